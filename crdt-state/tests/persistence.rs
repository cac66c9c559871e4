use shoal_state::crdt::Stamp;
use shoal_state::hlc::Timestamp;
use shoal_state::{
    ObjectKey, ObjectState, Store, StoreConfig, StoreError, WireEntry, WriteMode, kind,
};

use crate::{T0, config_map, open};

#[test]
fn reopen_with_10000_objects_gives_identical_state() {
    let dir = tempfile::tempdir().unwrap();
    let info = kind::lookup("v1", "ConfigMap").unwrap();
    let entries: Vec<WireEntry> = (0..10_000u64)
        .map(|i| {
            let key = ObjectKey::new(info, "default", &format!("cm-{i}"));
            let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": key.name, "namespace": "default", "labels": {"i": i.to_string()}},
                "data": {"k": "v".repeat(64)}});
            let stamp = Stamp { time: Timestamp::new(T0 + i, 0), node: 7 };
            WireEntry { state: ObjectState::create(format!("uid-{i}"), stamp, &body), key }
        })
        .collect();
    let (digest, rv, sample) = {
        let mut store = open(dir.path(), "a", 1);
        store.merge_remote_at(entries, T0 + 20_000).unwrap();
        assert_eq!(store.len(), 10_000);
        let key = ObjectKey::new(info, "default", "cm-4242");
        (
            store.root_digest(),
            store.resource_version(),
            store.get(&key).unwrap(),
        )
    };
    let store = open(dir.path(), "a", 1);
    assert_eq!(store.len(), 10_000);
    assert_eq!(store.root_digest(), digest);
    // Numbering resumes past the resourceVersions a write-behind store may have shown before a
    // crash without writing them (see `store/journal.rs`).
    assert_eq!(store.resource_version(), rv + shoal_state::SEQ_RESERVE + 1);
    let key = ObjectKey::new(info, "default", "cm-4242");
    assert_eq!(store.get(&key).unwrap(), sample);
}

#[test]
fn writes_survive_reopen_and_resource_versions_keep_growing() {
    let dir = tempfile::tempdir().unwrap();
    let rv1 = {
        let mut store = open(dir.path(), "a", 1);
        store
            .write_at(config_map("one", &[("a", "1")]), WriteMode::Create, T0)
            .unwrap();
        let w = store
            .write_at(config_map("one", &[("a", "2")]), WriteMode::Update, T0 + 1)
            .unwrap();
        w.change.unwrap().resource_version
    };
    let mut store = open(dir.path(), "a", 1);
    let key = config_map("one", &[]).key;
    assert_eq!(store.get(&key).unwrap()["data"]["a"], "2");
    let w = store
        .write_at(config_map("two", &[]), WriteMode::Create, T0 + 2)
        .unwrap();
    assert!(w.change.unwrap().resource_version > rv1);
    // A watch cannot resume from before the restart: the change log is in memory.
    assert!(matches!(
        store.changes_since(0),
        Err(StoreError::Expired { .. })
    ));
    assert_eq!(store.changes_since(rv1).unwrap().len(), 1);
    // Which groups changed (what the API's RBAC cache asks), from the same log.
    assert_eq!(store.group_changed_since(0, ""), None);
    assert_eq!(store.group_changed_since(rv1, ""), Some(true));
    assert_eq!(
        store.group_changed_since(rv1, "rbac.authorization.k8s.io"),
        Some(false)
    );
    assert_eq!(
        store.group_changed_since(store.resource_version(), ""),
        Some(false)
    );
}

#[test]
fn write_modes_and_preconditions() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path(), "a", 1);
    let created = store
        .write_at(config_map("x", &[("a", "1")]), WriteMode::Create, T0)
        .unwrap();
    assert!(matches!(
        store.write_at(config_map("x", &[]), WriteMode::Create, T0),
        Err(StoreError::AlreadyExists { .. })
    ));
    assert!(matches!(
        store.write_at(config_map("y", &[]), WriteMode::Update, T0),
        Err(StoreError::NotFound { .. })
    ));
    let mut stale = config_map("x", &[("a", "2")]);
    stale.resource_version = Some("999".into());
    let err = store.write_at(stale, WriteMode::Update, T0).unwrap_err();
    assert!(err.to_string().contains("has been modified"), "{err}");
    // An unchanged write is not a new version.
    let same = store
        .write_at(config_map("x", &[("a", "1")]), WriteMode::Upsert, T0)
        .unwrap();
    assert!(same.change.is_none());
    assert_eq!(
        same.object["metadata"]["resourceVersion"],
        created.object["metadata"]["resourceVersion"]
    );
    let deleted = store.delete_at(&created.entry.key, None, T0 + 1).unwrap();
    assert_eq!(
        deleted.object["data"]["a"], "1",
        "delete returns the last live object"
    );
    assert!(store.get(&created.entry.key).is_none());
    assert!(matches!(
        store.delete_at(&created.entry.key, None, T0 + 2),
        Err(StoreError::NotFound { .. })
    ));
    // A new create after the delete is a new incarnation.
    let again = store
        .write_at(config_map("x", &[]), WriteMode::Create, T0 + 3)
        .unwrap();
    assert_ne!(
        again.object["metadata"]["uid"],
        created.object["metadata"]["uid"]
    );
}

#[test]
fn damaged_files_are_errors_naming_the_file_not_empty_stores() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = open(dir.path(), "a", 1);
        for i in 0..50 {
            store
                .write_at(
                    config_map(&format!("cm-{i}"), &[("k", &"v".repeat(500))]),
                    WriteMode::Create,
                    T0 + i,
                )
                .unwrap();
        }
    }
    let path = dir.path().join("a.redb");
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len / 3).unwrap();
    drop(file);
    let result = shoal_state::Store::open(shoal_state::StoreConfig::new(&path, 1));
    let err = result
        .err()
        .expect("a truncated store must not open as empty");
    assert!(err.to_string().contains("a.redb"), "{err}");

    let garbage = dir.path().join("g.redb");
    std::fs::write(&garbage, vec![0xAB; 8192]).unwrap();
    let err = shoal_state::Store::open(shoal_state::StoreConfig::new(&garbage, 1))
        .err()
        .expect("garbage must not open");
    assert!(err.to_string().contains("g.redb"), "{err}");
}

#[test]
fn peers_entries_with_unknown_kinds_or_future_clocks_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path(), "a", 1);
    let good = ObjectKey::new(kind::lookup("v1", "ConfigMap").unwrap(), "default", "ok");
    let unknown = ObjectKey {
        group: "x".into(),
        kind: "Widget".into(),
        namespace: "default".into(),
        name: "w".into(),
    };
    let body = serde_json::json!({"metadata": {"name": "ok"}});
    let now = Stamp {
        time: Timestamp::new(T0, 0),
        node: 2,
    };
    let future = Stamp {
        time: Timestamp::new(T0 + 3_600_000, 0),
        node: 2,
    };
    let entries = vec![
        WireEntry {
            key: good.clone(),
            state: ObjectState::create("u1".into(), now, &body),
        },
        WireEntry {
            key: unknown,
            state: ObjectState::create("u2".into(), now, &body),
        },
        WireEntry {
            key: ObjectKey {
                name: "late".into(),
                ..good.clone()
            },
            state: ObjectState::create("u3".into(), future, &body),
        },
    ];
    let outcome = store.merge_remote_at(entries, T0).unwrap();
    assert_eq!(outcome.changes.len(), 1);
    let reasons: Vec<String> = outcome.rejected.iter().map(|e| e.to_string()).collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[0].contains("Widget"), "{reasons:?}");
    assert!(
        reasons[1].contains("late") && reasons[1].contains("ahead"),
        "{reasons:?}"
    );
}

/// A push acknowledges only what it made durable: one refused entry (a clock an hour ahead)
/// turns the answer into `Refused` naming it, so the writer cannot count this node toward its
/// quorum; the accepted entry is merged all the same. Anti-entropy reports the same refusal.
#[test]
fn a_push_with_a_refused_entry_is_not_acknowledged_and_sessions_report_refusals() {
    use shoal_state::sync::{self, Step, SyncRequest, SyncResponse, SyncSession};
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path(), "a", 1);
    let key =
        |name: &str| ObjectKey::new(kind::lookup("v1", "ConfigMap").unwrap(), "default", name);
    let body = serde_json::json!({"metadata": {"name": "x"}});
    let at = |ms: u64| Stamp {
        time: Timestamp::new(ms, 0),
        node: 2,
    };
    let good = WireEntry {
        key: key("ok"),
        state: ObjectState::create("u1".into(), at(T0), &body),
    };
    let late = WireEntry {
        key: key("late"),
        state: ObjectState::create("u2".into(), at(T0 + 3_600_000), &body),
    };
    let (response, outcome) = sync::serve(
        &mut store,
        SyncRequest::Push {
            entries: vec![good.clone()],
            last_sync_ms: 0,
        },
        T0,
    );
    assert_eq!(response, SyncResponse::PushAck);
    assert_eq!(outcome.changes.len(), 1);

    let mut other = open(dir.path(), "b", 3);
    let (response, outcome) = sync::serve(
        &mut other,
        SyncRequest::Push {
            entries: vec![good, late.clone()],
            last_sync_ms: 0,
        },
        T0,
    );
    match response {
        SyncResponse::Refused { reason } => {
            assert!(
                reason.contains("late") && reason.contains("ahead"),
                "{reason}"
            )
        }
        other => panic!("a push with a refused entry was answered {other:?}"),
    }
    assert_eq!(outcome.changes.len(), 1, "the accepted entry still merges");
    assert!(other.get(&key("ok")).is_some());

    // Anti-entropy from a peer holding the refused entry: the session names it.
    let mut holder = open(dir.path(), "c", 4);
    holder.merge_remote_at(vec![late], T0 + 3_600_000).unwrap();
    let (mut session, mut request) = SyncSession::start();
    loop {
        let (response, _) = sync::serve(&mut holder, request, T0 + 3_600_000);
        match session.on_response(&mut store, response, T0).unwrap() {
            Step::Send(next) => request = next,
            Step::Done(_) => break,
        }
    }
    let reasons: Vec<String> = session.rejected.iter().map(|e| e.to_string()).collect();
    assert!(
        reasons.len() == 1 && reasons[0].contains("late"),
        "{reasons:?}"
    );
}

/// A tmpfs mounted over a directory for one test, unmounted on drop (also when the test fails).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Needs root (CI runs the tests as root).
    fn mount(dir: &std::path::Path, size: &str) -> Self {
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a tmpfs needs root");
        Self(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the filesystem holding `dir` with one file, until the kernel says it is full.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // What a partial last chunk left free, as well.
    while file.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
    path
}

/// A full disk fails a write with an error naming the store and leaves nothing half-applied;
/// once space is back the store writes again without a restart (redb refuses every operation
/// after an I/O error until its database is reopened), and what it acknowledged is on disk.
#[test]
fn a_full_disk_fails_writes_and_the_store_writes_again_once_space_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let _tmpfs = Tmpfs::mount(dir.path(), "8m");
    let info = kind::lookup("v1", "ConfigMap").unwrap();
    let key = |name: &str| ObjectKey::new(info, "default", name);
    let mut store = open(dir.path(), "a", 1);
    store
        .write(config_map("before", &[("k", "v")]), WriteMode::Create)
        .unwrap();
    let filler = fill(dir.path());
    let big = "x".repeat(200_000);
    let error = store
        .write(config_map("during", &[("k", &big)]), WriteMode::Create)
        .expect_err("a write on a full disk must fail");
    assert!(
        matches!(&error, StoreError::Storage { path, .. } if path.starts_with(dir.path())),
        "{error}"
    );
    assert!(
        error.to_string().contains("No space left on device"),
        "{error}"
    );
    // Again, now through the reopen: the disk is still full.
    let again = store
        .write(config_map("during", &[("k", &big)]), WriteMode::Create)
        .expect_err("still full");
    assert!(
        again.to_string().contains("No space left on device"),
        "{again}"
    );
    assert!(store.get(&key("during")).is_none(), "nothing half-applied");
    std::fs::remove_file(filler).unwrap();
    store
        .write(config_map("after", &[("k", "v")]), WriteMode::Create)
        .expect("space is back: the store writes again");
    store
        .write(config_map("during", &[("k", "v")]), WriteMode::Create)
        .expect("the refused write can be retried");
    drop(store);
    let store = open(dir.path(), "a", 1);
    for name in ["before", "after", "during"] {
        assert!(store.get(&key(name)).is_some(), "{name} survived a restart");
    }
}

/// A list reads one kind's range of keys: exactly that kind's live objects (not a kind whose
/// name it prefixes, nor a namespace whose name it prefixes, nor a deleted one), in key order.
#[test]
fn a_list_returns_exactly_its_kind_and_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path(), "a", 1);
    let objects = [
        ("v1", "Pod", "a", "p1"),
        ("v1", "Pod", "ab", "p2"),
        ("v1", "Pod", "a", "p0"),
        ("v1", "Service", "a", "s1"),
        ("v1", "ServiceAccount", "a", "sa1"),
        ("v1", "ConfigMap", "a", "c1"),
        ("apps/v1", "ReplicaSet", "a", "r1"),
        ("v1", "Pod", "b", "gone"),
    ];
    for (api_version, kind_name, namespace, name) in objects {
        let mut body = serde_json::json!({"apiVersion": api_version, "kind": kind_name,
            "metadata": {"name": name, "namespace": namespace}});
        match kind_name {
            "Pod" => {
                body["spec"] = serde_json::json!({"containers": [{"name": "c", "image": "i"}]})
            }
            "Service" => body["spec"] = serde_json::json!({"ports": [{"port": 80}]}),
            "ReplicaSet" => {
                body["spec"] = serde_json::json!({"selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}},
                        "spec": {"containers": [{"name": "c", "image": "i"}]}}})
            }
            _ => {}
        }
        let valid = shoal_state::validate(body, namespace).unwrap();
        store.write_at(valid, WriteMode::Create, T0).unwrap();
    }
    let pod = kind::lookup("v1", "Pod").unwrap();
    store
        .delete_at(&ObjectKey::new(pod, "b", "gone"), None, T0 + 1)
        .unwrap();
    let names = |list: Vec<serde_json::Value>| -> Vec<String> {
        list.iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["metadata"]["namespace"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(
        names(store.list("", "Pod", None)),
        ["a/p0", "a/p1", "ab/p2"]
    );
    assert_eq!(names(store.list("", "Pod", Some("a"))), ["a/p0", "a/p1"]);
    assert_eq!(names(store.list("", "Pod", Some("ab"))), ["ab/p2"]);
    assert!(store.list("", "Pod", Some("b")).is_empty());
    assert_eq!(names(store.list("", "Service", None)), ["a/s1"]);
    assert_eq!(
        names(store.list("", "ServiceAccount", Some("a"))),
        ["a/sa1"]
    );
    assert_eq!(names(store.list("apps", "ReplicaSet", Some("a"))), ["a/r1"]);
    assert!(store.list("apps", "Deployment", None).is_empty());
}

#[test]
fn the_peak_membership_persists_rises_by_itself_and_lowers_only_when_set() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = open(dir.path(), "a", 1);
        assert_eq!(store.peak_members(), 0);
        store.note_members(5).unwrap();
        store.note_members(3).unwrap();
        assert_eq!(store.peak_members(), 5, "fewer members now do not lower it");
    }
    let mut store = open(dir.path(), "a", 1);
    assert_eq!(store.peak_members(), 5, "persisted");
    store.set_peak_members(3).unwrap();
    assert_eq!(store.peak_members(), 3);
    drop(store);
    let mut store = open(dir.path(), "a", 1);
    assert_eq!(store.peak_members(), 3, "the lowered peak persists");
    store.note_members(4).unwrap();
    assert_eq!(
        store.peak_members(),
        4,
        "more members at once raise it again"
    );
    store.set_peak_members(0).unwrap();
    assert_eq!(store.peak_members(), 1, "never below one node");
}

/// Stages a write of ConfigMap `name` on `store` as a forwarding agent does: its state of the
/// key (the version the client read) and the write staged over it.
fn staged(
    store: &mut shoal_state::Store,
    name: &str,
    holder: &str,
    mode: WriteMode,
    now: u64,
) -> (Option<WireEntry>, WireEntry) {
    let key = config_map(name, &[]).key;
    let read = store.entry(&key);
    match store
        .stage_at(config_map(name, &[("holder", holder)]), mode, now)
        .unwrap()
    {
        shoal_state::Staged::Changed(write) => (read, write),
        shoal_state::Staged::Unchanged(_) => panic!("the write changes nothing"),
    }
}

#[test]
fn a_home_admits_one_write_per_version_read_and_only_over_what_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut home = open(dir.path(), "home", 1);
    let mut a = open(dir.path(), "a", 2);
    let mut b = open(dir.path(), "b", 3);
    let created = home
        .write_at(
            config_map("x", &[("holder", "nobody")]),
            WriteMode::Create,
            T0,
        )
        .unwrap();
    for peer in [&mut a, &mut b] {
        peer.merge_remote_at(vec![created.entry.clone()], T0)
            .unwrap();
    }
    // Two agents stage a takeover over the same version: the home admits the first only.
    let (read_a, write_a) = staged(&mut a, "x", "a", WriteMode::Update, T0 + 1);
    let (read_b, write_b) = staged(&mut b, "x", "b", WriteMode::Update, T0 + 2);
    home.check_serialized(read_a.as_ref(), &write_a, false, T0 + 3)
        .unwrap();
    home.merge_remote_at(vec![write_a.clone()], T0 + 3).unwrap();
    let err = home
        .check_serialized(read_b.as_ref(), &write_b, false, T0 + 3)
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Conflict { reason, .. } if reason.contains("has been modified")),
        "{err}"
    );
    // What the check prevents: merged without it, b's later write replaces a's, whose client
    // was told it won.
    let mut merged = open(dir.path(), "merged", 4);
    merged
        .merge_remote_at(vec![write_a.clone(), write_b.clone()], T0 + 3)
        .unwrap();
    assert_eq!(merged.get(&write_a.key).unwrap()["data"]["holder"], "b");

    // A home that never got the object admits a write over the version its peer read.
    let behind = open(dir.path(), "behind", 5);
    behind
        .check_serialized(read_b.as_ref(), &write_b, false, T0 + 3)
        .unwrap();
    // An update of an object deleted meanwhile is NotFound; a read of another key is refused.
    home.delete_at(&write_a.key, None, T0 + 4).unwrap();
    let (read_c, write_c) = staged(&mut a, "x", "c", WriteMode::Update, T0 + 5);
    assert!(matches!(
        home.check_serialized(read_c.as_ref(), &write_c, false, T0 + 6),
        Err(StoreError::NotFound { .. })
    ));
    let (_, other) = staged(&mut a, "y", "a", WriteMode::Create, T0 + 7);
    let err = home
        .check_serialized(read_c.as_ref(), &other, true, T0 + 7)
        .unwrap_err();
    assert!(err.to_string().contains("not of the key written"), "{err}");

    // Two creates of one name: the first is admitted, the second finds the object.
    let (read_1, create_1) = staged(&mut a, "z", "a", WriteMode::Create, T0 + 8);
    let (read_2, create_2) = staged(&mut b, "z", "b", WriteMode::Create, T0 + 8);
    home.check_serialized(read_1.as_ref(), &create_1, true, T0 + 9)
        .unwrap();
    home.merge_remote_at(vec![create_1], T0 + 9).unwrap();
    assert!(matches!(
        home.check_serialized(read_2.as_ref(), &create_2, true, T0 + 9),
        Err(StoreError::AlreadyExists { .. })
    ));
    // A create over the tombstone of a deleted incarnation is admitted.
    let mut fresh = open(dir.path(), "fresh", 6);
    let (none, again) = staged(&mut fresh, "x", "d", WriteMode::Create, T0 + 10);
    assert!(none.is_none());
    home.check_serialized(None, &again, true, T0 + 10).unwrap();
}

fn open_write_behind(dir: &std::path::Path, bell: &std::sync::Arc<shoal_state::Doorbell>) -> Store {
    let mut config = StoreConfig::new(dir.join("a.redb"), 1);
    config.write_behind = Some(bell.clone());
    Store::open(config).unwrap()
}

/// Write-behind: a commit is visible at once and on disk only once a writer takes it; every
/// commit made meanwhile goes in one batch (one transaction, one fsync).
#[test]
fn write_behind_commits_many_writes_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let bell = std::sync::Arc::new(shoal_state::Doorbell::default());
    let mut store = open_write_behind(dir.path(), &bell);
    let opened = store.last_commit();
    assert_eq!(store.durable_commit(), opened);
    for i in 0..100 {
        let name = format!("cm-{i}");
        store
            .write_at(config_map(&name, &[("a", "1")]), WriteMode::Create, T0 + i)
            .unwrap();
    }
    assert!(
        bell.wait(std::time::Duration::ZERO),
        "commits ring the writer"
    );
    assert_eq!(store.len(), 100, "readers see the commits before the disk");
    assert_eq!(store.durable_commit(), opened);
    let batch = store.take_batch().unwrap();
    assert_eq!(batch.len(), 100);
    assert_eq!(batch.last_commit(), opened + 100);
    assert!(store.take_batch().is_none(), "the journal was taken whole");
    batch.write().unwrap();
    store.batch_done(batch, true);
    assert_eq!(store.durable_commit(), opened + 100);
    drop(store);
    assert_eq!(open_write_behind(dir.path(), &bell).len(), 100);
}

/// A batch that failed to write goes back to the journal behind what was committed since: the
/// disk ends with the newest state of every key.
#[test]
fn a_failed_batch_is_written_again_behind_newer_commits() {
    let dir = tempfile::tempdir().unwrap();
    let bell = std::sync::Arc::new(shoal_state::Doorbell::default());
    let mut store = open_write_behind(dir.path(), &bell);
    store
        .write_at(config_map("x", &[("a", "1")]), WriteMode::Create, T0)
        .unwrap();
    store
        .write_at(config_map("y", &[("a", "1")]), WriteMode::Create, T0)
        .unwrap();
    let failed = store.take_batch().unwrap();
    store
        .write_at(config_map("x", &[("a", "2")]), WriteMode::Update, T0 + 1)
        .unwrap();
    store.batch_done(failed, false);
    let retry = store.take_batch().unwrap();
    assert_eq!(retry.len(), 2, "x (its newer state) and y");
    retry.write().unwrap();
    store.batch_done(retry, true);
    assert_eq!(store.durable_commit(), store.last_commit());
    drop(store);
    let store = open_write_behind(dir.path(), &bell);
    let x = store.get(&config_map("x", &[]).key).unwrap();
    assert_eq!(x["data"]["a"], "2");
    assert!(store.get(&config_map("y", &[]).key).is_some());
}

/// A crash before the writer ran loses the unwritten commits (no one acknowledged them), and
/// the resourceVersions they showed are never used again nor resumed from.
#[test]
fn a_crash_before_the_write_never_reuses_a_resource_version_shown() {
    let dir = tempfile::tempdir().unwrap();
    let bell = std::sync::Arc::new(shoal_state::Doorbell::default());
    let shown = {
        let mut store = open_write_behind(dir.path(), &bell);
        store
            .write_at(config_map("kept", &[]), WriteMode::Create, T0)
            .unwrap();
        store.flush().unwrap();
        let lost = store
            .write_at(config_map("lost", &[]), WriteMode::Create, T0 + 1)
            .unwrap();
        lost.change.unwrap().resource_version
    }; // dropped with "lost" journaled only: a crash
    let mut store = open_write_behind(dir.path(), &bell);
    assert!(store.get(&config_map("kept", &[]).key).is_some());
    assert!(store.get(&config_map("lost", &[]).key).is_none());
    assert!(store.resource_version() > shown);
    assert!(matches!(
        store.changes_since(shown),
        Err(StoreError::Expired { .. })
    ));
    let next = store
        .write_at(config_map("other", &[]), WriteMode::Create, T0 + 2)
        .unwrap();
    assert!(next.change.unwrap().resource_version > shown);
    // Opened again without a crash in between, numbering still moves past what was shown.
    drop(store);
    let again = open_write_behind(dir.path(), &bell);
    assert!(again.resource_version() > shown);
}

use proptest::prelude::*;
use shoal_state::{Store, WriteMode};

use crate::{T0, anti_entropy, config_map, open, pair};

#[derive(Debug, Clone)]
enum Op {
    /// Write object `obj` key `field` = `value` at node `node`.
    Write {
        node: usize,
        obj: u8,
        field: u8,
        value: u8,
    },
    Delete {
        node: usize,
        obj: u8,
    },
    /// A push from `from` to `to` (only within a partition side).
    Sync {
        from: usize,
        to: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..5, 0u8..6, 0u8..3, 0u8..4).prop_map(|(node, obj, field, value)| Op::Write { node, obj, field, value }),
        1 => (0usize..5, 0u8..6).prop_map(|(node, obj)| Op::Delete { node, obj }),
        3 => (0usize..5, 0usize..5).prop_map(|(from, to)| Op::Sync { from, to }),
    ]
}

fn side(node: usize) -> usize {
    usize::from(node >= 3)
}

/// Applies a write as an upsert of one field of the current object (read-modify-write).
fn write(store: &mut Store, obj: u8, field: u8, value: u8, now: u64) {
    let name = format!("obj-{obj}");
    let key = config_map(&name, &[]).key;
    let mut data: Vec<(String, String)> = store
        .get(&key)
        .and_then(|o| o["data"].as_object().cloned())
        .map(|m| {
            m.into_iter()
                .map(|(k, v)| (k, v.as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default();
    data.retain(|(k, _)| *k != format!("f{field}"));
    data.push((format!("f{field}"), value.to_string()));
    let refs: Vec<(&str, &str)> = data.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    store
        .write_at(config_map(&name, &refs), WriteMode::Upsert, now)
        .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Five replicas split 3|2; both sides write, delete and sync among themselves; after the
    /// partition heals, anti-entropy makes every replica byte-identical (same digest, same
    /// objects), whatever happened before.
    #[test]
    fn partitions_heal_to_identical_state(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let mut stores: Vec<Store> = (0..5).map(|i| open(dir.path(), &format!("n{i}"), i as u64 + 1)).collect();
        let mut now = T0;
        for op in ops {
            now += 3;
            match op {
                Op::Write { node, obj, field, value } => write(&mut stores[node], obj, field, value, now),
                Op::Delete { node, obj } => {
                    let key = config_map(&format!("obj-{obj}"), &[]).key;
                    let _ = stores[node].delete_at(&key, None, now);
                }
                Op::Sync { from, to } if from != to && side(from) == side(to) => {
                    let (a, b) = pair(&mut stores, to, from);
                    anti_entropy(a, b, now);
                }
                Op::Sync { .. } => {}
            }
        }
        // Heal: every node pulls from every other once; node 0 ends complete, and every later
        // node pulls from it.
        for i in 0..5 {
            for j in (0..5).filter(|j| *j != i) {
                let (a, b) = pair(&mut stores, i, j);
                anti_entropy(a, b, now);
            }
        }
        let digest = stores[0].root_digest();
        for s in &stores {
            prop_assert_eq!(s.root_digest(), digest.clone());
        }
        let strip = |v: serde_json::Value| {
            let mut v = v;
            v["metadata"].as_object_mut().unwrap().remove("resourceVersion");
            v
        };
        let reference: Vec<_> = stores[0].list("", "ConfigMap", None).into_iter().map(strip).collect();
        for s in &stores[1..] {
            let list: Vec<_> = s.list("", "ConfigMap", None).into_iter().map(strip).collect();
            prop_assert_eq!(&list, &reference);
        }
    }
}

#[test]
fn anti_entropy_only_exchanges_differing_entries() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = open(dir.path(), "a", 1);
    let mut b = open(dir.path(), "b", 2);
    for i in 0..200 {
        a.write_at(
            config_map(&format!("cm-{i}"), &[("k", "v")]),
            WriteMode::Create,
            T0 + i,
        )
        .unwrap();
    }
    anti_entropy(&mut b, &mut a, T0 + 500);
    assert_eq!(a.root_digest(), b.root_digest());
    // One more write on a: a session exchanges one bucket's entries, not the store.
    a.write_at(config_map("late", &[]), WriteMode::Create, T0 + 600)
        .unwrap();
    let (mut session, mut request) = shoal_state::sync::SyncSession::start();
    loop {
        let (response, _) = shoal_state::sync::serve(&mut a, request, T0 + 700);
        match session.on_response(&mut b, response, T0 + 700).unwrap() {
            shoal_state::sync::Step::Send(next) => request = next,
            shoal_state::sync::Step::Done(changes) => {
                assert_eq!(changes.len(), 1);
                break;
            }
        }
    }
    assert_eq!(session.buckets_differing, 1);
    assert!(
        session.entries_received < 10,
        "received {}",
        session.entries_received
    );
    assert_eq!(a.root_digest(), b.root_digest());
}

const DAY: u64 = 24 * 3600 * 1000;

/// Two stores that shared object `doomed`; then `b` went away, `a` deleted the object and, a
/// day later, forgot the tombstone. Returns (a, b, the object's key, a time after that).
fn forgotten_delete(dir: &std::path::Path) -> (Store, Store, shoal_state::ObjectKey, u64) {
    let mut a = open(dir, "a", 1);
    let mut b = open(dir, "b", 2);
    a.write_at(config_map("doomed", &[]), WriteMode::Create, T0)
        .unwrap();
    anti_entropy(&mut b, &mut a, T0 + 10);
    let key = config_map("doomed", &[]).key;
    a.delete_at(&key, None, T0 + 20).unwrap();
    assert_eq!(a.collect_tombstones(T0 + 20 + DAY + 1).unwrap(), 1);
    (a, b, key, T0 + 20 + DAY + 100)
}

#[test]
fn a_node_away_past_the_tombstone_horizon_adopts_peers_state() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, mut b, key, back) = forgotten_delete(dir.path());
    assert!(b.behind(b.last_sync_ms(), a.collected_through_ms()));
    // b comes back: it must not resurrect the object.
    anti_entropy(&mut b, &mut a, back);
    assert!(b.get(&key).is_none());
    assert!(a.get(&key).is_none());
    assert_eq!(a.root_digest(), b.root_digest());
}

/// Runs one session of `a` pulling from `b`; returns the session (for its flags).
fn pull(a: &mut Store, b: &mut Store, now_ms: u64) -> shoal_state::sync::SyncSession {
    use shoal_state::sync::{self, Step, SyncSession};
    let (mut session, mut request) = SyncSession::start();
    loop {
        let (response, _) = sync::serve(b, request, now_ms);
        match session.on_response(a, response, now_ms).unwrap() {
            Step::Send(next) => request = next,
            Step::Done(_) => return session,
        }
    }
}

/// The other direction of the horizon test: the node that stayed and forgot the tombstone
/// pulls from the one that was away, and must not take the deleted object back from it. Its
/// pushes are refused until it has resynced; it keeps what it wrote while away; answering a
/// peer does not count as a sync; watchers are told of the object it drops.
#[test]
fn a_node_behind_forgotten_deletes_is_neither_merged_from_nor_acknowledged_until_it_resyncs() {
    use shoal_state::sync::{self, SyncRequest, SyncResponse};
    let dir = tempfile::tempdir().unwrap();
    let (mut a, mut b, key, back) = forgotten_delete(dir.path());
    // b wrote while away (its clock said so).
    let kept = config_map("written-while-away", &[]);
    b.write_at(kept.clone(), WriteMode::Create, T0 + DAY)
        .unwrap();

    // a pulls from b first: nothing of b is merged.
    let session = pull(&mut a, &mut b, back);
    assert!(a.get(&key).is_none(), "the forgotten object came back");
    assert!(session.peer_behind);
    // b answered a: that is no sync for b, which is still behind.
    assert!(b.behind(b.last_sync_ms(), a.collected_through_ms()));
    // b's pushes are refused (a write there is not acknowledged by a).
    let (response, _) = sync::serve(
        &mut a,
        SyncRequest::Push {
            entries: vec![],
            last_sync_ms: b.last_sync_ms(),
        },
        back,
    );
    assert!(
        matches!(response, SyncResponse::Refused { .. }),
        "{response:?}"
    );

    // b pulls from a: it adopts a's state, drops the object (telling watchers), keeps its own
    // write; then a pulls it from b, and the two agree.
    let rv = b.resource_version();
    let (mut session, mut request) = shoal_state::sync::SyncSession::start();
    let changes = loop {
        let (response, _) = sync::serve(&mut a, request, back);
        match session.on_response(&mut b, response, back).unwrap() {
            shoal_state::sync::Step::Send(next) => request = next,
            shoal_state::sync::Step::Done(changes) => break changes,
        }
    };
    assert!(b.get(&key).is_none());
    assert!(
        changes.iter().any(|c| c.key == key
            && c.event == shoal_state::EventType::Deleted
            && c.resource_version > rv),
        "{changes:?}"
    );
    assert!(
        b.get(&kept.key).is_some(),
        "a write made while away was dropped"
    );
    assert!(!b.behind(b.last_sync_ms(), a.collected_through_ms()));
    let session = pull(&mut a, &mut b, back + 10);
    assert!(!session.peer_behind);
    assert!(a.get(&kept.key).is_some());
    assert!(a.get(&key).is_none());
    assert_eq!(a.root_digest(), b.root_digest());
}

/// A whole cluster off for longer than the horizon: nobody forgot anything meanwhile, so the
/// nodes merge as usual and nothing written on either is dropped.
#[test]
fn a_cluster_back_after_the_horizon_merges_as_usual() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = open(dir.path(), "a", 1);
    let mut b = open(dir.path(), "b", 2);
    a.write_at(config_map("from-a", &[]), WriteMode::Create, T0)
        .unwrap();
    b.write_at(config_map("from-b", &[]), WriteMode::Create, T0)
        .unwrap();
    let later = T0 + 3 * DAY;
    assert_eq!(a.collect_tombstones(later).unwrap(), 0);
    anti_entropy(&mut a, &mut b, later);
    anti_entropy(&mut b, &mut a, later);
    assert_eq!(a.len(), 2);
    assert_eq!(a.root_digest(), b.root_digest());
}

/// A session pulling many buckets takes several rounds; each round's merges are handed out
/// as they are made (`fresh_changes`), so watchers get them before any write committed in a
/// later round: delivered only at the end, a round's changes came after the writes committed
/// between rounds, and a watcher saw an object's older version last (a kubelet dropped a pod
/// bound to it: issue #40's session, the scheduling test's flake).
#[test]
fn a_multi_round_session_hands_out_each_rounds_changes_in_commit_order() {
    use shoal_state::sync::{self, Step, SyncSession};
    let dir = tempfile::tempdir().unwrap();
    let mut source = open(dir.path(), "source", 1);
    for i in 0..400 {
        source
            .write_at(config_map(&format!("cm-{i}"), &[]), WriteMode::Create, T0)
            .unwrap();
    }
    let mut puller = open(dir.path(), "puller", 2);
    let (mut session, mut request) = SyncSession::start();
    let mut handed: Vec<u64> = Vec::new();
    let mut rounds_with_changes = 0;
    let all = loop {
        let (response, _) = sync::serve(&mut source, request, T0);
        let step = session.on_response(&mut puller, response, T0).unwrap();
        let fresh = session.fresh_changes(&step);
        rounds_with_changes += usize::from(!fresh.is_empty());
        handed.extend(fresh.iter().map(|c| c.resource_version));
        // A write between rounds: committed after what was handed out, before what comes.
        match step {
            Step::Send(next) => {
                let name = format!("local-{}", handed.len());
                let w = puller
                    .write_at(config_map(&name, &[]), WriteMode::Create, T0)
                    .unwrap();
                handed.push(w.change.unwrap().resource_version);
                request = next;
            }
            Step::Done(all) => break all,
        }
    };
    assert!(
        rounds_with_changes > 1,
        "one round only: the test proves nothing"
    );
    assert_eq!(all.len(), 400);
    let mut sorted = handed.clone();
    sorted.sort_unstable();
    assert_eq!(handed, sorted, "handed out in commit order");
}

//! The desired-state store of one node: the CRDT entries in memory for reads, persisted in redb
//! for durability, with a per-node commit sequence that serves as Kubernetes' `resourceVersion`
//! and a bounded change log for watches. How it takes peers' state (merges, resyncs, the tombstone
//! horizon) is in `store/merge.rs`; how commits reach the disk (one fsync per commit, or group
//! commit by a writer thread that never holds the store) is in `store/journal.rs`.

mod journal;
mod merge;

pub use journal::{Batch, Doorbell, SEQ_RESERVE};

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::crdt::{NodeId, ObjectState, Stamp};
use crate::digest::{BucketDigest, Hash16, bucket_of, entry_hash};
use crate::hlc::{ClockError, Hlc, Timestamp};
use crate::horizon::{Currency, Horizon, Plan};
use crate::kind::ObjectKey;
use crate::labels::check_dns_label;
use crate::object::ValidObject;
use crate::sync::WireEntry;

const OBJECTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("objects");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_SEQ: &str = "seq";
const META_HLC: &str = "hlc";
const META_LAST_SYNC_MS: &str = "last-sync-ms";
const META_PEAK_MEMBERS: &str = "peak-members";
const META_COLLECTED_THROUGH_MS: &str = "collected-through-ms";
const META_CURRENT_SINCE_MS: &str = "current-since-ms";
const META_CURRENT_MS: &str = "current-ms";

/// Tunables of a store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub path: PathBuf,
    /// This node's id, the tie-breaker of concurrent writes.
    pub node: NodeId,
    /// Timestamps further ahead of our wall clock are refused (default 60 s).
    pub max_clock_drift: Duration,
    /// Deleted objects are forgotten after this long (default 24 h). A node that has not synced
    /// for this long, or since a delete a peer forgot, resyncs instead of being merged from (see
    /// [`crate::horizon`]).
    pub tombstone_horizon: Duration,
    /// Changes kept for watches; older resourceVersions get "too old" (default 1,000; the
    /// apiserver's watch cache keeps 100 per resource type).
    pub change_log_capacity: usize,
    /// redb page cache (default 16 MiB; every object is also held decoded in memory).
    pub cache_bytes: usize,
    /// `None` (the default): every commit is on disk (fsync'd) before it returns. `Some(bell)`:
    /// write-behind — a commit changes memory and a journal, rings `bell`, and returns; a writer
    /// thread takes the journal ([`Store::take_batch`]) and persists it outside the store's
    /// lock, many commits in one fsync, and the caller waits for [`Store::durable_commit`] before
    /// it acknowledges anything (see `store/journal.rs`).
    pub write_behind: Option<std::sync::Arc<Doorbell>>,
}

impl StoreConfig {
    pub fn new(path: impl Into<PathBuf>, node: NodeId) -> Self {
        Self {
            path: path.into(),
            node,
            max_clock_drift: Duration::from_secs(60),
            tombstone_horizon: Duration::from_secs(24 * 3600),
            change_log_capacity: 1_000,
            cache_bytes: 16 << 20,
            write_behind: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store {path}: {source}")]
    Open {
        path: PathBuf,
        source: Box<redb::DatabaseError>,
    },
    #[error("store {path}: {message}")]
    Storage { path: PathBuf, message: String },
    #[error("store {path} is corrupt: entry {key}: {reason}")]
    Corrupt {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{key} not found")]
    NotFound { key: ObjectKey },
    #[error("{key} already exists")]
    AlreadyExists { key: ObjectKey },
    #[error("{key}: {reason}")]
    Conflict { key: ObjectKey, reason: String },
    #[error("resourceVersion {requested} is too old; the oldest available is {oldest}")]
    Expired { requested: u64, oldest: u64 },
    #[error("entry {key} from a peer: {reason}")]
    Rejected { key: String, reason: String },
    #[error(transparent)]
    Clock(#[from] ClockError),
}

/// What a watcher sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    #[serde(rename = "ADDED")]
    Added,
    #[serde(rename = "MODIFIED")]
    Modified,
    #[serde(rename = "DELETED")]
    Deleted,
}

/// One committed change, numbered by this node's commit sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub resource_version: u64,
    pub key: ObjectKey,
    pub event: EventType,
    /// The object as of this change (its last live form for a delete).
    pub object: Value,
}

/// How a local write treats an existing object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Fail if a live object exists (POST).
    Create,
    /// Fail if no live object exists (PUT).
    Update,
    /// Create or update (apply).
    Upsert,
}

#[derive(Debug, Clone)]
struct Entry {
    state: ObjectState,
    resource_version: u64,
    hash: Hash16,
}

#[derive(Serialize, Deserialize)]
struct StoredEntry {
    state: ObjectState,
    resource_version: u64,
}

/// A write computed but not yet persisted (see [`Store::stage_at`]).
#[derive(Debug, Clone)]
pub enum Staged {
    /// The write changes nothing: nothing to persist or replicate.
    Unchanged(Written),
    Changed(WireEntry),
}

/// The result of a local write: the object as stored, and what to push to peers.
#[derive(Debug, Clone)]
pub struct Written {
    pub object: Value,
    pub entry: WireEntry,
    pub change: Option<Change>,
}

pub struct Store {
    config: StoreConfig,
    /// The database, and what is committed in memory but not yet on it.
    disk: std::sync::Arc<journal::Disk>,
    journal: journal::Journal,
    hlc: Hlc,
    seq: u64,
    /// How current this store is (see [`crate::horizon`]), as in memory and as on disk: the last
    /// sync and current times are written at most once per [`Store::sync_persist_interval_ms`].
    currency: Currency,
    persisted: Currency,
    /// The last sync time read when the store was opened (it may lag the last sync by up to the
    /// persist interval).
    last_sync_at_open: u64,
    /// The most cluster members this node has known at once (see [`Store::peak_members`]).
    peak_members: u64,
    entries: BTreeMap<ObjectKey, Entry>,
    digest: BucketDigest,
    changes: VecDeque<Change>,
    /// The lowest resourceVersion a watch may resume from.
    oldest_watchable: u64,
    /// The sequence on disk when the store was opened; the [`SEQ_RESERVE`] after it were never
    /// used since.
    reopened_at: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// RFC 3339 (seconds) of an HLC time.
pub fn rfc3339(time: Timestamp) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(time.wall_ms()))
        .to_string()
}

fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl Store {
    /// Opens (or creates) the store. A damaged file is an error naming it, never an empty store.
    pub fn open(config: StoreConfig) -> Result<Self, StoreError> {
        let path = config.path.clone();
        let storage = |e: &dyn std::fmt::Display| StoreError::Storage {
            path: path.clone(),
            message: e.to_string(),
        };
        let db = Self::open_db(&config)?;
        // Make sure both tables exist, so reads never race a first write.
        let txn = db.begin_write().map_err(|e| storage(&e))?;
        txn.open_table(OBJECTS).map_err(|e| storage(&e))?;
        txn.open_table(META).map_err(|e| storage(&e))?;
        txn.commit().map_err(|e| storage(&e))?;

        let read = db.begin_read().map_err(|e| storage(&e))?;
        let meta = read.open_table(META).map_err(|e| storage(&e))?;
        let get = |k: &str| -> Result<u64, StoreError> {
            Ok(meta
                .get(k)
                .map_err(|e| storage(&e))?
                .map_or(0, |v| v.value()))
        };
        let seq = get(META_SEQ)?;
        let hlc_last = get(META_HLC)?;
        let currency = Currency {
            last_sync_ms: get(META_LAST_SYNC_MS)?,
            collected_through_ms: get(META_COLLECTED_THROUGH_MS)?,
            current_since_ms: get(META_CURRENT_SINCE_MS)?,
            current_ms: get(META_CURRENT_MS)?,
        };
        let peak_members = get(META_PEAK_MEMBERS)?;
        let table = read.open_table(OBJECTS).map_err(|e| storage(&e))?;
        let mut entries = BTreeMap::new();
        let mut digest = BucketDigest::default();
        for item in table.iter().map_err(|e| storage(&e))? {
            let (k, v) = item.map_err(|e| storage(&e))?;
            let key = ObjectKey::from_bytes(k.value()).ok_or_else(|| StoreError::Corrupt {
                path: path.clone(),
                key: String::from_utf8_lossy(k.value()).into_owned(),
                reason: "malformed key".into(),
            })?;
            let stored: StoredEntry =
                rmp_serde::from_slice(v.value()).map_err(|e| StoreError::Corrupt {
                    path: path.clone(),
                    key: key.to_string(),
                    reason: e.to_string(),
                })?;
            let hash = entry_hash(&key, &stored.state);
            digest.toggle(bucket_of(&key), &hash);
            entries.insert(
                key,
                Entry {
                    state: stored.state,
                    resource_version: stored.resource_version,
                    hash,
                },
            );
        }
        drop(table);
        drop(meta);
        drop(read);
        let hlc = Hlc::new(
            Timestamp(hlc_last),
            config.max_clock_drift.as_millis() as u64,
        );
        // Write-behind may have shown resourceVersions up to `SEQ_RESERVE` past the last one on
        // disk before a crash: numbering resumes past all of them, so one number never names two
        // different changes, and a watch cannot resume from one of them (it may be lost).
        let mut store = Self {
            oldest_watchable: seq,
            reopened_at: seq,
            disk: std::sync::Arc::new(journal::Disk::new(&config, db)),
            journal: journal::Journal::new(seq + SEQ_RESERVE + 1),
            config,
            hlc,
            seq: seq + SEQ_RESERVE + 1,
            currency,
            persisted: currency,
            last_sync_at_open: currency.last_sync_ms,
            peak_members,
            entries,
            digest,
            changes: VecDeque::new(),
        };
        // The new numbering is on disk before any number of it is shown.
        store.commit(&[], &[])?;
        store.flush()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.config.path
    }

    pub fn node(&self) -> NodeId {
        self.config.node
    }

    /// The doorbell of this store's writer, if commits are written behind (see
    /// [`StoreConfig::write_behind`]).
    pub fn write_behind(&self) -> Option<std::sync::Arc<Doorbell>> {
        self.config.write_behind.clone()
    }

    /// The latest commit sequence number (the list resourceVersion).
    pub fn resource_version(&self) -> u64 {
        self.seq
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.entries
            .values()
            .filter(|e| !e.state.is_deleted())
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of entries including tombstones.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// When this store last completed a sync that keeps it current (a session or a resync with
    /// a peer, or equal digests; for a store away longer than the horizon, only a resync from a
    /// peer that vouches: see [`crate::horizon`]), in wall ms; 0 if never. Persisted at most once
    /// a minute, so after a restart it may lag by that much (which only makes
    /// [`Store::behind`] more cautious).
    pub fn last_sync_ms(&self) -> u64 {
        self.currency.last_sync_ms
    }

    /// The latest deletion time among the tombstones this store, or a peer whose state it took,
    /// has forgotten (0: none): the horizon it judges peers by.
    pub fn collected_through_ms(&self) -> u64 {
        self.currency.collected_through_ms
    }

    /// How current this store is, as it tells its peers.
    pub fn currency(&self) -> Currency {
        self.currency
    }

    /// The horizon settings this store judges peers with.
    pub fn horizon(&self) -> Horizon {
        Horizon {
            tombstone_ms: self.config.tombstone_horizon.as_millis() as u64,
            drift_ms: self.config.max_clock_drift.as_millis() as u64,
        }
    }

    /// This store has been away (stopped, or not current) for longer than the horizon: it may
    /// hold objects deleted and forgotten elsewhere, and resyncs before its state is merged
    /// anywhere.
    pub fn lapsed(&self, now_ms: u64) -> bool {
        self.currency.lapsed(now_ms, self.horizon())
    }

    /// A store back from an absence may take this store's state as the cluster's.
    pub fn vouches(&self, now_ms: u64) -> bool {
        self.currency.vouches(now_ms, self.horizon())
    }

    /// Whether a store that last synced at `last_sync_ms` may hold objects that a store that
    /// forgot tombstones through `collected_through_ms` deleted: it has not synced since (with
    /// the clock-drift bound as a margin). Such a store must not be merged from as it is: it
    /// resyncs first, keeping only what it wrote since. [`Store::peer_must_resync`] also refuses
    /// a store away longer than the horizon.
    pub fn behind(&self, last_sync_ms: u64, collected_through_ms: u64) -> bool {
        let peer = Currency {
            last_sync_ms,
            ..Currency::default()
        };
        peer.behind(collected_through_ms, self.horizon())
    }

    /// Whether entries from a peer that last synced at `last_sync_ms` (a push, a write to
    /// serialize) must be refused until it resyncs: it is away longer than the horizon (and this
    /// store is not), or behind this store's horizon, own or learned.
    pub fn peer_must_resync(&self, last_sync_ms: u64, now_ms: u64) -> bool {
        !self
            .currency
            .accepts_push(last_sync_ms, now_ms, self.horizon())
    }

    /// What an anti-entropy session does with a peer of currency `peer` (see [`Plan`]).
    pub fn plan_sync(&self, peer: &Currency, now_ms: u64) -> Plan {
        self.currency.plan(peer, now_ms, self.horizon())
    }

    fn storage_err(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Storage {
            path: self.config.path.clone(),
            message: e.to_string(),
        }
    }

    fn open_db(config: &StoreConfig) -> Result<Database, StoreError> {
        redb::Builder::new()
            .set_cache_size(config.cache_bytes)
            .create(&config.path)
            .map_err(|source| StoreError::Open {
                path: config.path.clone(),
                source: Box::new(source),
            })
    }

    /// The object as clients see it: body plus server metadata.
    fn present(key: &ObjectKey, entry: &Entry) -> Value {
        let _ = key;
        let mut object = entry.state.render();
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), Value::String(entry.state.uid.clone()));
            meta.insert(
                "resourceVersion".into(),
                Value::String(entry.resource_version.to_string()),
            );
            meta.insert(
                "creationTimestamp".into(),
                Value::String(rfc3339(entry.state.created.time)),
            );
            meta.insert("generation".into(), Value::from(entry.state.generation()));
            if let Some(deleted) = entry.state.deleted {
                meta.insert(
                    "deletionTimestamp".into(),
                    Value::String(rfc3339(deleted.time)),
                );
            }
        }
        object
    }

    fn record_change(&mut self, change: Change) {
        self.changes.push_back(change);
        while self.changes.len() > self.config.change_log_capacity {
            let dropped = self.changes.pop_front().expect("non-empty");
            self.oldest_watchable = dropped.resource_version;
        }
    }

    /// Installs a new state for `key` in memory (after it was committed) and records the change.
    fn install(&mut self, key: &ObjectKey, state: ObjectState, rv: u64) -> Option<Change> {
        let bucket = bucket_of(key);
        let was_live = self.entries.get(key).is_some_and(|e| !e.state.is_deleted());
        let previous = self
            .entries
            .get(key)
            .map(|e| (e.hash, Self::present(key, e)));
        if let Some((old_hash, _)) = &previous {
            self.digest.toggle(bucket, old_hash);
        }
        let hash = entry_hash(key, &state);
        self.digest.toggle(bucket, &hash);
        let entry = Entry {
            state,
            resource_version: rv,
            hash,
        };
        let is_live = !entry.state.is_deleted();
        let object = Self::present(key, &entry);
        self.entries.insert(key.clone(), entry);
        let event = match (was_live, is_live) {
            (false, true) => EventType::Added,
            (true, true) => EventType::Modified,
            (true, false) => EventType::Deleted,
            (false, false) => return None,
        };
        let change = Change {
            resource_version: rv,
            key: key.clone(),
            event,
            object,
        };
        self.record_change(change.clone());
        Some(change)
    }

    /// Writes a validated object from a client of this node.
    pub fn write(&mut self, object: ValidObject, mode: WriteMode) -> Result<Written, StoreError> {
        self.write_at(object, mode, now_ms())
    }

    pub fn write_at(
        &mut self,
        object: ValidObject,
        mode: WriteMode,
        now_ms: u64,
    ) -> Result<Written, StoreError> {
        match self.stage_at(object, mode, now_ms)? {
            Staged::Unchanged(written) => Ok(written),
            Staged::Changed(entry) => self.commit_staged(entry),
        }
    }

    pub fn stage(&mut self, object: ValidObject, mode: WriteMode) -> Result<Staged, StoreError> {
        self.stage_at(object, mode, now_ms())
    }

    /// Computes the state a write produces without persisting it, so the caller can start
    /// replicating it while [`Store::commit_staged`] fsyncs. The caller must commit (or drop) it
    /// before staging anything else.
    pub fn stage_at(
        &mut self,
        object: ValidObject,
        mode: WriteMode,
        now_ms: u64,
    ) -> Result<Staged, StoreError> {
        let key = object.key.clone();
        if object.info.namespaced {
            check_dns_label(&key.namespace).map_err(|reason| StoreError::Conflict {
                key: key.clone(),
                reason: reason.to_string(),
            })?;
        }
        let existing = self.entries.get(&key).filter(|e| !e.state.is_deleted());
        if let (Some(e), Some(uid)) = (existing, &object.uid)
            && *uid != e.state.uid
        {
            return Err(StoreError::Conflict {
                key,
                reason: format!(
                    "metadata.uid: precondition failed: {uid} is not the current uid {}",
                    e.state.uid
                ),
            });
        }
        if let (Some(e), Some(rv)) = (existing, &object.resource_version)
            && mode != WriteMode::Create
            && *rv != e.resource_version.to_string()
        {
            return Err(StoreError::Conflict {
                key,
                reason: format!(
                    "the object has been modified; please apply your changes to the latest version and try again (resourceVersion {rv} is not the current {})",
                    e.resource_version
                ),
            });
        }
        let time = self.hlc.now(now_ms);
        let stamp = Stamp {
            time,
            node: self.config.node,
        };
        let state = match (existing, mode) {
            (Some(_), WriteMode::Create) => return Err(StoreError::AlreadyExists { key }),
            (None, WriteMode::Update) => return Err(StoreError::NotFound { key }),
            (None, _) => ObjectState::create(new_uid(), stamp, &object.body),
            (Some(e), _) => {
                let mut state = e.state.clone();
                if !state.update(stamp, &object.body) {
                    // Nothing changed: no commit, no new resourceVersion (like the apiserver).
                    let object = Self::present(&key, e);
                    let entry = WireEntry {
                        key,
                        state: e.state.clone(),
                    };
                    return Ok(Staged::Unchanged(Written {
                        object,
                        entry,
                        change: None,
                    }));
                }
                state
            }
        };
        Ok(Staged::Changed(WireEntry { key, state }))
    }

    /// Persists a staged write (see `store/journal.rs` for when it is on disk) and makes it
    /// visible.
    pub fn commit_staged(&mut self, entry: WireEntry) -> Result<Written, StoreError> {
        self.commit_local(entry.key, entry.state)
    }

    fn commit_local(&mut self, key: ObjectKey, state: ObjectState) -> Result<Written, StoreError> {
        self.seq += 1;
        let stored = StoredEntry {
            state,
            resource_version: self.seq,
        };
        if let Err(e) = self.commit(&[(&key, Some(&stored))], &[]) {
            self.seq -= 1;
            return Err(e);
        }
        let StoredEntry { state, .. } = stored;
        let change = self.install(&key, state.clone(), self.seq);
        let entry = &self.entries[&key];
        let object = change
            .as_ref()
            .map_or_else(|| Self::present(&key, entry), |c| c.object.clone());
        Ok(Written {
            object,
            entry: WireEntry { key, state },
            change,
        })
    }

    /// Deletes a live object; `uid` is an optional precondition.
    pub fn delete(&mut self, key: &ObjectKey, uid: Option<&str>) -> Result<Written, StoreError> {
        self.delete_at(key, uid, now_ms())
    }

    pub fn delete_at(
        &mut self,
        key: &ObjectKey,
        uid: Option<&str>,
        now_ms: u64,
    ) -> Result<Written, StoreError> {
        let existing = self
            .entries
            .get(key)
            .filter(|e| !e.state.is_deleted())
            .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
        if let Some(uid) = uid
            && uid != existing.state.uid
        {
            return Err(StoreError::Conflict {
                key: key.clone(),
                reason: format!("metadata.uid: precondition failed: {uid} is not the current uid"),
            });
        }
        let last_live = Self::present(key, existing);
        let mut state = existing.state.clone();
        let time = self.hlc.now(now_ms);
        state.delete(Stamp {
            time,
            node: self.config.node,
        });
        let mut written = self.commit_local(key.clone(), state)?;
        // Watchers and callers get the last live form, as the apiserver returns it.
        written.object = last_live.clone();
        if let Some(change) = &mut written.change {
            change.object = last_live;
        }
        if let Some(last) = self.changes.back_mut() {
            last.object = written.object.clone();
        }
        Ok(written)
    }

    /// Decides a write serialized by this node, the home of its key (DESIGN.md §5): a peer
    /// staged `write` over `read`, its own state of the key at the time (`None`: it had none),
    /// after checking the client's precondition against it. The write is admitted only if no
    /// other write came in between: this store, joined with `read`, must hold exactly `read`
    /// (for a create: no live object), and `write` must supersede it. Nothing changes here;
    /// the caller commits `write` with [`Store::merge_remote`] under the same lock, so two
    /// peers' writes staged over one version cannot both be admitted.
    pub fn check_serialized(
        &self,
        read: Option<&WireEntry>,
        write: &WireEntry,
        create: bool,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let key = &write.key;
        let rejected = |reason: String| StoreError::Rejected {
            key: key.to_string(),
            reason,
        };
        for entry in read.into_iter().chain([write]) {
            if entry.key != *key {
                return Err(rejected(format!(
                    "the version read is of {}, not of the key written",
                    entry.key
                )));
            }
            validate_remote(key, &entry.state).map_err(rejected)?;
            self.hlc
                .check(entry.state.max_stamp().time, now_ms)
                .map_err(|e| rejected(e.to_string()))?;
        }
        let mut basis = self.entries.get(key).map(|e| e.state.clone());
        if let Some(read) = read {
            match &mut basis {
                Some(state) => state.merge(&read.state),
                None => basis = Some(read.state.clone()),
            }
        }
        let live = basis.as_ref().filter(|s| !s.is_deleted());
        if create {
            if live.is_some() {
                return Err(StoreError::AlreadyExists { key: key.clone() });
            }
        } else {
            let Some(live) = live else {
                return Err(StoreError::NotFound { key: key.clone() });
            };
            if read.is_none_or(|r| r.state != *live) {
                return Err(StoreError::Conflict {
                    key: key.clone(),
                    reason: "the object has been modified; please apply your changes to the latest version and try again (another write of it came first)".into(),
                });
            }
        }
        let mut result = basis.unwrap_or_else(|| write.state.clone());
        result.merge(&write.state);
        if result != write.state {
            return Err(StoreError::Conflict {
                key: key.clone(),
                reason: "a newer write of the object came first; please apply your changes to the latest version and try again".into(),
            });
        }
        Ok(())
    }

    /// This store's state of `key` as sent between nodes (a tombstone included).
    pub fn entry(&self, key: &ObjectKey) -> Option<WireEntry> {
        self.entries.get(key).map(|e| WireEntry {
            key: key.clone(),
            state: e.state.clone(),
        })
    }

    /// The most cluster members (this node included) this node has ever known at once,
    /// persisted: the write quorum is capped by this, never by the members alive right now, so a
    /// node cut off from its peers cannot acknowledge writes alone (0 on a fresh store).
    pub fn peak_members(&self) -> u64 {
        self.peak_members
    }

    /// Sets the peak to `members` (≥ 1), lower or higher, persisted: an operator's word that
    /// the nodes beyond it are gone for good (`shoal baseline --set`). [`Store::note_members`]
    /// raises it again as soon as more nodes are known at once.
    pub fn set_peak_members(&mut self, members: u64) -> Result<(), StoreError> {
        let members = members.max(1);
        // On disk before it is used: the quorum of every later write is counted from it.
        self.commit(&[], &[(META_PEAK_MEMBERS, members)])?;
        self.flush()?;
        self.peak_members = members;
        Ok(())
    }

    /// Records that `members` nodes are known now; persisted (fsync) only when it is a new peak.
    pub fn note_members(&mut self, members: u64) -> Result<(), StoreError> {
        if members <= self.peak_members {
            return Ok(());
        }
        self.commit(&[], &[(META_PEAK_MEMBERS, members)])?;
        self.flush()?;
        self.peak_members = members;
        Ok(())
    }

    /// The replicated state of `key` if it is a tombstone (a deleted object not yet collected):
    /// what a retried delete must make durable again before it answers "not found".
    pub fn tombstone(&self, key: &ObjectKey) -> Option<WireEntry> {
        self.entries
            .get(key)
            .filter(|e| e.state.is_deleted())
            .map(|e| WireEntry {
                key: key.clone(),
                state: e.state.clone(),
            })
    }

    /// A live object as clients see it.
    pub fn get(&self, key: &ObjectKey) -> Option<Value> {
        let entry = self.entries.get(key).filter(|e| !e.state.is_deleted())?;
        Some(Self::present(key, entry))
    }

    /// A deleted object not yet collected, as it was when deleted (with `deletionTimestamp`):
    /// the garbage collector reads how an owner was deleted from it.
    pub fn deleted(&self, key: &ObjectKey) -> Option<Value> {
        let entry = self.entries.get(key).filter(|e| e.state.is_deleted())?;
        Some(Self::present(key, entry))
    }

    /// Live objects of one kind (`group`, `kind`), optionally in one namespace, in key order.
    pub fn list(&self, group: &str, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        // Keys sort by (group, kind, namespace, name): the kind's (and namespace's) objects are
        // one range, read without visiting the others.
        let first = ObjectKey {
            group: group.to_owned(),
            kind: kind.to_owned(),
            namespace: namespace.unwrap_or_default().to_owned(),
            name: String::new(),
        };
        self.entries
            .range(first..)
            .take_while(|(k, _)| {
                k.group == group && k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns)
            })
            .filter(|(_, e)| !e.state.is_deleted())
            .map(|(k, e)| Self::present(k, e))
            .collect()
    }

    /// Whether a change after `resource_version` touched an object of API group `group`
    /// (`None` when some changes after it were dropped: it cannot tell). Reads the change log
    /// back from its newest entry, cloning nothing.
    pub fn group_changed_since(&self, resource_version: u64, group: &str) -> Option<bool> {
        let unknown = resource_version > self.reopened_at
            && resource_version <= self.reopened_at + SEQ_RESERVE;
        if resource_version < self.oldest_watchable || unknown {
            return None;
        }
        Some(
            self.changes
                .iter()
                .rev()
                .take_while(|c| c.resource_version > resource_version)
                .any(|c| c.key.group == group),
        )
    }

    /// Changes after `resource_version`, or [`StoreError::Expired`] if some were dropped.
    pub fn changes_since(&self, resource_version: u64) -> Result<Vec<Change>, StoreError> {
        let unknown = resource_version > self.reopened_at
            && resource_version <= self.reopened_at + SEQ_RESERVE;
        if resource_version < self.oldest_watchable || unknown {
            return Err(StoreError::Expired {
                requested: resource_version,
                oldest: self.oldest_watchable,
            });
        }
        Ok(self
            .changes
            .iter()
            .filter(|c| c.resource_version > resource_version)
            .cloned()
            .collect())
    }

    pub fn bucket_hashes(&self) -> Vec<Hash16> {
        self.digest.buckets().to_vec()
    }

    pub fn digest(&self) -> &BucketDigest {
        &self.digest
    }

    /// Hex of the root digest, as gossiped.
    pub fn root_digest(&self) -> String {
        hex::encode(self.digest.root())
    }

    /// (key, entry hash) of every entry whose key falls in `buckets`.
    pub fn entry_hashes_in_buckets(&self, buckets: &[u8]) -> Vec<(ObjectKey, Hash16)> {
        let wanted: std::collections::HashSet<u8> = buckets.iter().copied().collect();
        self.entries
            .iter()
            .filter(|(k, _)| wanted.contains(&bucket_of(k)))
            .map(|(k, e)| (k.clone(), e.hash))
            .collect()
    }

    /// The entries (tombstones included) of `keys` that this store has.
    pub fn entries_for(&self, keys: &[ObjectKey]) -> Vec<WireEntry> {
        keys.iter()
            .filter_map(|k| {
                self.entries.get(k).map(|e| WireEntry {
                    key: k.clone(),
                    state: e.state.clone(),
                })
            })
            .collect()
    }

    /// Every entry (tombstones included) whose key falls in `buckets`.
    pub fn entries_in_buckets(&self, buckets: &[u8]) -> Vec<WireEntry> {
        let wanted: std::collections::HashSet<u8> = buckets.iter().copied().collect();
        self.entries
            .iter()
            .filter(|(k, _)| wanted.contains(&bucket_of(k)))
            .map(|(k, e)| WireEntry {
                key: k.clone(),
                state: e.state.clone(),
            })
            .collect()
    }
}

/// What a merge of peer entries did.
#[derive(Debug, Default)]
pub struct MergeOutcome {
    pub changes: Vec<Change>,
    /// Entries refused, each naming its key and the reason.
    pub rejected: Vec<StoreError>,
}

/// Writing nodes a peer's entry may count spec writes for (a cluster is far smaller).
const MAX_WRITERS: usize = 4096;

/// Structural checks on an entry from the network.
fn validate_remote(key: &ObjectKey, state: &ObjectState) -> Result<(), String> {
    if key.info().is_none() {
        return Err(format!("unknown kind {}/{}", key.group, key.kind));
    }
    crate::labels::check_object_name(&key.group, &key.name).map_err(|r| format!("name: {r}"))?;
    if key.info().is_some_and(|i| i.namespaced) {
        check_dns_label(&key.namespace).map_err(|r| format!("namespace: {r}"))?;
    } else if !key.namespace.is_empty() {
        return Err("cluster-scoped kind with a namespace".into());
    }
    if state.uid.is_empty() || state.uid.len() > 64 {
        return Err("uid must be 1 to 64 characters".into());
    }
    if state.spec_writes.iter().count() > MAX_WRITERS {
        return Err(format!(
            "spec_writes: more than {MAX_WRITERS} writing nodes"
        ));
    }
    let size = serde_json::to_vec(&state.render()).map_or(usize::MAX, |v| v.len());
    if size > crate::object::MAX_OBJECT_BYTES {
        return Err(format!(
            "object is {size} bytes; the limit is {} bytes",
            crate::object::MAX_OBJECT_BYTES
        ));
    }
    Ok(())
}

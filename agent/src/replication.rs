//! Replication of the desired-state store between agents, over the node endpoint's sync channel.
//!
//! - Write path: validate → commit locally (in memory; the store's writer thread fsyncs it with
//!   every other commit made meanwhile, outside the store's lock) → push the new state to every
//!   live peer at once → acknowledge when [`Replication::quorum_needed`] nodes (this one
//!   included, once its writer reports the commit on disk) hold it durably: `write_quorum`, capped only by the most members this node has ever known (a
//!   single-node cluster acknowledges alone; a node cut off from its peers answers 503 instead,
//!   writing nothing when it sees too few peers to try).
//!   A write that changes nothing (a retry after a 503) is pushed again and acknowledged only at
//!   quorum, like a retried delete of a tombstone. Peers that missed a push get it by
//!   anti-entropy.
//! - Changes reach watchers in commit order, once they are on this node's disk (as etcd's watch
//!   sends only committed entries). Reads (GET, LIST, a watch's replay of the change log) show
//!   this node's memory, which may be one group commit ahead of its disk: a crash then loses
//!   only what no one acknowledged, and the store never reuses a resourceVersion it showed.
//! - A peer's push is acknowledged once it is on this node's disk.
//! - Anti-entropy: every node gossips its store's root digest; a node whose digest differs from
//!   a live peer's runs a [`SyncSession`] with it (bucket hashes, then only differing buckets).
//!   About once a minute the store forgets tombstones older than the horizon; the sync protocol
//!   keeps a node that was away from bringing them back (`shoal_state::sync`).
//!
//! The protocol logic lives in `shoal_state::sync`; this module only moves bytes and time.

use std::net::SocketAddr;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use shoal_gossip::{Channel, IncomingRequests, MemberState, Membership, PeerEndpoint, keys};
use shoal_state::sync::{self, Step, SyncSession};
use shoal_state::{
    Change, ObjectKey, Refusal, Staged, Store, StoreError, SyncRequest, SyncResponse, ValidObject,
    WireEntry, WriteMode,
};
use tracing::{debug, info, warn};

/// A node's membership baseline: majorities are counted of `members`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Baseline {
    pub members: u64,
    /// The member names the membership lists now (alive or not), sorted.
    pub listed: Vec<String>,
}

/// The distinct member names of `members`, sorted.
fn listed_names(members: &[shoal_gossip::Member]) -> Vec<String> {
    let names: std::collections::BTreeSet<&str> = members
        .iter()
        .filter_map(|m| m.meta.as_ref().map(|meta| meta.name.as_str()))
        .collect();
    names.into_iter().map(str::to_owned).collect()
}

/// Tunables of replication.
#[derive(Debug, Clone)]
pub struct ReplicationConfig {
    /// Nodes (this one included) that must hold a write durably before it is acknowledged,
    /// capped by the most members this node has ever known at once. Default 2.
    pub write_quorum: usize,
    /// The cluster size assumed before any peer is known: 2 for a node started with `--join`
    /// (a node joining a cluster, even with a wiped data dir, never acknowledges alone), else 1.
    pub expected_members: usize,
    /// How long a write waits for its quorum. Default 5 s.
    pub push_timeout: Duration,
    /// Period of digest publication and anti-entropy. Default 1 s.
    pub anti_entropy_interval: Duration,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        Self {
            write_quorum: 2,
            expected_members: 1,
            push_timeout: Duration::from_secs(5),
            anti_entropy_interval: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "the write is stored on this node but only {acked} of the {needed} nodes required by the write quorum {why}; retry (writes are idempotent; it is replicated when peers are reachable)"
    )]
    NotDurable {
        acked: usize,
        needed: usize,
        /// "confirmed it within 5s", or "are reachable" when too few peers are alive to try.
        why: String,
    },
    #[error(
        "only {reachable} of the {needed} nodes required by the write quorum are reachable from this node; nothing was written (retry when peers are back)"
    )]
    Unavailable { reachable: usize, needed: usize },
    #[error(
        "node {home} orders the writes of this object and did not decide this one ({reason}); retry (when a node is gone, the next live node takes its place)"
    )]
    Home { home: String, reason: String },
}

/// Why the operator's baseline was not set.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error(
        "members: {members} is below the {} nodes the membership still lists ({}); a dead node is listed until the dead-node grace period forgets it",
        listed.len(),
        listed.join(", ")
    )]
    BelowListed { members: u64, listed: Vec<String> },
    #[error("cannot record the baseline: {0}")]
    Store(#[from] StoreError),
}

/// Why an anti-entropy session with a peer ended early.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Endpoint(#[from] shoal_gossip::EndpointError),
    #[error(transparent)]
    Decode(#[from] shoal_state::sync::DecodeError),
    #[error(transparent)]
    Session(#[from] shoal_state::sync::SessionError),
}

/// The store, shared by the API and replication.
pub struct Replication {
    store: Arc<Mutex<Store>>,
    endpoint: PeerEndpoint,
    membership: Arc<Membership>,
    config: ReplicationConfig,
    traffic: Arc<SyncTraffic>,
    changes: tokio::sync::broadcast::Sender<Change>,
    /// Keys whose refusal from a peer was already logged at warn level (anti-entropy pulls a
    /// refused entry again every round until its cause goes).
    refusals_logged: Mutex<std::collections::HashSet<String>>,
    /// When this node last caught up with each peer: saw the peer's store digest equal to its
    /// own, or merged a complete anti-entropy session from it (fencing waits for this).
    caught_up: Mutex<std::collections::HashMap<SocketAddr, Instant>>,
    /// What the store's writer thread has put on disk (see [`Replication::await_durable`]).
    durable: tokio::sync::watch::Sender<Durable>,
    /// Changes committed in memory and not yet on disk, in commit order, each with its commit:
    /// watchers get them once they are on disk ([`Replication::publish`]).
    unpublished: Mutex<std::collections::VecDeque<(u64, Change)>>,
}

/// The store's commits on disk, as its writer thread reports them.
#[derive(Debug, Clone, Default)]
struct Durable {
    /// Every commit up to this one is on disk.
    commit: u64,
    /// The last failed write: the last commit it held, and why.
    failed: Option<(u64, String)>,
}

/// A failed write of the store is tried again after this long, doubling up to 5 s.
const REWRITE_FIRST: Duration = Duration::from_millis(100);
const REWRITE_MAX: Duration = Duration::from_secs(5);

/// Bytes of sync payloads this node sent and received (pushes and anti-entropy, both roles).
#[derive(Debug, Default)]
pub struct SyncTraffic {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    /// Peers' entries this node refused (pushed or pulled).
    pub entries_refused: AtomicU64,
    /// Pushes of this node's writes that a peer refused (not counted toward the quorum).
    pub pushes_refused: AtomicU64,
}

impl SyncTraffic {
    fn count(&self, sent: usize, received: usize) {
        self.sent.fetch_add(sent as u64, Ordering::Relaxed);
        self.received.fetch_add(received as u64, Ordering::Relaxed);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Replication {
    pub fn new(
        store: Store,
        endpoint: PeerEndpoint,
        membership: Arc<Membership>,
        config: ReplicationConfig,
    ) -> Arc<Self> {
        let durable = tokio::sync::watch::Sender::new(Durable {
            commit: store.durable_commit(),
            failed: None,
        });
        Arc::new(Self {
            durable,
            unpublished: Mutex::default(),
            store: Arc::new(Mutex::new(store)),
            endpoint,
            membership,
            config,
            traffic: Arc::default(),
            changes: tokio::sync::broadcast::channel(1024).0,
            refusals_logged: Mutex::new(Default::default()),
            caught_up: Mutex::new(Default::default()),
        })
    }

    /// Starts answering peers and running anti-entropy.
    pub fn start(self: &Arc<Self>) -> Result<(), crate::agent::AgentError> {
        if let Some(bell) = self.read(|s| s.write_behind()) {
            let me = self.clone();
            crate::supervise::spawn_thread("store-writer", move || me.write_behind(&bell))
                .map_err(|e| StoreError::Storage {
                    path: self.read(|s| s.path().to_owned()),
                    message: format!("cannot start the store's writer thread: {e}"),
                })?;
        }
        let requests = self.endpoint.subscribe_requests(Channel::Sync)?;
        let me = self.clone();
        crate::supervise::spawn_receiving("sync-requests", requests, move |requests, _| {
            me.clone().serve(requests)
        });
        let me = self.clone();
        crate::supervise::spawn("anti-entropy", move || me.clone().anti_entropy());
        Ok(())
    }

    /// The store's writer: takes everything committed since its last write, writes it in one
    /// transaction (one fsync) without holding the store, reports it, and again. A failed write
    /// is reported at once (its waiters fail) and tried again with back-off.
    fn write_behind(&self, bell: &shoal_state::Doorbell) {
        let mut retry = REWRITE_FIRST;
        loop {
            bell.wait(Duration::from_secs(1));
            loop {
                let batch = {
                    let mut store = self.store();
                    // A commit the store wrote itself (a rare synchronous one) is reported too.
                    let done = store.durable_commit();
                    self.durable.send_if_modified(|d| {
                        let newer = done > d.commit;
                        d.commit = d.commit.max(done);
                        newer
                    });
                    self.publish_durable(done);
                    store.take_batch()
                };
                let Some(batch) = batch else { break };
                let written =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| batch.write()))
                        .unwrap_or_else(|_| {
                            Err(StoreError::Storage {
                                path: self.read(|s| s.path().to_owned()),
                                message: "the write panicked".into(),
                            })
                        });
                let last = batch.last_commit();
                self.store
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .batch_done(batch, written.is_ok());
                match written {
                    Ok(()) => {
                        self.publish_durable(last);
                        self.durable.send_modify(|d| d.commit = d.commit.max(last));
                        retry = REWRITE_FIRST;
                    }
                    Err(error) => {
                        warn!(%error, retry_in = ?retry, "cannot write the store; writing it again");
                        self.durable
                            .send_modify(|d| d.failed = Some((last, error.to_string())));
                        std::thread::sleep(retry);
                        retry = (retry * 2).min(REWRITE_MAX);
                    }
                }
            }
        }
    }

    /// Waits until the store's commit `commit` is on disk, up to `deadline`; the error says why
    /// not (the disk's own error as soon as a write holding it failed).
    async fn await_durable(
        &self,
        commit: u64,
        deadline: tokio::time::Instant,
    ) -> Result<(), String> {
        if self.read(|s| s.durable_commit()) >= commit {
            return Ok(()); // also every commit of a store that writes before returning
        }
        let mut durable = self.durable.subscribe();
        let settled = |d: &Durable| {
            d.commit >= commit || d.failed.as_ref().is_some_and(|(last, _)| *last >= commit)
        };
        match tokio::time::timeout_at(deadline, durable.wait_for(settled)).await {
            Ok(Ok(d)) if d.commit >= commit => Ok(()),
            Ok(Ok(d)) => Err(d
                .failed
                .as_ref()
                .map_or_else(String::new, |(_, why)| why.clone())),
            Ok(Err(_)) => Err("the store's writer stopped".into()),
            Err(_) => Err("this node's disk did not confirm it in time".into()),
        }
    }

    /// Sync traffic and refusals so far.
    pub fn traffic(&self) -> &SyncTraffic {
        &self.traffic
    }

    /// Every committed change from now on, local or replicated (for watches). A receiver that
    /// lags more than 1,024 changes gets `Lagged` and must relist.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Sends changes `store` just committed to watchers once they are on disk (at once for a
    /// store that writes before returning; else when the writer reports them). Callers hold the
    /// store lock that committed them, so watchers see changes in commit (resourceVersion)
    /// order.
    fn publish(&self, store: &Store, changes: impl IntoIterator<Item = Change>) {
        let commit = store.last_commit();
        let durable = store.durable_commit();
        let mut waiting = self.unpublished.lock().unwrap_or_else(|p| p.into_inner());
        for change in changes {
            if commit <= durable && waiting.is_empty() {
                let _ = self.changes.send(change);
            } else {
                waiting.push_back((commit, change));
            }
        }
    }

    /// Sends watchers the changes held for commits up to `durable`, now on disk.
    fn publish_durable(&self, durable: u64) {
        let mut waiting = self.unpublished.lock().unwrap_or_else(|p| p.into_inner());
        while waiting
            .front()
            .is_some_and(|(commit, _)| *commit <= durable)
        {
            if let Some((_, change)) = waiting.pop_front() {
                let _ = self.changes.send(change);
            }
        }
    }

    /// Peer connections refused at the TLS handshake by this node's endpoint.
    pub fn refused_handshakes(&self) -> u64 {
        self.endpoint.refused_handshakes()
    }

    /// The store, locked. A panic while it was held may have left its memory unlike its disk:
    /// the agent then stops (exit code 70) rather than serve or replicate that memory, and
    /// starts again from its disk under its supervisor; no acknowledged write is lost, as each
    /// was on disk first.
    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|_| {
            tracing::error!("the store's lock is poisoned (a panic while it was held); stopping");
            std::process::exit(70)
        })
    }

    /// Reads under the store lock. A panic in `f` (a caller's bug: a controller's reconcile, say,
    /// which its quarantine catches) reaches the caller after the lock is released, so it never
    /// poisons the store: a read changes nothing in it.
    pub fn read<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        let store = self.store();
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&store)));
        drop(store);
        read.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Writes an object and waits for the write quorum. The push to peers starts before the
    /// local fsync, so the two overlap; the write is acknowledged only when both are done.
    pub async fn write(
        &self,
        object: ValidObject,
        mode: WriteMode,
    ) -> Result<(Value, bool), WriteError> {
        self.write_lingering(object, mode, Duration::ZERO).await
    }

    /// [`Replication::write`], then up to `linger` more for every live peer to hold it: for
    /// writes every node must see before the client acts on them (a cordon before the drain's
    /// evictions: the replacements' auction must not bid the cordoned node). Durable at quorum
    /// as any write; a peer that does not answer within `linger` only delays the answer.
    pub async fn write_everywhere(
        &self,
        object: ValidObject,
        mode: WriteMode,
        linger: Duration,
    ) -> Result<(Value, bool), WriteError> {
        self.write_lingering(object, mode, linger).await
    }

    async fn write_lingering(
        &self,
        object: ValidObject,
        mode: WriteMode,
        linger: Duration,
    ) -> Result<(Value, bool), WriteError> {
        #[cfg(debug_assertions)]
        if let Some(answer) = crate::fault_injection::dropped(&object) {
            return Ok((answer, true));
        }
        let peers = self.live_peers().await;
        self.check_reachable(peers.len())?;
        // The commit changes memory and the journal only; the store's writer thread fsyncs it
        // (with every other commit made meanwhile) while the push runs, and both are awaited.
        let (written, acks, commit) = {
            let mut store = self.store();
            let (written, acks) = match store.stage(object, mode)? {
                // Nothing changes here, but the state may be an earlier write of the same
                // content that missed its quorum (a client retrying after 503): it is pushed
                // again and acknowledged only at quorum, never on this node's copy alone.
                Staged::Unchanged(written) => {
                    let acks = self.push(written.entry.clone(), &store, &peers);
                    (written, acks)
                }
                Staged::Changed(entry) => {
                    let acks = self.push(entry.clone(), &store, &peers);
                    (store.commit_staged(entry)?, acks)
                }
            };
            self.publish(&store, written.change.clone());
            (written, acks, store.last_commit())
        };
        let created = written
            .change
            .as_ref()
            .is_some_and(|c| c.event == shoal_state::EventType::Added);
        self.await_local(commit).await?;
        self.await_quorum(acks, peers.len(), linger).await?;
        Ok((written.object, created))
    }

    /// A client's write (the Kubernetes API). A create, or a write with a resourceVersion
    /// precondition, is decided by the object's home node: the live node with the highest
    /// rendezvous hash of its key. This node checks the precondition against its own copy (the
    /// client's resourceVersion is this node's), stages the write over that copy and sends both
    /// to the home, which admits the write only if nothing else was written in between
    /// ([`Store::check_serialized`]), then commits and replicates it as any write. So two
    /// agents cannot both acknowledge writes made from one version (two candidates taking one
    /// leader Lease), nor both create one name. Other writes are [`Replication::write`].
    ///
    /// Homes are chosen from each node's view of membership: while views disagree (a node just
    /// joined or died, a partition) two nodes may each act as a key's home, and their writes
    /// merge last-writer-wins as before.
    pub async fn write_serialized(
        &self,
        object: ValidObject,
        mode: WriteMode,
    ) -> Result<(Value, bool), WriteError> {
        #[cfg(debug_assertions)]
        if let Some(answer) = crate::fault_injection::dropped(&object) {
            return Ok((answer, true));
        }
        if mode != WriteMode::Create && object.resource_version.is_none() {
            return self.write(object, mode).await;
        }
        let members = self.membership.members().await;
        let Some((home, home_addr)) = home_of(&object.key, &members) else {
            return self.write(object, mode).await;
        };
        let Some(home_addr) = home_addr else {
            return self.write(object, mode).await; // this node is the home
        };
        let peers = self.live_peers().await;
        self.check_reachable(peers.len())?;
        let key = object.key.clone();
        let staged = {
            let mut store = self.store();
            let read = store.entry(&key);
            match store.stage(object.clone(), mode)? {
                Staged::Changed(write) => Some((read, write, store.last_sync_ms())),
                // A write that changes nothing is acknowledged as any (at quorum), here.
                Staged::Unchanged(_) => None,
            }
        };
        let Some((read, write, last_sync_ms)) = staged else {
            return self.write(object, mode).await;
        };
        let request = SyncRequest::Serialize {
            read: read.map(Box::new),
            write: Box::new(write.clone()),
            create: mode == WriteMode::Create,
            last_sync_ms,
        }
        .encode();
        let unreachable = |reason: String| WriteError::Home {
            home: home.clone(),
            reason,
        };
        let timeout = self.config.push_timeout + Duration::from_secs(1);
        let bytes = self
            .endpoint
            .request(home_addr, Channel::Sync, &request, timeout)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        self.traffic.count(request.len(), bytes.len());
        match SyncResponse::decode(&bytes) {
            Ok(SyncResponse::Serialized { refusal: None, .. }) => {}
            Ok(SyncResponse::Serialized {
                refusal: Some(refusal),
                current,
            }) => {
                if let Some(current) = current.filter(|c| c.key == key) {
                    self.merge_from(home_addr, *current);
                }
                return Err(refused(key, &home, refusal));
            }
            Ok(other) => return Err(unreachable(format!("it answered {other:?}"))),
            Err(e) => return Err(unreachable(e.to_string())),
        }
        // The home's push has usually brought it here already; merging again changes nothing.
        let object = on_disk(|| {
            let mut store = self.store();
            let outcome = store.merge_remote(vec![write])?;
            self.publish(&store, outcome.changes);
            Ok::<_, StoreError>(store.get(&key).or_else(|| store.deleted(&key)))
        })?;
        let object = object.ok_or(StoreError::NotFound { key })?;
        Ok((object, mode == WriteMode::Create))
    }

    /// Merges one entry a peer sent outside a push or a session (a home's state of a key with
    /// its refusal); refusals are reported as any.
    fn merge_from(&self, peer: SocketAddr, entry: WireEntry) {
        let merged = on_disk(|| {
            let mut store = self.store();
            // The home's state comes without the home's currency (`horizon`): merged as an
            // entry from a peer not known current.
            let outcome = store.merge_unvouched_at(vec![entry], now_ms())?;
            self.publish(&store, outcome.changes);
            Ok::<_, StoreError>(outcome.rejected)
        });
        match merged {
            Ok(rejected) => self.report_refusals(peer, &rejected),
            Err(error) => debug!(%peer, %error, "cannot merge a home's state of a key"),
        }
    }

    /// Decides a peer's serialized write as the home of its key (see
    /// [`Replication::write_serialized`]): checks it, pushes it to the live peers, commits it,
    /// and answers once the write quorum holds it.
    async fn decide_serialized(
        &self,
        read: Option<WireEntry>,
        write: WireEntry,
        create: bool,
        last_sync_ms: u64,
    ) -> SyncResponse {
        let key = write.key.clone();
        let refusal = |refusal| SyncResponse::Serialized {
            refusal: Some(refusal),
            current: self.read(|s| s.entry(&key)).map(Box::new),
        };
        let peers = self.live_peers().await;
        if let Err(WriteError::Unavailable { reachable, needed }) =
            self.check_reachable(peers.len())
        {
            return refusal(Refusal::Unavailable { reachable, needed });
        }
        let decided = on_disk(|| {
            let mut store = self.store();
            if store.peer_must_resync(last_sync_ms, now_ms()) {
                return Err(Refusal::Rejected(format!(
                    "the requester last synced at {last_sync_ms} ms, before deletes this node has forgotten: it must resync first"
                )));
            }
            store
                .check_serialized(read.as_ref(), &write, create, now_ms())
                .map_err(|e| match e {
                    StoreError::Conflict { reason, .. } => Refusal::Conflict(reason),
                    StoreError::NotFound { .. } => Refusal::NotFound,
                    StoreError::AlreadyExists { .. } => Refusal::AlreadyExists,
                    other => Refusal::Rejected(other.to_string()),
                })?;
            let acks = self.push(write.clone(), &store, &peers);
            let outcome = store
                .merge_remote(vec![write])
                .map_err(|e| Refusal::Rejected(e.to_string()))?;
            if let Some(e) = outcome.rejected.first() {
                return Err(Refusal::Rejected(e.to_string()));
            }
            self.publish(&store, outcome.changes);
            Ok((acks, store.last_commit()))
        });
        let acks = match decided {
            Ok((acks, commit)) => match self.await_local(commit).await {
                Ok(()) => acks,
                Err(WriteError::NotDurable { acked, needed, why }) => {
                    return refusal(Refusal::NotDurable { acked, needed, why });
                }
                Err(other) => return refusal(Refusal::Rejected(other.to_string())),
            },
            Err(r) => return refusal(r),
        };
        match self.await_quorum(acks, peers.len(), Duration::ZERO).await {
            Ok(()) => SyncResponse::Serialized {
                refusal: None,
                current: None,
            },
            Err(WriteError::NotDurable { acked, needed, why }) => {
                refusal(Refusal::NotDurable { acked, needed, why })
            }
            Err(other) => refusal(Refusal::Rejected(other.to_string())),
        }
    }

    /// Deletes an object and waits for the write quorum. Deleting an object already deleted
    /// here (a retry after 503) pushes its tombstone again and answers "not found" only once
    /// the quorum holds the delete.
    pub async fn delete(&self, key: &ObjectKey, uid: Option<&str>) -> Result<Value, WriteError> {
        let peers = self.live_peers().await;
        self.check_reachable(peers.len())?;
        let (result, acks) = {
            let mut store = self.store();
            match store.delete(key, uid) {
                Ok(written) => {
                    let acks = self.push(written.entry.clone(), &store, &peers);
                    self.publish(&store, written.change.clone());
                    (Ok(written.object), acks)
                }
                Err(e @ StoreError::NotFound { .. }) => match store.tombstone(key) {
                    Some(tombstone) => (Err(e), self.push(tombstone, &store, &peers)),
                    None => return Err(e.into()),
                },
                Err(e) => return Err(e.into()),
            }
        };
        let commit = self.read(|s| s.last_commit());
        self.await_local(commit).await?;
        self.await_quorum(acks, peers.len(), Duration::ZERO).await?;
        Ok(result?)
    }

    /// Live peers' addresses. Also records the cluster's size (see [`Store::note_members`]).
    async fn live_peers(&self) -> Vec<SocketAddr> {
        let members = self.membership.members().await;
        self.note_members(&members);
        members
            .into_iter()
            .filter(|m| !m.is_self && m.state == MemberState::Alive)
            .map(|m| m.gossip_addr)
            .collect()
    }

    /// Refuses a write up front when fewer nodes than the quorum are reachable: it could not be
    /// acknowledged, and kept on this node alone it would diverge (a create here would start an
    /// incarnation that, created later, replaces the one the reachable majority keeps writing).
    fn check_reachable(&self, peers: usize) -> Result<(), WriteError> {
        let needed = self.quorum_needed();
        if peers + 1 < needed {
            return Err(WriteError::Unavailable {
                reachable: peers + 1,
                needed,
            });
        }
        Ok(())
    }

    /// The membership baseline (the most nodes known at once, persisted) and the names the
    /// membership lists now.
    pub async fn baseline(&self) -> Baseline {
        let members = self.membership.members().await;
        self.note_members(&members);
        Baseline {
            members: self.read(|s| s.peak_members()),
            listed: listed_names(&members),
        }
    }

    /// Sets this node's baseline to `members` (an operator's word that the nodes beyond it are
    /// gone for good: majorities, for fencing and run leases, are then counted of `members`).
    /// Refused below the nodes the membership still lists (dead ones are listed until the
    /// dead-node grace period forgets them), which would raise it again at once.
    pub async fn set_baseline(&self, members: u64) -> Result<Baseline, BaselineError> {
        let listed = listed_names(&self.membership.members().await);
        if members == 0 || (members as usize) < listed.len() {
            return Err(BaselineError::BelowListed { members, listed });
        }
        on_disk(|| self.store().set_peak_members(members))?;
        info!(members, "membership baseline set by the operator");
        Ok(Baseline { members, listed })
    }

    /// Records how many nodes the membership shows, counted by name: a node whose data dir was
    /// wiped rejoins under a new id while its old one is still remembered, and is still one
    /// node (fencing counts its majorities against the peak of this).
    fn note_members(&self, members: &[shoal_gossip::Member]) {
        let count = listed_names(members).len() as u64;
        if let Err(error) = on_disk(|| self.store().note_members(count)) {
            warn!(%error, "cannot record the cluster size");
        }
    }

    /// Nodes, this one included, that must hold a write before it is acknowledged:
    /// `write_quorum`, capped by the most members this node has known (persisted), never by
    /// the members alive now.
    pub fn quorum_needed(&self) -> usize {
        let peak = self.read(|s| s.peak_members()) as usize;
        quorum_needed(
            self.config.write_quorum,
            peak.max(self.config.expected_members),
        )
    }

    /// Starts pushing `entry` to `peers`; each push reports whether the peer made it durable.
    fn push(
        &self,
        entry: WireEntry,
        store: &Store,
        peers: &[SocketAddr],
    ) -> tokio::sync::mpsc::Receiver<bool> {
        let (tx, rx) = tokio::sync::mpsc::channel(peers.len().max(1));
        let payload = Arc::new(
            SyncRequest::Push {
                entries: vec![entry],
                last_sync_ms: store.last_sync_ms(),
            }
            .encode(),
        );
        self.traffic.count(payload.len() * peers.len(), 0);
        for &peer in peers {
            let (endpoint, payload, tx) = (self.endpoint.clone(), payload.clone(), tx.clone());
            let traffic = self.traffic.clone();
            let timeout = self.config.push_timeout;
            // Pushes run to completion even after the quorum is reached.
            tokio::spawn(async move {
                let ok = match endpoint
                    .request(peer, Channel::Sync, &payload, timeout)
                    .await
                {
                    Ok(bytes) => match SyncResponse::decode(&bytes) {
                        Ok(SyncResponse::PushAck) => true,
                        Ok(other) => {
                            traffic.pushes_refused.fetch_add(1, Ordering::Relaxed);
                            warn!(%peer, response = ?other, "peer refused a pushed write; not counted toward the quorum");
                            false
                        }
                        Err(error) => {
                            warn!(%peer, %error, "unreadable push acknowledgement");
                            false
                        }
                    },
                    Err(error) => {
                        debug!(%peer, %error, "push failed; anti-entropy will deliver it");
                        false
                    }
                };
                let _ = tx.send(ok).await;
            });
        }
        rx
    }

    /// Waits until this node's commit `commit` (a write it acknowledges) is on its disk.
    async fn await_local(&self, commit: u64) -> Result<(), WriteError> {
        let deadline = tokio::time::Instant::now() + self.config.push_timeout;
        self.await_durable(commit, deadline)
            .await
            .map_err(|why| WriteError::NotDurable {
                acked: 0,
                needed: self.quorum_needed(),
                why: format!("have it on disk (this node's disk: {why})"),
            })
    }

    /// Waits until [`Self::quorum_needed`] nodes, this one included, hold the write; fails at
    /// once when fewer peers than that are alive.
    async fn await_quorum(
        &self,
        mut acks: tokio::sync::mpsc::Receiver<bool>,
        peers: usize,
        linger: Duration,
    ) -> Result<(), WriteError> {
        let needed = self.quorum_needed();
        let mut acked = 1; // this node: on its disk (`await_local`)
        if peers + 1 < needed {
            return Err(WriteError::NotDurable {
                acked: peers + 1,
                needed,
                why: "are reachable".into(),
            });
        }
        let deadline = tokio::time::Instant::now() + self.config.push_timeout;
        while acked < needed {
            match tokio::time::timeout_at(deadline, acks.recv()).await {
                Ok(Some(true)) => acked += 1,
                Ok(Some(false)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        if acked >= needed {
            // Lingering for the rest (a refusal or a silent peer ends it early or at the limit).
            let until = tokio::time::Instant::now() + linger;
            let mut answered = acked;
            while !linger.is_zero() && answered < peers + 1 {
                match tokio::time::timeout_at(until, acks.recv()).await {
                    Ok(Some(_)) => answered += 1,
                    Ok(None) | Err(_) => break,
                }
            }
            Ok(())
        } else {
            Err(WriteError::NotDurable {
                acked,
                needed,
                why: format!("confirmed it within {:?}", self.config.push_timeout),
            })
        }
    }

    /// Answers peers' sync requests.
    async fn serve(self: Arc<Self>, requests: crate::supervise::Held<IncomingRequests>) {
        let mut requests = requests.lock().await;
        while let Some(request) = requests.recv().await {
            let this = self.clone();
            // Store work (merges) runs off the async workers.
            tokio::task::spawn_blocking(move || {
                let peer = request.peer;
                let received = request.payload.len();
                let response = match SyncRequest::decode(&request.payload) {
                    Ok(SyncRequest::Serialize {
                        read,
                        write,
                        create,
                        last_sync_ms,
                    }) => {
                        // Decided on the async workers: it waits for the write quorum.
                        tokio::runtime::Handle::current().spawn(async move {
                            let response = this
                                .decide_serialized(read.map(|r| *r), *write, create, last_sync_ms)
                                .await;
                            let bytes = response.encode();
                            this.traffic.count(bytes.len(), received);
                            request.respond(bytes);
                        });
                        return;
                    }
                    Ok(req) => {
                        let mut store = this.store();
                        let (response, outcome) = sync::serve(&mut store, req, now_ms());
                        this.publish(&store, outcome.changes);
                        let commit = store.last_commit();
                        drop(store);
                        this.report_refusals(peer, &outcome.rejected);
                        if matches!(response, SyncResponse::PushAck) {
                            // A push is acknowledged once it is on this node's disk.
                            tokio::runtime::Handle::current().spawn(async move {
                                let deadline =
                                    tokio::time::Instant::now() + this.config.push_timeout;
                                let response = match this.await_durable(commit, deadline).await {
                                    Ok(()) => SyncResponse::PushAck,
                                    Err(why) => SyncResponse::Refused {
                                        reason: format!("not on this node's disk: {why}"),
                                    },
                                };
                                let bytes = response.encode();
                                this.traffic.count(bytes.len(), received);
                                request.respond(bytes);
                            });
                            return;
                        }
                        response
                    }
                    Err(error) => {
                        warn!(%peer, %error, "refused a malformed sync request");
                        SyncResponse::Refused {
                            reason: error.to_string(),
                        }
                    }
                };
                let bytes = response.encode();
                this.traffic.count(bytes.len(), received);
                request.respond(bytes);
            });
        }
    }

    /// Publishes the digest and reconciles with one differing peer per round.
    async fn anti_entropy(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(self.config.anti_entropy_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut round: usize = 0;
        loop {
            ticker.tick().await;
            round += 1;
            let members = self.membership.members().await;
            self.note_members(&members);
            if round % TOMBSTONE_ROUNDS == 1 {
                match on_disk(|| self.store().collect_tombstones(now_ms())) {
                    Ok(0) => {}
                    Ok(n) => info!(tombstones = n, "forgot tombstones older than the horizon"),
                    Err(error) => warn!(%error, "cannot collect tombstones"),
                }
            }
            let ours = self.read(|s| s.root_digest());
            self.membership.publish(keys::STORE_DIGEST, &ours).await;
            let peers = self.membership.peer_values(keys::STORE_DIGEST).await;
            let mut differing: Vec<SocketAddr> = Vec::new();
            let mut equal: Vec<SocketAddr> = Vec::new();
            for peer in peers {
                match peer.value {
                    Some(Ok(theirs)) if theirs == ours => {
                        equal.push(peer.addr);
                        self.note_caught_up(peer.addr, Instant::now());
                    }
                    Some(Ok(_)) => differing.push(peer.addr),
                    _ => {}
                }
            }
            if !equal.is_empty() && differing.is_empty() {
                // A node back from longer than the tombstone horizon is current again only
                // after a resync from a peer that vouches for its state, equal digests or not
                // (`shoal_state::horizon`): otherwise its first write would be refused.
                if self.read(|s| s.lapsed(now_ms())) {
                    let peer = equal[round % equal.len()];
                    if let Err(error) = self.sync_with(peer).await {
                        debug!(%peer, %error, "resync after a long absence failed");
                    }
                } else {
                    let _ = on_disk(|| self.store().mark_synced(now_ms()));
                }
                continue;
            }
            let Some(peer) = differing.get(round % differing.len().max(1)).copied() else {
                continue;
            };
            if let Err(error) = self.sync_with(peer).await {
                debug!(%peer, %error, "anti-entropy session failed");
            }
        }
    }

    /// Records that this node holds everything `peer` held at `at`.
    pub fn note_caught_up(&self, peer: SocketAddr, at: Instant) {
        self.caught_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(peer, at);
    }

    /// How many peers this node has caught up with since `since`: it saw their store digest
    /// equal to its own, or merged a complete anti-entropy session from them begun after that
    /// instant (so it holds everything they held then).
    pub fn caught_up_since(&self, since: Instant) -> usize {
        self.caught_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|at| **at >= since)
            .count()
    }

    /// One anti-entropy session with `peer`.
    pub async fn sync_with(&self, peer: SocketAddr) -> Result<(), SyncError> {
        // What the peer sends comes from its store as it is from now on.
        let began = Instant::now();
        let (mut session, mut request) = SyncSession::start();
        let timeout = Duration::from_secs(30);
        loop {
            let payload = request.encode();
            let bytes = self
                .endpoint
                .request(peer, Channel::Sync, &payload, timeout)
                .await?;
            self.traffic.count(payload.len(), bytes.len());
            let response = SyncResponse::decode(&bytes)?;
            let step = on_disk(|| {
                let mut store = self.store();
                let step = session.on_response(&mut store, response, now_ms())?;
                // Each round's merges go to watchers now, under the lock that committed them.
                self.publish(&store, session.fresh_changes(&step));
                Ok::<_, SyncError>(step)
            })?;
            match step {
                Step::Send(next) => request = next,
                Step::Done(changes) => {
                    if !changes.is_empty() {
                        info!(%peer, changes = changes.len(),
                              received = session.entries_received, buckets = session.buckets_differing,
                              "anti-entropy merged changes");
                    }
                    log_changes(&changes);
                    if session.peer_behind {
                        info!(%peer, "peer has not synced since deletes this node forgot; not merging from it until it resyncs");
                    } else {
                        self.note_caught_up(peer, began);
                    }
                    self.report_refusals(peer, &session.rejected);
                    return Ok(());
                }
            }
        }
    }
}

impl Replication {
    /// Logs (at warn level once per key) and counts peers' entries this node refused.
    fn report_refusals(&self, peer: SocketAddr, rejected: &[StoreError]) {
        if rejected.is_empty() {
            return;
        }
        self.traffic
            .entries_refused
            .fetch_add(rejected.len() as u64, Ordering::Relaxed);
        let mut logged = self
            .refusals_logged
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for error in rejected {
            let key = match error {
                StoreError::Rejected { key, .. } => key.clone(),
                other => other.to_string(),
            };
            if logged.len() < 10_000 && logged.insert(key) {
                warn!(%peer, %error, "refused an entry from a peer");
            } else {
                debug!(%peer, %error, "refused an entry from a peer (again)");
            }
        }
    }
}

/// Anti-entropy rounds between two tombstone collections (about a minute at the default 1 s).
const TOMBSTONE_ROUNDS: usize = 60;

/// Runs store work that may take long on the disk (a bulk merge, tombstone collection, meta
/// updates): the async worker running it hands its other tasks (gossip, QUIC, the API) to
/// another thread meanwhile, so they never wait behind it. Store work answering peers runs on
/// the blocking pool (`serve`). A client's single-object write does not use it (see `write`).
fn on_disk<T>(work: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(work)
}

/// Nodes, the writer included, that must hold a write before it is acknowledged: the configured
/// quorum, capped by the largest cluster this node has known (so a one-node cluster works), and
/// at least one.
pub fn quorum_needed(write_quorum: usize, peak_members: usize) -> usize {
    write_quorum.min(peak_members).max(1)
}

fn log_changes(changes: &[Change]) {
    for change in changes {
        debug!(key = %change.key, rv = change.resource_version, event = ?change.event, "replicated change");
    }
}

/// The home of `key` among the live `members` (this node included): its name, and its address
/// unless it is this node. `None` when no live member has a valid id.
fn home_of(
    key: &ObjectKey,
    members: &[shoal_gossip::Member],
) -> Option<(String, Option<SocketAddr>)> {
    let live: Vec<(u64, &shoal_gossip::Member)> = members
        .iter()
        .filter(|m| m.is_self || m.state == MemberState::Alive)
        .filter_map(|m| Some((u64::from_str_radix(&m.node_id, 16).ok()?, m)))
        .collect();
    let home = shoal_core::placement::auction::auctioneer(
        &key.to_string(),
        live.iter().map(|(id, _)| *id),
    )?;
    let (_, member) = live.iter().find(|(id, _)| *id == home)?;
    let addr = (!member.is_self).then_some(member.gossip_addr);
    Some((member.name().to_owned(), addr))
}

/// The error a home's refusal of a serialized write of `key` is to the client.
fn refused(key: ObjectKey, home: &str, refusal: Refusal) -> WriteError {
    match refusal {
        Refusal::Conflict(reason) => StoreError::Conflict { key, reason }.into(),
        Refusal::NotFound => StoreError::NotFound { key }.into(),
        Refusal::AlreadyExists => StoreError::AlreadyExists { key }.into(),
        Refusal::NotDurable { acked, needed, why } => WriteError::NotDurable {
            acked,
            needed,
            why: format!("{why} (the write was decided by {home}, the node that orders it)"),
        },
        Refusal::Unavailable { reachable, needed } => WriteError::Home {
            home: home.to_owned(),
            reason: format!(
                "only {reachable} of the {needed} nodes of the write quorum are reachable from it"
            ),
        },
        Refusal::Rejected(reason) => WriteError::Home {
            home: home.to_owned(),
            reason,
        },
    }
}

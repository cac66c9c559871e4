//! Replication of the desired-state store between agents, over the node endpoint's sync channel.
//!
//! - Write path: validate → commit locally (fsync) → push the new state to every live peer at
//!   once → acknowledge when `min(write_quorum, live nodes)` nodes (this one included) hold it
//!   durably. Peers that missed the push get it by anti-entropy.
//! - Anti-entropy: every node gossips its store's root digest; a node whose digest differs from
//!   a live peer's runs a [`SyncSession`] with it (bucket hashes, then only differing buckets).
//!
//! The protocol logic lives in `shoal_state::sync`; this module only moves bytes and time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use shoal_gossip::{Channel, IncomingRequests, MemberState, Membership, PeerEndpoint, keys};
use shoal_state::sync::{self, Step, SyncSession};
use shoal_state::{
    Change, ObjectKey, Staged, Store, StoreError, SyncRequest, SyncResponse, ValidObject,
    WireEntry, WriteMode,
};
use tracing::{debug, info, warn};

/// Tunables of replication.
#[derive(Debug, Clone)]
pub struct ReplicationConfig {
    /// Nodes (this one included) that must hold a write durably before it is acknowledged,
    /// capped by the number of live nodes. Default 2.
    pub write_quorum: usize,
    /// How long a write waits for its quorum. Default 5 s.
    pub push_timeout: Duration,
    /// Period of digest publication and anti-entropy. Default 1 s.
    pub anti_entropy_interval: Duration,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        Self {
            write_quorum: 2,
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
        "the write is stored on this node but only {acked} of the {needed} nodes required by the write quorum confirmed it within {timeout:?}; retry (writes are idempotent)"
    )]
    NotDurable {
        acked: usize,
        needed: usize,
        timeout: Duration,
    },
}

/// The store, shared by the API and replication.
pub struct Replication {
    store: Arc<Mutex<Store>>,
    endpoint: PeerEndpoint,
    membership: Arc<Membership>,
    config: ReplicationConfig,
    traffic: SyncTraffic,
    changes: tokio::sync::broadcast::Sender<Change>,
}

/// Bytes of sync payloads this node sent and received (pushes and anti-entropy, both roles).
#[derive(Debug, Default)]
pub struct SyncTraffic {
    pub sent: AtomicU64,
    pub received: AtomicU64,
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
        Arc::new(Self {
            store: Arc::new(Mutex::new(store)),
            endpoint,
            membership,
            config,
            traffic: SyncTraffic::default(),
            changes: tokio::sync::broadcast::channel(1024).0,
        })
    }

    /// Starts answering peers and running anti-entropy.
    pub fn start(self: &Arc<Self>) -> Result<(), shoal_gossip::EndpointError> {
        let requests = self.endpoint.subscribe_requests(Channel::Sync)?;
        tokio::spawn(self.clone().serve(requests));
        tokio::spawn(self.clone().anti_entropy());
        Ok(())
    }

    /// Sync payload bytes sent and received so far.
    pub fn traffic(&self) -> (u64, u64) {
        (
            self.traffic.sent.load(Ordering::Relaxed),
            self.traffic.received.load(Ordering::Relaxed),
        )
    }

    /// Every committed change from now on, local or replicated (for watches). A receiver that
    /// lags more than 1,024 changes gets `Lagged` and must relist.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    fn publish(&self, changes: impl IntoIterator<Item = Change>) {
        for change in changes {
            let _ = self.changes.send(change);
        }
    }

    /// Reads under the store lock.
    pub fn read<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        f(&self.store.lock().unwrap())
    }

    /// Writes an object and waits for the write quorum. The push to peers starts before the
    /// local fsync, so the two overlap; the write is acknowledged only when both are done.
    pub async fn write(
        &self,
        object: ValidObject,
        mode: WriteMode,
    ) -> Result<(Value, bool), WriteError> {
        let peers = self.live_peers().await;
        let (written, acks) = {
            let mut store = self.store.lock().unwrap();
            match store.stage(object, mode)? {
                Staged::Unchanged(written) => return Ok((written.object, false)),
                Staged::Changed(entry) => {
                    let acks = self.push(entry.clone(), &peers);
                    (store.commit_staged(entry)?, acks)
                }
            }
        };
        let created = written
            .change
            .as_ref()
            .is_some_and(|c| c.event == shoal_state::EventType::Added);
        self.publish(written.change.clone());
        self.await_quorum(acks, peers.len()).await?;
        Ok((written.object, created))
    }

    /// Deletes an object and waits for the write quorum.
    pub async fn delete(&self, key: &ObjectKey, uid: Option<&str>) -> Result<Value, WriteError> {
        let peers = self.live_peers().await;
        let written = {
            let mut store = self.store.lock().unwrap();
            store.delete(key, uid)?
        };
        let acks = self.push(written.entry.clone(), &peers);
        self.publish(written.change.clone());
        self.await_quorum(acks, peers.len()).await?;
        Ok(written.object)
    }

    /// Live peers' addresses.
    async fn live_peers(&self) -> Vec<SocketAddr> {
        self.membership
            .members()
            .await
            .into_iter()
            .filter(|m| !m.is_self && m.state == MemberState::Alive)
            .map(|m| m.gossip_addr)
            .collect()
    }

    /// Starts pushing `entry` to `peers`; each push reports whether the peer made it durable.
    fn push(&self, entry: WireEntry, peers: &[SocketAddr]) -> tokio::sync::mpsc::Receiver<bool> {
        let (tx, rx) = tokio::sync::mpsc::channel(peers.len().max(1));
        let payload = Arc::new(
            SyncRequest::Push {
                entries: vec![entry],
            }
            .encode(),
        );
        self.traffic.count(payload.len() * peers.len(), 0);
        for &peer in peers {
            let (endpoint, payload, tx) = (self.endpoint.clone(), payload.clone(), tx.clone());
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
                            warn!(%peer, response = ?other, "peer did not accept a pushed write");
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

    /// Waits until `min(write_quorum, peers + 1)` nodes, this one included, hold the write.
    async fn await_quorum(
        &self,
        mut acks: tokio::sync::mpsc::Receiver<bool>,
        peers: usize,
    ) -> Result<(), WriteError> {
        let needed = self.config.write_quorum.min(peers + 1);
        let mut acked = 1; // this node: committed and fsync'd
        let deadline = tokio::time::Instant::now() + self.config.push_timeout;
        while acked < needed {
            match tokio::time::timeout_at(deadline, acks.recv()).await {
                Ok(Some(true)) => acked += 1,
                Ok(Some(false)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        if acked >= needed {
            Ok(())
        } else {
            Err(WriteError::NotDurable {
                acked,
                needed,
                timeout: self.config.push_timeout,
            })
        }
    }

    /// Answers peers' sync requests.
    async fn serve(self: Arc<Self>, mut requests: IncomingRequests) {
        while let Some(request) = requests.recv().await {
            let this = self.clone();
            // Store work (fsync) runs off the async workers.
            tokio::task::spawn_blocking(move || {
                let peer = request.peer;
                let received = request.payload.len();
                let response = match SyncRequest::decode(&request.payload) {
                    Ok(req) => {
                        let (response, outcome) =
                            sync::serve(&mut this.store.lock().unwrap(), req, now_ms());
                        for rejected in &outcome.rejected {
                            warn!(%peer, error = %rejected, "refused an entry from a peer");
                        }
                        this.publish(outcome.changes);
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
            let ours = self.read(|s| s.root_digest());
            self.membership.publish(keys::STORE_DIGEST, &ours).await;
            let peers = self.membership.peer_values(keys::STORE_DIGEST).await;
            let mut differing: Vec<SocketAddr> = Vec::new();
            let mut in_sync = false;
            for peer in peers {
                match peer.value {
                    Some(Ok(theirs)) if theirs == ours => in_sync = true,
                    Some(Ok(_)) => differing.push(peer.addr),
                    _ => {}
                }
            }
            if in_sync && differing.is_empty() {
                let _ = self.store.lock().unwrap().mark_synced(now_ms());
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

    /// One anti-entropy session with `peer`.
    pub async fn sync_with(&self, peer: SocketAddr) -> Result<(), String> {
        let (mut session, mut request) = {
            let store = self.store.lock().unwrap();
            SyncSession::start(&store, now_ms())
        };
        let timeout = Duration::from_secs(30);
        loop {
            let payload = request.encode();
            let bytes = self
                .endpoint
                .request(peer, Channel::Sync, &payload, timeout)
                .await
                .map_err(|e| e.to_string())?;
            self.traffic.count(payload.len(), bytes.len());
            let response = SyncResponse::decode(&bytes).map_err(|e| e.to_string())?;
            let step = {
                let mut store = self.store.lock().unwrap();
                session
                    .on_response(&mut store, response, now_ms())
                    .map_err(|e| e.to_string())?
            };
            match step {
                Step::Send(next) => request = next,
                Step::Done(changes) => {
                    if !changes.is_empty() {
                        info!(%peer, changes = changes.len(),
                              received = session.entries_received, buckets = session.buckets_differing,
                              "anti-entropy merged changes");
                    }
                    log_changes(&changes);
                    self.publish(changes);
                    return Ok(());
                }
            }
        }
    }
}

fn log_changes(changes: &[Change]) {
    for change in changes {
        debug!(key = %change.key, rv = change.resource_version, event = ?change.event, "replicated change");
    }
}

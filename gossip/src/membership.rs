//! Cluster membership: chitchat (scuttlebutt + phi-accrual) run over any [`Transport`], with
//! typed node metadata and a member list that collapses restarts (generations) of one node.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chitchat::transport::Transport;
use chitchat::{ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, spawn_chitchat};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::liveness::{LivenessTracker, MemberState, Verdict};
use crate::node_meta::{Key, MetaError, NodeMeta};

/// How this node joins and watches the cluster.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    /// Stable id of this node (persisted by the agent).
    pub node_id: String,
    /// Restart counter; must grow on every start of the same node id.
    pub generation: u64,
    /// Nodes with another cluster id are ignored (chitchat's BadCluster).
    pub cluster_id: String,
    /// Address peers use to reach this node.
    pub advertise_addr: SocketAddr,
    /// Address the transport listens on.
    pub listen_addr: SocketAddr,
    /// Any existing members (host:port), tried until one answers.
    pub seeds: Vec<String>,
    /// Period of gossip rounds (each round talks to up to 3 live nodes).
    pub gossip_interval: Duration,
    /// A node is declared dead when the time since its last heartbeat exceeds
    /// `phi_threshold` mean heartbeat intervals (chitchat's phi-accrual detector, judged once
    /// per round), or `phi_threshold` gossip intervals (the tracker, sampled 8 times a round).
    ///
    /// Default 6: a failure is seen by all within 1.5 s at the default 200 ms interval
    /// (BENCHMARKS.md). The trade-off is false suspicion: 6 rounds (1.2 s) without a heartbeat
    /// from a live node — an agent starved of CPU, a congested link — make it dead. The
    /// 10-minute soak with a CPU hog per core and store writes (BENCHMARKS.md) saw none; chitchat's
    /// own default is 8, Cassandra's 8, Akka's 10, on coarser heartbeats.
    pub phi_threshold: f64,
    /// How long a dead node stays listed before it is forgotten.
    pub dead_node_grace_period: Duration,
}

impl MembershipConfig {
    pub fn new(
        node_id: impl Into<String>,
        generation: u64,
        cluster_id: impl Into<String>,
        addr: SocketAddr,
    ) -> Self {
        Self {
            node_id: node_id.into(),
            generation,
            cluster_id: cluster_id.into(),
            advertise_addr: addr,
            listen_addr: addr,
            seeds: Vec::new(),
            gossip_interval: Duration::from_millis(200),
            phi_threshold: 6.0,
            dead_node_grace_period: Duration::from_secs(600),
        }
    }

    /// Silence after which a live node is shown as suspect: half of what the failure
    /// detector needs to declare it dead with a steady heartbeat.
    fn suspect_after(&self) -> Duration {
        self.gossip_interval
            .mul_f64((self.phi_threshold / 2.0).max(1.0))
    }

    /// Silence after which the failure detector declares a node dead, at a steady heartbeat.
    fn dead_after(&self) -> Duration {
        self.gossip_interval.mul_f64(self.phi_threshold)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("cannot start gossip on {addr}: {source}")]
    Start {
        addr: SocketAddr,
        source: anyhow::Error,
    },
}

/// One node as seen from here (the newest generation of its id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub node_id: String,
    pub generation: u64,
    pub gossip_addr: SocketAddr,
    pub state: MemberState,
    pub is_self: bool,
    /// The metadata the node published; `None` until it arrives (or if it is invalid, see
    /// `meta_error`).
    pub meta: Option<NodeMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_error: Option<String>,
}

impl Member {
    /// The node's name, falling back to its id before its metadata arrived.
    pub fn name(&self) -> &str {
        self.meta.as_ref().map_or(&self.node_id, |m| &m.name)
    }
}

/// A value a live peer published (see [`Membership::peer_values`]).
#[derive(Debug, Clone)]
pub struct PeerValue<T> {
    pub node_id: String,
    pub addr: SocketAddr,
    /// `None` if the peer has not published the key (yet).
    pub value: Option<Result<T, MetaError>>,
}

/// A running membership: gossip task plus the state needed to answer "who is there".
pub struct Membership {
    handle: Arc<ChitchatHandle>,
    tracker: Arc<Mutex<LivenessTracker<ChitchatId>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Membership {
    /// Starts gossiping on `transport` and publishing `meta`.
    pub async fn start(
        config: MembershipConfig,
        meta: &NodeMeta,
        transport: &dyn Transport,
    ) -> Result<Self, MembershipError> {
        let (suspect_after, dead_after) = (config.suspect_after(), config.dead_after());
        let interval = config.gossip_interval;
        let chitchat_config = ChitchatConfig {
            chitchat_id: ChitchatId::new(
                config.node_id.clone(),
                config.generation,
                config.advertise_addr,
            ),
            cluster_id: config.cluster_id.clone(),
            gossip_interval: config.gossip_interval,
            listen_addr: config.listen_addr,
            seed_nodes: config.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                phi_threshold: config.phi_threshold,
                // A recent window, so the mean follows the current gossip rhythm.
                sampling_window_size: 100,
                // Gaps longer than a few rounds (a node paused, a partition) are not rhythm:
                // counted, they would inflate the mean and slow detection of the next failure.
                max_interval: config.gossip_interval * 5,
                initial_interval: config.gossip_interval,
                dead_node_grace_period: config.dead_node_grace_period,
            },
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            extra_liveness_predicate: None,
        };
        let handle = spawn_chitchat(chitchat_config, meta.key_values(), transport)
            .await
            .map_err(|source| MembershipError::Start {
                addr: config.listen_addr,
                source,
            })?;
        let handle = Arc::new(handle);
        let tracker = Arc::new(Mutex::new(LivenessTracker::new(suspect_after, dead_after)));
        let tasks = vec![
            tokio::spawn(watch_liveness(handle.chitchat(), tracker.clone(), interval)),
            tokio::spawn(join_burst(handle.clone(), interval)),
        ];
        Ok(Self {
            handle,
            tracker,
            tasks,
        })
    }

    /// Wakes the returned [`tokio::sync::Notify`] each time gossip brings a peer's new value of
    /// a key starting with `prefix` (a reader then looks at once instead of at its next
    /// period). Deleted keys are not notified (chitchat does not), so readers still look
    /// periodically too. The subscription lasts as long as the returned handle.
    pub async fn on_change(
        &self,
        prefix: &str,
    ) -> (Arc<tokio::sync::Notify>, chitchat::ListenerHandle) {
        let notify = Arc::new(tokio::sync::Notify::new());
        let wake = notify.clone();
        let chitchat = self.handle.chitchat();
        let listener = chitchat
            .lock()
            .await
            .subscribe_event(prefix, move |_| wake.notify_one());
        (notify, listener)
    }

    pub fn node_id(&self) -> &str {
        &self.handle.chitchat_id().node_id
    }

    pub fn generation(&self) -> u64 {
        self.handle.chitchat_id().generation_id
    }

    /// Every known node (newest generation per node id), sorted by name.
    pub async fn members(&self) -> Vec<Member> {
        let chitchat = self.handle.chitchat();
        let chitchat = chitchat.lock().await;
        members_of(&chitchat, &self.tracker, Instant::now())
    }

    /// Republishes this node's metadata (e.g. after a label change).
    pub async fn set_meta(&self, meta: &NodeMeta) {
        let chitchat = self.handle.chitchat();
        let mut chitchat = chitchat.lock().await;
        let state = chitchat.self_node_state();
        for (key, value) in meta.key_values() {
            state.set(key, value);
        }
    }

    /// Publishes `value` under `key` in this node's gossip state.
    pub async fn publish<T: Serialize + DeserializeOwned>(&self, key: Key<T>, value: &T) {
        let chitchat = self.handle.chitchat();
        let mut chitchat = chitchat.lock().await;
        chitchat
            .self_node_state()
            .set(key.name(), key.encode(value));
    }

    /// Sets (`Some`) or deletes (`None`) one key of this node's gossip state whose name is
    /// not fixed (e.g. one key per pod: `pod.<uid>`).
    pub async fn set_dynamic(&self, key: &str, value: Option<String>) {
        let chitchat = self.handle.chitchat();
        let mut chitchat = chitchat.lock().await;
        let state = chitchat.self_node_state();
        match value {
            Some(value) => state.set(key, value),
            None => state.delete(key),
        }
    }

    /// What [`Membership::dynamic_values`] and the live nodes' metadata depend on, cheap to
    /// compare: each live node (id, generation) with the highest version of its published
    /// state. Equal answers mean no live node published, changed or deleted a key in between
    /// and none came or went, so a reader polling those values may skip the round.
    pub async fn values_version(&self) -> Vec<(String, u64, u64)> {
        let chitchat = self.handle.chitchat();
        let chitchat = chitchat.lock().await;
        let mut out: Vec<(String, u64, u64)> = live_ids(&chitchat, &self.tracker)
            .into_iter()
            .map(|id| {
                let version = chitchat.node_state(id).map_or(0, |s| s.max_version());
                (id.node_id.to_string(), id.generation_id, version)
            })
            .collect();
        out.sort();
        out
    }

    /// Each live node's heartbeat as this node last saw it (node id, heartbeat). A node's
    /// heartbeat advances once per gossip round of that node, so a reader can tell that rounds
    /// went by (and reached it) without timing them.
    pub async fn heartbeats(&self) -> Vec<(String, u64)> {
        let chitchat = self.handle.chitchat();
        let chitchat = chitchat.lock().await;
        let mut out: Vec<(String, u64)> = live_ids(&chitchat, &self.tracker)
            .into_iter()
            .map(|id| {
                let heartbeat = chitchat.node_state(id).map_or(0, |s| s.heartbeat().into());
                (id.node_id.to_string(), heartbeat)
            })
            .collect();
        out.sort();
        out
    }

    /// Every live node's keys starting with `prefix`, this node's included (newest generation
    /// of each node id): (node id, key, value).
    pub async fn dynamic_values(&self, prefix: &str) -> Vec<(String, String, String)> {
        let chitchat = self.handle.chitchat();
        let chitchat = chitchat.lock().await;
        let mut out = Vec::new();
        for id in live_ids(&chitchat, &self.tracker) {
            let Some(state) = chitchat.node_state(id) else {
                continue;
            };
            for (key, value) in state.iter_prefix(prefix) {
                out.push((id.node_id.to_string(), key.to_owned(), value.value.clone()));
            }
        }
        out
    }

    /// The value of `key` published by each live peer (newest generation of each node id).
    pub async fn peer_values<T: Serialize + DeserializeOwned>(
        &self,
        key: Key<T>,
    ) -> Vec<PeerValue<T>> {
        let chitchat = self.handle.chitchat();
        let chitchat = chitchat.lock().await;
        let self_id = chitchat.self_chitchat_id().clone();
        let newest: Vec<&ChitchatId> = live_ids(&chitchat, &self.tracker)
            .into_iter()
            .filter(|id| id.node_id != self_id.node_id)
            .collect();
        newest
            .into_iter()
            .filter_map(|id| {
                let state = chitchat.node_state(id)?;
                Some(PeerValue {
                    node_id: id.node_id.to_string(),
                    addr: id.gossip_advertise_addr,
                    value: state.get(key.name()).map(|raw| key.decode(raw)),
                })
            })
            .collect()
    }

    /// The value of `key` this node published, if it did.
    pub async fn own_value<T: Serialize + DeserializeOwned>(
        &self,
        key: Key<T>,
    ) -> Option<Result<T, MetaError>> {
        let chitchat = self.handle.chitchat();
        let mut chitchat = chitchat.lock().await;
        chitchat
            .self_node_state()
            .get(key.name())
            .map(|raw| key.decode(raw))
    }

    /// Stops gossiping. Peers will see this node dead after their detection delay.
    pub async fn shutdown(&self) {
        for task in &self.tasks {
            task.abort();
        }
        if self.handle.initiate_shutdown().is_ok() {
            let _ = self.handle.termination_watcher().await;
        }
    }
}

/// The nodes shown live — `alive` or `suspect` by the member-state rule, this node included —
/// newest generation of each id: what the data read from gossip (pod statuses, published
/// values) is taken from, so it follows the same rule as the member list and does not blink
/// out when chitchat's own verdict lags (its detector judges once per round).
fn live_ids<'a>(
    chitchat: &'a chitchat::Chitchat,
    tracker: &Mutex<LivenessTracker<ChitchatId>>,
) -> Vec<&'a ChitchatId> {
    observe_states(chitchat, tracker, Instant::now())
        .into_iter()
        .filter(|(_, state)| matches!(state, MemberState::Alive | MemberState::Suspect))
        .map(|(id, _)| id)
        .collect()
}

/// The newest generation of each node id among `ids`, by node id: older generations are past
/// lives of a restart.
fn newest_generations<'a>(
    ids: impl Iterator<Item = &'a ChitchatId>,
) -> BTreeMap<&'a str, &'a ChitchatId> {
    let mut newest: BTreeMap<&str, &ChitchatId> = BTreeMap::new();
    for id in ids {
        let slot = newest.entry(&id.node_id).or_insert(id);
        if id.generation_id > slot.generation_id {
            *slot = id;
        }
    }
    newest
}

/// The newest generation of every known node id with its state, as the tracker classifies it now.
fn observe_states<'a>(
    chitchat: &'a chitchat::Chitchat,
    tracker: &Mutex<LivenessTracker<ChitchatId>>,
    now: Instant,
) -> Vec<(&'a ChitchatId, MemberState)> {
    let self_id = chitchat.self_chitchat_id();
    let live: HashSet<&ChitchatId> = chitchat.live_nodes().collect();
    let dead: HashSet<&ChitchatId> = chitchat.dead_nodes().collect();
    let newest = newest_generations(chitchat.node_states().keys());
    let mut tracker = tracker
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let states = newest
        .into_values()
        .filter_map(|id| {
            let node_state = chitchat.node_state(id)?;
            if id == self_id {
                return Some((id, MemberState::Alive));
            }
            let verdict = if live.contains(id) {
                Some(Verdict::Live)
            } else if dead.contains(id) {
                Some(Verdict::Dead)
            } else {
                None
            };
            Some((
                id,
                tracker.observe(now, id, node_state.heartbeat().into(), verdict),
            ))
        })
        .collect();
    let known = chitchat.node_states();
    tracker.retain(|id| known.contains_key(id));
    states
}

fn members_of(
    chitchat: &chitchat::Chitchat,
    tracker: &Mutex<LivenessTracker<ChitchatId>>,
    now: Instant,
) -> Vec<Member> {
    let self_id = chitchat.self_chitchat_id();
    let mut members: Vec<Member> = observe_states(chitchat, tracker, now)
        .into_iter()
        .filter_map(|(id, state)| {
            let node_state = chitchat.node_state(id)?;
            let (meta, meta_error) = match NodeMeta::read(|k| node_state.get(k)) {
                Ok(meta) => (Some(meta), None),
                Err(err) => (None, Some(err.to_string())),
            };
            Some(Member {
                node_id: id.node_id.to_string(),
                generation: id.generation_id,
                gossip_addr: id.gossip_advertise_addr,
                state,
                is_self: id == self_id,
                meta,
                meta_error,
            })
        })
        .collect();
    members.sort_by(|a, b| a.name().cmp(b.name()).then(a.node_id.cmp(&b.node_id)));
    members
}

/// How often heartbeats are sampled: a few times per gossip round, so that an advance is seen
/// (and a joining node shown alive) within a fraction of a round of its arrival.
fn sample_period(interval: Duration) -> Duration {
    (interval / 8).max(Duration::from_millis(5))
}

/// Samples every node's heartbeat several times per gossip round, and logs joins and state
/// changes once per round.
async fn watch_liveness(
    chitchat: Arc<tokio::sync::Mutex<chitchat::Chitchat>>,
    tracker: Arc<Mutex<LivenessTracker<ChitchatId>>>,
    interval: Duration,
) {
    let sample = sample_period(interval);
    let per_report = (interval.as_nanos() / sample.as_nanos()).max(1);
    let mut previous: BTreeMap<String, (u64, MemberState)> = BTreeMap::new();
    let mut ticker = tokio::time::interval(sample);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for tick in 0u128.. {
        ticker.tick().await;
        let members = {
            let chitchat = chitchat.lock().await;
            if tick % per_report != 0 {
                observe_states(&chitchat, &tracker, Instant::now());
                continue;
            }
            members_of(&chitchat, &tracker, Instant::now())
        };
        for m in &members {
            let now = (m.generation, m.state);
            match previous.get(&m.node_id) {
                None => {
                    info!(node = m.name(), id = %m.node_id, generation = m.generation, addr = %m.gossip_addr, state = %m.state, "member discovered")
                }
                Some(before) if *before != now => {
                    info!(node = m.name(), id = %m.node_id, generation = m.generation, from = %before.1, to = %m.state, "member changed")
                }
                Some(_) => {}
            }
        }
        previous = members
            .into_iter()
            .map(|m| (m.node_id, (m.generation, m.state)))
            .collect();
    }
}

/// Right after start, gossips directly with the peers it learns of (see [`JoinBurst`]).
async fn join_burst(handle: Arc<ChitchatHandle>, interval: Duration) {
    let self_id = handle.chitchat_id().clone();
    let mut burst = JoinBurst::new(Instant::now(), interval, &self_id.node_id);
    let mut ticker = tokio::time::interval(sample_period(interval));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let peers: Vec<SocketAddr> = {
            let chitchat = handle.chitchat();
            let chitchat = chitchat.lock().await;
            chitchat
                .node_states()
                .keys()
                .filter(|id| id.node_id != self_id.node_id)
                .map(|id| id.gossip_advertise_addr)
                .collect()
        };
        let Some(targets) = burst.next(Instant::now(), &peers) else {
            return;
        };
        for addr in targets {
            if handle.gossip(addr).is_err() {
                return; // chitchat stopped
            }
        }
    }
}

/// A node that just started tells its peers about itself at once instead of waiting for
/// random gossip to carry it (memberlist's push on join, in chitchat's terms): every peer it
/// learns of in its first rounds gets two direct gossip messages, `spacing` apart, so that the
/// peer sees this node's heartbeat advance once — what the peer needs to show it alive — and
/// this node gets the peer's fresh heartbeat twice in the answers. At most [`BURST_PEERS`] peers
/// (chosen by a hash salted with the node id, so joiners spread over a large cluster); random
/// gossip reaches the rest.
///
/// Pure: fed with the peers known and the time.
#[derive(Debug)]
pub(crate) struct JoinBurst {
    until: Instant,
    spacing: Duration,
    salt: u64,
    /// Per peer: messages sent (1 or 2) and when the last one went.
    sent: HashMap<SocketAddr, (u8, Instant)>,
}

/// Most peers a joining node sends its burst to.
pub(crate) const BURST_PEERS: usize = 32;
/// Gossip rounds after start during which newly learnt peers get the burst.
const BURST_ROUNDS: u32 = 10;

impl JoinBurst {
    pub(crate) fn new(start: Instant, interval: Duration, node_id: &str) -> Self {
        Self {
            until: start + interval * BURST_ROUNDS,
            spacing: interval / 4,
            salt: hash_of(&node_id),
            sent: HashMap::new(),
        }
    }

    /// The peers to send a gossip message to now; `None` once the burst is over.
    pub(crate) fn next(&mut self, now: Instant, peers: &[SocketAddr]) -> Option<Vec<SocketAddr>> {
        let done = self.sent.len() >= BURST_PEERS && self.sent.values().all(|(n, _)| *n >= 2);
        if now >= self.until || done {
            return None;
        }
        let mut fresh: Vec<SocketAddr> = peers
            .iter()
            .filter(|p| !self.sent.contains_key(p))
            .copied()
            .collect();
        fresh.sort_by_key(|p| (hash_of(&(self.salt, p)), *p));
        fresh.dedup();
        let mut out = Vec::new();
        for peer in fresh
            .into_iter()
            .take(BURST_PEERS.saturating_sub(self.sent.len()))
        {
            self.sent.insert(peer, (1, now));
            out.push(peer);
        }
        for (peer, (count, last)) in &mut self.sent {
            if *count == 1 && now.saturating_duration_since(*last) >= self.spacing {
                *count = 2;
                *last = now;
                out.push(*peer);
            }
        }
        out.sort();
        Some(out)
    }
}

fn hash_of(value: &impl std::hash::Hash) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(range: std::ops::Range<u16>) -> Vec<SocketAddr> {
        range.map(|p| ([127, 0, 0, 1], p).into()).collect()
    }

    const ROUND: Duration = Duration::from_millis(200);

    #[test]
    fn every_peer_gets_two_messages_a_quarter_round_apart() {
        let t0 = Instant::now();
        let mut burst = JoinBurst::new(t0, ROUND, "a");
        let ms = Duration::from_millis;
        assert_eq!(burst.next(t0, &[]), Some(vec![]));
        // The seed's answer names three peers.
        assert_eq!(burst.next(t0 + ms(25), &peers(1..4)), Some(peers(1..4)));
        assert_eq!(burst.next(t0 + ms(50), &peers(1..4)), Some(vec![]));
        // A fourth peer learnt later gets its first message; the first three their second.
        let mut expected = peers(1..5);
        expected.sort();
        assert_eq!(burst.next(t0 + ms(75), &peers(1..5)), Some(expected));
        assert_eq!(burst.next(t0 + ms(100), &peers(1..5)), Some(vec![]));
        assert_eq!(burst.next(t0 + ms(125), &peers(1..5)), Some(peers(4..5)));
        // Nothing more for them, and nothing at all after ten rounds.
        assert_eq!(burst.next(t0 + ms(1000), &peers(1..5)), Some(vec![]));
        assert_eq!(burst.next(t0 + ROUND * 10, &peers(1..9)), None);
    }

    #[test]
    fn a_large_cluster_gets_a_bounded_burst_spread_by_node_id() {
        let t0 = Instant::now();
        let all = peers(1..1001);
        let first = |id: &str| {
            let mut burst = JoinBurst::new(t0, ROUND, id);
            let sent = burst.next(t0, &all).unwrap();
            assert_eq!(sent.len(), BURST_PEERS);
            assert_eq!(
                burst.next(t0 + ROUND, &all).unwrap(),
                sent,
                "second message"
            );
            assert_eq!(burst.next(t0 + ROUND * 2, &all), None, "done");
            sent
        };
        let (a, b) = (first("a"), first("b"));
        let shared = a.iter().filter(|p| b.contains(p)).count();
        assert!(shared < BURST_PEERS / 2, "{shared} peers in common");
    }
}

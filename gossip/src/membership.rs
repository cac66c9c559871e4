//! Cluster membership: chitchat (scuttlebutt + phi-accrual) run over any [`Transport`], with
//! typed node metadata and a member list that collapses restarts (generations) of one node.

use std::collections::{BTreeMap, HashSet};
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
    /// `phi_threshold` mean heartbeat intervals.
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
            phi_threshold: 8.0,
            dead_node_grace_period: Duration::from_secs(600),
        }
    }

    /// Silence after which a live node is shown as suspect: half of what the failure
    /// detector needs to declare it dead with a steady heartbeat.
    fn suspect_after(&self) -> Duration {
        self.gossip_interval
            .mul_f64((self.phi_threshold / 2.0).max(1.0))
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
    handle: ChitchatHandle,
    tracker: Arc<Mutex<LivenessTracker<ChitchatId>>>,
    reporter: tokio::task::JoinHandle<()>,
}

impl Membership {
    /// Starts gossiping on `transport` and publishing `meta`.
    pub async fn start(
        config: MembershipConfig,
        meta: &NodeMeta,
        transport: &dyn Transport,
    ) -> Result<Self, MembershipError> {
        let suspect_after = config.suspect_after();
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
        let tracker = Arc::new(Mutex::new(LivenessTracker::new(suspect_after)));
        let reporter = tokio::spawn(report_changes(handle.chitchat(), tracker.clone(), interval));
        Ok(Self {
            handle,
            tracker,
            reporter,
        })
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

    /// Every live node's keys starting with `prefix`, this node's included (newest generation
    /// of each node id): (node id, key, value).
    pub async fn dynamic_values(&self, prefix: &str) -> Vec<(String, String, String)> {
        let chitchat = self.handle.chitchat();
        let chitchat = chitchat.lock().await;
        let mut newest: BTreeMap<&str, &ChitchatId> = BTreeMap::new();
        let self_id = chitchat.self_chitchat_id().clone();
        for id in chitchat.live_nodes().chain(std::iter::once(&self_id)) {
            let slot = newest.entry(&id.node_id).or_insert(id);
            if id.generation_id > slot.generation_id {
                *slot = id;
            }
        }
        let mut out = Vec::new();
        for id in newest.into_values() {
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
        let mut newest: BTreeMap<&str, &ChitchatId> = BTreeMap::new();
        for id in chitchat
            .live_nodes()
            .filter(|id| id.node_id != self_id.node_id)
        {
            let slot = newest.entry(&id.node_id).or_insert(id);
            if id.generation_id > slot.generation_id {
                *slot = id;
            }
        }
        newest
            .into_values()
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

    /// Stops gossiping. Peers will see this node dead after their detection delay.
    pub async fn shutdown(&self) {
        self.reporter.abort();
        if self.handle.initiate_shutdown().is_ok() {
            let _ = self.handle.termination_watcher().await;
        }
    }
}

fn members_of(
    chitchat: &chitchat::Chitchat,
    tracker: &Mutex<LivenessTracker<ChitchatId>>,
    now: Instant,
) -> Vec<Member> {
    let self_id = chitchat.self_chitchat_id().clone();
    let live: HashSet<&ChitchatId> = chitchat.live_nodes().collect();
    let dead: HashSet<&ChitchatId> = chitchat.dead_nodes().collect();
    let mut tracker = tracker.lock().unwrap();
    // Newest generation of each node id wins; older generations are past lives of a restart.
    let mut newest: BTreeMap<&str, &ChitchatId> = BTreeMap::new();
    for id in chitchat.node_states().keys() {
        let slot = newest.entry(&id.node_id).or_insert(id);
        if id.generation_id > slot.generation_id {
            *slot = id;
        }
    }
    let mut members: Vec<Member> = newest
        .into_values()
        .filter_map(|id| {
            let node_state = chitchat.node_state(id)?;
            let is_self = *id == self_id;
            let state = if is_self {
                MemberState::Alive
            } else {
                let verdict = if live.contains(id) {
                    Some(Verdict::Live)
                } else if dead.contains(id) {
                    Some(Verdict::Dead)
                } else {
                    None
                };
                tracker.observe(now, id, node_state.heartbeat().into(), verdict)
            };
            let (meta, meta_error) = match NodeMeta::read(|k| node_state.get(k)) {
                Ok(meta) => (Some(meta), None),
                Err(err) => (None, Some(err.to_string())),
            };
            Some(Member {
                node_id: id.node_id.to_string(),
                generation: id.generation_id,
                gossip_addr: id.gossip_advertise_addr,
                state,
                is_self,
                meta,
                meta_error,
            })
        })
        .collect();
    let known: HashSet<&ChitchatId> = chitchat.node_states().keys().collect();
    tracker.retain(|id| known.contains(id));
    members.sort_by(|a, b| a.name().cmp(b.name()).then(a.node_id.cmp(&b.node_id)));
    members
}

/// Logs joins and state changes once per gossip interval.
async fn report_changes(
    chitchat: Arc<tokio::sync::Mutex<chitchat::Chitchat>>,
    tracker: Arc<Mutex<LivenessTracker<ChitchatId>>>,
    interval: Duration,
) {
    let mut previous: BTreeMap<String, (u64, MemberState)> = BTreeMap::new();
    let mut ticker = tokio::time::interval(interval);
    loop {
        ticker.tick().await;
        let members = {
            let chitchat = chitchat.lock().await;
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

//! Runs the auction (`shoal_core::placement`) on a live agent: builds the world from membership
//! and the replicated pods, carries auction messages over the node endpoint's auction channel,
//! and writes each binding as the pod's `spec.nodeName` (with its epoch in the
//! `shoal.io/binding-epoch` annotation), as a Kubernetes binding does. The store keeps the two
//! as one register ordered by (epoch, HLC, writer): a binding of an older epoch never wins
//! ([`shoal_state::crdt`]).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::PoisonError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use shoal_gossip::{
    Channel, IncomingFrames, IncomingRequests, MemberState, Membership, PeerEndpoint, keys,
};
use shoal_state::{ObjectKey, WriteMode, kind};
use tracing::{debug, info, warn};

use crate::observed::events::{self, EventType, NewEvent, ObjectRef, Recorder};

use crate::replication::Replication;
use shoal_core::placement::auction::{
    AuctionConfig, Binding, Message, NodeId, Output, Scheduler, World, auctioneer, auctioneer_of,
};
use shoal_core::placement::cluster::ClusterView;
use shoal_core::placement::eviction;
use shoal_core::placement::lease::{self, LeaseReply, LeaseRequest};
use shoal_core::placement::partition::{self, FenceConfig, Policy};
use shoal_model::placement::{NodeView, PodRequest, Resources, Taint, TaintEffect};

/// Annotation carrying a binding's epoch.
pub const EPOCH_ANNOTATION: &str = shoal_state::crdt::BINDING_EPOCH_ANNOTATION;
/// On a pod preempted (unbound) to make room: the uid of the pod that took its place. It is
/// auctioned again only once that pod's binding is visible here.
pub const PREEMPTED_BY_ANNOTATION: &str = "shoal.io/preempted-by";

/// Tunables.
#[derive(Debug, Clone)]
pub struct SchedulingConfig {
    /// Period of the scheduling loop.
    pub tick: Duration,
    /// How long a node must have been seen dead before its pods are auctioned again.
    pub eviction_delay: Duration,
    /// Timing of the `fenced` partition policy.
    pub fence: FenceConfig,
    pub auction: AuctionConfig,
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        Self {
            tick: Duration::from_millis(100),
            eviction_delay: Duration::from_secs(5),
            fence: FenceConfig::new(Duration::from_secs(4), Duration::from_secs(5)),
            auction: AuctionConfig::default(),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct WireMessage {
    from: NodeId,
    message: Message,
}

/// A live agent's scheduling.
pub struct Scheduling {
    self_id: NodeId,
    replication: Arc<Replication>,
    membership: Arc<Membership>,
    endpoint: PeerEndpoint,
    config: SchedulingConfig,
    started: Instant,
    state: Mutex<State>,
    /// Scheduled, FailedScheduling and Preempted, about the pods this node auctions.
    events: Arc<Recorder>,
    /// Wakes the loop before its tick when a pod needs an auction.
    wake: tokio::sync::Notify,
    /// The pods' gossiped statuses (a DaemonSet's rolling update counts its available pods).
    statuses: Arc<crate::observed::pod_status::PodStatusCache>,
}

/// A pod as scheduling needs it, parsed once per change.
struct PodEntry {
    request: Arc<PodRequest>,
    policy: Policy,
    /// Owned by a DaemonSet (its uid): bound to its node for good, never auctioned.
    daemon: Option<String>,
    key: ObjectKey,
    node_name: Option<String>,
    epoch: u64,
    preempted_by: Option<String>,
    /// The PersistentVolumeClaims it names (a change of one re-reads it).
    claims: Vec<String>,
    /// It has generic ephemeral volumes: their claims are made for it before its auction.
    ephemeral: bool,
}

/// What `pod`'s PersistentVolumeClaims allow, from the store now (none read when it names
/// none); `used_elsewhere`: whether another pod placed already names the claim.
fn volume_placement(
    replication: &Replication,
    pod: &Value,
    used_elsewhere: &dyn Fn(&str) -> bool,
) -> shoal_model::storage::Placement {
    use shoal_model::storage;
    let named = storage::claims_of(pod);
    if named.is_empty() {
        return Default::default();
    }
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let (Some(claims), Some(volumes), Some(classes)) = (
        kind::lookup("v1", "PersistentVolumeClaim"),
        kind::lookup("v1", "PersistentVolume"),
        kind::lookup("storage.k8s.io/v1", "StorageClass"),
    ) else {
        return Default::default();
    };
    // Its ReadWriteOncePod claims, asked of `used_elsewhere` between two reads of the store:
    // that takes the scheduler's lock, never while the store's is held.
    let one_pod: Vec<String> = replication.read(|s| {
        named
            .into_iter()
            .map(|(_, claim)| claim)
            .filter(|claim| {
                s.get(&ObjectKey::new(claims, namespace, claim))
                    .is_some_and(|c| {
                        c["spec"]["accessModes"]
                            .as_array()
                            .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"))
                    })
            })
            .collect()
    });
    let used: std::collections::HashSet<String> = one_pod
        .into_iter()
        .filter(|claim| used_elsewhere(claim))
        .collect();
    replication.read(|s| {
        let claim = |name: &str| s.get(&ObjectKey::new(claims, namespace, name));
        let volume = |name: &str| s.get(&ObjectKey::new(volumes, "", name));
        let class = |name: &str| s.get(&ObjectKey::new(classes, "", name));
        storage::placement(pod, &claim, &volume, &class, &|c| used.contains(c))
    })
}

impl PodEntry {
    fn parse(
        key: ObjectKey,
        pod: &Value,
        volumes: shoal_model::storage::Placement,
    ) -> Result<Self, shoal_model::placement::RequestError> {
        let mut request = PodRequest::from_pod(pod)?;
        request.volumes = volumes;
        Ok(Self {
            ephemeral: pod["spec"]["volumes"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v.get("ephemeral").is_some())),
            claims: shoal_model::storage::claims_of(pod)
                .into_iter()
                .map(|(_, claim)| claim)
                .collect(),
            request: Arc::new(request),
            policy: Policy::parse(pod["metadata"]["annotations"][partition::ANNOTATION].as_str()),
            daemon: shoal_core::controllers::daemon_set::daemon_set_of(pod).map(str::to_owned),
            key,
            node_name: pod["spec"]["nodeName"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
            preempted_by: pod["metadata"]["annotations"][PREEMPTED_BY_ANNOTATION]
                .as_str()
                .map(str::to_owned),
            epoch: pod["metadata"]["annotations"][EPOCH_ANNOTATION]
                .as_str()
                .and_then(|e| e.parse().ok())
                .unwrap_or(0),
        })
    }
}

#[derive(Default)]
struct State {
    scheduler: Option<Scheduler>,
    /// Every pod, kept current from the store's change feed.
    pods: HashMap<String, PodEntry>,
    cluster: ClusterView,
    addresses: HashMap<NodeId, (String, SocketAddr)>,
    dead_since: eviction::DeadTimers<String>,
    /// This node's verdicts as auctioneer.
    unschedulable: BTreeMap<String, String>,
    /// Verdicts were dropped from `unschedulable` since it was last published.
    republish: bool,
    /// The pods this node was auctioneer of at the last tick (with their epochs).
    pending: Vec<(Arc<PodRequest>, u64)>,
    /// Everyone's verdicts, refreshed every tick (for the API's PodScheduled condition).
    all_unschedulable: BTreeMap<String, String>,
    /// What this node's views say about its fenced pods (the pure core the simulator drives
    /// too); it starts stopped.
    fence: partition::Fence,
    /// The membership baseline majorities are counted against (the last tick's).
    baseline: usize,
    /// Run leases of fenced pods this node gives its peers and itself ([`lease`]).
    grantor: Option<lease::Grantor>,
    /// Run leases this node holds for the fenced pods bound to it.
    holder: lease::Holder,
    /// When this node last asked for its run leases.
    last_lease_round: Option<Duration>,
    /// The names of the nodes the membership lists (alive, suspect or dead), as of the last
    /// tick: a node no longer listed has left, and its DaemonSet pods go.
    listed: std::collections::HashSet<String>,
    /// Whether the last tick's membership view was settled.
    settled: bool,
    /// The volumes the nodes' built-in provisioners made: volume name → (node, bytes).
    volumes_given: HashMap<String, (String, u64)>,
    /// Pods (uids) whose ephemeral volumes' claims were found made: not looked at again.
    ephemeral_made: std::collections::HashSet<String>,
}

/// The binding `pods` hold for `uid`: the node it names and its epoch.
fn bound_to(pods: &HashMap<String, PodEntry>, uid: &str) -> Option<lease::Binding> {
    pods.get(uid).and_then(|p| {
        p.node_name.clone().map(|node| lease::Binding {
            name: format!("{}/{}", p.key.namespace, p.key.name),
            node,
            epoch: p.epoch,
        })
    })
}

fn to_taint(t: &shoal_gossip::NodeTaint) -> Option<Taint> {
    let effect = match t.effect.as_str() {
        "NoSchedule" => TaintEffect::NoSchedule,
        "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
        "NoExecute" => TaintEffect::NoExecute,
        _ => return None,
    };
    Some(Taint {
        key: t.key.clone(),
        value: t.value.clone(),
        effect,
    })
}

fn node_numeric_id(hex_id: &str) -> Option<NodeId> {
    u64::from_str_radix(hex_id, 16).ok()
}

/// Why a peer's run-lease request was refused.
#[derive(Debug, thiserror::Error)]
enum LeaseRefusal {
    #[error("malformed lease request: {0}")]
    Malformed(#[from] rmp_serde::decode::Error),
    #[error(transparent)]
    Invalid(#[from] lease::RequestError),
    #[error("node id {0:?} is not a hex number")]
    NodeId(String),
}

impl Scheduling {
    pub fn new(
        self_id: NodeId,
        replication: Arc<Replication>,
        membership: Arc<Membership>,
        endpoint: PeerEndpoint,
        config: SchedulingConfig,
        events: Arc<Recorder>,
        statuses: Arc<crate::observed::pod_status::PodStatusCache>,
    ) -> Arc<Self> {
        let scheduler = Scheduler::new(self_id, config.auction.clone());
        let grantor = lease::Grantor::new(Duration::ZERO, config.fence.lease_term);
        Arc::new(Self {
            self_id,
            replication,
            membership,
            endpoint,
            config,
            events,
            statuses,
            started: Instant::now(),
            wake: tokio::sync::Notify::new(),
            state: Mutex::new(State {
                scheduler: Some(scheduler),
                grantor: Some(grantor),
                ..State::default()
            }),
        })
    }

    /// Starts the loop, the pod cache and the message handler.
    pub fn start(self: &Arc<Self>) -> Result<(), shoal_gossip::EndpointError> {
        let incoming = self.endpoint.subscribe(Channel::Auction)?;
        let lease_requests = self.endpoint.subscribe_requests(Channel::Fence)?;
        // Subscribe before the first listing, so no change falls between them.
        let changes = self.replication.subscribe();
        self.reload_pods();
        // Each loop keeps its receiver across a panic (`supervise::spawn_receiving`).
        let me = self.clone();
        crate::supervise::spawn_receiving("scheduling-pods", changes, move |changes, restarted| {
            me.clone().follow(changes, restarted)
        });
        let me = self.clone();
        crate::supervise::spawn_receiving("auction-messages", incoming, move |incoming, _| {
            me.clone().receive(incoming)
        });
        let me = self.clone();
        crate::supervise::spawn_receiving("lease-requests", lease_requests, move |requests, _| {
            me.clone().serve_leases(requests)
        });
        let me = self.clone();
        crate::supervise::spawn("scheduling", move || me.clone().run());
        Ok(())
    }

    /// Whether a pod placed already, other than `pod`, names a claim of `pod`'s namespace (a
    /// `ReadWriteOncePod` claim is then not `pod`'s to use); asked only of pods with such a
    /// claim.
    fn used_elsewhere<'a>(&'a self, pod: &Value) -> impl Fn(&str) -> bool + 'a {
        let namespace = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        move |claim: &str| {
            self.state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pods
                .values()
                .any(|e| {
                    e.node_name.is_some()
                        && e.key.namespace == namespace
                        && e.request.uid != uid
                        && e.claims.iter().any(|c| c == claim)
                })
        }
    }

    /// Parses again the pods of `namespace` that name claim `claim` (it was made, bound or
    /// changed): the work is that of those pods, not of every pod.
    fn reload_claimants(&self, namespace: &str, claim: &str) {
        let keys: Vec<ObjectKey> = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pods
            .values()
            .filter(|e| e.key.namespace == namespace && e.claims.iter().any(|c| c == claim))
            .map(|e| e.key.clone())
            .collect();
        for key in keys {
            let Some(pod) = self.replication.read(|s| s.get(&key)) else {
                continue;
            };
            let volumes = volume_placement(&self.replication, &pod, &self.used_elsewhere(&pod));
            if let Ok(entry) = PodEntry::parse(key, &pod, volumes) {
                self.state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pods
                    .insert(entry.request.uid.clone(), entry);
            }
        }
    }

    fn reload_pods(&self) {
        let info = kind::lookup("v1", "Pod").expect("Pod is a known kind");
        let pods = self.replication.read(|s| s.list("", "Pod", None));
        let mut entries = HashMap::new();
        for pod in &pods {
            let key = ObjectKey::new(
                info,
                pod["metadata"]["namespace"].as_str().unwrap_or("default"),
                pod["metadata"]["name"].as_str().unwrap_or(""),
            );
            let volumes = volume_placement(&self.replication, pod, &self.used_elsewhere(pod));
            if let Ok(entry) = PodEntry::parse(key, pod, volumes) {
                entries.insert(entry.request.uid.clone(), entry);
            }
        }
        let given = self.replication.read(|s| {
            s.list("", "PersistentVolume", None)
                .iter()
                .filter_map(|v| {
                    let name = v["metadata"]["name"].as_str()?.to_owned();
                    Some((name, shoal_model::storage::given_by(v)?))
                })
                .collect()
        });
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.pods = entries;
        state.volumes_given = given;
    }

    /// Keeps the pod cache current from the store's change feed.
    /// Keeps the pod cache current from the store's change feed (`restarted`: after a panic,
    /// which lost the change being taken in, the cache is listed again first).
    async fn follow(
        self: Arc<Self>,
        changes: crate::supervise::Held<tokio::sync::broadcast::Receiver<shoal_state::Change>>,
        restarted: bool,
    ) {
        let mut changes = changes.lock().await;
        if restarted {
            self.reload_pods();
        }
        loop {
            match changes.recv().await {
                Ok(change) if change.key.kind == "Pod" && change.key.group.is_empty() => {
                    let uid = change.object["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let volumes = volume_placement(
                        &self.replication,
                        &change.object,
                        &self.used_elsewhere(&change.object),
                    );
                    let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                    if change.event == shoal_state::EventType::Deleted {
                        let gone = state.pods.remove(&uid);
                        drop(state);
                        // Its claims may be free now (a ReadWriteOncePod claim's next pod).
                        for claim in gone.map(|e| e.claims).unwrap_or_default() {
                            self.reload_claimants(&change.key.namespace, &claim);
                        }
                        continue;
                    }
                    match PodEntry::parse(change.key.clone(), &change.object, volumes) {
                        Ok(entry) => {
                            let unbound = entry.node_name.is_none();
                            state.pods.insert(uid, entry);
                            if unbound {
                                self.wake.notify_one();
                            }
                        }
                        Err(error) => {
                            debug!(pod = %change.key, %error, "pod cannot be scheduled");
                            state.pods.remove(&uid);
                        }
                    }
                }
                // A claim bound or made, a volume made or gone: where its pods may go changes.
                Ok(change)
                    if matches!(
                        change.key.kind.as_str(),
                        "PersistentVolumeClaim" | "PersistentVolume" | "StorageClass"
                    ) =>
                {
                    match change.key.kind.as_str() {
                        "PersistentVolumeClaim" => {
                            self.reload_claimants(&change.key.namespace, &change.key.name)
                        }
                        "PersistentVolume" => {
                            let given = match change.event {
                                shoal_state::EventType::Deleted => None,
                                _ => shoal_model::storage::given_by(&change.object),
                            };
                            let mut state =
                                self.state.lock().unwrap_or_else(PoisonError::into_inner);
                            match given {
                                Some(given) => {
                                    state.volumes_given.insert(change.key.name.clone(), given)
                                }
                                None => state.volumes_given.remove(&change.key.name),
                            };
                            drop(state);
                            let reference = &change.object["spec"]["claimRef"];
                            if let (Some(ns), Some(claim)) =
                                (reference["namespace"].as_str(), reference["name"].as_str())
                            {
                                self.reload_claimants(ns, claim);
                            }
                        }
                        // A class changes rarely: every pod is read again.
                        _ => self.reload_pods(),
                    }
                    if let Some(scheduler) = self
                        .state
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .scheduler
                        .as_mut()
                    {
                        scheduler.volumes_changed();
                    }
                    self.wake.notify_one();
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => self.reload_pods(),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Whether this node's fenced pods must stop: it has lacked a majority for the fence
    /// timeout (the container runtime acts on this).
    ///
    /// After the partition heals they stay stopped until this node's store has caught up with
    /// the majority's (its digest equals those of a majority of the membership): until then it
    /// cannot know whether the majority has bound them elsewhere, and starting them again
    /// could run a fenced pod twice.
    /// Hands a pod back to the auction: its binding is cleared with the epoch raised (so the
    /// older binding cannot win a merge) and its node stops it. Used for a preemption's victim
    /// (`preempted_by` names the pod that took its room) and for a pod its node refused at
    /// admission. Returns whether that was written (false: the pod is not known here yet, or the
    /// write failed; the kubelet tries again).
    pub async fn unbind(&self, pod_uid: &str, preempted_by: Option<&str>) -> bool {
        let epoch = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pods
            .get(pod_uid)
            .map(|p| p.epoch);
        match epoch {
            Some(epoch) => {
                self.write_binding(pod_uid, None, epoch.saturating_add(1), preempted_by)
                    .await
            }
            None => false,
        }
    }

    pub fn must_stop_fenced(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.fence.must_stop()
    }

    /// Whether the fenced pod `uid` may run here now: this node's fenced pods are not stopped
    /// ([`Self::must_stop_fenced`]) and it holds the pod's run lease at the epoch of its
    /// binding ([`lease`]).
    pub fn may_run_fenced(&self, uid: &str) -> bool {
        self.fenced_run_left(uid).is_some()
    }

    /// How much longer the fenced pod `uid` may run here if no further lease reply comes (the
    /// node is not fenced off and holds the pod's run lease until then); `None`: not now. The
    /// kubelet writes the end into the pod's fence lease, where its shims enforce it
    /// (`runtime::lease`).
    pub fn fenced_run_left(&self, uid: &str) -> Option<Duration> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // Read under the lock: time spent waiting for it is time the lease has run.
        let now = self.now();
        if state.fence.must_stop() {
            return None;
        }
        let pod = state.pods.get(uid)?;
        let until = state
            .holder
            .held_until(uid, pod.epoch, now, state.baseline)?;
        Some(until.saturating_sub(now))
    }

    /// Asks this node's own grantor and every live peer for the run leases of the fenced pods
    /// bound here, all in one request per peer; replies are taken in as they come. Every
    /// 500 ms, or every tick while one of them is not held.
    fn lease_round(self: &Arc<Self>) {
        let now = self.now();
        let hold = self.config.fence.lease_hold;
        let (asks, peers) = {
            let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let state = &mut *guard;
            let Some((name, _)) = state.addresses.get(&self.self_id).cloned() else {
                return;
            };
            let asks: Vec<lease::Ask> = state
                .pods
                .values()
                .filter(|p| p.policy == Policy::Fenced && p.node_name.as_deref() == Some(&name))
                .map(|p| lease::Ask {
                    uid: p.request.uid.clone(),
                    epoch: p.epoch,
                })
                .collect();
            let wanted: std::collections::HashSet<&str> =
                asks.iter().map(|a| a.uid.as_str()).collect();
            state.holder.retain(now, |uid| wanted.contains(uid));
            let all_held = asks
                .iter()
                .all(|a| state.holder.holds(&a.uid, a.epoch, now, state.baseline));
            let due = lease::round_due(state.last_lease_round, all_held, now, self.config.tick);
            if asks.is_empty() || !due {
                return;
            }
            state.last_lease_round = Some(now);
            let granted = match state.grantor.as_mut() {
                Some(grantor) => {
                    grantor.answer(now, &name, &asks, |uid| bound_to(&state.pods, uid))
                }
                None => Vec::new(),
            };
            let reply = LeaseReply {
                granted,
                baseline: u32::try_from(state.baseline).unwrap_or(u32::MAX),
            };
            let me = format!("{:016x}", self.self_id);
            state.holder.on_reply(now, hold, &me, &asks, &reply);
            let peers: Vec<(NodeId, SocketAddr)> = state
                .addresses
                .iter()
                .filter(|(id, _)| **id != self.self_id)
                .map(|(id, (_, addr))| (*id, *addr))
                .collect();
            (asks, peers)
        };
        let payload = Arc::new(
            rmp_serde::to_vec(&LeaseRequest { asks: asks.clone() })
                .expect("lease requests serialize"),
        );
        let asks = Arc::new(asks);
        for (peer, addr) in peers {
            let this = self.clone();
            let payload = payload.clone();
            let asks = asks.clone();
            tokio::spawn(async move {
                let answer = this
                    .endpoint
                    .request(addr, Channel::Fence, &payload, Duration::from_secs(1))
                    .await;
                match answer.map(|bytes| rmp_serde::from_slice::<LeaseReply>(&bytes)) {
                    Ok(Ok(reply)) => {
                        let grantor = format!("{peer:016x}");
                        let mut state = this.state.lock().unwrap_or_else(PoisonError::into_inner);
                        state.holder.on_reply(now, hold, &grantor, &asks, &reply);
                    }
                    Ok(Err(error)) => warn!(%addr, %error, "refused a malformed lease reply"),
                    Err(error) => debug!(%addr, %error, "lease request not answered"),
                }
            });
        }
    }

    /// Answers peers' run-lease requests with this node's grantor.
    async fn serve_leases(self: Arc<Self>, requests: crate::supervise::Held<IncomingRequests>) {
        let mut requests = requests.lock().await;
        while let Some(request) = requests.recv().await {
            let reply = match self.answer_lease(&request.node_id, &request.payload) {
                Ok(reply) => reply,
                Err(error) => {
                    warn!(peer = %request.peer, node = %request.node_id, %error, "refused a lease request");
                    LeaseReply {
                        granted: Vec::new(),
                        baseline: 0,
                    }
                }
            };
            request.respond(rmp_serde::to_vec(&reply).expect("lease replies serialize"));
        }
    }

    /// The grantor's answer to the node `node_id` (from its certificate): only a node this one
    /// sees alive, and only for the pods its store binds to that node.
    fn answer_lease(&self, node_id: &str, payload: &[u8]) -> Result<LeaseReply, LeaseRefusal> {
        let request: LeaseRequest = rmp_serde::from_slice(payload)?;
        lease::validate(&request)?;
        let id =
            node_numeric_id(node_id).ok_or_else(|| LeaseRefusal::NodeId(node_id.to_owned()))?;
        let now = self.now();
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let state = &mut *guard;
        let baseline = u32::try_from(state.baseline).unwrap_or(u32::MAX);
        let granted = match (state.addresses.get(&id), state.grantor.as_mut()) {
            (Some((holder, _)), Some(grantor)) => {
                grantor.answer(now, holder, &request.asks, |uid| bound_to(&state.pods, uid))
            }
            _ => Vec::new(),
        };
        Ok(LeaseReply { granted, baseline })
    }

    /// Why no node took a pod, if an auctioneer said so.
    pub fn unschedulable_reason(&self, pod_uid: &str) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .all_unschedulable
            .get(pod_uid)
            .cloned()
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    async fn run(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(self.config.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = self.wake.notified() => {}
            }
            let outputs = self.tick().await;
            // The run leases this round keeps are what the kubelet renews its fenced pods'
            // fence leases from ([`Self::may_run_fenced`]).
            self.lease_round();
            self.handle(outputs).await;
            // Verdicts this node no longer gives (the pod moved to another auctioneer, or was
            // bound) leave what it publishes.
            let pruned = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                std::mem::take(&mut state.republish).then(|| state.unschedulable.clone())
            };
            if let Some(map) = pruned {
                self.membership.publish(keys::UNSCHEDULABLE, &map).await;
            }
            self.claim_daemon_pods().await;
            self.make_ephemeral_claims().await;
        }
    }

    /// Makes the claims of the generic ephemeral volumes of the pods this node auctions
    /// (upstream's ephemeral volume controller): each from its volume's template, named after
    /// the pod and the volume, controlled by the pod; the auction waits for them
    /// (`storage::placement`: a missing claim blocks the pod).
    async fn make_ephemeral_claims(&self) {
        let keys: Vec<(String, ObjectKey)> = {
            let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let state = &mut *guard;
            let pods = &state.pods;
            state.ephemeral_made.retain(|uid| pods.contains_key(uid));
            // And the pods bound to this node by name (`spec.nodeName`: no auction).
            let me = state
                .addresses
                .get(&self.self_id)
                .map(|(name, _)| name.as_str());
            let named_here = state
                .pods
                .values()
                .filter(|e| e.ephemeral && me.is_some() && e.node_name.as_deref() == me);
            state
                .pending
                .iter()
                .filter_map(|(request, _)| state.pods.get(&request.uid))
                .filter(|entry| entry.ephemeral)
                .chain(named_here)
                .filter(|entry| !state.ephemeral_made.contains(&entry.request.uid))
                .map(|entry| (entry.request.uid.clone(), entry.key.clone()))
                .collect()
        };
        let Some(claim_kind) = kind::lookup("v1", "PersistentVolumeClaim") else {
            return;
        };
        for (uid, key) in keys {
            let Some(pod) = self.replication.read(|s| s.get(&key)) else {
                continue;
            };
            let mut all_there = true;
            for mut claim in shoal_model::storage::ephemeral_claims(&pod) {
                let name = claim["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let claim_key = ObjectKey::new(claim_kind, &key.namespace, &name);
                if self.replication.read(|s| s.get(&claim_key)).is_some() {
                    continue;
                }
                all_there = false;
                crate::api::admission::admit_new_claim(&self.replication, &mut claim);
                let made = match shoal_state::validate(claim, &key.namespace) {
                    Ok(mut valid) => {
                        shoal_model::validation::default("PersistentVolumeClaim", &mut valid.body);
                        self.replication
                            .write(valid, shoal_state::WriteMode::Create)
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                };
                match made {
                    Ok(()) => info!(pod = %key, claim = %name, "ephemeral volume's claim made"),
                    Err(error) => {
                        debug!(pod = %key, claim = %name, %error, "ephemeral volume's claim not made")
                    }
                }
            }
            if all_there {
                self.state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .ephemeral_made
                    .insert(uid);
            }
        }
    }

    /// One round of this node's DaemonSet duties, decided by
    /// [`shoal_core::controllers::daemon_set::reconcile_node`] from the live nodes this round's tick
    /// saw and the DaemonSets' pods as stored, with the statuses their nodes report.
    async fn claim_daemon_pods(&self) {
        use shoal_core::controllers::daemon_set;
        use shoal_core::controllers::workload::{Action, PodView};
        let daemon_sets = self.replication.read(|s| s.list("apps", "DaemonSet", None));
        let (me, cluster, listed, settled, live_ids, keys) = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let keys: Vec<ObjectKey> = state
                .pods
                .values()
                .filter(|p| p.daemon.is_some())
                .map(|p| p.key.clone())
                .collect();
            (
                state.addresses.get(&self.self_id).map(|(n, _)| n.clone()),
                state.cluster.clone(),
                state.listed.clone(),
                state.settled,
                state.addresses.keys().copied().collect::<Vec<NodeId>>(),
                keys,
            )
        };
        let Some(me) = me else { return };
        if daemon_sets.is_empty() && keys.is_empty() {
            return;
        }
        let objects: Vec<Value> = self
            .replication
            .read(|s| keys.iter().filter_map(|k| s.get(k)).collect());
        let pods: Vec<PodView> = objects
            .into_iter()
            .map(|object| {
                let status = self.statuses.status_of(&object);
                PodView::from_object(object, status.as_ref())
            })
            .collect();
        let actions = {
            let owns = |ds: &Value| {
                auctioneer(
                    ds["metadata"]["uid"].as_str().unwrap_or_default(),
                    live_ids.iter().copied(),
                ) == Some(self.self_id)
            };
            let round = daemon_set::Round {
                me: &me,
                cluster: &cluster,
                listed: &|name: &str| listed.contains(name),
                settled,
                owns: &owns,
                now_ms: crate::controllers::now_ms(),
            };
            daemon_set::reconcile_node(&round, &daemon_sets, &pods)
        };
        let info = kind::lookup("v1", "Pod").expect("Pod is a known kind");
        for action in actions {
            match action {
                Action::Create(pod) => {
                    let namespace = pod["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or("default")
                        .to_owned();
                    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
                    let key = ObjectKey::new(info, &namespace, name);
                    match shoal_state::validate(pod, &namespace) {
                        Ok(valid) => match self.replication.write(valid, WriteMode::Create).await {
                            Ok((pod, _)) => {
                                info!(pod = %key, "claimed a DaemonSet pod");
                                let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
                                self.events.record(NewEvent::new(
                                    ObjectRef::pod(&key.namespace, &key.name, uid),
                                    EventType::Normal,
                                    "Scheduled",
                                    format!(
                                        "Successfully assigned {}/{} to {me}",
                                        key.namespace, key.name
                                    ),
                                    events::SCHEDULER,
                                ));
                            }
                            Err(e) => debug!(pod = %key, error = %e, "DaemonSet pod not created"),
                        },
                        Err(e) => {
                            warn!(pod = %key, error = %e, "a DaemonSet's template is not a valid pod")
                        }
                    }
                }
                Action::Delete {
                    namespace,
                    name,
                    uid,
                    ..
                } => {
                    let key = ObjectKey::new(info, &namespace, &name);
                    match self.replication.delete(&key, Some(&uid)).await {
                        Ok(_) => info!(pod = %key, "deleted a DaemonSet pod"),
                        Err(e) => debug!(pod = %key, error = %e, "DaemonSet pod not deleted"),
                    }
                }
                other => debug!(action = ?other, "not a DaemonSet action"),
            }
        }
    }

    /// A DaemonSet's status as observed, over the live nodes the last tick saw
    /// ([`shoal_core::controllers::daemon_set::status`]).
    pub fn daemon_set_status(
        &self,
        ds: &Value,
        pods: &[shoal_core::controllers::workload::PodView],
    ) -> Value {
        let cluster = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .cluster
            .clone();
        shoal_core::controllers::daemon_set::status(
            ds,
            &cluster,
            pods,
            crate::controllers::now_ms(),
        )
    }

    /// Rebuilds the world and lets the scheduler start auctions.
    async fn tick(&self) -> Vec<Output> {
        let members = self.membership.members().await;
        let peer_verdicts = self.membership.peer_values(keys::UNSCHEDULABLE).await;
        let digests = self.membership.peer_values(keys::STORE_DIGEST).await;
        let (ours, peak) = self
            .replication
            .read(|s| (s.root_digest(), s.peak_members()));
        // A peer whose digest equals this node's holds nothing this one lacks (fencing counts
        // the peers caught up with).
        let checked = Instant::now();
        for peer in &digests {
            if matches!(&peer.value, Some(Ok(d)) if *d == ours) {
                self.replication.note_caught_up(peer.addr, checked);
            }
        }
        // Labels, taints and cordons users set through the API, and the namespaces' labels
        // (for pod affinity terms' namespaceSelector), read before the lock.
        let settings = self.replication.read(crate::node_settings::stored);
        let namespaces = self.replication.read(|s| s.list("", "Namespace", None));
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.now();
        let mut cluster = ClusterView::default();
        let mut given: HashMap<String, u64> = HashMap::new();
        for (node, bytes) in state.volumes_given.values() {
            let sum = given.entry(node.clone()).or_default();
            *sum = sum.saturating_add(*bytes);
        }
        cluster.set_volumes_given(given);
        for namespace in &namespaces {
            if let Some(name) = namespace["metadata"]["name"].as_str() {
                cluster.set_namespace_labels(
                    name,
                    shoal_model::placement::namespace_labels(namespace),
                );
            }
        }
        let mut addresses = HashMap::new();
        let mut live_names: HashMap<String, NodeId> = HashMap::new();
        // Suspect or joining nodes keep their pods; only a node declared dead starts the clock.
        let mut undecided: std::collections::HashSet<String> = std::collections::HashSet::new();
        for m in &members {
            let (Some(id), Some(meta)) = (node_numeric_id(&m.node_id), m.meta.as_ref()) else {
                continue;
            };
            let dead = m.state == MemberState::Dead;
            state.dead_since.observe(&meta.name, dead, now);
            if dead {
                continue;
            }
            if m.state != MemberState::Alive {
                undecided.insert(meta.name.clone());
                continue;
            }
            addresses.insert(id, (meta.name.clone(), m.gossip_addr));
            live_names.insert(meta.name.clone(), id);
            let (labels, taints) = crate::node_settings::effective(
                &meta.labels,
                &meta.taints,
                settings.get(&meta.name),
            );
            cluster.add_node(NodeView {
                id,
                name: meta.name.clone(),
                labels,
                taints: taints.iter().filter_map(to_taint).collect(),
                allocatable: Resources::new(
                    meta.capacity.cpu_millis,
                    meta.capacity.memory_bytes,
                    u64::from(meta.capacity.pods),
                ),
                volume_bytes: meta.capacity.volume_bytes,
            });
        }
        let live_ids: Vec<NodeId> = addresses.keys().copied().collect();
        // Majorities are counted against the most nodes this one has known at once (persisted),
        // never against the members membership still remembers (it forgets the dead).
        let names: std::collections::HashSet<&str> = members
            .iter()
            .filter_map(|m| m.meta.as_ref().map(|meta| meta.name.as_str()))
            .collect();
        let baseline = (peak as usize).max(names.len());
        let settled = partition::membership_settled(
            self.started.elapsed(),
            members.iter().filter(|m| m.meta.is_none()).count(),
            &self.config.fence,
        );
        // Peers caught up with since the majority became visible.
        let agreeing = state.fence.catch_up_since().map_or(0, |since| {
            self.replication.caught_up_since(self.started + since)
        });
        let view = partition::FenceView {
            alive: live_ids.len(),
            baseline,
            agreeing,
            settled,
        };
        for change in state.fence.observe(self.now(), view, &self.config.fence) {
            match change {
                partition::FenceChange::LostMajority => warn!(
                    alive = live_ids.len(),
                    baseline,
                    "this node no longer sees a majority: fenced pods are not replaced here, and must stop once the fence timeout passes"
                ),
                partition::FenceChange::RegainedMajority => {
                    info!(
                        alive = live_ids.len(),
                        baseline, "a majority of the membership is visible again"
                    )
                }
                partition::FenceChange::Stopped => {
                    warn!("no majority for the fence timeout: this node's fenced pods stop")
                }
                partition::FenceChange::Released => {
                    info!("desired state caught up with the majority: fenced pods may run here")
                }
            }
        }
        state.baseline = baseline;
        let majority = state.fence.has_majority();
        let mut pending = Vec::new();
        let mut dead_since = std::mem::take(&mut state.dead_since);
        let bound = |uid: &str, pods: &HashMap<String, PodEntry>| {
            pods.get(uid).is_some_and(|p| p.node_name.is_some())
        };
        let rules = eviction::Rules {
            majority,
            eviction_delay: self.config.eviction_delay,
            fence: &self.config.fence,
        };
        for entry in state.pods.values() {
            let awaits_preemptor = entry.node_name.is_none()
                && entry
                    .preempted_by
                    .as_ref()
                    .is_some_and(|p| state.pods.contains_key(p) && !bound(p, &state.pods));
            let pod = eviction::Pod {
                bound: entry.node_name.is_some(),
                epoch: entry.epoch,
                policy: entry.policy,
                daemon: entry.daemon.is_some(),
                awaits_preemptor,
            };
            let seen = match &entry.node_name {
                None => eviction::Seen::Live,
                Some(node) if live_names.contains_key(node) => eviction::Seen::Live,
                Some(node) if undecided.contains(node) => eviction::Seen::Undecided,
                Some(_) if pod.daemon => eviction::Seen::Gone(None),
                Some(node) => eviction::Seen::Gone(dead_since.gone_for(node, now, settled)),
            };
            let next_epoch = match eviction::decide(&rules, &pod, seen) {
                eviction::Verdict::Placed => {
                    if let Some(id) = entry.node_name.as_ref().and_then(|n| live_names.get(n)) {
                        cluster.place(*id, &entry.request);
                    }
                    continue;
                }
                eviction::Verdict::Wait => continue,
                eviction::Verdict::Auction(epoch) => epoch,
            };
            if auctioneer_of(&entry.request, live_ids.iter().copied()) == Some(self.self_id) {
                // A pod whose nodeName points at a dead node must not be bound back there.
                let mut request = (*entry.request).clone();
                request.node_name = None;
                pending.push((Arc::new(request), next_epoch));
            }
        }
        state.dead_since = dead_since;
        // A pod's verdict is its current auctioneer's, about a pod still unbound: the
        // auctioneer moves as nodes join and leave, and a former one's verdict (`0/3 nodes`
        // after a fourth joined) must not outlive it, here or in what this node publishes.
        let current = |uid: &String, pods: &HashMap<String, PodEntry>, node: NodeId| {
            pods.get(uid).is_some_and(|p| {
                p.node_name.is_none()
                    && auctioneer_of(&p.request, live_ids.iter().copied()) == Some(node)
            })
        };
        let pods = std::mem::take(&mut state.pods);
        let before = state.unschedulable.len();
        state
            .unschedulable
            .retain(|uid, _| current(uid, &pods, self.self_id));
        state.republish |= state.unschedulable.len() != before;
        let mut verdicts: BTreeMap<String, String> = state.unschedulable.clone();
        for peer in peer_verdicts {
            if let (Some(id), Some(Ok(map))) = (node_numeric_id(&peer.node_id), peer.value) {
                verdicts.extend(map.into_iter().filter(|(uid, _)| current(uid, &pods, id)));
            }
        }
        state.pods = pods;
        state.all_unschedulable = verdicts;
        state.cluster = cluster;
        state.addresses = addresses;
        state.listed = members
            .iter()
            .filter_map(|m| m.meta.as_ref().map(|meta| meta.name.clone()))
            .collect();
        state.settled = settled;
        // Borrowed, never taken out: a panic inside must not leave the state without it.
        let State {
            scheduler,
            cluster,
            pending: kept,
            ..
        } = &mut *state;
        let world = World {
            cluster,
            pending: &pending,
        };
        let outputs = scheduler
            .as_mut()
            .expect("the scheduler is set at construction")
            .tick(self.now(), &world);
        *kept = pending;
        outputs
    }

    async fn receive(self: Arc<Self>, incoming: crate::supervise::Held<IncomingFrames>) {
        let mut incoming = incoming.lock().await;
        while let Some(frame) = incoming.recv().await {
            let peer = frame.peer;
            let wire: WireMessage = match rmp_serde::from_slice(&frame.payload) {
                Ok(w) => w,
                Err(error) => {
                    warn!(%peer, %error, "refused a malformed auction message");
                    continue;
                }
            };
            // A message is the certificate's node's: a claim to be another node is refused.
            if format!("{:016x}", wire.from) != *frame.node_id {
                warn!(%peer, node = %frame.node_id, claimed = %format!("{:016x}", wire.from), "refused an auction message claiming another node's identity");
                continue;
            }
            let outputs = self.on_message(wire.from, wire.message);
            self.handle(outputs).await;
        }
    }

    fn on_message(&self, from: NodeId, message: Message) -> Vec<Output> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let State {
            scheduler,
            cluster,
            pending,
            ..
        } = &mut *state;
        let scheduler = scheduler
            .as_mut()
            .expect("the scheduler is set at construction");
        let world = World {
            cluster,
            pending: &[],
        };
        let now = self.now();
        let mut outputs = scheduler.on_message(now, from, message, &world);
        // An auction decided by its last bid: the next starts now, not at the next tick, from
        // the pending pods of the last tick (the scheduler skips those it has bound since).
        if scheduler.has_room() {
            let world = World { cluster, pending };
            outputs.extend(scheduler.resume(now, &world));
        }
        outputs
    }

    async fn handle(&self, mut outputs: Vec<Output>) {
        while let Some(output) = outputs.pop() {
            match output {
                Output::Send { to, message } if to == self.self_id => {
                    outputs.extend(self.on_message(self.self_id, message));
                }
                Output::Send { to, message } => {
                    let addr = self
                        .state
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .addresses
                        .get(&to)
                        .map(|(_, a)| *a);
                    let Some(addr) = addr else { continue };
                    let bytes = rmp_serde::to_vec(&WireMessage {
                        from: self.self_id,
                        message,
                    })
                    .expect("auction messages serialize");
                    if let Err(error) = self.endpoint.send(addr, Channel::Auction, &bytes) {
                        debug!(%addr, %error, "auction message not sent");
                    }
                }
                Output::Bind(binding) => self.bind(binding).await,
                Output::Preempt { binding, victims } => {
                    // The preemptor's binding first, then the victims' unbinding (replication
                    // keeps that order per peer): a node that sees a victim unbound has seen
                    // who took its room, so it does not offer that room to the victim again.
                    info!(pod = %binding.pod, victims = victims.len(), "preempting lower-priority pods");
                    let preemptor = binding.pod.clone();
                    self.bind(binding).await;
                    for victim in &victims {
                        self.unbind(victim, Some(&preemptor)).await;
                    }
                }
                Output::Unschedulable { pod, message } => {
                    let key = self
                        .state
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .pods
                        .get(&pod)
                        .map(|p| p.key.clone());
                    if let Some(key) = key {
                        self.events.record(NewEvent::new(
                            ObjectRef::pod(&key.namespace, &key.name, &pod),
                            EventType::Warning,
                            "FailedScheduling",
                            message.clone(),
                            events::SCHEDULER,
                        ));
                    }
                    let map = {
                        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                        state.republish = false;
                        state.unschedulable.insert(pod.clone(), message.clone());
                        // Bounded: the newest verdicts of this auctioneer.
                        while state.unschedulable.len() > 256 {
                            let first = state
                                .unschedulable
                                .keys()
                                .next()
                                .cloned()
                                .expect("non-empty");
                            state.unschedulable.remove(&first);
                        }
                        state.unschedulable.clone()
                    };
                    info!(pod = %pod, reason = %message, "pod unschedulable");
                    self.membership.publish(keys::UNSCHEDULABLE, &map).await;
                }
            }
        }
    }

    /// Writes the binding into the pod: `spec.nodeName` and the epoch annotation.
    async fn bind(&self, binding: Binding) {
        let node_name = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .addresses
            .get(&binding.node)
            .map(|(n, _)| n.clone());
        let Some(node_name) = node_name else { return };
        self.write_binding(&binding.pod, Some(node_name), binding.epoch, None)
            .await;
    }

    async fn write_binding(
        &self,
        pod_uid: &str,
        node_name: Option<String>,
        epoch: u64,
        preempted_by: Option<&str>,
    ) -> bool {
        let key = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pods
            .get(pod_uid)
            .map(|p| p.key.clone());
        let Some(key) = key else { return false };
        let pod = self
            .replication
            .read(|s| s.get(&key))
            .filter(|p| p["metadata"]["uid"] == pod_uid);
        let Some(mut pod) = pod else { return false };
        let annotations_ok =
            pod["metadata"]["annotations"].is_object() || pod["metadata"]["annotations"].is_null();
        if !pod["spec"].is_object() || !annotations_ok {
            warn!(pod = %key, "pod has a malformed spec or annotations; not bound");
            return false;
        }
        match &node_name {
            Some(node) => pod["spec"]["nodeName"] = json!(node),
            None => {
                if let Some(spec) = pod["spec"].as_object_mut() {
                    spec.remove("nodeName");
                }
            }
        }
        pod["metadata"]["annotations"][EPOCH_ANNOTATION] = json!(epoch.to_string());
        if let Some(preemptor) = preempted_by {
            pod["metadata"]["annotations"][PREEMPTED_BY_ANNOTATION] = json!(preemptor);
        }
        if let Some(meta) = pod["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        let valid = match shoal_state::validate(pod, &key.namespace) {
            Ok(v) => v,
            Err(e) => {
                warn!(pod = %key, error = %e, "binding not written");
                return false;
            }
        };
        match self.replication.write(valid, WriteMode::Update).await {
            Ok(_) => {
                let pod_ref = ObjectRef::pod(&key.namespace, &key.name, pod_uid);
                match (&node_name, preempted_by) {
                    (Some(node), _) => {
                        info!(pod = %key, node = %node, epoch, "pod bound");
                        self.events.record(NewEvent::new(
                            pod_ref,
                            EventType::Normal,
                            "Scheduled",
                            format!(
                                "Successfully assigned {}/{} to {node}",
                                key.namespace, key.name
                            ),
                            events::SCHEDULER,
                        ));
                    }
                    (None, Some(preemptor)) => {
                        info!(pod = %key, epoch, "pod preempted: auctioned again");
                        self.events.record(NewEvent::new(
                            pod_ref,
                            EventType::Normal,
                            "Preempted",
                            format!("Preempted by pod {preemptor}"),
                            events::SCHEDULER,
                        ));
                    }
                    (None, None) => info!(pod = %key, epoch, "pod unbound: auctioned again"),
                }
                true
            }
            Err(e) => {
                debug!(pod = %key, error = %e, "binding not written");
                false
            }
        }
    }
}

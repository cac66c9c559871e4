//! The distributed auction (DESIGN.md §6) as a pure state machine: one [`Scheduler`] per node,
//! fed with time, messages and the replicated view of the world; it returns messages to send,
//! bindings to write and unschedulable verdicts. No sockets, no clocks.
//!
//! - Each pending pod has one **auctioneer**: the live node with the highest rendezvous hash of
//!   (pod uid, node id). A dead auctioneer is replaced without election when views change.
//!   A pod with a hard constraint wider than one node (required pod (anti-)affinity over a
//!   zone, a `DoNotSchedule` spread) is keyed by that constraint instead ([`auction_key`]):
//!   all the pods that share it are auctioned by one node, which checks each against its own
//!   view and the ones it bound lately before it binds — so two auctioneers never race for
//!   one zone while membership views agree (during a view change, as for every binding, two
//!   may). Pods of *different* constraints that constrain each other are checked against the
//!   auctioneer's view only (the window is the replication delay).
//! - The auctioneer batches its pods and calls for bids from a deterministic sample of live
//!   nodes (rendezvous over (auction id, node id)); if none of the sample can take a pod, the pod
//!   goes to an exhaustive auction over every live node before it is declared unschedulable.
//! - Each bidder decides for itself (predicates on its own labels, taints, allocations) and
//!   answers every pod of the batch with a score or a reasoned decline, plus its free resources.
//!   Bids are optimistic (Omega-style): nothing is reserved, because reserving every pod of every
//!   concurrent batch starved the nodes in simulation (14% of a feasible workload placed). A
//!   bidder does remember what it has *offered* and not yet seen bound, and scores later pods as
//!   if those were placed: soft pressure that spreads concurrent auctions without declining
//!   anything. (Declining a pod whose required anti-affinity clashes with an open offer was
//!   tried: it serialised a Deployment's replicas, one per 5 s retry round, in simulation.)
//! - The auctioneer packs its batch greedily: each pod goes to its best offer (score, lowered by
//!   what this batch already gave that node; then a hash tie-break) among nodes whose reported
//!   free resources still fit it and where no pod this batch placed forbids it by a hard
//!   topology constraint ([`predicates::batch_conflict`]). Two auctioneers may still pick the
//!   same capacity, or the same node for two replicas that must not share it: the winner's
//!   admission refuses what no longer fits or breaks a node-local constraint
//!   ([`predicates::hostname_conflict`]), and the pod is auctioned again with epoch + 1.
//! - Bindings merge by (epoch, stamp): the highest wins everywhere, so concurrent auctioneers
//!   converge on one node per pod.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::cluster::ClusterView;
use super::predicates::{self, Decline};
use shoal_model::placement::{NodeView, PodRequest, Resources};

pub type NodeId = u64;

/// Which node runs a pod. Higher `epoch` wins, then higher `stamp` (the writer's time in ms and
/// id), the order of the store's binding register ([`shoal_state::crdt::Marker`]).
///
/// The live shell writes a binding through the store, which stamps it with the node's HLC and
/// ignores `stamp`; the simulator, which has no store, merges bindings with [`Binding::wins_over`],
/// so both order bindings by the same [`Marker`](shoal_state::crdt::Marker) comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub pod: String,
    pub node: NodeId,
    pub epoch: u64,
    pub stamp: (u64, NodeId),
}

impl Binding {
    /// The store's register order for this binding, as if written at `stamp`.
    pub fn marker(&self) -> shoal_state::crdt::Marker {
        shoal_state::crdt::Marker {
            epoch: self.epoch,
            stamp: shoal_state::Stamp {
                time: shoal_state::hlc::Timestamp::new(self.stamp.0, 0),
                node: self.stamp.1,
            },
        }
    }

    pub fn wins_over(&self, other: &Binding) -> bool {
        (self.marker(), self.node) > (other.marker(), other.node)
    }
}

/// A node's messages to another.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Message {
    Call {
        auction: (NodeId, u64),
        pods: Vec<Arc<PodRequest>>,
        /// Every live node is asked: bidders also say whom they would preempt.
        #[serde(default)]
        exhaustive: bool,
    },
    Bids {
        auction: (NodeId, u64),
        /// What the bidder has free (allocatable minus allocated), and its allocatable.
        free: Resources,
        allocatable: Resources,
        bids: Vec<(String, Result<i64, Decline>)>,
        /// For pods declined for lack of resources: the lower-priority pods whose eviction
        /// would make room, with the highest priority among them.
        #[serde(default)]
        preemptions: Vec<(String, Vec<String>, i32)>,
    },
}

/// What a node asks its shell to do.
#[derive(Debug, Clone)]
pub enum Output {
    Send {
        to: NodeId,
        message: Message,
    },
    Bind(Binding),
    Unschedulable {
        pod: String,
        message: String,
    },
    /// Preemption: write `binding`, and unbind `victims` (they are auctioned again).
    Preempt {
        binding: Binding,
        victims: Vec<String>,
    },
}

/// Tunables.
#[derive(Debug, Clone)]
pub struct AuctionConfig {
    /// Pods per auction.
    pub batch: usize,
    /// Auctions one auctioneer runs at once. Later waves see earlier waves' bindings, which is
    /// what keeps a burst of pods balanced (everything at once placed 10,000 pods with a CPU
    /// utilisation stddev of 0.21 against greedy's 0.005).
    pub max_in_flight: usize,
    /// Nodes asked per (non-exhaustive) auction.
    pub sample: usize,
    /// An auction decides with the bids it has after this long.
    pub bid_timeout: Duration,
    /// An offer not resolved by a binding stops weighing on scores after this long.
    pub offer_ttl: Duration,
    /// How much of an open offer's requests weighs on the bidder's later scores, in percent.
    pub pressure_percent: u64,
    /// An unschedulable pod is auctioned again after this long.
    pub retry_after: Duration,
    /// Auction the pods that share a wide constraint at one node, checked against its view
    /// ([`auction_key`]). Off only to measure what it buys (scheduling-bench).
    pub serialize_wide: bool,
}

impl Default for AuctionConfig {
    fn default() -> Self {
        // Measured on 200 nodes / 10,000 pods (scheduling-bench): the bigger the sample, the
        // more concurrent auctions herd onto the same best nodes (sample 200: CPU stddev 0.20;
        // 32: 0.10; 8: 0.03-0.04 against greedy's 0.004). Small batches and samples win.
        Self {
            batch: 4,
            max_in_flight: 1,
            sample: 8,
            bid_timeout: Duration::from_millis(500),
            offer_ttl: Duration::from_secs(2),
            pressure_percent: 100,
            retry_after: Duration::from_secs(5),
            serialize_wide: true,
        }
    }
}

/// What the shell knows of the world, as of now.
pub struct World<'a> {
    pub cluster: &'a ClusterView,
    /// Pods this node is auctioneer of, with the epoch their next binding must carry.
    pub pending: &'a [(Arc<PodRequest>, u64)],
}

/// How many times in a row a pod whose offers all went stale is auctioned again at once.
const STALE_RETRIES: u32 = 10;

/// How many times the sample size of least-loaded nodes half of a sample is drawn from.
const LOAD_POOL: usize = 4;
/// Percent of a sample drawn from the least-loaded pool.
const LOAD_SHARE: usize = 50;

/// (highest victim priority, number of victims, tie-break, node, victim uids).
type PreemptionOffer = (i32, usize, u64, NodeId, Vec<String>);

#[derive(Clone)]
struct Auction {
    pods: Vec<Arc<PodRequest>>,
    epochs: HashMap<String, u64>,
    waiting: HashSet<NodeId>,
    asked: usize,
    exhaustive: bool,
    /// Per pod: (score, tie-break, node) of every offer.
    offers: HashMap<String, Vec<(i64, u64, NodeId)>>,
    /// Per node: (free, allocatable) as reported with its bids.
    capacity: HashMap<NodeId, (Resources, Resources)>,
    declines: HashMap<String, Vec<Decline>>,
    /// Per pod: every bidder's preemption offer.
    preemptions: HashMap<String, Vec<PreemptionOffer>>,
    deadline: Duration,
}

/// An offer a bidder made and has not seen resolved.
#[derive(Debug, Clone)]
struct Offer {
    /// Its share of the soft pressure on later scores.
    expected: Resources,
    /// Forgotten after this.
    until: Duration,
}

/// One node's scheduler: bidder and auctioneer.
#[derive(Clone)]
pub struct Scheduler {
    pub id: NodeId,
    config: AuctionConfig,
    /// Offers made and not yet resolved: (requests, forget after).
    offered: HashMap<String, Offer>,
    auctions: HashMap<u64, Auction>,
    in_flight: HashSet<String>,
    /// Unschedulable pods, auctioned again after this time or when the nodes change.
    retry_at: HashMap<String, Duration>,
    /// The [`ClusterView::shape`] the unschedulable verdicts were given against.
    shape: Option<u64>,
    exhaustive_next: HashSet<String>,
    /// Pods with a wide constraint this node bound lately, (node, pod, until): a later auction
    /// of their group counts them until its view holds them.
    recent: Vec<(NodeId, Arc<PodRequest>, Duration)>,
    /// Pods auctioned again because every offer had gone stale, and how often in a row.
    stale: HashMap<String, u32>,
    /// Pods this node bound, at which epoch, until when: not auctioned again before the shell
    /// shows them bound (a binding refused and handed back comes with a new epoch).
    bound: HashMap<String, (u64, Duration)>,
    /// An auction was decided since pending pods were last looked at ([`Self::has_room`]).
    decided: bool,
    seq: u64,
    /// Messages and evaluations, for benchmarks.
    pub evaluations: u64,
    /// Auctions started, and of those exhaustive (every node asked), for benchmarks.
    pub auctions_started: u64,
    pub exhaustive_auctions: u64,
    /// Pods auctioned again because their offers had gone stale, for benchmarks.
    pub stale_retries: u64,
}

/// A bidder's preemption offers: for each pod it declined only for lack of resources (all its
/// other predicates hold), the lower-priority pods it would evict to make room.
fn preemption_offers(
    id: NodeId,
    pods: &[Arc<PodRequest>],
    bids: &[(String, Result<i64, Decline>)],
    world: &World,
) -> Vec<(String, Vec<String>, i32)> {
    let Some(node) = world.cluster.node(id) else {
        return Vec::new();
    };
    pods.iter()
        .zip(bids)
        .filter(|(_, (_, bid))| {
            matches!(
                bid,
                Err(Decline::InsufficientCpu | Decline::InsufficientMemory | Decline::TooManyPods)
            )
        })
        .filter_map(|(pod, _)| {
            let victims = world.cluster.victims_for(id, pod)?;
            // The other predicates must hold once the victims are gone.
            let freed = victims
                .iter()
                .fold(world.cluster.allocated(id), |used, uid| {
                    used.minus(world.cluster.requests_of(id, uid).unwrap_or_default())
                });
            predicates::check(pod, node, freed, world.cluster).ok()?;
            let highest = victims
                .iter()
                .filter_map(|v| world.cluster.priority_of(id, v))
                .max()
                .unwrap_or(i32::MIN);
            Some((pod.uid.clone(), victims, highest))
        })
        .collect()
}

/// Rendezvous hash of (key, node).
pub fn rendezvous(key: &str, node: NodeId) -> u64 {
    predicates::tie_break(key, node)
}

/// Draw number `draw` of an auction whose key hashes to `key` ([`predicates::key_hash`]): an
/// index below `len` (0 when `len` is 0).
fn hashed_index(key: u64, draw: u64, len: usize) -> usize {
    (predicates::tie_break_hashed(key, draw) % len.max(1) as u64) as usize
}

/// Up to `k` distinct nodes of `nodes`, drawn by hashing (`key`, draw number): a sample that
/// is random across auctions, replays exactly, and costs O(k) rather than a hash of every node
/// of the cluster (what ranking all of them by rendezvous cost: 20% of the scheduling
/// benchmark's CPU at 1,000 nodes).
fn hashed_sample(key: &str, nodes: &[NodeId], k: usize) -> Vec<NodeId> {
    if k >= nodes.len() {
        return nodes.to_vec();
    }
    let key = predicates::key_hash(key);
    let mut chosen = Vec::with_capacity(k);
    let mut draw = 0;
    // Each draw is new with probability ≥ 1 - k/len; the bound only guards a degenerate hash.
    while chosen.len() < k && draw < 4 * nodes.len() as u64 + 64 {
        let n = nodes[hashed_index(key, draw, nodes.len())];
        draw += 1;
        if !chosen.contains(&n) {
            chosen.push(n);
        }
    }
    chosen
}

/// The live node with the highest rendezvous hash of `key`: a pod's auctioneer (by
/// [`auction_key`]), and the owner of other keys (objects' homes, controllers' objects).
pub fn auctioneer(key: &str, live: impl IntoIterator<Item = NodeId>) -> Option<NodeId> {
    let key = predicates::key_hash(key);
    live.into_iter()
        .max_by_key(|n| (predicates::tie_break_hashed(key, *n), *n))
}

/// What chooses a pod's auctioneer: its uid, or for a pod with a hard constraint wider than a
/// node ([`predicates::has_wide_constraint`]) that constraint — its namespace, topology key
/// and selector — so every pod that shares it (the replicas of one workload) is auctioned by
/// one node, one auction after another, each checked against the placements before it. Two
/// auctioneers racing for one zone was the alternative; this costs no message.
pub fn auction_key(pod: &PodRequest) -> std::borrow::Cow<'_, str> {
    let spreads = pod
        .spread
        .iter()
        .filter(|s| s.hard)
        .map(|s| (&s.topology_key, &s.selector));
    let terms = pod
        .anti_affinity
        .iter()
        .chain(&pod.affinity)
        .filter(|t| t.topology_key != predicates::HOSTNAME)
        .map(|t| (&t.topology_key, &t.selector));
    match spreads.chain(terms).next() {
        None => std::borrow::Cow::Borrowed(&pod.uid),
        Some((key, selector)) => {
            std::borrow::Cow::Owned(format!("wide/{}/{key}/{selector:?}", pod.namespace))
        }
    }
}

/// The topology keys of the wide constraints of `pods` ([`predicates::has_wide_constraint`]),
/// each once.
fn wide_keys(pods: &[Arc<PodRequest>]) -> Vec<&str> {
    let mut keys: Vec<&str> = Vec::new();
    for pod in pods {
        let spreads = pod
            .spread
            .iter()
            .filter(|s| s.hard)
            .map(|s| &s.topology_key);
        let terms = pod
            .anti_affinity
            .iter()
            .chain(&pod.affinity)
            .map(|t| &t.topology_key)
            .filter(|k| *k != predicates::HOSTNAME);
        for key in spreads.chain(terms) {
            if !keys.contains(&key.as_str()) {
                keys.push(key);
            }
        }
    }
    keys
}

/// The auctioneer of `pod` among `live` nodes (by [`auction_key`]).
pub fn auctioneer_of(pod: &PodRequest, live: impl IntoIterator<Item = NodeId>) -> Option<NodeId> {
    auctioneer(&auction_key(pod), live)
}

impl Scheduler {
    pub fn new(id: NodeId, config: AuctionConfig) -> Self {
        Self {
            id,
            config,
            offered: HashMap::new(),
            auctions: HashMap::new(),
            in_flight: HashSet::new(),
            retry_at: HashMap::new(),
            shape: None,
            exhaustive_next: HashSet::new(),
            recent: Vec::new(),
            stale: HashMap::new(),
            bound: HashMap::new(),
            decided: false,
            seq: 0,
            evaluations: 0,
            auctions_started: 0,
            exhaustive_auctions: 0,
            stale_retries: 0,
        }
    }

    /// Decides auctions past their deadline and starts auctions for pending pods.
    pub fn tick(&mut self, now: Duration, world: &World) -> Vec<Output> {
        let mut out = Vec::new();
        let expired: Vec<u64> = self
            .auctions
            .iter()
            .filter(|(_, a)| a.deadline <= now)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in expired {
            self.decide(seq, now, world, &mut out);
        }
        self.bound.retain(|_, (_, until)| *until > now);
        self.start_pending(now, world, &mut out);
        out
    }

    /// Whether an auction was decided (by its last bid) since the pending pods were last
    /// looked at, and another may start: then the shell calls [`Scheduler::resume`] with them
    /// rather than wait for the next tick, so a queue of pods that must go one auction at a
    /// time ([`Scheduler::chunks`]) moves at the speed of the bids, not of the ticks.
    pub fn has_room(&self) -> bool {
        self.decided && self.auctions.len() < self.config.max_in_flight
    }

    /// Starts auctions for the pending pods in `world` (what a tick does after deciding).
    pub fn resume(&mut self, now: Duration, world: &World) -> Vec<Output> {
        let mut out = Vec::new();
        self.start_pending(now, world, &mut out);
        out
    }

    /// Starts auctions for the pending pods, as many as may be in flight.
    fn start_pending(&mut self, now: Duration, world: &World, out: &mut Vec<Output>) {
        self.decided = false;
        // A node joined, left or changed: what did not fit may fit now (upstream's scheduler
        // moves its unschedulable pods back to the active queue on a node's addition or
        // update), so every verdict is given again at once rather than after `retry_after`.
        let shape = world.cluster.shape();
        if self.shape != Some(shape) {
            self.shape = Some(shape);
            self.retry_at.clear();
        }
        if self.auctions.len() >= self.config.max_in_flight {
            return;
        }
        let mut batch: Vec<Arc<PodRequest>> = Vec::new();
        let mut exhaustive: Vec<Arc<PodRequest>> = Vec::new();
        let mut epochs = HashMap::new();
        let free = self
            .config
            .max_in_flight
            .saturating_sub(self.auctions.len());
        // The batches below take at most this many pods, in order: once the batch holds them
        // (and no exhaustive re-auction is left to find), a later pod can only matter if it is
        // bound directly. A node with many pending pods (the replicas of wide constraints
        // wait for one another here) would otherwise look each of them up on every resume.
        let enough = free.saturating_mul(self.config.batch);
        for (pod, epoch) in world.pending {
            if batch.len() >= enough && self.exhaustive_next.is_empty() && pod.node_name.is_none() {
                continue;
            }
            if self.in_flight.contains(&pod.uid)
                || self.retry_at.get(&pod.uid).is_some_and(|t| *t > now)
                // Bound by this node at this epoch; the shell has not seen it yet.
                || self
                    .bound
                    .get(&pod.uid)
                    .is_some_and(|(e, until)| e == epoch && *until > now)
            {
                continue;
            }
            if let Some(name) = &pod.node_name {
                // spec.nodeName: bound directly, as in Kubernetes.
                if let Some(node) = world.cluster.nodes().find(|n| n.name == *name) {
                    self.bound
                        .insert(pod.uid.clone(), (*epoch, now + self.config.offer_ttl));
                    out.push(Output::Bind(Binding {
                        pod: pod.uid.clone(),
                        node: node.id,
                        epoch: *epoch,
                        stamp: (now.as_millis() as u64, self.id),
                    }));
                }
                continue;
            }
            epochs.insert(pod.uid.clone(), *epoch);
            if self.exhaustive_next.remove(&pod.uid) {
                exhaustive.push(pod.clone());
            } else {
                batch.push(pod.clone());
            }
        }
        // Exhaustive re-auctions first: they are pods no sample could take. Only the batches
        // that can start now are formed; the rest wait for a later tick (exhaustive ones keep
        // their mark).
        let (first, left) = self.chunks(exhaustive, free);
        for pod in left {
            self.exhaustive_next.insert(pod.uid.clone());
        }
        let (then, _) = self.chunks(batch, free - first.len());
        for (chunk, exhaustive) in first
            .into_iter()
            .map(|c| (c, true))
            .chain(then.into_iter().map(|c| (c, false)))
        {
            self.start(chunk, &epochs, exhaustive, now, world, out);
        }
    }

    /// The first `limit` auction batches of `pods`, in order, and the pods left over: at most
    /// `batch` pods each, and never two pods that share a wide constraint in one batch (the
    /// bidders would offer both the same domain, and the second would find it taken by the
    /// first). Measured the other way (issue #37's constrained workload, 1,000 nodes): 26,005
    /// auctions instead of 35,235 and ~15% more placements per CPU second, but the mixed
    /// workload's spread of node utilisation went from 0.024 to 0.032, as the later pods of a
    /// batch took the sample's worse nodes; not taken.
    fn chunks(
        &self,
        pods: Vec<Arc<PodRequest>>,
        limit: usize,
    ) -> (Vec<Vec<Arc<PodRequest>>>, Vec<Arc<PodRequest>>) {
        let mut chunks: Vec<Vec<Arc<PodRequest>>> = Vec::new();
        let mut keys: HashSet<String> = HashSet::new();
        let mut pods = pods.into_iter();
        for pod in pods.by_ref() {
            let key = (self.config.serialize_wide && predicates::has_wide_constraint(&pod))
                .then(|| auction_key(&pod).into_owned());
            let full = chunks.last().is_none_or(|c| c.len() >= self.config.batch)
                || key.as_ref().is_some_and(|k| keys.contains(k));
            if full {
                if chunks.len() >= limit {
                    return (chunks, std::iter::once(pod).chain(pods).collect());
                }
                chunks.push(Vec::new());
                keys.clear();
            }
            if let Some(key) = key {
                keys.insert(key);
            }
            chunks.last_mut().expect("pushed above").push(pod);
        }
        (chunks, Vec::new())
    }

    fn start(
        &mut self,
        pods: Vec<Arc<PodRequest>>,
        epochs: &HashMap<String, u64>,
        exhaustive: bool,
        now: Duration,
        world: &World,
        out: &mut Vec<Output>,
    ) {
        self.seq += 1;
        let key = format!("{}/{}", self.id, self.seq);
        let mut nodes = world.cluster.node_ids();
        if !exhaustive && nodes.len() > self.config.sample {
            // Only nodes whose labels and taints admit one of the pods are worth asking: the
            // least-loaded are often tainted nodes few pods tolerate (with 5% of nodes
            // tainted, the least-loaded pool was all tainted and 5% of the zone-spread pods
            // found no offer in their sample). If none does, every node is asked, and the
            // declines say why. One pass over the view also gives each node's CPU load.
            let mut by_load: Vec<(u64, NodeId)> = world
                .cluster
                .nodes()
                .filter(|n| pods.iter().any(|p| predicates::admits(p, n)))
                .map(|n| {
                    let used = world.cluster.allocated(n.id).cpu_millis;
                    let load = used
                        .saturating_mul(1000)
                        .checked_div(n.allocatable.cpu_millis)
                        .unwrap_or(u64::MAX);
                    (load, n.id)
                })
                .collect();
            if by_load.is_empty() {
                by_load = nodes.iter().map(|n| (0, *n)).collect();
            } else {
                nodes = by_load.iter().map(|(_, n)| *n).collect();
            }
            // Half the sample from the least-loaded nodes (a random pick among the
            // `LOAD_POOL` × sample emptiest, so concurrent auctioneers do not herd onto the
            // same ones), half from everyone (pods with selectors or spread need variety).
            let pool = (self.config.sample * LOAD_POOL).min(by_load.len());
            if pool < by_load.len() {
                by_load.select_nth_unstable(pool);
                by_load.truncate(pool);
            }
            let by_load: Vec<NodeId> = by_load.into_iter().map(|(_, n)| n).collect();
            let mut chosen = hashed_sample(&key, &by_load, self.config.sample * LOAD_SHARE / 100);
            let key_h = predicates::key_hash(&key);
            // The rest from everyone: drawn until the sample is full.
            let first: u64 = 1 << 32; // other draws than the pool's
            let mut draw = first;
            while chosen.len() < self.config.sample && draw < first + 4 * nodes.len() as u64 + 64 {
                let n = nodes[hashed_index(key_h, draw, nodes.len())];
                draw += 1;
                if !chosen.contains(&n) {
                    chosen.push(n);
                }
            }
            // A pod with a wide constraint may fit only in some domains (the emptiest zone of a
            // spread): the sample holds a node of every domain of its topology key, when those
            // are few, so it does not fall back to asking every node for want of one — a node
            // that admits one of the batch's pods, as all of `nodes` do if any does (a tainted
            // node there would decline, and the auction go exhaustive: 5.5% of spread pods
            // did). Found by walking the nodes from a point the key picks: the walk stops as
            // soon as every domain has one.
            for topology in wide_keys(&pods) {
                if world.cluster.domain_count(topology) > self.config.sample {
                    continue;
                }
                let covered: HashSet<&String> = chosen
                    .iter()
                    .filter_map(|n| world.cluster.node(*n)?.labels.get(topology))
                    .collect();
                let mut missing: HashSet<String> = world
                    .cluster
                    .domains_of(topology)
                    .into_iter()
                    .filter(|d| !covered.contains(d))
                    .collect();
                let start = hashed_index(key_h, u64::MAX, nodes.len());
                let mut extra = Vec::new();
                for step in 0..nodes.len() {
                    if missing.is_empty() {
                        break;
                    }
                    let id = nodes[(start + step) % nodes.len()];
                    if let Some(d) = world.cluster.node(id).and_then(|n| n.labels.get(topology))
                        && missing.remove(d)
                    {
                        extra.push(id);
                    }
                }
                chosen.extend(extra);
            }
            nodes = chosen;
        }
        for pod in &pods {
            self.in_flight.insert(pod.uid.clone());
        }
        let exhaustive = exhaustive || nodes.len() == world.cluster.node_count();
        self.auctions_started += 1;
        self.exhaustive_auctions += u64::from(exhaustive);
        for node in &nodes {
            out.push(Output::Send {
                to: *node,
                message: Message::Call {
                    auction: (self.id, self.seq),
                    pods: pods.clone(),
                    exhaustive,
                },
            });
        }
        self.auctions.insert(
            self.seq,
            Auction {
                epochs: pods
                    .iter()
                    .map(|p| (p.uid.clone(), epochs.get(&p.uid).copied().unwrap_or(0)))
                    .collect(),
                pods,
                waiting: nodes.iter().copied().collect(),
                asked: nodes.len(),
                exhaustive,
                offers: HashMap::new(),
                preemptions: HashMap::new(),
                capacity: HashMap::new(),
                declines: HashMap::new(),
                deadline: now + self.config.bid_timeout,
            },
        );
    }

    pub fn on_message(
        &mut self,
        now: Duration,
        from: NodeId,
        message: Message,
        world: &World,
    ) -> Vec<Output> {
        let mut out = Vec::new();
        match message {
            Message::Call {
                auction,
                pods,
                exhaustive,
            } => {
                let Some(node) = world.cluster.node(self.id) else {
                    return out;
                };
                let allocatable = node.allocatable;
                let free = allocatable.minus(world.cluster.allocated(self.id));
                let bids = self.bid(now, &pods, world);
                let preemptions = if exhaustive {
                    preemption_offers(self.id, &pods, &bids, world)
                } else {
                    Vec::new()
                };
                out.push(Output::Send {
                    to: auction.0,
                    message: Message::Bids {
                        auction,
                        free,
                        allocatable,
                        bids,
                        preemptions,
                    },
                });
            }
            Message::Bids {
                auction,
                free,
                allocatable,
                bids,
                preemptions,
            } => {
                let Some(a) = self
                    .auctions
                    .get_mut(&auction.1)
                    .filter(|_| auction.0 == self.id)
                else {
                    return out;
                };
                a.waiting.remove(&from);
                a.capacity.insert(from, (free, allocatable));
                for (uid, bid) in bids {
                    match bid {
                        Ok(score) => a.offers.entry(uid.clone()).or_default().push((
                            score,
                            predicates::tie_break(&uid, from),
                            from,
                        )),
                        Err(decline) => a.declines.entry(uid).or_default().push(decline),
                    }
                }
                for (uid, victims, highest) in preemptions {
                    let tie = predicates::tie_break(&uid, from);
                    a.preemptions.entry(uid).or_default().push((
                        highest,
                        victims.len(),
                        tie,
                        from,
                        victims,
                    ));
                }
                if a.waiting.is_empty() {
                    self.decide(auction.1, now, world, &mut out);
                }
            }
        }
        out
    }

    /// The bidder side: checks each pod of the batch against this node as it is now, and
    /// scores it as if the pods it has offered (and not seen bound yet) were placed, weighted by
    /// `pressure_percent`.
    fn bid(
        &mut self,
        now: Duration,
        pods: &[Arc<PodRequest>],
        world: &World,
    ) -> Vec<(String, Result<i64, Decline>)> {
        let Some(node) = world.cluster.node(self.id) else {
            return Vec::new();
        };
        self.offered.retain(|_, o| o.until > now);
        let used = world.cluster.allocated(self.id);
        let mut pressure = self
            .offered
            .values()
            .fold(Resources::default(), |acc, o| acc.plus(o.expected));
        let mut bids = Vec::with_capacity(pods.len());
        for pod in pods {
            self.evaluations += 1;
            let bid = predicates::check(pod, node, used, world.cluster);
            let bid = bid.map(|()| {
                let score = predicates::score(pod, node, used.plus(pressure), world.cluster);
                let expected = Resources::new(
                    pod.requests.cpu_millis * self.config.pressure_percent / 100,
                    pod.requests.memory_bytes * self.config.pressure_percent / 100,
                    0,
                );
                pressure = pressure.plus(expected);
                self.offered.insert(
                    pod.uid.clone(),
                    Offer {
                        expected,
                        until: now + self.config.offer_ttl,
                    },
                );
                score
            });
            bids.push((pod.uid.clone(), bid));
        }
        bids
    }

    /// Packs the batch: each pod, in order, to its best offer that still fits what the bidder
    /// reported free minus what this batch already gave it.
    fn decide(&mut self, seq: u64, now: Duration, world: &World, out: &mut Vec<Output>) {
        let Some(mut a) = self.auctions.remove(&seq) else {
            return;
        };
        self.decided = true;
        let mut given: HashMap<NodeId, Resources> = HashMap::new();
        // What this batch placed, for the hard topology constraints between its own pods, and
        // before them the pods with a wide constraint this node bound lately that its view
        // does not hold yet (the bidders may not have seen them either).
        self.recent.retain(|(node, pod, until)| {
            *until > now && world.cluster.requests_of(*node, &pod.uid).is_none()
        });
        let mut placed: Vec<(NodeId, Arc<PodRequest>)> = self
            .recent
            .iter()
            .map(|(node, pod, _)| (*node, pod.clone()))
            .collect();
        for pod in &a.pods {
            self.in_flight.remove(&pod.uid);
            let epoch = a.epochs.get(&pod.uid).copied().unwrap_or(0);
            let offers = a.offers.remove(&pod.uid).unwrap_or_default();
            let placed_views: Vec<(&NodeView, &PodRequest)> = placed
                .iter()
                .filter_map(|(n, q)| Some((world.cluster.node(*n)?, q.as_ref())))
                .collect();
            // A bidder checked its own view, which may lag this node's: a pod with a wide
            // constraint is checked again against what this node knows.
            let wide = self.config.serialize_wide && predicates::has_wide_constraint(pod);
            let mut conflicts: Vec<Decline> = Vec::new();
            let best = offers
                .iter()
                .filter_map(|&(score, tie, node)| {
                    if let Some(view) = world.cluster.node(node) {
                        let conflict = if placed_views.is_empty() {
                            None
                        } else {
                            predicates::batch_conflict(pod, view, &placed_views, world.cluster)
                        };
                        let conflict = conflict.or_else(|| {
                            wide.then(|| predicates::topology(pod, view, world.cluster).err())
                                .flatten()
                        });
                        if let Some(decline) = conflict {
                            conflicts.push(decline);
                            return None;
                        }
                    }
                    let (free, allocatable) = a.capacity.get(&node).copied()?;
                    let already = given.get(&node).copied().unwrap_or_default();
                    let left = free.minus(already);
                    let fits = pod.requests.cpu_millis <= left.cpu_millis
                        && pod.requests.memory_bytes <= left.memory_bytes
                        && pod.requests.pods <= left.pods;
                    // What this batch gave the node lowers its least-allocated score, as if the
                    // bidder had scored the pod after them.
                    // (A score and capacities come from the bidder: bounded arithmetic.)
                    let share = |g: u64, cap: u64| {
                        (g.saturating_mul(100).checked_div(cap).unwrap_or(0)).min(100) as i64
                    };
                    let lowered = score.saturating_sub(
                        predicates::WEIGHT_LEAST_ALLOCATED
                            * (share(already.cpu_millis, allocatable.cpu_millis)
                                + share(already.memory_bytes, allocatable.memory_bytes))
                            / 2,
                    );
                    fits.then_some((lowered, tie, node))
                })
                .max();
            match best {
                Some((_, _, node)) => {
                    *given.entry(node).or_default() = given
                        .get(&node)
                        .copied()
                        .unwrap_or_default()
                        .plus(pod.requests);
                    placed.push((node, pod.clone()));
                    if wide {
                        self.recent
                            .push((node, pod.clone(), now + self.config.offer_ttl));
                    }
                    self.bound
                        .insert(pod.uid.clone(), (epoch, now + self.config.offer_ttl));
                    out.push(Output::Bind(Binding {
                        pod: pod.uid.clone(),
                        node,
                        epoch,
                        stamp: (now.as_millis() as u64, self.id),
                    }));
                }
                // Every offer was ruled out by what was placed since it was made (the bidders'
                // views were stale, not the nodes unfit): auctioned again at once with fresh
                // bids, a few times, before it counts as not fitting.
                None if !conflicts.is_empty()
                    && conflicts.len() == offers.len()
                    && self.stale.get(&pod.uid).copied().unwrap_or(0) < STALE_RETRIES =>
                {
                    *self.stale.entry(pod.uid.clone()).or_default() += 1;
                    self.stale_retries += 1;
                    if a.exhaustive {
                        self.exhaustive_next.insert(pod.uid.clone());
                    }
                }
                None if !a.exhaustive => {
                    self.exhaustive_next.insert(pod.uid.clone());
                }
                None if a.preemptions.contains_key(&pod.uid) => {
                    // Nowhere to fit: the node whose victims matter least (lowest highest
                    // priority, then fewest) makes room.
                    let mut options = a.preemptions.remove(&pod.uid).unwrap_or_default();
                    options.sort_by_key(|(highest, count, tie, node, _)| {
                        (*highest, *count, std::cmp::Reverse(*tie), *node)
                    });
                    let (_, _, _, node, victims) = options.swap_remove(0);
                    self.bound
                        .insert(pod.uid.clone(), (epoch, now + self.config.offer_ttl));
                    out.push(Output::Preempt {
                        binding: Binding {
                            pod: pod.uid.clone(),
                            node,
                            epoch,
                            stamp: (now.as_millis() as u64, self.id),
                        },
                        victims,
                    });
                }
                None => {
                    let mut declines = a.declines.get(&pod.uid).cloned().unwrap_or_default();
                    // Offers this batch's own pods ruled out count with their reason; those
                    // its packing used up count as insufficient.
                    declines.extend(
                        offers
                            .iter()
                            .skip(conflicts.len())
                            .map(|_| Decline::InsufficientCpu),
                    );
                    declines.extend(conflicts);
                    self.stale.remove(&pod.uid);
                    self.retry_at
                        .insert(pod.uid.clone(), now + self.config.retry_after);
                    out.push(Output::Unschedulable {
                        pod: pod.uid.clone(),
                        message: predicates::summarize(
                            world.cluster.node_count().max(a.asked),
                            &declines,
                        ),
                    });
                }
            }
        }
    }

    /// What a pod's volumes allow changed (a claim made, bound or gone): every verdict is given
    /// again at once, as when the nodes change, rather than at its retry.
    pub fn volumes_changed(&mut self) {
        self.retry_at.clear();
    }

    /// A binding became visible: the offer for it is resolved (it now counts as allocated on
    /// the winner, and as nothing elsewhere).
    pub fn on_binding(&mut self, binding: &Binding) {
        self.offered.remove(&binding.pod);
        self.retry_at.remove(&binding.pod);
        self.stale.remove(&binding.pod);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(uid: &str, app: &str, spec: serde_json::Value) -> Arc<PodRequest> {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "i"}]);
        Arc::new(
            PodRequest::from_pod(
                &json!({"metadata": {"name": uid, "uid": uid, "namespace": "default",
                "labels": {"app": app}}, "spec": spec}),
            )
            .unwrap(),
        )
    }

    fn zone_spread(app: &str) -> serde_json::Value {
        json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": app}}}]})
    }

    /// Replicas sharing a wide constraint share an auctioneer (and never a batch); a pod
    /// without one, or with only hostname-scoped terms the node itself checks, is keyed by its
    /// uid.
    #[test]
    fn pods_sharing_a_wide_constraint_share_an_auctioneer_and_never_a_batch() {
        let (a, b) = (
            pod("a", "web", zone_spread("web")),
            pod("b", "web", zone_spread("web")),
        );
        let other = pod("c", "db", zone_spread("db"));
        let plain = pod("d", "web", json!({}));
        let hostname = pod(
            "e",
            "web",
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}}}),
        );
        assert_eq!(auction_key(&a), auction_key(&b));
        assert_ne!(auction_key(&a), auction_key(&other));
        assert_eq!(auction_key(&plain), "d");
        assert_eq!(auction_key(&hostname), "e");
        let live = 1..=50u64;
        assert_eq!(auctioneer_of(&a, live.clone()), auctioneer_of(&b, live));

        let scheduler = Scheduler::new(1, AuctionConfig::default());
        let queue = vec![
            a.clone(),
            plain.clone(),
            other.clone(),
            b.clone(),
            hostname.clone(),
        ];
        let (chunks, left) = scheduler.chunks(queue.clone(), 10);
        let uids: Vec<Vec<&str>> = chunks
            .iter()
            .map(|c| c.iter().map(|p| p.uid.as_str()).collect())
            .collect();
        assert_eq!(uids, [vec!["a", "d", "c"], vec!["b", "e"]]);
        assert!(left.is_empty());
        // Only the batches that can start are formed; the rest are handed back in order.
        let (chunks, left) = scheduler.chunks(queue, 1);
        assert_eq!(chunks.len(), 1);
        assert_eq!(
            left.iter().map(|p| p.uid.as_str()).collect::<Vec<_>>(),
            ["b", "e"]
        );
    }
}

//! A deterministic simulation of the auction: every node's [`Scheduler`] in one process, a
//! message queue with a fixed latency on virtual time, and the replicated world (placements and
//! bindings) applied as the auctioneers write it. Fenced pods run as they do in the agent: only
//! while their node's side is not fenced off *and* the node holds the pod's run lease, from the
//! same [`Grantor`] and [`Holder`] the agent's scheduling shell drives, asked on the same
//! schedule ([`lease::round_due`]). Used by the tests (node loss, partitions, determinism) and
//! by the 1,000-node benchmark.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use shoal_core::placement::auction::{
    AuctionConfig, Binding, Message, NodeId, Output, Scheduler, World, auctioneer, auctioneer_of,
};
use shoal_core::placement::cluster::ClusterView;
use shoal_core::placement::eviction;
use shoal_core::placement::lease::{self, Ask, Grantor, Holder, LeaseReply};
use shoal_core::placement::partition::{self, FenceConfig, Policy};
use shoal_core::placement::predicates;
use shoal_model::placement::{NodeView, PodRequest};

/// Tunables of a simulation.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub latency: Duration,
    pub tick: Duration,
    /// How long a dead node's pods wait before they are auctioned again.
    pub eviction_delay: Duration,
    pub auction: AuctionConfig,
    /// Timing of the `fenced` policy.
    pub fence: FenceConfig,
    /// How long nodes on the two sides of a partition take to declare each other dead
    /// (at most the fence config's detection bound).
    pub detection: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: Duration::from_millis(1),
            tick: Duration::from_millis(10),
            eviction_delay: Duration::from_secs(3),
            auction: AuctionConfig::default(),
            fence: FenceConfig::new(Duration::from_secs(2), Duration::from_secs(2)),
            detection: Duration::from_secs(2),
        }
    }
}

/// One node's run-lease state: what it grants its peers, what it holds, when it last asked.
#[derive(Debug, Clone)]
struct NodeLeases {
    grantor: Grantor,
    holder: Holder,
    last_round: Option<Duration>,
}

/// The name a node's bindings and leases carry.
fn node_name(id: NodeId) -> String {
    format!("node-{id}")
}

/// Counters of a run.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimStats {
    /// Calls for bids and bid answers.
    pub auction_messages: u64,
    /// Binding writes (each replicated to every node by the store).
    pub bindings_written: u64,
    /// Bindings refused at admission (re-auctioned with epoch + 1).
    pub refused: u64,
    /// Predicate + score evaluations by bidders.
    pub evaluations: u64,
    /// Auctions started, exhaustive ones, and stale re-auctions (the schedulers' counters).
    pub auctions: u64,
    pub exhaustive_auctions: u64,
    pub stale_retries: u64,
    /// Pods evicted by preemption (and auctioned again).
    pub preempted: u64,
    /// Bindings that broke a hard topology constraint (required pod affinity or
    /// anti-affinity, `DoNotSchedule` spread) given every pod bound before them: what a
    /// serial scheduler would never do. The checker of the auction's exactness.
    pub topology_violations: u64,
}

#[derive(Clone)]
pub struct Sim {
    pub now: Duration,
    config: SimConfig,
    schedulers: BTreeMap<NodeId, Scheduler>,
    pub cluster: ClusterView,
    pods: HashMap<String, Arc<PodRequest>>,
    pub bindings: HashMap<String, Binding>,
    dead: eviction::DeadTimers<NodeId>,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    in_transit: HashMap<u64, (NodeId, NodeId, Message)>,
    msg_seq: u64,
    /// Who bid on a pod (to release their reservations when it is bound).
    bidders: HashMap<String, HashSet<NodeId>>,
    pub unschedulable: HashMap<String, String>,
    pub stats: SimStats,
    /// Pods waiting for an auction, by auctioneer, with the epoch their binding must carry.
    pending: HashMap<NodeId, BTreeMap<String, (Arc<PodRequest>, u64)>>,
    auctioneer_of: HashMap<String, NodeId>,
    /// Evictions due: (time, dead node).
    evictions: Vec<(Duration, NodeId)>,
    /// Partition policy per pod (absent: available).
    policies: HashMap<String, Policy>,
    /// Nodes of the whole cluster (majorities are counted against it).
    members: usize,
    /// What this world's side knows of its fenced pods (the live shell's core).
    fence: partition::Fence,
    /// Nodes on the other side of a partition, declared dead at the given time.
    cut_off: HashMap<NodeId, Duration>,
    /// Each node's run leases (a node of the other side keeps its own there).
    leases: BTreeMap<NodeId, NodeLeases>,
    /// Fenced pods of frozen nodes whose containers still run: uid -> (node, binding epoch,
    /// the instant its shim kills it).
    frozen_runs: HashMap<String, (NodeId, u64, Duration)>,
}

impl Sim {
    pub fn new(config: SimConfig, nodes: Vec<NodeView>) -> Self {
        let mut cluster = ClusterView::default();
        let mut schedulers = BTreeMap::new();
        let mut leases = BTreeMap::new();
        for node in nodes {
            schedulers.insert(node.id, Scheduler::new(node.id, config.auction.clone()));
            leases.insert(
                node.id,
                NodeLeases {
                    grantor: Grantor::new(Duration::ZERO, config.fence.lease_term),
                    holder: Holder::default(),
                    last_round: None,
                },
            );
            cluster.add_node(node);
        }
        Self {
            now: Duration::ZERO,
            config,
            schedulers,
            cluster,
            pods: HashMap::new(),
            bindings: HashMap::new(),
            dead: eviction::DeadTimers::default(),
            queue: BinaryHeap::new(),
            in_transit: HashMap::new(),
            msg_seq: 0,
            bidders: HashMap::new(),
            unschedulable: HashMap::new(),
            stats: SimStats::default(),
            pending: HashMap::new(),
            auctioneer_of: HashMap::new(),
            evictions: Vec::new(),
            policies: HashMap::new(),
            members: 0,
            fence: partition::Fence::new(),
            cut_off: HashMap::new(),
            leases,
            frozen_runs: HashMap::new(),
        }
        .with_members()
    }

    fn with_members(mut self) -> Self {
        self.members = self.schedulers.len();
        self.observe_fence();
        self
    }

    /// Feeds this side's view to the fence: nodes not yet declared dead still count as alive
    /// (nobody knows they are gone), and the stores of one side agree.
    fn observe_fence(&mut self) {
        let alive = self.schedulers.len() + self.cut_off.len();
        let view = partition::FenceView {
            alive,
            baseline: self.members,
            agreeing: alive.saturating_sub(1),
            settled: true,
        };
        self.fence.observe(self.now, view, &self.config.fence);
    }

    /// Sets a pod's partition policy.
    pub fn set_policy(&mut self, uid: &str, policy: Policy) {
        self.policies.insert(uid.to_owned(), policy);
    }

    fn policy(&self, uid: &str) -> Policy {
        self.policies.get(uid).copied().unwrap_or(Policy::Available)
    }

    pub fn add_pods(&mut self, pods: impl IntoIterator<Item = PodRequest>) {
        let live: Vec<NodeId> = self.schedulers.keys().copied().collect();
        for pod in pods {
            let pod = Arc::new(pod);
            if let Some(a) = self.auctioneer_for(&pod, &live) {
                self.auctioneer_of.insert(pod.uid.clone(), a);
            }
            self.pods.insert(pod.uid.clone(), pod.clone());
            self.make_pending(&pod.uid, 1);
        }
    }

    /// A pod's auctioneer among `live`, as the shell chooses it ([`auctioneer_of`]); by uid
    /// alone when the config turns serialization off (to measure what it buys).
    fn auctioneer_for(&self, pod: &PodRequest, live: &[NodeId]) -> Option<NodeId> {
        if self.config.auction.serialize_wide {
            auctioneer_of(pod, live.iter().copied())
        } else {
            auctioneer(&pod.uid, live.iter().copied())
        }
    }

    fn make_pending(&mut self, uid: &str, epoch: u64) {
        let Some(a) = self.auctioneer_of.get(uid).copied() else {
            return;
        };
        let pod = self.pods[uid].clone();
        self.pending
            .entry(a)
            .or_default()
            .insert(uid.to_owned(), (pod, epoch));
    }

    fn unpend(&mut self, uid: &str) {
        if let Some(a) = self.auctioneer_of.get(uid)
            && let Some(list) = self.pending.get_mut(a)
        {
            list.remove(uid);
        }
    }

    /// A node dies: it stops answering at once; its pods are re-auctioned after the eviction
    /// delay (membership would have declared it dead by then).
    pub fn kill(&mut self, node: NodeId) {
        self.schedulers.remove(&node);
        self.dead.observe(&node, true, self.now);
        self.cluster.remove_node(node);
        self.evictions
            .push((self.now + self.config.eviction_delay, node));
        // Membership changed: auctioneers move (only those of the dead node's pods, by
        // rendezvous hashing), and pending pods follow them.
        self.move_auctioneers(|_, auctioneer| auctioneer == Some(node));
    }

    /// Membership changed: the pods `moves` picks (by uid and current auctioneer) get the
    /// auctioneer their key hashes to among the live nodes now, and pending pods follow them.
    fn move_auctioneers(&mut self, moves: impl Fn(&str, Option<NodeId>) -> bool) {
        let live: Vec<NodeId> = self.schedulers.keys().copied().collect();
        let waiting: Vec<(String, u64)> = self
            .pending
            .drain()
            .flat_map(|(_, list)| list.into_iter().map(|(uid, (_, epoch))| (uid, epoch)))
            .collect();
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            if moves(&uid, self.auctioneer_of.get(&uid).copied())
                && let Some(a) = self.auctioneer_for(&self.pods[&uid], &live)
            {
                self.auctioneer_of.insert(uid, a);
            }
        }
        for (uid, epoch) in waiting {
            self.make_pending(&uid, epoch);
        }
    }

    /// A node joins: it bids from now on, and becomes the auctioneer of the pods (and
    /// constraints) that now hash to it, as membership's rendezvous hashing moves them.
    pub fn join(&mut self, node: NodeView) {
        let id = node.id;
        self.schedulers
            .insert(id, Scheduler::new(id, self.config.auction.clone()));
        self.leases.insert(
            id,
            NodeLeases {
                grantor: Grantor::new(self.now, self.config.fence.lease_term),
                holder: Holder::default(),
                last_round: None,
            },
        );
        self.cluster.add_node(node);
        self.members = self.members.max(self.schedulers.len());
        // Any pod's key may hash to the newcomer now.
        self.move_auctioneers(|_, _| true);
    }

    /// A node freezes (SIGSTOP of its agent): it stops answering and asking, so its peers
    /// declare it dead as [`Sim::kill`] does, but its containers run on. A fenced one runs
    /// until the deadline its kubelet last wrote into its fence lease
    /// ([`Holder::held_until`], the agent's `fenced_run_left`), where its shim kills it; an
    /// available one runs on (that is its policy).
    pub fn freeze(&mut self, node: NodeId) {
        let baseline = self.members.max(1);
        if let Some(l) = self.leases.get(&node) {
            for (uid, b) in &self.bindings {
                if b.node != node || self.policy(uid) != Policy::Fenced || self.fenced_stopped() {
                    continue;
                }
                if let Some(until) = l.holder.held_until(uid, b.epoch, self.now, baseline) {
                    self.frozen_runs.insert(uid.clone(), (node, b.epoch, until));
                }
            }
        }
        self.kill(node);
    }

    pub fn bound_count(&self) -> usize {
        self.bindings
            .values()
            .filter(|b| !self.dead.contains(&b.node))
            .count()
    }

    /// Pods of dead nodes become pending at the next epoch once their policy allows: the live
    /// scheduler's decision ([`eviction::decide`]; this world's view is always settled and has
    /// no suspect nodes or DaemonSet pods).
    fn evict_due(&mut self) {
        let now = self.now;
        self.evictions.retain(|(at, _)| *at > now);
        let rules = eviction::Rules {
            majority: self.fence.has_majority(),
            eviction_delay: self.config.eviction_delay,
            fence: &self.config.fence,
        };
        let mut orphans: Vec<(String, u64)> = Vec::new();
        for (uid, b) in &self.bindings {
            // A pod on a live node is placed whatever it is (`decide`'s first rule for a bound
            // pod): skipped before its policy is looked up, as this runs every tick over every
            // binding (measured: 2 % of the 1,000-node benchmark's CPU otherwise).
            if !self.dead.contains(&b.node) {
                continue;
            }
            let seen = eviction::Seen::Gone(self.dead.gone_for(&b.node, now, true));
            let pod = eviction::Pod {
                bound: true,
                epoch: b.epoch,
                policy: self.policies.get(uid).copied().unwrap_or(Policy::Available),
                daemon: false,
                awaits_preemptor: false,
            };
            if let eviction::Verdict::Auction(epoch) = eviction::decide(&rules, &pod, seen) {
                orphans.push((uid.clone(), epoch));
            }
        }
        for (uid, epoch) in orphans {
            self.make_pending(&uid, epoch);
        }
    }

    /// The nodes this world can no longer reach (the other side of a partition): they stop
    /// answering at once and are declared dead after the detection delay.
    pub fn cut(&mut self, unreachable: &[NodeId]) {
        for node in unreachable {
            self.schedulers.remove(node);
            self.cut_off.insert(*node, self.now + self.config.detection);
        }
        // Messages in flight to or from them are lost.
        let gone: HashSet<NodeId> = unreachable.iter().copied().collect();
        self.in_transit
            .retain(|_, (from, to, _)| !gone.contains(from) && !gone.contains(to));
    }

    fn declare_cut_off_dead(&mut self) {
        let now = self.now;
        let due: Vec<NodeId> = self
            .cut_off
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(n, _)| *n)
            .collect();
        for node in due {
            self.cut_off.remove(&node);
            self.kill(node);
        }
        self.observe_fence();
    }

    /// Whether this world's side stopped its fenced pods (no majority for the fence timeout).
    pub fn fenced_stopped(&self) -> bool {
        self.fence.must_stop()
    }

    /// Where each pod runs in this world right now: its binding's node, if that node is alive
    /// here; a fenced pod only while this side is not fenced off and the node holds the pod's
    /// run lease at the binding's epoch (the agent's `may_run_fenced`).
    pub fn running(&self) -> Vec<(String, NodeId)> {
        let frozen = self
            .frozen_runs
            .iter()
            .filter(|(_, (_, _, until))| self.now < *until)
            .map(|(uid, (node, _, _))| (uid.clone(), *node));
        self.bindings
            .iter()
            .filter(|(_, b)| self.schedulers.contains_key(&b.node))
            .filter(|(uid, b)| self.policy(uid) != Policy::Fenced || self.may_run_fenced(uid, b))
            .map(|(uid, b)| (uid.clone(), b.node))
            .chain(frozen)
            .collect()
    }

    fn may_run_fenced(&self, uid: &str, binding: &Binding) -> bool {
        !self.fenced_stopped()
            && self.leases.get(&binding.node).is_some_and(|l| {
                l.holder
                    .holds(uid, binding.epoch, self.now, self.members.max(1))
            })
    }

    /// Every live node whose lease round is due asks every node of its side (itself included)
    /// for the leases of the fenced pods bound to it; grantors answer from this side's
    /// bindings. Replies arrive at once (sent and received at `now`).
    fn lease_rounds(&mut self) {
        let now = self.now;
        let hold = self.config.fence.lease_hold;
        let baseline = self.members.max(1);
        let live: Vec<NodeId> = self.schedulers.keys().copied().collect();
        // The fenced pods bound to each node (one pass: most simulations have none).
        let mut asks_of: HashMap<NodeId, Vec<Ask>> = HashMap::new();
        for (uid, policy) in &self.policies {
            if let (Policy::Fenced, Some(b)) = (policy, self.bindings.get(uid)) {
                asks_of.entry(b.node).or_default().push(Ask {
                    uid: uid.clone(),
                    epoch: b.epoch,
                });
            }
        }
        for &holder in &live {
            let name = node_name(holder);
            let mut asks = asks_of.remove(&holder).unwrap_or_default();
            asks.sort_by(|x, y| x.uid.cmp(&y.uid));
            let Some(mine) = self.leases.get_mut(&holder) else {
                continue;
            };
            let wanted: HashSet<&str> = asks.iter().map(|a| a.uid.as_str()).collect();
            mine.holder.retain(now, |uid| wanted.contains(uid));
            let all_held = asks
                .iter()
                .all(|a| mine.holder.holds(&a.uid, a.epoch, now, baseline));
            if asks.is_empty()
                || !lease::round_due(mine.last_round, all_held, now, self.config.tick)
            {
                continue;
            }
            mine.last_round = Some(now);
            for &grantor in &live {
                let bindings = &self.bindings;
                let granted = self
                    .leases
                    .get_mut(&grantor)
                    .expect("every live node has leases")
                    .grantor
                    .answer(now, &name, &asks, |uid| {
                        bindings.get(uid).map(|b| lease::Binding {
                            name: uid.to_owned(),
                            node: node_name(b.node),
                            epoch: b.epoch,
                        })
                    });
                let reply = LeaseReply {
                    granted,
                    baseline: u32::try_from(baseline).unwrap_or(u32::MAX),
                };
                self.leases
                    .get_mut(&holder)
                    .expect("checked above")
                    .holder
                    .on_reply(now, hold, &node_name(grantor), &asks, &reply);
            }
        }
    }

    /// Heals a partition: one world from every side's, bindings merged by the binding rule
    /// (the higher one wins), every node alive again.
    pub fn heal(sides: Vec<Sim>) -> Sim {
        let mut sides = sides.into_iter();
        let mut merged = sides.next().expect("at least one side");
        let mut all_nodes: BTreeMap<NodeId, shoal_model::placement::NodeView> = BTreeMap::new();
        let mut schedulers = std::mem::take(&mut merged.schedulers);
        // Each node keeps the lease state of the side it lived on.
        let mut leases: BTreeMap<NodeId, NodeLeases> = merged
            .leases
            .iter()
            .filter(|(id, _)| schedulers.contains_key(id))
            .map(|(id, l)| (*id, l.clone()))
            .collect();
        let mut bindings = std::mem::take(&mut merged.bindings);
        let mut now = merged.now;
        let mut others = Vec::new();
        for side in sides {
            now = now.max(side.now);
            schedulers.extend(side.schedulers.clone());
            for id in side.schedulers.keys() {
                leases.insert(*id, side.leases[id].clone());
            }
            for (uid, b) in &side.bindings {
                if bindings.get(uid).is_none_or(|old| b.wins_over(old)) {
                    bindings.insert(uid.clone(), b.clone());
                }
            }
            others.push(side);
        }
        for side in std::iter::once(&merged).chain(&others) {
            for n in side.cluster.nodes() {
                all_nodes.insert(n.id, n.clone());
            }
        }
        let mut cluster = ClusterView::default();
        for n in all_nodes.values() {
            if schedulers.contains_key(&n.id) {
                cluster.add_node(n.clone());
            }
        }
        for (uid, b) in &bindings {
            if let Some(pod) = merged.pods.get(uid) {
                cluster.place(b.node, pod);
            }
        }
        merged.now = now;
        merged.schedulers = schedulers;
        merged.leases = leases;
        merged.bindings = bindings;
        merged.cluster = cluster;
        merged.dead.clear();
        merged.cut_off.clear();
        merged.evictions.clear();
        merged.observe_fence();
        merged.in_transit.clear();
        merged.queue.clear();
        // Auctioneers over the whole membership again; unbound pods pending there.
        let live: Vec<NodeId> = merged.schedulers.keys().copied().collect();
        merged.pending.clear();
        let uids: Vec<String> = merged.pods.keys().cloned().collect();
        for uid in uids {
            if let Some(a) = merged.auctioneer_for(&merged.pods[&uid], &live) {
                merged.auctioneer_of.insert(uid.clone(), a);
            }
            if !merged.bindings.contains_key(&uid) {
                merged.make_pending(&uid, 1);
            }
        }
        merged
    }

    fn send(&mut self, from: NodeId, to: NodeId, message: Message) {
        self.msg_seq += 1;
        self.stats.auction_messages += 1;
        if let Message::Bids { bids, .. } = &message {
            for (uid, bid) in bids {
                if bid.is_ok() {
                    self.bidders.entry(uid.clone()).or_default().insert(from);
                }
            }
        }
        self.in_transit.insert(self.msg_seq, (from, to, message));
        self.queue
            .push(Reverse((self.now + self.config.latency, self.msg_seq)));
    }

    fn apply(&mut self, from: NodeId, outputs: Vec<Output>) {
        for output in outputs {
            match output {
                Output::Send { to, message } => self.send(from, to, message),
                Output::Unschedulable { pod, message } => {
                    self.unschedulable.insert(pod, message);
                }
                Output::Bind(binding) => self.bind(binding),
                Output::Preempt { binding, victims } => {
                    for victim in victims {
                        let Some(old) = self.bindings.remove(&victim) else {
                            continue;
                        };
                        let pod = self.pods[&victim].clone();
                        self.cluster.unplace(old.node, &pod);
                        self.stats.preempted += 1;
                        self.make_pending(&victim, old.epoch + 1);
                    }
                    self.bind(binding);
                }
            }
        }
    }

    /// Writes a binding (merge rule: the higher binding wins) and runs the winner's admission:
    /// its resources, host ports (the view's [`ClusterView::host_ports_taken`], what
    /// [`predicates::host_port_conflict`] finds at the kubelet), and
    /// [`predicates::hostname_conflict`] as the kubelet runs it.
    fn bind(&mut self, binding: Binding) {
        self.stats.bindings_written += 1;
        if self
            .bindings
            .get(&binding.pod)
            .is_some_and(|old| !binding.wins_over(old))
        {
            return;
        }
        let pod = self.pods[&binding.pod].clone();
        let Some(node) = self.cluster.node(binding.node).cloned() else {
            return; // the winner died meanwhile: the pod stays pending
        };
        let free = node.allocatable.minus(self.cluster.allocated(node.id));
        let fits = pod.requests.cpu_millis <= free.cpu_millis
            && pod.requests.memory_bytes <= free.memory_bytes
            && pod.requests.pods <= free.pods;
        // The node's own host-port and anti-affinity checks, as the kubelet's admission makes
        // them (only pods with host ports or such terms, or matched by one here, pay for the
        // scan).
        let fits = fits && !self.cluster.host_ports_taken(node.id, &pod);
        let fits = fits && {
            let involved = pod
                .anti_affinity
                .iter()
                .any(|t| t.topology_key == predicates::HOSTNAME)
                || self.cluster.repelled(&node, &pod);
            !involved || {
                // The pods the node runs (its view of itself is the cluster's, here).
                let here: Vec<&PodRequest> = self
                    .cluster
                    .pods_on(node.id)
                    .filter(|uid| *uid != binding.pod)
                    .filter_map(|uid| self.pods.get(uid).map(|p| p.as_ref()))
                    .collect();
                let namespace_labels = |ns: &str| self.cluster.namespace_labels(ns).cloned();
                predicates::hostname_conflict(&pod, here, &namespace_labels).is_none()
            }
        };
        for bidder in self.bidders.remove(&binding.pod).unwrap_or_default() {
            if let Some(s) = self.schedulers.get_mut(&bidder) {
                s.on_binding(&binding);
            }
        }
        if !fits {
            // The winner refuses: re-auction with a higher epoch.
            self.stats.refused += 1;
            self.make_pending(&binding.pod, binding.epoch + 1);
            return;
        }
        if let Some(old) = self.bindings.get(&binding.pod)
            && self.cluster.node(old.node).is_some()
        {
            // The loser stops its instance.
            self.cluster.unplace(old.node, &pod);
        }
        // The checker: against every pod bound so far (this view is the whole truth), would a
        // serial scheduler have placed it here?
        if predicates::topology(&pod, &node, &self.cluster).is_err() {
            self.stats.topology_violations += 1;
        }
        self.cluster.place(binding.node, &pod);
        self.unschedulable.remove(&binding.pod);
        self.unpend(&binding.pod);
        self.bindings.insert(binding.pod.clone(), binding);
    }

    /// The pods node `id` is auctioneer of, with their epochs.
    fn pending_of(&self, id: NodeId) -> Vec<(Arc<PodRequest>, u64)> {
        self.pending
            .get(&id)
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Runs until `done` holds or `limit` of virtual time passes.
    pub fn run(&mut self, limit: Duration, done: impl Fn(&Sim) -> bool) {
        let end = self.now + limit;
        let mut next_tick = self.now;
        while self.now < end && !done(self) {
            while let Some(Reverse((at, seq))) = self.queue.peek().copied() {
                if at > self.now {
                    break;
                }
                self.queue.pop();
                let (from, to, message) = self.in_transit.remove(&seq).expect("queued");
                let Some(mut s) = self.schedulers.remove(&to) else {
                    continue;
                };
                let world = World {
                    cluster: &self.cluster,
                    pending: &[],
                };
                let mut outputs = s.on_message(self.now, from, message, &world);
                // As the shell does: an auction decided by its last bid lets the next start.
                if s.has_room() {
                    let pending = self.pending_of(to);
                    let world = World {
                        cluster: &self.cluster,
                        pending: &pending,
                    };
                    outputs.extend(s.resume(self.now, &world));
                }
                self.schedulers.insert(to, s);
                self.apply(to, outputs);
            }
            if self.now >= next_tick {
                self.declare_cut_off_dead();
                self.evict_due();
                self.lease_rounds();
                let ids: Vec<NodeId> = self.schedulers.keys().copied().collect();
                for id in ids {
                    let Some(mut s) = self.schedulers.remove(&id) else {
                        continue;
                    };
                    let pending = self.pending_of(id);
                    let world = World {
                        cluster: &self.cluster,
                        pending: &pending,
                    };
                    let outputs = s.tick(self.now, &world);
                    self.schedulers.insert(id, s);
                    self.apply(id, outputs);
                }
                next_tick = self.now + self.config.tick;
            }
            let next_message = self.queue.peek().map(|Reverse((at, _))| *at);
            self.now = next_message
                .map_or(next_tick, |m| m.min(next_tick))
                .max(self.now + Duration::from_micros(1));
        }
        self.stats.evaluations = self.schedulers.values().map(|s| s.evaluations).sum();
        self.stats.auctions = self.schedulers.values().map(|s| s.auctions_started).sum();
        self.stats.exhaustive_auctions = self
            .schedulers
            .values()
            .map(|s| s.exhaustive_auctions)
            .sum();
        self.stats.stale_retries = self.schedulers.values().map(|s| s.stale_retries).sum();
    }

    /// Everything placed, on live nodes, within every node's allocatable?
    pub fn check_invariants(&self) -> Result<(), String> {
        for node in self.cluster.nodes() {
            let used = self.cluster.allocated(node.id);
            if used.cpu_millis > node.allocatable.cpu_millis
                || used.memory_bytes > node.allocatable.memory_bytes
                || used.pods > node.allocatable.pods
            {
                return Err(format!(
                    "node {} is overcommitted: {used:?} > {:?}",
                    node.name, node.allocatable
                ));
            }
        }
        Ok(())
    }
}

/// The centralized greedy baseline: each pod, in order, to the best-scoring feasible node.
pub fn central_greedy(nodes: &[NodeView], pods: &[PodRequest]) -> ClusterView {
    let mut cluster = ClusterView::default();
    for n in nodes {
        cluster.add_node(n.clone());
    }
    for pod in pods {
        let best = nodes
            .iter()
            .filter_map(|n| {
                let used = cluster.allocated(n.id);
                predicates::check(pod, n, used, &cluster).ok().map(|()| {
                    (
                        predicates::score(pod, n, used, &cluster),
                        predicates::tie_break(&pod.uid, n.id),
                        n.id,
                    )
                })
            })
            .max();
        if let Some((_, _, id)) = best {
            cluster.place(id, pod);
        }
    }
    cluster
}

/// Standard deviation of nodes' CPU utilisation (0..1).
pub fn cpu_utilisation_stddev(cluster: &ClusterView) -> f64 {
    let fractions: Vec<f64> = cluster
        .nodes()
        .map(|n| cluster.allocated(n.id).cpu_millis as f64 / n.allocatable.cpu_millis.max(1) as f64)
        .collect();
    let mean = fractions.iter().sum::<f64>() / fractions.len().max(1) as f64;
    (fractions.iter().map(|f| (f - mean).powi(2)).sum::<f64>() / fractions.len().max(1) as f64)
        .sqrt()
}

//! The node's pod network: holds a block of the cluster CIDR through desired state, keeps the
//! bridge on it and the routes to every other node's block (DESIGN.md §9).
//!
//! The decisions are pure (`shoal_net::lease`); this shell reads the leases and membership,
//! writes lease objects through the same store API as users, and applies the result to the
//! host through `shoal_net::linux::BridgeNetwork`. Level-triggered: every round starts from
//! what the store and the host say, so a restarted agent simply continues.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::PoisonError;
use std::time::Duration;

use serde_json::{Value, json};
use shoal_gossip::{MemberState, Membership};
use shoal_net::lease::{self, Decision, Lease, Pool};
use shoal_net::linux::{BridgeNetwork, Route};
use shoal_state::{ObjectKey, WriteMode, kind};
use tracing::{debug, info, warn};

use crate::replication::Replication;
use crate::runtime::Runtime;

/// The lease object kind.
pub fn lease_kind() -> &'static kind::KindInfo {
    kind::lookup("network.shoal.io/v1", "PodCIDRBlock").expect("a built-in kind")
}

/// A block held by a node that has not been alive for this long may be taken by a node that
/// finds no free block (a partitioned holder that comes back then re-leases and renumbers).
pub const RECLAIM_AFTER: Duration = Duration::from_secs(600);

/// Reads the valid leases among stored `PodCIDRBlock` objects; others (a name that is not a
/// block, a spec that disagrees with the name, no holder) are skipped and named in the log.
pub fn leases(objects: &[Value]) -> Vec<Lease> {
    let mut out = Vec::new();
    for object in objects {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        match parse_lease(object) {
            Ok(lease) => out.push(lease),
            Err(reason) => debug!(lease = name, reason, "ignoring a PodCIDRBlock"),
        }
    }
    out
}

fn parse_lease(object: &Value) -> Result<Lease, &'static str> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let (block, holder) =
        lease::parse_lease_name(name).ok_or("the name is not <block>.<node id>")?;
    if object["spec"]["cidr"].as_str() != Some(block.to_string().as_str()) {
        return Err("spec.cidr differs from the name");
    }
    if object["spec"]["nodeID"].as_str() != Some(holder) {
        return Err("spec.nodeID differs from the name");
    }
    Ok(Lease {
        block,
        holder: holder.to_owned(),
        created: object["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    })
}

/// The lease object for `block` held by this node.
pub fn lease_object(block: ipnet::Ipv4Net, node_id: &str, node_name: &str) -> Value {
    json!({
        "apiVersion": "network.shoal.io/v1",
        "kind": "PodCIDRBlock",
        "metadata": {"name": lease::lease_name(block, node_id)},
        "spec": {"cidr": block.to_string(), "nodeID": node_id, "nodeName": node_name},
    })
}

/// Each node's block, by node id (for Node objects' `spec.podCIDR`).
pub fn blocks_by_node(
    replication: &Replication,
    pool: Option<&Pool>,
) -> HashMap<String, ipnet::Ipv4Net> {
    let info = lease_kind();
    let objects = replication.read(|s| s.list(info.group, info.kind, None));
    let leases = leases(&objects);
    let mut by_node: HashMap<String, ipnet::Ipv4Net> = HashMap::new();
    for (block, lease) in lease::winners(&leases) {
        if pool.is_some_and(|p| !p.has_block(block)) {
            continue;
        }
        let entry = by_node.entry(lease.holder.clone()).or_insert(block);
        *entry = (*entry).min(block);
    }
    by_node
}

/// The routes to other nodes' blocks: via each live holder's address, except blocks whose
/// holder shares this host's network namespace (its bridge is a local link already).
pub fn routes(
    leases: &[Lease],
    pool: &Pool,
    me: &str,
    members: &[shoal_gossip::Member],
    local: &BTreeSet<Ipv4Addr>,
) -> Vec<Route> {
    let mut by_node: HashMap<&str, Ipv4Addr> = HashMap::new();
    for m in members {
        if m.is_self || !matches!(m.state, MemberState::Alive | MemberState::Suspect) {
            continue;
        }
        if let IpAddr::V4(ip) = m.gossip_addr.ip() {
            by_node.insert(m.node_id.as_str(), ip);
        }
    }
    let mut out: Vec<Route> = lease::winners(leases)
        .into_values()
        .filter(|l| l.holder != me && pool.has_block(l.block))
        .filter_map(|l| {
            let via = *by_node.get(l.holder.as_str())?;
            (!via.is_loopback() && !via.is_unspecified() && !local.contains(&via)).then_some(
                Route {
                    block: l.block,
                    via,
                },
            )
        })
        .collect();
    out.sort();
    out.dedup_by_key(|r| r.block);
    out
}

/// The running pod network of this node.
pub struct NodeNetwork {
    pool: Pool,
    bridge: Arc<BridgeNetwork>,
    runtime: Runtime,
    replication: Arc<Replication>,
    membership: Arc<Membership>,
    node_id: String,
    node_name: String,
    /// This node's own addresses (routes via them are never needed).
    local: BTreeSet<Ipv4Addr>,
    /// Set by [`NodeNetwork::stop`]; the loop ends after its current round.
    stop: tokio::sync::watch::Sender<bool>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl NodeNetwork {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pool: Pool,
        bridge: Arc<BridgeNetwork>,
        runtime: Runtime,
        replication: Arc<Replication>,
        membership: Arc<Membership>,
        node_id: String,
        node_name: String,
        host_ip: IpAddr,
    ) -> Arc<Self> {
        let mut local = BTreeSet::new();
        if let IpAddr::V4(ip) = host_ip {
            local.insert(ip);
        }
        Arc::new(Self {
            pool,
            bridge,
            runtime,
            replication,
            membership,
            node_id,
            node_name,
            local,
            stop: tokio::sync::watch::channel(false).0,
            task: std::sync::Mutex::new(None),
        })
    }

    /// Ends the loop and waits for its current round (nothing touches the host afterwards).
    pub async fn stop(&self) {
        self.stop.send_replace(true);
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// `--cleanup`: stops the loop, removes the bridge and Shoal's routes, releases this node's
    /// leases.
    pub async fn cleanup(&self) {
        self.stop().await;
        let bridge = self.bridge.clone();
        let cluster = self.pool.cluster();
        match tokio::task::spawn_blocking(move || bridge.cleanup(Some(cluster))).await {
            Ok(Ok(())) => info!("--cleanup: pod network removed"),
            Ok(Err(e)) => warn!(error = %e, "--cleanup: removing the pod network"),
            Err(e) => warn!(error = %e, "--cleanup"),
        }
        let info = lease_kind();
        let objects = self
            .replication
            .read(|s| s.list(info.group, info.kind, None));
        for lease in leases(&objects) {
            if lease.holder != self.node_id {
                continue;
            }
            let key = ObjectKey::new(info, "", &lease::lease_name(lease.block, &lease.holder));
            match self.replication.delete(&key, None).await {
                Ok(_) => info!(block = %lease.block, "--cleanup: pod CIDR released"),
                Err(e) => {
                    warn!(block = %lease.block, error = %e, "--cleanup: releasing the pod CIDR")
                }
            }
        }
    }

    /// Runs the lease and route loop: every second, and at once when a lease changes.
    pub fn start(self: &Arc<Self>) {
        let this = self.clone();
        *self.task.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(crate::supervise::spawn("pod-network", move || {
                this.clone().run()
            }));
    }

    async fn run(self: Arc<Self>) {
        let mut changes = self.replication.subscribe();
        let mut stop = self.stop.subscribe();
        let mut not_alive_since: HashMap<String, tokio::time::Instant> = HashMap::new();
        let mut applied: Option<Vec<Route>> = None;
        let mut rounds = 0u64;
        loop {
            if *stop.borrow() {
                return;
            }
            self.round(&mut not_alive_since, &mut applied).await;
            rounds += 1;
            if rounds.is_multiple_of(30) {
                // Re-apply now and then: someone may have changed the host's routes.
                applied = None;
            }
            let sleep = tokio::time::sleep(Duration::from_secs(1));
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    _ = stop.changed() => return,
                    change = changes.recv() => match change {
                        Ok(c) if c.key.group == lease_kind().group => break,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        }
    }

    async fn round(
        &self,
        not_alive_since: &mut HashMap<String, tokio::time::Instant>,
        applied: &mut Option<Vec<Route>>,
    ) {
        let info = lease_kind();
        let objects = self
            .replication
            .read(|s| s.list(info.group, info.kind, None));
        let leases = leases(&objects);
        let members = self.membership.members().await;
        let now = tokio::time::Instant::now();
        let alive: BTreeSet<&str> = members
            .iter()
            .filter(|m| m.state == MemberState::Alive)
            .map(|m| m.node_id.as_str())
            .collect();
        not_alive_since.retain(|id, _| !alive.contains(id.as_str()));
        for lease in &leases {
            if !alive.contains(lease.holder.as_str()) && lease.holder != self.node_id {
                not_alive_since.entry(lease.holder.clone()).or_insert(now);
            }
        }
        let replaceable = |holder: &str| {
            not_alive_since
                .get(holder)
                .is_some_and(|since| now.duration_since(*since) >= RECLAIM_AFTER)
        };
        let decision = self.pool.decide(&self.node_id, &leases, &replaceable);
        let release = match &decision {
            Decision::Hold { release, .. }
            | Decision::Claim { release, .. }
            | Decision::Exhausted { release, .. } => release.clone(),
        };
        for block in release {
            let key = ObjectKey::new(info, "", &lease::lease_name(block, &self.node_id));
            match self.replication.delete(&key, None).await {
                Ok(_) => {
                    info!(%block, "released a pod CIDR claim (extra, or held by a node that claimed it first)")
                }
                Err(e) => debug!(%block, error = %e, "releasing a block"),
            }
        }
        match decision {
            Decision::Hold { block, .. } => {
                if self.bridge.block() != Some(block) {
                    self.install(block).await;
                }
            }
            Decision::Claim {
                block, replacing, ..
            } => {
                if let Some(old) = self.bridge.block() {
                    warn!(lost = %old, "another node claimed this node's pod CIDR first (both claimed it apart); claiming another and renumbering pods");
                }
                if let Some(holder) = &replacing {
                    info!(%block, %holder, "taking over the block of a node gone for {RECLAIM_AFTER:?}");
                    let key = ObjectKey::new(info, "", &lease::lease_name(block, holder));
                    if let Err(e) = self.replication.delete(&key, None).await {
                        debug!(%block, error = %e, "removing the old lease");
                    }
                }
                let object = lease_object(block, &self.node_id, &self.node_name);
                match shoal_state::validate(object, "") {
                    Ok(valid) => match self.replication.write(valid, WriteMode::Create).await {
                        Ok(_) => info!(%block, "leased a pod CIDR block"),
                        Err(crate::replication::WriteError::NotDurable { .. }) => {
                            info!(%block, "leased a pod CIDR block (not yet on a quorum)")
                        }
                        Err(e) => debug!(%block, error = %e, "lease not written; trying again"),
                    },
                    Err(e) => warn!(%block, error = %e, "lease object refused"),
                }
            }
            Decision::Exhausted { blocks, .. } => {
                warn!(
                    blocks,
                    cluster = %self.pool.cluster(),
                    "every block of the cluster CIDR is held: this node's pods get no address (widen --cluster-cidr or shorten --node-cidr-size)"
                );
            }
        }
        let want = routes(&leases, &self.pool, &self.node_id, &members, &self.local);
        if applied.as_ref() != Some(&want) {
            let bridge = self.bridge.clone();
            let routes = want.clone();
            match tokio::task::spawn_blocking(move || bridge.sync_routes(&routes)).await {
                Ok(Ok(())) => *applied = Some(want),
                Ok(Err(e)) => warn!(error = %e, "routes to other nodes' pods"),
                Err(e) => warn!(error = %e, "routes task"),
            }
        }
    }

    /// Puts the bridge on `block`, keeping the addresses of pods that already have one in it.
    async fn install(&self, block: ipnet::Ipv4Net) {
        let runtime = self.runtime.clone();
        let bridge = self.bridge.clone();
        let result = tokio::task::spawn_blocking(move || {
            let existing: Vec<(String, Ipv4Addr)> = runtime
                .list()
                .into_iter()
                .filter_map(|p| Some((p.sandbox.uid, p.network?.ip)))
                .collect();
            let misfits = bridge.set_block(block, &existing)?;
            // Pods whose records do not fit are renumbered by the kubelet (outside the block)
            // or here (a duplicate within it).
            for uid in misfits {
                if let Some(network) = runtime.pod_network(&uid)
                    && block.contains(&network.ip)
                    && let Err(e) = runtime.remove_sandbox(&uid)
                {
                    warn!(pod = %uid, error = %e, "removing a pod with a duplicate address");
                }
            }
            Ok::<_, shoal_net::NetError>(())
        })
        .await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(%block, error = %e, "cannot set up the pod network; retrying"),
            Err(e) => warn!(error = %e, "pod network task"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shoal_state::{Store, StoreConfig};

    /// A node of the simulation: a real store and the block its pods are numbered from.
    struct SimNode {
        id: String,
        store: Store,
        in_use: Option<ipnet::Ipv4Net>,
    }

    fn all_entries(store: &Store) -> Vec<shoal_state::WireEntry> {
        store.entries_in_buckets(&(0..=255).collect::<Vec<u8>>())
    }

    /// Every node of `group` merges every other's entries (a fully connected side).
    fn sync(nodes: &mut [SimNode], group: &[usize], now: u64) {
        let entries: Vec<_> = group
            .iter()
            .flat_map(|&i| all_entries(&nodes[i].store))
            .collect();
        for &i in group {
            nodes[i]
                .store
                .merge_remote_at(entries.clone(), now)
                .unwrap();
        }
    }

    /// One round of the code that runs (`Pool::decide` on the stored leases, lease objects
    /// written with `WriteMode::Create`) on node `i`.
    fn lease_round(pool: &Pool, node: &mut SimNode, now: u64) {
        let info = lease_kind();
        let objects = node.store.list(info.group, info.kind, None);
        let decision = pool.decide(&node.id, &leases(&objects), &|_| false);
        let release = match &decision {
            Decision::Hold { release, .. }
            | Decision::Claim { release, .. }
            | Decision::Exhausted { release, .. } => release.clone(),
        };
        for block in release {
            let key = ObjectKey::new(info, "", &lease::lease_name(block, &node.id));
            let _ = node.store.delete_at(&key, None, now);
        }
        match decision {
            Decision::Hold { block, .. } => node.in_use = Some(block),
            Decision::Claim { block, .. } => {
                let valid = shoal_state::validate(lease_object(block, &node.id, "n"), "").unwrap();
                // AlreadyExists (a mate claimed it first) is retried next round.
                let _ = node.store.write_at(valid, WriteMode::Create, now);
            }
            Decision::Exhausted { .. } => {}
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Nodes lease blocks on the sides of a partition (any split, any order), the sides
        /// merge in any order, and each node keeps running the lease round: after a few rounds
        /// every node numbers its pods from a block no other node uses, and the stores agree on
        /// one holder per block. The pool is small, so the sides collide often.
        #[test]
        fn after_a_healed_partition_no_two_nodes_use_one_block(
            sides in proptest::collection::vec(0usize..2, 2..6),
            order in proptest::collection::vec(0usize..6, 0..12),
            blocks_log2 in 3u8..5,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let pool = Pool::new("10.88.0.0/16".parse().unwrap(), 16 + blocks_log2).unwrap();
            let mut nodes: Vec<SimNode> = sides.iter().enumerate().map(|(i, _)| SimNode {
                id: format!("{:016x}", 0x1000 + i as u64 * 7919),
                store: Store::open(StoreConfig::new(dir.path().join(format!("s{i}")), 0x1000 + i as u64)).unwrap(),
                in_use: None,
            }).collect();
            let groups: Vec<Vec<usize>> = (0..2).map(|g| (0..nodes.len()).filter(|i| sides[*i] == g).collect()).collect();
            let mut now = 1_000_000u64;
            // Partitioned: each side leases on its own, nodes taking turns in the given order.
            for _ in 0..4 {
                for &pick in order.iter().chain([0, 1, 2, 3, 4, 5].iter()) {
                    let i = pick % nodes.len();
                    now += 10;
                    lease_round(&pool, &mut nodes[i], now);
                    sync(&mut nodes, &groups[sides[i]], now);
                }
            }
            for n in &nodes { prop_assert!(n.in_use.is_some(), "every node leased while partitioned"); }
            // Healed: merges in the given order, then rounds until nothing changes.
            let all: Vec<usize> = (0..nodes.len()).collect();
            for &pick in &order {
                let i = pick % nodes.len();
                let j = (pick + 1) % nodes.len();
                sync(&mut nodes, &[i, j], now);
            }
            for _ in 0..6 {
                sync(&mut nodes, &all, now);
                for node in nodes.iter_mut() {
                    now += 10;
                    lease_round(&pool, node, now);
                }
            }
            sync(&mut nodes, &all, now);
            for node in nodes.iter_mut() { lease_round(&pool, node, now); }
            let used: Vec<_> = nodes.iter().map(|n| n.in_use.unwrap()).collect();
            let distinct: std::collections::BTreeSet<_> = used.iter().collect();
            prop_assert_eq!(distinct.len(), used.len(), "blocks in use: {:?}", used);
            // Each node's block is the one the (identical) stores say it holds.
            let info = lease_kind();
            let stored = leases(&nodes[0].store.list(info.group, info.kind, None));
            let winners = lease::winners(&stored);
            for n in &nodes {
                let block = n.in_use.unwrap();
                prop_assert_eq!(winners.get(&block).map(|w| w.holder.as_str()), Some(n.id.as_str()));
                prop_assert_eq!(n.store.root_digest(), nodes[0].store.root_digest());
            }
        }
    }

    #[test]
    fn lease_objects_round_trip_and_bad_ones_are_skipped() {
        let block: ipnet::Ipv4Net = "10.88.3.0/24".parse().unwrap();
        let mut good = lease_object(block, "ab12", "n1");
        good["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut wrong_cidr = lease_object(block, "ab12", "n1");
        wrong_cidr["spec"]["cidr"] = json!("10.88.4.0/24");
        let mut other_holder = lease_object(block, "ab12", "n1");
        other_holder["spec"]["nodeID"] = json!("cd34");
        let mut bad_name = good.clone();
        bad_name["metadata"]["name"] = json!("../../etc");
        assert_eq!(
            leases(&[good, wrong_cidr, other_holder, bad_name]),
            vec![Lease {
                block,
                holder: "ab12".into(),
                created: "2026-01-01T00:00:00Z".into()
            }]
        );
    }
}

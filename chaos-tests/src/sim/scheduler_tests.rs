//! Simulation tests of the auction: deterministic, virtual time, no sockets.

use std::collections::HashSet;
use std::time::Duration;

use proptest::prelude::*;

use super::scheduler::{Sim, SimConfig};
use shoal_core::placement::auction::{Binding, auctioneer};
use shoal_core::placement::workload;
use shoal_model::placement::{PodRequest, Resources};

fn settle(sim: &mut Sim, want: usize) {
    sim.run(Duration::from_secs(60), |s| {
        s.bound_count() + s.unschedulable.len() >= want
    });
}

#[test]
fn fifty_nodes_place_every_pod_once_without_overcommit() {
    let nodes = workload::nodes(1, 50);
    let pods = workload::pods(2, 1500);
    let mut sim = Sim::new(SimConfig::default(), nodes);
    sim.add_pods(pods.clone());
    settle(&mut sim, pods.len());
    sim.check_invariants().unwrap();
    assert_eq!(sim.bound_count() + sim.unschedulable.len(), pods.len());
    // The workload asks for more than the 50 nodes have: compare with a central greedy scheduler.
    let greedy = super::scheduler::central_greedy(&workload::nodes(1, 50), &pods);
    let greedy_placed: u64 = greedy.nodes().map(|n| greedy.allocated(n.id).pods).sum();
    assert!(
        sim.bound_count() as f64 >= 0.95 * greedy_placed as f64,
        "auction placed {}, central greedy {greedy_placed}",
        sim.bound_count()
    );
    // Every pod bound once, on a node whose labels satisfy it.
    for pod in &pods {
        if let Some(b) = sim.bindings.get(&pod.uid) {
            let node = sim.cluster.node(b.node).unwrap();
            assert!(
                pod.node_selector
                    .iter()
                    .all(|(k, v)| node.labels.get(k) == Some(v))
            );
        }
    }
}

/// Issue #37's benchmark workload, small: 30% of the pods carry a required constraint over
/// their own group (zone spread in groups of 12, hostname anti-affinity in groups of 10).
/// Every pod is placed, no binding breaks a constraint given those before it (the checker),
/// and the final placement satisfies every group, read from the bindings themselves.
#[test]
fn the_constrained_workload_is_placed_exactly() {
    let nodes = workload::nodes(11, 30);
    let pods = workload::pods_of(workload::Profile::Constrained, 12, 1000);
    let mut sim = Sim::new(SimConfig::default(), nodes);
    sim.add_pods(pods.clone());
    settle(&mut sim, pods.len());
    sim.check_invariants().unwrap();
    assert_eq!(sim.bound_count(), pods.len(), "{:?}", sim.unschedulable);
    assert_eq!(sim.stats.topology_violations, 0);
    let mut groups: std::collections::BTreeMap<&str, Vec<(u64, String)>> = Default::default();
    for pod in &pods {
        if let Some(group) = pod.labels.get("group") {
            let node = sim.bindings[&pod.uid].node;
            let zone =
                sim.cluster.node(node).unwrap().labels["topology.kubernetes.io/zone"].clone();
            groups.entry(group).or_default().push((node, zone));
        }
    }
    assert!(groups.len() > 20, "{} groups", groups.len());
    for (group, placed) in groups {
        if group.starts_with("apart-") {
            let distinct: HashSet<u64> = placed.iter().map(|(n, _)| *n).collect();
            assert_eq!(distinct.len(), placed.len(), "{group}: {placed:?}");
        } else {
            let mut per_zone = std::collections::BTreeMap::<&str, usize>::new();
            for zone in ["a", "b", "c"] {
                per_zone.insert(zone, 0);
            }
            for (_, zone) in &placed {
                *per_zone.get_mut(zone.as_str()).unwrap() += 1;
            }
            let (min, max) = (per_zone.values().min(), per_zone.values().max());
            assert!(max.unwrap() - min.unwrap() <= 1, "{group}: {per_zone:?}");
        }
    }
}

#[test]
fn the_same_input_replays_the_same_placements() {
    let run = || {
        let mut sim = Sim::new(SimConfig::default(), workload::nodes(3, 30));
        sim.add_pods(workload::pods(4, 600));
        settle(&mut sim, 600);
        let mut b: Vec<(String, u64)> = sim
            .bindings
            .iter()
            .map(|(p, b)| (p.clone(), b.node))
            .collect();
        b.sort();
        b
    };
    assert_eq!(run(), run());
}

#[test]
fn pods_of_a_dead_node_are_auctioned_again_after_the_eviction_delay() {
    let config = SimConfig {
        eviction_delay: Duration::from_secs(2),
        ..SimConfig::default()
    };
    let mut sim = Sim::new(config, workload::nodes(5, 50));
    let pods = workload::pods(6, 800);
    sim.add_pods(pods.clone());
    settle(&mut sim, pods.len());
    let victims: Vec<u64> = (1..=5).collect();
    let orphans: HashSet<String> = sim
        .bindings
        .iter()
        .filter(|(_, b)| victims.contains(&b.node))
        .map(|(p, _)| p.clone())
        .collect();
    assert!(!orphans.is_empty());
    for v in &victims {
        sim.kill(*v);
    }
    let killed_at = sim.now;
    sim.run(Duration::from_secs(1), |_| false);
    assert!(
        orphans
            .iter()
            .all(|p| victims.contains(&sim.bindings[p].node)),
        "nothing moves before the eviction delay"
    );
    sim.run(Duration::from_secs(30), |s| {
        orphans.iter().all(|p| {
            s.bindings
                .get(p)
                .is_some_and(|b| !victims.contains(&b.node))
                || s.unschedulable.contains_key(p)
        })
    });
    assert!(
        sim.now < killed_at + Duration::from_secs(3),
        "re-auctioned within the delay + 1 s: {:?}",
        sim.now - killed_at
    );
    for p in &orphans {
        if let Some(b) = sim.bindings.get(p) {
            assert!(!victims.contains(&b.node));
            assert!(b.epoch >= 2, "a re-auction bumps the epoch");
        }
    }
    sim.check_invariants().unwrap();
}

#[test]
fn a_pod_that_fits_nowhere_gets_kube_scheduler_style_reasons() {
    let nodes = workload::nodes(7, 10);
    let mut sim = Sim::new(SimConfig::default(), nodes);
    let mut huge = workload::pods(8, 1).remove(0);
    huge.uid = "huge".into();
    huge.requests = Resources::new(100_000, 1, 1);
    huge.node_selector.clear();
    let mut picky = workload::pods(9, 1).remove(0);
    picky.uid = "picky".into();
    picky.node_selector = [("disk".to_owned(), "nvme".to_owned())].into();
    sim.add_pods([huge, picky]);
    settle(&mut sim, 2);
    assert!(
        sim.unschedulable["huge"].starts_with("0/10 nodes are available: "),
        "{}",
        sim.unschedulable["huge"]
    );
    assert!(
        sim.unschedulable["huge"].contains("Insufficient cpu"),
        "{}",
        sim.unschedulable["huge"]
    );
    assert_eq!(
        sim.unschedulable["picky"],
        "0/10 nodes are available: 10 node(s) didn't match Pod's node affinity/selector."
    );
}

/// Pods that fit nowhere are auctioned again as soon as a node that fits joins, not after
/// the retry delay (5 s), as kube-scheduler requeues its unschedulable pods on a node's
/// addition. The pods keep their auctioneers (the joiner is auctioneer of none of them), so
/// what moves them is the changed view.
#[test]
fn unschedulable_pods_are_auctioned_again_when_a_node_that_fits_joins() {
    let nodes = untainted(13, 10);
    let mut sim = Sim::new(SimConfig::default(), nodes.clone());
    let picky: Vec<PodRequest> = (0..5)
        .map(|i| {
            let mut p = workload::pods(14 + i, 1).remove(0);
            p.uid = format!("picky-{i}");
            p.node_selector = [("disk".to_owned(), "nvme".to_owned())].into();
            p
        })
        .collect();
    sim.add_pods(picky.clone());
    settle(&mut sim, 5);
    assert_eq!(sim.unschedulable.len(), 5);
    let mut joiner = nodes[0].clone();
    joiner.id = 1_000;
    joiner.name = "node-new".into();
    joiner.labels.insert("disk".into(), "nvme".into());
    joiner
        .labels
        .insert("kubernetes.io/hostname".into(), "node-new".into());
    let live = || sim_nodes(&nodes, 1_000);
    assert!(
        picky
            .iter()
            .all(|p| auctioneer(&p.uid, live()) != Some(1_000)),
        "pick seeds where the joiner is auctioneer of none"
    );
    sim.join(joiner);
    let joined = sim.now;
    sim.run(Duration::from_secs(30), |s| s.bound_count() == 5);
    assert_eq!(sim.bound_count(), 5, "{:?}", sim.unschedulable);
    assert!(
        sim.now - joined < Duration::from_secs(1),
        "placed {:?} after the join",
        sim.now - joined
    );
    assert!(sim.bindings.values().all(|b| b.node == 1_000));
}

fn sim_nodes(nodes: &[shoal_model::placement::NodeView], extra: u64) -> Vec<u64> {
    nodes.iter().map(|n| n.id).chain([extra]).collect()
}

/// Issue #37's case: four replicas with required anti-affinity on the hostname, three nodes,
/// every replica auctioned at once (by different auctioneers, and some by one): no two share a
/// node, and the fourth is left unschedulable for anti-affinity, as kube-scheduler leaves it.
#[test]
fn replicas_that_must_not_share_a_node_never_do() {
    let nodes = untainted(3, 3);
    let replica = |i: usize| {
        PodRequest::from_pod(&serde_json::json!({
            "metadata": {"name": format!("web-{i}"), "uid": format!("web-{i}"), "namespace": "default", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "100m"}}}],
                     "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                         {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}}}
        }))
        .unwrap()
    };
    for seed in 0..20 {
        let mut sim = Sim::new(SimConfig::default(), nodes.clone());
        sim.add_pods((0..4).map(|i| replica(seed * 10 + i)));
        settle(&mut sim, 4);
        sim.run(Duration::from_secs(60), |s| s.bound_count() >= 3);
        let used: Vec<u64> = sim.bindings.values().map(|b| b.node).collect();
        let distinct: HashSet<u64> = used.iter().copied().collect();
        assert_eq!(
            used.len(),
            distinct.len(),
            "seed {seed}: two replicas on one node: {used:?}"
        );
        assert_eq!(
            used.len(),
            3,
            "seed {seed}: {used:?} {:?}",
            sim.unschedulable
        );
        // Within a few auction rounds: the node's admission hands a clash back at once.
        assert!(
            sim.now < Duration::from_secs(1),
            "seed {seed}: {:?}",
            sim.now
        );
        let reason = sim
            .unschedulable
            .values()
            .next()
            .cloned()
            .unwrap_or_default();
        assert!(
            reason.contains("didn't match pod anti-affinity rules"),
            "seed {seed}: {reason:?}"
        );
    }
}

/// Issue #37: constraints over zones, which no node can check alone. Replicas that must not
/// share a zone and replicas spread over zones, auctioned at once on 30 nodes in 3 zones: with
/// their auctions serialized at one auctioneer per constraint (the default) no binding breaks
/// a constraint given those before it (the simulator's checker, `topology_violations`), one
/// replica per zone runs and the rest say why. The same input auctioned by uid, as before,
/// breaks them: the checker can fail.
#[test]
fn zone_constraints_hold_under_concurrent_auctions() {
    let nodes = untainted(5, 30);
    let apart = |i| constrained("db", i, anti("db", "topology.kubernetes.io/zone"));
    let spread = |i| constrained("web", i, zone_spread("web", 1));
    let run = |serialize: bool| {
        let mut violations = 0;
        for seed in 0..10 {
            let mut config = SimConfig::default();
            config.auction.serialize_wide = serialize;
            let mut sim = Sim::new(config, nodes.clone());
            sim.add_pods((0..6).map(|i| apart(seed * 10 + i)));
            sim.add_pods((0..30).map(|i| spread(seed * 100 + i)));
            sim.run(Duration::from_secs(30), |s| {
                s.bound_count() + s.unschedulable.len() >= 36
            });
            violations += sim.stats.topology_violations;
            if serialize {
                let db_zones: Vec<&String> = sim
                    .bindings
                    .iter()
                    .filter(|(uid, _)| uid.starts_with("db-"))
                    .filter_map(|(_, b)| {
                        sim.cluster
                            .node(b.node)?
                            .labels
                            .get("topology.kubernetes.io/zone")
                    })
                    .collect();
                let distinct: HashSet<&&String> = db_zones.iter().collect();
                assert_eq!(
                    (db_zones.len(), distinct.len()),
                    (3, 3),
                    "seed {seed}: {db_zones:?}"
                );
                let reason = sim
                    .unschedulable
                    .values()
                    .find(|r| r.contains("anti-affinity"));
                assert!(reason.is_some(), "seed {seed}: {:?}", sim.unschedulable);
            }
        }
        violations
    };
    assert_eq!(run(true), 0);
    let unserialized = run(false);
    assert!(
        unserialized > 0,
        "the checker saw no violation without serialization"
    );
}

#[test]
fn node_name_binds_directly() {
    let nodes = workload::nodes(10, 5);
    let target = nodes[3].clone();
    let mut sim = Sim::new(SimConfig::default(), nodes);
    let mut pod: PodRequest = workload::pods(11, 1).remove(0);
    pod.node_name = Some(target.name.clone());
    pod.node_selector.clear();
    let uid = pod.uid.clone();
    sim.add_pods([pod]);
    settle(&mut sim, 1);
    assert_eq!(sim.bindings[&uid].node, target.id);
    assert_eq!(
        sim.stats.auction_messages, 0,
        "no auction for a pod with spec.nodeName"
    );
}

#[test]
fn auctioneers_move_only_for_pods_of_a_removed_node() {
    let live: Vec<u64> = (1..=20).collect();
    let before: Vec<u64> = (0..500)
        .map(|i| auctioneer(&format!("p{i}"), live.iter().copied()).unwrap())
        .collect();
    let after: Vec<u64> = (0..500)
        .map(|i| auctioneer(&format!("p{i}"), live.iter().copied().filter(|n| *n != 7)).unwrap())
        .collect();
    for (b, a) in before.iter().zip(&after) {
        if *b != 7 {
            assert_eq!(a, b, "rendezvous hashing keeps other pods' auctioneers");
        }
    }
}

proptest! {
    /// Bindings of one pod written in any order resolve to the same winner everywhere.
    #[test]
    fn every_binding_conflict_resolves_to_one_winner(
        writes in proptest::collection::vec((0u64..4, 1u64..4, 0u64..100, 0u64..5), 1..8),
        order in any::<u64>(),
    ) {
        let bindings: Vec<Binding> = writes.iter().map(|(node, epoch, t, writer)| Binding { pod: "p".into(), node: *node, epoch: *epoch, stamp: (*t, *writer) }).collect();
        let merge = |list: &[Binding]| list.iter().fold(None::<Binding>, |acc, b| match acc {
            Some(a) if !b.wins_over(&a) => Some(a),
            _ => Some(b.clone()),
        });
        let mut shuffled = bindings.clone();
        let n = shuffled.len();
        for i in 0..n {
            shuffled.swap(i, ((order >> (i % 32)) as usize + i) % n);
        }
        prop_assert_eq!(merge(&bindings), merge(&shuffled));
    }
}

/// A pod of app `app` with the scheduling fields `fields` and a 100m request.
fn constrained(app: &str, i: usize, fields: serde_json::Value) -> PodRequest {
    let mut spec = serde_json::json!({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "100m"}}}]});
    for (k, v) in fields.as_object().into_iter().flatten() {
        spec[k] = v.clone();
    }
    PodRequest::from_pod(&serde_json::json!({
        "metadata": {"name": format!("{app}-{i}"), "uid": format!("{app}-{i}"), "namespace": "default", "labels": {"app": app}},
        "spec": spec
    }))
    .unwrap()
}

/// `workload::nodes(seed, n)` without taints (zones a, b, c).
fn untainted(seed: u64, n: usize) -> Vec<shoal_model::placement::NodeView> {
    workload::nodes(seed, n)
        .into_iter()
        .map(|mut node| {
            node.taints.clear();
            node
        })
        .collect()
}

/// A `DoNotSchedule` spread over zones of the pods labelled `app`.
fn zone_spread(app: &str, max_skew: u64) -> serde_json::Value {
    serde_json::json!({"topologySpreadConstraints": [{"maxSkew": max_skew,
        "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": app}}}]})
}

fn anti(app: &str, key: &str) -> serde_json::Value {
    serde_json::json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}]}}})
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Issue #37's property: whatever the cluster size, message latency and the order and
    /// timing in which pods arrive, no binding ever breaks a required constraint given those
    /// before it (the simulator's checker), and every pod that can be placed is: one `db` per
    /// zone (zone anti-affinity), one `cache` per node (hostname anti-affinity), and every
    /// `web` (zone spread, always satisfiable here).
    #[test]
    fn hard_constraints_hold_for_any_arrival_order_and_latency(
        seed in 0u64..1000,
        node_count in 3usize..24,
        dbs in 1usize..7,
        caches in 0usize..30,
        webs in 0usize..30,
        skew in 1u64..3,
        latency_ms in 1u64..20,
        waves in proptest::collection::vec(0u64..300, 1..4),
    ) {
        let nodes = untainted(seed, node_count);
        let config = SimConfig {
            latency: Duration::from_millis(latency_ms),
            ..SimConfig::default()
        };
        let mut sim = Sim::new(config, nodes);
        let spread = zone_spread("web", skew);
        let mut pods: Vec<PodRequest> = (0..dbs)
            .map(|i| constrained("db", i, anti("db", "topology.kubernetes.io/zone")))
            .chain((0..caches).map(|i| constrained("cache", i, anti("cache", "kubernetes.io/hostname"))))
            .chain((0..webs).map(|i| constrained("web", i, spread.clone())))
            .collect();
        // A seeded shuffle, then the pods in waves with pauses between them.
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for i in (1..pods.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            pods.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let total = pods.len();
        let per_wave = total.div_ceil(waves.len()).max(1);
        for (wave, pause) in pods.chunks(per_wave).zip(&waves) {
            sim.add_pods(wave.to_vec());
            let end = sim.now + Duration::from_millis(*pause);
            sim.run(Duration::from_millis(*pause), |s| s.now >= end);
        }
        let zones = 3.min(node_count);
        let want = dbs.min(zones) + caches.min(node_count) + webs;
        sim.run(Duration::from_secs(60), |s| s.bound_count() >= want);
        prop_assert_eq!(sim.stats.topology_violations, 0);
        prop_assert!(sim.check_invariants().is_ok());
        let placed = |prefix: &str| sim.bindings.keys().filter(|u| u.starts_with(prefix)).count();
        prop_assert_eq!(placed("db-"), dbs.min(zones));
        prop_assert_eq!(placed("cache-"), caches.min(node_count));
        prop_assert_eq!(placed("web-"), webs);
    }
}

#[test]
fn a_high_priority_pod_preempts_the_least_important_pods() {
    use serde_json::json;
    let node = |id: u64| shoal_model::placement::NodeView {
        id,
        name: format!("n{id}"),
        labels: [("kubernetes.io/hostname".to_owned(), format!("n{id}"))].into(),
        taints: vec![],
        allocatable: Resources::new(2000, 4 << 30, 110),
        volume_bytes: None,
    };
    let pinned = |name: &str, cpu: &str, priority: i64, node: Option<&str>| {
        let selector = node.map_or(json!({}), |n| json!({"kubernetes.io/hostname": n}));
        PodRequest::from_pod(&json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"priority": priority, "nodeSelector": selector, "containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"cpu": cpu}}}]},
        }))
        .unwrap()
    };
    let pod = |name: &str, cpu: &str, priority: i64| pinned(name, cpu, priority, None);
    let mut sim = Sim::new(SimConfig::default(), vec![node(1), node(2)]);
    // Both nodes full: n1 with priority-10 pods, n2 with priority-0 pods (one of them small).
    sim.add_pods([
        pinned("mid-a", "1000m", 10, Some("n1")),
        pinned("mid-b", "1000m", 10, Some("n1")),
        pinned("low-a", "1500m", 0, Some("n2")),
        pinned("low-b", "500m", 0, Some("n2")),
    ]);
    settle(&mut sim, 4);
    assert_eq!(sim.bound_count(), 4, "{:?}", sim.unschedulable);
    let node_of = |sim: &Sim, p: &str| sim.bindings.get(&format!("uid-{p}")).map(|b| b.node);
    let low_node = node_of(&sim, "low-a").unwrap();
    assert_eq!(low_node, 2);

    // 1.5 cores at priority 100 fit nowhere: the node of the priority-0 pods makes room, and
    // only as much as needed (low-a; low-b is spared).
    sim.add_pods([pod("urgent", "1500m", 100)]);
    sim.run(Duration::from_secs(30), |s| {
        s.bindings.contains_key("uid-urgent")
    });
    sim.check_invariants().unwrap();
    assert_eq!(node_of(&sim, "urgent"), Some(low_node));
    assert_eq!(sim.stats.preempted, 1);
    assert_eq!(node_of(&sim, "low-a"), None, "the victim is unbound");
    assert_eq!(node_of(&sim, "low-b"), Some(low_node), "spared: not needed");
    assert!(node_of(&sim, "mid-a").is_some() && node_of(&sim, "mid-b").is_some());

    // The victim is auctioned again: nothing fits it and nothing it may preempt (equal or
    // higher priority everywhere) — it says so instead of evicting anyone.
    sim.run(Duration::from_secs(30), |s| {
        s.unschedulable.contains_key("uid-low-a")
    });
    assert!(sim.unschedulable["uid-low-a"].starts_with("0/2 nodes are available"));
    assert_eq!(sim.stats.preempted, 1);

    // A pod of no higher priority than anything placed preempts nothing.
    sim.add_pods([pod("peer", "1500m", 0)]);
    sim.run(Duration::from_secs(30), |s| {
        s.unschedulable.contains_key("uid-peer")
    });
    assert_eq!(sim.stats.preempted, 1);
}

#[test]
fn a_partition_heals_to_one_binding_per_pod_and_fenced_pods_never_run_twice() {
    use shoal_core::placement::partition::Policy;
    let nodes = workload::nodes(7, 50);
    let ids: Vec<u64> = nodes.iter().map(|n| n.id).collect();
    let pods = workload::pods(8, 600);
    let mut sim = Sim::new(SimConfig::default(), nodes);
    let fenced: HashSet<String> = pods
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 == 0)
        .map(|(_, p)| p.uid.clone())
        .collect();
    for uid in &fenced {
        sim.set_policy(uid, Policy::Fenced);
    }
    sim.add_pods(pods.clone());
    settle(&mut sim, pods.len());
    let placed_before = sim.bound_count();

    // Split 30 | 20: each side is its own world from now on, on one shared clock.
    let (major, minor): (Vec<u64>, Vec<u64>) = (ids[..30].to_vec(), ids[30..].to_vec());
    let mut a = sim.clone();
    a.cut(&minor);
    let mut b = sim;
    b.cut(&major);
    let mut sides = vec![a, b];
    // Fenced pods never run on two nodes at any instant; available ones may (that is the
    // policy), and are deduplicated on heal.
    let check = |sides: &[Sim]| {
        let sides: Vec<&Sim> = sides.iter().collect();
        fenced_run_once(&sides, &fenced).unwrap();
    };
    let mut moved_fenced = false;
    for _ in 0..1500 {
        for side in sides.iter_mut() {
            let end = side.now + Duration::from_millis(10);
            side.run(Duration::from_millis(10), |s| s.now >= end);
        }
        check(&sides);
        // The majority eventually replaces the minority's fenced pods; the minority never
        // replaces the majority's.
        moved_fenced |= sides[0]
            .bindings
            .iter()
            .any(|(uid, b)| fenced.contains(uid) && b.epoch > 1 && major.contains(&b.node));
        assert!(
            !sides[1]
                .bindings
                .iter()
                .any(|(uid, b)| fenced.contains(uid) && b.epoch > 1)
        );
    }
    assert!(moved_fenced, "the majority replaced no fenced pod");
    assert!(
        sides[1].fenced_stopped(),
        "the minority stopped its fenced pods"
    );

    // Heal: one binding per pod, each pod placed exactly once, nothing overcommitted.
    let mut healed = Sim::heal(sides);
    healed.run(Duration::from_secs(30), |s| {
        s.bound_count() + s.unschedulable.len() >= pods.len()
    });
    healed.check_invariants().unwrap();
    let placed: u64 = healed
        .cluster
        .nodes()
        .map(|n| healed.cluster.allocated(n.id).pods)
        .sum();
    assert_eq!(
        placed as usize,
        healed.bindings.len(),
        "a pod is placed twice"
    );
    assert!(
        healed.bound_count() >= placed_before,
        "{} < {placed_before}",
        healed.bound_count()
    );
    check(&[healed]);
}

/// Every fenced pod runs on at most one node of `sides` at this instant.
fn fenced_run_once(sides: &[&Sim], fenced: &HashSet<String>) -> Result<(), String> {
    let mut runs: std::collections::HashMap<String, Vec<u64>> = Default::default();
    for side in sides {
        for (uid, node) in side.running() {
            runs.entry(uid).or_default().push(node);
        }
    }
    for uid in fenced {
        if let Some(nodes) = runs.get(uid).filter(|n| n.len() > 1) {
            return Err(format!("fenced pod {uid} runs on {nodes:?}"));
        }
    }
    Ok(())
}

#[test]
fn a_frozen_node_s_fenced_pods_run_elsewhere_only_after_their_shims_killed_them() {
    use shoal_core::placement::partition::Policy;
    let nodes = workload::nodes(11, 7);
    let pods = workload::pods(12, 60);
    let config = SimConfig::default();
    let term = config.fence.lease_term;
    let mut sim = Sim::new(config, nodes);
    let fenced: HashSet<String> = pods.iter().map(|p| p.uid.clone()).collect();
    for uid in &fenced {
        sim.set_policy(uid, Policy::Fenced);
    }
    sim.add_pods(pods.clone());
    settle(&mut sim, pods.len());
    // Grantors grant nothing for one term after they start; then every bound pod runs.
    let end = sim.now + term + Duration::from_secs(1);
    sim.run(term + Duration::from_secs(1), |s| s.now >= end);
    let running: HashSet<String> = sim.running().into_iter().map(|(uid, _)| uid).collect();
    assert_eq!(
        running.len(),
        sim.bound_count(),
        "a bound fenced pod holds no lease"
    );

    let victim = sim.bindings.values().next().expect("a binding").node;
    let victims: HashSet<String> = sim
        .bindings
        .iter()
        .filter(|(_, b)| b.node == victim)
        .map(|(uid, _)| uid.clone())
        .collect();
    sim.freeze(victim);
    let mut moved_and_running = false;
    for _ in 0..2000 {
        let end = sim.now + Duration::from_millis(10);
        sim.run(Duration::from_millis(10), |s| s.now >= end);
        fenced_run_once(&[&sim], &fenced).unwrap();
        moved_and_running |= sim
            .running()
            .iter()
            .any(|(uid, node)| victims.contains(uid) && *node != victim);
    }
    assert!(
        moved_and_running,
        "no pod of the frozen node runs elsewhere"
    );
}

#[test]
fn the_fenced_run_check_names_a_pod_that_runs_twice() {
    let nodes = workload::nodes(13, 4);
    let pods = workload::pods(14, 8);
    let mut sim = Sim::new(SimConfig::default(), nodes);
    sim.add_pods(pods.clone());
    settle(&mut sim, pods.len());
    // Available pods on both sides of a split may run twice; called fenced, the check fails.
    let fenced: HashSet<String> = pods.iter().map(|p| p.uid.clone()).collect();
    let ids: Vec<u64> = sim.cluster.nodes().map(|n| n.id).collect();
    let mut a = sim.clone();
    a.cut(&ids[2..]);
    let mut b = sim;
    b.cut(&ids[..2]);
    for side in [&mut a, &mut b] {
        let end = side.now + Duration::from_secs(30);
        side.run(Duration::from_secs(30), |s| s.now >= end);
    }
    let error = fenced_run_once(&[&a, &b], &fenced).unwrap_err();
    assert!(error.contains("runs on"), "{error}");
}

#[test]
fn a_limit_without_a_request_requests_the_limit() {
    use serde_json::json;
    let pod = |resources: serde_json::Value| {
        PodRequest::from_pod(&json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}]},
        }))
        .unwrap()
        .requests
    };
    // What the kubelet sizes the cgroup by (cpu.shares from 1 cpu), the auction counts.
    assert_eq!(
        pod(json!({"limits": {"cpu": "1", "memory": "64Mi"}})),
        Resources::new(1000, 64 << 20, 1)
    );
    assert_eq!(
        pod(json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "1", "memory": "64Mi"}})),
        Resources::new(250, 64 << 20, 1)
    );
    assert_eq!(pod(json!({})), Resources::new(0, 0, 1));
}

//! Synthetic clusters and workloads for the simulation tests and benchmark: seeded, so a run
//! replays exactly.

use std::collections::BTreeMap;

use shoal_model::placement::{
    AntiAffinity, NodeView, Operator, PodRequest, Requirement, Resources, Spread, Taint,
    TaintEffect, Toleration,
};

/// splitmix64: a small, well-mixed, seedable generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// `n` nodes: 16–64 cores, 4 GiB per core, 200 pods, zones a/b/c, half with `disk=ssd`, 5%
/// tainted `dedicated=batch:NoSchedule`.
pub fn nodes(seed: u64, n: usize) -> Vec<NodeView> {
    let mut rng = Rng::new(seed);
    (0..n as u64)
        .map(|i| {
            let cores = [16, 32, 48, 64][rng.below(4) as usize];
            let mut labels = BTreeMap::new();
            labels.insert("kubernetes.io/hostname".to_owned(), format!("node-{i}"));
            labels.insert(
                "topology.kubernetes.io/zone".to_owned(),
                ["a", "b", "c"][(i % 3) as usize].to_owned(),
            );
            labels.insert(
                "disk".to_owned(),
                if rng.below(2) == 0 { "ssd" } else { "hdd" }.to_owned(),
            );
            let taints = if rng.below(20) == 0 {
                vec![Taint {
                    key: "dedicated".into(),
                    value: "batch".into(),
                    effect: TaintEffect::NoSchedule,
                }]
            } else {
                vec![]
            };
            NodeView {
                id: i + 1,
                name: format!("node-{i}"),
                labels,
                taints,
                allocatable: Resources::new(cores * 1000, cores << 32, 200),
                volume_bytes: None,
            }
        })
        .collect()
}

/// Which constraints a synthetic workload's pods carry (the sizes and apps are the same in
/// every profile, drawn from the same seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The benchmark's historical mix: 20% require `disk=ssd`, 10% spread across zones
    /// (maxSkew 1) with a selector matching their whole app (so every pod of the app moves
    /// the spread's counts), 5% tolerate the batch taint.
    Mixed,
    /// No constraint at all: the baseline of what constraints cost.
    None,
    /// 30% of pods carry a required topology constraint over their own group, as replicas of
    /// a Deployment do: 15% in groups of 12 spread across zones (maxSkew 1, `DoNotSchedule`),
    /// 15% in groups of 10 with required anti-affinity on `kubernetes.io/hostname`.
    Constrained,
}

/// `n` pods of 40 apps: 50m–500m CPU and 128Mi–2Gi each (100,000 of them fill ~55% of 1,000
/// nodes), constrained as [`Profile::Mixed`] says.
pub fn pods(seed: u64, n: usize) -> Vec<PodRequest> {
    pods_of(Profile::Mixed, seed, n)
}

/// `n` pods of 40 apps, constrained as `profile` says.
pub fn pods_of(profile: Profile, seed: u64, n: usize) -> Vec<PodRequest> {
    let mut rng = Rng::new(seed ^ 0x5eed);
    let (mut spread_pods, mut apart_pods) = (0usize, 0usize);
    (0..n)
        .map(|i| {
            let app = format!("app-{}", rng.below(40));
            let cpu = [50, 100, 200, 250, 500][rng.below(5) as usize];
            let mem = [128u64, 256, 512, 1024, 2048][rng.below(5) as usize] << 20;
            let kind = rng.below(100);
            let mut labels = BTreeMap::from([("app".to_owned(), app.clone())]);
            if profile != Profile::Mixed {
                let (spread, anti_affinity) = match (profile, kind) {
                    (Profile::Constrained, 0..15) => {
                        let group = format!("spread-{}", spread_pods / 12);
                        spread_pods += 1;
                        let spread = zone_spread(own_group(&group));
                        labels.insert("group".to_owned(), group);
                        (vec![spread], vec![])
                    }
                    (Profile::Constrained, 15..30) => {
                        let group = format!("apart-{}", apart_pods / 10);
                        apart_pods += 1;
                        let term = AntiAffinity {
                            topology_key: "kubernetes.io/hostname".into(),
                            selector: own_group(&group),
                            namespaces: Default::default(),
                        };
                        labels.insert("group".to_owned(), group);
                        (vec![], vec![term])
                    }
                    _ => (vec![], vec![]),
                };
                return PodRequest {
                    labels,
                    spread,
                    anti_affinity,
                    ..plain(i, cpu, mem)
                };
            }
            let mut node_selector = BTreeMap::new();
            if kind < 20 {
                node_selector.insert("disk".to_owned(), "ssd".to_owned());
            }
            let spread = if (20..30).contains(&kind) {
                vec![zone_spread(vec![Requirement {
                    key: "app".into(),
                    op: Operator::In,
                    values: vec![app.clone()],
                }])]
            } else {
                vec![]
            };
            let tolerations = if (30..35).contains(&kind) {
                vec![Toleration {
                    key: Some("dedicated".into()),
                    exists: true,
                    value: String::new(),
                    effect: None,
                }]
            } else {
                vec![]
            };
            PodRequest {
                labels,
                node_selector,
                tolerations,
                spread,
                ..plain(i, cpu, mem)
            }
        })
        .collect()
}

/// Pod `i` asking for `cpu` millicores and `mem` bytes, with no constraint.
fn plain(i: usize, cpu: u64, mem: u64) -> PodRequest {
    PodRequest {
        uid: format!("pod-{i:06}"),
        namespace: "default".into(),
        name: format!("pod-{i}"),
        labels: BTreeMap::new(),
        requests: Resources::new(cpu, mem, 1),
        node_selector: BTreeMap::new(),
        required_terms: vec![],
        preferred_terms: vec![],
        tolerations: vec![],
        priority: 0,
        anti_affinity: vec![],
        affinity: vec![],
        spread: vec![],
        preferred_pod_terms: vec![],
        node_name: None,
        host_ports: vec![],
        volumes: Default::default(),
    }
}

/// The selector of the pods labelled `group=<group>`.
fn own_group(group: &str) -> Vec<Requirement> {
    vec![Requirement {
        key: "group".into(),
        op: Operator::In,
        values: vec![group.to_owned()],
    }]
}

/// A required zone spread (maxSkew 1) over the pods `selector` selects.
fn zone_spread(selector: Vec<Requirement>) -> Spread {
    Spread {
        topology_key: "topology.kubernetes.io/zone".into(),
        max_skew: 1,
        hard: true,
        selector,
        min_domains: None,
        honor_node_affinity: true,
        honor_node_taints: false,
    }
}

//! Named fault scenarios and the seeded generator that turns one into a schedule. Pure: the same
//! (scenario, nodes, duration, seed) always gives the same schedule, so a failing run replays
//! from the seed it printed.

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

/// One fault, on lab host indices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    /// Groups that cannot reach each other at all.
    Partition { groups: Vec<Vec<usize>> },
    /// Packets from `from` to `to` are dropped; the other direction flows.
    OneWay { from: Vec<usize>, to: Vec<usize> },
    /// `middle` reaches everyone; `left` and `right` do not reach each other.
    Bridge {
        middle: usize,
        left: Vec<usize>,
        right: Vec<usize>,
    },
    /// A fraction of the packets `node` receives is dropped.
    Loss { node: usize, percent: u8 },
    /// `kill -9`; started again (same data dir) when the fault ends.
    Kill { node: usize },
    /// SIGSTOP: silent, sockets open; SIGCONT when the fault ends.
    Pause { node: usize },
    /// The node's kubelet thread stopped (ptrace: the rest of its agent runs on) and the node
    /// cut off from every other: the majority replaces its fenced pods, which only their shims
    /// can stop. Both undone when the fault ends.
    KubeletStuck { node: usize },
    /// SIGTERM and a clean start at once.
    Restart { node: usize },
    /// `kill -9`, the data dir wiped, started again as a new node when the fault ends.
    Wipe { node: usize },
    /// The node's data dir (its own small tmpfs) filled until writes fail with ENOSPC; the
    /// space is freed when the fault ends. The agent keeps running.
    DiskFull { node: usize },
    /// The node's wall clock set `offset_s` seconds ahead (or behind, negative) of the others'
    /// (libfaketime; monotonic time untouched), then set right again.
    ClockSkew { node: usize, offset_s: i32 },
    /// Every fsync (fdatasync, syncfs) of the node's agent takes `delay_ms` longer (a library
    /// preloaded into the unmodified agent), then the disk is fast again. The agent keeps
    /// running; its readers must not wait for its disk.
    SlowDisk { node: usize, delay_ms: u64 },
    /// The hostile objects of [`crate::poison`] sent to `node`'s Kubernetes API.
    Poison { node: usize },
    /// A partition with the minority's first node killed as well.
    PartitionAndKill {
        groups: Vec<Vec<usize>>,
        node: usize,
    },
    /// A flapping link: `node` cut off from every other node and reconnected, in turns of
    /// `period_ms`, for the fault's span (it starts cut).
    Flap { node: usize, period_ms: u64 },
    /// A partition during which host `node`, whose agent has not run before (the scenario's
    /// last host), starts and joins through the nodes of its group; it stays when healed.
    PartitionAndJoin {
        groups: Vec<Vec<usize>>,
        node: usize,
    },
}

impl Fault {
    /// The hosts the fault touches (for the timeline).
    pub fn nodes(&self) -> Vec<usize> {
        match self {
            Fault::Partition { groups } => {
                // The smaller side is the one shown as faulty.
                groups
                    .iter()
                    .min_by_key(|g| g.len())
                    .cloned()
                    .unwrap_or_default()
            }
            Fault::OneWay { to, .. } => to.clone(),
            Fault::Bridge { left, right, .. } => left.iter().chain(right).copied().collect(),
            Fault::PartitionAndKill { groups, node } | Fault::PartitionAndJoin { groups, node } => {
                let mut nodes = groups
                    .iter()
                    .min_by_key(|g| g.len())
                    .cloned()
                    .unwrap_or_default();
                if !nodes.contains(node) {
                    nodes.push(*node);
                }
                nodes
            }
            Fault::Loss { node, .. }
            | Fault::Kill { node }
            | Fault::Pause { node }
            | Fault::KubeletStuck { node }
            | Fault::Restart { node }
            | Fault::Wipe { node }
            | Fault::DiskFull { node }
            | Fault::SlowDisk { node, .. }
            | Fault::Poison { node }
            | Fault::ClockSkew { node, .. }
            | Fault::Flap { node, .. } => vec![*node],
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Fault::Partition { .. } => "partition",
            Fault::OneWay { .. } => "one-way",
            Fault::Bridge { .. } => "bridge",
            Fault::Loss { .. } => "loss",
            Fault::Kill { .. } => "kill",
            Fault::Pause { .. } => "pause",
            Fault::KubeletStuck { .. } => "kubelet-stuck",
            Fault::Restart { .. } => "restart",
            Fault::Wipe { .. } => "wipe",
            Fault::DiskFull { .. } => "disk-full",
            Fault::SlowDisk { .. } => "slow-disk",
            Fault::Poison { .. } => "poison",
            Fault::ClockSkew { .. } => "clock-skew",
            Fault::PartitionAndKill { .. } => "partition+kill",
            Fault::Flap { .. } => "flap",
            Fault::PartitionAndJoin { .. } => "partition+join",
        }
    }
}

/// A fault active from `start_ms` to `end_ms` (milliseconds since the run started).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub start_ms: u64,
    pub end_ms: u64,
    #[serde(flatten)]
    pub fault: Fault,
}

/// A named family of faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    kinds: &'static [Kind],
    /// How long each fault lasts, in ms (inclusive range).
    fault_ms: (u64, u64),
    /// The agents' dead-node grace period (none: their default, 10 min), for faults that must
    /// outlast it.
    pub dead_node_grace_ms: Option<u64>,
    /// Its node faults (pause, kubelet-stuck) hit a node that runs a fenced pod when they start
    /// (the runner picks it: the schedule cannot know where pods run), and the fenced pods they
    /// silence must be replaced on another node before they end (checker 9).
    pub targets_fenced: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Partition,
    OneWay,
    Bridge,
    Loss,
    Kill,
    Pause,
    KubeletStuck,
    Restart,
    Wipe,
    DiskFull,
    SlowDisk,
    Poison,
    ClockSkew,
    PartitionAndKill,
    Flap,
    /// Only in its own scenario: its host has no agent until the fault starts one.
    PartitionAndJoin,
}

const ALL: &[Kind] = &[
    Kind::Partition,
    Kind::OneWay,
    Kind::Bridge,
    Kind::Loss,
    Kind::Kill,
    Kind::Pause,
    Kind::KubeletStuck,
    Kind::Restart,
    Kind::Wipe,
    Kind::DiskFull,
    Kind::SlowDisk,
    Kind::Poison,
    Kind::ClockSkew,
    Kind::PartitionAndKill,
    Kind::Flap,
];

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "partition",
        about: "symmetric partitions of random shapes (majority/minority, three ways)",
        kinds: &[Kind::Partition],
        fault_ms: (4_000, 10_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "one-way",
        about: "one-way partitions: a group's packets to the others are dropped, not theirs",
        kinds: &[Kind::OneWay],
        fault_ms: (4_000, 10_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "bridge",
        about: "bridge partitions: one node sees both halves, the halves do not see each other",
        kinds: &[Kind::Bridge],
        fault_ms: (4_000, 10_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "loss",
        about: "random packet loss (20-60%) into one node",
        kinds: &[Kind::Loss],
        fault_ms: (4_000, 10_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "kill",
        about: "kill -9 of one node, started again with its data dir",
        kinds: &[Kind::Kill],
        fault_ms: (2_000, 8_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "pause",
        about: "SIGSTOP of one node (silent, sockets open), then SIGCONT",
        kinds: &[Kind::Pause],
        fault_ms: (2_000, 8_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "pause-fenced",
        about: "SIGSTOP of a node that runs a fenced pod, longer than its replacement delay: the pod must move, never run twice",
        kinds: &[Kind::Pause],
        fault_ms: (12_000, 14_000),
        dead_node_grace_ms: None,
        targets_fenced: true,
    },
    Scenario {
        name: "kubelet-stuck",
        about: "the kubelet thread of a node that runs a fenced pod stopped (ptrace) and the node cut off: the majority replaces the pod, only the shims can stop the old one",
        kinds: &[Kind::KubeletStuck],
        fault_ms: (12_000, 14_000),
        dead_node_grace_ms: None,
        targets_fenced: true,
    },
    Scenario {
        name: "restart",
        about: "graceful restarts, and restarts with the data dir wiped",
        kinds: &[Kind::Restart, Kind::Wipe],
        fault_ms: (2_000, 6_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "disk-full",
        about: "one node's data dir (a 256 MiB tmpfs) full until writes fail, then freed",
        kinds: &[Kind::DiskFull],
        fault_ms: (3_000, 8_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "slow-disk",
        about: "every fsync of one agent 1-2 s slow (a preloaded library), then fast again",
        kinds: &[Kind::SlowDisk],
        fault_ms: (5_000, 9_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "poison",
        about: "hostile objects (huge counts, exponential $(VAR) expansion, oversized, malformed) sent to one agent's Kubernetes API",
        kinds: &[Kind::Poison],
        fault_ms: (3_000, 6_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "clock-skew",
        about: "one agent's wall clock 10-50 s fast or slow (libfaketime), then right again",
        kinds: &[Kind::ClockSkew],
        fault_ms: (4_000, 10_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "partition-kill",
        about: "a partition with a node of the minority killed too",
        kinds: &[Kind::PartitionAndKill],
        fault_ms: (4_000, 10_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "flap",
        about: "a flapping link: one node cut off and reconnected every 0.3-1.5 s",
        kinds: &[Kind::Flap],
        fault_ms: (4_000, 10_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "long-partition",
        about: "a partition longer than the dead-node grace period (6 s here): each side forgets the other's nodes, then they meet again",
        kinds: &[Kind::Partition],
        fault_ms: (13_000, 16_000),
        dead_node_grace_ms: Some(6_000),
        targets_fenced: false,
    },
    Scenario {
        name: "partition-join",
        about: "a node that never ran joins during a partition (the last host; its agent starts inside the fault, with every other node as a seed)",
        kinds: &[Kind::PartitionAndJoin],
        fault_ms: (10_000, 14_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
    Scenario {
        name: "random",
        about: "any of the above, one at a time, for soaks",
        kinds: ALL,
        fault_ms: (2_000, 10_000),
        dead_node_grace_ms: None,
        targets_fenced: false,
    },
];

impl Scenario {
    /// Whether its faults fill disks: each node's data dir is then its own small tmpfs.
    pub fn needs_disks(&self) -> bool {
        self.kinds.contains(&Kind::DiskFull)
    }

    /// Whether its faults slow disks: every agent then runs with the slow-disk library, and the
    /// run checks that reads never wait for a disk.
    pub fn slows_disks(&self) -> bool {
        self.kinds.contains(&Kind::SlowDisk)
    }

    /// Whether it sends hostile objects (checker 8 then judges their answers).
    pub fn poisons(&self) -> bool {
        self.kinds.contains(&Kind::Poison)
    }

    /// Whether its faults move clocks: every agent then runs under libfaketime.
    pub fn needs_clocks(&self) -> bool {
        self.kinds.contains(&Kind::ClockSkew)
    }

    /// Whether its last host's agent starts only inside a fault (it joins then).
    pub fn joins_late(&self) -> bool {
        self.kinds.contains(&Kind::PartitionAndJoin)
    }
}

pub fn scenario(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

/// Quiet time at the start (the workload warms up) and at the end (faults healed; the run
/// then measures convergence).
pub const WARMUP_MS: u64 = 2_000;
pub const COOLDOWN_MS: u64 = 2_000;

/// The schedule of `scenario` for `nodes` hosts over `duration_ms`, from `seed`: faults one at a
/// time, each for a random span of the scenario's range, with 1-3 s of quiet between them, the
/// last healed `COOLDOWN_MS` before the end. A named scenario of several kinds takes them in
/// turn (so a short run has each); `random` draws each fault's kind.
pub fn schedule(scenario: &Scenario, nodes: usize, duration_ms: u64, seed: u64) -> Vec<Step> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut steps = Vec::new();
    let mut at = WARMUP_MS;
    let end = duration_ms.saturating_sub(COOLDOWN_MS);
    if nodes < 3 {
        return steps;
    }
    let first = rng.random_range(0..scenario.kinds.len());
    loop {
        let length = rng.random_range(scenario.fault_ms.0..=scenario.fault_ms.1);
        if at + length > end {
            break;
        }
        let kind = if scenario.name == "random" {
            scenario.kinds[rng.random_range(0..scenario.kinds.len())]
        } else {
            scenario.kinds[(first + steps.len()) % scenario.kinds.len()]
        };
        steps.push(Step {
            start_ms: at,
            end_ms: at + length,
            fault: fault(kind, nodes, &mut rng),
        });
        at += length + rng.random_range(1_000..=3_000);
    }
    steps
}

/// `nodes` indices shuffled.
fn shuffled(nodes: usize, rng: &mut Xoshiro256PlusPlus) -> Vec<usize> {
    let mut all: Vec<usize> = (0..nodes).collect();
    for i in (1..all.len()).rev() {
        all.swap(i, rng.random_range(0..=i));
    }
    all
}

fn sorted(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v
}

/// A random split into a majority and a minority (or, one time in four with 5+ nodes, three
/// groups none of which is a majority).
fn groups(nodes: usize, rng: &mut Xoshiro256PlusPlus) -> Vec<Vec<usize>> {
    let order = shuffled(nodes, rng);
    if nodes >= 5 && rng.random_range(0..4) == 0 {
        let a = nodes / 3;
        let b = (nodes - a) / 2;
        return vec![
            sorted(order[..a].to_vec()),
            sorted(order[a..a + b].to_vec()),
            sorted(order[a + b..].to_vec()),
        ];
    }
    let minority = rng.random_range(1..=(nodes - 1) / 2);
    vec![
        sorted(order[minority..].to_vec()),
        sorted(order[..minority].to_vec()),
    ]
}

fn fault(kind: Kind, nodes: usize, rng: &mut Xoshiro256PlusPlus) -> Fault {
    let node = rng.random_range(0..nodes);
    match kind {
        Kind::Partition => Fault::Partition {
            groups: groups(nodes, rng),
        },
        Kind::OneWay => {
            let g = groups(nodes, rng);
            // Either direction: the minority deaf or the minority mute.
            let (a, b) = (g[0].clone(), g[1..].concat());
            if rng.random_range(0..2) == 0 {
                Fault::OneWay {
                    from: a,
                    to: sorted(b),
                }
            } else {
                Fault::OneWay {
                    from: sorted(b),
                    to: a,
                }
            }
        }
        Kind::Bridge => {
            let order = shuffled(nodes, rng);
            let half = (nodes - 1) / 2;
            Fault::Bridge {
                middle: order[0],
                left: sorted(order[1..1 + half].to_vec()),
                right: sorted(order[1 + half..].to_vec()),
            }
        }
        Kind::Loss => Fault::Loss {
            node,
            percent: rng.random_range(20..=60),
        },
        Kind::Kill => Fault::Kill { node },
        Kind::DiskFull => Fault::DiskFull { node },
        Kind::Poison => Fault::Poison { node },
        Kind::SlowDisk => Fault::SlowDisk {
            node,
            delay_ms: rng.random_range(1_000..=2_000),
        },
        Kind::ClockSkew => {
            let offset_s = rng.random_range(10..=50);
            Fault::ClockSkew {
                node,
                offset_s: if rng.random_range(0..2) == 0 {
                    offset_s
                } else {
                    -offset_s
                },
            }
        }
        Kind::Pause => Fault::Pause { node },
        Kind::KubeletStuck => Fault::KubeletStuck { node },
        Kind::Restart => Fault::Restart { node },
        Kind::Wipe => Fault::Wipe { node },
        Kind::PartitionAndKill => {
            let groups = groups(nodes, rng);
            let minority = groups.iter().min_by_key(|g| g.len()).expect("two groups");
            let node = minority[rng.random_range(0..minority.len())];
            Fault::PartitionAndKill { groups, node }
        }
        Kind::PartitionAndJoin => Fault::PartitionAndJoin {
            groups: groups(nodes, rng),
            node: nodes - 1,
        },
        Kind::Flap => Fault::Flap {
            node,
            period_ms: rng.random_range(300..=1_500),
        },
    }
}

/// The (from, to) host pairs of `nodes` hosts whose packets a network fault drops (a flapping
/// link: while it is cut). Empty for process faults.
pub fn blocked_pairs(fault: &Fault, nodes: usize) -> Vec<(usize, usize)> {
    let between = |a: &[usize], b: &[usize]| -> Vec<(usize, usize)> {
        a.iter()
            .flat_map(|x| b.iter().map(move |y| (*x, *y)))
            .collect()
    };
    match fault {
        Fault::Partition { groups }
        | Fault::PartitionAndKill { groups, .. }
        | Fault::PartitionAndJoin { groups, .. } => {
            let mut pairs = Vec::new();
            for (i, a) in groups.iter().enumerate() {
                for (j, b) in groups.iter().enumerate() {
                    if i != j {
                        pairs.extend(between(a, b));
                    }
                }
            }
            pairs
        }
        Fault::OneWay { from, to } => between(from, to),
        Fault::Flap { node, .. } | Fault::KubeletStuck { node } => {
            let others: Vec<usize> = (0..nodes).filter(|n| n != node).collect();
            let mut pairs = between(&[*node], &others);
            pairs.extend(between(&others, &[*node]));
            pairs
        }
        Fault::Bridge { left, right, .. } => {
            let mut pairs = between(left, right);
            pairs.extend(between(right, left));
            pairs
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule() {
        let s = scenario("random").unwrap();
        let a = schedule(s, 5, 120_000, 42);
        assert_eq!(a, schedule(s, 5, 120_000, 42));
        assert_ne!(a, schedule(s, 5, 120_000, 43));
        assert!(a.len() >= 8, "{a:?}");
    }

    #[test]
    fn a_short_run_of_a_named_scenario_has_each_of_its_faults() {
        let steps = schedule(scenario("restart").unwrap(), 5, 24_000, 20261201);
        let names: std::collections::BTreeSet<&str> =
            steps.iter().map(|s| s.fault.name()).collect();
        assert_eq!(names, ["restart", "wipe"].into(), "{steps:?}");
    }

    #[test]
    fn faults_come_one_at_a_time_inside_the_run() {
        for scenario in SCENARIOS {
            for seed in 0..50 {
                let steps = schedule(scenario, 5, 60_000, seed);
                assert!(!steps.is_empty(), "{}", scenario.name);
                let mut previous_end = WARMUP_MS;
                for step in &steps {
                    assert!(step.start_ms >= previous_end, "{step:?}");
                    assert!(step.end_ms > step.start_ms);
                    assert!(step.end_ms <= 60_000 - COOLDOWN_MS, "{step:?}");
                    previous_end = step.end_ms;
                }
            }
        }
    }

    #[test]
    fn partitions_cover_every_node_once_and_block_both_ways() {
        for seed in 0..200 {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
            let g = groups(5, &mut rng);
            let mut all: Vec<usize> = g.concat();
            all.sort_unstable();
            assert_eq!(all, [0, 1, 2, 3, 4], "{g:?}");
            assert!(g.iter().all(|x| !x.is_empty()), "{g:?}");
            let pairs = blocked_pairs(&Fault::Partition { groups: g.clone() }, 5);
            for (a, b) in &pairs {
                assert!(pairs.contains(&(*b, *a)));
                assert!(!g.iter().any(|x| x.contains(a) && x.contains(b)));
            }
        }
    }

    #[test]
    fn a_bridge_keeps_the_middle_connected_and_a_one_way_partition_one_direction() {
        let bridge = Fault::Bridge {
            middle: 0,
            left: vec![1, 2],
            right: vec![3, 4],
        };
        let pairs = blocked_pairs(&bridge, 5);
        assert_eq!(pairs.len(), 8);
        assert!(pairs.iter().all(|(a, b)| *a != 0 && *b != 0));
        let one_way = Fault::OneWay {
            from: vec![0],
            to: vec![1, 2],
        };
        assert_eq!(blocked_pairs(&one_way, 3), [(0, 1), (0, 2)]);
        let flap = Fault::Flap {
            node: 1,
            period_ms: 500,
        };
        assert_eq!(
            blocked_pairs(&flap, 3),
            [(1, 0), (1, 2), (0, 1), (2, 1)],
            "a flapping node is cut off both ways"
        );
    }

    #[test]
    fn the_joiner_is_the_last_host_and_joins_inside_a_partition() {
        let s = scenario("partition-join").unwrap();
        assert!(s.joins_late());
        assert!(
            !scenario("random").unwrap().joins_late(),
            "random never joins"
        );
        for seed in 0..50 {
            let steps = schedule(s, 5, 24_000, seed);
            assert!(!steps.is_empty(), "seed {seed}");
            for step in &steps {
                let Fault::PartitionAndJoin { groups, node } = &step.fault else {
                    panic!("{step:?}");
                };
                assert_eq!(*node, 4);
                assert_eq!(groups.iter().filter(|g| g.contains(node)).count(), 1);
                let pairs = blocked_pairs(&step.fault, 5);
                assert!(
                    pairs.iter().any(|(a, _)| a == node),
                    "it is cut off from a side"
                );
            }
        }
    }

    #[test]
    fn a_long_partition_outlasts_the_grace_period_it_sets() {
        let s = scenario("long-partition").unwrap();
        let grace = s.dead_node_grace_ms.unwrap();
        for seed in 0..50 {
            let steps = schedule(s, 5, 24_000, seed);
            assert!(!steps.is_empty(), "seed {seed}: a 24 s run has one");
            for step in steps {
                // Failure detection (~3.2 s) + the grace, with time to spare before the heal.
                assert!(step.end_ms - step.start_ms > grace + 5_000, "{step:?}");
                assert!(matches!(step.fault, Fault::Partition { .. }));
            }
        }
    }
}

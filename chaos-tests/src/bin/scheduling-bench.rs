//! Scheduling benchmark: the distributed auction simulated with all its nodes in one process
//! (virtual time, 1 ms message latency), against a centralized greedy scheduler on the same input.
//!
//! Reports placements per second of CPU time on this machine, auction messages per placement,
//! and placement quality (fraction placed, standard deviation of node CPU utilisation).
//!
//! Usage: cargo run --release -p shoal-chaos --bin scheduling-bench -- --nodes 1000 --pods 100000
//! [--profile mixed|none|constrained]

use std::time::{Duration, Instant};

use clap::Parser;
use shoal_chaos::sim::scheduler::{Sim, SimConfig, central_greedy, cpu_utilisation_stddev};
use shoal_core::placement::workload;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    #[arg(long, default_value_t = 100_000)]
    pods: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Nodes asked per auction.
    #[arg(long, default_value_t = 8)]
    sample: usize,
    /// Pods per auction.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Skip the (slow) centralized baseline.
    #[arg(long)]
    no_greedy: bool,
    /// Auction pods with a wide hard constraint by uid like the others (what serializing
    /// them at one auctioneer per constraint buys is the difference).
    #[arg(long)]
    no_serialize_wide: bool,
    /// Which constraints the pods carry: `mixed` (20% node selector, 10% zone spread over
    /// their whole app, 5% tolerations), `none`, or `constrained` (30% with a required
    /// topology constraint over their own group: 15% zone spread, 15% hostname anti-affinity).
    #[arg(long, value_enum, default_value_t = Profile::Mixed)]
    profile: Profile,
    /// Toy sizes, a few seconds: what CI runs to prove the benchmark still runs and prints
    /// its table (the figures mean nothing; peers not installed are skipped).
    #[arg(long)]
    smoke: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Profile {
    Mixed,
    None,
    Constrained,
}

impl From<Profile> for workload::Profile {
    fn from(p: Profile) -> Self {
        match p {
            Profile::Mixed => workload::Profile::Mixed,
            Profile::None => workload::Profile::None,
            Profile::Constrained => workload::Profile::Constrained,
        }
    }
}

fn main() {
    let mut args = Args::parse();
    if args.smoke {
        args.nodes = 20;
        args.pods = 300;
    }
    let nodes = workload::nodes(args.seed, args.nodes);
    let pods = workload::pods_of(args.profile.into(), args.seed + 1, args.pods);
    let capacity: u64 = nodes.iter().map(|n| n.allocatable.cpu_millis).sum();
    let demand: u64 = pods.iter().map(|p| p.requests.cpu_millis).sum();
    println!(
        "{} nodes, {} pods; pods ask for {:.0}% of the cluster's CPU\n",
        args.nodes,
        args.pods,
        100.0 * demand as f64 / capacity as f64
    );

    let start = Instant::now();
    let mut config = SimConfig::default();
    config.auction.sample = args.sample;
    config.auction.batch = args.batch;
    config.auction.serialize_wide = !args.no_serialize_wide;
    let mut sim = Sim::new(config, nodes.clone());
    sim.add_pods(pods.clone());
    sim.run(Duration::from_secs(600), |s| {
        s.bound_count() + s.unschedulable.len() >= args.pods
    });
    let cpu = start.elapsed().as_secs_f64();
    sim.check_invariants().expect("no node overcommitted");
    let placed = sim.bound_count();
    let auction_stddev = cpu_utilisation_stddev(&sim.cluster);
    if std::env::var_os("SHOAL_BENCH_DEBUG").is_some() {
        debug_distribution(&sim.cluster);
    }

    println!("| figure | distributed auction | central greedy | auction / greedy |");
    println!("|---|---|---|---|");
    let greedy = (!args.no_greedy).then(|| {
        let start = Instant::now();
        let greedy = central_greedy(&nodes, &pods);
        let t = start.elapsed().as_secs_f64();
        let placed: u64 = greedy.nodes().map(|n| greedy.allocated(n.id).pods).sum();
        (placed as f64, cpu_utilisation_stddev(&greedy), t)
    });
    // The greedy columns, or dashes when it was not run (`--no-greedy`).
    let column = |f: &dyn Fn((f64, f64, f64)) -> String| greedy.map_or("—".to_owned(), f);
    let rate = placed as f64 / cpu;
    println!(
        "| pods placed | {placed} ({:.1}%) | {} | {} |",
        100.0 * placed as f64 / args.pods as f64,
        column(&|(p, _, _)| format!("{p} ({:.1}%)", 100.0 * p / args.pods as f64)),
        column(&|(p, _, _)| format!("{:.3}", placed as f64 / p)),
    );
    println!(
        "| stddev of node CPU utilisation | {auction_stddev:.3} | {} | {} |",
        column(&|(_, s, _)| format!("{s:.3}")),
        column(&|(_, s, _)| format!("{:.2}", auction_stddev / s)),
    );
    println!(
        "| placements per CPU second | {rate:.0} | {} | {} |",
        column(&|(p, _, t)| format!("{:.0}", p / t)),
        column(&|(p, _, t)| format!("{:.2}", rate / (p / t))),
    );
    println!(
        "\nauction: {:.2} s CPU, {:.2} s virtual; {} auction messages ({:.2} per placement), {} bindings written, {} refused at admission, {} bid evaluations ({:.1} per pod); {} bindings broke a hard topology constraint (wide constraints serialized: {})",
        cpu,
        sim.now.as_secs_f64(),
        sim.stats.auction_messages,
        sim.stats.auction_messages as f64 / placed.max(1) as f64,
        sim.stats.bindings_written,
        sim.stats.refused,
        sim.stats.evaluations,
        sim.stats.evaluations as f64 / args.pods as f64,
        sim.stats.topology_violations,
        !args.no_serialize_wide,
    );
    println!(
        "{} auctions ({} exhaustive), {} pods auctioned again for stale offers",
        sim.stats.auctions, sim.stats.exhaustive_auctions, sim.stats.stale_retries
    );
    if let Some((pod, reason)) = sim.unschedulable.iter().next() {
        println!("example unschedulable pod {pod}: {reason}");
    }
}

/// With SHOAL_BENCH_DEBUG set: CPU utilisation by node size (where imbalance comes from).
fn debug_distribution(cluster: &shoal_core::placement::cluster::ClusterView) {
    let mut by_size: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for n in cluster.nodes() {
        by_size
            .entry(n.allocatable.cpu_millis)
            .or_default()
            .push(cluster.allocated(n.id).cpu_millis as f64 / n.allocatable.cpu_millis as f64);
    }
    for (size, fr) in by_size {
        let mean = fr.iter().sum::<f64>() / fr.len() as f64;
        let max = fr.iter().cloned().fold(0.0, f64::max);
        let min = fr.iter().cloned().fold(1.0, f64::min);
        eprintln!(
            "{size}m: {} nodes mean {mean:.3} min {min:.3} max {max:.3}",
            fr.len()
        );
    }
}

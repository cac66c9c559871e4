//! Chaos benchmark: every named scenario (or those given) over several seeds on a lab of real
//! agents, through the same `shoal-chaos` run as the CI profile. Reports per scenario the
//! convergence time after the last heal (p50 / max over the seeds), acknowledged operations per
//! second while faults were active, the share of operations acknowledged, the time to replace
//! a fenced pod of a failed node (from the fault's start to the replacement's first heartbeat,
//! p50 / max over every move), and violations.
//!
//! Usage (root): cargo run -p shoal-chaos --bin chaos-bench -- --seeds 3 --duration 30s

use std::time::Duration;

use clap::Parser;
use shoal_chaos::history::Outcome;
use shoal_chaos::run::{RunConfig, run};
use shoal_chaos::scenario::{SCENARIOS, scenario};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 5)]
    nodes: usize,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Scenarios to run (default: every named one but `random`).
    scenarios: Vec<String>,
    /// Toy sizes, a few seconds: what CI runs to prove the benchmark still runs and prints
    /// its table (the figures mean nothing; peers not installed are skipped).
    #[arg(long)]
    smoke: bool,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.nodes = 3;
        args.duration = Duration::from_secs(3);
        args.seeds = 1;
        if args.scenarios.is_empty() {
            args.scenarios = vec!["partition".into()];
        }
    }
    let names: Vec<String> = if args.scenarios.is_empty() {
        SCENARIOS
            .iter()
            .filter(|s| s.name != "random")
            .map(|s| s.name.to_owned())
            .collect()
    } else {
        args.scenarios.clone()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "| scenario | runs | faults | convergence p50 / max (ms) | acked ops/s during faults | acknowledged / failed / unknown | fenced pods replaced: moves, p50 / max (ms) | violations |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for name in &names {
        let Some(s) = scenario(name) else {
            anyhow::bail!("no scenario {name:?}");
        };
        let mut convergence = Vec::new();
        let mut rates = Vec::new();
        let mut replaced = Vec::new();
        let (mut faults, mut ok, mut fail, mut unknown) = (0, 0, 0, 0);
        let mut violations: std::collections::BTreeMap<&str, usize> = Default::default();
        for seed in 1..=args.seeds {
            // Every run keeps its report, so a violation can be read, not only counted.
            let mut config = RunConfig::new(s, args.nodes, args.duration, seed);
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/chaos-bench")
                .join(format!("{name}-{seed}"));
            config.report_dir = Some(dir.clone());
            let report = runtime.block_on(run(config))?;
            if !report.passed() {
                eprintln!("{name}, seed {seed}: FAILED, see {}", dir.display());
            }
            convergence.push(report.convergence_ms.unwrap_or(u64::MAX));
            rates.push(report.acked_per_second_during_faults());
            faults += report.steps.len();
            ok += report.history.count(Outcome::Ok);
            fail += report.history.count(Outcome::Fail);
            unknown += report.history.count(Outcome::Unknown);
            for v in &report.violations {
                *violations.entry(v.checker).or_default() += 1;
            }
            replaced.extend(
                shoal_chaos::report::fenced_moves(&report.fenced_runs, &report.steps)
                    .iter()
                    .filter_map(|m| m.after_fault_ms),
            );
        }
        convergence.sort_unstable();
        replaced.sort_unstable();
        let rate = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        // A run whose stores never agreed within the bound.
        let ms = |v: u64| {
            if v == u64::MAX {
                "never".to_owned()
            } else {
                v.to_string()
            }
        };
        let total: usize = violations.values().sum();
        let violations = if total == 0 {
            "0".to_owned()
        } else {
            let by: Vec<String> = violations
                .iter()
                .map(|(c, n)| format!("{c}: {n}"))
                .collect();
            format!("{total} ({})", by.join(", "))
        };
        println!(
            "| {name} | {} | {faults} | {} / {} | {rate:.1} | {ok} / {fail} / {unknown} | {} | {violations} |",
            args.seeds,
            ms(percentile(&convergence, 0.5)),
            ms(convergence.last().copied().unwrap_or(0)),
            if replaced.is_empty() {
                "0".to_owned()
            } else {
                format!(
                    "{}, {} / {}",
                    replaced.len(),
                    percentile(&replaced, 0.5),
                    replaced.last().copied().unwrap_or(0)
                )
            },
        );
    }
    Ok(())
}

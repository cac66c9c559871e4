//! `shoal-chaos`: breaks a lab of real `shoal` agents on a seeded schedule and checks the
//! invariants from what the workload and the agents recorded.
//!
//! ```text
//! shoal-chaos list
//! shoal-chaos run [--nodes 5] [--duration 5m] [--seed N] [--scenario NAME|random] [--report DIR]
//!                  [--clients 4] [--self-test]
//! shoal-chaos clean
//! ```
//!
//! Needs root (network namespaces, veths, nftables) and the `shoal` binary (next to this one, or
//! `$SHOAL_BIN`). Exit status: 0 when every checker passed, 1 on a violation, 2 when the harness
//! itself failed.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use shoal_chaos::run::{RunConfig, clean, run};
use shoal_chaos::scenario::{SCENARIOS, scenario};

#[derive(Parser)]
#[command(
    name = "shoal-chaos",
    about = "Chaos runs against a lab of real shoal agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the scenarios.
    List,
    /// One run: a lab, a seeded fault schedule, a recorded workload, the checkers' verdicts.
    Run {
        #[arg(long, default_value_t = 5)]
        nodes: usize,
        /// How long the schedule of faults (and the workload) lasts, e.g. 90s or 5m; the
        /// workload stops at the last heal and the stores' convergence is measured from there.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// The schedule's seed (random when absent; printed first either way).
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long, default_value = "random")]
        scenario: String,
        /// Directory for report.md, timeline.svg and history.jsonl.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Concurrent workload clients.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// The checkers' self-test: give the agent meant to lack the secret the cluster's, add
        /// a pod of a foreign controller to the Deployment's after the faults, run an unfenced
        /// twin of a fenced pod, grant a process 4 cpus in node 0's pod cgroups and send a write
        /// the agents, started with fault injection on, drop; the run must then fail checkers
        /// 1, 3, 4, 5 and 6 (1 only with a debug build of the agent, which has fault injection).
        #[arg(long)]
        self_test: bool,
        /// Keep the agents' logs (and the workload's objects) in the report directory also
        /// when the run passes.
        #[arg(long)]
        keep_logs: bool,
    },
    /// Remove what killed runs left (agents, namespaces, data directories).
    Clean,
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::List => {
            for s in SCENARIOS {
                println!("{:<16} {}", s.name, s.about);
            }
            0
        }
        Command::Clean => match clean() {
            Ok(removed) => {
                for r in &removed {
                    println!("removed {r}");
                }
                if removed.is_empty() {
                    println!("nothing to clean");
                }
                0
            }
            Err(e) => {
                eprintln!("shoal-chaos clean: {e:#}");
                2
            }
        },
        Command::Run {
            nodes,
            duration,
            seed,
            scenario: name,
            report,
            clients,
            self_test,
            keep_logs,
        } => {
            let Some(scenario) = scenario(&name) else {
                eprintln!(
                    "shoal-chaos: no scenario {name:?}; `shoal-chaos list` shows them: {}",
                    SCENARIOS
                        .iter()
                        .map(|s| s.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                std::process::exit(2);
            };
            if nodes < 3 {
                eprintln!("shoal-chaos: --nodes must be at least 3");
                std::process::exit(2);
            }
            let seed = seed.unwrap_or_else(rand::random);
            println!("seed {seed} (replay with --seed {seed})");
            let mut config = RunConfig::new(scenario, nodes, duration, seed);
            config.report_dir = report;
            config.clients = clients.max(1);
            config.sabotage = self_test;
            config.keep_evidence = keep_logs;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(async {
                // Ctrl-C drops the run, whose lab, agents and data dir clean up on drop.
                tokio::select! {
                    result = run(config) => match result {
                        Ok(report) => {
                            print!("{}", shoal_chaos::report::markdown(&report));
                            i32::from(!report.passed())
                        }
                        Err(e) => {
                            eprintln!("shoal-chaos run: {e:#}");
                            2
                        }
                    },
                    _ = tokio::signal::ctrl_c() => {
                        eprintln!("shoal-chaos: interrupted; the lab is torn down");
                        2
                    }
                }
            })
        }
    };
    std::process::exit(code);
}

//! The `shoal-chaos` CI profile: each named scenario on five real agents, on a short schedule,
//! must pass every checker. The seeds are fixed (override with `SHOAL_CHAOS_SEED`) so a failure
//! replays with `shoal-chaos run --scenario NAME --seed N`; reports go to
//! `target/chaos-reports/<scenario>/`. Needs root, like the other chaos tests.

use std::time::Duration;

use shoal_chaos::report::markdown;
use shoal_chaos::run::{RunConfig, run};
use shoal_chaos::scenario::scenario;

/// One lab at a time: the tests of this binary would otherwise build labs of the same name (the
/// name comes from the process id) side by side.
static LAB: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const PROFILE: &[&str] = &[
    "partition",
    "one-way",
    "bridge",
    "loss",
    "kill",
    "pause",
    "pause-fenced",
    "kubelet-stuck",
    "restart",
    "disk-full",
    "slow-disk",
    "poison",
    "clock-skew",
    "partition-kill",
    "flap",
    "long-partition",
    "partition-join",
];

/// The failed scenarios' reports, shown as text when the test returns it: a returned error is
/// printed without a backtrace, so CI's tail of the output ends with the violations themselves.
struct Failures(Vec<String>);

impl std::fmt::Debug for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("\n\n"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_named_scenario_passes_every_checker() -> Result<(), Failures> {
    let _lab = LAB.lock().await;
    let seed: u64 = std::env::var("SHOAL_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261201);
    let reports = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/chaos-reports");
    let mut failures = Vec::new();
    for name in PROFILE {
        let mut config = RunConfig::new(scenario(name).unwrap(), 5, Duration::from_secs(24), seed);
        config.report_dir = Some(reports.join(name));
        let report = match run(config).await {
            Ok(report) => report,
            Err(e) => {
                failures.push(format!(
                    "FAILED: scenario {name}, seed {seed}: the harness failed: {e:#}"
                ));
                continue;
            }
        };
        eprintln!(
            "{name}: {} ops ({} acknowledged), converged {:?} ms after the last heal, {} violations",
            report.history.ops.len(),
            report.history.count(shoal_chaos::history::Outcome::Ok),
            report.convergence_ms,
            report.violations.len()
        );
        if !report.passed() {
            let summary: Vec<String> = report
                .violations
                .iter()
                .map(|v| format!("  - {}: {}", v.checker, v.message))
                .collect();
            // The whole report first, the scenario's violations last (what a truncated log keeps).
            failures.push(format!(
                "{}\n\nFAILED: scenario {name}, seed {seed}:\n{}",
                markdown(&report),
                summary.join("\n")
            ));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failures(failures))
    }
}

/// The checkers can fail against the real agents: a run whose agents have fault injection on
/// (they acknowledge one write and drop it) that gives the cluster's secret to the agent
/// meant to lack it, adds a foreign controller's pod to the Deployment's, runs an unfenced twin
/// of a fenced pod and grants a process 4 cpus in a node's pod cgroups must be reported by
/// checkers 1, 3, 4, 5 and 6 (and by nothing else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_self_test_run_is_caught_by_the_write_replica_fencing_overcommit_and_secret_checkers() {
    let _lab = LAB.lock().await;
    let mut config = RunConfig::new(scenario("loss").unwrap(), 5, Duration::from_secs(8), 7);
    config.sabotage = true;
    // Counts that never become exact are waited for this long.
    config.converge_bound = Duration::from_secs(20);
    let report = run(config).await.expect("the harness runs");
    let caught: std::collections::BTreeSet<&str> =
        report.violations.iter().map(|v| v.checker).collect();
    assert_eq!(
        caught,
        [
            shoal_chaos::checker::ACKNOWLEDGED_WRITES,
            shoal_chaos::checker::REPLICAS,
            shoal_chaos::checker::OVERCOMMIT,
            shoal_chaos::checker::FENCED,
            shoal_chaos::checker::SECRET
        ]
        .into(),
        "{}",
        markdown(&report)
    );
    let text = markdown(&report);
    let lost = format!("to {} is lost", shoal_chaos::run::DROPPED_KEY);
    assert!(text.contains(&lost), "{text}");
    assert!(text.contains("chaos-app-stray"), "{text}");
    assert!(text.contains("intruder"), "{text}");
    assert!(text.contains("chaos-fenced-0 ran twice at once"), "{text}");
    assert!(text.contains("podchaos-breach/c "), "{text}");
}

//! A run's report: `report.md` (what was injected, what the workload saw, what the checkers
//! found), `timeline.svg` (faults as bands per node, acknowledged writes per second, digest
//! agreement after the heal) and `history.jsonl` (every operation, for replaying a checker).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use crate::checker::Instance;
use crate::history::Outcome;
use crate::run::RunReport;
use crate::scenario::Step;

/// A fenced pod's move to another node, read from its heartbeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedMove {
    pub pod: String,
    pub from: String,
    pub to: String,
    /// From the old run's last heartbeat to the new run's first: how long the pod ran nowhere.
    pub downtime_ms: u64,
    /// From the start of the last fault that touched the old node before its last heartbeat
    /// to the new run's first heartbeat: the time to replace the pod of a failed node.
    pub after_fault_ms: Option<u64>,
}

/// Every move of a fenced pod between consecutive runs on different nodes (`runs` sorted by
/// pod, then first heartbeat, as `run` records them; nodes are named `n<index>`).
pub fn fenced_moves(runs: &[Instance], steps: &[Step]) -> Vec<FencedMove> {
    let mut moves = Vec::new();
    for pair in runs.windows(2) {
        let (old, new) = (&pair[0], &pair[1]);
        if old.pod != new.pod || old.node == new.node || new.first_ms < old.last_ms {
            continue;
        }
        let index: Option<usize> = old.node.strip_prefix('n').and_then(|i| i.parse().ok());
        let fault_start = steps
            .iter()
            .filter(|s| s.start_ms <= old.last_ms)
            .filter(|s| index.is_some_and(|i| s.fault.nodes().contains(&i)))
            .map(|s| s.start_ms)
            .max();
        moves.push(FencedMove {
            pod: old.pod.clone(),
            from: old.node.clone(),
            to: new.node.clone(),
            downtime_ms: new.first_ms - old.last_ms,
            after_fault_ms: fault_start.map(|start| new.first_ms.saturating_sub(start)),
        });
    }
    moves
}

pub fn write(report: &RunReport, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("report.md"), markdown(report))?;
    std::fs::write(dir.join("timeline.svg"), timeline(report))?;
    std::fs::write(dir.join("history.jsonl"), report.history.to_jsonl())?;
    Ok(())
}

pub fn markdown(report: &RunReport) -> String {
    let c = &report.config;
    let h = &report.history;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# shoal-chaos: scenario `{}`, seed {}\n",
        c.scenario.name, c.seed
    );
    let _ = writeln!(
        out,
        "Replay: `shoal-chaos run --scenario {} --seed {} --nodes {} --duration {}s`\n",
        c.scenario.name,
        c.seed,
        c.nodes,
        c.duration.as_secs()
    );
    let _ = writeln!(out, "{}\n", c.scenario.about);
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(
        out,
        "| verdict | {} |",
        if report.passed() {
            "**pass**"
        } else {
            "**FAIL**"
        }
    );
    let _ = writeln!(out, "| nodes | {} |", c.nodes);
    let _ = writeln!(out, "| faults injected | {} |", report.steps.len());
    let _ = writeln!(
        out,
        "| operations | {} invoked: {} acknowledged, {} failed, {} unknown |",
        h.ops.len(),
        h.count(Outcome::Ok),
        h.count(Outcome::Fail),
        h.count(Outcome::Unknown)
    );
    let _ = writeln!(
        out,
        "| acknowledged operations per second during faults | {:.1} |",
        report.acked_per_second_during_faults()
    );
    let _ = writeln!(
        out,
        "| convergence after the last fault | {} |",
        report
            .convergence_ms
            .map_or("not within the bound".to_owned(), |ms| format!("{ms} ms"))
    );
    let _ = writeln!(
        out,
        "| Deployment scaled | {} times acknowledged, {} not |",
        report.scales.0, report.scales.1
    );
    let _ = writeln!(
        out,
        "| replica counts exact after the last fault | {} |",
        report
            .replicas_ms
            .map_or("not within the bound".to_owned(), |ms| format!("{ms} ms"))
    );
    let _ = writeln!(
        out,
        "| an agent without the secret | {} |",
        report.intrusion_evidence
    );
    let _ = writeln!(
        out,
        "| cpu the nodes granted (checker 5) | {} |",
        report.overcommit_evidence
    );
    let nodes_of = |pod: &str| {
        let mut nodes: Vec<&str> = report
            .fenced_runs
            .iter()
            .filter(|r| r.pod == pod)
            .map(|r| r.node.as_str())
            .collect();
        nodes.dedup();
        nodes.join(" → ")
    };
    let mut fenced: Vec<&str> = report.fenced_runs.iter().map(|r| r.pod.as_str()).collect();
    fenced.dedup();
    let _ = writeln!(
        out,
        "| fenced pods' runs (from their heartbeats) | {} runs, {} heartbeats; {} |",
        report.fenced_runs.len(),
        report.fenced_runs.iter().map(|r| r.beats).sum::<usize>(),
        fenced
            .iter()
            .map(|p| format!("{p}: {}", nodes_of(p)))
            .collect::<Vec<_>>()
            .join("; ")
    );
    if c.sabotage {
        let _ = writeln!(
            out,
            "| self-test | the invariants of checkers 3, 4, 5 and 6 were broken on purpose, and a write that a fault-injection agent drops was sent |"
        );
    }
    let moves = fenced_moves(&report.fenced_runs, &report.steps);
    if !moves.is_empty() {
        let _ = writeln!(
            out,
            "| fenced pods moved (replaced after the fault began) | {} |",
            moves
                .iter()
                .map(|m| format!(
                    "{} {} → {} {}",
                    m.pod,
                    m.from,
                    m.to,
                    m.after_fault_ms
                        .map_or("(no fault)".to_owned(), |ms| format!(
                            "{:.1} s",
                            ms as f64 / 1000.0
                        ))
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    if !report.fenced_runs.is_empty() {
        let _ = writeln!(
            out,
            "\n## Fenced pods' runs\n\n| pod | node | run | first heartbeat | last heartbeat | heartbeats |\n|---|---|---|---|---|---|"
        );
        for r in &report.fenced_runs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.1} s | {:.1} s | {} |",
                r.pod,
                r.node,
                r.id.get(..8).unwrap_or(&r.id),
                r.first_ms as f64 / 1000.0,
                r.last_ms as f64 / 1000.0,
                r.beats
            );
        }
    }
    if !report.hostile.is_empty() {
        let _ = writeln!(
            out,
            "\n## Hostile objects (checker 8)\n\n| object | sent to | expected | answer | pods waiting |\n|---|---|---|---|---|"
        );
        for h in &report.hostile {
            let message: String = h.message.chars().take(160).collect();
            let pods: Vec<String> = h
                .pods
                .iter()
                .map(|(node, reason, message)| {
                    let message: String = message.chars().take(100).collect();
                    format!("{node}: {reason} ({message})")
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | n{} | {} | {} {} | {} |",
                h.name,
                h.node,
                serde_json::to_string(&h.expect).unwrap_or_default(),
                h.status,
                message.replace('|', "\\|"),
                pods.join("; ").replace('|', "\\|")
            );
        }
    }
    let _ = writeln!(out, "\n## Checkers\n\n| checker | violations |\n|---|---|");
    for (name, count) in &report.checkers {
        let _ = writeln!(out, "| {name} | {count} |");
    }
    if !report.violations.is_empty() {
        let _ = writeln!(out, "\n## Violations\n");
        for v in &report.violations {
            let _ = writeln!(out, "- **{}**: {}", v.checker, v.message);
            for id in &v.ops {
                if let Some(op) = h.ops.iter().find(|o| o.id == *id) {
                    let _ = writeln!(
                        out,
                        "  - op {}: {:?} on n{} at {}-{} ms: {:?} ({})",
                        op.id,
                        op.request,
                        op.node,
                        op.invoked_ms,
                        op.completed_ms,
                        op.outcome,
                        op.detail
                    );
                }
            }
        }
    }
    let _ = writeln!(
        out,
        "\n## Faults\n\n| from | to | fault | nodes |\n|---|---|---|---|"
    );
    for s in &report.steps {
        let _ = writeln!(
            out,
            "| {:.1} s | {:.1} s | {} | {} |",
            s.start_ms as f64 / 1000.0,
            s.end_ms as f64 / 1000.0,
            s.fault.name(),
            serde_json::to_string(&s.fault).unwrap_or_default()
        );
    }
    let _ = writeln!(out, "\n## Fault driver log\n");
    for (at, text) in &report.fault_log {
        let _ = writeln!(out, "- {:.1} s: {text}", *at as f64 / 1000.0);
    }
    out
}

/// The timeline picture: one band row per node (red where a fault touches it), then the rate of
/// acknowledged operations per second, then digest agreement after the heal.
pub fn timeline(report: &RunReport) -> String {
    let nodes = report.config.nodes;
    let end_ms = report
        .samples
        .last()
        .map_or(report.quiet_ms, |s| s.at_ms)
        .max(report.config.duration.as_millis() as u64)
        .max(1);
    let (left, width, row) = (60.0, 900.0, 22.0);
    let x = |ms: u64| left + width * ms as f64 / end_ms as f64;
    let rate_top = row * nodes as f64 + 30.0;
    let rate_height = 80.0;
    let height = rate_top + rate_height + 60.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"#,
        left + width + 20.0
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for n in 0..nodes {
        let y = 10.0 + row * n as f64;
        let _ = writeln!(svg, r#"<text x="5" y="{}">n{n}</text>"#, y + 14.0);
        let _ = writeln!(
            svg,
            r##"<rect x="{left}" y="{y}" width="{width}" height="{}" fill="#eef5ee"/>"##,
            row - 4.0
        );
        for s in report.steps.iter().filter(|s| s.fault.nodes().contains(&n)) {
            let _ = writeln!(
                svg,
                r##"<rect x="{:.1}" y="{y}" width="{:.1}" height="{}" fill="#d9534f"><title>{}</title></rect>"##,
                x(s.start_ms),
                (x(s.end_ms) - x(s.start_ms)).max(1.0),
                row - 4.0,
                s.fault.name()
            );
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{}" fill="white">{}</text>"#,
                x(s.start_ms) + 2.0,
                y + 13.0,
                s.fault.name()
            );
        }
    }
    // Acknowledged operations per second.
    let seconds = (end_ms / 1000 + 1) as usize;
    let mut per_second = vec![0usize; seconds];
    for op in report
        .history
        .ops
        .iter()
        .filter(|o| o.outcome == Outcome::Ok)
    {
        if let Some(slot) = per_second.get_mut((op.completed_ms / 1000) as usize) {
            *slot += 1;
        }
    }
    let peak = per_second.iter().copied().max().unwrap_or(0).max(1);
    let points: Vec<String> = per_second
        .iter()
        .enumerate()
        .map(|(s, n)| {
            format!(
                "{:.1},{:.1}",
                x(s as u64 * 1000 + 500),
                rate_top + rate_height - rate_height * *n as f64 / peak as f64
            )
        })
        .collect();
    let _ = writeln!(
        svg,
        r#"<text x="5" y="{}">acks/s</text><text x="5" y="{}">max {peak}</text>"#,
        rate_top + 12.0,
        rate_top + 26.0
    );
    let _ = writeln!(
        svg,
        r##"<polyline fill="none" stroke="#337ab7" stroke-width="1.5" points="{}"/>"##,
        points.join(" ")
    );
    // Digest agreement: green where all live stores agree, grey where they differ.
    let y = rate_top + rate_height + 15.0;
    let _ = writeln!(svg, r#"<text x="5" y="{}">digests</text>"#, y + 10.0);
    for s in &report.samples {
        let _ = writeln!(
            svg,
            r#"<rect x="{:.1}" y="{y}" width="3" height="12" fill="{}"/>"#,
            x(s.at_ms),
            if s.agree() { "#5cb85c" } else { "#999" }
        );
    }
    let _ = writeln!(
        svg,
        r#"<line x1="{0:.1}" x2="{0:.1}" y1="5" y2="{1}" stroke="black" stroke-dasharray="4"/><text x="{0:.1}" y="{2}">heal</text>"#,
        x(report.quiet_ms),
        y + 14.0,
        y + 28.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="{}">0 s</text><text x="{}" y="{}" text-anchor="end">{:.0} s</text>"#,
        y + 28.0,
        left + width,
        y + 28.0,
        end_ms as f64 / 1000.0
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Fault;

    fn run(pod: &str, node: &str, first_ms: u64, last_ms: u64) -> Instance {
        Instance {
            pod: pod.into(),
            node: node.into(),
            id: format!("{node}-{first_ms}"),
            first_ms,
            last_ms,
            beats: 1,
        }
    }

    #[test]
    fn a_move_is_timed_from_the_fault_on_the_old_node() {
        let steps = vec![
            Step {
                start_ms: 2_000,
                end_ms: 8_000,
                fault: Fault::Kill { node: 3 },
            },
            Step {
                start_ms: 9_800,
                end_ms: 16_800,
                fault: Fault::Kill { node: 2 },
            },
        ];
        let runs = vec![
            run("a", "n3", 400, 4_000),
            // Restarted on the same node: not a move.
            run("a", "n3", 10_500, 24_300),
            run("b", "n2", 400, 11_900),
            run("b", "n0", 16_400, 21_600),
        ];
        assert_eq!(
            fenced_moves(&runs, &steps),
            vec![FencedMove {
                pod: "b".into(),
                from: "n2".into(),
                to: "n0".into(),
                downtime_ms: 4_500,
                after_fault_ms: Some(6_600),
            }]
        );
    }
}

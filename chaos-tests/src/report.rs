//! A run's report: `report.md` (what was injected, what the workload saw, what the checkers
//! found), `timeline.svg` (faults as bands per node, acknowledged writes per second, digest
//! agreement after the heal) and `history.jsonl` (every operation, for replaying a checker).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use crate::history::Outcome;
use crate::run::RunReport;

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
    if c.sabotage {
        let _ = writeln!(
            out,
            "| self-test | the invariants of checkers 3 and 6 were broken on purpose |"
        );
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

//! Resource usage of this node and its containers, sampled from cgroups and /proc: served as
//! metrics.k8s.io objects (`kubectl top`) by any agent's API, and as Prometheus text on
//! `/metrics` for this node.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// One container's usage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContainerUsage {
    pub name: String,
    /// CPU rate over the last sampling window.
    pub cpu_nanocores: u64,
    pub cpu_seconds_total: f64,
    pub memory_working_set_bytes: u64,
}

/// One pod's usage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PodUsage {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub containers: Vec<ContainerUsage>,
}

/// What one node reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeUsage {
    pub node: String,
    /// When the samples were taken (ms since the epoch).
    pub timestamp_ms: u64,
    pub window_ms: u64,
    pub cpu_nanocores: u64,
    pub memory_working_set_bytes: u64,
    pub pods: Vec<PodUsage>,
}

/// A cumulative CPU counter turned into a rate between two samples.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuRate {
    last: Option<(u64, u64)>,
    nanocores: u64,
}

impl CpuRate {
    /// Feeds a sample (`at_ms`, cumulative CPU ns); returns the rate in nanocores.
    pub fn sample(&mut self, at_ms: u64, cpu_ns: u64) -> u64 {
        if let Some((t, c)) = self.last
            && at_ms > t
            && cpu_ns >= c
        {
            self.nanocores = (cpu_ns - c).saturating_mul(1000) / (at_ms - t);
        }
        self.last = Some((at_ms, cpu_ns));
        self.nanocores
    }
}

/// The host's CPU time in use (ns, all cores, not idle) and memory in use (bytes), from /proc.
pub fn host_usage() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: busy = all − idle − iowait.
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100)
        .max(1) as u64;
    let busy_ns = (total - idle) * (1_000_000_000 / ticks);
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = |key: &str| -> Option<u64> {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let used = kb("MemTotal:")?.saturating_sub(kb("MemAvailable:")?) * 1024;
    Some((busy_ns, used))
}

/// A gauge (a counter when its name ends in `_total`): name, help text, and (labels, value)
/// series.
pub type Gauge<'a> = (&'a str, &'a str, Vec<(String, f64)>);

/// Prometheus text exposition of a node's usage (cAdvisor's metric names).
pub fn prometheus(usage: &NodeUsage, extra: &[Gauge]) -> String {
    let mut out = String::new();
    let label = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"");
    let _ = writeln!(
        out,
        "# HELP container_cpu_usage_seconds_total Cumulative CPU time consumed by the container."
    );
    let _ = writeln!(out, "# TYPE container_cpu_usage_seconds_total counter");
    for pod in &usage.pods {
        for c in &pod.containers {
            let _ = writeln!(
                out,
                "container_cpu_usage_seconds_total{{namespace=\"{}\",pod=\"{}\",container=\"{}\"}} {}",
                label(&pod.namespace),
                label(&pod.name),
                label(&c.name),
                c.cpu_seconds_total
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP container_memory_working_set_bytes Current working set of the container."
    );
    let _ = writeln!(out, "# TYPE container_memory_working_set_bytes gauge");
    for pod in &usage.pods {
        for c in &pod.containers {
            let _ = writeln!(
                out,
                "container_memory_working_set_bytes{{namespace=\"{}\",pod=\"{}\",container=\"{}\"}} {}",
                label(&pod.namespace),
                label(&pod.name),
                label(&c.name),
                c.memory_working_set_bytes
            );
        }
    }
    for (name, help, series) in extra {
        let _ = writeln!(out, "# HELP {name} {help}");
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in series {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
    }
    out
}

/// Rates per container between samples.
#[derive(Debug, Default)]
pub struct Sampler {
    containers: HashMap<String, CpuRate>,
    host: CpuRate,
    last_ms: Option<u64>,
}

impl Sampler {
    /// A container's rate (`key`: runtime id).
    pub fn container(&mut self, key: &str, at_ms: u64, cpu_ns: u64) -> u64 {
        self.containers
            .entry(key.to_owned())
            .or_default()
            .sample(at_ms, cpu_ns)
    }

    pub fn host(&mut self, at_ms: u64, cpu_ns: u64) -> u64 {
        self.host.sample(at_ms, cpu_ns)
    }

    /// Forgets containers not in `live`; returns the window since the previous round.
    pub fn finish_round(&mut self, at_ms: u64, live: &[String]) -> u64 {
        self.containers.retain(|k, _| live.contains(k));
        let window = self.last_ms.map_or(0, |l| at_ms.saturating_sub(l));
        self.last_ms = Some(at_ms);
        window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_rates_come_from_two_samples() {
        let mut rate = CpuRate::default();
        assert_eq!(rate.sample(1_000, 5_000_000_000), 0);
        // 0.5 s of CPU in 1 s: half a core.
        assert_eq!(rate.sample(2_000, 5_500_000_000), 500_000_000);
        // A counter that went backwards (container replaced) keeps the last rate.
        assert_eq!(rate.sample(3_000, 1), 500_000_000);
    }

    #[test]
    fn prometheus_text_has_the_cadvisor_names() {
        let usage = NodeUsage {
            node: "n1".into(),
            pods: vec![PodUsage {
                namespace: "default".into(),
                name: "web".into(),
                uid: "u".into(),
                containers: vec![ContainerUsage {
                    name: "c".into(),
                    cpu_nanocores: 1,
                    cpu_seconds_total: 1.5,
                    memory_working_set_bytes: 4096,
                }],
            }],
            ..NodeUsage::default()
        };
        let text = prometheus(
            &usage,
            &[(
                "shoal_members",
                "Members by state.",
                vec![("state=\"alive\"".into(), 3.0)],
            )],
        );
        assert!(text.contains("container_cpu_usage_seconds_total{namespace=\"default\",pod=\"web\",container=\"c\"} 1.5\n"), "{text}");
        assert!(text.contains("container_memory_working_set_bytes{namespace=\"default\",pod=\"web\",container=\"c\"} 4096\n"));
        assert!(text.contains("shoal_members{state=\"alive\"} 3\n"));
    }
}

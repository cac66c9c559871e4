//! Checker 5's evidence, read from the kernel rather than from any agent's view: the cpu share
//! of every container that runs in an agent's cgroups, sampled through the run.
//!
//! The kubelet sizes a container's `cpu.shares` from its cpu request (1024 per cpu, at least 2:
//! `kubelet/container.rs`), and runc writes it before the container's process is exec'd. So the
//! shares of the containers whose cgroups hold a process that is no longer runc's own are what
//! the node has granted at that instant. While runc places its init process in a fresh cgroup
//! and before it writes the limits, the cgroup has the kernel's default (1024 shares): such a
//! cgroup (every process still named `runc` or `runc:[…]`) has granted nothing yet and is not
//! counted.

use std::path::{Path, PathBuf};

use shoal_agent::runtime::cgroup::{self, Layout};

/// One container cgroup that holds a running process, and its cpu shares.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Granted {
    /// `pod<uid>/<container>` below the agent's scope.
    pub cgroup: String,
    pub shares: u64,
}

/// Where the agent whose runtime scope is `scope` keeps its pods' cpu cgroups.
pub fn scope_dir(layout: Layout, scope: &str) -> PathBuf {
    cgroup::dir(layout, "cpu", &cgroup::scope_path(scope))
}

/// Every container cgroup below `scope_dir` with a started process, and its shares (cgroup
/// v2's `cpu.weight` converted back with runc's formula, exact to within 27 shares). A scope
/// without cgroups yet is an empty list; a cgroup that vanishes while it is read is skipped.
pub fn granted(layout: Layout, scope_dir: &Path) -> Vec<Granted> {
    let mut out = Vec::new();
    let Ok(pods) = std::fs::read_dir(scope_dir) else {
        return out;
    };
    for pod in pods.flatten() {
        let Ok(containers) = std::fs::read_dir(pod.path()) else {
            continue;
        };
        for container in containers.flatten() {
            let dir = container.path();
            if !dir.is_dir() || !started(&dir) {
                continue;
            }
            let shares = match layout {
                Layout::V1 => read_u64(&dir.join("cpu.shares")),
                Layout::V2 => read_u64(&dir.join("cpu.weight")).map(shares_of_weight),
            };
            if let Some(shares) = shares {
                out.push(Granted {
                    cgroup: format!(
                        "{}/{}",
                        pod.file_name().to_string_lossy(),
                        container.file_name().to_string_lossy()
                    ),
                    shares,
                });
            }
        }
    }
    out.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
    out
}

/// Whether a process of the cgroup runs something other than runc (its limits are written).
fn started(dir: &Path) -> bool {
    let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return false;
    };
    procs.lines().any(|pid| {
        std::fs::read_to_string(format!("/proc/{}/comm", pid.trim()))
            .is_ok_and(|comm| !is_runc(comm.trim()))
    })
}

fn is_runc(comm: &str) -> bool {
    comm == "runc" || comm.starts_with("runc:")
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// runc maps shares to cgroup v2's weight as `1 + (shares - 2) × 9999 / 262142`; this is its
/// inverse (rounded up, so a grant is never under-counted by more than the formula loses).
pub fn shares_of_weight(weight: u64) -> u64 {
    let weight = weight.clamp(1, 10_000);
    2 + ((weight - 1) * 262_142).div_ceil(9999)
}

/// The shares a node with `allocatable_millis` of cpu can grant in all: what its containers'
/// requests sum to at most, floored as the kubelet floors each (a sum of floors never exceeds
/// the floor of the sum).
pub fn shares_of_millis(millis: u64) -> u64 {
    millis.saturating_mul(1024) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_is_told_from_the_containers_own_processes() {
        assert!(is_runc("runc"));
        assert!(is_runc("runc:[2:INIT]"));
        assert!(!is_runc("sleep"));
        assert!(!is_runc("sh"));
    }

    #[test]
    fn weights_convert_back_to_at_least_the_shares_runc_converted() {
        for shares in [2u64, 358, 614, 1024, 2048, 262_144] {
            let weight = 1 + (shares - 2) * 9999 / 262_142;
            let back = shares_of_weight(weight);
            assert!(
                back + 27 >= shares && back <= shares + 27,
                "{shares} -> {weight} -> {back}"
            );
        }
        assert_eq!(shares_of_millis(2000), 2048);
        assert_eq!(shares_of_millis(600), 614);
    }
}

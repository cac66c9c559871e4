//! Checker 5's evidence, read from the kernel rather than from any agent's view: the cpu share
//! of every container that runs in an agent's cgroups, sampled through the run.
//!
//! The kubelet sizes a container's `cpu.shares` from its cpu request (1024 per cpu, at least 2:
//! `kubelet/container.rs`), and runc writes it before the container's process is exec'd. So the
//! shares of the containers whose cgroups hold a process that is no longer runc's own are what
//! the node has granted at that instant. While runc places its init process in a fresh cgroup
//! and before it writes the limits, the cgroup has the kernel's default (1024 shares): such a
//! cgroup has granted nothing yet and is not counted. Its processes are all runc's: named
//! `runc` or `runc:[…]` once runc's `nsexec` has named them, and before that `exe` with the
//! command line `runc init` (runc re-executes itself through `/proc/self/exe`, and the kernel
//! names a process after the file it executed; seen in CI: such a cgroup counted as 1024 shares
//! granted, and checker 5 failed on a node that had granted nothing more than its cpu).

use std::path::{Path, PathBuf};

use shoal_agent::runtime::cgroup::{self, Layout};

/// One container cgroup that holds a running process, and its cpu shares.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Granted {
    /// `pod<uid>/<container>` below the agent's scope.
    pub cgroup: String,
    pub shares: u64,
    /// The name (`comm`) of the first of its processes that is not runc's: the evidence that
    /// the container runs, shown in a violation.
    pub process: String,
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
            if !dir.is_dir() {
                continue;
            }
            let Some(process) = started(&dir) else {
                continue;
            };
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
                    process,
                });
            }
        }
    }
    out.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
    out
}

/// The name of a process of the cgroup that runs something other than runc (so its limits are
/// written), if there is one.
fn started(dir: &Path) -> Option<String> {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
    procs.lines().find_map(|pid| {
        let pid = pid.trim();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let comm = comm.trim();
        (!is_runc(comm, &cmdline)).then(|| comm.to_owned())
    })
}

/// Whether a process (its `comm` and its NUL-separated command line) is runc's own: named by
/// runc's `nsexec`, or runc's init before `nsexec` named it (`exe`, from `/proc/self/exe`,
/// running `runc init`; its command line reads empty for a moment while it execs).
fn is_runc(comm: &str, cmdline: &[u8]) -> bool {
    if comm == "runc" || comm.starts_with("runc:") {
        return true;
    }
    let mut args = cmdline.split(|b| *b == 0);
    let argv0 = args.next().unwrap_or_default();
    let runc_init = argv0
        .rsplit(|b| *b == b'/')
        .next()
        .is_some_and(|name| name.starts_with(b"runc"))
        && args.next() == Some(b"init".as_slice());
    runc_init || (comm == "exe" && cmdline.is_empty())
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
        assert!(is_runc("runc", b"runc\0init\0"));
        assert!(is_runc("runc:[2:INIT]", b"runc\0init\0"));
        // runc's init before nsexec names it (what CI's checker 5 once counted as granted).
        assert!(is_runc("exe", b"runc\0init\0"));
        assert!(is_runc("exe", b"/usr/sbin/runc\0init\0"));
        assert!(is_runc("exe", b""));
        assert!(!is_runc("sleep", b"sleep\0infinity\0"));
        assert!(!is_runc("sh", b"sh\0-c\0init\0"));
        assert!(!is_runc("exe", b"/app/exe\0serve\0"));
        assert!(!is_runc("init", b"init\0"));
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

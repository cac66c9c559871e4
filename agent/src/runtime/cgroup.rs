//! The few cgroup files the agent reads or writes itself (runc manages the containers' own
//! cgroups): pod-level limits, OOM kill counters, usage, and removal of a pod's cgroups.
//! Works on cgroup v1 (also the hybrid layout of this machine) and v2.

use std::io;
use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";

/// Which cgroup layout the host uses for resource controllers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Per-controller hierarchies (`/sys/fs/cgroup/memory`, …), possibly beside a unified one.
    V1,
    /// One unified hierarchy.
    V2,
}

impl Layout {
    pub fn detect() -> Self {
        if Path::new(ROOT).join("memory").is_dir() {
            Layout::V1
        } else {
            Layout::V2
        }
    }
}

/// The cgroup path (below every hierarchy's root) of a pod of the runtime instance `scope`.
pub fn pod_path(scope: &str, pod_uid: &str) -> String {
    format!("{}/pod{pod_uid}", scope_path(scope))
}

/// The cgroup path that holds every pod cgroup of the runtime instance `scope`.
pub fn scope_path(scope: &str) -> String {
    format!("/shoal/{scope}")
}

/// The directory of cgroup `path` in `controller`'s hierarchy (v2: the unified one).
pub fn dir(layout: Layout, controller: &str, path: &str) -> PathBuf {
    let path = path.trim_start_matches('/');
    match layout {
        Layout::V1 => Path::new(ROOT).join(controller).join(path),
        Layout::V2 => Path::new(ROOT).join(path),
    }
}

/// Creates the pod's cgroup and caps its memory (the sum of its containers' limits).
pub fn set_pod_memory_limit(layout: Layout, pod_path: &str, bytes: i64) -> io::Result<()> {
    let dir = dir(layout, "memory", pod_path);
    std::fs::create_dir_all(&dir)?;
    match layout {
        Layout::V1 => std::fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string()),
        Layout::V2 => std::fs::write(dir.join("memory.max"), bytes.to_string()),
    }
}

/// Creates the pod's cgroup in the pids hierarchy and caps how many processes (tasks) all its
/// containers together may have (the kubelet's `--pod-max-pids`): a fork bomb stops there.
pub fn set_pod_pids_limit(layout: Layout, pod_path: &str, pids: u64) -> io::Result<()> {
    let dir = dir(layout, "pids", pod_path);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("pids.max"), pids.to_string())
}

/// How many times the kernel's OOM killer killed a process of this cgroup.
pub fn oom_kills(layout: Layout, path: &str) -> u64 {
    let (file, key) = match layout {
        Layout::V1 => ("memory.oom_control", "oom_kill"),
        Layout::V2 => ("memory.events", "oom_kill"),
    };
    std::fs::read_to_string(dir(layout, "memory", path).join(file))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Memory working set (bytes in use minus inactive file cache, as cAdvisor counts it) and
/// CPU time used (ns) by a cgroup, if it exists.
pub fn usage(layout: Layout, path: &str) -> Option<(u64, u64)> {
    let read = |controller: &str, file: &str| {
        std::fs::read_to_string(dir(layout, controller, path).join(file)).ok()
    };
    let stat = |key: &str| -> u64 {
        read("memory", "memory.stat")
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            })
            .unwrap_or(0)
    };
    match layout {
        Layout::V1 => {
            let usage: u64 = read("memory", "memory.usage_in_bytes")?
                .trim()
                .parse()
                .ok()?;
            let memory = usage.saturating_sub(stat("total_inactive_file "));
            let cpu = read("cpuacct", "cpuacct.usage")?.trim().parse().ok()?;
            Some((memory, cpu))
        }
        Layout::V2 => {
            let current: u64 = read("memory", "memory.current")?.trim().parse().ok()?;
            let memory = current.saturating_sub(stat("inactive_file "));
            let cpu_us: u64 = read("cpu", "cpu.stat")?
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())?;
            Some((memory, cpu_us * 1000))
        }
    }
}

/// Removes a cgroup (and empty children) in every hierarchy; missing ones are fine.
pub fn remove(layout: Layout, path: &str) -> io::Result<()> {
    let dirs: Vec<PathBuf> = roots(layout)?
        .into_iter()
        .map(|root| root.join(path.trim_start_matches('/')))
        .collect();
    for dir in dirs {
        remove_tree(&dir)?;
    }
    Ok(())
}

/// Removes one cgroup directory in every hierarchy where it has no children left.
pub fn remove_if_empty(layout: Layout, path: &str) -> io::Result<()> {
    for root in roots(layout)? {
        let _ = std::fs::remove_dir(root.join(path.trim_start_matches('/')));
    }
    Ok(())
}

fn roots(layout: Layout) -> io::Result<Vec<PathBuf>> {
    Ok(match layout {
        Layout::V1 => std::fs::read_dir(ROOT)?
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect(),
        Layout::V2 => vec![PathBuf::from(ROOT)],
    })
}

/// SIGKILLs every process in a cgroup tree (all hierarchies) until none is left or `patience`
/// runs out; returns how many are left. Used when runc's state is gone but processes are not.
pub fn kill_all(layout: Layout, path: &str, patience: std::time::Duration) -> usize {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let mut pids = Vec::new();
        for root in roots(layout).unwrap_or_default() {
            collect_pids(&root.join(path.trim_start_matches('/')), &mut pids);
        }
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() || std::time::Instant::now() > deadline {
            return pids.len();
        }
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn collect_pids(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&entry.path(), pids);
            }
        }
    }
}

/// cgroup directories are removed bottom-up with rmdir (their files cannot be unlinked).
fn remove_tree(dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    for entry in entries.filter_map(Result::ok) {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(io::Error::new(
            err.kind(),
            format!("rmdir {}: {err}", dir.display()),
        )),
        _ => Ok(()),
    }
}

//! What this host offers, read from the kernel, and the well-known node labels.

use std::collections::BTreeMap;

use shoal_gossip::Capacity;

/// Kubernetes' default pod limit per node.
pub const DEFAULT_MAX_PODS: u32 = 110;

/// Raises this process's soft limit on open files to its hard limit (the default soft limit,
/// 1,024, is what a pod flooding the API or the DNS would reach first: each listener caps its
/// connections below it, and accept loops back off on EMFILE). Returns the limit in force.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

/// CPU from the scheduler's view of available cores, memory from `/proc/meminfo`.
pub fn detect_capacity(max_pods: u32) -> std::io::Result<Capacity> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let memory_bytes = parse_mem_total(&meminfo).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "/proc/meminfo has no parsable MemTotal line",
        )
    })?;
    Ok(Capacity {
        cpu_millis: cores * 1000,
        memory_bytes,
        pods: max_pods,
        volume_bytes: None,
    })
}

/// What the built-in provisioner may give out on this node: `configured`, or else the size of
/// the filesystem holding `data_dir` (as the kubelet reports a node's `ephemeral-storage`).
pub fn volume_capacity(
    data_dir: &std::path::Path,
    configured: Option<u64>,
) -> std::io::Result<u64> {
    if let Some(bytes) = configured {
        return Ok(bytes);
    }
    std::fs::create_dir_all(data_dir)?;
    let fs = nix::sys::statvfs::statvfs(data_dir).map_err(std::io::Error::from)?;
    Ok(fs.blocks().saturating_mul(fs.fragment_size()))
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line.split_whitespace().skip(1);
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// Host facts for the Node's `status.nodeInfo`.
pub fn node_info(fallback_machine_id: &str) -> shoal_gossip::NodeInfo {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let os_image = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| "Linux".into());
    let machine_id = Some(read("/etc/machine-id"))
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| fallback_machine_id.to_owned());
    shoal_gossip::NodeInfo {
        kernel_version: read("/proc/sys/kernel/osrelease"),
        os_image,
        machine_id,
        boot_id: read("/proc/sys/kernel/random/boot_id"),
        started_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        container_runtime: String::new(),
    }
}

/// `kubernetes.io/hostname`, `kubernetes.io/os` and `kubernetes.io/arch`, as kubelets set them.
pub fn well_known_labels(node_name: &str) -> BTreeMap<String, String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), node_name.to_owned()),
        (
            "kubernetes.io/os".to_owned(),
            std::env::consts::OS.to_owned(),
        ),
        ("kubernetes.io/arch".to_owned(), arch.to_owned()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total() {
        assert_eq!(
            parse_mem_total("MemFree: 1 kB\nMemTotal:       24576 kB\n"),
            Some(24576 * 1024)
        );
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: x kB\n"), None);
    }

    #[test]
    fn detects_this_host() {
        let cap = detect_capacity(DEFAULT_MAX_PODS).unwrap();
        assert!(cap.cpu_millis >= 1000 && cap.memory_bytes > 0);
    }
}

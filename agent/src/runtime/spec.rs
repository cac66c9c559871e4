//! A container start as data ([`ContainerRequest`]: what the kubelet asks for, mounts named by
//! their sources, not by host paths) and the OCI runtime spec (`config.json`) built from it
//! once the runtime has resolved those sources ([`Resolved`]). Pure: no file is read or
//! written here.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::HostPathType;

/// Where a container mount comes from, as the kubelet asks for it; the runtime resolves it to
/// a host path when it starts the container ([`Resolved::mounts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSource {
    /// A file of the pod's sandbox: `hosts`, `hostname` or `resolv.conf`.
    SandboxFile(&'static str),
    /// The pod's volume `volume` (its directory), or `sub_path` beneath it: opened without
    /// following a symlink out and bind-mounted for this container alone (CVE-2017-1002101).
    Volume {
        volume: String,
        sub_path: Option<String>,
    },
    /// A `hostPath`, or `sub_path` beneath it: checked against its type and the node's policy
    /// (`--host-path-allow`) on the path it resolves to, and bind-mounted through the very
    /// descriptor that was checked.
    HostPath {
        path: String,
        kind: HostPathType,
        sub_path: Option<String>,
    },
    /// A volume the built-in provisioner made (`volume`, its PersistentVolume's name), or
    /// `sub_path` beneath it: its directory under the node's volumes directory, opened beneath
    /// it without following a symlink, and bind-mounted for this container alone.
    Persistent {
        volume: String,
        sub_path: Option<String>,
    },
    /// The attempt's termination message file (`terminationMessagePath`): made empty and
    /// world-writable beside its log, read when the attempt has exited.
    TerminationLog,
}

/// A mount the kubelet asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub source: MountSource,
    pub destination: String,
    pub readonly: bool,
    /// Read-only in every submount too (`rro`, mount_setattr(2)).
    pub recursive_readonly: bool,
    /// The field it comes from (`app.volumeMounts[0]`), which errors name.
    pub field: String,
}

/// A bind mount into the container, resolved to a host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub source: PathBuf,
    pub destination: String,
    pub readonly: bool,
    /// Read-only in every submount too (`rro`, mount_setattr(2)).
    pub recursive_readonly: bool,
}

/// Resource limits of a container (cgroup settings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: Option<i64>,
    /// cpu.shares from the cpu request (Kubernetes: millicores × 1024 / 1000, at least 2).
    pub cpu_shares: u64,
    /// CFS quota in µs per `cpu_period_us`, from the cpu limit.
    pub cpu_quota_us: Option<i64>,
    pub cpu_period_us: u64,
    pub pids: Option<i64>,
}

/// Everything the runtime needs to create one container; the kubelet resolves it from the
/// pod, the image and the node.
#[derive(Debug, Clone)]
pub struct ContainerRequest {
    /// Runtime-wide unique id.
    pub id: String,
    pub hostname: String,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub uid: u32,
    pub gid: u32,
    pub readonly_rootfs: bool,
    pub no_new_privileges: bool,
    /// Capabilities the process keeps (bounding, effective, permitted).
    pub capabilities: Vec<String>,
    pub limits: Limits,
    pub mounts: Vec<Mount>,
    /// Image layer directories, lowest first (overlayfs lower dirs).
    pub layers: Vec<PathBuf>,
    pub log_path: PathBuf,
    pub seccomp: Seccomp,
    /// Groups the process also belongs to (`supplementalGroups`, `fsGroup`).
    pub additional_gids: Vec<u32>,
    /// Namespaced sysctls (`securityContext.sysctls`, the safe set).
    pub sysctls: std::collections::BTreeMap<String, String>,
    /// Share the node's PID / IPC namespace (`hostPID`, `hostIPC`; nodes started with
    /// `--allow-privileged` only).
    pub host_pid: bool,
    pub host_ipc: bool,
    /// Share the node's network namespace (`hostNetwork`; `--allow-privileged` nodes only).
    pub host_network: bool,
    /// `securityContext.privileged` (nodes started with `--allow-privileged` only): every
    /// capability, no seccomp filter, no masked or read-only /proc paths, a writable /sys,
    /// the host's devices.
    pub privileged: bool,
    /// The pod's partition policy is `fenced`: when its node's run lease on the pod ends (as
    /// the kubelet knew it when it decided the start; `CLOCK_MONOTONIC` ms,
    /// `runtime::lease::monotonic_ms`). The shim does not start the container at or after this
    /// deadline and kills it then, unless a later renewal of the fence lease moves it; it also
    /// kills it once the agent stops renewing the lease (see `runtime::lease`).
    pub fence_deadline_ms: Option<u64>,
    /// The process's stdin stays open for attaches (see `runtime::shim`), `stdin_once`: until
    /// the first attach ends; `tty`: on a terminal (`process.terminal`).
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
    /// `terminationMessagePolicy: FallbackToLogsOnError`: a failed container that wrote no
    /// termination message gets the end of its log as one.
    pub termination_message_from_logs: bool,
}

/// The capabilities of [`ALL_CAPABILITIES`] in this process's bounding set (what the node
/// itself may hold, as Docker computes a privileged container's set).
pub fn bounding_capabilities() -> Vec<String> {
    let mask = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapBnd:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .unwrap_or(0);
    ALL_CAPABILITIES
        .iter()
        .enumerate()
        .filter(|(bit, _)| mask & (1 << bit) != 0)
        .map(|(_, cap)| cap.to_string())
        .collect()
}

/// Every capability the kernel defines, in the kernel's numbering (bit `i` is the `i`-th).
pub const ALL_CAPABILITIES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// Docker's and containerd's default capability set.
pub const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Which seccomp filter a container runs under (`securityContext.seccompProfile`).
#[derive(Debug, Clone, PartialEq)]
pub enum Seccomp {
    /// Shoal's RuntimeDefault ([`super::seccomp`]): containerd's default allow-list.
    RuntimeDefault,
    /// No filter (asked for explicitly).
    Unconfined,
    /// A node-local profile: `localhostProfile`, relative to `<data-dir>/seccomp/`.
    Localhost(String),
}

/// What the runtime resolved of a [`ContainerRequest`] before it builds the spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// [`ContainerRequest::mounts`], in order, as host paths.
    pub mounts: Vec<BindMount>,
    /// The pod's network namespace (shared by its containers).
    pub netns: PathBuf,
    /// cgroup path below the cgroup root(s), e.g. `/shoal/pod<uid>/<id>`.
    pub cgroup_path: String,
    /// The [`Seccomp::Localhost`] profile, read and checked to be an OCI `linux.seccomp`
    /// object.
    pub seccomp_profile: Option<Value>,
}

/// The container's `config.json`.
pub fn runtime_spec(request: &ContainerRequest, resolved: &Resolved) -> Value {
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
    ];
    if request.privileged {
        // The host's devices instead of a private /dev, and /sys writable.
        mounts[1] = json!({"destination": "/dev", "type": "bind", "source": "/dev", "options": ["rbind", "rslave"]});
        mounts[5] = json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev"]});
    }
    for mount in &resolved.mounts {
        let mut options = vec!["rbind", "rprivate"];
        if mount.readonly {
            options.push("ro");
        }
        if mount.recursive_readonly {
            options.push("rro");
        }
        mounts.push(json!({
            "destination": mount.destination,
            "type": "bind",
            "source": mount.source,
            "options": options,
        }));
    }
    let mut resources = json!({
        "devices": [{"allow": request.privileged, "access": "rwm"}],
        "cpu": {"shares": request.limits.cpu_shares, "period": request.limits.cpu_period_us},
    });
    if let Some(quota) = request.limits.cpu_quota_us {
        resources["cpu"]["quota"] = json!(quota);
    }
    if let Some(memory) = request.limits.memory_bytes {
        // No swap: the limit is the limit (Kubernetes runs without swap).
        resources["memory"] = json!({"limit": memory, "swap": memory});
    }
    if let Some(pids) = request.limits.pids {
        resources["pids"] = json!({"limit": pids});
    }
    let caps = &request.capabilities;
    let mut namespaces = vec![
        json!({"type": "uts"}),
        json!({"type": "mount"}),
        // The container sees its own cgroup as the root of its cgroup tree.
        json!({"type": "cgroup"}),
    ];
    if !request.host_network {
        namespaces.push(json!({"type": "network", "path": resolved.netns}));
    }
    if !request.host_pid {
        namespaces.push(json!({"type": "pid"}));
    }
    if !request.host_ipc {
        namespaces.push(json!({"type": "ipc"}));
    }
    let mut user = json!({"uid": request.uid, "gid": request.gid});
    if !request.additional_gids.is_empty() {
        user["additionalGids"] = json!(request.additional_gids);
    }
    let mut spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": request.tty,
            "user": user,
            "args": request.args,
            "env": request.env,
            "cwd": request.working_dir,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": request.no_new_privileges,
        },
        "root": {"path": "rootfs", "readonly": request.readonly_rootfs},
        "hostname": request.hostname,
        "mounts": mounts,
        "linux": {
            "cgroupsPath": resolved.cgroup_path,
            "resources": resources,
            "namespaces": namespaces,
            "sysctl": request.sysctls,
            "maskedPaths": [
                "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                "/proc/scsi",
            ],
            "readonlyPaths": [
                "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
            ],
        },
    });
    if request.privileged {
        spec["linux"]["maskedPaths"] = json!([]);
        spec["linux"]["readonlyPaths"] = json!([]);
    }
    match &request.seccomp {
        Seccomp::RuntimeDefault => {
            spec["linux"]["seccomp"] = super::seccomp::runtime_default(caps);
        }
        Seccomp::Localhost(_) => {
            spec["linux"]["seccomp"] = resolved.seccomp_profile.clone().unwrap_or(Value::Null)
        }
        Seccomp::Unconfined => {}
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ContainerRequest {
        ContainerRequest {
            id: "c1".into(),
            hostname: "web-0".into(),
            args: vec!["sh".into(), "-c".into(), "echo hi".into()],
            env: vec!["PATH=/bin".into()],
            working_dir: "/".into(),
            uid: 1000,
            gid: 1000,
            readonly_rootfs: true,
            no_new_privileges: true,
            capabilities: DEFAULT_CAPABILITIES.iter().map(|c| c.to_string()).collect(),
            limits: Limits {
                memory_bytes: Some(64 << 20),
                cpu_shares: 512,
                cpu_quota_us: Some(50_000),
                cpu_period_us: 100_000,
                pids: Some(128),
            },
            mounts: vec![Mount {
                source: MountSource::Volume {
                    volume: "cache".into(),
                    sub_path: None,
                },
                destination: "/cache".into(),
                readonly: false,
                recursive_readonly: false,
                field: "c.volumeMounts[0]".into(),
            }],
            layers: vec![],
            log_path: "/data/pods/u/logs/c/0.log".into(),
            seccomp: Seccomp::RuntimeDefault,
            additional_gids: vec![2000],
            sysctls: [("net.ipv4.tcp_syncookies".to_owned(), "1".to_owned())].into(),
            host_pid: false,
            host_ipc: false,
            host_network: false,
            privileged: false,
            fence_deadline_ms: None,
            stdin: false,
            stdin_once: false,
            termination_message_from_logs: false,
            tty: false,
        }
    }

    fn resolved() -> Resolved {
        Resolved {
            mounts: vec![BindMount {
                source: "/data/pods/u/volumes/cache".into(),
                destination: "/cache".into(),
                readonly: false,
                recursive_readonly: false,
            }],
            netns: "/run/netns/shoal-u".into(),
            cgroup_path: "/shoal/podu/c1".into(),
            seccomp_profile: None,
        }
    }

    #[test]
    fn the_spec_is_a_valid_oci_runtime_spec() {
        let value = runtime_spec(&request(), &resolved());
        let spec: oci_spec::runtime::Spec = serde_json::from_value(value.clone()).unwrap();
        let process = spec.process().as_ref().unwrap();
        assert_eq!(process.user().uid(), 1000);
        assert_eq!(process.no_new_privileges(), Some(true));
        assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
        let linux = spec.linux().as_ref().unwrap();
        let memory = linux
            .resources()
            .as_ref()
            .unwrap()
            .memory()
            .as_ref()
            .unwrap();
        assert_eq!(memory.limit(), Some(64 << 20));
        assert_eq!(
            value["linux"]["namespaces"][3]["path"],
            "/run/netns/shoal-u"
        );
        let kinds: Vec<&str> = linux
            .namespaces()
            .as_ref()
            .unwrap()
            .iter()
            .map(|n| match n.typ() {
                oci_spec::runtime::LinuxNamespaceType::Cgroup => "cgroup",
                oci_spec::runtime::LinuxNamespaceType::Pid => "pid",
                oci_spec::runtime::LinuxNamespaceType::Ipc => "ipc",
                _ => "other",
            })
            .collect();
        assert!(kinds.contains(&"cgroup") && kinds.contains(&"pid") && kinds.contains(&"ipc"));
        assert_eq!(
            process.user().additional_gids().as_deref(),
            Some(&[2000][..])
        );
        assert_eq!(value["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(value["linux"]["sysctl"]["net.ipv4.tcp_syncookies"], "1");
        assert_eq!(value["mounts"][6]["destination"], "/cache");
        assert_eq!(value["linux"]["resources"]["pids"]["limit"], 128);
    }

    #[test]
    fn no_limits_means_no_cgroup_caps() {
        let mut r = request();
        r.limits = Limits {
            cpu_shares: 2,
            cpu_period_us: 100_000,
            ..Limits::default()
        };
        let value = runtime_spec(&r, &resolved());
        assert!(value["linux"]["resources"].get("memory").is_none());
        assert!(value["linux"]["resources"]["cpu"].get("quota").is_none());
    }
}

//! Running containers on this node (DESIGN.md §8) with a real OCI runtime: `runc`, driven
//! through one `shoal shim` per container ([`shim`]). The runtime is low-level on purpose
//! (create sandbox, start, signal, remove, list): what to run and when is the kubelet's
//! decision ([`crate::kubelet`]).
//!
//! Layout under `<data-dir>/pods/<pod uid>/`:
//! - `sandbox.json`: the pod's identity and network namespace;
//! - `etc/`: the pod's `hosts`, `hostname` and `resolv.conf`, bind-mounted into containers;
//! - `volumes/<name>/`: emptyDir and configMap volumes;
//! - `containers/<name>.<attempt>/`: a bundle (`config.json`, overlay `rootfs`, `upper`,
//!   `work`), `meta.json`, and the shim's state files (`started.json`, `exit.json`);
//! - `logs/<name>/<attempt>.log`: container output in the CRI log format.
//!
//! Every container and pod sandbox lives under those directories, runc's root
//! `<data-dir>/runc`, the `shoal-<scope>-<uid>` network namespace and the
//! `/shoal/<scope>/pod<uid>` cgroup (scope: a hash of the data dir), so
//! [`Runtime::remove_sandbox`] and [`Runtime::reset`] can leave nothing behind.

pub mod cgroup;
mod container;
pub mod exec;
pub mod lease;
mod mounts;
pub mod persistent;
mod sandbox;
pub mod seccomp;
pub mod shim;
pub mod spec;

use std::collections::BTreeMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::beneath::{Resolve, Root};
pub use exec::ExecProcess;
pub use shim::{Exited, Started};
pub use spec::{BindMount, ContainerRequest, Limits, Mount, MountSource};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("no OCI runtime: {0} (install runc: apt-get install -y runc)")]
    NoRuntime(String),
    #[error("{what} {value:?} is not a safe identifier (it would become a host path)")]
    InvalidId { what: &'static str, value: String },
    #[error("hostPath {path:?} {reason}")]
    HostPath { path: String, reason: String },
    #[error("volume {volume}: subPath {sub_path:?}: {reason}")]
    SubPath {
        volume: String,
        sub_path: String,
        reason: String,
    },
    #[error("pod network: {0}")]
    Network(#[from] shoal_net::NetError),
    /// A mount of a container request could not be made (`field` names it, e.g.
    /// `app.volumeMounts[0]`).
    #[error("{field}: {source}")]
    Mount {
        field: String,
        source: Box<RuntimeError>,
    },
    #[error("seccomp profile {path:?}: {reason}")]
    Seccomp { path: String, reason: String },
    /// A process run in a container (a probe, a hook) could not run or did not end in time.
    #[error("exec in container {container}: {message}")]
    Exec { container: String, message: String },
}

impl RuntimeError {
    /// Whether the error is the request's (a mount or profile the pod names that cannot be
    /// made: Kubernetes' `CreateContainerConfigError`) rather than the node's.
    pub fn is_config_error(&self) -> bool {
        matches!(self, Self::Mount { .. } | Self::Seccomp { .. })
    }
}

pub use shoal_model::node_inputs::HostPathType;

/// Which host paths pods may mount with `hostPath` (`--host-path-allow`): below one of
/// `allow` (any path when empty), never below one of `deny` (`--host-path-deny`), and never
/// the agent's own data dir, anything in it, or anything containing it; nor a `protected` file
/// or anything containing it. Checked on the path as resolved on the host, after symlinks,
/// whatever the API admitted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPathPolicy {
    pub allow: Vec<PathBuf>,
    pub deny: Vec<PathBuf>,
    /// The agent's secrets outside its data dir, as resolved at its start: the cluster secret
    /// (from which the node CA's key and the admin token derive: a pod that read it could
    /// mint node certificates) and the registry credentials it was given.
    pub protected: Vec<PathBuf>,
}

pub use shoal_core::pod::observed::is_safe_id;

/// Refuses a pod uid or a name (container, volume: DNS-1123 labels) that is not one safe path
/// component, before it is joined into a host path.
fn check_id(what: &'static str, value: &str) -> Result<(), RuntimeError> {
    let ok = match what {
        "pod uid" => is_safe_id(value),
        _ => shoal_state::labels::check_dns_label(value).is_ok(),
    };
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::InvalidId {
            what,
            value: value.to_owned(),
        })
    }
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A pod's sandbox: what its containers share.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxSpec {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub hostname: String,
    /// The pod's memory cap (sum of its containers' limits, when all have one).
    pub memory_limit_bytes: Option<i64>,
    /// The most processes the pod's containers may run together (`--pod-pids-limit`).
    #[serde(default)]
    pub pids_limit: Option<u64>,
    /// `hostNetwork`: the pod shares the node's network namespace.
    #[serde(default)]
    pub host_network: bool,
    /// How the pod resolves names (its resolv.conf).
    #[serde(default)]
    pub dns: shoal_net::dns::PodDns,
    /// The pod's cpu and memory requests, recorded so node admission keeps counting a pod
    /// that still runs here after its object was deleted or bound elsewhere.
    #[serde(default)]
    pub cpu_request_millis: u64,
    #[serde(default)]
    pub memory_request_bytes: u64,
}

pub use shoal_core::pod::observed::{ContainerMeta, ObservedContainer, ObservedState};

/// One pod sandbox found on disk, with its containers.
#[derive(Debug, Clone)]
pub struct ObservedPod {
    pub sandbox: SandboxSpec,
    pub containers: Vec<ObservedContainer>,
    /// The pod's network as recorded when its sandbox was made (`None`: loopback only, host
    /// network, or not made yet).
    pub network: Option<shoal_net::PodNetwork>,
}

impl ObservedPod {
    /// The latest attempt of container `name`, whatever its state.
    pub fn latest(&self, name: &str) -> Option<&ObservedContainer> {
        self.containers
            .iter()
            .filter(|c| c.meta.name == name)
            .max_by_key(|c| c.meta.attempt)
    }

    /// The latest attempt of container `name` if it is running.
    pub fn running(&self, name: &str) -> Option<&ObservedContainer> {
        self.latest(name)
            .filter(|c| matches!(c.state, ObservedState::Running(_)))
    }
}

/// The container runtime as the kubelet drives it, shaped as Kubernetes' CRI: pod sandboxes
/// (run, status, remove), containers (one start from a request built as data, signals,
/// status), stats, and the paths the kubelet names (each container's log, its cgroup). The
/// runc and shim runtime ([`Runtime`]) is the product's; the chaos tests' simulators have a
/// simulated one. Streaming (exec, attach, port-forward) is shaped for a process-based
/// runtime: the runtime hands back a process to spawn or a socket, and the kubelet relays it.
pub trait ContainerRuntime: Send + Sync {
    /// The runtime's name and version (`runc://1.1.5`).
    fn version(&self) -> String;
    /// Makes the pod's sandbox if it is missing (CRI's RunPodSandbox): its directory, cgroup,
    /// network namespace and address, and its `/etc` files. Idempotent.
    fn ensure_sandbox(&self, sandbox: &SandboxSpec) -> Result<(), RuntimeError>;
    /// The pod's network as its sandbox recorded it (`None`: loopback only, host network, or
    /// no sandbox).
    fn pod_network(&self, uid: &str) -> Option<shoal_net::PodNetwork>;
    /// Removes the pod's sandbox and everything in it (its containers must have exited).
    fn remove_sandbox(&self, uid: &str) -> Result<(), RuntimeError>;
    /// The pod's volume `name`, made if missing, opened as a root that nothing resolves out of.
    fn ensure_volume(&self, uid: &str, name: &str) -> Result<Root, RuntimeError>;
    /// [`ContainerRuntime::ensure_volume`] backed by memory (`emptyDir.medium: Memory`): a
    /// tmpfs of `size_bytes` (the kernel's default without), mounted once.
    fn ensure_memory_volume(
        &self,
        uid: &str,
        name: &str,
        size_bytes: Option<u64>,
    ) -> Result<Root, RuntimeError>;
    /// The bytes pod `uid`'s volume `name` holds ([`persistent::du`], at most `max_entries`
    /// looked at); `None` if it has no such volume here.
    fn volume_usage(&self, uid: &str, name: &str, max_entries: usize) -> Option<u64>;
    /// The bytes the provisioned volume `name` holds ([`persistent::usage`]).
    fn persistent_volume_usage(&self, name: &str, max_entries: usize) -> Option<u64>;
    /// Where one container attempt's log is written.
    fn log_path(&self, uid: &str, name: &str, attempt: u32) -> PathBuf;
    /// The cgroup of container `runtime_id` of pod `uid`.
    fn container_cgroup(&self, uid: &str, runtime_id: &str) -> String;
    /// Creates and starts a container of the pod's sandbox (CRI's CreateContainer and
    /// StartContainer in one call): the request's mounts and profile are resolved here.
    fn start_container(
        &self,
        pod_uid: &str,
        meta: &ContainerMeta,
        request: &ContainerRequest,
    ) -> Result<(), RuntimeError>;
    /// Sends `signal` (`TERM`, `KILL`) to the container's process.
    fn signal(&self, meta: &ContainerMeta, signal: &str) -> Result<(), RuntimeError>;
    /// Every sandbox and its containers, as they are now.
    fn list(&self) -> Vec<ObservedPod>;
    /// A running container's memory working set and cpu time (ns).
    fn usage(&self, meta: &ContainerMeta) -> Option<(u64, u64)>;
    /// One pod's sandbox and containers as they are now (`None`: no sandbox here).
    fn pod(&self, uid: &str) -> Option<ObservedPod> {
        self.list().into_iter().find(|p| p.sandbox.uid == uid)
    }
    /// Removes one exited container attempt (CRI's RemoveContainer); its log stays.
    fn remove_container(&self, uid: &str, name: &str, attempt: u32) -> Result<(), RuntimeError>;
    /// Whether a pod's recorded network is still this node's (a pod numbered from an address
    /// block the node lost is made again).
    fn network_is_current(&self, network: &shoal_net::PodNetwork) -> bool;
    /// The pod's network namespace, which probes and port-forward connect from (not used for
    /// host-network pods).
    fn netns_path(&self, uid: &str) -> PathBuf;
    /// Renews pod `uid`'s fence lease: its fenced containers may run until `deadline_ms`
    /// (monotonic), and die once renewals stop ([`lease`]). `NotFound`: no sandbox yet.
    fn renew_fence_lease(&self, uid: &str, counter: u64, deadline_ms: u64) -> io::Result<()>;
    /// CRI's ExecSync: runs `command` in a running container (probes, hooks), returns its
    /// exit code and the first KiB of its output, and kills it after `timeout`.
    fn exec_sync(
        &self,
        meta: &ContainerMeta,
        command: &[String],
        timeout: Duration,
    ) -> Result<(i32, String), RuntimeError>;
    /// CRI's Exec: `command` ready to run in the container of pod `uid`, with a terminal of
    /// the given size (`Some(None)`: size not known) or without one.
    fn exec_stream(
        &self,
        uid: &str,
        meta: &ContainerMeta,
        command: &[String],
        terminal: Option<Option<(u16, u16)>>,
    ) -> Result<ExecProcess, RuntimeError>;
    /// CRI's Attach, input side: a connection that carries the client's session messages
    /// (stdin, resizes) to a container made with stdin or a tty.
    fn attach_input(
        &self,
        uid: &str,
        meta: &ContainerMeta,
    ) -> io::Result<std::os::unix::net::UnixStream>;
}

impl ContainerRuntime for Runtime {
    fn version(&self) -> String {
        self.runtime_version()
    }
    fn ensure_sandbox(&self, sandbox: &SandboxSpec) -> Result<(), RuntimeError> {
        Runtime::ensure_sandbox(self, sandbox)
    }
    fn pod_network(&self, uid: &str) -> Option<shoal_net::PodNetwork> {
        Runtime::pod_network(self, uid)
    }
    fn remove_sandbox(&self, uid: &str) -> Result<(), RuntimeError> {
        Runtime::remove_sandbox(self, uid)
    }
    fn ensure_volume(&self, uid: &str, name: &str) -> Result<Root, RuntimeError> {
        Runtime::ensure_volume(self, uid, name)
    }
    fn ensure_memory_volume(
        &self,
        uid: &str,
        name: &str,
        size_bytes: Option<u64>,
    ) -> Result<Root, RuntimeError> {
        Runtime::ensure_memory_volume(self, uid, name, size_bytes)
    }
    fn volume_usage(&self, uid: &str, name: &str, max_entries: usize) -> Option<u64> {
        persistent::du(&self.volume_dir(uid, name).ok()?, max_entries)
    }
    fn persistent_volume_usage(&self, name: &str, max_entries: usize) -> Option<u64> {
        persistent::usage(&self.data_dir, name, max_entries)
    }
    fn log_path(&self, uid: &str, name: &str, attempt: u32) -> PathBuf {
        Runtime::log_path(self, uid, name, attempt)
    }
    fn container_cgroup(&self, uid: &str, runtime_id: &str) -> String {
        format!("{}/{runtime_id}", self.pod_cgroup(uid))
    }
    fn start_container(
        &self,
        pod_uid: &str,
        meta: &ContainerMeta,
        request: &ContainerRequest,
    ) -> Result<(), RuntimeError> {
        Runtime::start_container(self, pod_uid, meta, request)
    }
    fn signal(&self, meta: &ContainerMeta, signal: &str) -> Result<(), RuntimeError> {
        Runtime::signal(self, meta, signal)
    }
    fn list(&self) -> Vec<ObservedPod> {
        Runtime::list(self)
    }
    fn usage(&self, meta: &ContainerMeta) -> Option<(u64, u64)> {
        Runtime::usage(self, meta)
    }
    fn pod(&self, uid: &str) -> Option<ObservedPod> {
        Runtime::observe_pod(self, uid)
    }
    fn remove_container(&self, uid: &str, name: &str, attempt: u32) -> Result<(), RuntimeError> {
        Runtime::remove_container(self, uid, name, attempt)
    }
    fn network_is_current(&self, network: &shoal_net::PodNetwork) -> bool {
        Runtime::network_is_current(self, network)
    }
    fn netns_path(&self, uid: &str) -> PathBuf {
        Runtime::netns_path(self, uid)
    }
    fn renew_fence_lease(&self, uid: &str, counter: u64, deadline_ms: u64) -> io::Result<()> {
        lease::renew(&self.fence_lease_path(uid), counter, deadline_ms)
    }
    fn exec_sync(
        &self,
        meta: &ContainerMeta,
        command: &[String],
        timeout: Duration,
    ) -> Result<(i32, String), RuntimeError> {
        Runtime::exec_sync(self, meta, command, timeout)
    }
    fn exec_stream(
        &self,
        uid: &str,
        meta: &ContainerMeta,
        command: &[String],
        terminal: Option<Option<(u16, u16)>>,
    ) -> Result<ExecProcess, RuntimeError> {
        Runtime::exec_stream(self, uid, meta, command, terminal)
    }
    fn attach_input(
        &self,
        uid: &str,
        meta: &ContainerMeta,
    ) -> io::Result<std::os::unix::net::UnixStream> {
        Runtime::attach_input(self, uid, meta)
    }
}

/// The runc-backed runtime of one agent.
#[derive(Debug, Clone)]
pub struct Runtime {
    runc: PathBuf,
    runc_root: PathBuf,
    /// The agent's data dir (canonical): never mountable by a pod.
    data_dir: PathBuf,
    pods_dir: PathBuf,
    /// Node-local seccomp profiles (`seccompProfile.localhostProfile` is a path below it).
    seccomp_dir: PathBuf,
    shoal_binary: PathBuf,
    layout: cgroup::Layout,
    log_max_bytes: u64,
    /// Names this runtime instance in host-wide namespaces (cgroups, network namespaces):
    /// derived from the data dir, so several agents on one host (tests, labs) never share a
    /// pod's cgroup or netns even for the same pod uid, and `shoal reset` finds the same names.
    scope: String,
    /// Gives each pod sandbox its interface and address (loopback only by default).
    network: std::sync::Arc<dyn shoal_net::PodNetworkPlugin>,
    /// The cluster DNS domain pods search (`--cluster-domain`).
    cluster_domain: String,
    /// Fenced containers die this long after the agent last renewed the fence lease
    /// ([`lease`]); `None`: they run without one (a runtime used without an agent).
    fence_timeout: Option<Duration>,
    /// Which host paths `hostPath` mounts may name (`--host-path-allow`).
    host_paths: HostPathPolicy,
}

fn run(command: &mut Command) -> Result<(), RuntimeError> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|err| RuntimeError::Command {
            command: format!("{command:?}"),
            message: err.to_string(),
        })?;
    if !output.status.success() {
        return Err(RuntimeError::Command {
            command: format!("{command:?}"),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn is_mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let path = path.to_string_lossy();
    text.lines()
        .any(|l| l.split(' ').nth(4) == Some(path.as_ref()))
}

fn unmount(path: &Path) -> Result<(), RuntimeError> {
    if !is_mounted(path) {
        return Ok(());
    }
    nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).map_err(|e| RuntimeError::Io {
        path: path.to_owned(),
        source: io::Error::from(e),
    })
}

/// The scope of the runtime whose (canonical) data dir is `data_dir`: the name of its
/// host-wide objects (`/shoal/<scope>/pod<uid>` cgroups, network namespaces).
pub fn scope_of(data_dir: &Path) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(data_dir.as_os_str().as_bytes())[..4])
}

impl Runtime {
    /// A runtime storing its state under `data_dir`, using `runc` from PATH (or `SHOAL_RUNC`).
    pub fn new(data_dir: &Path) -> Result<Self, RuntimeError> {
        let runc = std::env::var_os("SHOAL_RUNC")
            .map(PathBuf::from)
            .or_else(|| {
                [
                    "/usr/sbin/runc",
                    "/usr/bin/runc",
                    "/usr/local/sbin/runc",
                    "/usr/local/bin/runc",
                ]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.exists())
            })
            .ok_or_else(|| RuntimeError::NoRuntime("runc is not installed".into()))?;
        let shoal_binary = std::env::current_exe().map_err(io_at(Path::new("/proc/self/exe")))?;
        // Bundles, mounts and runc's state are named by absolute paths (a relative data dir
        // would break every one of them and the cleanup that matches mounts by path).
        std::fs::create_dir_all(data_dir).map_err(io_at(data_dir))?;
        let data_dir = &std::fs::canonicalize(data_dir).map_err(io_at(data_dir))?;
        let scope = scope_of(data_dir);
        let runtime = Self {
            scope,
            runc,
            runc_root: data_dir.join("runc"),
            data_dir: data_dir.clone(),
            pods_dir: crate::paths::pods(data_dir),
            seccomp_dir: data_dir.join("seccomp"),
            shoal_binary,
            layout: cgroup::Layout::detect(),
            log_max_bytes: 10 << 20,
            network: std::sync::Arc::new(shoal_net::LoopbackOnly),
            cluster_domain: "cluster.local".to_owned(),
            fence_timeout: None,
            host_paths: HostPathPolicy::default(),
        };
        for dir in [&runtime.runc_root, &runtime.pods_dir] {
            std::fs::create_dir_all(dir).map_err(io_at(dir))?;
        }
        Ok(runtime)
    }

    /// Fenced containers hold their pod's fence lease ([`lease`]) with this timeout: the
    /// kubelet renews [`Self::fence_lease_path`] of each fenced pod it may run, their shims
    /// kill them once it lapses.
    pub fn with_fence_timeout(mut self, timeout: Duration) -> Self {
        self.fence_timeout = Some(timeout);
        self
    }

    /// The fence lease file of pod `uid` (in its pod directory), which the kubelet renews
    /// while the pod may run here (checked ids only).
    pub fn fence_lease_path(&self, uid: &str) -> PathBuf {
        self.pod_dir(uid).join(lease::FILE)
    }

    /// `hostPath` mounts may name only what `policy` allows (default: anything outside the
    /// agent's data dir).
    pub fn with_host_paths(mut self, policy: HostPathPolicy) -> Self {
        self.host_paths = policy;
        self
    }

    /// Pods get their network from `plugin` (default: loopback only).
    pub fn with_network(mut self, plugin: std::sync::Arc<dyn shoal_net::PodNetworkPlugin>) -> Self {
        self.network = plugin;
        self
    }

    /// The DNS domain pods' resolv.conf searches.
    pub fn with_cluster_domain(mut self, domain: &str) -> Self {
        self.cluster_domain = domain.to_owned();
        self
    }

    /// Whether a pod's recorded network is still this node's (see
    /// [`shoal_net::PodNetworkPlugin::is_current`]).
    pub fn network_is_current(&self, network: &shoal_net::PodNetwork) -> bool {
        self.network.is_current(network)
    }

    /// This runtime's scope (names its host-wide objects).
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The `shoal` binary that runs shims (tests pass the built binary).
    pub fn with_shoal_binary(mut self, binary: PathBuf) -> Self {
        self.shoal_binary = binary;
        self
    }

    pub fn runtime_version(&self) -> String {
        Command::new(&self.runc)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8(o.stdout)
                    .ok()?
                    .lines()
                    .next()
                    .map(|l| l.replace("runc version ", "runc://"))
            })
            .unwrap_or_else(|| "runc://unknown".into())
    }

    pub fn cgroup_layout(&self) -> cgroup::Layout {
        self.layout
    }

    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.pods_dir.join(uid)
    }

    /// The bundle directory of a container attempt (checked ids only).
    pub fn bundle(&self, uid: &str, name: &str, attempt: u32) -> PathBuf {
        self.pod_dir(uid)
            .join("containers")
            .join(format!("{name}.{attempt}"))
    }

    /// The log file of one container attempt.
    pub fn log_path(&self, uid: &str, name: &str, attempt: u32) -> PathBuf {
        self.pod_dir(uid)
            .join("logs")
            .join(name)
            .join(format!("{attempt}.log"))
    }

    /// Stops and removes every container and pod sandbox of this node (`shoal reset`, and the
    /// test harness after killing an agent).
    pub fn reset(&self) -> Result<usize, RuntimeError> {
        let pods = self.list();
        for pod in &pods {
            for container in &pod.containers {
                if !matches!(container.state, ObservedState::Exited { .. }) {
                    let _ = self.signal(&container.meta, "KILL");
                }
            }
        }
        let mut first_error = None;
        for pod in &pods {
            if let Err(err) = self.remove_sandbox(&pod.sandbox.uid) {
                first_error.get_or_insert(err);
            }
        }
        // Directories without a sandbox record (a crash mid-creation).
        if let Ok(entries) = std::fs::read_dir(&self.pods_dir) {
            for entry in entries.filter_map(Result::ok) {
                let uid = entry.file_name().to_string_lossy().into_owned();
                if let Err(err) = self.remove_sandbox(&uid) {
                    first_error.get_or_insert(err);
                }
            }
        }
        // The node-wide parent, once empty (other agents on this host may still use it).
        let _ = cgroup::remove_if_empty(self.layout, &format!("/shoal/{}", self.scope));
        let _ = cgroup::remove_if_empty(self.layout, "/shoal");
        match first_error {
            Some(err) => Err(err),
            None => Ok(pods.len()),
        }
    }

    /// Runtime ids of containers runc knows in this agent's root (for leak checks).
    pub fn runc_containers(&self) -> BTreeMap<String, String> {
        let output = Command::new(&self.runc)
            .arg("--root")
            .arg(&self.runc_root)
            .args(["list", "--format", "json"])
            .output();
        let Ok(output) = output else {
            return BTreeMap::new();
        };
        serde_json::from_slice::<Option<Vec<serde_json::Value>>>(&output.stdout)
            .ok()
            .flatten()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| {
                Some((
                    c["id"].as_str()?.to_owned(),
                    c["status"].as_str()?.to_owned(),
                ))
            })
            .collect()
    }
}

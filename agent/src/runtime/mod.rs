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
pub mod exec;
pub mod lease;
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
/// `allow` (any path when empty), and never the agent's own data dir, anything in it, or
/// anything containing it. Checked on the path as resolved on the host, after symlinks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPathPolicy {
    pub allow: Vec<PathBuf>,
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

    /// Directory of a pod's volume `name` (both checked to be one path component).
    pub fn volume_dir(&self, uid: &str, name: &str) -> Result<PathBuf, RuntimeError> {
        check_id("pod uid", uid)?;
        check_id("volume name", name)?;
        Ok(self.pod_dir(uid).join("volumes").join(name))
    }

    /// Creates (if missing) the directory of a pod's volume `name` beneath the pods
    /// directory, refusing any symlink on the way, and returns it as a [`Root`] for the
    /// kubelet to fill.
    pub fn ensure_volume(&self, uid: &str, name: &str) -> Result<Root, RuntimeError> {
        check_id("pod uid", uid)?;
        check_id("volume name", name)?;
        let rel = Path::new(uid).join("volumes").join(name);
        Root::open(&self.pods_dir)
            .and_then(|pods| pods.create_dir_all(&rel, 0o755, Resolve::Beneath))
            .map_err(io_at(&self.pods_dir.join(&rel)))
    }

    /// A node-local seccomp profile: `<data-dir>/seccomp/<rel>`, resolved beneath that
    /// directory without following symlinks, at most 1 MiB, checked to be an OCI
    /// `linux.seccomp` object.
    pub fn seccomp_profile(&self, rel: &str) -> Result<serde_json::Value, RuntimeError> {
        let refused = |reason: String| RuntimeError::Seccomp {
            path: rel.to_owned(),
            reason,
        };
        let root = Root::open(&self.seccomp_dir)
            .map_err(|e| refused(format!("{}: {e}", self.seccomp_dir.display())))?;
        let fd = root
            .open_at(
                Path::new(rel),
                nix::fcntl::OFlag::O_RDONLY,
                Resolve::Beneath,
            )
            .map_err(|e| refused(format!("{}: {e}", self.seccomp_dir.join(rel).display())))?;
        let mut bytes = Vec::new();
        io::Read::read_to_end(
            &mut io::Read::take(std::fs::File::from(fd), 1 << 20),
            &mut bytes,
        )
        .map_err(|e| refused(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| refused(format!("not JSON: {e}")))?;
        serde_json::from_value::<oci_spec::runtime::LinuxSeccomp>(value.clone())
            .map_err(|e| refused(format!("not an OCI seccomp profile: {e}")))?;
        Ok(value)
    }

    fn sub_paths_dir(&self, uid: &str, container: &str, attempt: u32) -> PathBuf {
        self.pod_dir(uid)
            .join("subpaths")
            .join(format!("{container}.{attempt}"))
    }

    /// Makes `sub_path` of volume `volume` available to one container attempt, as the kubelet
    /// does since CVE-2017-1002101: the path is opened beneath the volume with every
    /// component a real directory (a symlink the container planted is refused, never
    /// followed), created as a directory if missing, and the opened file itself (through its
    /// descriptor) is bind-mounted at `pods/<uid>/subpaths/<container>.<attempt>/<index>`,
    /// which the container's mount then names. Returns that path.
    pub fn bind_sub_path(
        &self,
        uid: &str,
        volume: &str,
        sub_path: &str,
        container: &str,
        attempt: u32,
        index: usize,
    ) -> Result<PathBuf, RuntimeError> {
        check_id("pod uid", uid)?;
        check_id("volume name", volume)?;
        check_id("container name", container)?;
        let refuse = |reason: String| RuntimeError::SubPath {
            volume: volume.to_owned(),
            sub_path: sub_path.to_owned(),
            reason,
        };
        let rel = crate::beneath::normal_components(Path::new(sub_path))
            .ok_or_else(|| refuse("must be a relative path without '..'".into()))?;
        let root = self.ensure_volume(uid, volume)?;
        let (fd, is_dir) = root
            .open_or_make_dir(&rel)
            .map_err(|err| match err.raw_os_error() {
                Some(libc::ELOOP) => {
                    refuse("a symlink is on its path; it is refused, never followed".into())
                }
                Some(libc::EXDEV) => refuse("it leaves its volume".into()),
                _ => refuse(err.to_string()),
            })?;
        self.stage_bind(uid, container, attempt, index, &fd, is_dir, false)
    }

    /// Makes host path `path` (a `hostPath` volume, optionally with `sub_path`) available to
    /// one container attempt: created if its type says so, opened (host symlinks followed:
    /// the host's layout is the administrator's), checked against `policy` on the path the
    /// descriptor resolved to and against its type, then bind-mounted through that very
    /// descriptor at the attempt's staging path (so nothing can swap it between the check
    /// and the mount). Returns the staging path.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_host_path(
        &self,
        uid: &str,
        container: &str,
        attempt: u32,
        index: usize,
        path: &str,
        kind: HostPathType,
        sub_path: Option<&str>,
        policy: &HostPathPolicy,
    ) -> Result<PathBuf, RuntimeError> {
        use std::os::fd::AsRawFd;
        check_id("pod uid", uid)?;
        check_id("container name", container)?;
        let refuse = |reason: String| RuntimeError::HostPath {
            path: path.to_owned(),
            reason,
        };
        let lexical = Path::new(path);
        if !lexical.is_absolute() || path.split('/').any(|p| p == "..") {
            return Err(refuse("must be an absolute path without '..'".into()));
        }
        let allowed = |resolved: &Path| -> Result<(), RuntimeError> {
            let data = &self.data_dir;
            if resolved.starts_with(data) || data.starts_with(resolved) {
                return Err(refuse(format!(
                    "resolves to {}, which is or holds this agent's data dir {}",
                    resolved.display(),
                    data.display()
                )));
            }
            if !policy.allow.is_empty() && !policy.allow.iter().any(|a| resolved.starts_with(a)) {
                return Err(refuse(format!(
                    "resolves to {}, outside the node's --host-path-allow prefixes",
                    resolved.display()
                )));
            }
            Ok(())
        };
        let exists = std::fs::symlink_metadata(lexical).is_ok();
        if !exists
            && matches!(
                kind,
                HostPathType::DirectoryOrCreate | HostPathType::FileOrCreate
            )
        {
            // Check where it would land before making it: the deepest existing ancestor,
            // resolved, plus the rest.
            let mut ancestor = lexical.to_owned();
            let mut rest = Vec::new();
            while std::fs::symlink_metadata(&ancestor).is_err() {
                rest.push(ancestor.file_name().unwrap_or_default().to_owned());
                if !ancestor.pop() {
                    break;
                }
            }
            let mut would_be = std::fs::canonicalize(&ancestor).map_err(io_at(&ancestor))?;
            for part in rest.iter().rev() {
                would_be.push(part);
            }
            allowed(&would_be)?;
            if kind == HostPathType::DirectoryOrCreate {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&would_be)
                    .map_err(io_at(&would_be))?;
            } else {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(&would_be)
                    .map_err(io_at(&would_be))?;
            }
        }
        let fd = nix::fcntl::open(
            lexical,
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| refuse(format!("cannot be opened: {e}")))?;
        let resolved = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(io_at(lexical))?;
        allowed(&resolved)?;
        let mode = nix::sys::stat::fstat(&fd)
            .map_err(|e| refuse(e.to_string()))?
            .st_mode
            & libc::S_IFMT;
        let want = match kind {
            HostPathType::Unchecked => None,
            HostPathType::DirectoryOrCreate | HostPathType::Directory => {
                Some((libc::S_IFDIR, "a directory"))
            }
            HostPathType::FileOrCreate | HostPathType::File => Some((libc::S_IFREG, "a file")),
            HostPathType::Socket => Some((libc::S_IFSOCK, "a socket")),
            HostPathType::CharDevice => Some((libc::S_IFCHR, "a character device")),
            HostPathType::BlockDevice => Some((libc::S_IFBLK, "a block device")),
        };
        if let Some((want, what)) = want
            && mode != want
        {
            return Err(refuse(format!("is not {what}, as its type requires")));
        }
        let (fd, is_dir) = match sub_path {
            None => (fd, mode == libc::S_IFDIR),
            Some(sub) => {
                let rel = crate::beneath::normal_components(Path::new(sub))
                    .ok_or_else(|| refuse(format!("subPath {sub:?} must descend")))?;
                Root::from_fd(fd, resolved.clone())
                    .open_or_make_dir(&rel)
                    .map_err(|e| refuse(format!("subPath {sub:?}: {e}")))?
            }
        };
        self.stage_bind(uid, container, attempt, index, &fd, is_dir, true)
    }

    /// Bind-mounts what `fd` refers to at the attempt's staging path `index`.
    #[allow(clippy::too_many_arguments)]
    fn stage_bind(
        &self,
        uid: &str,
        container: &str,
        attempt: u32,
        index: usize,
        fd: &std::os::fd::OwnedFd,
        is_dir: bool,
        recursive: bool,
    ) -> Result<PathBuf, RuntimeError> {
        use std::os::fd::AsRawFd;
        let dir = self.sub_paths_dir(uid, container, attempt);
        std::fs::create_dir_all(&dir).map_err(io_at(&dir))?;
        let target = dir.join(index.to_string());
        unmount(&target)?;
        if is_dir {
            std::fs::create_dir_all(&target).map_err(io_at(&target))?;
        } else {
            std::fs::File::create(&target).map_err(io_at(&target))?;
        }
        let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let mut flags = nix::mount::MsFlags::MS_BIND;
        if recursive {
            flags |= nix::mount::MsFlags::MS_REC;
        }
        nix::mount::mount(Some(&source), &target, None::<&str>, flags, None::<&str>).map_err(
            |e| RuntimeError::Io {
                path: target.clone(),
                source: io::Error::from(e),
            },
        )?;
        Ok(target)
    }

    /// Unmounts and removes the subPath mounts of one container attempt.
    fn remove_sub_paths(
        &self,
        uid: &str,
        container: &str,
        attempt: u32,
    ) -> Result<(), RuntimeError> {
        let dir = self.sub_paths_dir(uid, container, attempt);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        for entry in entries.filter_map(Result::ok) {
            unmount(&entry.path())?;
        }
        std::fs::remove_dir_all(&dir).map_err(io_at(&dir))
    }

    /// The pod's generated `/etc` files.
    pub fn etc_dir(&self, uid: &str) -> PathBuf {
        self.pod_dir(uid).join("etc")
    }

    /// The network namespace name of a pod.
    pub fn netns_name(&self, uid: &str) -> String {
        format!("shoal-{}-{uid}", self.scope)
    }

    /// The network a pod's sandbox was given.
    pub fn pod_network(&self, uid: &str) -> Option<shoal_net::PodNetwork> {
        if !is_safe_id(uid) {
            return None;
        }
        read_json::<Option<shoal_net::PodNetwork>>(&self.pod_dir(uid).join("network.json"))
            .flatten()
    }

    /// Path of the pod's network namespace.
    pub fn netns_path(&self, uid: &str) -> PathBuf {
        Path::new("/run/netns").join(self.netns_name(uid))
    }

    /// The pod's cgroup (below each hierarchy's root); its containers' cgroups are children.
    pub fn pod_cgroup(&self, uid: &str) -> String {
        cgroup::pod_path(&self.scope, uid)
    }

    /// Creates the pod sandbox if missing: directories, network namespace (loopback up) with
    /// the pod's interface and address from the network plugin (recorded in `network.json`),
    /// /etc files, the pod cgroup with its memory cap. Idempotent.
    pub fn ensure_sandbox(&self, sandbox: &SandboxSpec) -> Result<(), RuntimeError> {
        check_id("pod uid", &sandbox.uid)?;
        let dir = self.pod_dir(&sandbox.uid);
        let record = dir.join("sandbox.json");
        let network_record = dir.join("network.json");
        if record.exists()
            && (sandbox.host_network
                || (self.netns_path(&sandbox.uid).exists() && network_record.exists()))
        {
            return Ok(());
        }
        for sub in ["containers", "logs", "volumes", "etc"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io_at(&dir))?;
        }
        // Written first, so a crash from here on still leaves a record that cleanup finds.
        shim::write_state(&dir, "sandbox.json", sandbox).map_err(io_at(&record))?;
        let network = if sandbox.host_network {
            None
        } else {
            let netns = shoal_net::netns::create(&self.netns_name(&sandbox.uid))?;
            let network = self.network.setup(&shoal_net::PodRef {
                uid: sandbox.uid.clone(),
                netns,
            })?;
            shim::write_state(&dir, "network.json", &network).map_err(io_at(&network_record))?;
            network
        };
        let etc = self.etc_dir(&sandbox.uid);
        let write = |name: &str, text: String| {
            std::fs::write(etc.join(name), text).map_err(io_at(&etc.join(name)))
        };
        // Like the kubelet's: localhost, then the pod's own address under its hostname.
        let own = match network {
            Some(network) => format!("{}\t{}\n", network.ip, sandbox.hostname),
            None => format!("127.0.1.1\t{}\n", sandbox.hostname),
        };
        write(
            "hosts",
            format!(
                "# Kubernetes-managed hosts file (written by shoal).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{own}"
            ),
        )?;
        write("hostname", format!("{}\n", sandbox.hostname))?;
        // The node's DNS server listens on the bridge: the pod's gateway (the node's own
        // gateway for a pod in the node's network namespace).
        write(
            "resolv.conf",
            shoal_net::dns::resolv_conf(
                &sandbox.dns,
                &sandbox.namespace,
                &self.cluster_domain,
                network
                    .map(|n| n.gateway)
                    .or_else(|| self.network.node_dns()),
                sandbox.host_network,
                &std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
            ),
        )?;
        if let Some(bytes) = sandbox.memory_limit_bytes {
            cgroup::set_pod_memory_limit(self.layout, &self.pod_cgroup(&sandbox.uid), bytes)
                .map_err(io_at(Path::new("/sys/fs/cgroup")))?;
        }
        if let Some(pids) = sandbox.pids_limit {
            cgroup::set_pod_pids_limit(self.layout, &self.pod_cgroup(&sandbox.uid), pids)
                .map_err(io_at(Path::new("/sys/fs/cgroup")))?;
        }
        Ok(())
    }

    /// Creates and starts a container in its pod's sandbox; returns once its shim runs (the
    /// process start shows up in [`Runtime::list`]).
    pub fn start_container(
        &self,
        pod_uid: &str,
        meta: &ContainerMeta,
        request: &ContainerRequest,
    ) -> Result<(), RuntimeError> {
        check_id("pod uid", pod_uid)?;
        check_id("container name", &meta.name)?;
        let bundle = self.bundle(pod_uid, &meta.name, meta.attempt);
        if bundle.exists() {
            // A leftover of an attempt that never got going: start clean.
            self.remove_bundle(pod_uid, &meta.name, meta.attempt)?;
        }
        let resolved = self.resolve(pod_uid, meta, request)?;
        let (rootfs, upper, work) = (
            bundle.join("rootfs"),
            bundle.join("upper"),
            bundle.join("work"),
        );
        for dir in [&rootfs, &upper, &work] {
            std::fs::create_dir_all(dir).map_err(io_at(dir))?;
        }
        shim::write_state(&bundle, "meta.json", meta).map_err(io_at(&bundle))?;
        let lower: Vec<String> = request
            .layers
            .iter()
            .rev()
            .map(|l| l.to_string_lossy().into_owned())
            .collect();
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.join(":"),
            upper.display(),
            work.display()
        );
        // nosuid, nodev: a set-id binary or a device node shipped in an image gains nothing
        // on the host's behalf (the bind mount runc makes of the rootfs keeps these flags).
        nix::mount::mount(
            Some("overlay"),
            &rootfs,
            Some("overlay"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| RuntimeError::Io {
            path: rootfs.clone(),
            source: io::Error::from(e),
        })?;
        let config = spec::runtime_spec(request, &resolved);
        let config_path = bundle.join("config.json");
        std::fs::write(
            &config_path,
            serde_json::to_vec_pretty(&config).expect("spec serializes"),
        )
        .map_err(io_at(&config_path))?;
        let shim_log = bundle.join("shim.log");
        let stderr = std::fs::File::create(&shim_log).map_err(io_at(&shim_log))?;
        let mut command = Command::new(&self.shoal_binary);
        command
            .arg("shim")
            .arg("--runc")
            .arg(&self.runc)
            .arg("--root")
            .arg(&self.runc_root)
            .arg("--id")
            .arg(&meta.runtime_id)
            .arg("--bundle")
            .arg(&bundle)
            .arg("--log")
            .arg(&request.log_path)
            .arg("--log-max-bytes")
            .arg(self.log_max_bytes.to_string());
        for (on, flag) in [
            (request.stdin, "--stdin"),
            (request.stdin && request.stdin_once, "--stdin-once"),
            (request.tty, "--tty"),
        ] {
            if on {
                command.arg(flag);
            }
        }
        if let (Some(deadline), Some(timeout)) = (request.fence_deadline_ms, self.fence_timeout) {
            command
                .arg("--fence-lease")
                .arg(self.fence_lease_path(pod_uid))
                .arg("--fence-timeout-ms")
                .arg(timeout.as_millis().to_string())
                .arg("--fence-deadline-ms")
                .arg(deadline.to_string());
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        // SAFETY: the closure runs between fork and exec and calls only setsid, which is
        // async-signal-safe; the shim leaves the agent's session so signals aimed at the
        // agent's process group do not reach containers.
        unsafe {
            command.pre_exec(|| {
                let _ = nix::unistd::setsid();
                Ok(())
            });
        }
        // The shim forks and its first process exits at once: this wait is short and leaves
        // no zombie behind.
        let status = command.status().map_err(io_at(&self.shoal_binary))?;
        if !status.success() {
            return Err(RuntimeError::Command {
                command: "shoal shim".into(),
                message: std::fs::read_to_string(&shim_log).unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// What `request`'s mounts and seccomp profile are on this node: sandbox files, volume
    /// directories, subPaths and host paths bind-mounted for this attempt (each checked as
    /// [`Self::bind_sub_path`] and [`Self::bind_host_path`] say), the profile read beneath the
    /// node's profile directory; and the pod's namespace and the container's cgroup.
    fn resolve(
        &self,
        pod_uid: &str,
        meta: &ContainerMeta,
        request: &ContainerRequest,
    ) -> Result<spec::Resolved, RuntimeError> {
        let mut mounts = Vec::with_capacity(request.mounts.len());
        for (index, mount) in request.mounts.iter().enumerate() {
            let source = match &mount.source {
                spec::MountSource::SandboxFile(name) => Ok(self.etc_dir(pod_uid).join(name)),
                spec::MountSource::Volume {
                    volume,
                    sub_path: None,
                } => self.volume_dir(pod_uid, volume),
                spec::MountSource::Volume {
                    volume,
                    sub_path: Some(sub),
                } => self.bind_sub_path(pod_uid, volume, sub, &meta.name, meta.attempt, index),
                spec::MountSource::HostPath {
                    path,
                    kind,
                    sub_path,
                } => self.bind_host_path(
                    pod_uid,
                    &meta.name,
                    meta.attempt,
                    index,
                    path,
                    *kind,
                    sub_path.as_deref(),
                    &self.host_paths,
                ),
            }
            .map_err(|source| RuntimeError::Mount {
                field: mount.field.clone(),
                source: Box::new(source),
            })?;
            mounts.push(BindMount {
                source,
                destination: mount.destination.clone(),
                readonly: mount.readonly,
                recursive_readonly: mount.recursive_readonly,
            });
        }
        let seccomp_profile = match &request.seccomp {
            spec::Seccomp::Localhost(path) => Some(self.seccomp_profile(path)?),
            _ => None,
        };
        Ok(spec::Resolved {
            mounts,
            netns: self.netns_path(pod_uid),
            cgroup_path: meta.cgroup_path.clone(),
            seccomp_profile,
        })
    }

    /// Sends `signal` to a container's processes.
    pub fn signal(&self, meta: &ContainerMeta, signal: &str) -> Result<(), RuntimeError> {
        run(Command::new(&self.runc)
            .arg("--root")
            .arg(&self.runc_root)
            .args(["kill", "--all", &meta.runtime_id, signal]))
    }

    /// Removes a container that has exited (or kills it first): runc state, cgroup, overlay
    /// mount, subPath mounts and bundle. Its log stays until the pod is removed.
    pub fn remove_container(
        &self,
        pod_uid: &str,
        name: &str,
        attempt: u32,
    ) -> Result<(), RuntimeError> {
        check_id("pod uid", pod_uid)?;
        check_id("container name", name)?;
        self.remove_bundle(pod_uid, name, attempt)?;
        self.remove_sub_paths(pod_uid, name, attempt)
    }

    fn remove_bundle(&self, pod_uid: &str, name: &str, attempt: u32) -> Result<(), RuntimeError> {
        let bundle = self.bundle(pod_uid, name, attempt);
        if let Some(meta) = read_json::<ContainerMeta>(&bundle.join("meta.json")) {
            let state = self.runc_root.join(&meta.runtime_id);
            if state.exists()
                && let Err(err) = run(Command::new(&self.runc)
                    .arg("--root")
                    .arg(&self.runc_root)
                    .args(["delete", "--force", &meta.runtime_id]))
            {
                tracing::warn!(container = %meta.runtime_id, error = %err, "runc delete failed; killing the container's cgroup");
            }
            // Whatever runc left (or a container whose runc state is lost) dies with its cgroup.
            cgroup::kill_all(self.layout, &meta.cgroup_path, Duration::from_secs(2));
            cgroup::remove(self.layout, &meta.cgroup_path)
                .map_err(io_at(Path::new(&meta.cgroup_path)))?;
            // The shim exits right after the process; give a straggler a moment.
            if let Some(shim) = read_json::<shim::ShimIdentity>(&bundle.join(shim::SHIM_PID_FILE)) {
                for _ in 0..50 {
                    if !shim.is_alive() || bundle.join(shim::EXIT_FILE).exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        unmount(&bundle.join("rootfs"))?;
        match std::fs::remove_dir_all(&bundle) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(io_at(&bundle)(err)),
            _ => Ok(()),
        }
    }

    /// Removes a pod sandbox and everything in it (containers must have exited or are
    /// killed): network namespace, cgroups, volumes, logs.
    pub fn remove_sandbox(&self, pod_uid: &str) -> Result<(), RuntimeError> {
        check_id("pod uid", pod_uid)?;
        let dir = self.pod_dir(pod_uid);
        let containers = dir.join("containers");
        let mut first_error = None;
        if let Ok(entries) = std::fs::read_dir(&containers) {
            for entry in entries.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some((name, attempt)) = name.rsplit_once('.')
                    && let Ok(attempt) = attempt.parse()
                    && let Err(err) = self.remove_container(pod_uid, name, attempt)
                {
                    first_error.get_or_insert(err);
                }
            }
        }
        // Even with records lost: every process of the pod's cgroup, every mount below its
        // directory.
        cgroup::kill_all(
            self.layout,
            &self.pod_cgroup(pod_uid),
            Duration::from_secs(2),
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = format!("{}/", dir.display());
        let mut below: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        below.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in below {
            if let Err(err) = unmount(Path::new(mount)) {
                first_error.get_or_insert(err);
            }
        }
        if let Some(err) = first_error {
            tracing::warn!(pod = %pod_uid, error = %err, "removing the pod's containers; cleaning up by cgroup and mounts");
        }
        if let Err(err) = self.network.teardown(&shoal_net::PodRef {
            uid: pod_uid.to_owned(),
            netns: self.netns_path(pod_uid),
        }) {
            tracing::warn!(pod = %pod_uid, error = %err, "removing the pod's network");
        }
        shoal_net::netns::delete(&self.netns_name(pod_uid))?;
        cgroup::remove(self.layout, &self.pod_cgroup(pod_uid))
            .map_err(io_at(Path::new(&self.pod_cgroup(pod_uid))))?;
        // This runtime's and the node-wide parents, once they hold no other pod.
        let _ = cgroup::remove_if_empty(self.layout, &format!("/shoal/{}", self.scope));
        let _ = cgroup::remove_if_empty(self.layout, "/shoal");
        match std::fs::remove_dir_all(&dir) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(io_at(&dir)(err)),
            _ => Ok(()),
        }
    }

    fn observe_container(&self, bundle: &Path) -> Option<ObservedContainer> {
        let meta: ContainerMeta = read_json(&bundle.join("meta.json"))?;
        let started: Option<Started> = read_json(&bundle.join(shim::STARTED_FILE));
        let exited: Option<Exited> = read_json(&bundle.join(shim::EXIT_FILE));
        let state = match exited {
            Some(exited) => {
                // The OOM counter lives in the container's cgroup, which stays until removal;
                // remember it beside the bundle once read.
                let oom_file = bundle.join("oom.json");
                let oom_killed = match read_json::<bool>(&oom_file) {
                    Some(oom) => oom,
                    None => {
                        let oom = cgroup::oom_kills(self.layout, &meta.cgroup_path) > 0;
                        let _ = shim::write_state(bundle, "oom.json", &oom);
                        oom
                    }
                };
                ObservedState::Exited {
                    started,
                    exited,
                    oom_killed,
                }
            }
            None => {
                let shim_alive = read_json::<shim::ShimIdentity>(&bundle.join(shim::SHIM_PID_FILE))
                    .is_some_and(|shim| shim.is_alive());
                let meta_age = std::fs::metadata(bundle.join("meta.json"))
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .unwrap_or_default();
                if shim_alive || meta_age < Duration::from_secs(5) {
                    match started {
                        Some(started) => ObservedState::Running(started),
                        None => ObservedState::Creating,
                    }
                } else {
                    // The shim is gone without a word (killed, or the node rebooted): the
                    // container is unsupervised, so it counts as exited and is replaced.
                    ObservedState::Exited {
                        started,
                        exited: Exited {
                            exit_code: 255,
                            signal: None,
                            finished_unix_ms: shim::unix_ms(std::time::SystemTime::now()),
                            start_error: Some("the container's shim disappeared".into()),
                            fence_lapsed: false,
                        },
                        oom_killed: false,
                    }
                }
            }
        };
        Some(ObservedContainer {
            log_path: self.log_path_for(bundle, &meta),
            meta,
            state,
        })
    }

    fn log_path_for(&self, bundle: &Path, meta: &ContainerMeta) -> PathBuf {
        let uid = bundle
            .parent()
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.log_path(&uid, &meta.name, meta.attempt)
    }

    /// Every pod sandbox on this node with its containers, from the files on disk.
    pub fn list(&self) -> Vec<ObservedPod> {
        let Ok(entries) = std::fs::read_dir(&self.pods_dir) else {
            return Vec::new();
        };
        let mut pods: Vec<ObservedPod> = entries
            .filter_map(Result::ok)
            .filter_map(|e| self.observe_dir(&e.path()))
            .collect();
        pods.sort_by(|a, b| a.sandbox.uid.cmp(&b.sandbox.uid));
        pods
    }

    /// One pod sandbox with its containers.
    pub fn observe_pod(&self, uid: &str) -> Option<ObservedPod> {
        if !is_safe_id(uid) {
            return None;
        }
        self.observe_dir(&self.pod_dir(uid))
    }

    fn observe_dir(&self, dir: &Path) -> Option<ObservedPod> {
        let sandbox = read_json::<SandboxSpec>(&dir.join("sandbox.json"))?;
        let mut containers: Vec<ObservedContainer> = std::fs::read_dir(dir.join("containers"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| self.observe_container(&e.path()))
            .collect();
        containers
            .sort_by(|a, b| (&a.meta.name, a.meta.attempt).cmp(&(&b.meta.name, b.meta.attempt)));
        let network =
            read_json::<Option<shoal_net::PodNetwork>>(&dir.join("network.json")).flatten();
        Some(ObservedPod {
            sandbox,
            containers,
            network,
        })
    }

    /// Memory (bytes) and CPU time (ns) of a running container.
    pub fn usage(&self, meta: &ContainerMeta) -> Option<(u64, u64)> {
        cgroup::usage(self.layout, &meta.cgroup_path)
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

//! The container runtime against real runc, overlayfs, cgroups and network namespaces
//! (needs root, runc and busybox-static: CI installs them).

mod images;
pub mod registry;

pub use registry::{Registry, TokenServer};

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use shoal_agent::images::ImageStore;
use shoal_agent::runtime::{
    ContainerMeta, ContainerRequest, Limits, ObservedState, Runtime, SandboxSpec,
};

/// The project's test images (`examples/images/build.sh`), built once per test run.
pub fn test_images() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = root.join("target/test-images");
        let status = std::process::Command::new("bash")
            .arg(root.join("examples/images/build.sh"))
            .arg(&out)
            .env("DOCKER", "1")
            .stdout(std::process::Stdio::null())
            .status()
            .expect("running examples/images/build.sh");
        assert!(status.success(), "examples/images/build.sh failed");
        out
    })
}

pub fn busybox_archive() -> PathBuf {
    test_images().join("busybox-1.oci.tar")
}

struct Node {
    _dir: tempfile::TempDir,
    images: ImageStore,
    runtime: Runtime,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let images = ImageStore::open(dir.path().join("images")).unwrap();
        images.import(&busybox_archive(), None).unwrap();
        let runtime = Runtime::new(dir.path())
            .unwrap()
            .with_shoal_binary(crate::shoal_binary());
        Self {
            _dir: dir,
            images,
            runtime,
        }
    }

    fn sandbox(&self, uid: &str) -> SandboxSpec {
        let sandbox = SandboxSpec {
            uid: uid.into(),
            namespace: "default".into(),
            name: format!("pod-{uid}"),
            hostname: format!("pod-{uid}"),
            memory_limit_bytes: None,
            pids_limit: None,
            host_network: false,
            dns: Default::default(),
            cpu_request_millis: 0,
            memory_request_bytes: 0,
        };
        self.runtime.ensure_sandbox(&sandbox).unwrap();
        sandbox
    }

    fn start(&self, uid: &str, name: &str, args: &[&str], limits: Limits, readonly: bool) {
        self.start_as(uid, name, args, limits, readonly, None);
    }

    fn start_as(
        &self,
        uid: &str,
        name: &str,
        args: &[&str],
        limits: Limits,
        readonly: bool,
        fence_deadline_ms: Option<u64>,
    ) {
        let image = self.images.resolve("shoal.local/busybox:1").unwrap();
        let id = format!("{uid}-{name}-0");
        let meta = ContainerMeta {
            name: name.into(),
            attempt: 0,
            init: false,
            image: image.reference.clone(),
            image_digest: image.digest.clone(),
            runtime_id: id.clone(),
            cgroup_path: format!("{}/{id}", self.runtime.pod_cgroup(uid)),
        };
        let request = ContainerRequest {
            id: id.clone(),
            hostname: format!("pod-{uid}"),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: image.env.clone(),
            working_dir: "/".into(),
            uid: 0,
            gid: 0,
            readonly_rootfs: readonly,
            no_new_privileges: true,
            capabilities: shoal_agent::runtime::spec::DEFAULT_CAPABILITIES
                .iter()
                .map(|c| c.to_string())
                .collect(),
            limits,
            mounts: vec![],
            layers: image.layers.clone(),
            log_path: self.runtime.log_path(uid, name, 0),
            seccomp: shoal_agent::runtime::spec::Seccomp::RuntimeDefault,
            additional_gids: vec![],
            sysctls: Default::default(),
            host_pid: false,
            host_ipc: false,
            host_network: false,
            privileged: false,
            fence_deadline_ms,
            stdin: false,
            stdin_once: false,
            termination_message_from_logs: false,
            tty: false,
        };
        self.runtime.start_container(uid, &meta, &request).unwrap();
    }

    fn wait_exit(&self, uid: &str, name: &str) -> ObservedState {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let state = self
                .runtime
                .list()
                .into_iter()
                .find(|p| p.sandbox.uid == uid)
                .and_then(|p| p.containers.into_iter().find(|c| c.meta.name == name))
                .map(|c| c.state);
            if let Some(state @ ObservedState::Exited { .. }) = state {
                return state;
            }
            assert!(Instant::now() < deadline, "{name} did not exit: {state:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self, uid: &str, name: &str) -> String {
        std::fs::read_to_string(self.runtime.log_path(uid, name, 0)).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.runtime.reset().unwrap();
    }
}

fn default_limits() -> Limits {
    Limits {
        cpu_shares: 2,
        cpu_period_us: 100_000,
        ..Limits::default()
    }
}

/// No process, mount, netns or cgroup of this runtime is left.
fn assert_no_leaks(uid: &str, runtime: &Runtime) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(uid), "mount left: {mounts}");
    assert!(!runtime.netns_path(uid).exists(), "netns left");
    assert!(
        !Path::new(&format!("/sys/fs/cgroup/memory{}", runtime.pod_cgroup(uid))).exists()
            && !Path::new(&format!(
                "/sys/fs/cgroup/unified{}",
                runtime.pod_cgroup(uid)
            ))
            .exists(),
        "cgroup left"
    );
    assert!(runtime.runc_containers().is_empty(), "runc containers left");
    // Nor the runtime's own parent cgroup (other tests' runtimes have their own scope).
    let scope_parent = runtime.pod_cgroup(uid);
    let scope_parent = scope_parent.rsplit_once('/').unwrap().0;
    assert!(
        !Path::new(&format!("/sys/fs/cgroup/memory{scope_parent}")).exists(),
        "{scope_parent} left"
    );
}

#[test]
fn a_container_runs_logs_and_exits_with_its_code() {
    let node = Node::new();
    let uid = "rt-exit";
    node.sandbox(uid);
    node.start(
        uid,
        "main",
        &["sh", "-c", "echo hello; echo oops >&2; hostname; exit 3"],
        default_limits(),
        false,
    );
    let ObservedState::Exited {
        exited,
        oom_killed,
        started,
    } = node.wait_exit(uid, "main")
    else {
        unreachable!()
    };
    assert_eq!(exited.exit_code, 3, "{exited:?}");
    assert!(!oom_killed);
    assert!(started.is_some());
    let log = node.log(uid, "main");
    assert!(log.contains(" stdout F hello\n"), "{log}");
    assert!(log.contains(" stderr F oops\n"), "{log}");
    assert!(log.contains(" stdout F pod-rt-exit\n"), "{log}");
    node.runtime.remove_sandbox(uid).unwrap();
    assert_no_leaks(uid, &node.runtime);
}

fn state_of(node: &Node, uid: &str, name: &str) -> Option<ObservedState> {
    node.runtime
        .list()
        .into_iter()
        .find(|p| p.sandbox.uid == uid)
        .and_then(|p| p.containers.into_iter().find(|c| c.meta.name == name))
        .map(|c| c.state)
}

/// A fenced container lives only while its agent renews the fence lease: renewed, it outlives
/// several fence timeouts; left alone (a killed or frozen agent), its shim kills it, and an
/// unfenced container beside it runs on.
#[test]
fn a_fenced_container_dies_once_the_fence_lease_is_not_renewed() {
    use shoal_agent::runtime::lease;
    let mut node = Node::new();
    let timeout = Duration::from_millis(500);
    node.runtime = node.runtime.clone().with_fence_timeout(timeout);
    let uid = "rt-fence";
    node.sandbox(uid);
    let path = node.runtime.fence_lease_path(uid);
    let far = || lease::monotonic_ms() + 60_000;
    lease::renew(&path, 0, far()).unwrap();
    let forever = ["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"];
    node.start_as(
        uid,
        "fenced",
        &forever,
        default_limits(),
        false,
        Some(far()),
    );
    node.start_as(uid, "free", &forever, default_limits(), false, None);
    for n in 1..=20 {
        lease::renew(&path, n, far()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    // Four fence timeouts have passed, the lease renewed all along.
    assert!(
        matches!(
            state_of(&node, uid, "fenced"),
            Some(ObservedState::Running(_))
        ),
        "{:?}",
        state_of(&node, uid, "fenced")
    );
    let ObservedState::Exited { exited, .. } = node.wait_exit(uid, "fenced") else {
        unreachable!()
    };
    assert!(exited.fence_lapsed, "{exited:?}");
    assert_eq!(exited.signal, Some(9), "{exited:?}");
    assert!(
        matches!(
            state_of(&node, uid, "free"),
            Some(ObservedState::Running(_))
        ),
        "the unfenced container must run on: {:?}",
        state_of(&node, uid, "free")
    );
    node.runtime.remove_sandbox(uid).unwrap();
    assert_no_leaks(uid, &node.runtime);
}

/// The deadline in a fenced pod's lease is enforced by the shim however busy the renewals
/// are: an agent whose run lease on the pod lapses writes the lapse as the deadline, and the
/// container dies then, not a fence timeout after the renewals stop (which, under load, let a
/// fenced pod run on two nodes at once).
#[test]
fn a_fenced_container_dies_at_its_lease_deadline_while_renewed() {
    use shoal_agent::runtime::lease;
    let mut node = Node::new();
    node.runtime = node
        .runtime
        .clone()
        .with_fence_timeout(Duration::from_secs(60));
    let uid = "rt-deadline";
    node.sandbox(uid);
    let path = node.runtime.fence_lease_path(uid);
    let deadline = lease::monotonic_ms() + 1_500;
    lease::renew(&path, 0, deadline).unwrap();
    let forever = ["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"];
    node.start_as(
        uid,
        "fenced",
        &forever,
        default_limits(),
        false,
        Some(deadline),
    );
    // Renewed every 100 ms, always with the same deadline (the run lease was not extended):
    // it runs until shortly before the deadline...
    let mut n = 1;
    while lease::monotonic_ms() + 300 < deadline {
        assert!(
            matches!(
                state_of(&node, uid, "fenced"),
                Some(ObservedState::Running(_) | ObservedState::Creating)
            ),
            "killed before its deadline: {:?}",
            state_of(&node, uid, "fenced")
        );
        lease::renew(&path, n, deadline).unwrap();
        n += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    // ... and dies at it, long before the lease's 60 s of silence would end it.
    let ObservedState::Exited { exited, .. } = node.wait_exit(uid, "fenced") else {
        unreachable!()
    };
    assert!(exited.fence_lapsed, "{exited:?}");
    assert_eq!(exited.signal, Some(9), "{exited:?}");
    node.runtime.remove_sandbox(uid).unwrap();
    assert_no_leaks(uid, &node.runtime);
}

/// A start comes a little after the kubelet decided it under its run lease, and on a loaded
/// host after that lease ended. The shim holds the container to the deadline the start was
/// decided under: past it, the container never starts; before it, the container dies at it —
/// though the lease file still holds an earlier run's deadline, which is not this start's, and
/// nothing renews the file (before this, such a container ran until the silence timeout, and
/// a fenced pod ran on two nodes at once under CI's load).
#[test]
fn a_fenced_container_is_held_to_the_run_lease_its_start_was_decided_under() {
    use shoal_agent::runtime::lease;
    let mut node = Node::new();
    node.runtime = node
        .runtime
        .clone()
        .with_fence_timeout(Duration::from_secs(60));
    let uid = "rt-late-start";
    node.sandbox(uid);
    let path = node.runtime.fence_lease_path(uid);
    // An earlier run's renewal: a deadline already past, not enforced on a new start.
    lease::renew(&path, 7, lease::monotonic_ms() - 5_000).unwrap();
    let announce = [
        "sh",
        "-c",
        "echo ran; trap '' TERM; while true; do sleep 0.1; done",
    ];
    node.start_as(
        uid,
        "late",
        &announce,
        default_limits(),
        false,
        Some(lease::monotonic_ms() - 1),
    );
    let ObservedState::Exited { exited, .. } = node.wait_exit(uid, "late") else {
        unreachable!()
    };
    let error = exited.start_error.clone().unwrap_or_default();
    assert!(
        error.starts_with(shoal_agent::runtime::shim::FENCE_LAPSED_BEFORE_START),
        "{exited:?}"
    );
    assert_eq!(
        node.log(uid, "late"),
        "",
        "the late container must not have run"
    );
    let deadline = lease::monotonic_ms() + 700;
    node.start_as(
        uid,
        "timely",
        &announce,
        default_limits(),
        false,
        Some(deadline),
    );
    let ObservedState::Exited { exited, .. } = node.wait_exit(uid, "timely") else {
        unreachable!()
    };
    assert!(exited.fence_lapsed, "{exited:?}");
    assert_eq!(exited.signal, Some(9), "{exited:?}");
    assert!(
        node.log(uid, "timely").contains("ran"),
        "it ran until its deadline"
    );
    node.runtime.remove_sandbox(uid).unwrap();
    assert_no_leaks(uid, &node.runtime);
}

#[test]
fn memory_limit_ends_in_an_oom_kill() {
    let node = Node::new();
    let uid = "rt-oom";
    node.sandbox(uid);
    let limits = Limits {
        memory_bytes: Some(16 << 20),
        ..default_limits()
    };
    // A shell variable that doubles until it passes 16 MiB.
    node.start(
        uid,
        "hog",
        &[
            "sh",
            "-c",
            "x=xxxxxxxxxxxxxxxx; while true; do x=$x$x; done",
        ],
        limits,
        false,
    );
    let ObservedState::Exited {
        exited, oom_killed, ..
    } = node.wait_exit(uid, "hog")
    else {
        unreachable!()
    };
    assert_eq!(exited.signal, Some(9), "{exited:?}");
    assert_eq!(exited.exit_code, 137);
    assert!(oom_killed);
}

#[test]
fn read_only_root_filesystem_is_enforced() {
    let node = Node::new();
    let uid = "rt-ro";
    node.sandbox(uid);
    node.start(
        uid,
        "ro",
        &[
            "sh",
            "-c",
            "touch /x && echo wrote || echo refused; touch /tmp/y || echo tmp-refused",
        ],
        default_limits(),
        true,
    );
    node.wait_exit(uid, "ro");
    let log = node.log(uid, "ro");
    assert!(log.contains("stdout F refused"), "{log}");
    assert!(!log.contains("wrote"), "{log}");
}

#[test]
fn a_missing_command_is_a_start_error_naming_it() {
    let node = Node::new();
    let uid = "rt-nocmd";
    node.sandbox(uid);
    node.start(uid, "bad", &["/no/such/binary"], default_limits(), false);
    let ObservedState::Exited { exited, .. } = node.wait_exit(uid, "bad") else {
        unreachable!()
    };
    let error = exited.start_error.unwrap_or_default();
    assert!(error.contains("/no/such/binary"), "{error}");
}

#[test]
fn containers_of_a_pod_share_localhost_and_killing_stops_them() {
    let node = Node::new();
    let uid = "rt-share";
    node.sandbox(uid);
    node.start(
        uid,
        "server",
        // PID 1 ignores signals it has no handler for: the trap is the graceful stop.
        &["sh", "-c", "trap 'echo bye; exit 0' TERM; echo -e 'HTTP/1.0 200 OK\\r\\n\\r\\nfrom-server' > /tmp/r; while true; do nc -l -p 8080 < /tmp/r; done"],
        default_limits(),
        false,
    );
    node.start(
        uid,
        "client",
        &["sh", "-c", "for i in $(seq 50); do wget -q -O - http://127.0.0.1:8080/ && exit 0; sleep 0.1; done; exit 1"],
        default_limits(),
        false,
    );
    let ObservedState::Exited { exited, .. } = node.wait_exit(uid, "client") else {
        unreachable!()
    };
    assert_eq!(exited.exit_code, 0, "{}", node.log(uid, "client"));
    assert!(node.log(uid, "client").contains("from-server"));
    let server = node
        .runtime
        .list()
        .into_iter()
        .flat_map(|p| p.containers)
        .find(|c| c.meta.name == "server")
        .unwrap();
    node.runtime.signal(&server.meta, "TERM").unwrap();
    let ObservedState::Exited { exited, .. } = node.wait_exit(uid, "server") else {
        unreachable!()
    };
    assert_eq!(exited.exit_code, 0, "{exited:?}");
    assert!(node.log(uid, "server").contains("stdout F bye"));
    node.runtime.remove_sandbox(uid).unwrap();
    assert_no_leaks(uid, &node.runtime);
}

/// The shim keeps no write end of its container's stdout or stderr: once the container's
/// processes are gone, the shim reads the end of both streams and reports the exit at once.
/// (A `Command` kept after `runc run` held both write ends, so every exit waited out the
/// shim's one-second drain deadline.) Checked in the fd tables, with no timing.
#[test]
fn the_shim_holds_no_write_end_of_its_containers_output() {
    use shoal_agent::runtime::Started;
    use shoal_agent::runtime::shim::{SHIM_PID_FILE, STARTED_FILE, ShimIdentity};
    let node = Node::new();
    let uid = "rt-pipes";
    node.sandbox(uid);
    node.start(uid, "main", &["sleep", "60"], default_limits(), false);
    let bundle = node.runtime.bundle(uid, "main", 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let started: Started = loop {
        if let Some(s) = std::fs::read(bundle.join(STARTED_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
        {
            break s;
        }
        assert!(Instant::now() < deadline, "main never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    let shim: ShimIdentity =
        serde_json::from_slice(&std::fs::read(bundle.join(SHIM_PID_FILE)).unwrap()).unwrap();
    // The pipes the container writes its output to.
    let output: Vec<String> = [1, 2]
        .iter()
        .map(|fd| {
            std::fs::read_link(format!("/proc/{}/fd/{fd}", started.pid))
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert!(output.iter().all(|l| l.starts_with("pipe:")), "{output:?}");
    // Every descriptor of the shim on those pipes, with its access mode.
    let mut held = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{}/fd", shim.pid)).unwrap() {
        let entry = entry.unwrap();
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        if !output.contains(&target) {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{}/fdinfo/{}",
            shim.pid,
            entry.file_name().to_string_lossy()
        ))
        .unwrap();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        held.push((target, flags & 0o3));
    }
    // It reads both streams (so the check looked at the right pipes) and writes neither.
    assert_eq!(
        held.iter().filter(|(_, mode)| *mode == 0).count(),
        2,
        "the shim's descriptors on the output pipes: {held:?}"
    );
    assert!(
        held.iter().all(|(_, mode)| *mode == 0),
        "the shim holds a write end of its container's output: {held:?}"
    );
    node.runtime.remove_sandbox(uid).unwrap();
    assert_no_leaks(uid, &node.runtime);
}

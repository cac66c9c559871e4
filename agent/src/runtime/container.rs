//! Containers: one start from a request built as data (through `shoal shim` and runc),
//! signals, removal, and what the runtime observes of each attempt on disk.

use super::*;

/// Where an exited attempt's termination message is kept once read (beside its bundle).
const MESSAGE_FILE: &str = "message.json";
/// Marks an attempt whose policy is `FallbackToLogsOnError`.
const FALLBACK_FILE: &str = "termination-fallback.json";
/// The most of a termination message kept (the kubelet's 4 KiB).
const MAX_MESSAGE_BYTES: u64 = 4096;

/// The last 80 lines of a container's log, at most 2 KiB (the kubelet's fallback message):
/// the log's last 16 KiB read, its CRI framing removed.
fn log_tail(path: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(16 << 10)))
        .ok()?;
    let mut raw = Vec::new();
    file.take(16 << 10).read_to_end(&mut raw).ok()?;
    let text = crate::kubelet::logs::render(&raw, false);
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    let mut tail = lines[lines.len().saturating_sub(80)..].join("\n");
    if tail.len() > 2048 {
        let mut cut = tail.len() - 2048;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = tail[cut..].to_owned();
    }
    Some(tail)
}

impl Runtime {
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
        if request.termination_message_from_logs {
            shim::write_state(&bundle, FALLBACK_FILE, &true).map_err(io_at(&bundle))?;
        }
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

    fn observe_container(&self, bundle: &Path) -> Option<ObservedContainer> {
        let meta: ContainerMeta = read_json(&bundle.join("meta.json"))?;
        let started: Option<Started> = read_json(&bundle.join(shim::STARTED_FILE));
        let exited: Option<Exited> = read_json(&bundle.join(shim::EXIT_FILE));
        let state = match exited {
            Some(mut exited) => {
                // The termination message, read once and kept beside the bundle.
                let message_file = bundle.join(MESSAGE_FILE);
                exited.message = match read_json::<Option<String>>(&message_file) {
                    Some(message) => message,
                    None => {
                        let message = self.termination_message(bundle, &meta, &exited);
                        let _ = shim::write_state(bundle, MESSAGE_FILE, &message);
                        message
                    }
                };
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
                            message: None,
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

    /// What an exited attempt says about its end: its termination message file (at most
    /// [`MAX_MESSAGE_BYTES`], read beneath the pods directory without following a symlink),
    /// or — `FallbackToLogsOnError`, nothing written, a failure — the last 80 lines of its log
    /// (at most 2 KiB), as the kubelet does.
    fn termination_message(
        &self,
        bundle: &Path,
        meta: &ContainerMeta,
        exited: &Exited,
    ) -> Option<String> {
        let uid = self.uid_of_bundle(bundle);
        let rel = Path::new(&uid)
            .join("logs")
            .join(&meta.name)
            .join(format!("{}.termination", meta.attempt));
        let written = crate::beneath::Root::open(&self.pods_dir)
            .and_then(|pods| {
                pods.read_regular(&rel, MAX_MESSAGE_BYTES, crate::beneath::Resolve::Beneath)
            })
            .unwrap_or_default();
        if !written.is_empty() {
            return Some(String::from_utf8_lossy(&written).into_owned());
        }
        let fallback = read_json::<bool>(&bundle.join(FALLBACK_FILE)).unwrap_or(false);
        if !fallback || exited.exit_code == 0 {
            return None;
        }
        let tail = log_tail(&self.log_path_for(bundle, meta))?;
        (!tail.is_empty()).then_some(tail)
    }

    fn uid_of_bundle(&self, bundle: &Path) -> String {
        bundle
            .parent()
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
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
}

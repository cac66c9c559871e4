//! A simulated container runtime: the product's [`ContainerRuntime`] trait over memory (and a
//! temporary directory for the pods' volumes, which the kubelet fills itself). Sandboxes and
//! containers are records; a started container runs until it is signalled or
//! [`SimRuntime::exit`] ends it. It records every call, so a test of the kubelet's start path
//! (`shoal_agent::kubelet::start`) can say exactly what reached the runtime — the code under
//! test is the product's; only the runtime is simulated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use shoal_agent::beneath::Root;
use shoal_agent::runtime::shim::{Exited, Started};
use shoal_agent::runtime::{
    ContainerMeta, ContainerRequest, ContainerRuntime, ObservedContainer, ObservedPod,
    ObservedState, RuntimeError, SandboxSpec,
};

/// One container the simulated runtime started.
#[derive(Debug, Clone)]
pub struct SimContainer {
    pub pod_uid: String,
    pub meta: ContainerMeta,
    pub request: ContainerRequest,
    /// `None` while it runs; its exit code once it ended.
    pub exit_code: Option<i32>,
}

#[derive(Debug, Default)]
struct State {
    sandboxes: BTreeMap<String, SandboxSpec>,
    containers: Vec<SimContainer>,
    calls: Vec<String>,
    /// The error the next start fails with.
    fail_next_start: Option<RuntimeError>,
    /// Each pod's last fence lease renewal: (counter, deadline in monotonic ms).
    fence_leases: BTreeMap<String, (u64, u64)>,
}

/// The simulated runtime of one node.
#[derive(Debug)]
pub struct SimRuntime {
    volumes: tempfile::TempDir,
    state: Mutex<State>,
}

impl SimRuntime {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            volumes: tempfile::tempdir()?,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every call made so far, in order (`ensure_sandbox u1`, `start u1 app 0`, …).
    pub fn calls(&self) -> Vec<String> {
        self.state().calls.clone()
    }

    /// The containers started so far.
    pub fn containers(&self) -> Vec<SimContainer> {
        self.state().containers.clone()
    }

    /// The next start fails with `error` (and starts nothing).
    pub fn fail_next_start(&self, error: RuntimeError) {
        self.state().fail_next_start = Some(error);
    }

    /// Container `runtime_id` ends with `code`.
    pub fn exit(&self, runtime_id: &str, code: i32) {
        let mut state = self.state();
        if let Some(c) = state
            .containers
            .iter_mut()
            .find(|c| c.meta.runtime_id == runtime_id)
        {
            c.exit_code.get_or_insert(code);
        }
    }

    /// Pod `uid`'s last fence lease renewal: (counter, deadline in monotonic ms).
    pub fn fence_lease(&self, uid: &str) -> Option<(u64, u64)> {
        self.state().fence_leases.get(uid).copied()
    }

    /// The directory of pod `uid`'s volume `name`.
    pub fn volume_path(&self, uid: &str, name: &str) -> PathBuf {
        self.volumes.path().join(uid).join(name)
    }
}

fn started() -> Started {
    Started {
        pid: 1,
        started_unix_ms: 0,
    }
}

impl ContainerRuntime for SimRuntime {
    fn version(&self) -> String {
        "sim://1".to_owned()
    }

    fn ensure_sandbox(&self, sandbox: &SandboxSpec) -> Result<(), RuntimeError> {
        let mut state = self.state();
        state.calls.push(format!("ensure_sandbox {}", sandbox.uid));
        state
            .sandboxes
            .entry(sandbox.uid.clone())
            .or_insert_with(|| sandbox.clone());
        Ok(())
    }

    fn pod_network(&self, uid: &str) -> Option<shoal_net::PodNetwork> {
        let _ = uid;
        None
    }

    fn remove_sandbox(&self, uid: &str) -> Result<(), RuntimeError> {
        let mut state = self.state();
        state.calls.push(format!("remove_sandbox {uid}"));
        state.sandboxes.remove(uid);
        state.containers.retain(|c| c.pod_uid != uid);
        Ok(())
    }

    fn ensure_volume(&self, uid: &str, name: &str) -> Result<Root, RuntimeError> {
        let path = self.volume_path(uid, name);
        std::fs::create_dir_all(&path).map_err(|source| RuntimeError::Io {
            path: path.clone(),
            source,
        })?;
        Root::open(&path).map_err(|source| RuntimeError::Io { path, source })
    }

    /// The simulator's volumes hold nothing it measures.
    fn volume_usage(&self, _uid: &str, _name: &str, _max_entries: usize) -> Option<u64> {
        None
    }

    fn persistent_volume_usage(&self, _name: &str, _max_entries: usize) -> Option<u64> {
        None
    }

    /// The simulator mounts nothing: a memory-backed volume is a directory like the others.
    fn ensure_memory_volume(
        &self,
        uid: &str,
        name: &str,
        _size_bytes: Option<u64>,
    ) -> Result<Root, RuntimeError> {
        self.ensure_volume(uid, name)
    }

    fn log_path(&self, uid: &str, name: &str, attempt: u32) -> PathBuf {
        Path::new("/sim/logs")
            .join(uid)
            .join(format!("{name}.{attempt}.log"))
    }

    fn container_cgroup(&self, uid: &str, runtime_id: &str) -> String {
        format!("/sim/pod{uid}/{runtime_id}")
    }

    fn start_container(
        &self,
        pod_uid: &str,
        meta: &ContainerMeta,
        request: &ContainerRequest,
    ) -> Result<(), RuntimeError> {
        let mut state = self.state();
        state
            .calls
            .push(format!("start {pod_uid} {} {}", meta.name, meta.attempt));
        if let Some(error) = state.fail_next_start.take() {
            return Err(error);
        }
        if !state.sandboxes.contains_key(pod_uid) {
            return Err(RuntimeError::Command {
                command: "start".into(),
                message: format!("pod {pod_uid} has no sandbox"),
            });
        }
        state.containers.push(SimContainer {
            pod_uid: pod_uid.to_owned(),
            meta: meta.clone(),
            request: request.clone(),
            exit_code: None,
        });
        Ok(())
    }

    fn signal(&self, meta: &ContainerMeta, signal: &str) -> Result<(), RuntimeError> {
        let mut state = self.state();
        state
            .calls
            .push(format!("signal {} {signal}", meta.runtime_id));
        if let Some(c) = state
            .containers
            .iter_mut()
            .find(|c| c.meta.runtime_id == meta.runtime_id)
        {
            c.exit_code
                .get_or_insert(128 + if signal == "KILL" { 9 } else { 15 });
        }
        Ok(())
    }

    fn list(&self) -> Vec<ObservedPod> {
        let state = self.state();
        state
            .sandboxes
            .values()
            .map(|sandbox| ObservedPod {
                sandbox: sandbox.clone(),
                network: None,
                containers: state
                    .containers
                    .iter()
                    .filter(|c| c.pod_uid == sandbox.uid)
                    .map(|c| ObservedContainer {
                        meta: c.meta.clone(),
                        log_path: c.request.log_path.clone(),
                        state: match c.exit_code {
                            None => ObservedState::Running(started()),
                            Some(code) => ObservedState::Exited {
                                started: Some(started()),
                                exited: Exited {
                                    exit_code: code,
                                    signal: None,
                                    finished_unix_ms: 0,
                                    start_error: None,
                                    fence_lapsed: false,
                                    message: None,
                                },
                                oom_killed: false,
                            },
                        },
                    })
                    .collect(),
            })
            .collect()
    }

    fn usage(&self, meta: &ContainerMeta) -> Option<(u64, u64)> {
        let _ = meta;
        None
    }

    fn remove_container(&self, uid: &str, name: &str, attempt: u32) -> Result<(), RuntimeError> {
        let mut state = self.state();
        state.calls.push(format!("remove {uid} {name} {attempt}"));
        state
            .containers
            .retain(|c| !(c.pod_uid == uid && c.meta.name == name && c.meta.attempt == attempt));
        Ok(())
    }

    fn network_is_current(&self, network: &shoal_net::PodNetwork) -> bool {
        let _ = network;
        true
    }

    fn netns_path(&self, uid: &str) -> PathBuf {
        Path::new("/sim/netns").join(uid)
    }

    fn renew_fence_lease(&self, uid: &str, counter: u64, deadline_ms: u64) -> std::io::Result<()> {
        let mut state = self.state();
        if !state.sandboxes.contains_key(uid) {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        state
            .fence_leases
            .insert(uid.to_owned(), (counter, deadline_ms));
        Ok(())
    }

    /// A running container's command "succeeds" (exit 0, no output): the simulation runs no
    /// processes, and says so for a container that is not running.
    fn exec_sync(
        &self,
        meta: &ContainerMeta,
        command: &[String],
        timeout: std::time::Duration,
    ) -> Result<(i32, String), RuntimeError> {
        let _ = timeout;
        let mut state = self.state();
        state
            .calls
            .push(format!("exec {} {}", meta.runtime_id, command.join(" ")));
        let running = state
            .containers
            .iter()
            .any(|c| c.meta.runtime_id == meta.runtime_id && c.exit_code.is_none());
        if running {
            Ok((0, String::new()))
        } else {
            Err(RuntimeError::Exec {
                container: meta.runtime_id.clone(),
                message: "not running".into(),
            })
        }
    }

    fn exec_stream(
        &self,
        uid: &str,
        meta: &ContainerMeta,
        command: &[String],
        terminal: Option<Option<(u16, u16)>>,
    ) -> Result<shoal_agent::runtime::ExecProcess, RuntimeError> {
        let _ = (uid, command, terminal);
        Err(RuntimeError::Exec {
            container: meta.runtime_id.clone(),
            message: "the simulated runtime runs no processes to stream".into(),
        })
    }

    fn attach_input(
        &self,
        uid: &str,
        meta: &ContainerMeta,
    ) -> std::io::Result<std::os::unix::net::UnixStream> {
        let _ = (uid, meta);
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "the simulated runtime has no container input",
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use shoal_agent::images::ResolvedImage;
    use shoal_agent::kubelet::start::{self, RUN_LEASE_ENDED, Start};
    use shoal_agent::runtime::{HostPathType, MountSource, SandboxSpec};
    use shoal_core::pod::plan::PodPlan;

    use super::*;

    fn image() -> ResolvedImage {
        ResolvedImage {
            reference: "shoal.local/busybox:1".into(),
            digest: "sha256:b".into(),
            entrypoint: vec![],
            cmd: vec!["sh".into()],
            env: vec!["PATH=/bin".into()],
            working_dir: None,
            user: None,
            layers: vec!["/layers/0".into()],
        }
    }

    fn sandbox(plan: &PodPlan) -> SandboxSpec {
        SandboxSpec {
            uid: plan.uid.clone(),
            namespace: plan.namespace.clone(),
            name: plan.name.clone(),
            hostname: plan.hostname.clone(),
            memory_limit_bytes: None,
            pids_limit: None,
            host_network: false,
            dns: Default::default(),
            cpu_request_millis: 0,
            memory_request_bytes: 0,
        }
    }

    /// Starts container 0 of `pod` on `runtime` at monotonic time `now`, with the node's run
    /// lease ending at `deadline` (if it holds one) and `objects` as the namespace's
    /// ConfigMaps.
    fn start_at(
        runtime: &SimRuntime,
        pod: &Value,
        objects: &[(&str, Value)],
        deadline: Option<u64>,
        now: u64,
    ) -> Result<(), shoal_agent::kubelet::container::ConfigError> {
        let plan = PodPlan::parse(pod).unwrap();
        let lookup = |kind: &str, name: &str| {
            objects
                .iter()
                .find(|(n, _)| kind == "ConfigMap" && *n == name)
                .map(|(_, o)| o.clone())
        };
        let clock = move || now;
        let token = |_: &PodPlan, _: &shoal_core::pod::plan::TokenFile| Ok("token".to_owned());
        start::start(
            runtime,
            &Start {
                plan: &plan,
                container: &plan.containers[0],
                attempt: 0,
                init: false,
                image: &image(),
                sandbox: sandbox(&plan),
                node_name: "n1",
                host_ip: "10.0.0.1",
                allow_privileged: false,
                lookup: &lookup,
                token: &token,
                service_links: &[],
                fence_deadline_ms: deadline,
                monotonic_ms: &clock,
            },
        )
    }

    fn pod(annotations: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "prod", "uid": "u1",
                            "annotations": annotations},
               "spec": {"containers": [{"name": "app", "image": "shoal.local/busybox:1",
                  "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}}],
                  "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"},
                                   {"name": "cfg", "mountPath": "/etc/cfg"},
                                   {"name": "data", "mountPath": "/data", "subPath": "app"},
                                   {"name": "host", "mountPath": "/host", "readOnly": true}]}],
                        "volumes": [{"name": "scratch", "emptyDir": {}},
                                    {"name": "cfg", "configMap": {"name": "cfg"}},
                                    {"name": "data", "emptyDir": {}},
                                    {"name": "host", "hostPath": {"path": "/srv/x", "type": "Directory"}}]}})
    }

    fn config_map() -> (&'static str, Value) {
        ("cfg", json!({"data": {"mode": "fast", "app.conf": "x=1"}}))
    }

    /// The start path, end to end on the simulated runtime: the volumes the kubelet fills
    /// (a ConfigMap projected into its volume), one sandbox ensured, then one start whose
    /// request carries the environment and every mount as data for the runtime to resolve.
    #[test]
    fn a_start_fills_the_volumes_ensures_the_sandbox_and_sends_one_request() {
        let runtime = SimRuntime::new().unwrap();
        start_at(&runtime, &pod(json!({})), &[config_map()], None, 0).unwrap();
        assert_eq!(runtime.calls(), ["ensure_sandbox u1", "start u1 app 0"]);
        let projected = std::fs::read_to_string(runtime.volume_path("u1", "cfg").join("app.conf"));
        assert_eq!(projected.unwrap(), "x=1");
        let started = runtime.containers();
        let c = &started[0];
        assert_eq!(c.meta.runtime_id, "u1-app-0");
        assert_eq!(c.meta.cgroup_path, "/sim/podu1/u1-app-0");
        assert!(
            c.request.env.contains(&"MODE=fast".to_owned()),
            "{:?}",
            c.request.env
        );
        assert_eq!(c.request.log_path, runtime.log_path("u1", "app", 0));
        assert_eq!(c.request.fence_deadline_ms, None);
        let sources: Vec<&MountSource> = c.request.mounts.iter().map(|m| &m.source).collect();
        assert_eq!(
            sources[3..],
            [
                &MountSource::Volume {
                    volume: "scratch".into(),
                    sub_path: None
                },
                &MountSource::Volume {
                    volume: "cfg".into(),
                    sub_path: None
                },
                &MountSource::Volume {
                    volume: "data".into(),
                    sub_path: Some("app".into())
                },
                &MountSource::HostPath {
                    path: "/srv/x".into(),
                    kind: HostPathType::Directory,
                    sub_path: None
                },
                // The attempt's termination message file, last.
                &MountSource::TerminationLog,
            ]
        );
        assert_eq!(runtime.list()[0].containers.len(), 1);
    }

    /// A ConfigMap a volume needs is missing: nothing reaches the runtime, and the pod waits
    /// for its volume (FailedMount, no back-off), as upstream's volume manager.
    #[test]
    fn a_missing_config_map_stops_the_start_before_the_runtime() {
        let runtime = SimRuntime::new().unwrap();
        let e = start_at(&runtime, &pod(json!({})), &[], None, 0).unwrap_err();
        assert_eq!(e.reason, shoal_agent::kubelet::VOLUMES_PENDING);
        assert!(
            e.message.contains("configmap \"cfg\" not found"),
            "{}",
            e.message
        );
        assert!(runtime.calls().is_empty(), "{:?}", runtime.calls());
    }

    /// A fenced pod's container starts only before its run lease ends, and carries that end
    /// to the runtime (whose shim holds it to it); after it, no start reaches the runtime and
    /// the kubelet waits without a back-off.
    #[test]
    fn a_fenced_start_after_the_run_lease_ended_never_reaches_the_runtime() {
        let fenced = pod(json!({"shoal.io/partition-policy": "fenced"}));
        let runtime = SimRuntime::new().unwrap();
        let e = start_at(&runtime, &fenced, &[config_map()], Some(5_000), 5_000).unwrap_err();
        assert_eq!(e.reason, RUN_LEASE_ENDED);
        assert!(!runtime.calls().iter().any(|c| c.starts_with("start")));
        start_at(&runtime, &fenced, &[config_map()], Some(5_000), 4_999).unwrap();
        assert_eq!(
            runtime.containers()[0].request.fence_deadline_ms,
            Some(5_000)
        );
        // Without a lease at all, a fenced container is not even built.
        let runtime = SimRuntime::new().unwrap();
        let e = start_at(&runtime, &fenced, &[config_map()], None, 0).unwrap_err();
        assert!(e.message.contains("run lease"), "{}", e.message);
        assert!(!runtime.calls().iter().any(|c| c.starts_with("start")));
    }

    /// The runtime's refusals are reported as Kubernetes does: a mount or profile the pod names
    /// that cannot be made is the pod's configuration; anything else is the runtime's.
    #[test]
    fn runtime_errors_map_to_the_kubernetes_reasons() {
        let runtime = SimRuntime::new().unwrap();
        runtime.fail_next_start(RuntimeError::Mount {
            field: "app.volumeMounts[2]".into(),
            source: Box::new(RuntimeError::SubPath {
                volume: "data".into(),
                sub_path: "app".into(),
                reason: "a symlink is on its path; it is refused, never followed".into(),
            }),
        });
        let e = start_at(&runtime, &pod(json!({})), &[config_map()], None, 0).unwrap_err();
        assert_eq!(e.reason, "CreateContainerConfigError");
        assert!(
            e.message
                .starts_with("app.volumeMounts[2]: volume data: subPath"),
            "{}",
            e.message
        );
        runtime.fail_next_start(RuntimeError::Command {
            command: "runc run".into(),
            message: "exec format error".into(),
        });
        let e = start_at(&runtime, &pod(json!({})), &[config_map()], None, 0).unwrap_err();
        assert_eq!(e.reason, "RunContainerError");
        // A container of the sim ends when signalled.
        start_at(&runtime, &pod(json!({})), &[config_map()], None, 0).unwrap();
        let meta = runtime.containers()[0].meta.clone();
        runtime.signal(&meta, "KILL").unwrap();
        assert!(matches!(
            runtime.list()[0].containers[0].state,
            ObservedState::Exited { .. }
        ));
    }
}

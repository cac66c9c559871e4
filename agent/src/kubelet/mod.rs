//! The kubelet: runs the pods bound to this node (DESIGN.md §8).
mod act;
pub mod admission;
pub mod container;
pub mod exec;
pub mod image_gc;
pub mod image_puller;
pub mod logs;
pub mod metrics;
pub mod node_service;
pub mod probe;
pub mod start;
mod sync;
pub mod volume_usage;

use std::collections::{HashMap, HashSet};
use std::sync::PoisonError;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use shoal_gossip::Membership;
use shoal_state::{ObjectKey, kind};
use tracing::{debug, info, warn};

use crate::images::{ImageError, ImageStore};
use crate::observed::events::{self, EventType, NewEvent, ObjectRef, Recorder};
use crate::replication::Replication;
use crate::runtime::{ContainerRuntime, ObservedPod, SandboxSpec};
use crate::scheduling::Scheduling;
use shoal_core::placement::partition::{self, Policy};
use shoal_core::pod::plan as pod;
use shoal_core::pod::worker::{Action, PodWorker, ProbeKind, StopSignal, WorkerConfig};

/// Tunables.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// Longest pause between two reconciliations (changes wake the loop at once).
    pub sync_period: Duration,
    pub worker: WorkerConfig,
    /// Node policy: extra capabilities, hostPID and hostIPC allowed (`--allow-privileged`).
    pub allow_privileged: bool,
    /// Processes per pod (`--pod-pids-limit`).
    pub pod_pids_limit: Option<u64>,
    /// What pods may request in all on this node (its capacity, as gossiped to bidders).
    pub allocatable: shoal_model::placement::Resources,
    /// When unused images are removed.
    pub image_gc: shoal_core::image_gc::Thresholds,
    /// Where pods' service-account tokens come from (none: pods asking for one wait).
    pub tokens: Option<Arc<crate::tokens::Tokens>>,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            sync_period: Duration::from_millis(100),
            worker: WorkerConfig::default(),
            allow_privileged: false,
            pod_pids_limit: Some(4096),
            allocatable: shoal_model::placement::Resources::new(u64::MAX, u64::MAX, u64::MAX),
            image_gc: shoal_core::image_gc::Thresholds::default(),
            tokens: None,
        }
    }
}

/// A lifecycle hook that ended: (pod uid, container, attempt, and for a postStart hook how
/// it ended; `None`: a preStop hook).
type HookDone = (String, String, u32, Option<Result<(), String>>);

struct ProbeResult {
    uid: String,
    name: String,
    attempt: u32,
    kind: ProbeKind,
    probe: pod::Probe,
    success: bool,
    message: String,
}

/// Runs this node's pods.
pub struct Kubelet {
    node_name: String,
    host_ip: String,
    runtime: Arc<dyn ContainerRuntime>,
    images: ImageStore,
    replication: Arc<Replication>,
    membership: Arc<Membership>,
    scheduling: Arc<Scheduling>,
    statuses: Arc<crate::observed::pod_status::PodStatusCache>,
    puller: Arc<image_puller::ImagePuller>,
    image_gc: image_gc::ImageGc,
    config: KubeletConfig,
    /// Pods bound to this node, by uid, parsed once per change.
    bound: Mutex<HashMap<String, Arc<BoundPod>>>,
    wake: Mutex<Option<mpsc::Sender<()>>>,
    handle: std::sync::OnceLock<tokio::runtime::Handle>,
    /// The latest usage sample of this node and its containers.
    usage: Mutex<metrics::NodeUsage>,
    /// What users see of the pods here as Events.
    events: Arc<Recorder>,
    /// Pods to evict (uid, why), from [`volume_usage`], for the loop to carry out.
    evictions: Mutex<Vec<(String, String)>>,
    /// The claims' volumes of this node as last measured.
    claim_stats: Mutex<Vec<volume_usage::ClaimStat>>,
    /// Set by [`Kubelet::stop`]; the loop sets `exited` when it has returned.
    stopping: std::sync::atomic::AtomicBool,
    exited: std::sync::atomic::AtomicBool,
    /// When this loop last renewed its fenced pods' fence leases, and how often in all.
    fence_renewed: Mutex<Option<std::time::Instant>>,
    fence_renewals: std::sync::atomic::AtomicU64,
    /// The file volumes (configMap, secret, downwardAPI, projected) of running pods as last
    /// written, by pod uid then volume (a hash of their files), and when they were last
    /// looked at ([`FILES_REFRESH`]).
    files_written: Mutex<FilesWritten>,
    /// The service-account tokens given to this node's pods, by (pod uid, token file): the
    /// token, when it was issued and when it expires (seconds since the epoch).
    pod_tokens: Mutex<HashMap<(String, pod::TokenFile), GivenToken>>,
}

/// A token given to a pod: the token, when it was issued and when it expires (seconds since
/// the epoch).
type GivenToken = (String, u64, u64);

/// When the file volumes were last looked at, and each running pod's (by uid) as last
/// written: a hash of each volume's files, by volume name.
type FilesWritten = (
    Option<std::time::Instant>,
    HashMap<String, std::collections::BTreeMap<String, u64>>,
);

/// How often the file volumes of running pods are compared with what they should hold now
/// (Kubernetes' kubelet: its sync period, a minute, plus its caches' lag; here a pass at most
/// every 2 s rewrites those that changed).
const FILES_REFRESH: Duration = Duration::from_secs(2);

/// How often the kubelet renews the fence leases of the fenced pods it may run (each pass,
/// at most this often).
const FENCE_RENEWAL: Duration = Duration::from_millis(100);

/// A pod bound to this node: the stored object and its plan, parsed when it changes (not on
/// every sync).
struct BoundPod {
    object: Value,
    plan: Result<pod::PodPlan, shoal_model::FieldError>,
    /// Its scheduling fields, for the node's own anti-affinity check at admission.
    placement: Option<shoal_model::placement::PodRequest>,
}

impl BoundPod {
    fn new(object: Value) -> Arc<Self> {
        Arc::new(Self {
            plan: pod::PodPlan::parse(&object),
            placement: shoal_model::placement::PodRequest::from_pod(&object).ok(),
            object,
        })
    }
}

/// The image is on its way from a peer: the start waits without back-off.
const PULLING: &str = "Pulling";
/// A container waits for its pod's claims to be bound (not a failure: no back-off).
pub const VOLUMES_PENDING: &str = "VolumesPending";

/// The pod an action is for, as this pass of the kubelet saw it.
struct Acting<'a> {
    uid: &'a str,
    plan: Option<&'a pod::PodPlan>,
    /// When the node's run lease on the (fenced) pod ends, if it holds one now.
    fence_deadline_ms: Option<u64>,
}

/// The gossiped form of a pod's status.
fn report(pod: &Value, status: Value) -> String {
    let report = crate::observed::pod_status::PodReport {
        namespace: pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned(),
        name: pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        status,
    };
    serde_json::to_string(&report).expect("reports serialize")
}

fn now_ms() -> u64 {
    crate::runtime::shim::unix_ms(SystemTime::now())
}

/// Why a container's log cannot be read on this node.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("pod {uid} does not run on node {node}")]
    NoPod { uid: String, node: String },
    #[error("previous terminated container {container:?} in pod {uid} not found")]
    NoPrevious { uid: String, container: String },
    #[error("container {container:?} in pod {uid} has not started yet")]
    NotStarted { uid: String, container: String },
    #[error(transparent)]
    Read(#[from] std::io::Error),
}

impl Kubelet {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node_name: String,
        host_ip: String,
        runtime: Arc<dyn ContainerRuntime>,
        images: ImageStore,
        replication: Arc<Replication>,
        membership: Arc<Membership>,
        scheduling: Arc<Scheduling>,
        statuses: Arc<crate::observed::pod_status::PodStatusCache>,
        puller: Arc<image_puller::ImagePuller>,
        events: Arc<Recorder>,
        config: KubeletConfig,
    ) -> Arc<Self> {
        Arc::new(Self {
            node_name,
            host_ip,
            runtime,
            images,
            replication,
            membership,
            scheduling,
            statuses,
            puller,
            image_gc: image_gc::ImageGc::new(config.image_gc),
            config,
            bound: Mutex::new(HashMap::new()),
            wake: Mutex::new(None),
            handle: std::sync::OnceLock::new(),
            usage: Mutex::new(metrics::NodeUsage::default()),
            events,
            evictions: Default::default(),
            claim_stats: Default::default(),
            stopping: Default::default(),
            exited: Default::default(),
            fence_renewed: Mutex::new(None),
            fence_renewals: Default::default(),
            files_written: Default::default(),
            pod_tokens: Default::default(),
        })
    }

    pub fn runtime(&self) -> &Arc<dyn ContainerRuntime> {
        &self.runtime
    }

    /// Stops the reconcile loop (pods keep running) and waits up to `timeout` for it to
    /// return, so nothing starts a container afterwards.
    pub fn stop(&self, timeout: Duration) {
        use std::sync::atomic::Ordering;
        self.stopping.store(true, Ordering::SeqCst);
        self.wake();
        let deadline = std::time::Instant::now() + timeout;
        while !self.exited.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the pod cache and the reconcile loop (on its own thread: runtime calls block).
    pub fn start(self: &Arc<Self>) {
        let changes = self.replication.subscribe();
        self.reload_bound();
        let me = self.clone();
        crate::supervise::spawn_receiving("kubelet-pods", changes, move |changes, restarted| {
            me.clone().follow(changes, restarted)
        });
        let me = self.clone();
        crate::supervise::spawn("image-gc", move || me.clone().collect_images());
        let me = self.clone();
        crate::supervise::spawn("volume-usage", move || me.clone().measure_volumes());
        let handle = tokio::runtime::Handle::current();
        let _ = self.handle.set(handle.clone());
        let kubelet = self.clone();
        // Supervised: a panic restarts the loop (with a new wake channel: the old receiver
        // went with the panicked run), which re-adopts the pods from what the runtime shows.
        crate::supervise::spawn_thread("kubelet", move || {
            let (tx, rx) = mpsc::channel();
            *kubelet.wake.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
            kubelet.clone().run(handle.clone(), rx)
        })
        .expect("spawning the kubelet thread");
    }

    fn is_mine(&self, pod: &Value) -> bool {
        pod["spec"]["nodeName"].as_str() == Some(self.node_name.as_str())
    }

    fn reload_bound(&self) {
        let pods = self.replication.read(|s| s.list("", "Pod", None));
        let mine = pods
            .into_iter()
            .filter(|p| self.is_mine(p))
            .filter_map(|p| Some((p["metadata"]["uid"].as_str()?.to_owned(), BoundPod::new(p))))
            .collect();
        *self.bound.lock().unwrap_or_else(PoisonError::into_inner) = mine;
    }

    fn wake(&self) {
        if let Some(tx) = self
            .wake
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            let _ = tx.send(());
        }
    }

    /// Keeps the bound pods current from the store's change feed (`restarted`: after a panic,
    /// which lost the change being taken in, they are listed again first).
    async fn follow(
        self: Arc<Self>,
        changes: crate::supervise::Held<tokio::sync::broadcast::Receiver<shoal_state::Change>>,
        restarted: bool,
    ) {
        let mut changes = changes.lock().await;
        if restarted {
            self.reload_bound();
            self.wake();
        }
        loop {
            match changes.recv().await {
                Ok(change) if change.key.kind == "Pod" && change.key.group.is_empty() => {
                    let Some(uid) = change.object["metadata"]["uid"].as_str() else {
                        continue;
                    };
                    let deleted = change.event == shoal_state::EventType::Deleted;
                    // Parsed before the lock is taken: nothing derived from input runs under it.
                    let parsed = (!deleted && self.is_mine(&change.object))
                        .then(|| BoundPod::new(change.object.clone()));
                    let mut bound = self.bound.lock().unwrap_or_else(PoisonError::into_inner);
                    match parsed {
                        Some(pod) => {
                            bound.insert(uid.to_owned(), pod);
                        }
                        None if bound.remove(uid).is_none() => continue,
                        None => {}
                    }
                    drop(bound);
                    self.wake();
                }
                // A claim just bound that a pod here waits on: its start is tried at once, not
                // at the next sync.
                Ok(change)
                    if change.key.kind == "PersistentVolumeClaim"
                        && change.key.group.is_empty()
                        && change.object["spec"]["volumeName"]
                            .as_str()
                            .is_some_and(|v| !v.is_empty()) =>
                {
                    let waited_on = self
                        .bound
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .values()
                        .any(|p| {
                            p.object["metadata"]["namespace"] == change.key.namespace.as_str()
                                && shoal_model::storage::claims_of(&p.object)
                                    .iter()
                                    .any(|(_, c)| *c == change.key.name)
                        });
                    if waited_on {
                        self.wake();
                    }
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    self.reload_bound();
                    self.wake();
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// The reconcile loop.
    fn run(self: Arc<Self>, handle: tokio::runtime::Handle, wake: mpsc::Receiver<()>) {
        let mut workers: HashMap<String, PodWorker> = HashMap::new();
        let mut published: HashMap<String, String> = HashMap::new();
        let (probe_tx, probe_rx) = mpsc::channel::<ProbeResult>();
        let (hook_tx, hook_rx) = mpsc::channel::<HookDone>();
        // Statuses published by an earlier run of this agent (its pods may be gone).
        for (node_id, key, value) in handle.block_on(
            self.membership
                .dynamic_values(crate::observed::pod_status::KEY_PREFIX),
        ) {
            if node_id == self.membership.node_id() {
                published.insert(key, value);
            }
        }
        info!(node = %self.node_name, runtime = %self.runtime.version(), "kubelet started");
        let mut busy = false;
        let mut admission = admission::Admission::default();
        let mut sampler = metrics::Sampler::default();
        let mut last_sample = 0u64;
        loop {
            // While a container is being created, look again soon: its start shows in files.
            let wait = if busy {
                Duration::from_millis(10)
            } else {
                self.config.sync_period
            };
            match wake.recv_timeout(wait) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                self.exited.store(true, std::sync::atomic::Ordering::SeqCst);
                info!("kubelet stopped");
                return;
            }
            while wake.try_recv().is_ok() {}
            for result in probe_rx.try_iter() {
                if let Some(worker) = workers.get_mut(&result.uid) {
                    worker.probe_done(
                        &result.name,
                        result.attempt,
                        result.kind,
                        &result.probe,
                        result.success,
                        &result.message,
                    );
                }
            }
            for (uid, name, attempt, post_start) in hook_rx.try_iter() {
                if let Some(worker) = workers.get_mut(&uid) {
                    match post_start {
                        Some(result) => worker.post_start_done(&name, attempt, result),
                        None => worker.pre_stop_done(&name, attempt),
                    }
                }
            }
            busy = self.sync(
                &handle,
                &mut workers,
                &mut published,
                &mut admission,
                &probe_tx,
                &hook_tx,
            );
            let now = now_ms();
            if now >= last_sample + 1_000 {
                last_sample = now;
                self.sample_usage(&mut sampler, now);
            }
        }
    }

    /// Whether the stored pod `namespace/name` of incarnation `uid` has the fenced policy (a
    /// pod no longer bound here: only its stored object says).
    fn is_fenced_object(&self, namespace: &str, name: &str, uid: &str) -> bool {
        let key = shoal_state::ObjectKey::new(
            shoal_state::kind::lookup("v1", "Pod").expect("Pod is a known kind"),
            namespace,
            name,
        );
        self.replication.read(|s| {
            s.get(&key).is_some_and(|pod| {
                pod["metadata"]["uid"] == uid
                    && Policy::parse(pod["metadata"]["annotations"][partition::ANNOTATION].as_str())
                        == Policy::Fenced
            })
        })
    }

    /// Renews the fence lease of each pod of `held` (fenced pods this pass found it may run:
    /// the node holds their run leases and is not fenced off), each with the deadline
    /// ([`crate::runtime::lease::monotonic_ms`]) at which its run lease lapses. The renewal
    /// comes from this loop's own progress, not from another task's: a kubelet that is stuck
    /// cannot stop a pod it should stop, so it stops renewing, and the pod's shims kill its
    /// containers at the last deadline written (`runtime::lease`).
    fn renew_fence_leases(&self, held: &[(String, u64)]) {
        let now = std::time::Instant::now();
        {
            let mut renewed = self.fence_renewed.lock().unwrap_or_else(|e| e.into_inner());
            if renewed.is_some_and(|at| now.duration_since(at) < FENCE_RENEWAL) {
                return;
            }
            *renewed = Some(now);
        }
        let counter = self
            .fence_renewals
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (uid, deadline_ms) in held {
            match self.runtime.renew_fence_lease(uid, counter, *deadline_ms) {
                Ok(()) => {}
                // No sandbox yet: no container to hold the lease either.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    warn!(pod = %uid, %error, "cannot renew the fence lease: the pod's fenced containers will be killed by their shims")
                }
            }
        }
    }

    /// Samples the usage of the node and of every running container (cgroups, /proc).
    fn sample_usage(&self, sampler: &mut metrics::Sampler, now: u64) {
        let mut pods = Vec::new();
        let mut live = Vec::new();
        for pod in self.runtime.list() {
            let mut containers = Vec::new();
            for c in &pod.containers {
                if !matches!(c.state, crate::runtime::ObservedState::Running(_)) {
                    continue;
                }
                let Some((memory, cpu_ns)) = self.runtime.usage(&c.meta) else {
                    continue;
                };
                live.push(c.meta.runtime_id.clone());
                containers.push(metrics::ContainerUsage {
                    name: c.meta.name.clone(),
                    cpu_nanocores: sampler.container(&c.meta.runtime_id, now, cpu_ns),
                    cpu_seconds_total: cpu_ns as f64 / 1e9,
                    memory_working_set_bytes: memory,
                });
            }
            if containers.is_empty() {
                continue;
            }
            pods.push(metrics::PodUsage {
                namespace: pod.sandbox.namespace.clone(),
                name: pod.sandbox.name.clone(),
                uid: pod.sandbox.uid.clone(),
                containers,
            });
        }
        let window_ms = sampler.finish_round(now, &live);
        let (cpu_nanocores, memory) = metrics::host_usage()
            .map(|(cpu_ns, memory)| (sampler.host(now, cpu_ns), memory))
            .unwrap_or_default();
        *self.usage.lock().unwrap_or_else(PoisonError::into_inner) = metrics::NodeUsage {
            node: self.node_name.clone(),
            timestamp_ms: now,
            window_ms,
            cpu_nanocores,
            memory_working_set_bytes: memory,
            pods,
        };
    }

    /// The latest usage sample.
    pub fn usage(&self) -> metrics::NodeUsage {
        self.usage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads a container's log on this node. `previous` reads the attempt before the latest.
    pub fn read_log(
        &self,
        uid: &str,
        container: &str,
        previous: bool,
        query: &logs::LogQuery,
    ) -> Result<(logs::LogChunk, bool), LogError> {
        let pod = self.runtime.pod(uid).ok_or_else(|| LogError::NoPod {
            uid: uid.to_owned(),
            node: self.node_name.clone(),
        })?;
        let mut attempts: Vec<&crate::runtime::ObservedContainer> = pod
            .containers
            .iter()
            .filter(|c| c.meta.name == container)
            .collect();
        attempts.sort_by_key(|c| c.meta.attempt);
        let chosen = if previous {
            attempts.len().checked_sub(2).map(|i| attempts[i])
        } else {
            attempts.last().copied()
        };
        let Some(chosen) = chosen else {
            let (uid, container) = (uid.to_owned(), container.to_owned());
            return Err(if previous {
                LogError::NoPrevious { uid, container }
            } else {
                LogError::NotStarted { uid, container }
            });
        };
        let running = !matches!(chosen.state, crate::runtime::ObservedState::Exited { .. });
        let chunk = logs::read(&chosen.log_path, query)?;
        Ok((chunk, running))
    }
}

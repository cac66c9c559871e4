//! The kubelet: runs the pods bound to this node (DESIGN.md §8).
pub mod admission;
pub mod container;
pub mod exec;
pub mod image_puller;
pub mod logs;
pub mod metrics;
pub mod node_service;
pub mod probe;
pub mod start;

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
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            sync_period: Duration::from_millis(100),
            worker: WorkerConfig::default(),
            allow_privileged: false,
            pod_pids_limit: Some(4096),
            allocatable: shoal_model::placement::Resources::new(u64::MAX, u64::MAX, u64::MAX),
        }
    }
}

/// A preStop hook that ended: (pod uid, container, attempt).
type HookDone = (String, String, u32);

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
    config: KubeletConfig,
    /// Pods bound to this node, by uid, parsed once per change.
    bound: Mutex<HashMap<String, Arc<BoundPod>>>,
    wake: Mutex<Option<mpsc::Sender<()>>>,
    handle: std::sync::OnceLock<tokio::runtime::Handle>,
    /// The latest usage sample of this node and its containers.
    usage: Mutex<metrics::NodeUsage>,
    /// What users see of the pods here as Events.
    events: Arc<Recorder>,
    /// Set by [`Kubelet::stop`]; the loop sets `exited` when it has returned.
    stopping: std::sync::atomic::AtomicBool,
    exited: std::sync::atomic::AtomicBool,
    /// When this loop last renewed its fenced pods' fence leases, and how often in all.
    fence_renewed: Mutex<Option<std::time::Instant>>,
    fence_renewals: std::sync::atomic::AtomicU64,
}

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
            config,
            bound: Mutex::new(HashMap::new()),
            wake: Mutex::new(None),
            handle: std::sync::OnceLock::new(),
            usage: Mutex::new(metrics::NodeUsage::default()),
            events,
            stopping: Default::default(),
            exited: Default::default(),
            fence_renewed: Mutex::new(None),
            fence_renewals: Default::default(),
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
            for (uid, name, attempt) in hook_rx.try_iter() {
                if let Some(worker) = workers.get_mut(&uid) {
                    worker.pre_stop_done(&name, attempt);
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

    fn sync(
        &self,
        handle: &tokio::runtime::Handle,
        workers: &mut HashMap<String, PodWorker>,
        published: &mut HashMap<String, String>,
        admission: &mut admission::Admission,
        probe_tx: &mpsc::Sender<ProbeResult>,
        hook_tx: &mpsc::Sender<HookDone>,
    ) -> bool {
        let bound = self
            .bound
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let fenced_stop = self.scheduling.must_stop_fenced();
        let mut observed: HashMap<String, ObservedPod> = self
            .runtime
            .list()
            .into_iter()
            .map(|p| (p.sandbox.uid.clone(), p))
            .collect();
        // Pods numbered from a block this node no longer holds (it lost the block to another
        // node after a partition healed) start over in a new sandbox with a new address: two
        // live pods must never share an IP.
        let stale: Vec<String> = observed
            .values()
            .filter(|p| {
                p.network
                    .is_some_and(|n| !self.runtime.network_is_current(&n))
            })
            .map(|p| p.sandbox.uid.clone())
            .collect();
        for uid in stale {
            info!(pod = %uid, "renumbering the pod: its address is outside this node's pod CIDR");
            match self.runtime.remove_sandbox(&uid) {
                Ok(()) => {
                    observed.remove(&uid);
                    workers.remove(&uid);
                }
                Err(error) => warn!(pod = %uid, %error, "removing the pod's old sandbox"),
            }
        }
        let refused = self.admit(handle, admission, &bound, &observed, workers);
        let uids: HashSet<String> = bound
            .keys()
            .chain(observed.keys())
            .chain(workers.keys())
            .filter(|uid| !refused.contains_key(*uid))
            .cloned()
            .collect();
        let mut statuses: HashMap<String, Option<String>> = HashMap::new();
        for (uid, refusal) in &refused {
            if let Some(pod) = bound.get(uid) {
                let status = json!({"phase": "Pending", "reason": refusal.reason, "message": refusal.message});
                statuses.insert(uid.clone(), Some(report(&pod.object, status)));
            }
        }
        let mut busy = observed.values().any(|p| {
            p.containers
                .iter()
                .any(|c| matches!(c.state, crate::runtime::ObservedState::Creating))
        });
        // Fenced pods this pass may run: their fence leases are renewed after it.
        let mut fence_held: Vec<(String, u64)> = Vec::new();
        for uid in uids {
            let now = now_ms();
            let pod = bound.get(&uid);
            let mut fenced = false;
            // When the node's run lease on this fenced pod ends: its containers start only
            // before it, and their shims hold them to it.
            let mut fence_deadline_ms = None;
            // A pod being deleted is stopped (gracefully), then its object deleted.
            let deleting = pod
                .is_some_and(|p| shoal_core::controllers::garbage::deletion_requested(&p.object));
            let plan: Option<&pod::PodPlan> = match pod.map(|p| &p.plan) {
                Some(Ok(plan)) => {
                    let policy = Policy::parse(
                        plan.annotations
                            .get(partition::ANNOTATION)
                            .map(String::as_str),
                    );
                    // A fenced pod runs only while this node holds its run lease; its shims
                    // kill it when that lease would lapse, whatever this loop does by then.
                    let left = (policy == Policy::Fenced && !fenced_stop)
                        .then(|| self.scheduling.fenced_run_left(&uid))
                        .flatten();
                    fenced = policy == Policy::Fenced && left.is_none();
                    if let Some(left) = left
                        && !deleting
                    {
                        let deadline_ms = crate::runtime::lease::monotonic_ms()
                            .saturating_add(left.as_millis() as u64);
                        fence_held.push((uid.clone(), deadline_ms));
                        fence_deadline_ms = Some(deadline_ms);
                    }
                    (!fenced && !deleting).then_some(plan)
                }
                Some(Err(error)) => {
                    // Not runnable as written (the API validates, but a newer peer may not):
                    // say why and leave whatever runs alone.
                    let status = json!({"phase": "Pending", "reason": "InvalidPodSpec", "message": error.to_string()});
                    let object = &pod.expect("parsed").object;
                    statuses.insert(uid.clone(), Some(report(object, status)));
                    continue;
                }
                None => None,
            };
            let empty = Vec::new();
            let seen = observed.get(&uid);
            let containers = seen.map_or(&empty, |p| &p.containers);
            let worker = workers
                .entry(uid.clone())
                .or_insert_with(|| PodWorker::new(self.config.worker));
            // A fenced pod running here but bound elsewhere now (the majority moved it while
            // this node was away) stops at once too: its grace period would be a time it runs
            // twice.
            let moved_fenced = plan.is_none()
                && seen.is_some_and(|p| {
                    self.is_fenced_object(&p.sandbox.namespace, &p.sandbox.name, &uid)
                });
            if fenced || moved_fenced {
                worker.stop_now();
            }
            if deleting
                && let Some(ms) =
                    pod.and_then(|p| shoal_core::controllers::garbage::deletion_grace_ms(&p.object))
            {
                worker.limit_grace(ms);
            }
            let decision = worker.decide(now, plan, seen.is_some(), containers);
            busy |= decision
                .actions
                .iter()
                .any(|a| matches!(a, Action::Start { .. }));
            for action in decision.actions {
                let pod = Acting {
                    uid: &uid,
                    plan,
                    fence_deadline_ms,
                };
                if let Err(error) = self.act(&pod, containers, worker, action, probe_tx, hook_tx) {
                    warn!(pod = %uid, %error, "kubelet action failed");
                    break;
                }
            }
            let decided = worker.take_events();
            if let Some((namespace, name)) = worker.pod() {
                for e in decided {
                    self.events.record(NewEvent::new(
                        ObjectRef::pod(namespace, name, &uid).container(&e.container, e.init),
                        if e.warning {
                            EventType::Warning
                        } else {
                            EventType::Normal
                        },
                        e.reason,
                        e.message,
                        events::KUBELET,
                    ));
                }
            }
            match decision.status {
                Some(mut status) => {
                    status["hostIP"] = json!(self.host_ip);
                    status["hostIPs"] = json!([{"ip": self.host_ip}]);
                    let pod_ip = if plan.is_some_and(|p| p.host_network) {
                        Some(self.host_ip.clone())
                    } else {
                        seen.and_then(|p| p.network).map(|n| n.ip.to_string())
                    };
                    if let Some(ip) = pod_ip {
                        status["podIP"] = json!(ip);
                        status["podIPs"] = json!([{ "ip": ip }]);
                    }
                    let object = &pod.expect("a status comes with a spec").object;
                    statuses.insert(uid.clone(), Some(report(object, status)));
                }
                // A pod being deleted keeps showing what it last was while it stops.
                None if deleting => {
                    let key = format!("{}{uid}", crate::observed::pod_status::KEY_PREFIX);
                    statuses.insert(uid.clone(), published.get(&key).cloned());
                }
                None => {
                    statuses.insert(uid.clone(), None);
                }
            }
            if decision.finished {
                workers.remove(&uid);
                if deleting && let Some(pod) = pod {
                    self.delete_stopped(handle, &pod.object);
                }
            }
        }
        self.renew_fence_leases(&fence_held);
        // Publish what changed; withdraw statuses of pods no longer here.
        for key in published.keys().cloned().collect::<Vec<_>>() {
            let uid = key.trim_start_matches(crate::observed::pod_status::KEY_PREFIX);
            if !statuses.contains_key(uid) {
                statuses.insert(uid.to_owned(), None);
            }
        }
        for (uid, status) in statuses {
            let key = format!("{}{uid}", crate::observed::pod_status::KEY_PREFIX);
            if published.get(&key) == status.as_ref() {
                continue;
            }
            handle.block_on(self.membership.set_dynamic(&key, status.clone()));
            let report = status.as_deref().and_then(|s| {
                serde_json::from_str::<crate::observed::pod_status::PodReport>(s).ok()
            });
            self.statuses.set_local(&uid, &self.node_name, report);
            match status {
                Some(status) => published.insert(key, status),
                None => published.remove(&key),
            };
        }
        busy
    }

    /// Deletes the object of a pod being deleted once it stopped here, unless finalizers
    /// still hold it (then it stays, stopped, until they are removed).
    fn delete_stopped(&self, handle: &tokio::runtime::Handle, object: &Value) {
        use shoal_core::controllers::garbage;
        if garbage::finish(object, 0, false) != garbage::Finish::Delete {
            return;
        }
        let meta = &object["metadata"];
        let key = shoal_state::ObjectKey::new(
            shoal_state::kind::lookup("v1", "Pod").expect("Pod is a known kind"),
            meta["namespace"].as_str().unwrap_or("default"),
            meta["name"].as_str().unwrap_or(""),
        );
        let uid = meta["uid"].as_str();
        match handle.block_on(self.replication.delete(&key, uid)) {
            Ok(_) => info!(pod = %key, "stopped and deleted"),
            Err(error) => warn!(pod = %key, %error, "stopped; deleting it again next round"),
        }
    }

    /// Node admission ([`admission`]): pods running here (or with a worker) keep their place;
    /// bound pods new to this node are admitted oldest first while they fit. A refused pod is
    /// not started and, unless a DaemonSet owns it (it belongs to this node), is handed back to
    /// the auction (its binding cleared, epoch + 1). Returns the refused pods.
    fn admit(
        &self,
        handle: &tokio::runtime::Handle,
        admission: &mut admission::Admission,
        bound: &HashMap<String, Arc<BoundPod>>,
        observed: &HashMap<String, ObservedPod>,
        workers: &HashMap<String, PodWorker>,
    ) -> HashMap<String, admission::Refusal> {
        use shoal_model::placement::Resources;
        let sandbox_requests = |uid: &str| {
            observed.get(uid).map(|pod| {
                let sandbox = &pod.sandbox;
                Resources::new(sandbox.cpu_request_millis, sandbox.memory_request_bytes, 1)
            })
        };
        let mut pods: Vec<admission::Candidate<'_>> = bound
            .iter()
            .map(|(uid, pod)| admission::Candidate {
                uid,
                bound: Some(admission::BoundHere {
                    created: pod.object["metadata"]["creationTimestamp"]
                        .as_str()
                        .unwrap_or_default(),
                    requests: pod.plan.as_ref().ok().map(|plan| plan.requests),
                }),
                sandbox: sandbox_requests(uid),
                worker: workers.contains_key(uid),
                daemon: pod.object["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["kind"] == "DaemonSet")),
                auctioned: shoal_state::crdt::binding_epoch(&pod.object) > 0,
                placement: pod.placement.as_ref(),
            })
            .collect();
        pods.extend(
            observed
                .keys()
                .filter(|uid| !bound.contains_key(*uid))
                .map(|uid| admission::Candidate {
                    uid,
                    bound: None,
                    sandbox: sandbox_requests(uid),
                    worker: workers.contains_key(uid),
                    daemon: false,
                    auctioned: false,
                    placement: None,
                }),
        );
        let cordoned = self
            .replication
            .read(crate::node_settings::stored)
            .get(&self.node_name)
            .is_some_and(|s| s.unschedulable);
        let verdicts = admission.decide(self.config.allocatable, cordoned, &pods);
        let mut refused = HashMap::new();
        for (uid, verdict) in verdicts {
            let refusal = verdict.refusal;
            if verdict.report {
                warn!(pod = %uid, reason = refusal.reason, message = %refusal.message,
                      "pod refused at admission{}", if verdict.hand_back { "; auctioned again" } else { "" });
            }
            // Until the cleared binding is written (the scheduler may not know the pod yet).
            if verdict.hand_back && handle.block_on(self.scheduling.unbind(&uid, None)) {
                admission.handed_back(&uid);
            }
            refused.insert(uid, refusal);
        }
        refused
    }

    fn sandbox_spec(&self, plan: &pod::PodPlan) -> SandboxSpec {
        SandboxSpec {
            uid: plan.uid.clone(),
            namespace: plan.namespace.clone(),
            name: plan.name.clone(),
            hostname: plan.hostname.clone(),
            memory_limit_bytes: plan.memory_limit_bytes(),
            pids_limit: self.config.pod_pids_limit,
            host_network: plan.host_network,
            dns: shoal_net::dns::PodDns {
                policy: plan.dns.policy.clone(),
                nameservers: plan.dns.nameservers.clone(),
                searches: plan.dns.searches.clone(),
                options: plan.dns.options.clone(),
            },
            cpu_request_millis: plan.requests.cpu_millis,
            memory_request_bytes: plan.requests.memory_bytes,
        }
    }

    fn act(
        &self,
        pod: &Acting<'_>,
        containers: &[crate::runtime::ObservedContainer],
        worker: &mut PodWorker,
        action: Action,
        probe_tx: &mpsc::Sender<ProbeResult>,
        hook_tx: &mpsc::Sender<HookDone>,
    ) -> Result<(), String> {
        let (uid, plan) = (pod.uid, pod.plan);
        let find = |name: &str, attempt: u32| {
            containers
                .iter()
                .find(|c| c.meta.name == name && c.meta.attempt == attempt)
                .map(|c| c.meta.clone())
        };
        match action {
            Action::EnsureSandbox => {
                let plan = plan.ok_or("no pod spec")?;
                self.runtime
                    .ensure_sandbox(&self.sandbox_spec(plan))
                    .map_err(|e| e.to_string())?;
            }
            Action::Start {
                name,
                attempt,
                init,
            } => {
                let plan = plan.ok_or("no pod spec")?;
                match self.start_container(plan, &name, attempt, init, pod.fence_deadline_ms) {
                    Ok(()) => {
                        let pulled = worker.start_succeeded(&name);
                        debug!(pod = %plan.name, container = %name, attempt, "container started");
                        let image = plan
                            .containers
                            .iter()
                            .chain(&plan.init_containers)
                            .find(|c| c.name == name)
                            .map_or("", |c| c.image.as_str());
                        let about = ObjectRef::pod(&plan.namespace, &plan.name, &plan.uid)
                            .container(&name, init);
                        let pulled = if pulled {
                            format!("Successfully pulled image {image:?}")
                        } else {
                            format!("Container image {image:?} already present on machine")
                        };
                        for (reason, message) in [
                            ("Pulled", pulled),
                            ("Created", format!("Created container: {name}")),
                            ("Started", format!("Started container {name}")),
                        ] {
                            self.events.record(NewEvent::new(
                                about.clone(),
                                EventType::Normal,
                                reason,
                                message,
                                events::KUBELET,
                            ));
                        }
                    }
                    Err(error) if error.reason == PULLING => {
                        worker.start_pending(&name, "Pulling", "ContainerCreating", &error.message);
                    }
                    Err(error) if error.reason == start::RUN_LEASE_ENDED => {
                        // Tried again once the node holds the lease again, with no back-off.
                        worker.start_pending(
                            &name,
                            start::RUN_LEASE_ENDED,
                            "ContainerCreating",
                            &error.message,
                        );
                    }
                    Err(error) => {
                        warn!(pod = %plan.name, container = %name, reason = error.reason, message = %error.message, "container not started");
                        worker.start_failed(&name, error.reason, &error.message, now_ms());
                    }
                }
            }
            Action::Signal {
                name,
                attempt,
                signal,
            } => {
                if let Some(meta) = find(&name, attempt) {
                    info!(pod = %uid, container = %name, attempt, ?signal, bound_here = plan.is_some(), "stopping container");
                    let signal = match signal {
                        StopSignal::Term => "TERM",
                        StopSignal::Kill => "KILL",
                    };
                    // The process may have just exited: not an error worth more than a debug line.
                    if let Err(error) = self.runtime.signal(&meta, signal) {
                        debug!(pod = %uid, container = %name, %error, "signal");
                    }
                }
            }
            Action::Probe {
                name,
                attempt,
                kind,
                probe,
            } => {
                let Some(meta) = find(&name, attempt) else {
                    return Ok(());
                };
                let runtime = self.runtime.clone();
                let netns =
                    (!plan.is_some_and(|p| p.host_network)).then(|| self.runtime.netns_path(uid));
                let tx = probe_tx.clone();
                let uid = uid.to_owned();
                // A fresh thread per probe: network probes move their thread into the pod's
                // network namespace, so it must not be reused.
                std::thread::Builder::new()
                    .name("probe".into())
                    .spawn(move || {
                        let (success, message) =
                            probe::run(&probe, netns.as_deref(), |command, timeout| {
                                runtime.exec_sync(&meta, command, timeout)
                            });
                        let _ = tx.send(ProbeResult {
                            uid,
                            name,
                            attempt,
                            kind,
                            probe,
                            success,
                            message,
                        });
                    })
                    .map_err(|e| e.to_string())?;
            }
            Action::PreStop {
                name,
                attempt,
                command,
            } => {
                let Some(meta) = find(&name, attempt) else {
                    return Ok(());
                };
                let grace = Duration::from_millis(
                    plan.map_or(30_000, |p| p.termination_grace_ms).max(1_000),
                );
                let runtime = self.runtime.clone();
                let tx = hook_tx.clone();
                let uid = uid.to_owned();
                std::thread::Builder::new()
                    .name("pre-stop".into())
                    .spawn(move || {
                        if let Err(error) = runtime.exec_sync(&meta, &command, grace) {
                            debug!(pod = %uid, container = %name, %error, "preStop hook failed");
                        }
                        let _ = tx.send((uid, name, attempt));
                    })
                    .map_err(|e| e.to_string())?;
            }
            Action::Remove { name, attempt } => {
                self.runtime
                    .remove_container(uid, &name, attempt)
                    .map_err(|e| e.to_string())?;
            }
            Action::RemoveSandbox => {
                self.runtime
                    .remove_sandbox(uid)
                    .map_err(|e| e.to_string())?;
                info!(pod = %uid, "pod sandbox removed");
            }
        }
        Ok(())
    }

    fn lookup(&self, namespace: &str, kind_name: &str, name: &str) -> Option<Value> {
        let info = kind::lookup("v1", kind_name)?;
        self.replication
            .read(|s| s.get(&ObjectKey::new(info, namespace, name)))
    }

    fn start_container(
        &self,
        plan: &pod::PodPlan,
        name: &str,
        attempt: u32,
        init: bool,
        fence_deadline_ms: Option<u64>,
    ) -> Result<(), container::ConfigError> {
        let c = plan
            .containers
            .iter()
            .chain(&plan.init_containers)
            .find(|c| c.name == name)
            .expect("the worker starts containers of the plan");
        let image = self.images.resolve(&c.image).map_err(|error| match error {
            ImageError::NotFound { .. } => {
                let handle = self.handle.get().expect("set when the kubelet starts");
                match self.puller.pull(&c.image, handle) {
                    Some(image_puller::PullState::Pulling { from }) => container::ConfigError {
                        reason: PULLING,
                        message: format!("pulling image {:?} from node {from}", c.image),
                    },
                    Some(image_puller::PullState::Failed { message }) => container::ConfigError {
                        reason: "ErrImagePull",
                        message: format!("pulling image {:?}: {message}", c.image),
                    },
                    None => container::ConfigError {
                        reason: "ErrImageNeverPull",
                        message: format!(
                            "{error} on node {}, nor on any live peer",
                            self.node_name
                        ),
                    },
                }
            }
            ImageError::Reference { .. } => container::ConfigError {
                reason: "InvalidImageName",
                message: error.to_string(),
            },
            other => container::ConfigError {
                reason: "CreateContainerError",
                message: other.to_string(),
            },
        })?;
        let lookup = |kind: &str, object: &str| self.lookup(&plan.namespace, kind, object);
        start::start(
            self.runtime.as_ref(),
            &start::Start {
                plan,
                container: c,
                attempt,
                init,
                image: &image,
                sandbox: self.sandbox_spec(plan),
                node_name: &self.node_name,
                host_ip: &self.host_ip,
                allow_privileged: self.config.allow_privileged,
                lookup: &lookup,
                fence_deadline_ms,
                monotonic_ms: &crate::runtime::lease::monotonic_ms,
            },
        )
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

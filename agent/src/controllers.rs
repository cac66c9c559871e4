//! Workload controllers without a controller manager (DESIGN.md §7): every workload object
//! is reconciled by one owner node, the live node with the highest rendezvous hash of the
//! object's uid (the auction's rule, [`shoal_core::placement::auction::auctioneer`]), so a dead
//! owner is replaced without an election and work spreads over the cluster. The decisions are
//! pure and live in `shoal_core::controllers` (one file per kind, the garbage collector, the
//! write each action becomes); this shell feeds them the store and the pods' gossiped statuses
//! and writes their actions through the same store API users write with. Level-triggered: a
//! restarted or newly chosen owner simply continues from what it sees.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use shoal_gossip::{MemberState, Membership};
use shoal_state::{ObjectKey, WriteMode, kind};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tracing::{debug, info, warn};

use shoal_core::controllers::workload::PodView;
use shoal_core::controllers::*;

use crate::observed::pod_status::PodStatusCache;
use crate::replication::Replication;

/// Writes one pass keeps in flight.
const WRITES_IN_FLIGHT: usize = 16;

/// The reconcile loop's tunables.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Longest pause between two passes (changes wake the loop sooner).
    pub resync: Duration,
    /// Shortest pause between two passes (a burst of changes is one pass).
    pub debounce: Duration,
    /// Where Service ClusterIPs come from (`--service-cidr`).
    pub service_cidr: ipnet::Ipv4Net,
    /// How often an HorizontalPodAutoscaler is synced (`--hpa-sync-period`; Kubernetes'
    /// `--horizontal-pod-autoscaler-sync-period`, 15 s).
    pub hpa_sync: Duration,
    /// What this agent publishes in the store: the cluster CA and its token-verifying key.
    pub published: Published,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            resync: Duration::from_secs(1),
            debounce: Duration::from_millis(50),
            service_cidr: shoal_model::service_ip::DEFAULT_SERVICE_CIDR
                .parse()
                .expect("the default parses"),
            hpa_sync: Duration::from_secs(15),
            published: Published::default(),
        }
    }
}

/// The controllers of one agent.
pub struct Controllers {
    node_id: u64,
    replication: Arc<Replication>,
    membership: Arc<Membership>,
    statuses: Arc<PodStatusCache>,
    config: ControllerConfig,
    /// Where the controllers' Events go (this node's recorder).
    events: Arc<crate::observed::events::Recorder>,
    /// The nodes' usage samples (the autoscalers' metrics), if this agent reads them.
    usage: Option<Arc<crate::kubelet::node_service::NodeService>>,
    /// What each autoscaler this node owns remembers ([`hpa::Memory`]), by uid.
    autoscalers: std::sync::Mutex<std::collections::HashMap<String, hpa::Memory>>,
    /// When the garbage collector last ran (ms since the epoch).
    collected_ms: std::sync::atomic::AtomicU64,
    /// The claim events recorded already: (claim uid, reason), once each.
    claims_told: std::sync::Mutex<HashSet<(String, &'static str)>>,
}

/// What an agent publishes about the cluster's identity (issue #40).
#[derive(Debug, Clone, Default)]
pub struct Published {
    /// The cluster CA (PEM), given to every namespace as `kube-root-ca.crt`.
    pub root_ca: String,
    /// This agent's ConfigMap with the public key its service-account tokens verify with
    /// ([`crate::tokens::Signer::key_object`]); none for an agent that issues no tokens.
    pub token_key: Option<Value>,
}

/// One pass's [`Snapshot`]: the store's workloads and pods, with the pods' statuses.
fn snapshot(replication: &Replication, statuses: &PodStatusCache) -> Snapshot {
    Snapshot::from_listed(replication.read(Snapshot::list), |pod| {
        statuses.status_of(pod)
    })
}

impl Controllers {
    pub fn new(
        node_id: u64,
        replication: Arc<Replication>,
        membership: Arc<Membership>,
        statuses: Arc<PodStatusCache>,
        config: ControllerConfig,
        events: Arc<crate::observed::events::Recorder>,
        usage: Option<Arc<crate::kubelet::node_service::NodeService>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            node_id,
            replication,
            membership,
            statuses,
            config,
            events,
            usage,
            autoscalers: Default::default(),
            collected_ms: Default::default(),
            claims_told: Default::default(),
        })
    }

    /// Records what an acknowledged controller write tells ([`events`]).
    fn record(&self, event: Option<crate::observed::events::NewEvent>) {
        if let Some(event) = event {
            self.events.record(event);
        }
    }

    /// Starts the reconcile loop, supervised ([`crate::supervise`]).
    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        crate::supervise::spawn("controllers", move || me.clone().run());
    }

    async fn run(self: Arc<Self>) {
        let mut changes = self.replication.subscribe();
        let mut statuses = self.statuses.subscribe();
        let wakes = |change: &shoal_state::Change| {
            matches!(
                change.key.kind.as_str(),
                "Pod"
                    | "ReplicaSet"
                    | "StatefulSet"
                    | "DaemonSet"
                    | "ControllerRevision"
                    | "PersistentVolumeClaim"
                    | "Deployment"
                    | "Job"
                    | "CronJob"
                    | "Service"
                    | "Namespace"
                    | "HorizontalPodAutoscaler"
            )
        };
        // The objects whose reconcile failed, skipped until their retry ([`quarantine`]).
        let mut quarantine = Quarantine::new();
        loop {
            // Only the statuses of pods a controller controls feed a reconcile (readiness,
            // completion); a bare pod's status changing wakes nothing.
            let began = tokio::time::Instant::now();
            let (controlled, requeue) = self.pass(&mut quarantine).await;
            // Under a stream of changes (a burst of creates) passes would run back to back and
            // take a whole core from the API and the scheduler: rest at least as long as the
            // pass took.
            tokio::time::sleep(self.config.debounce.max(began.elapsed())).await;
            // What came in during the pass and the debounce is covered by one more pass, all of
            // it: taking one change per pass would replay a burst (a thousand pods created) as
            // a thousand passes over the whole store.
            let mut again = false;
            loop {
                match changes.try_recv() {
                    Ok(c) => again |= wakes(&c),
                    Err(TryRecvError::Lagged(_)) => again = true,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Closed) => return,
                }
            }
            loop {
                match statuses.try_recv() {
                    Ok(c) => again |= controlled.contains(&c.uid),
                    Err(TryRecvError::Lagged(_)) => again = true,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Closed) => return,
                }
            }
            if again {
                continue;
            }
            // Wait for a change of a workload or a pod (stored or observed), the earliest
            // requeue a controller asked for, or the resync.
            let wait = requeue.map_or(self.config.resync, |at_ms| {
                Duration::from_millis(at_ms.saturating_sub(now_ms())).min(self.config.resync)
            });
            let resync = tokio::time::sleep(wait);
            tokio::pin!(resync);
            loop {
                tokio::select! {
                    _ = &mut resync => break,
                    change = changes.recv() => match change {
                        Ok(c) if wakes(&c) => break,
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => return,
                    },
                    change = statuses.recv() => match change {
                        Ok(c) if controlled.contains(&c.uid) => break,
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => return,
                    },
                }
            }
        }
    }

    /// The live nodes' numeric ids (owners are chosen among them).
    async fn live_nodes(&self) -> Vec<u64> {
        self.membership
            .members()
            .await
            .into_iter()
            .filter(|m| m.is_self || m.state == MemberState::Alive)
            .filter_map(|m| u64::from_str_radix(&m.node_id, 16).ok())
            .collect()
    }

    fn owns(&self, object: &Value, live: &[u64]) -> bool {
        shoal_core::placement::auction::auctioneer(uid_of(object), live.iter().copied())
            == Some(self.node_id)
    }

    /// One reconcile of every workload this node owns; returns the uids of the pods some
    /// controller controls (whose statuses matter to the next pass) and the earliest requeue
    /// a controller asked for (ms since the epoch).
    async fn pass(&self, quarantine: &mut Quarantine) -> (HashSet<String>, Option<u64>) {
        let live = self.live_nodes().await;
        let snapshot = snapshot(&self.replication, &self.statuses);
        let mut controlled: HashSet<String> = snapshot
            .pods
            .values()
            .flat_map(NamespacePods::all)
            .filter(|p| p.controller_uid.is_some())
            .map(|p| p.uid.clone())
            .collect();
        let now = now_ms();
        let mut random = || rand::random::<u64>();
        let mut actions = decide(
            &snapshot,
            &|o| self.owns(o, &live),
            now,
            &mut random,
            quarantine,
        );
        actions.extend(self.autoscale(&snapshot, &live, now).await);
        // One due already asked for nothing this pass could do: not a reason to spin.
        let requeue = earliest_requeue(&actions).filter(|at| *at > now);
        // Concurrently: each write waits for its quorum, and a ReplicaSet of 100 creates 100.
        // The pods this pass made are controlled too: their first statuses (Running, Ready)
        // wake the next pass, rather than the resync (an OrderedReady StatefulSet waits on
        // each).
        use futures_util::StreamExt as _;
        let created: Vec<Option<String>> = futures_util::stream::iter(actions)
            .map(|action| self.apply(action))
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        controlled.extend(created.into_iter().flatten());
        self.service_ips(&live).await;
        self.namespaces(&live).await;
        let now = now_ms();
        let last = self.collected_ms.load(std::sync::atomic::Ordering::Relaxed);
        if now >= last.saturating_add(GARBAGE_INTERVAL_MS) {
            self.collected_ms
                .store(now, std::sync::atomic::Ordering::Relaxed);
            self.collect_garbage(&live, now).await;
            self.claim_events(&live);
        }
        (controlled, requeue)
    }

    /// Why the claims this node owns that are not bound wait, as Events
    /// ([`shoal_core::storage::claim_events`]), once per claim and reason.
    fn claim_events(&self, live: &[u64]) {
        let (claims, volumes, classes) = self.replication.read(|s| {
            (
                s.list("", "PersistentVolumeClaim", None),
                s.list("", "PersistentVolume", None),
                s.list("storage.k8s.io", "StorageClass", None),
            )
        });
        let owned: Vec<Value> = claims.into_iter().filter(|c| self.owns(c, live)).collect();
        let mut told = self.claims_told.lock().unwrap_or_else(|e| e.into_inner());
        let uids: HashSet<&str> = owned.iter().map(uid_of).collect();
        told.retain(|(uid, _)| uids.contains(uid.as_str()));
        let waiting = owned
            .iter()
            .any(|c| c["spec"]["volumeName"].as_str().is_none_or(str::is_empty));
        if !waiting {
            return;
        }
        // Only then are the pods read: which claims they name.
        let named: HashSet<String> = self.replication.read(|s| {
            s.list("", "Pod", None)
                .iter()
                .flat_map(|p| {
                    let ns = p["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or("default")
                        .to_owned();
                    shoal_model::storage::claims_of(p)
                        .into_iter()
                        .map(move |(_, claim)| format!("{ns}/{claim}"))
                })
                .collect()
        });
        let events = shoal_core::storage::claim_events(&owned, &volumes, &classes, &|ns, name| {
            named.contains(&format!("{ns}/{name}"))
        });
        for e in events {
            if !told.insert((e.claim.2.clone(), e.reason)) {
                continue;
            }
            let (namespace, name, uid) = e.claim;
            self.events.record(crate::observed::events::NewEvent::new(
                crate::observed::events::ObjectRef {
                    api_version: "v1".into(),
                    kind: "PersistentVolumeClaim".into(),
                    namespace,
                    name,
                    uid,
                    field_path: String::new(),
                },
                if e.warning {
                    crate::observed::events::EventType::Warning
                } else {
                    crate::observed::events::EventType::Normal
                },
                e.reason,
                e.message,
                "persistentvolume-controller",
            ));
        }
    }

    /// One round of [`garbage`] collection: each dependent whose first owner this node owns
    /// is judged from what the store holds of its owners, and each object being deleted that
    /// this node owns is finished; what a round leaves undone (a failed write, a dependent
    /// still going) the next one does.
    async fn collect_garbage(&self, live: &[u64], now: u64) {
        let alive_names: HashSet<String> = self
            .membership
            .members()
            .await
            .into_iter()
            .filter(|m| m.is_self || matches!(m.state, MemberState::Alive | MemberState::Suspect))
            .map(|m| m.name().to_owned())
            .collect();
        // The store's lock is held for the copy only; the round runs off the async workers.
        let read = self.replication.read(GarbageRead::of);
        let (node, live) = (self.node_id, live.to_vec());
        let planned = tokio::task::spawn_blocking(move || {
            let alive = |name: &str| alive_names.contains(name);
            garbage_plan(&read, node, &live, &alive, now)
        })
        .await;
        let Ok(plan) = planned else {
            warn!("the garbage collector's round panicked; the next one runs as usual");
            return;
        };
        for step in garbage_writes(plan, &now_rfc3339()) {
            match self.graceful(step.write) {
                Write::Over { key, uid, lay } => {
                    let terminating = matches!(lay, Lay::Terminate { .. });
                    let written = self
                        .write_over(key.clone(), &uid, lay.what(), |current| lay.apply(current))
                        .await;
                    if terminating && step.announce {
                        self.record(written.as_ref().and_then(events::deleted));
                    }
                    if step.then_delete && written.is_some_and(|w| !has_finalizers(&w)) {
                        match self.replication.delete(&key, Some(&uid)).await {
                            Ok(_) => info!(object = %key, "finalized and deleted"),
                            Err(e) => debug!(object = %key, error = %e, "not deleted yet"),
                        }
                    }
                }
                Write::Delete { key, uid } => match self.replication.delete(&key, Some(&uid)).await
                {
                    Ok(stored) => {
                        info!(object = %key, "garbage collected");
                        if step.announce {
                            self.record(events::deleted(&stored));
                        }
                    }
                    Err(e) => debug!(object = %key, error = %e, "garbage not collected"),
                },
                Write::Create(_) => {}
            }
        }
    }

    /// `write`, with a delete made as [`delete_write`] makes it from this node's copy of the
    /// object (a pod on a node is deleted gracefully).
    fn graceful(&self, write: Write) -> Write {
        match write {
            Write::Delete { key, uid } => {
                let current = self.replication.read(|s| s.get(&key));
                delete_write(key, uid, current.as_ref(), &now_rfc3339())
            }
            other => other,
        }
    }

    /// One sync of each autoscaler this node owns that is due ([`hpa::reconcile`]), from the
    /// usage every live node samples (asked only when one is due).
    async fn autoscale(&self, snapshot: &Snapshot, live: &[u64], now: u64) -> Vec<Action> {
        let owned: Vec<&Value> = snapshot
            .autoscalers
            .iter()
            .filter(|h| self.owns(h, live))
            .collect();
        let sync_ms = u64::try_from(self.config.hpa_sync.as_millis()).unwrap_or(u64::MAX);
        let due = {
            let mut memories = self.autoscalers.lock().unwrap_or_else(|e| e.into_inner());
            memories.retain(|uid, _| owned.iter().any(|h| uid_of(h) == uid));
            owned
                .iter()
                .any(|h| memories.get(uid_of(h)).is_none_or(|m| m.due(now, sync_ms)))
        };
        let Some(source) = self.usage.as_ref().filter(|_| due) else {
            return Vec::new();
        };
        let usage: std::collections::HashMap<String, hpa::Usage> = source
            .cluster_usage()
            .await
            .into_iter()
            .flat_map(|node| node.pods)
            .map(|pod| {
                let sum = pod
                    .containers
                    .iter()
                    .fold(hpa::Usage::default(), |u, c| hpa::Usage {
                        cpu_nanocores: u.cpu_nanocores.saturating_add(c.cpu_nanocores),
                        memory_bytes: u.memory_bytes.saturating_add(c.memory_working_set_bytes),
                    });
                (pod.uid, sum)
            })
            .collect();
        let mut memories = self.autoscalers.lock().unwrap_or_else(|e| e.into_inner());
        let mut actions = Vec::new();
        for autoscaler in owned {
            let namespace = namespace_of(autoscaler);
            let reference = &autoscaler["spec"]["scaleTargetRef"];
            let target_name = reference["name"].as_str().unwrap_or("");
            let targets = match reference["kind"].as_str() {
                Some("Deployment") => &snapshot.deployments,
                Some("ReplicaSet") => &snapshot.replica_sets,
                Some("StatefulSet") => &snapshot.stateful_sets,
                _ => &Vec::new(),
            };
            let target = targets
                .iter()
                .find(|t| namespace_of(t) == namespace && name_of(t) == target_name);
            let pods: Vec<&PodView> = snapshot.pods_in(namespace).iter().collect();
            let memory = memories.entry(uid_of(autoscaler).to_owned()).or_default();
            actions.extend(hpa::reconcile(
                autoscaler, target, &pods, &usage, memory, now, sync_ms,
            ));
        }
        actions
    }

    /// Creates the built-in namespaces (their owner: the node owning a fixed name), and empties
    /// then deletes the namespaces being deleted that this node owns ([`namespace::finalize`]).
    async fn namespaces(&self, live: &[u64]) {
        let info = kind::lookup("v1", "Namespace").expect("Namespace is a stored kind");
        let namespaces = self.replication.read(|s| s.list("", "Namespace", None));
        let names: Vec<String> = namespaces
            .iter()
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        let bootstrap = shoal_core::placement::auction::auctioneer(
            "shoal-built-in-namespaces",
            live.iter().copied(),
        ) == Some(self.node_id);
        if bootstrap {
            self.built_in_storage_class().await;
            self.default_rbac().await;
            self.api_service().await;
            for object in namespace::missing_built_ins(&names) {
                if let Ok(valid) = shoal_state::validate(object, "") {
                    match self.replication.write(valid, WriteMode::Create).await {
                        Ok((o, _)) => {
                            info!(namespace = %o["metadata"]["name"], "built-in namespace created")
                        }
                        Err(e) => debug!(error = %e, "built-in namespace not created"),
                    }
                }
            }
        }
        // Each namespace's owner gives it its `default` ServiceAccount.
        let accounts: Vec<(String, String)> = self.replication.read(|s| {
            s.list("", "ServiceAccount", None)
                .iter()
                .map(|a| {
                    let text = |f: &str| a["metadata"][f].as_str().unwrap_or_default().to_owned();
                    (text("namespace"), text("name"))
                })
                .collect()
        });
        let owned: Vec<Value> = namespaces
            .iter()
            .filter(|n| self.owns(n, live))
            .cloned()
            .collect();
        // And the cluster's CA, for the pods' service-account volumes.
        let root_cas: Vec<(String, String)> = self.replication.read(|s| {
            let info = kind::lookup("v1", "ConfigMap").expect("ConfigMap is a stored kind");
            owned
                .iter()
                .filter_map(|n| n["metadata"]["name"].as_str())
                .filter(|ns| {
                    s.get(&ObjectKey::new(info, ns, namespace::ROOT_CA))
                        .is_some()
                })
                .map(|ns| (ns.to_owned(), namespace::ROOT_CA.to_owned()))
                .collect()
        });
        let made = namespace::missing_default_accounts(&owned, &accounts)
            .into_iter()
            .chain(namespace::missing_root_ca(
                &owned,
                &root_cas,
                &self.config.published.root_ca,
            ));
        for object in made {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            let what = describe(&object);
            if let Ok(valid) = shoal_state::validate(object, &ns) {
                match self.replication.write(valid, WriteMode::Create).await {
                    Ok(_) => debug!(namespace = %ns, object = %what, "created"),
                    Err(e) => debug!(namespace = %ns, object = %what, error = %e, "not created"),
                }
            }
        }
        self.publish_token_key().await;
        for ns in namespaces
            .iter()
            .filter(|n| namespace::terminating(n) && self.owns(n, live))
        {
            // Contents first, then (looked at again at once) the emptied namespace.
            for _ in 0..2 {
                if !self.finalize_namespace(info, ns).await {
                    break;
                }
            }
        }
    }

    /// The `default/kubernetes` Service, made while it is missing (as the apiserver keeps it:
    /// a deleted one comes back), on the service CIDR's first address.
    async fn api_service(&self) {
        let Some(info) = kind::lookup("v1", "Service") else {
            return;
        };
        let (ns, name) = crate::endpoints::API_SERVICE;
        let key = ObjectKey::new(info, ns, name);
        if self.replication.read(|s| s.get(&key).is_some()) {
            return;
        }
        let ip = std::net::Ipv4Addr::from(u32::from(self.config.service_cidr.network()) + 1);
        if let Ok(valid) = shoal_state::validate(crate::endpoints::api_service(ip), ns) {
            match self.replication.write(valid, WriteMode::Create).await {
                Ok(_) => info!(%ip, "the kubernetes Service created"),
                Err(e) => debug!(error = %e, "the kubernetes Service not created"),
            }
        }
    }

    /// Writes this agent's token-verifying key ([`Published::token_key`]) while the store
    /// does not hold it as it is (once `kube-system` exists).
    async fn publish_token_key(&self) {
        let Some(object) = &self.config.published.token_key else {
            return;
        };
        let (Some(info), Some(name)) = (
            kind::lookup("v1", "ConfigMap"),
            object["metadata"]["name"].as_str(),
        ) else {
            return;
        };
        let ns = crate::tokens::KEY_NAMESPACE;
        let (stored, namespace_exists) = self.replication.read(|s| {
            let namespace = kind::lookup("v1", "Namespace")
                .is_some_and(|n| s.get(&ObjectKey::new(n, "", ns)).is_some());
            (s.get(&ObjectKey::new(info, ns, name)), namespace)
        });
        if !namespace_exists || stored.is_some_and(|s| s["data"] == object["data"]) {
            return;
        }
        if let Ok(valid) = shoal_state::validate(object.clone(), ns) {
            match self.replication.write(valid, WriteMode::Upsert).await {
                Ok(_) => info!(configmap = %name, "service-account token key published"),
                Err(e) => warn!(error = %e, "service-account token key not published"),
            }
        }
    }

    /// The StorageClass every cluster starts with (`local-path`, the built-in provisioner's),
    /// made while the cluster has no StorageClass and its tombstone does not say a user
    /// deleted it (a class the user changed or replaced is theirs).
    async fn built_in_storage_class(&self) {
        let Some(info) = kind::lookup("storage.k8s.io/v1", "StorageClass") else {
            return;
        };
        let key = ObjectKey::new(info, "", shoal_model::storage::DEFAULT_CLASS);
        let (any, seen) = self.replication.read(|s| {
            (
                !s.list("storage.k8s.io", "StorageClass", None).is_empty(),
                s.get(&key).is_some() || s.deleted(&key).is_some(),
            )
        });
        if any || seen {
            return;
        }
        if let Ok(valid) = shoal_state::validate(shoal_model::storage::built_in_class(), "") {
            let mut valid = valid;
            shoal_model::validation::default("StorageClass", &mut valid.body);
            match self.replication.write(valid, WriteMode::Create).await {
                Ok(_) => info!("built-in StorageClass local-path created"),
                Err(e) => debug!(error = %e, "built-in StorageClass not created"),
            }
        }
    }

    /// The default ClusterRoles and ClusterRoleBindings ([`shoal_model::rbac::bootstrap`]),
    /// each made while it is missing and its tombstone does not say a user deleted it (as
    /// upstream's reconciliation, a default the user changed is theirs).
    async fn default_rbac(&self) {
        for object in shoal_model::rbac::bootstrap() {
            let (Some(api_version), Some(kind_name), Some(name)) = (
                object["apiVersion"].as_str(),
                object["kind"].as_str(),
                object["metadata"]["name"].as_str(),
            ) else {
                continue;
            };
            let Some(info) = kind::lookup(api_version, kind_name) else {
                continue;
            };
            let key = ObjectKey::new(info, "", name);
            if self
                .replication
                .read(|s| s.get(&key).is_some() || s.deleted(&key).is_some())
            {
                continue;
            }
            let what = format!("{kind_name}/{name}");
            match shoal_state::validate(object, "") {
                Ok(valid) => match self.replication.write(valid, WriteMode::Create).await {
                    Ok(_) => info!(object = %what, "default RBAC object created"),
                    Err(e) => debug!(object = %what, error = %e, "default RBAC object not created"),
                },
                Err(e) => warn!(object = %what, error = %e, "invalid default RBAC object"),
            }
        }
    }

    /// One step of [`namespace::finalize`]; returns whether it deleted contents (the next step
    /// may delete the namespace).
    async fn finalize_namespace(&self, info: &'static shoal_state::KindInfo, ns: &Value) -> bool {
        {
            let name = ns["metadata"]["name"].as_str().unwrap_or_default();
            let contents: Vec<(ObjectKey, String)> = self.replication.read(|s| {
                shoal_state::KINDS
                    .iter()
                    .filter(|k| k.namespaced)
                    .flat_map(|k| {
                        s.list(k.group, k.kind, Some(name))
                            .into_iter()
                            .map(move |o| {
                                (
                                    ObjectKey::new(
                                        k,
                                        name,
                                        o["metadata"]["name"].as_str().unwrap_or(""),
                                    ),
                                    o["metadata"]["uid"].as_str().unwrap_or("").to_owned(),
                                )
                            })
                    })
                    .collect()
            });
            match namespace::finalize(ns, contents) {
                namespace::Finalize::Contents(objects) => {
                    futures_util::StreamExt::for_each_concurrent(
                        futures_util::stream::iter(objects),
                        WRITES_IN_FLIGHT,
                        |(key, uid)| async move {
                            if let Err(e) = self.replication.delete(&key, Some(&uid)).await {
                                debug!(object = %key, error = %e, "namespace content not deleted");
                            }
                        },
                    )
                    .await;
                    true
                }
                namespace::Finalize::Namespace(uid) => {
                    let key = ObjectKey::new(info, "", name);
                    match self.replication.delete(&key, Some(&uid)).await {
                        Ok(_) => info!(namespace = %name, "namespace emptied and deleted"),
                        Err(e) => debug!(namespace = %name, error = %e, "namespace not deleted"),
                    }
                    false
                }
                namespace::Finalize::Nothing => false,
            }
        }
    }

    /// Gives the Services this node owns the ClusterIP and node ports they need
    /// ([`service_ip::reconcile`], [`service_ip::reconcile_node_ports`]).
    async fn service_ips(&self, live: &[u64]) {
        let services = self.replication.read(|s| s.list("", "Service", None));
        for (i, ip) in service_ip::reconcile(&services, self.config.service_cidr) {
            let ip = serde_json::json!(ip.to_string());
            self.update_service(&services[i], live, "clusterIP", "ClusterIP", |spec| {
                spec["clusterIPs"] = serde_json::json!([ip]);
                spec["clusterIP"] = ip.clone();
            })
            .await;
        }
        for (i, ports) in service_ip::reconcile_node_ports(&services) {
            self.update_service(&services[i], live, "ports", "node ports", |spec| {
                spec["ports"] = serde_json::json!(&ports);
            })
            .await;
        }
    }

    /// Applies `change` to the spec of `service` as stored now, if this node owns it and its
    /// `field` is still what the decision saw (a user's edit since wins), and writes it.
    async fn update_service(
        &self,
        service: &Value,
        live: &[u64],
        field: &str,
        what: &str,
        mut change: impl FnMut(&mut Value),
    ) {
        if !self.owns(service, live) {
            return;
        }
        let Some(key) = key_of(
            "Service",
            namespace_of(service),
            service["metadata"]["name"].as_str().unwrap_or(""),
        ) else {
            return;
        };
        self.write_over(key, uid_of(service), what, |current| {
            if current["spec"][field] != service["spec"][field] {
                return false;
            }
            change(&mut current["spec"]);
            true
        })
        .await;
    }

    /// Lays `change` over `key` as stored now (not as read for the decision, so a binding or a
    /// user's edit made since is kept) if it is still the incarnation `uid` and `change` agrees
    /// (returns true), and writes it through the store API users write with — from the version
    /// it read, and laid over again if another write came in between (as the API's patches).
    async fn write_over(
        &self,
        key: ObjectKey,
        uid: &str,
        what: &str,
        mut change: impl FnMut(&mut Value) -> bool,
    ) -> Option<Value> {
        for attempt in 1..=WRITE_ATTEMPTS {
            let current = self.replication.read(|s| s.get(&key))?;
            let valid = match overlay(&key, uid, current, &mut change)? {
                Ok(valid) => valid,
                Err(e) => {
                    warn!(object = %key, error = %e, "controller built an invalid {what}");
                    return None;
                }
            };
            match self.replication.write(valid, WriteMode::Update).await {
                Ok((written, _)) => {
                    info!(object = %key, "controller wrote {what}");
                    return Some(written);
                }
                Err(crate::replication::WriteError::Store(shoal_state::StoreError::Conflict {
                    ..
                })) if attempt < WRITE_ATTEMPTS => {
                    debug!(object = %key, attempt, "{what} raced another write; laid over again");
                }
                Err(e) => {
                    debug!(object = %key, error = %e, "controller could not write {what}");
                    return None;
                }
            }
        }
        None
    }

    /// Writes what `action` asks; the uid of the pod it created, if it created one.
    async fn apply(&self, action: Action) -> Option<String> {
        if let Action::Failed { object, message } = &action {
            warn!(object = %format!("{}/{}/{}", object.kind, object.namespace, object.name),
                %message, "reconcile failed: quarantined");
            self.record(Some(events::reconcile_failed(object.clone(), message)));
            return None;
        }
        let rescaled = match &action {
            Action::Scale {
                namespace,
                autoscaler,
                autoscaler_uid,
                message,
                ..
            } => Some(events::rescaled(
                namespace,
                autoscaler,
                autoscaler_uid,
                message,
            )),
            _ => None,
        };
        match write_of(action).map(|w| self.graceful(w)) {
            None => {}
            Some(Write::Create(mut object)) => {
                let what = describe(&object);
                let namespace = namespace_of(&object).to_owned();
                if object["kind"] == "Pod" && object["apiVersion"] == "v1" {
                    crate::api::admission::admit_new_pod(&self.replication, &mut object);
                }
                if object["kind"] == "PersistentVolumeClaim" && object["apiVersion"] == "v1" {
                    crate::api::admission::admit_new_claim(&self.replication, &mut object);
                }
                match shoal_state::validate(object, &namespace) {
                    Ok(valid) => match self.replication.write(valid, WriteMode::Create).await {
                        Ok((written, _)) => {
                            info!(object = %what, "controller created");
                            self.record(events::created(&written));
                            if written["kind"] == "Pod" {
                                return written["metadata"]["uid"].as_str().map(str::to_owned);
                            }
                        }
                        Err(e) => debug!(object = %what, error = %e, "controller create failed"),
                    },
                    Err(e) => {
                        warn!(object = %what, error = %e, "controller built an invalid object")
                    }
                }
            }
            Some(Write::Over { key, uid, lay }) => {
                let mut from = None;
                let terminating = matches!(lay, Lay::Terminate { .. });
                let written = self
                    .write_over(key, &uid, lay.what(), |current| {
                        from = lay.scales_from(current);
                        lay.apply(current)
                    })
                    .await;
                if let Some(written) = written {
                    if terminating {
                        self.record(events::deleted(&written));
                    } else if let Some(event) = rescaled {
                        self.record(Some(event));
                    } else if let Some(from) = from {
                        self.record(events::scaled(&written, from));
                    }
                }
            }
            Some(Write::Delete { key, uid }) => {
                match self.replication.delete(&key, Some(&uid)).await {
                    Ok(stored) => {
                        info!(object = %key, "controller deleted");
                        self.record(events::deleted(&stored));
                    }
                    Err(e) => debug!(object = %key, error = %e, "controller delete failed"),
                }
            }
        }
        None
    }
}

/// How often the garbage collector runs.
const GARBAGE_INTERVAL_MS: u64 = 2_000;

/// How often a controller's write is laid over a newer version before it gives up (the next
/// pass decides again).
const WRITE_ATTEMPTS: u32 = 5;

/// Now, as `metadata` timestamps are written.
fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// Milliseconds since the epoch (0 before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn describe(object: &Value) -> String {
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or("?"),
        namespace_of(object),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

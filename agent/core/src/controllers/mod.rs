//! The workload controllers' pure core (DESIGN.md §7): every decision a controller makes, from
//! a snapshot of the store and the pods' observed statuses to [`Action`]s and the store writes
//! they become. No I/O: the agent's shell (`agent/src/controllers.rs`) reads the store, chooses
//! each object's owner node and writes; the partition simulator
//! (`chaos-tests/src/sim/partition.rs`) drives the same functions — [`decide`], [`write_of`],
//! [`overlay`], [`garbage_plan`], [`garbage_writes`] — on both sides of a cut over real stores.
//!
//! One file per kind ([`replica_set`], [`deployment`], [`daemon_set`], [`stateful_set`],
//! [`job`], [`cron_job`], [`hpa`], [`namespace`], [`service_ip`]), each `reconcile → actions`; [`garbage`] is the only
//! garbage collector (the API's delete does not cascade); [`quarantine`] keeps a panicking
//! reconcile from stopping the others; [`workload`] is what they share (pod views, actions).
//!
//! After a partition both sides' owners may have acted; the next reconcile on the healed
//! cluster removes the surplus in the same deterministic order everywhere
//! ([`replica_set::removal_rank`]).

pub mod cron_job;
pub mod daemon_set;
pub mod deployment;
pub mod events;
pub mod garbage;
pub mod hpa;
pub mod job;
pub mod namespace;
pub mod quarantine;
pub mod replica_set;
pub mod service_ip;
pub mod stateful_set;
pub mod workload;

use std::collections::{BTreeMap, HashSet};

use serde_json::Value;
use shoal_state::{ObjectKey, kind};

pub use quarantine::Quarantine;
pub use workload::Action;
use workload::PodView;

/// Everything one pass decides with: the workloads and pods of each namespace, with the
/// pods' observed statuses.
pub struct Snapshot {
    pub deployments: Vec<Value>,
    pub replica_sets: Vec<Value>,
    pub stateful_sets: Vec<Value>,
    /// The DaemonSets (their template history: `kubectl rollout history|undo daemonset`).
    pub daemon_sets: Vec<Value>,
    /// Every ControllerRevision (the StatefulSets' history).
    pub controller_revisions: Vec<Value>,
    /// Every PersistentVolumeClaim (the StatefulSets' claims), when there is a StatefulSet.
    pub claims: Vec<Value>,
    pub jobs: Vec<Value>,
    pub cron_jobs: Vec<Value>,
    pub autoscalers: Vec<Value>,
    pub pods: BTreeMap<String, NamespacePods>,
}

/// The pods of one namespace, grouped by controlling owner: a controller reads its own pods
/// and the orphans, not every pod of the namespace (1,000 ReplicaSets over 10,000 pods would
/// otherwise be 10 million selector checks a pass; `reconcile-bench` in BENCHMARKS.md).
#[derive(Default)]
pub struct NamespacePods {
    /// Sorted by controller uid, orphans first.
    pods: Vec<PodView>,
    owners: std::collections::HashMap<String, std::ops::Range<usize>>,
    orphans: std::ops::Range<usize>,
}

impl NamespacePods {
    /// Groups `pods` (all of one namespace).
    pub fn new(mut pods: Vec<PodView>) -> Self {
        pods.sort_by(|a, b| a.controller_uid.cmp(&b.controller_uid));
        let mut owners = std::collections::HashMap::new();
        let mut orphans = 0..0;
        let mut start = 0;
        while start < pods.len() {
            let owner = pods[start].controller_uid.clone();
            let end = start
                + pods[start..]
                    .iter()
                    .take_while(|p| p.controller_uid == owner)
                    .count();
            match owner {
                Some(uid) => {
                    owners.insert(uid, start..end);
                }
                None => orphans = start..end,
            }
            start = end;
        }
        Self {
            pods,
            owners,
            orphans,
        }
    }

    pub fn all(&self) -> &[PodView] {
        &self.pods
    }

    /// The pods whose controlling owner has `uid`.
    pub fn owned_by(&self, uid: &str) -> &[PodView] {
        self.owners
            .get(uid)
            .map_or(&[], |range| &self.pods[range.clone()])
    }

    /// The pods without a controlling owner.
    pub fn orphans(&self) -> &[PodView] {
        &self.pods[self.orphans.clone()]
    }
}

/// Pods whose controller is an incarnation that another object of the same kind and name
/// replaced (two owners created it on both sides of a partition, or one died while its create
/// was still spreading; the later-created one won the merge) count as orphans: the surviving
/// incarnation adopts them if they match it, and its surplus removal keeps the count exact.
/// Only a replacement releases a pod, never an owner merely absent here (that may be a write
/// not yet replicated; deletion takes its pods with it).
pub fn release_replaced_owners(views: &mut [PodView], owners: &[(&str, &[Value])]) {
    let live: std::collections::HashMap<(&str, &str, &str), &str> = owners
        .iter()
        .flat_map(|(kind, objects)| {
            objects.iter().map(move |o| {
                (
                    (
                        *kind,
                        namespace_of(o),
                        o["metadata"]["name"].as_str().unwrap_or(""),
                    ),
                    uid_of(o),
                )
            })
        })
        .collect();
    for view in views.iter_mut() {
        let Some(reference) = view.object["metadata"]["ownerReferences"]
            .as_array()
            .and_then(|refs| refs.iter().find(|r| r["controller"] == true))
        else {
            continue;
        };
        let (kind, name, uid) = (
            reference["kind"].as_str().unwrap_or(""),
            reference["name"].as_str().unwrap_or(""),
            reference["uid"].as_str().unwrap_or(""),
        );
        if live
            .get(&(kind, view.namespace.as_str(), name))
            .is_some_and(|current| *current != uid)
        {
            view.controller_uid = None;
        }
    }
}

/// What a [`Snapshot`] reads from the store, before the pods' statuses join it.
pub struct Listed {
    pub deployments: Vec<Value>,
    pub replica_sets: Vec<Value>,
    pub stateful_sets: Vec<Value>,
    pub daemon_sets: Vec<Value>,
    pub controller_revisions: Vec<Value>,
    pub claims: Vec<Value>,
    pub jobs: Vec<Value>,
    pub cron_jobs: Vec<Value>,
    pub autoscalers: Vec<Value>,
    pub pods: Vec<Value>,
}

impl Snapshot {
    /// The workloads of `store` and, if there is any, every pod.
    pub fn list(store: &shoal_state::Store) -> Listed {
        let deployments = store.list("apps", "Deployment", None);
        let replica_sets = store.list("apps", "ReplicaSet", None);
        let stateful_sets = store.list("apps", "StatefulSet", None);
        let daemon_sets = store.list("apps", "DaemonSet", None);
        let controller_revisions = if stateful_sets.is_empty() && daemon_sets.is_empty() {
            Vec::new()
        } else {
            store.list("apps", "ControllerRevision", None)
        };
        let claims = if stateful_sets.is_empty() {
            Vec::new()
        } else {
            store.list("", "PersistentVolumeClaim", None)
        };
        let jobs = store.list("batch", "Job", None);
        let cron_jobs = store.list("batch", "CronJob", None);
        let autoscalers = store.list("autoscaling", "HorizontalPodAutoscaler", None);
        // Without a workload no pod is anyone's to reconcile: none is read.
        let idle = deployments.is_empty()
            && replica_sets.is_empty()
            && stateful_sets.is_empty()
            && jobs.is_empty()
            && cron_jobs.is_empty();
        let pods = if idle {
            Vec::new()
        } else {
            store.list("", "Pod", None)
        };
        Listed {
            deployments,
            replica_sets,
            stateful_sets,
            daemon_sets,
            controller_revisions,
            claims,
            jobs,
            cron_jobs,
            autoscalers,
            pods,
        }
    }

    /// What was listed, each pod with the status its node reports (`status_of`).
    pub fn from_listed(listed: Listed, status_of: impl Fn(&Value) -> Option<Value>) -> Self {
        let Listed {
            mut deployments,
            mut replica_sets,
            mut stateful_sets,
            daemon_sets,
            controller_revisions,
            claims,
            mut jobs,
            mut cron_jobs,
            autoscalers,
            mut pods,
        } = listed;
        // Objects being deleted (finalizers pending) show it as the API shows them.
        for object in deployments
            .iter_mut()
            .chain(replica_sets.iter_mut())
            .chain(stateful_sets.iter_mut())
            .chain(jobs.iter_mut())
            .chain(cron_jobs.iter_mut())
            .chain(pods.iter_mut())
        {
            garbage::render_deletion(object);
        }
        let mut views: Vec<PodView> = pods
            .into_iter()
            .map(|pod| {
                let status = status_of(&pod);
                PodView::from_object(pod, status.as_ref())
            })
            .collect();
        release_replaced_owners(
            &mut views,
            &[
                ("ReplicaSet", &replica_sets),
                ("StatefulSet", &stateful_sets),
                ("Job", &jobs),
            ],
        );
        let by_namespace = Self::group(views);
        Self {
            deployments,
            replica_sets,
            stateful_sets,
            daemon_sets,
            controller_revisions,
            claims,
            jobs,
            cron_jobs,
            autoscalers,
            pods: by_namespace,
        }
    }

    /// Pods by namespace, grouped by owner.
    pub fn group(views: Vec<PodView>) -> BTreeMap<String, NamespacePods> {
        let mut by_namespace: BTreeMap<String, Vec<PodView>> = BTreeMap::new();
        for view in views {
            by_namespace
                .entry(view.namespace.clone())
                .or_default()
                .push(view);
        }
        by_namespace
            .into_iter()
            .map(|(namespace, pods)| (namespace, NamespacePods::new(pods)))
            .collect()
    }

    pub fn pods_in(&self, namespace: &str) -> &[PodView] {
        self.pods.get(namespace).map_or(&[], NamespacePods::all)
    }

    /// The pods a controller with `uid` in `namespace` controls.
    pub fn owned_by(&self, namespace: &str, uid: &str) -> &[PodView] {
        self.pods
            .get(namespace)
            .map_or(&[], |pods| pods.owned_by(uid))
    }

    /// What a ReplicaSet's reconcile reads: the pods it controls, then its namespace's orphans
    /// (those it may adopt).
    pub fn replica_set_candidates<'a>(
        &'a self,
        rs: &Value,
    ) -> impl Iterator<Item = &'a PodView> + use<'a> {
        let namespace = namespace_of(rs);
        self.owned_by(namespace, uid_of(rs))
            .iter()
            .chain(self.orphans_in(namespace))
    }

    /// The pods of `namespace` without a controlling owner.
    pub fn orphans_in(&self, namespace: &str) -> &[PodView] {
        self.pods.get(namespace).map_or(&[], NamespacePods::orphans)
    }

    pub fn jobs_in(&self, namespace: &str) -> Vec<Value> {
        self.jobs
            .iter()
            .filter(|j| namespace_of(j) == namespace)
            .cloned()
            .collect()
    }

    /// The claims of `namespace`: (name, uid).
    pub fn claims_in(&self, namespace: &str) -> Vec<(&str, &str)> {
        self.claims
            .iter()
            .filter(|c| namespace_of(c) == namespace)
            .map(|c| (name_of(c), uid_of(c)))
            .collect()
    }

    pub fn controller_revisions_in(&self, namespace: &str) -> Vec<Value> {
        self.controller_revisions
            .iter()
            .filter(|r| namespace_of(r) == namespace)
            .cloned()
            .collect()
    }

    pub fn replica_sets_in(&self, namespace: &str) -> Vec<Value> {
        self.replica_sets
            .iter()
            .filter(|rs| namespace_of(rs) == namespace)
            .cloned()
            .collect()
    }
}

/// What the workload controllers decide in one pass over `snapshot` at `now_ms`, for the
/// objects `owns` says are this node's: the pure core the shell's loop and the partition
/// simulator both run. `random` yields the entropy of new objects' names.
pub fn decide(
    snapshot: &Snapshot,
    owns: &dyn Fn(&Value) -> bool,
    now_ms: u64,
    random: &mut dyn FnMut() -> u64,
    quarantine: &mut Quarantine,
) -> Vec<Action> {
    let mut actions = Vec::new();
    for d in snapshot.deployments.iter().filter(|d| owns(d)) {
        let namespace = namespace_of(d);
        actions.extend(quarantine.guard(d, now_ms, || {
            deployment::reconcile(
                d,
                &snapshot.replica_sets_in(namespace),
                snapshot.pods_in(namespace),
                now_ms,
            )
        }));
    }
    for rs in snapshot.replica_sets.iter().filter(|r| owns(r)) {
        actions.extend(quarantine.guard(rs, now_ms, || {
            replica_set::reconcile(rs, snapshot.replica_set_candidates(rs), random)
        }));
    }
    for sts in snapshot.stateful_sets.iter().filter(|s| owns(s)) {
        actions.extend(quarantine.guard(sts, now_ms, || {
            stateful_set::reconcile(
                sts,
                snapshot.replica_set_candidates(sts),
                &snapshot.controller_revisions_in(namespace_of(sts)),
                &snapshot.claims_in(namespace_of(sts)),
                now_ms,
            )
        }));
    }
    for ds in snapshot.daemon_sets.iter().filter(|d| owns(d)) {
        let namespace = namespace_of(ds);
        actions.extend(quarantine.guard(ds, now_ms, || {
            if garbage::deletion_requested(ds) {
                return Vec::new();
            }
            let revisions =
                stateful_set::revisions_of(ds, &snapshot.controller_revisions_in(namespace));
            stateful_set::history(ds, &revisions, &[])
        }));
    }
    for job in snapshot.jobs.iter().filter(|j| owns(j)) {
        actions.extend(quarantine.guard(job, now_ms, || {
            job::reconcile(
                job,
                snapshot.owned_by(namespace_of(job), uid_of(job)),
                now_ms,
                random,
            )
        }));
    }
    for cron_job in snapshot.cron_jobs.iter().filter(|c| owns(c)) {
        let namespace = namespace_of(cron_job);
        actions.extend(quarantine.guard(cron_job, now_ms, || {
            let mut actions = cron_job::reconcile(
                cron_job,
                &snapshot.jobs_in(namespace),
                snapshot.pods_in(namespace),
                now_ms,
            );
            actions.extend(cron_job::next_due(cron_job, now_ms));
            actions
        }));
    }
    // Objects gone, or owned elsewhere now, leave the quarantine.
    if quarantine.is_empty() {
        return actions;
    }
    let present: HashSet<&str> = snapshot
        .deployments
        .iter()
        .chain(&snapshot.replica_sets)
        .chain(&snapshot.stateful_sets)
        .chain(&snapshot.daemon_sets)
        .chain(&snapshot.jobs)
        .chain(&snapshot.cron_jobs)
        .filter(|o| owns(o))
        .map(uid_of)
        .collect();
    quarantine.retain(|uid| present.contains(uid));
    actions
}

pub fn namespace_of(object: &Value) -> &str {
    object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
}

pub fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

pub fn uid_of(object: &Value) -> &str {
    object["metadata"]["uid"].as_str().unwrap_or_default()
}

/// A controller's [`Action`] as a store write: what the shell and the partition simulator
/// both do with one.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Validated (defaults, uid and creation time are the store's) and created.
    Create(Value),
    /// `lay` laid over the object `key` as stored now, if it is still the incarnation `uid`.
    Over {
        key: ObjectKey,
        uid: String,
        lay: Lay,
    },
    /// The incarnation `uid` of `key` deleted.
    Delete { key: ObjectKey, uid: String },
}

/// What a controller changes in an object as stored now; nothing else of it (a binding, a
/// user's edit, another writer's annotations) is touched.
#[derive(Debug, Clone, PartialEq)]
pub enum Lay {
    /// Owner references and annotations as in this object, and `spec.replicas` if it sets one
    /// (adoption, release, a Deployment's scaling of its ReplicaSets).
    Update(Value),
    /// `spec.replicas` (what the `/scale` subresource changes).
    Replicas(i64),
    /// A ControllerRevision's `revision` number.
    Revision(i64),
    /// These annotations added (existing keys kept: each is a register of its own).
    Annotations(BTreeMap<String, String>),
    /// The references to these owner uids removed (the garbage collector's orphaning).
    DropOwners(Vec<String>),
    /// Marked as being deleted in the foreground at this time ([`garbage::mark_deleting`]).
    MarkForeground(String),
    /// Marked as being deleted (in the background) at this time: an object with finalizers,
    /// which stays until they are gone ([`delete_write`]).
    MarkDeleting(String),
    /// This finalizer removed.
    RemoveFinalizer(&'static str),
    /// A pod marked as being deleted at this time, within this grace (s): its node stops it and
    /// then deletes the object ([`delete_write`]).
    Terminate { at: String, grace: u64 },
}

/// A controller's (or the garbage collector's) delete of the incarnation `uid` of `key` as the
/// store write it becomes, given the object as stored now (`at`: the time, RFC 3339). A pod on
/// a node is deleted gracefully, as a DELETE through the API deletes it: marked, stopped by its
/// node within its grace, then gone ([`garbage::pod_grace`]); an object with finalizers (a
/// claim's `pvc-protection`) is marked and stays until they are gone; anything else goes at
/// once. The shell and the partition simulator both write deletes through this.
pub fn delete_write(key: ObjectKey, uid: String, current: Option<&Value>, at: &str) -> Write {
    let pod = key.group.is_empty() && key.kind == "Pod";
    match current
        .filter(|_| pod)
        .and_then(|c| garbage::pod_grace(c, None))
    {
        Some(grace) => Write::Over {
            key,
            uid,
            lay: Lay::Terminate {
                at: at.to_owned(),
                grace,
            },
        },
        None if current.is_some_and(has_finalizers) => Write::Over {
            key,
            uid,
            lay: Lay::MarkDeleting(at.to_owned()),
        },
        None => Write::Delete { key, uid },
    }
}

impl Lay {
    /// Changes `current`; false if there is nothing to write.
    pub fn apply(&self, current: &mut Value) -> bool {
        match self {
            Lay::Update(object) => {
                for field in ["ownerReferences", "annotations"] {
                    current["metadata"][field] = object["metadata"][field].clone();
                }
                if !object["spec"]["replicas"].is_null() {
                    current["spec"]["replicas"] = object["spec"]["replicas"].clone();
                }
            }
            Lay::Replicas(replicas) => current["spec"]["replicas"] = serde_json::json!(replicas),
            Lay::Revision(number) => {
                if current["revision"] == serde_json::json!(number) {
                    return false;
                }
                current["revision"] = serde_json::json!(number);
            }
            Lay::Annotations(annotations) => {
                if !current["metadata"]["annotations"].is_object() {
                    current["metadata"]["annotations"] = serde_json::json!({});
                }
                for (k, v) in annotations {
                    current["metadata"]["annotations"][k] = Value::String(v.clone());
                }
            }
            Lay::DropOwners(uids) => {
                if let Some(refs) = current["metadata"]["ownerReferences"].as_array_mut() {
                    refs.retain(|r| !uids.iter().any(|u| r["uid"].as_str() == Some(u.as_str())));
                }
            }
            Lay::MarkForeground(now) => return garbage::mark_deleting(current, "Foreground", now),
            Lay::MarkDeleting(now) => return garbage::mark_deleting(current, "Background", now),
            Lay::Terminate { at, grace } => {
                let marked = garbage::mark_deleting(current, "Background", at);
                return garbage::set_grace(current, *grace) || marked;
            }
            Lay::RemoveFinalizer(name) => {
                if let Some(list) = current["metadata"]["finalizers"].as_array_mut() {
                    list.retain(|f| f != name);
                }
            }
        }
        true
    }

    /// `current`'s `spec.replicas` if this changes it from a Deployment's decision (what the
    /// `ScalingReplicaSet` Event tells).
    pub fn scales_from(&self, current: &Value) -> Option<i64> {
        match self {
            Lay::Update(object) if !object["spec"]["replicas"].is_null() => {
                current["spec"]["replicas"].as_i64()
            }
            _ => None,
        }
    }

    pub fn what(&self) -> &'static str {
        match self {
            Lay::Update(_) => "an update",
            Lay::Replicas(_) => "a scale",
            Lay::Revision(_) => "a revision number",
            Lay::Annotations(_) => "a record",
            Lay::DropOwners(_) => "owner references",
            Lay::MarkForeground(_) => "a foreground deletion",
            Lay::MarkDeleting(_) => "a deletion its finalizers hold",
            Lay::RemoveFinalizer(_) => "a finalizer removal",
            Lay::Terminate { .. } => "a graceful deletion",
        }
    }
}

/// The write `action` asks for (`None`: nothing to write, or a kind controllers do not write).
pub fn write_of(action: Action) -> Option<Write> {
    match action {
        Action::Create(object) | Action::Update(object) if object.is_null() => None,
        Action::Create(object) => Some(Write::Create(object)),
        Action::Update(object) => {
            let info = object["apiVersion"]
                .as_str()
                .and_then(|v| kind::lookup(v, object["kind"].as_str().unwrap_or("")))?;
            let key = ObjectKey::new(info, namespace_of(&object), name_of(&object));
            let uid = uid_of(&object).to_owned();
            Some(Write::Over {
                key,
                uid,
                lay: Lay::Update(object),
            })
        }
        Action::Delete {
            kind,
            namespace,
            name,
            uid,
        } => Some(Write::Delete {
            key: key_of(kind, &namespace, &name)?,
            uid,
        }),
        Action::Scale {
            kind,
            namespace,
            name,
            uid,
            replicas,
            ..
        } => Some(Write::Over {
            key: key_of(kind, &namespace, &name)?,
            uid,
            lay: Lay::Replicas(replicas),
        }),
        Action::Renumber {
            namespace,
            name,
            uid,
            revision,
        } => Some(Write::Over {
            key: key_of("ControllerRevision", &namespace, &name)?,
            uid,
            lay: Lay::Revision(revision),
        }),
        Action::Annotate {
            kind,
            namespace,
            name,
            uid,
            annotations,
        } => Some(Write::Over {
            key: key_of(kind, &namespace, &name)?,
            uid,
            lay: Lay::Annotations(annotations),
        }),
        Action::Requeue { .. } | Action::Failed { .. } => None,
    }
}

/// The earliest [`Action::Requeue`] among `actions`, ms since the epoch.
pub fn earliest_requeue(actions: &[Action]) -> Option<u64> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Requeue { at_ms } => Some(*at_ms),
            _ => None,
        })
        .min()
}

/// `change` laid over `current` (the object `key` as stored now) as the write that replaces
/// it from the version read (a write in between makes the store refuse it as a conflict).
/// `None` if `current` is another incarnation than `uid` or `change` declines.
pub fn overlay(
    key: &ObjectKey,
    uid: &str,
    mut current: Value,
    change: &mut dyn FnMut(&mut Value) -> bool,
) -> Option<Result<shoal_state::ValidObject, shoal_state::ObjectError>> {
    if current["metadata"]["uid"] != uid || !change(&mut current) {
        return None;
    }
    let read_rv = current["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_owned);
    if let Some(meta) = current["metadata"].as_object_mut() {
        meta.retain(|_, v| !v.is_null());
        meta.remove("resourceVersion");
    }
    Some(
        shoal_state::validate(current, &key.namespace).map(|mut valid| {
            valid.resource_version = read_rv;
            valid
        }),
    )
}

/// What a round of [`garbage`] collection reads from the store, under its lock: every object,
/// the tombstones of the owners they name that are not live, and when the store last synced.
/// The round itself ([`garbage_plan`]) runs after the lock is released.
pub struct GarbageRead {
    objects: Vec<(ObjectKey, Value)>,
    tombstones: std::collections::HashMap<ObjectKey, Value>,
    synced_ms: u64,
}

impl GarbageRead {
    pub fn of(store: &shoal_state::Store) -> Self {
        let mut objects: Vec<(ObjectKey, Value)> = Vec::new();
        for k in shoal_state::KINDS {
            for o in store.list(k.group, k.kind, None) {
                let key = ObjectKey::new(
                    k,
                    o["metadata"]["namespace"].as_str().unwrap_or(""),
                    o["metadata"]["name"].as_str().unwrap_or(""),
                );
                objects.push((key, o));
            }
        }
        let mut tombstones = std::collections::HashMap::new();
        for (key, o) in &objects {
            for (reference, _) in garbage::owner_references(o) {
                if let Some(owner) = garbage::owner_key(reference, key)
                    && !tombstones.contains_key(&owner)
                    && let Some(tombstone) = store.deleted(&owner)
                {
                    tombstones.insert(owner, tombstone);
                }
            }
        }
        Self {
            objects,
            tombstones,
            synced_ms: store.last_sync_ms(),
        }
    }
}

/// One round of [`garbage`] collection over what `read` holds, as node `node` sees it
/// (`live`: the nodes owners are chosen among; `alive`: whether a node of that name is up).
pub fn garbage_plan(
    read: &GarbageRead,
    node: u64,
    live: &[u64],
    alive: &dyn Fn(&str) -> bool,
    now_ms: u64,
) -> garbage::Plan {
    let live_objects: std::collections::HashMap<&ObjectKey, &Value> =
        read.objects.iter().map(|(key, o)| (key, o)).collect();
    let stored = |key: &ObjectKey| {
        (
            live_objects.get(key).map(|o| (*o).clone()),
            read.tombstones.get(key).cloned(),
        )
    };
    let mine =
        |uid: &str| crate::placement::auction::auctioneer(uid, live.iter().copied()) == Some(node);
    garbage::plan(
        &read.objects,
        &garbage::Round {
            stored: &stored,
            mine: &mine,
            alive,
            synced_ms: read.synced_ms,
            now_ms,
        },
    )
}

/// One write of a garbage-collection round.
#[derive(Debug, Clone, PartialEq)]
pub struct Collect {
    pub write: Write,
    /// Then deleted, if the object written has no finalizer left (a foreground deletion whose
    /// last blocking dependent went).
    pub then_delete: bool,
    /// A dependent collected: an Event tells it.
    pub announce: bool,
}

/// The writes that carry out `plan` (`now`: the time a foreground deletion is marked with).
pub fn garbage_writes(plan: garbage::Plan, now: &str) -> Vec<Collect> {
    use garbage::{Finish, Verdict};
    let mut writes = Vec::new();
    let step = |write, then_delete, announce| Collect {
        write,
        then_delete,
        announce,
    };
    for d in plan.dependents {
        let (key, uid) = (d.key, d.uid);
        match d.verdict {
            Verdict::Keep => {}
            Verdict::DropReferences(uids) => writes.push(step(
                Write::Over {
                    key,
                    uid,
                    lay: Lay::DropOwners(uids),
                },
                false,
                false,
            )),
            // It has dependents that block it: it waits for them, as its owner waits.
            Verdict::Delete { foreground: true } if d.blocked_by_own => writes.push(step(
                Write::Over {
                    key,
                    uid,
                    lay: Lay::MarkForeground(now.to_owned()),
                },
                false,
                false,
            )),
            Verdict::Delete { .. } => writes.push(step(Write::Delete { key, uid }, false, true)),
        }
    }
    for (key, uid, finish) in plan.finishing {
        match finish {
            Finish::Nothing => {}
            Finish::RemoveForeground => writes.push(step(
                Write::Over {
                    key,
                    uid,
                    lay: Lay::RemoveFinalizer(garbage::FOREGROUND),
                },
                true,
                false,
            )),
            Finish::Delete => writes.push(step(Write::Delete { key, uid }, false, false)),
            Finish::Unprotect(finalizer) => writes.push(step(
                Write::Over {
                    key,
                    uid,
                    lay: Lay::RemoveFinalizer(finalizer),
                },
                true,
                false,
            )),
        }
    }
    writes
}

pub fn has_finalizers(object: &Value) -> bool {
    object["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty())
}

/// The store key of a kind controllers write.
pub fn key_of(kind_name: &str, namespace: &str, name: &str) -> Option<ObjectKey> {
    let group_version = match kind_name {
        "ReplicaSet" | "Deployment" | "StatefulSet" | "ControllerRevision" => "apps/v1",
        "HorizontalPodAutoscaler" => "autoscaling/v2",
        "Job" | "CronJob" => "batch/v1",
        _ => "v1",
    };
    Some(ObjectKey::new(
        kind::lookup(group_version, kind_name)?,
        namespace,
        name,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, namespace: &str, owner: Option<&str>) -> PodView {
        let mut meta = serde_json::json!({"name": name, "namespace": namespace, "uid": name});
        if let Some(uid) = owner {
            meta["ownerReferences"] = serde_json::json!([{"uid": uid, "controller": true}]);
        }
        PodView::new(&serde_json::json!({"metadata": meta}), None)
    }

    #[test]
    fn pods_of_a_replaced_incarnation_are_orphans_and_pods_of_an_absent_owner_are_not() {
        let owned = |name: &str, rs: &str, uid: &str| {
            PodView::new(
                &serde_json::json!({"metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"app": "web"},
                    "ownerReferences": [{"kind": "ReplicaSet", "name": rs, "uid": uid, "controller": true}]}}),
                None,
            )
        };
        let mut views = vec![
            owned("current", "web-1", "uid-new"),
            owned("stray", "web-1", "uid-old"),
            owned("not-yet-here", "web-2", "uid-x"),
        ];
        let sets = vec![
            serde_json::json!({"metadata": {"name": "web-1", "namespace": "default", "uid": "uid-new"}}),
        ];
        release_replaced_owners(&mut views, &[("ReplicaSet", &sets), ("Job", &[])]);
        let owners: Vec<Option<&str>> = views.iter().map(|v| v.controller_uid.as_deref()).collect();
        assert_eq!(owners, [Some("uid-new"), None, Some("uid-x")]);
        // The surviving incarnation adopts the stray (it matches) and keeps the count exact.
        let rs = serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "default", "uid": "uid-new"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}}}},
        });
        let grouped = Snapshot::group(views);
        let pods: Vec<&PodView> = grouped["default"]
            .owned_by("uid-new")
            .iter()
            .chain(grouped["default"].orphans())
            .collect();
        let actions = replica_set::reconcile(&rs, pods, &mut || 7);
        let adopted = actions
            .iter()
            .filter(|a| matches!(a, workload::Action::Update(_)))
            .count();
        let deleted = actions
            .iter()
            .filter(|a| matches!(a, workload::Action::Delete { .. }))
            .count();
        assert_eq!((adopted, deleted), (1, 1), "{actions:?}");
    }

    #[test]
    fn pods_are_grouped_by_namespace_and_owner() {
        let snapshot = Snapshot {
            deployments: vec![],
            replica_sets: vec![],
            stateful_sets: vec![],
            daemon_sets: vec![],
            controller_revisions: vec![],
            claims: vec![],
            jobs: vec![],
            cron_jobs: vec![],
            autoscalers: vec![],
            pods: Snapshot::group(vec![
                view("a", "default", Some("rs1")),
                view("b", "default", None),
                view("c", "default", Some("rs2")),
                view("d", "default", Some("rs1")),
                view("e", "other", Some("rs1")),
            ]),
        };
        let names = |pods: &[PodView]| pods.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(snapshot.owned_by("default", "rs1")), ["a", "d"]);
        assert_eq!(names(snapshot.owned_by("other", "rs1")), ["e"]);
        assert_eq!(names(snapshot.orphans_in("default")), ["b"]);
        assert!(snapshot.owned_by("default", "nobody").is_empty());
        assert!(snapshot.orphans_in("other").is_empty());
        assert_eq!(snapshot.pods_in("default").len(), 4);
        let rs = serde_json::json!({"metadata": {"namespace": "default", "uid": "rs2"}});
        let candidates: Vec<&str> = snapshot
            .replica_set_candidates(&rs)
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(candidates, ["c", "b"]);
    }

    #[test]
    fn a_controllers_delete_of_a_pod_on_a_node_is_graceful_and_of_anything_else_at_once() {
        let at = "2026-12-04T00:00:00Z";
        let pod_key = key_of("Pod", "default", "web-a").unwrap();
        let mut bound = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-a", "namespace": "default", "uid": "u1"},
            "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 7}});
        let write = delete_write(pod_key.clone(), "u1".into(), Some(&bound), at);
        let Write::Over { lay, uid, .. } = write else {
            panic!("a bound pod is marked, not deleted: {write:?}");
        };
        assert_eq!(uid, "u1");
        assert!(lay.apply(&mut bound));
        assert!(garbage::deletion_requested(&bound));
        assert_eq!(garbage::deletion_grace_ms(&bound), Some(7_000));
        // The next pass's delete of the marked pod changes nothing (no second write).
        let again = delete_write(pod_key.clone(), "u1".into(), Some(&bound), at);
        let Write::Over { lay, .. } = again else {
            panic!("{again:?}")
        };
        assert!(!lay.apply(&mut bound));
        // An unbound pod, a pod this node holds no copy of, and a ReplicaSet go at once.
        let unbound = serde_json::json!({"kind": "Pod", "spec": {}});
        for current in [Some(&unbound), None] {
            assert!(matches!(
                delete_write(pod_key.clone(), "u1".into(), current, at),
                Write::Delete { .. }
            ));
        }
        let rs = serde_json::json!({"kind": "ReplicaSet", "spec": {"nodeName": "n1"}});
        let rs_key = key_of("ReplicaSet", "default", "web").unwrap();
        assert!(matches!(
            delete_write(rs_key, "u2".into(), Some(&rs), at),
            Write::Delete { .. }
        ));
        // An object with finalizers (a claim's protection) is marked and stays.
        let mut claim = serde_json::json!({"kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "finalizers": ["kubernetes.io/pvc-protection"]}});
        let claim_key = key_of("PersistentVolumeClaim", "default", "data").unwrap();
        let Write::Over { lay, .. } = delete_write(claim_key, "u3".into(), Some(&claim), at) else {
            panic!("a claim with a finalizer is not deleted at once");
        };
        assert!(lay.apply(&mut claim));
        assert!(garbage::deletion_requested(&claim));
    }
}

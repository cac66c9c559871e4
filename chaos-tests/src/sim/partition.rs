//! The partition simulator: the workload controllers' pure core ([`decide`], [`write_of`],
//! [`overlay`]) driven over real stores ([`shoal_state::Store`], one per side of a partition)
//! without sockets, sleeps or wall time. Each side's owners reconcile the same ReplicaSets,
//! Deployments and Jobs while cut off from the other; the heal merges the two stores (as
//! anti-entropy does) and the cluster reconciles until nothing changes. [`check`] then holds
//! the healed state to the invariants: one state everywhere, exact replica counts, no pod left
//! to an incarnation the merge dropped, every completion counted once.
//!
//! What the sim models around the controllers, as the shell's neighbours do it: the scheduler
//! binds unbound pods and rebinds those on nodes its side cannot see, when the live scheduler's
//! decision (`shoal_core::placement::eviction`) lets them move (the real binding is an epoch register, with
//! run leases for fenced pods, `shoal_core::placement::lease`; here it is `spec.nodeName` alone), and each
//! kubelet reports the pods bound to it: Running and Ready, a Job's pods Succeeded after
//! [`JOB_ROUNDS`] rounds. A side sees no status from the other side's nodes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Value, json};
use shoal_state::{ObjectKey, Store, StoreConfig, WriteMode};

use shoal_core::controllers::workload::{Phase, PodView, replicas, selector, selects};
use shoal_core::controllers::{
    GarbageRead, Quarantine, Snapshot, Write, decide, garbage, garbage_plan, garbage_writes,
    has_finalizers, job, namespace_of, overlay, uid_of, write_of,
};
use shoal_core::placement::auction::auctioneer;
use shoal_core::placement::eviction;
use shoal_core::placement::partition::{self, FenceConfig, Policy};

/// The simulated epoch (ms).
const START_MS: u64 = 1_800_000_000_000;
/// One round (by default): every node's controllers and garbage collector, the kubelets and
/// the scheduler act once.
const ROUND_MS: u64 = 1_000;
/// Rounds a Job's pod runs before it succeeds.
const JOB_ROUNDS: u64 = 2;
/// Rounds the healed cluster gets to settle.
const SETTLE_ROUNDS: u64 = 300;

fn node_name(id: u64) -> String {
    format!("node-{id}")
}

/// What the kubelets know: the pods that started on each node and which of them succeeded.
#[derive(Default)]
struct Kubelets {
    /// (pod uid, node) → the round it started there.
    started: HashMap<(String, u64), u64>,
    /// Job pods that ran to success (pod uid → its Job's uid): the ground truth the ledger is
    /// checked against.
    succeeded: BTreeMap<String, String>,
}

impl Kubelets {
    /// The status the node `pod` is bound to reports, if that node is among `live`.
    fn status(&self, pod: &Value, live: &[u64], round: u64) -> Option<Value> {
        let node = bound_node(pod).filter(|n| live.contains(n))?;
        let uid = uid_of(pod).to_owned();
        let started = *self.started.get(&(uid, node))?;
        if is_job_pod(pod) && round >= started + JOB_ROUNDS {
            return Some(json!({"phase": "Succeeded", "containerStatuses": [
                {"name": "c", "state": {"terminated": {"exitCode": 0}}}]}));
        }
        Some(json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}))
    }

    /// Starts the pods newly bound to `live` nodes, notes the Job pods that succeed, and
    /// stops and deletes the pods being deleted (as the real kubelet does once their containers
    /// stopped, within their grace). Returns how many pods it deleted.
    fn step(&mut self, store: &mut Store, live: &[u64], round: u64, now_ms: u64) -> usize {
        let mut deleted = 0;
        for pod in store.list("", "Pod", None) {
            let Some(node) = bound_node(&pod).filter(|n| live.contains(n)) else {
                continue;
            };
            if garbage::deletion_requested(&pod) {
                let key = ObjectKey::new(
                    shoal_state::kind::lookup("v1", "Pod").expect("Pod is stored"),
                    namespace_of(&pod),
                    pod["metadata"]["name"].as_str().unwrap_or(""),
                );
                if garbage::finish(&pod, 0, false) == garbage::Finish::Delete
                    && store.delete_at(&key, Some(uid_of(&pod)), now_ms).is_ok()
                {
                    deleted += 1;
                }
                continue;
            }
            self.started
                .entry((uid_of(&pod).to_owned(), node))
                .or_insert(round);
            let succeeded = self
                .status(&pod, live, round)
                .is_some_and(|s| s["phase"] == "Succeeded");
            if succeeded {
                let job =
                    shoal_core::controllers::workload::controller_of(&pod).unwrap_or_default();
                self.succeeded.insert(uid_of(&pod).to_owned(), job);
            }
        }
        deleted
    }
}

/// xorshift64*: deterministic names, so a failing run replays.
fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn bound_node(pod: &Value) -> Option<u64> {
    pod["spec"]["nodeName"]
        .as_str()?
        .strip_prefix("node-")?
        .parse()
        .ok()
}

fn is_job_pod(pod: &Value) -> bool {
    !pod["metadata"]["labels"][job::JOB_NAME_LABEL].is_null()
}

/// Two sides of a cluster, each with the store its nodes share (a side's writes reach a
/// quorum of its own nodes).
struct Sim {
    _dir: tempfile::TempDir,
    sides: [(Vec<u64>, Store); 2],
    partitioned: bool,
    now_ms: u64,
    round_ms: u64,
    round: u64,
    seed: u64,
    kubelets: Kubelets,
    /// Each side's clocks of the nodes it cannot see ([`eviction::DeadTimers`]).
    dead: [eviction::DeadTimers<u64>; 2],
}

impl Sim {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let open = |name: &str, node| {
            Store::open(StoreConfig::new(dir.path().join(name), node)).expect("store opens")
        };
        let sides = [(vec![1, 2], open("a", 1)), (vec![3, 4], open("b", 3))];
        Self {
            _dir: dir,
            sides,
            partitioned: false,
            now_ms: START_MS,
            round_ms: ROUND_MS,
            round: 0,
            seed: 0x5eed_1234_abcd_ef01,
            kubelets: Kubelets::default(),
            dead: Default::default(),
        }
    }

    fn all_nodes(&self) -> Vec<u64> {
        self.sides.iter().flat_map(|(n, _)| n.clone()).collect()
    }

    /// A user's write through side `side` (both sides, once merged, if not partitioned).
    fn user_write(&mut self, side: usize, object: Value, mode: WriteMode) {
        let namespace = namespace_of(&object).to_owned();
        let valid = shoal_state::validate(object, &namespace).expect("a valid manifest");
        self.sides[side]
            .1
            .write_at(valid, mode, self.now_ms)
            .expect("the user's write");
        if !self.partitioned {
            self.sync();
        }
    }

    /// A user's change of `key` as stored on side `side` (`kubectl scale`, `set image`).
    fn user_edit(&mut self, side: usize, key: &ObjectKey, change: impl Fn(&mut Value)) {
        let store = &mut self.sides[side].1;
        let current = store.get(key).expect("the object exists");
        let uid = uid_of(&current).to_owned();
        let valid = overlay(key, &uid, current, &mut |c| {
            change(c);
            true
        })
        .expect("same incarnation")
        .expect("valid");
        store
            .write_at(valid, WriteMode::Update, self.now_ms)
            .expect("the user's edit");
    }

    /// Anti-entropy run to the end: each store merges every entry of the other.
    fn sync(&mut self) {
        let every: Vec<u8> = (0..=255).collect();
        for (from, to) in [(0, 1), (1, 0)] {
            let entries = self.sides[from].1.entries_in_buckets(&every);
            let outcome = self.sides[to]
                .1
                .merge_remote_at(entries, self.now_ms)
                .expect("merge");
            assert!(outcome.rejected.is_empty(), "{:?}", outcome.rejected);
            self.sides[to].1.mark_synced(self.now_ms).expect("synced");
        }
    }

    /// One round; returns how many writes changed a store.
    fn round(&mut self) -> usize {
        self.round += 1;
        self.now_ms += self.round_ms;
        let groups: Vec<(usize, Vec<u64>)> = if self.partitioned {
            vec![(0, self.sides[0].0.clone()), (1, self.sides[1].0.clone())]
        } else {
            vec![(0, self.all_nodes())]
        };
        let mut writes = 0;
        for (side, live) in groups {
            writes += self
                .kubelets
                .step(&mut self.sides[side].1, &live, self.round, self.now_ms);
            for &node in &live {
                let snapshot = Snapshot::from_listed(Snapshot::list(&self.sides[side].1), |p| {
                    self.kubelets.status(p, &live, self.round)
                });
                let owns = |o: &Value| auctioneer(uid_of(o), live.iter().copied()) == Some(node);
                let mut seed = self.seed;
                let actions = decide(
                    &snapshot,
                    &owns,
                    self.now_ms,
                    &mut || xorshift(&mut seed),
                    &mut Quarantine::new(),
                );
                self.seed = seed;
                for action in actions {
                    writes += apply(&mut self.sides[side].1, action, self.now_ms);
                }
                writes += collect(&mut self.sides[side].1, node, &live, self.now_ms);
            }
            let all = self.all_nodes();
            writes += bind(
                &mut self.sides[side].1,
                &mut self.dead[side],
                &live,
                &all,
                self.now_ms,
            );
        }
        if !self.partitioned {
            self.sync();
        }
        writes
    }

    /// Rounds until nothing is written for longer than anything waits (a Job's pod runs, the
    /// garbage collector's grace for a replaced owner's dependents); panics if the cluster
    /// does not settle.
    fn settle(&mut self) {
        let wait = (JOB_ROUNDS + 1).max(garbage::REPLACED_GRACE_MS.div_ceil(self.round_ms) + 1);
        let mut quiet = 0;
        for _ in 0..SETTLE_ROUNDS {
            quiet = if self.round() == 0 { quiet + 1 } else { 0 };
            if quiet > wait {
                return;
            }
        }
        panic!("the cluster did not settle in {SETTLE_ROUNDS} rounds");
    }

    fn check(&self) -> Result<(), String> {
        check(
            [&self.sides[0].1, &self.sides[1].1],
            &self.kubelets,
            &self.all_nodes(),
            self.round,
            self.now_ms,
        )
    }
}

/// Writes `action` to `store`; 1 if that changed it.
fn apply(store: &mut Store, action: shoal_core::controllers::Action, now_ms: u64) -> usize {
    write_of(action).map_or(0, |write| {
        usize::from(execute(store, write, now_ms).is_some_and(|w| w.change.is_some()))
    })
}

/// One round of the garbage collector of `node`, as the shell runs it.
fn collect(store: &mut Store, node: u64, live: &[u64], now_ms: u64) -> usize {
    let names: Vec<String> = live.iter().map(|n| node_name(*n)).collect();
    let alive = |name: &str| names.iter().any(|n| n == name);
    let plan = garbage_plan(&GarbageRead::of(store), node, live, &alive, now_ms);
    let at = job_time(now_ms);
    let mut writes = 0;
    for step in garbage_writes(plan, &at) {
        let (key, uid) = match &step.write {
            Write::Over { key, uid, .. } | Write::Delete { key, uid } => (key.clone(), uid.clone()),
            Write::Create(_) => continue,
        };
        let Some(written) = execute(store, step.write, now_ms) else {
            continue;
        };
        writes += usize::from(written.change.is_some());
        if step.then_delete
            && !has_finalizers(&written.object)
            && store.delete_at(&key, Some(&uid), now_ms).is_ok()
        {
            writes += 1;
        }
    }
    writes
}

fn job_time(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// Writes `write` to `store` as the shell writes it to the replicated store. A write the
/// store refuses (a delete of a pod already gone, a conflict) is left, as the shell leaves
/// it, to the next pass.
fn execute(store: &mut Store, write: Write, now_ms: u64) -> Option<shoal_state::Written> {
    let written = match write {
        Write::Create(object) => {
            let namespace = namespace_of(&object).to_owned();
            let valid =
                shoal_state::validate(object, &namespace).expect("controllers build valid objects");
            store.write_at(valid, WriteMode::Create, now_ms)
        }
        Write::Over { key, uid, lay } => {
            let current = store.get(&key)?;
            let valid = overlay(&key, &uid, current, &mut |c| lay.apply(c))?;
            store.write_at(
                valid.expect("controllers build valid objects"),
                WriteMode::Update,
                now_ms,
            )
        }
        Write::Delete { key, uid } => {
            let current = store.get(&key);
            match shoal_core::controllers::delete_write(
                key,
                uid,
                current.as_ref(),
                &job_time(now_ms),
            ) {
                Write::Delete { key, uid } => store.delete_at(&key, Some(&uid), now_ms),
                graceful => return execute(store, graceful, now_ms),
            }
        }
    };
    written.ok()
}

/// The scheduler's part, with the live scheduler's decision ([`eviction::decide`]): unbound
/// pods, and pods bound to nodes this side cannot see once their policy lets them move, are
/// bound to the live node the auction's rendezvous hash picks. This world has no failure
/// detector: a node the side cannot see is dead from the round it is cut off, its `available`
/// pods move at once (no eviction delay), its `fenced` ones only on a side with a majority of
/// `all`, a round's detection and fence timeout later.
fn bind(
    store: &mut Store,
    dead: &mut eviction::DeadTimers<u64>,
    live: &[u64],
    all: &[u64],
    now_ms: u64,
) -> usize {
    let info = shoal_state::kind::lookup("v1", "Pod").expect("Pod is stored");
    let now = std::time::Duration::from_millis(now_ms.saturating_sub(START_MS));
    for node in all {
        dead.observe(node, !live.contains(node), now);
    }
    let round = std::time::Duration::from_millis(ROUND_MS);
    let fence = FenceConfig::new(round, round);
    let rules = eviction::Rules {
        majority: partition::has_majority(live.len(), all.len()),
        eviction_delay: std::time::Duration::ZERO,
        fence: &fence,
    };
    let mut writes = 0;
    for pod in store.list("", "Pod", None) {
        let node = bound_node(&pod);
        let facts = eviction::Pod {
            bound: node.is_some(),
            // Bindings here are `spec.nodeName` alone, without an epoch.
            epoch: 0,
            policy: Policy::parse(pod["metadata"]["annotations"][partition::ANNOTATION].as_str()),
            daemon: pod["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| o.iter().any(|r| r["kind"] == "DaemonSet")),
            awaits_preemptor: false,
        };
        let seen = match node {
            Some(n) if !live.contains(&n) => eviction::Seen::Gone(dead.gone_for(&n, now, true)),
            _ => eviction::Seen::Live,
        };
        if !matches!(
            eviction::decide(&rules, &facts, seen),
            eviction::Verdict::Auction(_)
        ) {
            continue;
        }
        // The pod's auctioneer as the shell chooses it (by its wide constraint, if any).
        let key = shoal_model::placement::PodRequest::from_pod(&pod).map_or_else(
            |_| uid_of(&pod).to_owned(),
            |request| shoal_core::placement::auction::auction_key(&request).into_owned(),
        );
        let Some(node) = auctioneer(&key, live.iter().copied()) else {
            continue;
        };
        let key = ObjectKey::new(
            info,
            namespace_of(&pod),
            pod["metadata"]["name"].as_str().unwrap_or(""),
        );
        let uid = uid_of(&pod).to_owned();
        if let Some(Ok(valid)) = overlay(&key, &uid, pod, &mut |c| {
            c["spec"]["nodeName"] = json!(node_name(node));
            true
        }) && store
            .write_at(valid, WriteMode::Update, now_ms)
            .is_ok_and(|w| w.change.is_some())
        {
            writes += 1;
        }
    }
    writes
}

/// The invariants of a healed, settled cluster (`live`: every node), as errors naming the
/// object that breaks one.
fn check(
    stores: [&Store; 2],
    kubelets: &Kubelets,
    live: &[u64],
    round: u64,
    now_ms: u64,
) -> Result<(), String> {
    let mut errors = Vec::new();
    let (a, b) = (stores[0].root_digest(), stores[1].root_digest());
    if a != b {
        errors.push(format!(
            "the sides' stores differ (root digests {a} and {b})"
        ));
    }
    let store = stores[0];
    let snapshot =
        Snapshot::from_listed(Snapshot::list(store), |p| kubelets.status(p, live, round));
    let all_pods: Vec<&PodView> = snapshot.pods.values().flat_map(|p| p.all()).collect();
    let name = |o: &Value| {
        format!(
            "{}/{}",
            namespace_of(o),
            o["metadata"]["name"].as_str().unwrap_or("")
        )
    };

    // Every active pod is some live object's, bound to a live node, and running there.
    let owners: BTreeMap<&str, &Value> = snapshot
        .replica_sets
        .iter()
        .chain(&snapshot.jobs)
        .map(|o| (uid_of(o), o))
        .collect();
    let stored: BTreeSet<&str> = snapshot
        .deployments
        .iter()
        .chain(&snapshot.replica_sets)
        .chain(&snapshot.jobs)
        .chain(&snapshot.cron_jobs)
        .map(uid_of)
        .collect();
    // No object, ended or not, is left to an owner the merge dropped (the garbage collector's).
    let objects = all_pods
        .iter()
        .map(|p| &p.object)
        .chain(&snapshot.replica_sets)
        .chain(&snapshot.jobs);
    for object in objects {
        if let Some(owner) = shoal_core::controllers::workload::controller_of(object)
            && !stored.contains(owner.as_str())
        {
            errors.push(format!(
                "{} {} names the controller {owner}, which is not stored",
                object["kind"].as_str().unwrap_or("object"),
                name(object)
            ));
        }
    }
    for pod in all_pods.iter().filter(|p| p.is_active()) {
        match pod.controller_uid.as_deref() {
            Some(uid) if owners.contains_key(uid) => {}
            other => errors.push(format!(
                "pod {}/{} is active without a live controller ({other:?})",
                pod.namespace, pod.name
            )),
        }
        if pod.phase != Phase::Running {
            errors.push(format!(
                "pod {}/{} is {:?} on {:?}",
                pod.namespace, pod.name, pod.phase, pod.node
            ));
        }
    }

    // Each ReplicaSet: exactly `replicas` active pods, all Ready; no active orphan it selects.
    for rs in &snapshot.replica_sets {
        let namespace = namespace_of(rs);
        let active: Vec<&PodView> = snapshot
            .owned_by(namespace, uid_of(rs))
            .iter()
            .filter(|p| p.is_active())
            .collect();
        let want = replicas(rs) as usize;
        if active.len() != want || active.iter().any(|p| !p.ready) {
            errors.push(format!(
                "ReplicaSet {} has {} active pods ({} ready), wants {want}",
                name(rs),
                active.len(),
                active.iter().filter(|p| p.ready).count()
            ));
        }
        let selector = selector(rs);
        for orphan in snapshot.orphans_in(namespace) {
            if orphan.is_active() && selects(&selector, &orphan.labels) {
                errors.push(format!(
                    "pod {namespace}/{} is an active orphan ReplicaSet {} selects",
                    orphan.name,
                    name(rs)
                ));
            }
        }
    }

    // Each Deployment: one ReplicaSet of the current template holds all its replicas.
    for d in &snapshot.deployments {
        let sets = shoal_core::controllers::deployment::owned_sets(d, &snapshot.replica_sets);
        let hash = shoal_core::controllers::workload::template_hash(&d["spec"]["template"]);
        let current: Vec<&&Value> = sets
            .iter()
            .filter(|s| s["metadata"]["labels"]["pod-template-hash"] == hash.as_str())
            .collect();
        let want = replicas(d);
        let ok = match current.as_slice() {
            [rs] => {
                replicas(rs) == want
                    && sets
                        .iter()
                        .filter(|s| uid_of(s) != uid_of(rs))
                        .all(|s| replicas(s) == 0)
            }
            _ => false,
        };
        if !ok {
            let scales: Vec<(String, u64)> = sets.iter().map(|s| (name(s), replicas(s))).collect();
            errors.push(format!(
                "Deployment {} (replicas {want}, template {hash}) has sets {scales:?}",
                name(d)
            ));
        }
    }

    // Each Job: complete, nothing of it active, and its count the ground truth's: every pod
    // that succeeded recorded once, none invented; Indexed: exactly `completions`.
    for j in &snapshot.jobs {
        let namespace = namespace_of(j);
        let status = job::status(j, snapshot.pods_in(namespace), now_ms);
        let complete = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Complete" && c["status"] == "True");
        let ledger = job::ledger(j);
        let recorded: BTreeSet<&str> = ledger
            .iter()
            .filter(|(_, e)| e.result == job::Outcome::Succeeded)
            .map(|(uid, _)| uid.as_str())
            .collect();
        let truth: BTreeSet<&str> = kubelets
            .succeeded
            .iter()
            .filter(|(_, owner)| owner.as_str() == uid_of(j))
            .map(|(pod, _)| pod.as_str())
            .collect();
        let spec = job::Spec::of(j);
        let succeeded = status["succeeded"].as_u64().unwrap_or(0);
        let expected = if spec.indexed {
            spec.completions
        } else {
            truth.len() as u64
        };
        let still_running = snapshot
            .owned_by(namespace, uid_of(j))
            .iter()
            .filter(|p| p.is_active() && !ledger.contains_key(&p.uid))
            .count();
        let indexes_ok = !spec.indexed
            || status["completedIndexes"]
                == format!("0-{}", spec.completions.saturating_sub(1)).as_str();
        if !complete
            || recorded != truth
            || succeeded != expected
            || succeeded < spec.completions
            || still_running != 0
            || !indexes_ok
        {
            errors.push(format!(
                "Job {}: complete {complete}, succeeded {succeeded} (expected {expected}), \
                 recorded {recorded:?} but succeeded on nodes {truth:?}, {still_running} still \
                 running, completedIndexes {}",
                name(j),
                status["completedIndexes"]
            ));
        }
    }
    // Each CronJob: one Job per scheduled time, none missed between its first and its last.
    for cj in &snapshot.cron_jobs {
        let mut times: Vec<u64> = snapshot
            .jobs
            .iter()
            .filter(|j| {
                shoal_core::controllers::workload::controller_of(j).as_deref() == Some(uid_of(cj))
            })
            .filter_map(|j| {
                let at = j["metadata"]["annotations"]
                    [shoal_core::controllers::cron_job::SCHEDULED_KEY]
                    .as_str()?;
                humantime::parse_rfc3339(at).ok()
            })
            .filter_map(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64)
            .collect();
        times.sort_unstable();
        let schedule = shoal_model::cron::schedule(cj).map_err(|e| e.to_string())?;
        for pair in times.windows(2) {
            if schedule.next(pair[0]) != Some(pair[1]) {
                errors.push(format!(
                    "CronJob {}: Jobs scheduled at {} and then {} (expected {:?})",
                    name(cj),
                    pair[0],
                    pair[1],
                    schedule.next(pair[0])
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

fn replica_set(name: &str, replicas: u64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
}

fn deployment(name: &str, replicas: u64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}}})
}

fn batch_job(name: &str, completions: u64, parallelism: u64, indexed: bool) -> Value {
    let mut j = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"completions": completions, "parallelism": parallelism,
            "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}]}}}});
    if indexed {
        j["spec"]["completionMode"] = json!("Indexed");
    }
    j
}

fn key(group_version: &str, kind: &str, name: &str) -> ObjectKey {
    ObjectKey::new(
        shoal_state::kind::lookup(group_version, kind).expect("a stored kind"),
        "default",
        name,
    )
}

fn active_pods(store: &Store, owner_uid: &str) -> usize {
    store
        .list("", "Pod", None)
        .iter()
        .filter(|p| {
            shoal_core::controllers::workload::controller_of(p).as_deref() == Some(owner_uid)
        })
        .count()
}

#[test]
fn replica_sets_reconciled_on_both_sides_heal_to_exact_counts() {
    let mut sim = Sim::new();
    // `settled` runs before the cut; `fresh` is applied just before it (no pod yet anywhere).
    sim.user_write(0, replica_set("settled", 3), WriteMode::Create);
    for _ in 0..3 {
        sim.round();
    }
    sim.check().expect("healthy before the cut");
    sim.user_write(0, replica_set("fresh", 3), WriteMode::Create);
    sim.partitioned = true;
    // Each side scales `settled` on its own: the later write (side b's) wins the merge.
    sim.user_edit(0, &key("apps/v1", "ReplicaSet", "settled"), |rs| {
        rs["spec"]["replicas"] = json!(5)
    });
    for _ in 0..4 {
        sim.round();
    }
    sim.user_edit(1, &key("apps/v1", "ReplicaSet", "settled"), |rs| {
        rs["spec"]["replicas"] = json!(2)
    });
    for _ in 0..4 {
        sim.round();
    }
    // Both sides created `fresh`'s three pods: six in all.
    let fresh = sim.sides[0]
        .1
        .get(&key("apps/v1", "ReplicaSet", "fresh"))
        .unwrap();
    let uid = uid_of(&fresh).to_owned();
    assert_eq!(
        (
            active_pods(&sim.sides[0].1, &uid),
            active_pods(&sim.sides[1].1, &uid)
        ),
        (3, 3)
    );
    sim.partitioned = false;
    sim.sync();
    assert_eq!(active_pods(&sim.sides[0].1, &uid), 6, "both sides' pods");
    sim.settle();
    sim.check().unwrap();
    let settled = sim.sides[1]
        .1
        .get(&key("apps/v1", "ReplicaSet", "settled"))
        .unwrap();
    assert_eq!(settled["spec"]["replicas"], 2, "the later scale won");
}

#[test]
fn a_deployment_both_sides_rolled_out_heals_to_one_replica_set_per_template() {
    let mut sim = Sim::new();
    // `cut` is applied just before the partition: each side creates its ReplicaSet (same
    // name, two incarnations) and pods. `rolled` runs before and is rolled out on one side.
    sim.user_write(0, deployment("rolled", 4), WriteMode::Create);
    for _ in 0..6 {
        sim.round();
    }
    sim.check().expect("healthy before the cut");
    sim.user_write(0, deployment("cut", 3), WriteMode::Create);
    sim.partitioned = true;
    sim.user_edit(1, &key("apps/v1", "Deployment", "rolled"), |d| {
        d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:2")
    });
    for _ in 0..10 {
        sim.round();
    }
    let uids: Vec<String> = sim
        .sides
        .iter()
        .map(|(_, s)| {
            s.list("apps", "ReplicaSet", None)
                .iter()
                .filter(|rs| rs["metadata"]["name"].as_str().unwrap().starts_with("cut-"))
                .map(|rs| uid_of(rs).to_owned())
                .collect::<Vec<_>>()
                .concat()
        })
        .collect();
    assert_ne!(uids[0], uids[1], "each side created its own incarnation");
    sim.partitioned = false;
    sim.sync();
    sim.settle();
    sim.check().unwrap();
    let rolled = sim.sides[0]
        .1
        .get(&key("apps/v1", "Deployment", "rolled"))
        .unwrap();
    assert_eq!(
        rolled["spec"]["template"]["spec"]["containers"][0]["image"],
        "busybox:2"
    );
}

#[test]
fn jobs_run_on_both_sides_count_each_completion_once() {
    let mut sim = Sim::new();
    // `midway` is cut while running; the others are applied just before the cut.
    sim.user_write(0, batch_job("midway", 6, 2, false), WriteMode::Create);
    sim.user_write(
        0,
        batch_job("midway-indexed", 6, 2, true),
        WriteMode::Create,
    );
    for _ in 0..4 {
        sim.round();
    }
    sim.user_write(0, batch_job("cut", 4, 2, false), WriteMode::Create);
    sim.user_write(0, batch_job("cut-indexed", 4, 2, true), WriteMode::Create);
    // Long enough for each side to finish `cut` on its own.
    sim.partitioned = true;
    for _ in 0..10 {
        sim.round();
    }
    sim.partitioned = false;
    sim.sync();
    sim.settle();
    sim.check().unwrap();
    let store = &sim.sides[0].1;
    let succeeded = |name: &str| {
        let j = store.get(&key("batch/v1", "Job", name)).unwrap();
        let pods: Vec<PodView> = store
            .list("", "Pod", None)
            .iter()
            .map(|p| PodView::new(p, None))
            .collect();
        let status = job::status(&j, &pods, sim.now_ms);
        status["succeeded"].as_u64().unwrap()
    };
    // Indexed: each index counts once, however many sides ran it.
    assert_eq!(succeeded("cut-indexed"), 4);
    assert_eq!(succeeded("midway-indexed"), 6);
    // Not indexed: each side ran its own pods to four completions, and every one counts (the
    // work was done; Kubernetes' `succeeded` counts every succeeded pod too). Exactly
    // `completions` across a partition takes an Indexed Job.
    assert_eq!(succeeded("cut"), 8);
    assert!(succeeded("midway") >= 6);
}

/// The checker can fail: each deliberate violation of a settled cluster is named.
#[test]
fn the_checker_names_each_violation() {
    let mut sim = Sim::new();
    sim.user_write(0, replica_set("web", 2), WriteMode::Create);
    sim.user_write(0, batch_job("batch", 2, 1, true), WriteMode::Create);
    sim.settle();
    sim.check().unwrap();

    // A completion the ledger never recorded (a lost one), and one it recorded twice would
    // be the same pod: both break `recorded == truth`.
    let truth = sim.kubelets.succeeded.clone();
    sim.kubelets
        .succeeded
        .insert("lost-pod".into(), truth.values().next().unwrap().clone());
    let error = sim.check().unwrap_err();
    assert!(
        error.contains("Job default/batch") && error.contains("lost-pod"),
        "{error}"
    );
    sim.kubelets.succeeded = truth;
    sim.check().unwrap();

    // A duplicate pod of the ReplicaSet, written on one side only: the count and the stores
    // both differ.
    let pods = sim.sides[0].1.list("", "Pod", None);
    let mut extra = pods
        .iter()
        .find(|p| p["metadata"]["name"].as_str().unwrap().starts_with("web-"))
        .unwrap()
        .clone();
    extra["metadata"]["name"] = json!("web-extra");
    for field in ["uid", "resourceVersion", "creationTimestamp"] {
        extra["metadata"].as_object_mut().unwrap().remove(field);
    }
    let valid = shoal_state::validate(extra, "default").unwrap();
    sim.sides[0]
        .1
        .write_at(valid, WriteMode::Create, sim.now_ms)
        .unwrap();
    let nodes = sim.all_nodes();
    let (round, now_ms) = (sim.round, sim.now_ms);
    sim.kubelets
        .step(&mut sim.sides[0].1, &nodes, round, now_ms);
    let error = sim.check().unwrap_err();
    assert!(error.contains("stores differ"), "{error}");
    assert!(
        error.contains("ReplicaSet default/web has 3 active pods"),
        "{error}"
    );
}

#[test]
fn a_cron_job_scheduled_on_both_sides_keeps_one_job_per_time() {
    let mut sim = Sim::new();
    sim.round_ms = 10_000;
    sim.user_write(
        0,
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "tick", "namespace": "default"},
            "spec": {"schedule": "*/1 * * * *", "successfulJobsHistoryLimit": 20,
                "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}]}}}}}}),
        WriteMode::Create,
    );
    for _ in 0..9 {
        sim.round();
    }
    // Cut for three and a half scheduled times: each side starts its own Job of each, under
    // the same name.
    sim.partitioned = true;
    for _ in 0..21 {
        sim.round();
    }
    let jobs = |store: &Store| -> Vec<(String, String)> {
        store
            .list("batch", "Job", None)
            .iter()
            .map(|j| {
                (
                    shoal_core::controllers::name_of(j).to_owned(),
                    uid_of(j).to_owned(),
                )
            })
            .collect()
    };
    let (a, b) = (jobs(&sim.sides[0].1), jobs(&sim.sides[1].1));
    let names = |jobs: &[(String, String)]| jobs.iter().map(|j| j.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b), "the same Jobs by name on both sides");
    assert_eq!(a.len(), 5);
    assert!(a.iter().zip(&b).filter(|(x, y)| x.1 != y.1).count() >= 3);
    sim.partitioned = false;
    sim.sync();
    // The merge kept one incarnation of each Job: the other's pods name a dropped owner.
    let error = sim.check().unwrap_err();
    assert!(error.contains("which is not stored"), "{error}");
    let key = key("batch/v1", "CronJob", "tick");
    sim.user_edit(0, &key, |cj| cj["spec"]["suspend"] = json!(true));
    sim.sync();
    sim.settle();
    sim.check().unwrap();
    assert_eq!(sim.sides[0].1.list("batch", "Job", None).len(), 5);
}

/// Every workload at once, cut at different moments for different lengths, with different
/// names drawn: each heals to the invariants.
#[test]
fn cuts_at_any_moment_heal_to_the_invariants() {
    for case in 0..12u64 {
        let mut sim = Sim::new();
        sim.seed ^= case.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        sim.user_write(0, replica_set("web", 3), WriteMode::Create);
        sim.user_write(0, deployment("api", 3), WriteMode::Create);
        sim.user_write(0, batch_job("batch", 4, 2, false), WriteMode::Create);
        sim.user_write(0, batch_job("indexed", 4, 2, true), WriteMode::Create);
        for _ in 0..case % 4 {
            sim.round();
        }
        sim.partitioned = true;
        let side = (case % 2) as usize;
        sim.user_edit(side, &key("apps/v1", "ReplicaSet", "web"), |rs| {
            rs["spec"]["replicas"] = json!(1 + case % 5)
        });
        for _ in 0..3 + case {
            sim.round();
        }
        sim.partitioned = false;
        sim.sync();
        sim.settle();
        sim.check().unwrap_or_else(|e| panic!("case {case}: {e}"));
    }
}

//! The invariants a chaos run is judged by, each a pure function of the recorded history and the
//! observed final state (DESIGN.md §11). They are tested below on hand-made histories, violating
//! ones included, so a checker that cannot fail would be caught.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::history::{Op, Outcome, Request};

/// A broken invariant, with the operations involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub checker: &'static str,
    pub message: String,
    pub ops: Vec<u64>,
}

/// A register object as it is at the end: its incarnation's uid and its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Final {
    pub uid: String,
    pub value: String,
}

pub const ACKNOWLEDGED_WRITES: &str = "acknowledged writes survive";
pub const CONVERGENCE: &str = "stores converge";
pub const TEARDOWN: &str = "nothing leaks, nothing panics";
pub const REPLICAS: &str = "replica counts exact";
pub const SECRET: &str = "no secret, no entry";
pub const FENCED: &str = "a fenced pod never runs twice";
pub const OVERCOMMIT: &str = "no node runs more than its allocatable";
pub const READS: &str = "reads never wait for a disk";
pub const HOSTILE: &str = "hostile objects refused or failed by name";
pub const REPLACED: &str = "a silenced node's fenced pods are replaced";

/// Checker 1: every acknowledged operation is visible at the end, or superseded under the
/// documented merge rules (`crdt-state/src/crdt.rs`):
/// - within one incarnation (uid), the same field is last-writer-wins by (HLC, node): an
///   acknowledged write may be replaced by another write to the key that was not over before it
///   began (concurrent or later; with clocks in step, an earlier one cannot have a later stamp);
/// - a delete wins over every update of its incarnation, concurrent or not, and of two
///   incarnations of one name the one created later (by HLC) replaces the other whole: an
///   acknowledged write to incarnation U may be gone if a delete of U may have happened, or if
///   another incarnation was not created strictly before U (real-time order of the creates that
///   answered 201; an incarnation created by an operation of unknown outcome may be either);
/// - an acknowledged delete of U holds if U is gone; a different, newer incarnation may hold
///   the name (only a create brings it back);
/// - a final value no operation wrote is always a violation.
///
/// An operation of unknown outcome may take effect at any time after it began ([`Op::may_follow`]);
/// an incarnation no answer names may have been created by one.
///
/// `finals` maps each key to its final state (absent = no live object).
pub fn acknowledged_writes(ops: &[Op], finals: &BTreeMap<String, Final>) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        by_key.entry(op.request.key()).or_default().push(op);
    }
    let violation = |message: String, ops: Vec<u64>| Violation {
        checker: ACKNOWLEDGED_WRITES,
        message,
        ops,
    };
    for (key, final_state) in finals {
        let writer = by_key.get(key.as_str()).and_then(|ops| {
            ops.iter().find(|o| {
                matches!(&o.request, Request::Write { value, .. } if *value == final_state.value)
            })
        });
        match writer {
            None => violations.push(violation(
                format!(
                    "{key} ends as {:?}, which no operation wrote",
                    final_state.value
                ),
                Vec::new(),
            )),
            Some(w) if w.outcome == Outcome::Fail => violations.push(violation(
                format!(
                    "{key} ends as {:?}, written by op {} that failed (definitely not applied)",
                    final_state.value, w.id
                ),
                vec![w.id],
            )),
            Some(_) => {}
        }
    }
    for (key, key_ops) in &by_key {
        let final_state = finals.get(*key);
        let create_of = |uid: &str| {
            key_ops
                .iter()
                .find(|o| o.created && o.outcome == Outcome::Ok && o.uid.as_deref() == Some(uid))
        };
        // Whether incarnation `newer` may have replaced `older`: not created strictly before it.
        let may_replace = |older: &str, newer: &str| match (create_of(older), create_of(newer)) {
            (Some(a), Some(b)) => !b.precedes(a),
            _ => true,
        };
        // Incarnations seen in answers, and the final one (which a write of unknown outcome may
        // have created: no answer names it).
        let incarnations: std::collections::BTreeSet<&str> = key_ops
            .iter()
            .filter_map(|o| o.uid.as_deref())
            .chain(final_state.map(|f| f.uid.as_str()))
            .collect();
        // Whether an incarnation no answer names — created by a write of unknown outcome, not
        // strictly before `older` was — may have replaced `older` and then been deleted.
        let phantom_replaced_and_deleted = |older: &str| {
            key_ops.iter().any(|w| {
                matches!(w.request, Request::Write { .. })
                    && w.outcome == Outcome::Unknown
                    && create_of(older).is_none_or(|c| w.may_follow(c))
                    && key_ops.iter().any(|d| {
                        matches!(d.request, Request::Delete { .. })
                            && d.may_have_happened()
                            && d.may_follow(w)
                    })
            })
        };
        for acked in key_ops.iter().filter(|o| o.outcome == Outcome::Ok) {
            let uid = acked.uid.as_deref();
            // Whether incarnation `uid` may be gone: a delete that says it removed it (or whose
            // incarnation is unknown and that was not over before `acked` began), or another
            // incarnation that may have replaced it.
            let deleted_by = || {
                let deleted = key_ops.iter().any(|d| {
                    matches!(d.request, Request::Delete { .. })
                        && d.may_have_happened()
                        && match (&d.uid, uid) {
                            (Some(d_uid), Some(uid)) => d_uid == uid,
                            _ => d.may_follow(acked),
                        }
                });
                deleted
                    || uid.is_some_and(|u| {
                        incarnations
                            .iter()
                            .any(|other| *other != u && may_replace(u, other))
                            || (final_state.is_none() && phantom_replaced_and_deleted(u))
                    })
            };
            match (&acked.request, final_state) {
                (Request::Write { value, .. }, Some(f)) if *value == f.value => {}
                (Request::Write { value, .. }, Some(f)) => {
                    let same_incarnation = uid.is_none_or(|u| u == f.uid);
                    let superseded = if same_incarnation {
                        key_ops.iter().any(|s| {
                            matches!(&s.request, Request::Write { value: v, .. } if *v == f.value)
                                && s.may_have_happened()
                                && s.may_follow(acked)
                        })
                    } else {
                        deleted_by()
                    };
                    if !superseded {
                        violations.push(violation(
                            format!(
                                "acknowledged write {} of {value:?} to {key} is lost: {key} ends as {:?} (uid {}), written before op {} began{}",
                                acked.id,
                                f.value,
                                f.uid,
                                acked.id,
                                if same_incarnation { "" } else { ", and its incarnation was neither deleted nor replaced by a newer one" }
                            ),
                            vec![acked.id],
                        ));
                    }
                }
                (Request::Write { value, .. }, None) => {
                    if !deleted_by() {
                        violations.push(violation(
                            format!(
                                "acknowledged write {} of {value:?} to {key} is lost: {key} is gone and nothing deleted it",
                                acked.id
                            ),
                            vec![acked.id],
                        ));
                    }
                }
                (Request::Delete { .. }, Some(f)) if uid == Some(f.uid.as_str()) => {
                    violations.push(violation(
                        format!(
                            "acknowledged delete {} of {key} (uid {}) is lost: the same incarnation is live at the end with {:?}",
                            acked.id, f.uid, f.value
                        ),
                        vec![acked.id],
                    ));
                }
                (Request::Delete { .. }, _) => {}
            }
        }
    }
    violations
}

/// What the stores of the live agents looked like at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DigestSample {
    pub at_ms: u64,
    /// The root digest of each live agent that answered.
    pub digests: Vec<String>,
    /// Live agents that did not answer.
    pub unanswered: usize,
}

impl DigestSample {
    pub fn agree(&self) -> bool {
        self.unanswered == 0
            && !self.digests.is_empty()
            && self.digests.iter().all(|d| *d == self.digests[0])
    }
}

/// Checker 2: after the last fault is healed (`healed_ms`), every live agent's store digest is
/// identical within `bound_ms`. Returns the convergence time (from the heal to the first sample
/// where all agree), or the violation.
pub fn convergence(
    samples: &[DigestSample],
    healed_ms: u64,
    bound_ms: u64,
) -> Result<u64, Violation> {
    match settled(
        samples,
        |s| s.at_ms,
        DigestSample::agree,
        healed_ms,
        bound_ms,
    ) {
        Ok(ms) => Ok(ms),
        Err((found, last)) => {
            let found = found.map(|ms| ms + healed_ms);
            Err(Violation {
                checker: CONVERGENCE,
                message: match (found, last) {
                    (Some(at), _) => format!(
                        "stores agreed only {} ms after the heal; the bound is {bound_ms} ms",
                        at - healed_ms
                    ),
                    (None, Some(l)) => format!(
                        "stores never agreed within {} ms of the heal (last sample: {} distinct digests, {} agents not answering)",
                        l.at_ms - healed_ms,
                        distinct(&l.digests),
                        l.unanswered
                    ),
                    (None, None) => "no digest sample after the heal".into(),
                },
                ops: Vec::new(),
            })
        }
    }
}

/// The time from `healed_ms` to the first sample after it for which `ok` holds, if that is within
/// `bound_ms`; otherwise when (if ever) it held, after the heal, and the last sample.
fn settled<S>(
    samples: &[S],
    at_ms: impl Fn(&S) -> u64,
    ok: impl Fn(&S) -> bool,
    healed_ms: u64,
    bound_ms: u64,
) -> Result<u64, (Option<u64>, Option<&S>)> {
    let after: Vec<&S> = samples.iter().filter(|s| at_ms(s) >= healed_ms).collect();
    match after.iter().find(|s| ok(s)) {
        Some(s) if at_ms(s) - healed_ms <= bound_ms => Ok(at_ms(s) - healed_ms),
        found => Err((found.map(|s| at_ms(s) - healed_ms), after.last().copied())),
    }
}

fn distinct(digests: &[String]) -> usize {
    let mut d: Vec<&String> = digests.iter().collect();
    d.sort();
    d.dedup();
    d.len()
}

/// A pod of a workload object as a store holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodSeen {
    pub name: String,
    /// The uid its `ownerReferences` name with `controller: true`.
    pub controller: Option<String>,
    /// `spec.nodeName`.
    pub node: Option<String>,
}

/// The chaos workload's Deployment, DaemonSet and Job and their pods at one moment, in one
/// store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplicaSample {
    pub at_ms: u64,
    /// The Deployment's `spec.replicas` (none: the Deployment is gone).
    pub desired: Option<u64>,
    /// The uids of the ReplicaSets the Deployment controls.
    pub replica_sets: Vec<String>,
    /// The pods the Deployment's selector matches that are not being deleted.
    pub pods: Vec<PodSeen>,
    /// The DaemonSet's uid (none: gone).
    pub daemon_set: Option<String>,
    /// The nodes a DaemonSet pod belongs on (every node of the lab: none has a taint or label
    /// the DaemonSet excludes).
    pub nodes: Vec<String>,
    /// The DaemonSet's selector's pods that are not being deleted.
    pub daemon_pods: Vec<PodSeen>,
    /// The Job (none: gone).
    pub job: Option<JobSeen>,
}

/// An Indexed Job's counts, from the completions recorded in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JobSeen {
    pub completions: u64,
    /// `status.succeeded`.
    pub succeeded: u64,
    /// `status.completedIndexes` (`0-5`).
    pub completed_indexes: String,
    /// Whether it has the condition `Complete`.
    pub complete: bool,
}

impl ReplicaSample {
    /// What is not exact in this sample; empty when the counts are.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let names = |pods: &[&PodSeen]| {
            pods.iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self.desired {
            None => problems.push("the Deployment is gone".to_owned()),
            Some(desired) => {
                if self.pods.len() as u64 != desired {
                    let all: Vec<&PodSeen> = self.pods.iter().collect();
                    problems.push(format!(
                        "{} pods for {desired} replicas: [{}]",
                        self.pods.len(),
                        names(&all)
                    ));
                }
            }
        }
        // The workload never changes the Deployment's template: a second ReplicaSet is a
        // rollout nobody asked for (and its surge pods make the count inexact by luck).
        if self.replica_sets.len() > 1 {
            problems.push(format!(
                "the Deployment controls {} ReplicaSets; its template never changed, so one",
                self.replica_sets.len()
            ));
        }
        for pod in &self.pods {
            let owned = pod
                .controller
                .as_ref()
                .is_some_and(|uid| self.replica_sets.contains(uid));
            if !owned {
                problems.push(format!(
                    "pod {} is controlled by {}, not by a ReplicaSet of the Deployment",
                    pod.name,
                    pod.controller.as_deref().unwrap_or("nothing")
                ));
            }
        }
        match &self.job {
            None => problems.push("the Job is gone".to_owned()),
            Some(job) => {
                let all = match job.completions {
                    0 => String::new(),
                    1 => "0".to_owned(),
                    n => format!("0-{}", n - 1),
                };
                if job.succeeded != job.completions || job.completed_indexes != all || !job.complete
                {
                    problems.push(format!(
                        "the Job counts {} of {} completions (indexes {:?}, complete: {})",
                        job.succeeded, job.completions, job.completed_indexes, job.complete
                    ));
                }
            }
        }
        let Some(daemon_set) = &self.daemon_set else {
            problems.push("the DaemonSet is gone".to_owned());
            return problems;
        };
        for node in &self.nodes {
            let on: Vec<&PodSeen> = self
                .daemon_pods
                .iter()
                .filter(|p| p.node.as_ref() == Some(node))
                .collect();
            match on.len() {
                1 => {}
                0 => problems.push(format!("no DaemonSet pod on {node}")),
                n => problems.push(format!("{n} DaemonSet pods on {node}: [{}]", names(&on))),
            }
        }
        for pod in &self.daemon_pods {
            if !pod.node.as_ref().is_some_and(|n| self.nodes.contains(n)) {
                problems.push(format!(
                    "DaemonSet pod {} is on {}, not a node of the cluster",
                    pod.name,
                    pod.node.as_deref().unwrap_or("no node")
                ));
            }
            if pod.controller.as_ref() != Some(daemon_set) {
                problems.push(format!(
                    "DaemonSet pod {} is controlled by {}, not by the DaemonSet",
                    pod.name,
                    pod.controller.as_deref().unwrap_or("nothing")
                ));
            }
        }
        problems
    }
}

/// Checker 3: once the faults are healed (`healed_ms`), within `bound_ms` the Deployment has
/// exactly `spec.replicas` pods, all its ReplicaSets', the DaemonSet exactly one pod on each
/// node, and the Indexed Job exactly its completions, each index once, and `Complete`: no
/// duplicate left by a healed partition, none lost with a killed node, no completion lost or
/// counted twice. Returns the time
/// it took, or the violation with what the last sample still got wrong.
pub fn replicas(
    samples: &[ReplicaSample],
    healed_ms: u64,
    bound_ms: u64,
) -> Result<u64, Violation> {
    let exact = |s: &ReplicaSample| s.problems().is_empty();
    settled(samples, |s| s.at_ms, exact, healed_ms, bound_ms).map_err(|(found, last)| Violation {
        checker: REPLICAS,
        message: match (found, last) {
            (Some(ms), _) => {
                format!("counts were exact only {ms} ms after the heal; the bound is {bound_ms} ms")
            }
            (None, Some(last)) => format!(
                "counts not exact {} ms after the heal: {}",
                last.at_ms - healed_ms,
                last.problems().join("; ")
            ),
            (None, None) => "no replica sample after the heal".into(),
        },
        ops: Vec::new(),
    })
}

/// What an agent started with another cluster's secret (and the same seeds) saw during a run,
/// what the cluster's agents saw of it, and how their APIs answered calls without the token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Intrusion {
    pub intruder: String,
    /// (agent, ms since start, the member names it listed), sampled through the run.
    pub views: Vec<(String, u64, Vec<String>)>,
    /// (ms since start, the member names the intruder listed).
    pub intruder_views: Vec<(u64, Vec<String>)>,
    /// The workload's objects the intruder's store held when asked (registers, the Deployment).
    pub intruder_objects: Vec<String>,
    /// (agent, the request, the HTTP status, or 0 when it did not answer) of API calls made
    /// without a valid token.
    pub unauthenticated: Vec<(String, String, u16)>,
}

/// Checker 6: a node without the secret never joins (no agent ever lists it, it never lists one
/// of them) nor reads state (its store holds none of the workload's objects), and every API call
/// without a valid token is answered 401. Missing evidence (no sample, no call) is a violation
/// too: this checker cannot pass by looking at nothing.
pub fn secret(intrusion: &Intrusion) -> Vec<Violation> {
    let violation = |message: String| Violation {
        checker: SECRET,
        message,
        ops: Vec::new(),
    };
    let mut violations = Vec::new();
    let intruder = &intrusion.intruder;
    if intrusion.views.is_empty() || intrusion.intruder_views.is_empty() {
        violations.push(violation(
            "no membership sample of the agents or of the intruder was taken".into(),
        ));
    }
    if intrusion.unauthenticated.is_empty() {
        violations.push(violation("no API call without a token was made".into()));
    }
    if let Some((agent, at, _)) = intrusion
        .views
        .iter()
        .find(|(_, _, members)| members.contains(intruder))
    {
        violations.push(violation(format!(
            "{agent} listed {intruder}, which has no secret, as a member at {at} ms"
        )));
    }
    if let Some((at, members)) = intrusion
        .intruder_views
        .iter()
        .find(|(_, members)| members.iter().any(|m| m != intruder))
    {
        violations.push(violation(format!(
            "{intruder}, which has no secret, listed members {members:?} at {at} ms"
        )));
    }
    if !intrusion.intruder_objects.is_empty() {
        violations.push(violation(format!(
            "{intruder}, which has no secret, holds the cluster's objects {:?}",
            intrusion.intruder_objects
        )));
    }
    for (agent, request, status) in &intrusion.unauthenticated {
        if *status != 401 {
            violations.push(violation(format!(
                "{agent} answered {request} without a valid token with {status}, not 401"
            )));
        }
    }
    violations
}

/// What was left on the machine after a lab's teardown, and the agents' logs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Leftovers {
    /// Processes still running from the lab's directory.
    pub processes: Vec<String>,
    /// Network namespaces with the lab's prefix.
    pub namespaces: Vec<String>,
    /// Mounts below the lab's directory.
    pub mounts: Vec<String>,
}

/// One run of a fenced pod's container, from its own evidence: the heartbeats it appended to a
/// file of its own (`<pod>_<node>_<instance id>`), on the host clock every node shares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instance {
    pub pod: String,
    pub node: String,
    /// The id the container drew when it started (one per run).
    pub id: String,
    /// Its first and last heartbeat (ms on the run's clock): it ran at least from one to the
    /// other.
    pub first_ms: u64,
    pub last_ms: u64,
    pub beats: usize,
}

/// Checker 4: no two runs of one fenced pod overlap in time, on one node or two. An instance
/// ran at least from its first heartbeat to its last, so two instances whose spans share an
/// instant ran at once; a span that ends as the other begins (the same heartbeat tick) is not
/// counted. `pods` are the fenced pods of the workload: one without any heartbeat is a
/// violation too (no evidence is not a pass).
pub fn fenced(pods: &[String], instances: &[Instance]) -> Vec<Violation> {
    let violation = |message: String| Violation {
        checker: FENCED,
        message,
        ops: Vec::new(),
    };
    let mut violations = Vec::new();
    for pod in pods {
        let mut runs: Vec<&Instance> = instances
            .iter()
            .filter(|i| &i.pod == pod && i.beats > 0)
            .collect();
        if runs.is_empty() {
            violations.push(violation(format!(
                "{pod} left no heartbeat: nothing shows where it ran"
            )));
            continue;
        }
        runs.sort_by_key(|i| (i.first_ms, i.last_ms));
        for (k, a) in runs.iter().enumerate() {
            for b in &runs[k + 1..] {
                if b.first_ms >= a.last_ms {
                    // Sorted by start: no later run can overlap `a` either.
                    break;
                }
                violations.push(violation(format!(
                    "{pod} ran twice at once for {} ms: instance {} on {} ({}..{} ms) and instance {} on {} ({}..{} ms)",
                    a.last_ms.min(b.last_ms) - b.first_ms,
                    a.id,
                    a.node,
                    a.first_ms,
                    a.last_ms,
                    b.id,
                    b.node,
                    b.first_ms,
                    b.last_ms
                )));
            }
        }
    }
    violations
}

/// How recent a heartbeat must be for its run to count as running (heartbeats come every
/// 100 ms; a loaded host delays some).
pub const FRESH_MS: u64 = 500;

/// The fenced pods running on `node` at `at_ms`: a run that had started by then and whose last
/// heartbeat is at most [`FRESH_MS`] before.
pub fn running_on(runs: &[Instance], node: &str, at_ms: u64) -> Vec<String> {
    let mut pods: Vec<String> = runs
        .iter()
        .filter(|r| r.node == node && r.beats > 0)
        .filter(|r| r.first_ms <= at_ms && r.last_ms + FRESH_MS >= at_ms)
        .map(|r| r.pod.clone())
        .collect();
    pods.sort();
    pods.dedup();
    pods
}

/// A fault that silenced a node running fenced pods (a pause, a stuck kubelet cut off).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Silenced {
    pub fault: &'static str,
    pub node: String,
    pub start_ms: u64,
    pub end_ms: u64,
}

/// Checker 9: the fenced pods that ran on a silenced node when its fault started were each
/// started on another node before the fault ended (a run there whose first heartbeat falls
/// inside the fault): fencing must not cost availability for longer than the replacement
/// delay. A fault that found no fenced pod on its node is a violation too (the scenario tested
/// nothing).
pub fn replaced(runs: &[Instance], silenced: &[Silenced]) -> Vec<Violation> {
    let violation = |message: String| Violation {
        checker: REPLACED,
        message,
        ops: Vec::new(),
    };
    let mut violations = Vec::new();
    for s in silenced {
        let pods = running_on(runs, &s.node, s.start_ms);
        if pods.is_empty() {
            violations.push(violation(format!(
                "the {} of {} at {:.1} s found no fenced pod running there: nothing was tested",
                s.fault,
                s.node,
                s.start_ms as f64 / 1000.0
            )));
        }
        for pod in pods {
            let moved = runs.iter().any(|r| {
                r.pod == pod
                    && r.node != s.node
                    && r.beats > 0
                    && r.first_ms > s.start_ms
                    && r.first_ms <= s.end_ms
            });
            if !moved {
                violations.push(violation(format!(
                    "{pod} ran on {} when its {} started at {:.1} s and was not started on another node before it ended at {:.1} s",
                    s.node,
                    s.fault,
                    s.start_ms as f64 / 1000.0,
                    s.end_ms as f64 / 1000.0
                )));
            }
        }
    }
    violations
}

/// The cpu one node had granted at one moment, from the kernel ([`crate::cpu`]): each running
/// container's cgroup and its cpu shares (1024 per requested cpu; 2 is the minimum a container
/// without a cpu request gets, and requests nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuSample {
    pub at_ms: u64,
    pub node: String,
    pub allocatable_millis: u64,
    pub granted: Vec<crate::cpu::Granted>,
}

impl CpuSample {
    /// The shares of the containers that requested cpu.
    pub fn requested_shares(&self) -> u64 {
        self.granted
            .iter()
            .filter(|g| g.shares > 2)
            .map(|g| g.shares)
            .sum()
    }
}

/// Checker 5: no node ever runs containers whose cpu requests exceed its allocatable (the
/// shares they were granted sum to more than the node's cpu in shares). One violation per
/// node, at its first overcommitted sample, with the containers and how many samples were over.
/// A run in which no container with a cpu request was ever seen running is a violation too:
/// no evidence is not a pass.
pub fn overcommit(samples: &[CpuSample]) -> Vec<Violation> {
    let violation = |message: String| Violation {
        checker: OVERCOMMIT,
        message,
        ops: Vec::new(),
    };
    let mut violations = Vec::new();
    if !samples.iter().any(|s| s.requested_shares() > 0) {
        violations.push(violation(
            "no container with a cpu request was seen running: nothing shows what nodes granted"
                .into(),
        ));
    }
    let mut nodes: Vec<&str> = samples.iter().map(|s| s.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    for node in nodes {
        let over: Vec<&CpuSample> = samples
            .iter()
            .filter(|s| s.node == node)
            .filter(|s| s.requested_shares() > crate::cpu::shares_of_millis(s.allocatable_millis))
            .collect();
        let Some(first) = over.first() else {
            continue;
        };
        violations.push(violation(format!(
            "{node} ran containers granted {} cpu shares (≈ {} m) on {} m allocatable at {} ms ({} samples over): {}",
            first.requested_shares(),
            first.requested_shares() * 1000 / 1024,
            first.allocatable_millis,
            first.at_ms,
            over.len(),
            first
                .granted
                .iter()
                .map(|g| format!("{} {} ({})", g.cgroup, g.shares, g.process))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    violations
}

/// Checker 7: nothing of the lab survives its teardown and no agent log holds a panic.
/// `logs` are (agent name, log text).
pub fn teardown(leftovers: &Leftovers, logs: &[(String, String)]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (what, items) in [
        ("processes", &leftovers.processes),
        ("network namespaces", &leftovers.namespaces),
        ("mounts", &leftovers.mounts),
    ] {
        if !items.is_empty() {
            violations.push(Violation {
                checker: TEARDOWN,
                message: format!(
                    "{} {what} left after teardown: {}",
                    items.len(),
                    items.join(", ")
                ),
                ops: Vec::new(),
            });
        }
    }
    for (agent, log) in logs {
        if let Some(line) = log.lines().find(|l| l.contains("panicked at")) {
            violations.push(Violation {
                checker: TEARDOWN,
                message: format!("agent {agent} panicked: {}", line.trim()),
                ops: Vec::new(),
            });
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: u64, request: Request, at: (u64, u64), outcome: Outcome, uid: Option<&str>) -> Op {
        Op {
            id,
            node: 0,
            request,
            invoked_ms: at.0,
            completed_ms: at.1,
            outcome,
            uid: uid.map(str::to_owned),
            created: false,
            detail: String::new(),
        }
    }

    fn created(mut op: Op) -> Op {
        op.created = true;
        op
    }

    fn write(id: u64, value: &str, at: (u64, u64), outcome: Outcome, uid: Option<&str>) -> Op {
        let request = Request::Write {
            key: "k".into(),
            value: value.into(),
        };
        op(id, request, at, outcome, uid)
    }

    fn delete(id: u64, at: (u64, u64), outcome: Outcome, uid: Option<&str>) -> Op {
        op(id, Request::Delete { key: "k".into() }, at, outcome, uid)
    }

    fn ends(uid: &str, value: &str) -> BTreeMap<String, Final> {
        [(
            "k".to_owned(),
            Final {
                uid: uid.into(),
                value: value.into(),
            },
        )]
        .into()
    }

    fn gone() -> BTreeMap<String, Final> {
        BTreeMap::new()
    }

    use Outcome::{Fail, Ok as Acked, Unknown};

    #[test]
    fn the_last_acknowledged_write_at_the_end_is_fine() {
        let ops = [
            write(1, "a", (0, 10), Acked, Some("u1")),
            write(2, "b", (20, 30), Acked, Some("u1")),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "b")), []);
    }

    #[test]
    fn an_acknowledged_write_replaced_by_an_earlier_one_is_lost() {
        let ops = [
            write(1, "a", (0, 10), Acked, Some("u1")),
            write(2, "b", (20, 30), Acked, Some("u1")),
        ];
        let v = acknowledged_writes(&ops, &ends("u1", "a"));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].ops, [2]);
        assert!(v[0].message.contains("is lost"), "{v:?}");
    }

    #[test]
    fn concurrent_writes_may_end_either_way() {
        let ops = [
            write(1, "a", (0, 30), Acked, Some("u1")),
            write(2, "b", (10, 20), Acked, Some("u1")),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "a")), []);
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "b")), []);
    }

    #[test]
    fn an_unknown_write_may_win_but_a_failed_one_never_shows() {
        let ops = [
            write(1, "a", (0, 10), Acked, Some("u1")),
            write(2, "b", (20, 30), Unknown, None),
            write(3, "c", (20, 30), Fail, None),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "b")), []);
        let v = acknowledged_writes(&ops, &ends("u1", "c"));
        assert!(v.iter().any(|v| v.message.contains("failed")), "{v:?}");
    }

    #[test]
    fn a_value_nobody_wrote_is_a_violation() {
        let ops = [write(1, "a", (0, 10), Acked, Some("u1"))];
        let v = acknowledged_writes(&ops, &ends("u1", "zzz"));
        assert!(
            v.iter().any(|v| v.message.contains("no operation wrote")),
            "{v:?}"
        );
    }

    #[test]
    fn a_vanished_write_needs_a_delete_of_its_incarnation() {
        let acked = write(1, "a", (0, 10), Acked, Some("u1"));
        let v = acknowledged_writes(std::slice::from_ref(&acked), &gone());
        assert_eq!(v.len(), 1, "{v:?}");
        // Delete wins over any update of its incarnation, even one acknowledged later.
        let ops = [delete(0, (0, 5), Acked, Some("u1")), acked.clone()];
        assert_eq!(acknowledged_writes(&ops, &gone()), []);
        // A delete of an older incarnation, over before the write began, does not explain it.
        let ops = [
            created(write(0, "z", (0, 1), Acked, Some("u0"))),
            delete(1, (2, 5), Acked, Some("u0")),
            created(write(2, "a", (6, 10), Acked, Some("u1"))),
        ];
        assert_eq!(acknowledged_writes(&ops, &gone()).len(), 1);
        // An unknown delete concurrent with it may.
        let ops = [acked, delete(2, (5, 50), Unknown, None)];
        assert_eq!(acknowledged_writes(&ops, &gone()), []);
    }

    /// Two incarnations of one name (created on both sides of a partition): the one created
    /// later replaces the other whole, so writes to the older one may go; an older one winning
    /// over a newer one is a violation.
    #[test]
    fn an_older_incarnation_yields_to_a_newer_one_never_the_reverse() {
        let ops = [
            created(write(1, "a", (0, 10), Acked, Some("u1"))),
            write(2, "b", (20, 30), Acked, Some("u1")),
            created(write(3, "c", (40, 50), Acked, Some("u2"))),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u2", "c")), []);
        let v = acknowledged_writes(&ops, &ends("u1", "b"));
        assert!(v.iter().any(|v| v.ops == [3]), "{v:?}");
        // Created concurrently: either may win.
        let ops = [
            created(write(1, "a", (0, 30), Acked, Some("u1"))),
            created(write(3, "c", (10, 20), Acked, Some("u2"))),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u1", "a")), []);
        assert_eq!(acknowledged_writes(&ops, &ends("u2", "c")), []);
    }

    /// Found by the partition scenario: an isolated node's write of unknown outcome (503) created
    /// an incarnation that, created later, replaced the one the majority kept acknowledging
    /// writes to. That is the documented rule for concurrent creates; with a write of unknown
    /// outcome behind it, it is no violation.
    #[test]
    fn an_incarnation_only_a_write_of_unknown_outcome_can_have_made_may_win() {
        let ops = [
            created(write(1, "a", (10, 20), Acked, Some("u1"))),
            write(2, "b", (30, 40), Acked, Some("u1")),
            write(3, "p", (15, 25), Unknown, None),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u9", "p")), []);
        // Even one that began before: like Jepsen's `info`, an operation of unknown outcome
        // may take effect at any time after it began (a frozen agent applies it when thawed).
        let ops = [
            created(write(1, "a", (10, 20), Acked, Some("u1"))),
            write(3, "p", (0, 5), Unknown, None),
        ];
        assert_eq!(acknowledged_writes(&ops, &ends("u9", "p")), []);
        // Made by an unknown write, then deleted by an unknown delete: the name may end empty.
        let ops = [
            created(write(1, "a", (10, 20), Acked, Some("u1"))),
            write(2, "b", (30, 40), Acked, Some("u1")),
            write(3, "p", (15, 25), Unknown, None),
            delete(4, (26, 28), Unknown, None),
        ];
        assert_eq!(acknowledged_writes(&ops, &gone()), []);
    }

    #[test]
    fn an_acknowledged_delete_must_not_come_back_in_the_same_incarnation() {
        let ops = [
            write(1, "a", (0, 10), Acked, Some("u1")),
            delete(2, (20, 30), Acked, Some("u1")),
        ];
        assert_eq!(acknowledged_writes(&ops, &gone()), []);
        let v = acknowledged_writes(&ops, &ends("u1", "a"));
        assert!(v.iter().any(|v| v.ops == [2]), "{v:?}");
        // A new incarnation may hold the name.
        let mut ops = ops.to_vec();
        ops.push(write(3, "b", (40, 50), Acked, Some("u2")));
        assert_eq!(acknowledged_writes(&ops, &ends("u2", "b")), []);
    }

    #[test]
    fn convergence_is_timed_from_the_heal_and_bounded() {
        let sample = |at_ms, digests: &[&str], unanswered| DigestSample {
            at_ms,
            digests: digests.iter().map(|d| d.to_string()).collect(),
            unanswered,
        };
        let samples = [
            sample(500, &["a", "a"], 0),
            sample(1_000, &["a", "b"], 0),
            sample(1_500, &["b", "b"], 1),
            sample(2_000, &["b", "b"], 0),
        ];
        assert_eq!(convergence(&samples, 900, 5_000), Ok(1_100));
        let late = convergence(&samples, 900, 1_000).unwrap_err();
        assert!(late.message.contains("only 1100 ms"), "{late:?}");
        let never = convergence(&samples[..3], 900, 5_000).unwrap_err();
        assert!(never.message.contains("never agreed"), "{never:?}");
    }

    fn pod(name: &str, controller: &str, node: &str) -> PodSeen {
        PodSeen {
            name: name.into(),
            controller: Some(controller.into()),
            node: Some(node.into()),
        }
    }

    fn exact_sample(at_ms: u64) -> ReplicaSample {
        ReplicaSample {
            at_ms,
            desired: Some(2),
            replica_sets: vec!["rs1".into()],
            pods: vec![pod("app-a", "rs1", "n0"), pod("app-b", "rs1", "n1")],
            daemon_set: Some("ds".into()),
            nodes: vec!["n0".into(), "n1".into()],
            daemon_pods: vec![pod("d-n0", "ds", "n0"), pod("d-n1", "ds", "n1")],
            job: Some(JobSeen {
                completions: 3,
                succeeded: 3,
                completed_indexes: "0-2".into(),
                complete: true,
            }),
        }
    }

    #[test]
    fn replica_counts_must_be_exact_once_healed() {
        assert_eq!(exact_sample(0).problems(), Vec::<String>::new());
        // A duplicate left by a healed partition, a pod of a foreign controller, a node without
        // its DaemonSet pod and one with two.
        let mut wrong = exact_sample(2_000);
        wrong.pods.push(pod("app-c", "rs1", "n1"));
        wrong.pods[0].controller = Some("rs-gone".into());
        wrong.daemon_pods[0].node = Some("n1".into());
        let problems = wrong.problems();
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(
            problems[0].contains("3 pods for 2 replicas"),
            "{problems:?}"
        );
        assert!(problems[1].contains("rs-gone"), "{problems:?}");
        assert!(
            problems[2].contains("no DaemonSet pod on n0"),
            "{problems:?}"
        );
        assert!(
            problems[3].contains("2 DaemonSet pods on n1"),
            "{problems:?}"
        );
        // A lost pod, a DaemonSet pod on a node that is not the cluster's, a gone DaemonSet.
        let mut lost = exact_sample(0);
        lost.pods.pop();
        lost.daemon_pods[1].node = Some("n9".into());
        let problems = lost.problems();
        assert!(
            problems[0].contains("1 pods for 2 replicas"),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("on n9, not a node")),
            "{problems:?}"
        );
        lost.daemon_set = None;
        assert!(
            lost.problems()
                .iter()
                .any(|p| p.contains("DaemonSet is gone"))
        );
        // A Job completion counted twice, one lost, one not yet complete, and a gone Job.
        let job_problem = |edit: &dyn Fn(&mut JobSeen)| {
            let mut sample = exact_sample(0);
            edit(sample.job.as_mut().unwrap());
            sample.problems()
        };
        let doubled = job_problem(&|j| j.succeeded = 4);
        assert!(doubled[0].contains("counts 4 of 3"), "{doubled:?}");
        let lost_index = job_problem(&|j| {
            j.succeeded = 2;
            j.completed_indexes = "0,2".into();
        });
        assert!(lost_index[0].contains("\"0,2\""), "{lost_index:?}");
        assert_eq!(job_problem(&|j| j.complete = false).len(), 1);
        let mut gone = exact_sample(0);
        gone.job = None;
        assert_eq!(gone.problems(), ["the Job is gone"]);
        // A rollout nobody asked for: the counts may be exact, the second ReplicaSet is not.
        let mut rolled = exact_sample(0);
        rolled.replica_sets.push("rs2".into());
        rolled.pods[1].controller = Some("rs2".into());
        assert_eq!(
            rolled.problems(),
            ["the Deployment controls 2 ReplicaSets; its template never changed, so one"]
        );

        let samples = [wrong.clone(), exact_sample(3_000)];
        assert_eq!(replicas(&samples, 1_000, 5_000), Ok(2_000));
        let late = replicas(&samples, 1_000, 1_000).unwrap_err();
        assert!(late.message.contains("only 2000 ms"), "{late:?}");
        let never = replicas(&samples[..1], 1_000, 5_000).unwrap_err();
        assert!(never.message.contains("3 pods for 2 replicas"), "{never:?}");
        // Samples before the heal do not count.
        assert!(replicas(&[exact_sample(500)], 1_000, 5_000).is_err());
    }

    fn clean_intrusion() -> Intrusion {
        Intrusion {
            intruder: "x".into(),
            views: vec![("n0".into(), 10, vec!["n0".into(), "n1".into()])],
            intruder_views: vec![(10, vec!["x".into()])],
            intruder_objects: Vec::new(),
            unauthenticated: vec![("n0".into(), "GET /api/v1/pods".into(), 401)],
        }
    }

    fn run(pod: &str, node: &str, id: &str, first_ms: u64, last_ms: u64) -> Instance {
        Instance {
            pod: pod.into(),
            node: node.into(),
            id: id.into(),
            first_ms,
            last_ms,
            beats: 10,
        }
    }

    #[test]
    fn a_silenced_node_s_fenced_pods_must_start_elsewhere_within_the_fault() {
        let silenced = [Silenced {
            fault: "pause",
            node: "n1".into(),
            start_ms: 2_000,
            end_ms: 14_000,
        }];
        // f-0 ran on n1 when the pause began and started on n2 at 9 s; f-1 ran elsewhere.
        let moved = [
            run("f-0", "n1", "a", 100, 1_950),
            run("f-0", "n2", "b", 9_000, 20_000),
            run("f-1", "n3", "c", 100, 20_000),
        ];
        assert_eq!(replaced(&moved, &silenced), vec![]);
        assert_eq!(running_on(&moved, "n1", 2_000), ["f-0"]);
        // Not replaced before the fault ended (it came back on n1 after it): a violation.
        let stayed = [
            run("f-0", "n1", "a", 100, 1_950),
            run("f-0", "n1", "b", 14_500, 20_000),
            run("f-0", "n2", "c", 14_100, 14_400),
        ];
        let found = replaced(&stayed, &silenced);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].checker, REPLACED);
        assert!(
            found[0].message.contains("f-0 ran on n1"),
            "{}",
            found[0].message
        );
        // A fault on a node that ran no fenced pod tested nothing: a violation too (a run that
        // ended long before the fault does not count).
        let elsewhere = [
            run("f-0", "n1", "a", 100, 1_000),
            run("f-0", "n2", "b", 1_100, 20_000),
        ];
        let found = replaced(&elsewhere, &silenced);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].message.contains("nothing was tested"),
            "{}",
            found[0].message
        );
    }

    #[test]
    fn two_runs_of_a_fenced_pod_must_never_overlap() {
        let pods = vec!["f-0".to_string(), "f-1".to_string()];
        // Moved from n1 to n2 after n1's run ended, and restarted on n2: fine. A run that ends
        // on the tick the next one starts is not an overlap.
        let fine = [
            run("f-0", "n1", "a", 100, 2_000),
            run("f-0", "n2", "b", 2_000, 5_000),
            run("f-0", "n2", "c", 5_500, 9_000),
            run("f-1", "n3", "d", 100, 9_000),
        ];
        assert_eq!(fenced(&pods, &fine), vec![]);
        // n1's run outlived its node's fence while n2 started the replacement.
        let twice = [
            run("f-0", "n1", "a", 100, 6_000),
            run("f-0", "n2", "b", 5_000, 9_000),
            run("f-1", "n3", "d", 100, 9_000),
            // Another pod's runs overlapping are not this pod's.
            run("f-1-other", "n1", "e", 100, 9_000),
        ];
        let found = fenced(&pods, &twice);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].checker, FENCED);
        assert!(
            found[0].message.contains("1000 ms") && found[0].message.contains("n1"),
            "{}",
            found[0].message
        );
        // Two runs on one node at once are caught too, and a pod without evidence is.
        let same_node = [
            run("f-0", "n1", "a", 100, 6_000),
            run("f-0", "n1", "b", 5_999, 9_000),
        ];
        let found = fenced(&pods, &same_node);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found
                .iter()
                .any(|v| v.message.contains("f-1 left no heartbeat"))
        );
        let mut silent = run("f-1", "n3", "d", 0, 0);
        silent.beats = 0;
        assert_eq!(fenced(&pods[1..], &[silent]).len(), 1);
    }

    #[test]
    fn an_agent_without_the_secret_must_stay_out_and_calls_without_a_token_get_401() {
        assert_eq!(secret(&clean_intrusion()), []);
        let mut joined = clean_intrusion();
        joined.views[0].2.push("x".into());
        joined.intruder_views[0].1.push("n1".into());
        joined.intruder_objects.push("configmaps/reg-1".into());
        joined.unauthenticated[0].2 = 200;
        let v = secret(&joined);
        assert_eq!(v.len(), 4, "{v:?}");
        assert!(v[0].message.contains("n0 listed x"), "{v:?}");
        assert!(v[1].message.contains("listed members"), "{v:?}");
        assert!(v[2].message.contains("reg-1"), "{v:?}");
        assert!(v[3].message.contains("with 200, not 401"), "{v:?}");
        // No evidence is no pass.
        let v = secret(&Intrusion {
            intruder: "x".into(),
            ..Intrusion::default()
        });
        assert_eq!(v.len(), 2, "{v:?}");
    }

    #[test]
    fn a_node_must_never_grant_more_cpu_than_it_has() {
        let granted = |list: &[(&str, u64)]| {
            list.iter()
                .map(|(cgroup, shares)| crate::cpu::Granted {
                    cgroup: (*cgroup).to_owned(),
                    shares: *shares,
                    process: "sleep".to_owned(),
                })
                .collect()
        };
        let sample = |at_ms: u64, node: &str, list: &[(&str, u64)]| CpuSample {
            at_ms,
            node: node.to_owned(),
            allocatable_millis: 2000,
            granted: granted(list),
        };
        // Three 600m containers and three without requests fit 2 cpus (3 × 614 + 3 × 2 shares);
        // 2048 shares exactly is full, not over.
        let fits = [
            sample(
                0,
                "n0",
                &[("poda/c", 614), ("podb/c", 614), ("podc/c", 614)],
            ),
            sample(0, "n1", &[("podd/c", 2), ("pode/c", 2), ("podf/c", 2)]),
            sample(100, "n1", &[("podd/c", 1024), ("pode/c", 1024)]),
        ];
        assert!(overcommit(&fits).is_empty(), "{:?}", overcommit(&fits));
        // A fourth 600m container on n0, in two samples: one violation, naming it.
        let mut over = fits.to_vec();
        over.push(sample(
            200,
            "n0",
            &[
                ("poda/c", 614),
                ("podb/c", 614),
                ("podc/c", 614),
                ("podg/c", 614),
            ],
        ));
        over.push(sample(300, "n0", &[("podg/c", 614), ("podh/c", 2000)]));
        let found = overcommit(&over);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].checker, OVERCOMMIT);
        assert!(
            found[0]
                .message
                .starts_with("n0 ran containers granted 2456 cpu shares")
        );
        assert!(found[0].message.contains("podg/c 614"));
        assert!(found[0].message.contains("(2 samples over)"));
        // Nothing with a request ever ran: no evidence, a violation.
        let idle = [sample(0, "n0", &[("podd/c", 2)])];
        assert_eq!(overcommit(&idle).len(), 1);
        assert_eq!(overcommit(&[]).len(), 1);
    }

    #[test]
    fn leftovers_and_panics_are_violations() {
        assert_eq!(
            teardown(&Leftovers::default(), &[("n0".into(), "fine\n".into())]),
            []
        );
        let left = Leftovers {
            namespaces: vec!["shc1-h0".into()],
            ..Leftovers::default()
        };
        let logs = [(
            "n1".into(),
            "x\nthread 'main' panicked at src/a.rs:1:1:\n".into(),
        )];
        let v = teardown(&left, &logs);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[1].message.contains("n1 panicked"), "{v:?}");
    }
}

/// One read of an agent's Kubernetes API (a LIST of the workload's ConfigMaps).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Read {
    pub node: usize,
    pub invoked_ms: u64,
    pub completed_ms: u64,
    /// Answered 200 (else an error or a timeout at `completed_ms`).
    pub ok: bool,
}

/// A span in which every fsync of `node`'s agent took `delay_ms` longer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlowDisk {
    pub node: usize,
    pub start_ms: u64,
    pub end_ms: u64,
    pub delay_ms: u64,
}

/// Checker 7 (the slow-disk scenario): a read of a node whose disk is slow is answered from
/// memory, never behind a write's fsync: every read begun while the node's disk was slow
/// answered, and in less than one fsync's delay. (A store that fsyncs under the lock its
/// readers take makes them wait a whole delay, or several: the writes queue on that lock.)
pub fn reads_unblocked(reads: &[Read], slow: &[SlowDisk]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for disk in slow {
        let during: Vec<&Read> = reads
            .iter()
            .filter(|r| r.node == disk.node)
            .filter(|r| r.invoked_ms >= disk.start_ms && r.invoked_ms < disk.end_ms)
            .collect();
        let blocked: Vec<&&Read> = during
            .iter()
            .filter(|r| !r.ok || r.completed_ms.saturating_sub(r.invoked_ms) >= disk.delay_ms)
            .collect();
        if let Some(worst) = blocked
            .iter()
            .max_by_key(|r| r.completed_ms.saturating_sub(r.invoked_ms))
        {
            violations.push(Violation {
                checker: READS,
                message: format!(
                    "n{}: {} of {} reads begun while each fsync took {} ms longer ({}-{} ms) waited that long or failed; the worst took {} ms{}",
                    disk.node,
                    blocked.len(),
                    during.len(),
                    disk.delay_ms,
                    disk.start_ms,
                    disk.end_ms,
                    worst.completed_ms.saturating_sub(worst.invoked_ms),
                    if worst.ok { "" } else { " and failed" },
                ),
                ops: Vec::new(),
            });
        } else if during.is_empty() {
            violations.push(Violation {
                checker: READS,
                message: format!(
                    "n{}: no read was made while its disk was slow ({}-{} ms): nothing was checked",
                    disk.node, disk.start_ms, disk.end_ms
                ),
                ops: Vec::new(),
            });
        }
    }
    violations
}

#[cfg(test)]
mod reads_tests {
    use super::*;

    fn read(node: usize, invoked_ms: u64, took: u64, ok: bool) -> Read {
        Read {
            node,
            invoked_ms,
            completed_ms: invoked_ms + took,
            ok,
        }
    }

    const DISK: SlowDisk = SlowDisk {
        node: 1,
        start_ms: 1_000,
        end_ms: 5_000,
        delay_ms: 1_500,
    };

    #[test]
    fn reads_answered_from_memory_pass() {
        let reads = [read(1, 1_200, 12, true), read(1, 4_900, 30, true)];
        assert!(reads_unblocked(&reads, &[DISK]).is_empty());
    }

    #[test]
    fn a_read_that_waited_for_the_disk_fails_the_checker() {
        let reads = [
            read(1, 1_200, 12, true),
            read(1, 2_000, 1_700, true),
            // Another node's slow read, and one before the fault, are not this disk's.
            read(0, 2_000, 3_000, true),
            read(1, 500, 3_000, true),
        ];
        let violations = reads_unblocked(&reads, &[DISK]);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].message.contains("1 of 2 reads"));
        assert!(violations[0].message.contains("1700 ms"));
    }

    #[test]
    fn a_failed_read_or_no_read_fails_the_checker() {
        let failed = [read(1, 1_200, 10, false)];
        assert_eq!(reads_unblocked(&failed, &[DISK]).len(), 1);
        assert_eq!(reads_unblocked(&[], &[DISK]).len(), 1);
    }
}

/// Checker 8 (the poison scenario): each hostile object got what [`crate::poison::Expect`]
/// says: a refusal (4xx) naming its field or cause, or, accepted, pods that all wait with the
/// reason and a message naming the cause. (That every agent stays up and the other workloads
/// keep their counts is checkers 2, 3 and the teardown's.)
pub fn hostile_objects(outcomes: &[crate::poison::Outcome]) -> Vec<Violation> {
    use crate::poison::Expect;
    let mut violations = Vec::new();
    for o in outcomes {
        let answer = format!("{} {}", o.status, o.message);
        let problem = match &o.expect {
            Expect::Accepted => (!(200..300).contains(&o.status))
                .then(|| format!("answered {answer}; expected it accepted")),
            Expect::Refused { names } => (!(400..500).contains(&o.status)
                || !o.message.contains(names))
            .then(|| format!("answered {answer}; expected a refusal (4xx) naming {names:?}")),
            Expect::PodsWait { reason, names } => {
                if !(200..300).contains(&o.status) {
                    Some(format!("answered {answer}; expected it accepted"))
                } else if o.pods.is_empty() {
                    Some("accepted, but no pod of it was seen".to_owned())
                } else {
                    o.pods
                        .iter()
                        .find(|(_, r, m)| r != reason || !m.contains(names))
                        .map(|(node, r, m)| {
                            format!(
                                "its pod on {node} waits with {r:?} ({m:?}); expected {reason:?} naming {names:?}"
                            )
                        })
                }
            }
        };
        if let Some(problem) = problem {
            violations.push(Violation {
                checker: HOSTILE,
                message: format!("{} (sent to n{}): {problem}", o.name, o.node),
                ops: Vec::new(),
            });
        }
    }
    violations
}

#[cfg(test)]
mod hostile_tests {
    use super::*;
    use crate::poison::{Expect, Outcome};

    fn outcome(expect: Expect, status: u16, message: &str, pods: &[(&str, &str)]) -> Outcome {
        Outcome {
            name: "chaos-poison-x-1".into(),
            node: 0,
            expect,
            status,
            message: message.into(),
            pods: pods
                .iter()
                .map(|(r, m)| ("n1".to_owned(), (*r).to_owned(), (*m).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn refusals_and_conditions_naming_the_cause_pass() {
        let ok = [
            outcome(Expect::Accepted, 201, "", &[]),
            outcome(
                Expect::Refused {
                    names: "spec.parallelism",
                },
                422,
                "Job.batch \"x\" is invalid: spec.parallelism: Invalid value",
                &[],
            ),
            outcome(
                Expect::PodsWait {
                    reason: "CreateContainerConfigError",
                    names: "B",
                },
                201,
                "",
                &[(
                    "CreateContainerConfigError",
                    "container \"c\": B expands to more",
                )],
            ),
        ];
        assert!(hostile_objects(&ok).is_empty());
    }

    #[test]
    fn an_accepted_hostile_object_or_a_vague_answer_fails_the_checker() {
        let refused = Expect::Refused {
            names: "spec.parallelism",
        };
        let wait = Expect::PodsWait {
            reason: "CreateContainerConfigError",
            names: "B",
        };
        let bad = [
            outcome(refused.clone(), 201, "", &[]),
            outcome(refused, 500, "internal error", &[]),
            outcome(wait.clone(), 201, "", &[]),
            outcome(wait, 201, "", &[("ContainerCreating", "")]),
            outcome(Expect::Accepted, 0, "connection refused", &[]),
        ];
        assert_eq!(hostile_objects(&bad).len(), 5);
    }
}

//! The Job controller (pure): run pods until `completions` of them succeed (or, with
//! `completionMode: Indexed`, until each index 0..completions has succeeded once), at most
//! `parallelism` at a time; fail the Job when more than `backoffLimit` pods failed or it ran
//! past `activeDeadlineSeconds`; delete it `ttlSecondsAfterFinished` after it finished.
//!
//! **The ledger.** A pod's end is observed state: its node gossips it, and it is gone with the
//! node. So before anything is decided from an ended pod, the owner records it in the Job
//! itself, one annotation per pod (`batch.shoal.io/done-<pod uid>` → result, index, time).
//! Each annotation is a field register of its own in the desired-state CRDT
//! (`crdt-state/src/crdt.rs`), so two owners that recorded different pods on the two sides of a
//! partition both keep theirs after the heal; a pod recorded twice is one key. Counts, the
//! Complete/Failed conditions and their times are computed from the ledger (never stored twice),
//! so a node's death can neither lose a recorded completion nor count one twice, and every agent
//! shows the same status. Finished pods are kept, as Kubernetes keeps them (their logs stay
//! readable with `kubectl logs job/NAME`), until the Job is deleted.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use shoal_model::job::{FailureAction, FailureRule, failure_policy};

use super::replica_set::removal_rank;
use super::workload::{
    Action, Phase, PodView, controller_ref, created_ms, name_suffix, string_map,
};

/// Annotation key prefix of the ledger; the pod's uid follows.
pub const LEDGER_PREFIX: &str = "batch.shoal.io/done-";
/// The index of a pod of an Indexed Job (annotation and label, as in Kubernetes).
pub const INDEX_KEY: &str = "batch.kubernetes.io/job-completion-index";
/// The label every pod of a Job carries (and the Job's default selector).
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";

/// Most pods one reconcile creates or deletes.
const BURST: usize = 500;
/// Kubernetes' pod-failure backoff: 10 s, doubled per failure, at most 6 min.
const BACKOFF_BASE_MS: u64 = 10_000;
const BACKOFF_MAX_MS: u64 = 360_000;

/// How one pod ended, as recorded in the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ended {
    pub result: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// When the owner recorded it, ms since the epoch.
    pub at_ms: u64,
    /// What `spec.podFailurePolicy` made of a failure (decided when it was recorded: the
    /// pod's exit codes are observed state, gone with the pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<FailureAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The first rule a failed pod matches, with Kubernetes' message (containers that exited 0
/// never match an exit-code rule; app containers are looked at before init containers).
pub fn judge_failure(rules: &[FailureRule], pod: &PodView) -> Option<(FailureAction, String)> {
    for (i, rule) in rules.iter().enumerate() {
        if let Some(codes) = &rule.on_exit_codes {
            let matching = [false, true].into_iter().find_map(|init| {
                pod.terminated.iter().find(|(name, code, is_init)| {
                    *is_init == init
                        && *code != 0
                        && codes.container.as_deref().is_none_or(|c| c == name)
                        && codes.values.contains(code) != codes.not_in
                })
            });
            if let Some((name, code, _)) = matching {
                let what = match rule.action {
                    FailureAction::FailJob => "FailJob",
                    FailureAction::Ignore => "Ignore",
                    FailureAction::Count | FailureAction::RestartLimit => "Count",
                };
                return Some((
                    rule.action,
                    format!(
                        "Container {name} for pod {}/{} failed with exit code {code} matching {what} rule at index {i}",
                        pod.namespace, pod.name
                    ),
                ));
            }
        } else if rule
            .on_conditions
            .iter()
            .any(|want| pod.conditions.iter().any(|have| have == want))
        {
            return Some((
                rule.action,
                format!(
                    "Pod {}/{} has condition {} matching {:?} rule at index {i}",
                    pod.namespace,
                    pod.name,
                    rule.on_conditions
                        .iter()
                        .map(|(t, _)| t.as_str())
                        .collect::<Vec<_>>()
                        .join(","),
                    rule.action
                ),
            ));
        }
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Succeeded,
    Failed,
}

/// The ledger of `job`: pod uid → how it ended. Entries that do not parse are ignored (and
/// logged by nobody: an annotation a user broke costs that one record).
pub fn ledger(job: &Value) -> BTreeMap<String, Ended> {
    string_map(&job["metadata"]["annotations"])
        .into_iter()
        .filter_map(|(k, v)| {
            let uid = k.strip_prefix(LEDGER_PREFIX)?.to_owned();
            Some((uid, serde_json::from_str(&v).ok()?))
        })
        .collect()
}

/// The knobs of a Job's spec, with Kubernetes' defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub completions: u64,
    pub parallelism: u64,
    pub backoff_limit: u64,
    pub indexed: bool,
    pub active_deadline_s: Option<u64>,
    pub ttl_after_finished_s: Option<u64>,
    pub suspend: bool,
}

impl Spec {
    pub fn of(job: &Value) -> Self {
        let spec = &job["spec"];
        let number = |field: &str| spec[field].as_u64();
        Self {
            completions: number("completions").unwrap_or(1),
            parallelism: number("parallelism").unwrap_or(1),
            backoff_limit: number("backoffLimit").unwrap_or(6),
            indexed: spec["completionMode"] == "Indexed",
            active_deadline_s: number("activeDeadlineSeconds"),
            ttl_after_finished_s: number("ttlSecondsAfterFinished"),
            suspend: spec["suspend"] == true,
        }
    }
}

/// Why a Job finished, and when (ms since the epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    Complete {
        at_ms: u64,
    },
    Failed {
        at_ms: u64,
        reason: &'static str,
        message: String,
    },
}

impl Finished {
    pub fn at_ms(&self) -> u64 {
        match self {
            Finished::Complete { at_ms } | Finished::Failed { at_ms, .. } => *at_ms,
        }
    }
}

/// What the ledger says so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub succeeded: u64,
    pub failed: u64,
    /// Indexed Jobs: the indexes that succeeded (below `completions`).
    pub succeeded_indexes: BTreeSet<u64>,
    pub finished: Option<Finished>,
    /// Failed pods' latest record, for the backoff.
    pub last_failure_ms: Option<u64>,
}

/// Counts and the verdict from the ledger at `now_ms` (deterministic: the times are the
/// ledger's, the deadline's).
pub fn progress(job: &Value, ledger: &BTreeMap<String, Ended>, now_ms: u64) -> Progress {
    let spec = Spec::of(job);
    let mut successes: Vec<&Ended> = ledger
        .values()
        .filter(|e| e.result == Outcome::Succeeded)
        .collect();
    // Failures a podFailurePolicy rule ignores do not count.
    let mut failures: Vec<u64> = ledger
        .values()
        .filter(|e| e.result == Outcome::Failed && e.action != Some(FailureAction::Ignore))
        .map(|e| e.at_ms)
        .collect();
    let fail_job = ledger
        .values()
        .filter(|e| e.action == Some(FailureAction::FailJob))
        .min_by_key(|e| e.at_ms);
    successes.sort_by_key(|e| (e.at_ms, e.index));
    failures.sort_unstable();
    // When each unit of completion was first reached (Indexed: per index; else per success).
    let mut firsts: BTreeMap<u64, u64> = BTreeMap::new();
    for (i, e) in successes.iter().enumerate() {
        if !spec.indexed {
            firsts.insert(i as u64, e.at_ms);
        } else if let Some(index) = e.index.filter(|i| *i < spec.completions) {
            firsts.entry(index).or_insert(e.at_ms);
        }
    }
    let succeeded = firsts.len() as u64;
    let complete_at = if spec.completions == 0 {
        Some(created_ms(job))
    } else if succeeded < spec.completions {
        None
    } else if spec.indexed {
        firsts.values().copied().max()
    } else {
        let mut times: Vec<u64> = firsts.values().copied().collect();
        times.sort_unstable();
        times.get(spec.completions as usize - 1).copied()
    };
    let restart_limit_at = ledger
        .values()
        .filter(|e| e.action == Some(FailureAction::RestartLimit))
        .map(|e| e.at_ms)
        .min();
    let backoff_at = usize::try_from(spec.backoff_limit)
        .ok()
        .and_then(|limit| failures.get(limit).copied())
        .into_iter()
        .chain(restart_limit_at)
        .min();
    let deadline_at = spec
        .active_deadline_s
        .and_then(|s| s.checked_mul(1000))
        .and_then(|ms| created_ms(job).checked_add(ms))
        .filter(|at| *at <= now_ms);
    let deadline = |d| {
        (
            d,
            "DeadlineExceeded",
            "Job was active longer than specified deadline".to_owned(),
        )
    };
    let mut failed_at = match (backoff_at, deadline_at) {
        (Some(b), Some(d)) if d < b => Some(deadline(d)),
        (Some(b), _) => Some((
            b,
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit".to_owned(),
        )),
        (None, Some(d)) => Some(deadline(d)),
        (None, None) => None,
    };
    if let Some(e) = fail_job
        && failed_at.as_ref().is_none_or(|(at, ..)| e.at_ms <= *at)
    {
        failed_at = Some((
            e.at_ms,
            "PodFailurePolicy",
            e.message.clone().unwrap_or_default(),
        ));
    }
    let finished = match (complete_at, failed_at) {
        (Some(c), Some((f, ..))) if c <= f => Some(Finished::Complete { at_ms: c }),
        (_, Some((at_ms, reason, message))) => Some(Finished::Failed {
            at_ms,
            reason,
            message,
        }),
        (Some(c), None) => Some(Finished::Complete { at_ms: c }),
        (None, None) => None,
    };
    Progress {
        succeeded,
        failed: failures.len() as u64,
        succeeded_indexes: if spec.indexed {
            firsts.keys().copied().collect()
        } else {
            BTreeSet::new()
        },
        finished,
        last_failure_ms: failures.last().copied(),
    }
}

/// The index a pod of an Indexed Job runs.
fn index_of(pod: &PodView) -> Option<u64> {
    pod.object["metadata"]["annotations"][INDEX_KEY]
        .as_str()?
        .parse()
        .ok()
}

/// The pods `job` controls, from all pods of its namespace.
fn owned<'a>(job: &Value, pods: &'a [PodView]) -> Vec<&'a PodView> {
    let uid = job["metadata"]["uid"].as_str().unwrap_or_default();
    let namespace = job["metadata"]["namespace"].as_str().unwrap_or("default");
    pods.iter()
        .filter(|p| p.namespace == namespace && p.controller_uid.as_deref() == Some(uid))
        .collect()
}

/// What `job` needs done at `now_ms`, given every pod of its namespace. `random` yields the
/// entropy of new pods' names.
pub fn reconcile(
    job: &Value,
    pods: &[PodView],
    now_ms: u64,
    random: &mut dyn FnMut() -> u64,
) -> Vec<Action> {
    let mut actions = Vec::new();
    if !job["metadata"]["deletionTimestamp"].is_null() {
        return actions;
    }
    let spec = Spec::of(job);
    let mut ledger = ledger(job);
    let owned = owned(job, pods);

    // 1. Record every ended pod not yet in the ledger (one write, before anything else is
    //    decided from it).
    let mut record = BTreeMap::new();
    // Validated by the API; a policy a newer peer wrote that does not parse here is none.
    let rules = failure_policy(job).unwrap_or_default();
    for pod in &owned {
        let result = match pod.phase {
            Phase::Succeeded => Outcome::Succeeded,
            Phase::Failed => Outcome::Failed,
            Phase::Pending | Phase::Running => continue,
        };
        if ledger.contains_key(&pod.uid) {
            continue;
        }
        let judged = (result == Outcome::Failed)
            .then(|| judge_failure(&rules, pod))
            .flatten();
        let ended = Ended {
            result,
            index: index_of(pod),
            at_ms: now_ms,
            action: judged.as_ref().map(|(a, _)| *a),
            message: judged.map(|(_, m)| m),
        };
        record.insert(
            format!("{LEDGER_PREFIX}{}", pod.uid),
            serde_json::to_string(&ended).expect("serializes"),
        );
        ledger.insert(pod.uid.clone(), ended);
    }
    // Restarts in place (restartPolicy OnFailure) are failures too: the live pods' restart
    // counts are observed state, so the verdict is recorded before it is acted on.
    if let Some((pod, ended)) = past_restart_limit(job, &spec, &owned, &ledger, now_ms) {
        record.insert(
            format!("{LEDGER_PREFIX}{}", pod.uid),
            serde_json::to_string(&ended).expect("serializes"),
        );
        ledger.insert(pod.uid.clone(), ended);
    }
    if !record.is_empty() {
        actions.push(Action::Annotate {
            kind: "Job",
            namespace: namespace(job).to_owned(),
            name: name(job).to_owned(),
            uid: job["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            annotations: record,
        });
    }

    // Pods still to finish. One the ledger already counts is done whatever its view says: if a
    // node reports it running again (re-run elsewhere after its node died) it goes; one whose
    // status is merely unknown for now (Pending: no node reports it) is left alone.
    let mut active: Vec<&PodView> = Vec::new();
    for pod in owned.iter().filter(|p| p.is_active()) {
        if !ledger.contains_key(&pod.uid) {
            active.push(pod);
        } else if pod.phase == Phase::Running {
            actions.push(Action::delete_pod(pod));
        }
    }
    let progress = progress(job, &ledger, now_ms);

    // 2. Finished: nothing runs any more; after the TTL the Job and its pods go.
    if let Some(finished) = &progress.finished {
        for pod in &active {
            actions.push(Action::delete_pod(pod));
        }
        let expires_at = spec
            .ttl_after_finished_s
            .and_then(|s| s.checked_mul(1000))
            .and_then(|ttl| finished.at_ms().checked_add(ttl));
        let expired = expires_at.is_some_and(|at| at <= now_ms);
        if let Some(at_ms) = expires_at.filter(|_| !expired) {
            actions.push(Action::Requeue { at_ms });
        }
        if expired {
            for pod in owned.iter().filter(|p| !p.is_active()) {
                actions.push(Action::delete_pod(pod));
            }
            actions.push(Action::Delete {
                kind: "Job",
                namespace: namespace(job).to_owned(),
                name: name(job).to_owned(),
                uid: job["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            });
        }
        return actions;
    }
    if spec.suspend {
        for pod in &active {
            actions.push(Action::delete_pod(pod));
        }
        return actions;
    }

    // Past activeDeadlineSeconds it fails: be back then.
    if let Some(at_ms) = spec
        .active_deadline_s
        .and_then(|s| s.checked_mul(1000))
        .and_then(|ms| created_ms(job).checked_add(ms))
    {
        actions.push(Action::Requeue { at_ms });
    }

    // 3. Keep the right pods running.
    active.sort_by(|a, b| removal_rank(a).cmp(&removal_rank(b)));
    let parallelism = spec.parallelism as usize;
    let mut create: Vec<Option<u64>> = Vec::new();
    if spec.indexed {
        // One live pod per pending index; duplicates and done indexes go (the most removable
        // first, so both sides of a healed partition keep the same one).
        let mut running: BTreeMap<u64, Vec<&PodView>> = BTreeMap::new();
        for pod in &active {
            match index_of(pod) {
                Some(i) if i < spec.completions && !progress.succeeded_indexes.contains(&i) => {
                    running.entry(i).or_default().push(pod)
                }
                _ => actions.push(Action::delete_pod(pod)),
            }
        }
        let mut kept = 0usize;
        for pods in running.values() {
            for pod in &pods[..pods.len() - 1] {
                actions.push(Action::delete_pod(pod));
            }
            kept += 1;
        }
        // Surplus over parallelism: the highest indexes stop first.
        for (_, pods) in running.iter().rev().take(kept.saturating_sub(parallelism)) {
            actions.push(Action::delete_pod(pods[pods.len() - 1]));
        }
        let pending = (0..spec.completions)
            .filter(|i| !progress.succeeded_indexes.contains(i) && !running.contains_key(i));
        for i in pending.take(parallelism.saturating_sub(kept).min(BURST)) {
            create.push(Some(i));
        }
    } else {
        let remaining = spec.completions.saturating_sub(progress.succeeded) as usize;
        let want = parallelism.min(remaining);
        if active.len() > want {
            for pod in active.iter().take(active.len() - want) {
                actions.push(Action::delete_pod(pod));
            }
        }
        // At most a burst per pass: allocate for what this pass does, never for what the
        // spec asks (a failed allocation aborts the agent, and the next owner after it).
        create.extend(std::iter::repeat_n(
            None,
            want.saturating_sub(active.len()).min(BURST),
        ));
    }
    // Failures slow down replacements (10 s, doubling, at most 6 min), as in Kubernetes.
    if let Some(last) = progress.last_failure_ms {
        let shift = progress.failed.saturating_sub(1).min(16) as u32;
        let delay = BACKOFF_BASE_MS
            .saturating_mul(1 << shift)
            .min(BACKOFF_MAX_MS);
        if now_ms < last.saturating_add(delay) && !create.is_empty() {
            create.clear();
            actions.push(Action::Requeue {
                at_ms: last.saturating_add(delay),
            });
        }
    }
    for index in create {
        actions.push(Action::Create(new_pod(job, index, &name_suffix(random()))));
    }
    actions
}

/// Whether the containers of `job`'s active pods, restarted in place under `restartPolicy:
/// OnFailure`, reached `backoffLimit` restarts in all (any restart with a limit of 0), as
/// Kubernetes' `pastBackoffLimitOnFailure` counts them; if so, the ledger entry that fails the
/// Job, for the pod that restarted most.
fn past_restart_limit<'a>(
    job: &Value,
    spec: &Spec,
    owned: &[&'a PodView],
    ledger: &BTreeMap<String, Ended>,
    now_ms: u64,
) -> Option<(&'a PodView, Ended)> {
    if job["spec"]["template"]["spec"]["restartPolicy"] != "OnFailure" {
        return None;
    }
    let active = owned
        .iter()
        .copied()
        .filter(|p| p.is_active() && !ledger.contains_key(&p.uid));
    let restarts = active
        .clone()
        .fold(0u64, |n, p| n.saturating_add(p.restarts));
    let past = match spec.backoff_limit {
        0 => restarts > 0,
        limit => restarts >= limit,
    };
    if !past {
        return None;
    }
    let pod = active.max_by(|a, b| a.restarts.cmp(&b.restarts).then(b.uid.cmp(&a.uid)))?;
    Some((
        pod,
        Ended {
            result: Outcome::Failed,
            index: index_of(pod),
            at_ms: now_ms,
            action: Some(FailureAction::RestartLimit),
            message: Some(format!(
                "{restarts} container restarts in the Job's pods reached backoffLimit {}",
                spec.backoff_limit
            )),
        },
    ))
}

fn namespace(job: &Value) -> &str {
    job["metadata"]["namespace"].as_str().unwrap_or("default")
}

fn name(job: &Value) -> &str {
    job["metadata"]["name"].as_str().unwrap_or_default()
}

/// A new pod of `job`: `<job>-<suffix>` (Indexed: `<job>-<index>-<suffix>`, with the index in
/// an annotation, a label and `JOB_COMPLETION_INDEX`), labelled with the Job's name and uid.
pub fn new_pod(job: &Value, index: Option<u64>, suffix: &str) -> Value {
    let template = &job["spec"]["template"];
    let name = name(job);
    let uid = job["metadata"]["uid"].as_str().unwrap_or_default();
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels[JOB_NAME_LABEL] = json!(name);
    labels[CONTROLLER_UID_LABEL] = json!(uid);
    labels["job-name"] = json!(name);
    labels["controller-uid"] = json!(uid);
    let mut annotations = template["metadata"]["annotations"].clone();
    if !annotations.is_object() {
        annotations = json!({});
    }
    let mut spec = template["spec"].clone();
    let pod_name = match index {
        Some(i) => {
            labels[INDEX_KEY] = json!(i.to_string());
            annotations[INDEX_KEY] = json!(i.to_string());
            for field in ["containers", "initContainers"] {
                for c in spec[field].as_array_mut().into_iter().flatten() {
                    let env = json!({"name": "JOB_COMPLETION_INDEX", "value": i.to_string()});
                    match c["env"].as_array_mut() {
                        Some(list) => list.push(env),
                        None => c["env"] = json!([env]),
                    }
                }
            }
            format!("{name}-{i}-{suffix}")
        }
        None => format!("{name}-{suffix}"),
    };
    shoal_model::validation::default_pod(&mut spec);
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "generateName": format!("{name}-"),
            "namespace": namespace(job),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [controller_ref(job)],
        },
        "spec": spec,
    })
}

/// The observed status of `job` at `now_ms`: counts and conditions from its ledger, running
/// pods from what their nodes report.
pub fn status(job: &Value, pods: &[PodView], now_ms: u64) -> Value {
    let spec = Spec::of(job);
    let ledger = ledger(job);
    let progress = progress(job, &ledger, now_ms);
    let active: Vec<&PodView> = owned(job, pods)
        .into_iter()
        .filter(|p| p.is_active() && !ledger.contains_key(&p.uid))
        .collect();
    let time = rfc3339;
    let condition = |kind: &str, reason: &str, message: &str, at: u64| {
        json!({"type": kind, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": time(at), "lastTransitionTime": time(at)})
    };
    let mut status = json!({
        "active": if progress.finished.is_some() { 0 } else { active.len() },
        "ready": active.iter().filter(|p| p.ready).count(),
        "succeeded": progress.succeeded,
        "failed": progress.failed,
        "terminating": 0,
        "startTime": time(created_ms(job)),
        "uncountedTerminatedPods": {},
    });
    if spec.indexed {
        status["completedIndexes"] = json!(ranges(&progress.succeeded_indexes));
    }
    let mut conditions = Vec::new();
    match &progress.finished {
        Some(Finished::Complete { at_ms }) => {
            conditions.push(condition(
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                *at_ms,
            ));
            conditions.push(condition(
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                *at_ms,
            ));
            status["completionTime"] = json!(time(*at_ms));
        }
        Some(Finished::Failed {
            at_ms,
            reason,
            message,
        }) => {
            conditions.push(condition("FailureTarget", reason, message, *at_ms));
            conditions.push(condition("Failed", reason, message, *at_ms));
        }
        None if spec.suspend => conditions.push(condition(
            "Suspended",
            "JobSuspended",
            "Job suspended",
            now_ms,
        )),
        None => {}
    }
    if !conditions.is_empty() {
        status["conditions"] = json!(conditions);
    }
    status
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .to_string()
}

/// `0-2,4` for {0, 1, 2, 4} (Kubernetes' `completedIndexes`).
fn ranges(indexes: &BTreeSet<u64>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = indexes.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::super::workload::testing::{created as creates, deleted};
    use super::*;

    fn deletes(actions: &[Action]) -> Vec<&str> {
        deleted(actions, None)
    }

    const T0: u64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    fn job(spec: Value) -> Value {
        let mut spec_full = json!({
            "template": {"metadata": {"labels": {"app": "batch"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}
        });
        for (k, v) in spec.as_object().unwrap() {
            spec_full[k] = v.clone();
        }
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "pi", "namespace": "default", "uid": "job1",
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": spec_full})
    }

    fn pod(name: &str, phase: &str, index: Option<u64>) -> PodView {
        let mut meta = json!({"name": name, "namespace": "default", "uid": format!("u-{name}"),
            "creationTimestamp": "2026-01-01T00:00:01Z",
            "ownerReferences": [{"uid": "job1", "controller": true}]});
        if let Some(i) = index {
            meta["annotations"] = json!({INDEX_KEY: i.to_string()});
        }
        let object = json!({"metadata": meta, "spec": {"nodeName": "n1"}});
        PodView::new(&object, Some(&json!({"phase": phase})))
    }

    fn counter() -> impl FnMut() -> u64 {
        let mut n = 0;
        move || {
            n += 1;
            n
        }
    }

    /// Applies the ledger writes of `actions` to `job` (what the shell does).
    fn recorded(job: &Value, actions: &[Action]) -> Value {
        let mut job = job.clone();
        for a in actions {
            if let Action::Annotate { annotations, .. } = a {
                for (k, v) in annotations {
                    job["metadata"]["annotations"][k] = json!(v);
                }
            }
        }
        job
    }

    /// Counts past anything the API admits (a stored object may come from a peer that did
    /// not check it) cost one burst of pods per pass: 2^40 once asked for a 16 TiB vector and
    /// aborted every owner in turn, 2^62 for one whose size overflowed (issue #35, item 1).
    #[test]
    fn huge_counts_create_one_burst() {
        for n in [1u64 << 40, 1 << 62, u64::MAX] {
            for mode in ["NonIndexed", "Indexed"] {
                let j = job(json!({"completions": n, "parallelism": n, "completionMode": mode}));
                let a = reconcile(&j, &[], T0, &mut counter());
                assert_eq!(creates(&a).len(), BURST, "{n} {mode}");
            }
        }
    }

    #[test]
    fn runs_parallelism_pods_until_completions_succeed() {
        let j = job(json!({"completions": 3, "parallelism": 2}));
        let a = reconcile(&j, &[], T0, &mut counter());
        let pods = creates(&a);
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0]["metadata"]["labels"][JOB_NAME_LABEL], "pi");
        assert_eq!(pods[0]["metadata"]["labels"]["app"], "batch");
        assert_eq!(pods[0]["metadata"]["ownerReferences"][0]["uid"], "job1");

        // One succeeded: it is recorded, and one more starts (2 running, 1 left after them).
        let world = [pod("a", "Succeeded", None), pod("b", "Running", None)];
        let a = reconcile(&j, &world, T0 + 5_000, &mut counter());
        assert!(matches!(&a[0], Action::Annotate { annotations, .. }
            if annotations.len() == 1 && annotations.contains_key("batch.shoal.io/done-u-a")));
        assert_eq!(creates(&a).len(), 1);
        let j = recorded(&j, &a);
        // Recorded once: the next pass writes nothing new.
        let world = [
            pod("a", "Succeeded", None),
            pod("b", "Running", None),
            pod("c", "Running", None),
        ];
        let a = reconcile(&j, &world, T0 + 6_000, &mut counter());
        assert!(a.is_empty(), "{a:?}");
        let s = status(&j, &world, T0 + 6_000);
        assert_eq!(
            (s["succeeded"].as_u64(), s["active"].as_u64()),
            (Some(1), Some(2))
        );
        assert!(s["conditions"].is_null());

        // Both end: complete, at the time the third success was recorded.
        let world = [
            pod("a", "Succeeded", None),
            pod("b", "Succeeded", None),
            pod("c", "Succeeded", None),
        ];
        let a = reconcile(&j, &world, T0 + 9_000, &mut counter());
        let j = recorded(&j, &a);
        assert!(creates(&a).is_empty());
        let s = status(&j, &world, T0 + 10_000);
        assert_eq!(s["succeeded"], 3);
        assert_eq!(s["active"], 0);
        assert_eq!(s["conditions"][1]["type"], "Complete");
        assert_eq!(s["completionTime"], "2026-01-01T00:00:09.000Z");
        // Nothing more to do; finished pods are kept.
        assert!(reconcile(&j, &world, T0 + 20_000, &mut counter()).is_empty());
    }

    #[test]
    fn a_recorded_completion_survives_the_loss_of_its_pod_and_is_never_counted_twice() {
        let j = job(json!({"completions": 2, "parallelism": 2}));
        let world = [pod("a", "Succeeded", None), pod("b", "Running", None)];
        let j = recorded(&j, &reconcile(&j, &world, T0 + 1_000, &mut counter()));
        // a's status is unknown for a moment (no node reports it): it is neither active nor
        // removed.
        let world = [pod("a", "Pending", None), pod("b", "Running", None)];
        assert!(reconcile(&j, &world, T0 + 1_500, &mut counter()).is_empty());
        // a's node died and the scheduler re-ran it elsewhere: that run goes.
        let world = [pod("a", "Running", None), pod("b", "Running", None)];
        let a = reconcile(&j, &world, T0 + 2_000, &mut counter());
        assert_eq!(deletes(&a), ["a"], "the re-run of a counted pod goes");
        assert!(creates(&a).is_empty(), "b is the one left to run");
        assert_eq!(status(&j, &world, T0 + 2_000)["succeeded"], 1);
        // It succeeds again before it is deleted: still one.
        let world = [pod("a", "Succeeded", None), pod("b", "Running", None)];
        let a = reconcile(&j, &world, T0 + 3_000, &mut counter());
        assert!(!a.iter().any(|a| matches!(a, Action::Annotate { .. })));
        assert_eq!(status(&j, &world, T0 + 3_000)["succeeded"], 1);
    }

    #[test]
    fn ledgers_written_on_both_sides_of_a_partition_merge_to_exact_counts() {
        // Each side's owner recorded the pods it saw; the CRDT keeps both sides' annotations.
        let j = job(json!({"completions": 3, "parallelism": 3}));
        let left = reconcile(
            &j,
            &[pod("a", "Succeeded", None)],
            T0 + 1_000,
            &mut counter(),
        );
        let right = reconcile(
            &j,
            &[pod("a", "Succeeded", None), pod("b", "Succeeded", None)],
            T0 + 1_500,
            &mut counter(),
        );
        let merged = recorded(&recorded(&j, &left), &right);
        let world = [
            pod("a", "Succeeded", None),
            pod("b", "Succeeded", None),
            pod("c", "Running", None),
            pod("d", "Running", None),
        ];
        let s = status(&merged, &world, T0 + 2_000);
        assert_eq!(
            s["succeeded"], 2,
            "a counted once although both sides recorded it"
        );
        // One completion left and two running: the most removable one goes.
        let a = reconcile(&merged, &world, T0 + 2_000, &mut counter());
        assert_eq!(deletes(&a).len(), 1);
        assert!(creates(&a).is_empty());
    }

    #[test]
    fn failures_back_off_and_fail_the_job_past_the_backoff_limit() {
        let j = job(json!({"completions": 1, "parallelism": 1, "backoffLimit": 1}));
        let world = [pod("a", "Failed", None)];
        let a = reconcile(&j, &world, T0 + 1_000, &mut counter());
        assert!(creates(&a).is_empty(), "10 s of backoff first");
        let j = recorded(&j, &a);
        assert!(creates(&reconcile(&j, &world, T0 + 10_999, &mut counter())).is_empty());
        assert_eq!(
            creates(&reconcile(&j, &world, T0 + 11_000, &mut counter())).len(),
            1
        );
        let world = [pod("a", "Failed", None), pod("b", "Failed", None)];
        let a = reconcile(&j, &world, T0 + 15_000, &mut counter());
        let j = recorded(&j, &a);
        let s = status(&j, &world, T0 + 16_000);
        assert_eq!(s["failed"], 2);
        assert_eq!(s["conditions"][1]["type"], "Failed");
        assert_eq!(s["conditions"][1]["reason"], "BackoffLimitExceeded");
        assert!(creates(&reconcile(&j, &world, T0 + 60_000, &mut counter())).is_empty());
    }

    /// Under `restartPolicy: OnFailure` a failing container restarts in place and its pod never
    /// fails: the restarts of the live pods count toward `backoffLimit` (reached at the limit,
    /// as Kubernetes counts them), the verdict is recorded in the ledger, and the Job fails
    /// with BackoffLimitExceeded; its pods stop. Under `Never` restarts count for nothing.
    #[test]
    fn restarts_in_place_count_toward_the_backoff_limit() {
        let mut j = job(json!({"completions": 2, "parallelism": 2, "backoffLimit": 3}));
        j["spec"]["template"]["spec"]["restartPolicy"] = json!("OnFailure");
        let restarting = |name: &str, restarts: u64| {
            let mut p = pod(name, "Running", None);
            p.restarts = restarts;
            p
        };
        let below = [restarting("a", 1), restarting("b", 1)];
        let a = reconcile(&j, &below, T0 + 1_000, &mut counter());
        assert!(a.is_empty(), "2 restarts of 3: nothing to do: {a:?}");
        let world = [restarting("a", 1), restarting("b", 2)];
        let a = reconcile(&j, &world, T0 + 2_000, &mut counter());
        let j2 = recorded(&j, &a);
        let ledger = ledger(&j2);
        assert_eq!(ledger.len(), 1, "{ledger:?}");
        assert_eq!(
            ledger["u-b"].action,
            Some(FailureAction::RestartLimit),
            "recorded on the pod that restarted most"
        );
        let s = status(&j2, &world, T0 + 2_000);
        assert_eq!(s["conditions"][1]["type"], "Failed");
        assert_eq!(s["conditions"][1]["reason"], "BackoffLimitExceeded");
        // Failed: the live pods go, nothing new starts.
        let a = reconcile(&j2, &world, T0 + 3_000, &mut counter());
        let mut gone = deletes(&a);
        gone.sort();
        assert_eq!(gone, ["a", "b"]);
        assert!(creates(&a).is_empty());
        // A limit of 0: the first restart fails the Job.
        let mut zero = j.clone();
        zero["spec"]["backoffLimit"] = json!(0);
        let a = reconcile(&zero, &[restarting("a", 1)], T0, &mut counter());
        assert_eq!(ledger_of(&recorded(&zero, &a)), 1);
        // Never: a pod fails instead of restarting; restart counts are not looked at.
        let never = job(json!({"completions": 2, "parallelism": 2, "backoffLimit": 3}));
        assert!(reconcile(&never, &world, T0 + 2_000, &mut counter()).is_empty());
    }

    fn ledger_of(job: &Value) -> usize {
        ledger(job).len()
    }

    /// A failed pod whose container `c` exited with `code`.
    fn failed_with(name: &str, code: i64) -> PodView {
        let mut p = pod(name, "Failed", None);
        p.terminated = vec![("c".into(), code, false)];
        p
    }

    #[test]
    fn the_pod_failure_policy_fails_the_job_ignores_or_counts_failures_by_exit_code() {
        let j = job(json!({"backoffLimit": 0, "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "c", "operator": "In", "values": [42]}},
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [7]}},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [7, 42]}},
        ]}}));
        // Exit 7 is ignored: with backoffLimit 0 the Job goes on, and a replacement starts
        // (after the backoff of the failures that count: none).
        let world = [failed_with("a", 7)];
        let a = reconcile(&j, &world, T0 + 1_000, &mut counter());
        let j1 = recorded(&j, &a);
        let s = status(&j1, &world, T0 + 1_000);
        assert!(s["conditions"].is_null(), "{s}");
        assert_eq!(s["failed"], 0, "ignored failures are not counted");
        assert_eq!(
            creates(&reconcile(&j1, &world, T0 + 1_000, &mut counter())).len(),
            1
        );
        // Exit 42 fails the Job at once, with Kubernetes' reason and message.
        let world = [failed_with("a", 7), failed_with("b", 42)];
        let j2 = recorded(&j1, &reconcile(&j1, &world, T0 + 2_000, &mut counter()));
        let s = status(&j2, &world, T0 + 2_000);
        assert_eq!(s["conditions"][1]["type"], "Failed");
        assert_eq!(s["conditions"][1]["reason"], "PodFailurePolicy");
        assert_eq!(
            s["conditions"][1]["message"],
            "Container c for pod default/b failed with exit code 42 matching FailJob rule at index 0"
        );
        // Exit 3 matches NotIn [7, 42]: counted, past backoffLimit 0.
        let world = [failed_with("a", 7), failed_with("c", 3)];
        let j3 = recorded(&j1, &reconcile(&j1, &world, T0 + 2_000, &mut counter()));
        let s = status(&j3, &world, T0 + 2_000);
        assert_eq!(s["conditions"][1]["reason"], "BackoffLimitExceeded");
        // The decision is in the ledger: the pod (and its exit code) may be gone since.
        let s = status(&j2, &[], T0 + 5_000);
        assert_eq!(s["conditions"][1]["reason"], "PodFailurePolicy");
    }

    #[test]
    fn pod_failure_policies_are_checked_naming_the_field() {
        let refused = |policy: Value, restart: &str| {
            let mut j = job(json!({"podFailurePolicy": policy}));
            j["spec"]["template"]["spec"]["restartPolicy"] = json!(restart);
            failure_policy(&j).unwrap_err().field
        };
        let rule = |r: Value| json!({"rules": [r]});
        let codes = json!({"operator": "In", "values": [1]});
        assert_eq!(
            refused(
                rule(json!({"action": "FailJob", "onExitCodes": codes})),
                "OnFailure"
            ),
            "spec.template.spec.restartPolicy"
        );
        assert_eq!(
            refused(
                rule(json!({"action": "Explode", "onExitCodes": codes})),
                "Never"
            ),
            "spec.podFailurePolicy.rules[0].action"
        );
        assert_eq!(
            refused(
                rule(json!({"action": "FailIndex", "onExitCodes": codes})),
                "Never"
            ),
            "spec.podFailurePolicy.rules[0].action"
        );
        assert_eq!(
            refused(rule(json!({"action": "Ignore"})), "Never"),
            "spec.podFailurePolicy.rules[0]"
        );
        assert_eq!(
            refused(
                rule(json!({"action": "Ignore", "onExitCodes": {"operator": "In", "values": [0]}})),
                "Never"
            ),
            "spec.podFailurePolicy.rules[0].onExitCodes.values"
        );
        assert_eq!(
            refused(
                rule(
                    json!({"action": "Ignore", "onExitCodes": {"containerName": "x", "operator": "In", "values": [1]}})
                ),
                "Never"
            ),
            "spec.podFailurePolicy.rules[0].onExitCodes.containerName"
        );
        // A condition rule matches the pod's reported conditions.
        let j = job(json!({"podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}}));
        let rules = failure_policy(&j).unwrap();
        let mut p = pod("a", "Failed", None);
        assert_eq!(judge_failure(&rules, &p), None);
        p.conditions
            .push(("DisruptionTarget".into(), "True".into()));
        assert_eq!(
            judge_failure(&rules, &p).map(|(a, _)| a),
            Some(FailureAction::Ignore)
        );
        // A container that exited 0 never matches (NotIn included).
        let j = job(json!({"podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [5]}}]}}));
        let rules = failure_policy(&j).unwrap();
        assert_eq!(judge_failure(&rules, &failed_with("z", 0)), None);
        assert!(judge_failure(&rules, &failed_with("z", 1)).is_some());
    }

    #[test]
    fn the_deadline_stops_a_running_job_and_the_ttl_deletes_a_finished_one() {
        let j = job(json!({"activeDeadlineSeconds": 30, "ttlSecondsAfterFinished": 60}));
        let world = [pod("a", "Running", None)];
        // Before the deadline nothing is written, and the reconcile asks to be back at it.
        assert_eq!(
            reconcile(&j, &world, T0 + 29_999, &mut counter()),
            [Action::Requeue { at_ms: T0 + 30_000 }]
        );
        let a = reconcile(&j, &world, T0 + 30_000, &mut counter());
        assert_eq!(deletes(&a), ["a"]);
        let s = status(&j, &world, T0 + 30_000);
        assert_eq!(s["conditions"][1]["reason"], "DeadlineExceeded");
        assert_eq!(s["active"], 0);
        // Finished: back when the TTL runs out, and then it goes.
        assert_eq!(
            reconcile(&j, &[], T0 + 89_999, &mut counter()),
            [Action::Requeue { at_ms: T0 + 90_000 }]
        );
        let a = reconcile(&j, &[], T0 + 90_000, &mut counter());
        assert_eq!(deletes(&a), ["pi"], "TTL after the failure at 30 s");
    }

    #[test]
    fn indexed_jobs_run_each_index_once() {
        let j = job(json!({"completions": 4, "parallelism": 2, "completionMode": "Indexed"}));
        let a = reconcile(&j, &[], T0, &mut counter());
        let pods = creates(&a);
        let indexes: Vec<&Value> = pods
            .iter()
            .map(|p| &p["metadata"]["annotations"][INDEX_KEY])
            .collect();
        assert_eq!(indexes, ["0", "1"]);
        assert_eq!(
            pods[1]["spec"]["containers"][0]["env"][0],
            json!({"name": "JOB_COMPLETION_INDEX", "value": "1"})
        );
        assert!(
            pods[1]["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("pi-1-")
        );
        // Index 0 done twice (a partition), 1 running twice: 0 counts once, one 1 goes, 2 starts.
        let world = [
            pod("a", "Succeeded", Some(0)),
            pod("b", "Succeeded", Some(0)),
            pod("c", "Running", Some(1)),
            pod("d", "Running", Some(1)),
        ];
        let a = reconcile(&j, &world, T0 + 1_000, &mut counter());
        assert_eq!(deletes(&a).len(), 1);
        let started: Vec<&Value> = creates(&a)
            .iter()
            .map(|p| &p["metadata"]["annotations"][INDEX_KEY])
            .collect();
        assert_eq!(started, ["2"]);
        let j = recorded(&j, &a);
        let s = status(&j, &world, T0 + 1_000);
        assert_eq!(s["succeeded"], 1);
        assert_eq!(s["completedIndexes"], "0");
        assert_eq!(ranges(&[0, 1, 2, 4, 6, 7].into()), "0-2,4,6-7");
    }

    #[test]
    fn a_suspended_job_runs_nothing() {
        let j = job(json!({"suspend": true}));
        let a = reconcile(&j, &[pod("a", "Running", None)], T0, &mut counter());
        assert_eq!(deletes(&a), ["a"]);
        assert!(creates(&a).is_empty());
        assert_eq!(status(&j, &[], T0)["conditions"][0]["type"], "Suspended");
    }
}

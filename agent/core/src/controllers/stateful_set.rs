//! The StatefulSet controller (pure; issue #39): pods with stable identities `NAME-k`, created,
//! replaced, updated and removed in the order Kubernetes' controller keeps
//! (`stateful_set_control.go`), each reconcile reading the pods as their nodes report them.
//!
//! - **Identity.** Pod `NAME-k` for each ordinal `k` in `[start, start + replicas)`
//!   (`spec.ordinals.start`), with `hostname: NAME-k` and `subdomain: serviceName` (so the
//!   governing headless Service's DNS answers `NAME-k.SERVICE.NS.svc.<domain>`), the labels
//!   `statefulset.kubernetes.io/pod-name`, `apps.kubernetes.io/pod-index` and
//!   `controller-revision-hash`, and the `fenced` partition policy: at most one pod per identity
//!   runs at any moment, whatever fails — a pod whose node is dead or cut off is replaced only
//!   once that node has stopped it (`crate::placement::partition`), the guarantee Kubernetes
//!   gives by never deleting the pods of an unreachable node.
//! - **`podManagementPolicy`.** `OrderedReady` (the default): ordinal `k` is created only once
//!   every lower one is Running and Ready (and available for `minReadySeconds`), and the highest
//!   surplus ordinal goes first, one at a time, only while every other pod is healthy.
//!   `Parallel`: all at once, both ways.
//! - **Revisions.** Each template is a ControllerRevision (`NAME-<hash>`, its `data` the
//!   strategic merge patch kubectl's `rollout undo` applies, `revision` numbered from 1). The
//!   StatefulSet's *update revision* is its template's; its *current revision* (annotation
//!   [`CURRENT_REVISION`], shown as `status.currentRevision`) moves to the update revision once
//!   every pod runs it and is ready. A template equal to an older revision (an undo) renumbers
//!   that revision rather than making another; revisions beyond `revisionHistoryLimit` that no
//!   pod uses are deleted, oldest first.
//! - **`updateStrategy`.** `RollingUpdate`: once every ordinal has a pod, outdated pods at or
//!   above `partition` are deleted from the highest ordinal down, at most `maxUnavailable` (1)
//!   unavailable at a time (each is recreated from the update revision, and a pod below the
//!   partition that goes is recreated from the current one). `OnDelete`: pods are replaced
//!   only when deleted, from the update revision.
//!
//! `volumeClaimTemplates` give each pod a `persistentVolumeClaim` volume named
//! `CLAIM-NAME-k`, as upstream; the claims themselves are not made yet (issue #39's storage
//! part), so such pods wait with the kubelet's reason.

use std::collections::{BTreeMap, HashSet};

use serde_json::{Value, json};

use super::replica_set::BURST;
use super::workload::{
    Action, Phase, PodView, controller_ref, min_ready_ms, replicas, requeue_for_availability,
    template_hash,
};

/// The pod label naming the ControllerRevision a pod was made from (as the DaemonSet's).
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// The pod labels upstream's controller sets.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// The StatefulSet annotation holding its current revision (`status.currentRevision`): the
/// revision every pod ran when the last update completed.
pub const CURRENT_REVISION: &str = "shoal.io/current-revision";

/// `spec.ordinals.start` (0 by default).
fn start(sts: &Value) -> u64 {
    sts["spec"]["ordinals"]["start"].as_u64().unwrap_or(0)
}

fn name(sts: &Value) -> &str {
    sts["metadata"]["name"].as_str().unwrap_or_default()
}

/// The ordinal of pod `pod` of StatefulSet `set` (`set-k`, `k` written without leading zeros).
pub fn ordinal(set: &str, pod: &str) -> Option<u64> {
    let digits = pod.strip_prefix(set)?.strip_prefix('-')?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

/// The name of the revision `template` is for `sts`.
pub fn revision_name(sts: &Value, template: &Value) -> String {
    format!("{}-{}", name(sts), template_hash(template))
}

/// One ControllerRevision of a StatefulSet, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Revision {
    pub name: String,
    pub uid: String,
    pub number: i64,
    /// The pod template it records.
    pub template: Value,
}

/// The revisions among `objects` (ControllerRevisions of the namespace) that `sts` controls.
pub fn revisions_of(sts: &Value, objects: &[Value]) -> Vec<Revision> {
    let uid = sts["metadata"]["uid"].as_str().unwrap_or_default();
    let mut revisions: Vec<Revision> = objects
        .iter()
        .filter(|r| super::workload::controller_of(r).as_deref() == Some(uid))
        .map(|r| {
            let mut template = r["data"]["spec"]["template"].clone();
            if let Some(t) = template.as_object_mut() {
                t.remove("$patch");
            }
            Revision {
                name: r["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                uid: r["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                number: r["revision"].as_i64().unwrap_or(0),
                template,
            }
        })
        .collect();
    revisions.sort_by(|a, b| (a.number, &a.name).cmp(&(b.number, &b.name)));
    revisions
}

/// The ControllerRevision recording `template` for `sts` as revision `number`: its data is the
/// patch `kubectl rollout undo` applies (the template replacing the StatefulSet's whole).
pub fn new_revision(sts: &Value, template: &Value, number: i64) -> Value {
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["controller.kubernetes.io/hash"] = json!(template_hash(template));
    let mut data_template = template.clone();
    data_template["$patch"] = json!("replace");
    json!({
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": revision_name(sts, template),
            "namespace": sts["metadata"]["namespace"].as_str().unwrap_or("default"),
            "labels": labels,
            "ownerReferences": [controller_ref(sts)],
        },
        "data": {"spec": {"template": data_template}},
        "revision": number,
    })
}

/// The claims ordinal `k` of `sts` needs (`CLAIM-NAME-k`), from its claim templates: labelled
/// with the set's selector, and owned by it when `whenDeleted: Delete` (so they go with it).
pub fn claims_for(sts: &Value, k: u64) -> Vec<Value> {
    let set = name(sts);
    let labels = sts["spec"]["selector"]["matchLabels"].clone();
    let owned = sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete";
    sts["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|template| {
            let claim_name = template["metadata"]["name"].as_str()?;
            let mut metadata = json!({
                "name": format!("{claim_name}-{set}-{k}"),
                "namespace": sts["metadata"]["namespace"].as_str().unwrap_or("default"),
            });
            if owned {
                let mut reference = controller_ref(sts);
                reference["controller"] = json!(false);
                metadata["ownerReferences"] = json!([reference]);
            }
            Some(shoal_model::storage::claim_from_template(
                template, metadata, &labels,
            ))
        })
        .collect()
}

/// The ordinal a claim named `CLAIM-NAME-k` of `sts` is for, if it is one of its templates'.
fn claim_ordinal(sts: &Value, claim: &str) -> Option<u64> {
    let set = name(sts);
    sts["spec"]["volumeClaimTemplates"]
        .as_array()?
        .iter()
        .filter_map(|t| t["metadata"]["name"].as_str())
        .find_map(|template| ordinal(&format!("{template}-{set}"), claim))
}

/// The update strategy, read once.
struct Strategy {
    rolling: bool,
    partition: u64,
    max_unavailable: u64,
}

fn strategy(sts: &Value) -> Strategy {
    let s = &sts["spec"]["updateStrategy"];
    let rolling = s["type"].as_str().unwrap_or("RollingUpdate") == "RollingUpdate";
    let r = &s["rollingUpdate"];
    let replicas = replicas(sts);
    let max_unavailable = match &r["maxUnavailable"] {
        Value::Number(n) => n.as_u64().unwrap_or(1),
        Value::String(p) => p
            .strip_suffix('%')
            .and_then(|p| p.parse::<u64>().ok())
            // A percentage of replicas, rounded down, as upstream.
            .map_or(1, |p| replicas.saturating_mul(p) / 100),
        _ => 1,
    }
    .max(1);
    Strategy {
        rolling,
        partition: r["partition"].as_u64().unwrap_or(0),
        max_unavailable,
    }
}

/// The pod of `sts` with ordinal `k`, made from `template` (revision `revision`).
pub fn new_pod(sts: &Value, template: &Value, revision: &str, k: u64) -> Value {
    let set = name(sts);
    let pod_name = format!("{set}-{k}");
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels[REVISION_LABEL] = json!(revision);
    labels[POD_NAME_LABEL] = json!(pod_name);
    labels[POD_INDEX_LABEL] = json!(k.to_string());
    let mut annotations = template["metadata"]["annotations"].clone();
    if !annotations.is_object() {
        annotations = json!({});
    }
    annotations[crate::placement::partition::ANNOTATION] = json!("fenced");
    let mut spec = template["spec"].clone();
    if spec.is_object() {
        spec["hostname"] = json!(pod_name);
        if let Some(service) = sts["spec"]["serviceName"]
            .as_str()
            .filter(|s| !s.is_empty())
        {
            spec["subdomain"] = json!(service);
        }
        // Each claim template is a volume of its own claim, `CLAIM-NAME-k`.
        for claim in sts["spec"]["volumeClaimTemplates"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let Some(claim_name) = claim["metadata"]["name"].as_str() else {
                continue;
            };
            let volume = json!({"name": claim_name,
                "persistentVolumeClaim": {"claimName": format!("{claim_name}-{pod_name}")}});
            let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
            let mut volumes: Vec<Value> = volumes
                .into_iter()
                .filter(|v| v["name"].as_str() != Some(claim_name))
                .collect();
            volumes.push(volume);
            spec["volumes"] = Value::Array(volumes);
        }
        shoal_model::validation::default_pod(&mut spec);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": sts["metadata"]["namespace"].as_str().unwrap_or("default"),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [controller_ref(sts)],
        },
        "spec": spec,
    })
}

/// Running and Ready (and, with `min_ready_ms`, available at `now_ms`), not being deleted.
fn healthy(pod: &PodView, min_ready_ms: u64, now_ms: u64) -> bool {
    !pod.deleting && pod.phase == Phase::Running && pod.is_available(min_ready_ms, now_ms)
}

fn ended(pod: &PodView) -> bool {
    matches!(pod.phase, Phase::Succeeded | Phase::Failed)
}

fn revision_of(pod: &PodView) -> Option<&str> {
    pod.labels.get(REVISION_LABEL).map(String::as_str)
}

/// What `sts` reads: its update and current revisions, and its pods by ordinal.
struct View<'a> {
    update: String,
    current: String,
    current_template: Value,
    /// The pods `sts` controls (selected by it), by ordinal; those without one are surplus.
    pods: BTreeMap<u64, &'a PodView>,
    unnamed: Vec<&'a PodView>,
}

fn view<'a>(sts: &Value, mine: &[&'a PodView], revisions: &[Revision]) -> View<'a> {
    let template = &sts["spec"]["template"];
    let update = revision_name(sts, template);
    let current = sts["metadata"]["annotations"][CURRENT_REVISION]
        .as_str()
        .filter(|c| *c == update || revisions.iter().any(|r| r.name == *c))
        .unwrap_or(&update)
        .to_owned();
    let current_template = revisions
        .iter()
        .find(|r| r.name == current)
        .map_or_else(|| template.clone(), |r| r.template.clone());
    let mut pods = BTreeMap::new();
    let mut unnamed = Vec::new();
    for pod in mine {
        match ordinal(name(sts), &pod.name) {
            Some(k) => {
                pods.insert(k, *pod);
            }
            None => unnamed.push(*pod),
        }
    }
    View {
        update,
        current,
        current_template,
        pods,
        unnamed,
    }
}

/// What `sts` needs done, given the pods it may own (those it controls and its namespace's
/// orphans; others are ignored) and its namespace's ControllerRevisions, at `now_ms`.
pub fn reconcile<'a>(
    sts: &Value,
    pods: impl IntoIterator<Item = &'a PodView>,
    revision_objects: &[Value],
    claims: &[(&str, &str)],
    now_ms: u64,
) -> Vec<Action> {
    let mut actions = Vec::new();
    if !sts["metadata"]["deletionTimestamp"].is_null() {
        return actions;
    }
    let uid = sts["metadata"]["uid"].as_str().unwrap_or_default();
    let namespace = sts["metadata"]["namespace"].as_str().unwrap_or("default");
    let set = name(sts);
    // Only an orphan of this set's naming is adopted.
    let mine = super::workload::claim_pods(
        sts,
        pods,
        &|pod| ordinal(set, &pod.name).is_some(),
        &mut actions,
    );
    let revisions = revisions_of(sts, revision_objects);
    let v = view(sts, &mine, &revisions);
    let used: Vec<&str> = mine
        .iter()
        .filter_map(|p| revision_of(p))
        .chain([v.update.as_str(), v.current.as_str()])
        .collect();
    actions.extend(history(sts, &revisions, &used));

    let strategy = strategy(sts);
    let first = start(sts);
    let end = first.saturating_add(replicas(sts));
    let parallel = sts["spec"]["podManagementPolicy"] == "Parallel";
    let min_ready = min_ready_ms(sts);
    let template = &sts["spec"]["template"];
    let ok = |p: &PodView| healthy(p, min_ready, now_ms);
    // A new pod for ordinal k: below the partition of a rolling update, from the current
    // revision; otherwise from the update revision.
    let make = |k: u64| {
        if strategy.rolling && k < strategy.partition {
            new_pod(sts, &v.current_template, &v.current, k)
        } else {
            new_pod(sts, template, &v.update, k)
        }
    };

    // Claims of ordinals scaled away go with `whenScaled: Delete` once their pod has.
    if sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Delete" {
        for (name, claim_uid) in claims {
            let Some(k) = claim_ordinal(sts, name) else {
                continue;
            };
            if (k < first || k >= end) && !v.pods.contains_key(&k) {
                actions.push(Action::Delete {
                    kind: "PersistentVolumeClaim",
                    namespace: namespace.to_owned(),
                    name: (*name).to_owned(),
                    uid: (*claim_uid).to_owned(),
                });
            }
        }
    }
    // Pods that cannot be one of the set's identities go.
    for pod in v.unnamed.iter().filter(|p| !p.deleting) {
        actions.push(Action::delete_pod(pod));
    }
    // Each ordinal in range: its claims made where missing (before its pod, which waits for
    // them), its pod made if missing, replaced if ended; in order, each waiting for the one
    // before it to be healthy (OrderedReady). At most [`BURST`] objects are made a pass: the
    // work is that of the pods there are, not of the replicas asked for.
    let existing: HashSet<&str> = claims.iter().map(|(n, _)| *n).collect();
    let mut made = 0usize;
    let mut blocked = false;
    for k in first..end {
        if made >= BURST {
            break;
        }
        let mut claims_missing = false;
        for claim in claims_for(sts, k) {
            if !existing.contains(claim["metadata"]["name"].as_str().unwrap_or_default()) {
                actions.push(Action::Create(claim));
                made += 1;
                claims_missing = true;
            }
        }
        match v.pods.get(&k) {
            // Its claims first: the pod comes in the next pass, once they are stored (a pod
            // whose claim is not there yet would be judged unschedulable, and wait for the
            // auction's retry).
            None if claims_missing => {
                if !parallel {
                    blocked = true;
                    break;
                }
            }
            None => {
                actions.push(Action::Create(make(k)));
                made += 1;
                if !parallel {
                    blocked = true;
                    break;
                }
            }
            Some(pod) if ended(pod) && !pod.deleting => {
                // Deleted, then made again once it is gone.
                actions.push(Action::delete_pod(pod));
                if !parallel {
                    blocked = true;
                    break;
                }
            }
            Some(pod) if !parallel && !ok(pod) => {
                blocked = true;
                break;
            }
            Some(_) => {}
        }
    }
    // Surplus ordinals go, highest first; OrderedReady: one at a time, and only while every
    // other pod is healthy.
    let condemned: Vec<&PodView> = v
        .pods
        .iter()
        .rev()
        .filter(|(k, _)| **k < first || **k >= end)
        .map(|(_, p)| *p)
        .collect();
    if !blocked {
        for pod in &condemned {
            if pod.deleting {
                if !parallel {
                    blocked = true;
                    break;
                }
                continue;
            }
            if !parallel
                && mine
                    .iter()
                    .any(|p| p.uid != pod.uid && !p.deleting && !ok(p) && !ended(p))
            {
                blocked = true;
                break;
            }
            actions.push(Action::delete_pod(pod));
            if !parallel {
                blocked = true;
                break;
            }
        }
    }
    // A rolling update, once every ordinal has its pod: outdated pods at or above the
    // partition go from the highest ordinal down, at most `maxUnavailable` unavailable at once.
    let complete = v.pods.range(first..end).count() as u64 == end - first;
    if strategy.rolling && !blocked && complete {
        let floor = strategy.partition.max(first);
        let mut unavailable = 0u64;
        for (_, pod) in v.pods.range(floor..end).rev() {
            let pod = *pod;
            if revision_of(pod) != Some(v.update.as_str()) && !pod.deleting {
                if unavailable >= strategy.max_unavailable {
                    break;
                }
                actions.push(Action::delete_pod(pod));
                unavailable += 1;
            } else if !ok(pod) {
                unavailable += 1;
            }
            if unavailable >= strategy.max_unavailable {
                break;
            }
        }
    }
    // Every pod at the update revision and healthy: the update is complete.
    let done = complete
        && v.current != v.update
        && v.pods
            .range(first..end)
            .all(|(_, pod)| revision_of(pod) == Some(v.update.as_str()) && ok(pod));
    if done || sts["metadata"]["annotations"][CURRENT_REVISION].is_null() {
        let current = if done { &v.update } else { &v.current };
        actions.push(Action::Annotate {
            kind: "StatefulSet",
            namespace: namespace.to_owned(),
            name: set.to_owned(),
            uid: uid.to_owned(),
            annotations: BTreeMap::from([(CURRENT_REVISION.to_owned(), current.clone())]),
        });
    }
    actions.extend(requeue_for_availability(
        mine.iter().copied().filter(|p| !p.deleting),
        min_ready,
        now_ms,
    ));
    actions
}

/// The revision writes: the update revision made (or renumbered last, when the template went
/// back to an older one), and the history beyond `revisionHistoryLimit` that nothing uses
/// deleted, oldest first.
/// A workload's template history (a StatefulSet's or a DaemonSet's ControllerRevisions,
/// `revisions`, oldest first): its current template's revision made, or renumbered as the
/// newest when the template went back to an older one (an undo); revisions beyond
/// `revisionHistoryLimit` that none of `used` names deleted, oldest first.
pub fn history(owner: &Value, revisions: &[Revision], used: &[&str]) -> Vec<Action> {
    let mut actions = Vec::new();
    let template = &owner["spec"]["template"];
    let update = revision_name(owner, template);
    let last = revisions.iter().map(|r| r.number).max().unwrap_or(0);
    let sts = owner;
    match revisions.iter().find(|r| r.name == update) {
        None => actions.push(Action::Create(new_revision(sts, template, last + 1))),
        Some(r) if r.number < last => actions.push(Action::Renumber {
            namespace: sts["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned(),
            name: r.name.clone(),
            uid: r.uid.clone(),
            revision: last + 1,
        }),
        Some(_) => {}
    }
    let limit = sts["spec"]["revisionHistoryLimit"].as_u64().unwrap_or(10);
    let used: HashSet<&str> = used.iter().copied().chain([update.as_str()]).collect();
    let unused: Vec<&Revision> = revisions
        .iter()
        .filter(|r| !used.contains(r.name.as_str()))
        .collect();
    let surplus = unused.len().saturating_sub(limit as usize);
    for r in unused.into_iter().take(surplus) {
        actions.push(Action::Delete {
            kind: "ControllerRevision",
            namespace: sts["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        });
    }
    actions
}

/// The observed status of `sts` at `now_ms`: its pods counted as their nodes report them, and
/// its revisions.
pub fn status(sts: &Value, pods: &[PodView], revision_objects: &[Value], now_ms: u64) -> Value {
    let uid = sts["metadata"]["uid"].as_str().unwrap_or_default();
    let mine: Vec<&PodView> = pods
        .iter()
        .filter(|p| p.controller_uid.as_deref() == Some(uid) && !p.deleting && !ended(p))
        .collect();
    let revisions = revisions_of(sts, revision_objects);
    let v = view(sts, &mine, &revisions);
    let min_ready = min_ready_ms(sts);
    let count = |f: &dyn Fn(&PodView) -> bool| mine.iter().filter(|p| f(p)).count();
    let ready = count(&|p| p.ready && p.phase == Phase::Running);
    let available = count(&|p| p.phase == Phase::Running && p.is_available(min_ready, now_ms));
    let current = count(&|p| revision_of(p) == Some(v.current.as_str()));
    let updated = count(&|p| revision_of(p) == Some(v.update.as_str()));
    json!({
        "observedGeneration": sts["metadata"]["generation"],
        "replicas": mine.len(),
        "readyReplicas": ready,
        "currentReplicas": current,
        "updatedReplicas": updated,
        "availableReplicas": available,
        "currentRevision": v.current,
        "updateRevision": v.update,
        "collisionCount": 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::workload::testing::{created, deleted};

    const T0: u64 = 1_800_000_000_000;

    fn sts(replicas: u64, extra: Value) -> Value {
        let mut s = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "web", "namespace": "default", "uid": "s1", "generation": 1},
            "spec": {"replicas": replicas, "serviceName": "nginx",
                "selector": {"matchLabels": {"app": "nginx"}},
                "template": {"metadata": {"labels": {"app": "nginx"}},
                    "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}});
        merge(&mut s, extra);
        s
    }

    fn merge(target: &mut Value, patch: Value) {
        if let (Some(t), Value::Object(p)) = (target.as_object_mut(), patch) {
            for (k, v) in p {
                match t.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        t.insert(k, v);
                    }
                }
            }
        }
    }

    /// Pod `web-k` made by `s` (at the update revision), in `phase`, ready or not.
    fn pod(s: &Value, k: u64, phase: &str, ready: bool) -> PodView {
        let mut object = new_pod(
            s,
            &s["spec"]["template"],
            &revision_name(s, &s["spec"]["template"]),
            k,
        );
        object["metadata"]["uid"] = json!(format!("u{k}"));
        let status = json!({"phase": phase,
            "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]});
        PodView::new(&object, Some(&status))
    }

    fn running(s: &Value, k: u64) -> PodView {
        pod(s, k, "Running", true)
    }

    fn names(values: Vec<&Value>) -> Vec<&str> {
        values
            .into_iter()
            .filter(|o| o["kind"] == "Pod")
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect()
    }

    fn with_revision(s: &mut Value, current: &str) {
        s["metadata"]["annotations"] = json!({CURRENT_REVISION: current});
    }

    #[test]
    fn ordinals_are_read_as_upstream_reads_them() {
        assert_eq!(ordinal("web", "web-0"), Some(0));
        assert_eq!(ordinal("web", "web-12"), Some(12));
        for bad in [
            "web-", "web-01", "web-a", "web0", "webx-1", "web--1", "web-1-2",
        ] {
            assert_eq!(ordinal("web", bad), None, "{bad}");
        }
        assert_eq!(ordinal("web-1", "web-1-2"), Some(2));
    }

    #[test]
    fn ordered_ready_makes_one_pod_at_a_time_in_order() {
        let s = sts(3, json!({}));
        let actions = reconcile(&s, &[], &[], &[], T0);
        assert_eq!(names(created(&actions)), ["web-0"]);
        let web0 = created(&actions)
            .into_iter()
            .find(|o| o["kind"] == "Pod")
            .unwrap();
        assert_eq!(web0["spec"]["hostname"], "web-0");
        assert_eq!(web0["spec"]["subdomain"], "nginx");
        assert_eq!(web0["metadata"]["labels"][POD_NAME_LABEL], "web-0");
        assert_eq!(web0["metadata"]["labels"][POD_INDEX_LABEL], "0");
        assert_eq!(
            web0["metadata"]["annotations"]["shoal.io/partition-policy"],
            "fenced"
        );
        // The first revision is made, numbered 1, and becomes the current one.
        let revision = created(&actions)
            .into_iter()
            .find(|o| o["kind"] == "ControllerRevision")
            .unwrap();
        assert_eq!(revision["revision"], 1);
        assert_eq!(
            web0["metadata"]["labels"][REVISION_LABEL],
            revision["metadata"]["name"]
        );
        assert!(actions.iter().any(|a| matches!(a, Action::Annotate { .. })));
        // web-0 not ready yet: nothing more.
        let actions = reconcile(&s, &[pod(&s, 0, "Running", false)], &[], &[], T0);
        assert!(names(created(&actions)).is_empty(), "{actions:?}");
        // Ready: web-1, not web-2.
        let actions = reconcile(&s, &[running(&s, 0)], &[], &[], T0);
        assert_eq!(names(created(&actions)), ["web-1"]);
    }

    #[test]
    fn a_pass_makes_at_most_a_burst_whatever_the_replicas_asked() {
        // The API refuses this (Shoal's bound); a reconcile of one must still be bounded.
        let s = sts(
            1_000_000_000,
            json!({"spec": {"podManagementPolicy": "Parallel",
                "volumeClaimTemplates": [{"metadata": {"name": "www"}}]}}),
        );
        let actions = reconcile(&s, &[], &[], &[], T0);
        let made = created(&actions).len();
        // The revision, then claims and pods up to the burst.
        assert!(made <= BURST + 2, "{made}");
    }

    #[test]
    fn parallel_makes_every_pod_at_once() {
        let s = sts(3, json!({"spec": {"podManagementPolicy": "Parallel"}}));
        let actions = reconcile(&s, &[pod(&s, 1, "Pending", false)], &[], &[], T0);
        assert_eq!(names(created(&actions)), ["web-0", "web-2"]);
    }

    #[test]
    fn ordinals_start_where_asked() {
        let s = sts(
            2,
            json!({"spec": {"ordinals": {"start": 5}, "podManagementPolicy": "Parallel"}}),
        );
        let actions = reconcile(&s, &[], &[], &[], T0);
        assert_eq!(names(created(&actions)), ["web-5", "web-6"]);
        // web-0 is outside the range now: it goes.
        let actions = reconcile(
            &s,
            &[running(&s, 0), running(&s, 5), running(&s, 6)],
            &[],
            &[],
            T0,
        );
        assert_eq!(deleted(&actions, Some("Pod")), ["web-0"]);
    }

    #[test]
    fn scale_down_removes_the_highest_first_one_at_a_time_while_all_are_healthy() {
        let s = sts(1, json!({}));
        let pods = [running(&s, 0), running(&s, 1), running(&s, 2)];
        let actions = reconcile(&s, &pods, &[], &[], T0);
        assert_eq!(deleted(&actions, Some("Pod")), ["web-2"]);
        // web-2 terminating: wait for it before web-1.
        let mut going = running(&s, 2);
        going.deleting = true;
        let actions = reconcile(&s, &[running(&s, 0), running(&s, 1), going], &[], &[], T0);
        assert!(deleted(&actions, Some("Pod")).is_empty(), "{actions:?}");
        // web-0 unhealthy: nothing is removed.
        let actions = reconcile(
            &s,
            &[pod(&s, 0, "Running", false), running(&s, 1)],
            &[],
            &[],
            T0,
        );
        assert!(deleted(&actions, Some("Pod")).is_empty(), "{actions:?}");
        // Parallel: all surplus at once.
        let p = sts(1, json!({"spec": {"podManagementPolicy": "Parallel"}}));
        let actions = reconcile(
            &p,
            &[running(&p, 0), running(&p, 1), running(&p, 2)],
            &[],
            &[],
            T0,
        );
        assert_eq!(deleted(&actions, Some("Pod")), ["web-2", "web-1"]);
    }

    #[test]
    fn an_ended_pod_is_replaced_under_its_name() {
        let s = sts(2, json!({}));
        let actions = reconcile(
            &s,
            &[running(&s, 0), pod(&s, 1, "Failed", false)],
            &[],
            &[],
            T0,
        );
        assert_eq!(deleted(&actions, Some("Pod")), ["web-1"]);
        // Gone: made again.
        let actions = reconcile(&s, &[running(&s, 0)], &[], &[], T0);
        assert_eq!(names(created(&actions)), ["web-1"]);
    }

    /// The objects a reconcile of `s` creates, kept as stored objects (uids given).
    fn stored_revisions(s: &Value, previous: &[Value]) -> Vec<Value> {
        let mut out = previous.to_vec();
        for (i, object) in created(&reconcile(s, &[], previous, &[], T0))
            .into_iter()
            .filter(|o| o["kind"] == "ControllerRevision")
            .enumerate()
        {
            let mut object = object.clone();
            object["metadata"]["uid"] = json!(format!("r{}-{i}", out.len()));
            out.push(object);
        }
        out
    }

    #[test]
    fn a_rolling_update_replaces_from_the_highest_ordinal_down_to_the_partition() {
        let old = sts(3, json!({}));
        let old_revision = revision_name(&old, &old["spec"]["template"]);
        let revisions = stored_revisions(&old, &[]);
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("i:2");
        with_revision(&mut new, &old_revision);
        let revisions = stored_revisions(&new, &revisions);
        assert_eq!(revisions.len(), 2);
        assert_eq!(revisions[1]["revision"], 2);
        let pods = [running(&old, 0), running(&old, 1), running(&old, 2)];
        let actions = reconcile(&new, &pods, &revisions, &[], T0);
        assert_eq!(deleted(&actions, Some("Pod")), ["web-2"]);
        // web-2 back at the new revision but not ready: wait.
        let pods = [
            running(&old, 0),
            running(&old, 1),
            pod(&new, 2, "Running", false),
        ];
        assert!(deleted(&reconcile(&new, &pods, &revisions, &[], T0), Some("Pod")).is_empty());
        let pods = [running(&old, 0), running(&old, 1), running(&new, 2)];
        assert_eq!(
            deleted(&reconcile(&new, &pods, &revisions, &[], T0), Some("Pod")),
            ["web-1"]
        );
        // A partition of 1: web-0 stays at the old revision, and the update is not complete.
        let mut partitioned = new.clone();
        partitioned["spec"]["updateStrategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 1}});
        let pods = [running(&old, 0), running(&new, 1), running(&new, 2)];
        let actions = reconcile(&partitioned, &pods, &revisions, &[], T0);
        assert!(deleted(&actions, Some("Pod")).is_empty(), "{actions:?}");
        assert!(!actions.iter().any(|a| matches!(a, Action::Annotate { .. })));
        // web-0 deleted by hand: made again from the current (old) revision.
        let pods = [running(&new, 1), running(&new, 2)];
        let actions = reconcile(&partitioned, &pods, &revisions, &[], T0);
        let made = created(&actions);
        let web0 = made.iter().find(|o| o["kind"] == "Pod").unwrap();
        assert_eq!(
            web0["metadata"]["labels"][REVISION_LABEL],
            old_revision.as_str()
        );
        assert_eq!(web0["spec"]["containers"][0]["image"], "i:1");
        // Every pod updated and ready: the update revision becomes the current one.
        let pods = [running(&new, 0), running(&new, 1), running(&new, 2)];
        let actions = reconcile(&new, &pods, &revisions, &[], T0);
        let update = revision_name(&new, &new["spec"]["template"]);
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Annotate { annotations, .. }
            if annotations[CURRENT_REVISION] == update))
        );
        let st = status(&new, &pods, &revisions, T0);
        assert_eq!(st["updatedReplicas"], 3);
        assert_eq!(st["currentRevision"], old_revision.as_str());
        assert_eq!(st["updateRevision"], update.as_str());
    }

    #[test]
    fn on_delete_replaces_nothing_by_itself() {
        let old = sts(2, json!({}));
        let revisions = stored_revisions(&old, &[]);
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("i:2");
        new["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
        with_revision(&mut new, &revision_name(&old, &old["spec"]["template"]));
        let pods = [running(&old, 0), running(&old, 1)];
        assert!(deleted(&reconcile(&new, &pods, &revisions, &[], T0), Some("Pod")).is_empty());
        // A pod deleted by the user comes back from the new template.
        let actions = reconcile(&new, &[running(&old, 0)], &revisions, &[], T0);
        let made = created(&actions);
        let web1 = made.iter().find(|o| o["kind"] == "Pod").unwrap();
        assert_eq!(web1["spec"]["containers"][0]["image"], "i:2");
    }

    #[test]
    fn going_back_to_an_older_template_renumbers_its_revision_and_history_is_bounded() {
        let one = sts(1, json!({"spec": {"revisionHistoryLimit": 1}}));
        let mut revisions = stored_revisions(&one, &[]);
        let mut two = one.clone();
        two["spec"]["template"]["spec"]["containers"][0]["image"] = json!("i:2");
        revisions = stored_revisions(&two, &revisions);
        // Back to the first template (kubectl rollout undo): revision 1 becomes 3.
        let actions = reconcile(&one, &[running(&one, 0)], &revisions, &[], T0);
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Renumber { revision: 3, name, .. }
                if *name == revision_name(&one, &one["spec"]["template"]))),
            "{actions:?}"
        );
        assert!(
            created(&actions)
                .iter()
                .all(|o| o["kind"] != "ControllerRevision")
        );
        // A third template: the second, used by nothing, is beyond the limit of 1 with the
        // first... both unused; the oldest goes.
        let mut three = one.clone();
        three["spec"]["template"]["spec"]["containers"][0]["image"] = json!("i:3");
        let mut current = three.clone();
        with_revision(
            &mut current,
            &revision_name(&three, &three["spec"]["template"]),
        );
        let revisions = stored_revisions(&three, &revisions);
        let actions = reconcile(&current, &[running(&three, 0)], &revisions, &[], T0);
        let gone: Vec<&str> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete {
                    kind: "ControllerRevision",
                    name,
                    ..
                } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(gone, [revision_name(&one, &one["spec"]["template"])]);
    }

    #[test]
    fn orphans_of_the_set_are_adopted_and_pods_that_stop_matching_released() {
        let s = sts(1, json!({}));
        let mut orphan = running(&s, 0);
        orphan.controller_uid = None;
        let actions = reconcile(&s, &[orphan], &[], &[], T0);
        assert!(actions.iter().any(|a| matches!(a, Action::Update(o)
            if o["metadata"]["ownerReferences"][0]["uid"] == "s1")));
        assert!(names(created(&actions)).is_empty());
        // An orphan with another naming is not this set's.
        let mut stranger = running(&s, 0);
        stranger.controller_uid = None;
        stranger.name = "web-x".into();
        let actions = reconcile(&s, &[stranger], &[], &[], T0);
        assert_eq!(names(created(&actions)), ["web-0"]);
        // An owned pod whose labels changed is released (and replaced).
        let mut relabeled = running(&s, 0);
        relabeled.labels.insert("app".into(), "other".into());
        let actions = reconcile(&s, &[relabeled], &[], &[], T0);
        assert!(actions.iter().any(|a| matches!(a, Action::Update(o)
            if o["metadata"]["ownerReferences"] == json!([]))));
        assert_eq!(names(created(&actions)), ["web-0"]);
    }

    #[test]
    fn each_ordinal_gets_its_claims_before_its_pod_and_scaled_away_ones_go_when_asked() {
        let s = sts(
            2,
            json!({"spec": {"volumeClaimTemplates": [{"metadata": {"name": "www"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}),
        );
        let actions = reconcile(&s, &[], &[], &[], T0);
        let claims: Vec<&str> = created(&actions)
            .into_iter()
            .filter(|o| o["kind"] == "PersistentVolumeClaim")
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        // OrderedReady: the first ordinal's claim with its pod; the next waits for it.
        assert_eq!(claims, ["www-web-0"]);
        let claim = &claims_for(&s, 0)[0];
        assert_eq!(claim["metadata"]["labels"]["app"], "nginx");
        assert!(
            claim["metadata"]["ownerReferences"].is_null(),
            "Retain by default"
        );
        // Existing claims are not made again.
        let have = [
            ("www-web-0", "c0"),
            ("www-web-1", "c1"),
            ("www-web-2", "c2"),
        ];
        let actions = reconcile(&s, &[running(&s, 0)], &[], &have, T0);
        assert!(
            created(&actions)
                .iter()
                .all(|o| o["kind"] != "PersistentVolumeClaim")
        );
        // Retained when scaled away, by default; deleted with `whenScaled: Delete` once the
        // pod has gone.
        assert!(deleted(&actions, Some("PersistentVolumeClaim")).is_empty());
        let mut scaled = s.clone();
        scaled["spec"]["persistentVolumeClaimRetentionPolicy"] =
            json!({"whenDeleted": "Delete", "whenScaled": "Delete"});
        let actions = reconcile(&scaled, &[running(&s, 0), running(&s, 2)], &[], &have, T0);
        assert!(
            deleted(&actions, Some("PersistentVolumeClaim")).is_empty(),
            "web-2 still there"
        );
        let actions = reconcile(&scaled, &[running(&s, 0), running(&s, 1)], &[], &have, T0);
        assert_eq!(
            deleted(&actions, Some("PersistentVolumeClaim")),
            ["www-web-2"]
        );
        assert_eq!(
            claims_for(&scaled, 0)[0]["metadata"]["ownerReferences"][0]["uid"],
            "s1"
        );
    }

    #[test]
    fn claim_templates_become_volumes_of_each_pods_own_claim() {
        let s = sts(
            1,
            json!({"spec": {"volumeClaimTemplates": [{"metadata": {"name": "www"}}]}}),
        );
        let pod = new_pod(&s, &s["spec"]["template"], "web-x", 3);
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": "www", "persistentVolumeClaim": {"claimName": "www-web-3"}}])
        );
    }

    #[test]
    fn status_counts_ready_current_and_updated_pods() {
        let s = sts(3, json!({}));
        let mut gone = running(&s, 2);
        gone.deleting = true;
        let pods = [running(&s, 0), pod(&s, 1, "Running", false), gone];
        let st = status(&s, &pods, &[], T0);
        assert_eq!(st["replicas"], 2);
        assert_eq!(st["readyReplicas"], 1);
        assert_eq!(st["availableReplicas"], 1);
        assert_eq!(st["updatedReplicas"], 2);
        assert_eq!(st["currentReplicas"], 2);
        assert_eq!(st["currentRevision"], st["updateRevision"]);
    }
}

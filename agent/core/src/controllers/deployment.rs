//! The Deployment controller (pure): one ReplicaSet per pod template (named and labelled by
//! the template's hash), rolled from old to new with RollingUpdate (maxSurge /
//! maxUnavailable, absolute or percent, Kubernetes' defaults 25% / 25%) or Recreate, with
//! revisions (`deployment.kubernetes.io/revision`), `revisionHistoryLimit` and pause. Status
//! is computed at read time from the ReplicaSets and the pods their nodes report.

use serde_json::{Value, json};

use super::replica_set;
use super::workload::{
    Action, PodView, controller_of, controller_ref, replicas, rfc3339_seconds, template_hash,
};

pub const REVISION: &str = "deployment.kubernetes.io/revision";
const HASH_LABEL: &str = "pod-template-hash";

/// An intOrString like `25%` or `1` of `total`: percentages round up for surge, down for
/// unavailability (as Kubernetes does).
fn scaled(value: &Value, total: u64, round_up: bool, default_percent: u64) -> u64 {
    let percent = |p: u64| {
        let x = total.saturating_mul(p);
        if round_up { x.div_ceil(100) } else { x / 100 }
    };
    match value {
        Value::Number(n) => n.as_u64().unwrap_or(0),
        Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<u64>().ok()) {
            Some(p) => percent(p),
            None => s.parse().unwrap_or(0),
        },
        _ => percent(default_percent),
    }
}

/// (maxSurge, maxUnavailable) for `replicas`; both 0 would never progress, so
/// maxUnavailable is then 1.
pub fn surge_and_unavailable(deployment: &Value, replicas: u64) -> (u64, u64) {
    let rolling = &deployment["spec"]["strategy"]["rollingUpdate"];
    let surge = scaled(&rolling["maxSurge"], replicas, true, 25);
    let unavailable = scaled(&rolling["maxUnavailable"], replicas, false, 25);
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable.min(replicas))
    }
}

fn revision(rs: &Value) -> u64 {
    rs["metadata"]["annotations"][REVISION]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// The ReplicaSets `deployment` controls, oldest revision first.
pub fn owned_sets<'a>(deployment: &Value, sets: &'a [Value]) -> Vec<&'a Value> {
    let uid = deployment["metadata"]["uid"].as_str();
    let mut owned: Vec<&Value> = sets
        .iter()
        .filter(|rs| controller_of(rs).as_deref() == uid && uid.is_some())
        .collect();
    owned.sort_by_key(|rs| (revision(rs), rs["metadata"]["name"].as_str().unwrap_or("")));
    owned
}

fn is_current(rs: &Value, hash: &str) -> bool {
    rs["metadata"]["labels"][HASH_LABEL] == hash
}

/// When a Deployment's pods count: its `minReadySeconds` and the time of the reconcile.
#[derive(Clone, Copy)]
struct Clock {
    min_ready_ms: u64,
    now_ms: u64,
}

/// Active pods of `rs`, and how many of them are available (ready for `minReadySeconds`).
fn pod_counts(rs: &Value, pods: &[PodView], clock: Clock) -> (u64, u64) {
    let owned: Vec<&PodView> = replica_set::owned(rs, pods)
        .into_iter()
        .filter(|p| p.is_active())
        .collect();
    (
        owned.len() as u64,
        owned
            .iter()
            .filter(|p| p.is_available(clock.min_ready_ms, clock.now_ms))
            .count() as u64,
    )
}

/// Ready pods of `rs` (active ones).
fn ready_count(rs: &Value, pods: &[PodView]) -> u64 {
    replica_set::owned(rs, pods)
        .into_iter()
        .filter(|p| p.is_active() && p.ready)
        .count() as u64
}

/// When the rollout to `rs` (the current template's ReplicaSet) last made progress, as
/// Kubernetes counts it against `progressDeadlineSeconds`: the ReplicaSet was created, or one of
/// its pods was created (a scale-up) or became ready (ms since the epoch, as the pods' nodes
/// report them; 0 if unknown).
fn last_progress_ms(rs: &Value, pods: &[PodView]) -> u64 {
    replica_set::owned(rs, pods)
        .into_iter()
        .filter(|p| p.is_active())
        .flat_map(|p| {
            [
                Some(p.created_ms),
                p.ready.then_some(p.ready_changed_ms).flatten(),
            ]
        })
        .flatten()
        .fold(super::workload::created_ms(rs), u64::max)
}

/// The ReplicaSet of the deployment's current template, as it would be created.
pub fn new_replica_set(deployment: &Value, hash: &str, revision: u64, replicas: u64) -> Value {
    let name = deployment["metadata"]["name"].as_str().unwrap_or_default();
    let mut template = deployment["spec"]["template"].clone();
    template["metadata"]["labels"][HASH_LABEL] = json!(hash);
    let mut selector = deployment["spec"]["selector"].clone();
    selector["matchLabels"][HASH_LABEL] = json!(hash);
    let mut rs = json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": format!("{name}-{hash}"),
            "namespace": deployment["metadata"]["namespace"],
            "labels": template["metadata"]["labels"],
            "annotations": {REVISION: revision.to_string()},
            "ownerReferences": [controller_ref(deployment)],
        },
        "spec": {"replicas": replicas, "selector": selector, "template": template},
    });
    if let Some(seconds) = deployment["spec"]["minReadySeconds"].as_u64() {
        rs["spec"]["minReadySeconds"] = json!(seconds);
    }
    rs
}

fn with_replicas(rs: &Value, n: u64) -> Action {
    let mut rs = rs.clone();
    rs["spec"]["replicas"] = json!(n);
    Action::Update(rs)
}

/// What `deployment` needs done at `now_ms`, given the ReplicaSets and pods of its
/// namespace. Pods count as available once ready for `minReadySeconds`; while one is ready but
/// not yet available, an [`Action::Requeue`] asks for a reconcile when it becomes so.
pub fn reconcile(deployment: &Value, sets: &[Value], pods: &[PodView], now_ms: u64) -> Vec<Action> {
    let mut actions = Vec::new();
    if !deployment["metadata"]["deletionTimestamp"].is_null() {
        return actions;
    }
    let clock = Clock {
        min_ready_ms: super::workload::min_ready_ms(deployment),
        now_ms,
    };
    let owned_pods = owned_sets(deployment, sets)
        .into_iter()
        .flat_map(|rs| replica_set::owned(rs, pods))
        .filter(|p| p.is_active());
    actions.extend(super::workload::requeue_for_availability(
        owned_pods,
        clock.min_ready_ms,
        now_ms,
    ));
    let want = replicas(deployment);
    let hash = template_hash(&deployment["spec"]["template"]);
    let owned = owned_sets(deployment, sets);
    let max_revision = owned.iter().map(|rs| revision(rs)).max().unwrap_or(0);
    let current = owned.iter().copied().find(|rs| is_current(rs, &hash));
    let olds: Vec<&Value> = owned
        .iter()
        .copied()
        .filter(|rs| !is_current(rs, &hash))
        .collect();
    let paused = deployment["spec"]["paused"] == true;
    let Some(current) = current else {
        if paused {
            return actions;
        }
        // A new template: its ReplicaSet, at the newest revision, sized by the strategy.
        let old_total: u64 = olds.iter().map(|rs| replicas(rs)).sum();
        let start = if recreate(deployment) || old_total == 0 {
            if old_total == 0 { want } else { 0 }
        } else {
            let (surge, _) = surge_and_unavailable(deployment, want);
            want.saturating_add(surge)
                .saturating_sub(old_total)
                .min(want)
        };
        actions.push(Action::Create(new_replica_set(
            deployment,
            &hash,
            max_revision + 1,
            start,
        )));
        return actions;
    };
    // Rolled back to an older template: its ReplicaSet becomes the newest revision.
    if revision(current) < max_revision {
        let mut rs = current.clone();
        rs["metadata"]["annotations"][REVISION] = json!((max_revision + 1).to_string());
        actions.push(Action::Update(rs));
        return actions;
    }
    // `minReadySeconds` is not part of the template: a change reaches the current ReplicaSet
    // (whose availableReplicas counts with it) by an update, as in Kubernetes.
    if current["spec"]["minReadySeconds"].as_u64().unwrap_or(0)
        != deployment["spec"]["minReadySeconds"].as_u64().unwrap_or(0)
    {
        let mut rs = current.clone();
        rs["spec"]["minReadySeconds"] = json!(clock.min_ready_ms / 1000);
        actions.push(Action::Update(rs));
        return actions;
    }
    if paused {
        return actions;
    }
    let current_replicas = replicas(current);
    let old_active: Vec<&Value> = olds.iter().copied().filter(|rs| replicas(rs) > 0).collect();
    if recreate(deployment) {
        if !old_active.is_empty() {
            actions.extend(old_active.iter().map(|rs| with_replicas(rs, 0)));
        } else if olds.iter().all(|rs| pod_counts(rs, pods, clock).0 == 0)
            && current_replicas != want
        {
            // Every old pod is gone: now the new ones.
            actions.push(with_replicas(current, want));
        }
    } else if old_active.is_empty() {
        if current_replicas != want {
            actions.push(with_replicas(current, want));
        }
    } else {
        let (surge, unavailable) = surge_and_unavailable(deployment, want);
        let total: u64 = owned.iter().map(|rs| replicas(rs)).sum();
        // Up: the new set grows into the surge room.
        let room = want.saturating_add(surge).saturating_sub(total);
        let grown = current_replicas.saturating_add(room).min(want);
        if grown != current_replicas {
            actions.push(with_replicas(current, grown));
        }
        // Down: old sets shrink as far as availability allows (available pods of all sets
        // must stay at or above want − maxUnavailable), oldest first.
        let ready: u64 = owned.iter().map(|rs| pod_counts(rs, pods, clock).1).sum();
        let min_available = want.saturating_sub(unavailable);
        let (current_pods, current_ready) = pod_counts(current, pods, clock);
        let new_unavailable = current_replicas
            .max(current_pods)
            .saturating_sub(current_ready);
        let mut can_remove = total
            .saturating_sub(min_available)
            .saturating_sub(new_unavailable)
            .min(
                ready.saturating_sub(min_available).saturating_add(
                    // Old pods that are not available cost no availability.
                    old_active
                        .iter()
                        .map(|rs| {
                            let (n, r) = pod_counts(rs, pods, clock);
                            n.saturating_sub(r)
                        })
                        .sum::<u64>(),
                ),
            );
        for rs in &old_active {
            if can_remove == 0 {
                break;
            }
            let n = replicas(rs);
            let cut = n.min(can_remove);
            can_remove -= cut;
            actions.push(with_replicas(rs, n - cut));
        }
    }
    // History: old, empty sets beyond revisionHistoryLimit go, oldest first.
    let limit = deployment["spec"]["revisionHistoryLimit"]
        .as_u64()
        .unwrap_or(10) as usize;
    let empty: Vec<&Value> = olds
        .iter()
        .copied()
        .filter(|rs| replicas(rs) == 0 && pod_counts(rs, pods, clock).0 == 0)
        .collect();
    for rs in empty.iter().take(empty.len().saturating_sub(limit)) {
        actions.push(Action::Delete {
            kind: "ReplicaSet",
            namespace: rs["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned(),
            name: rs["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            uid: rs["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        });
    }
    actions
}

fn recreate(deployment: &Value) -> bool {
    deployment["spec"]["strategy"]["type"] == "Recreate"
}

/// The observed status of `deployment` (kubectl rollout status reads it): counts from its
/// ReplicaSets' pods as their nodes report them, `observedGeneration` once the current
/// template's ReplicaSet exists at the newest revision, and the Available and Progressing
/// conditions (ProgressDeadlineExceeded once the rollout to the newest ReplicaSet made no
/// progress for `progressDeadlineSeconds` without having completed).
pub fn status(deployment: &Value, sets: &[Value], pods: &[PodView], now_ms: u64) -> Value {
    let clock = Clock {
        min_ready_ms: super::workload::min_ready_ms(deployment),
        now_ms,
    };
    let want = replicas(deployment);
    let hash = template_hash(&deployment["spec"]["template"]);
    let owned = owned_sets(deployment, sets);
    let max_revision = owned.iter().map(|rs| revision(rs)).max().unwrap_or(0);
    let current = owned
        .iter()
        .copied()
        .find(|rs| is_current(rs, &hash) && revision(rs) == max_revision);
    let (mut total, mut available, mut ready) = (0, 0, 0);
    for rs in &owned {
        let (n, a) = pod_counts(rs, pods, clock);
        total += n;
        available += a;
        ready += ready_count(rs, pods);
    }
    let (updated, updated_available) = current.map_or((0, 0), |rs| pod_counts(rs, pods, clock));
    let generation = deployment["metadata"]["generation"].as_u64().unwrap_or(1);
    let observed = if current.is_some() || deployment["spec"]["paused"] == true {
        generation
    } else {
        generation.saturating_sub(1)
    };
    let (_, unavailable) = surge_and_unavailable(deployment, want);
    let minimum_available = available >= want.saturating_sub(unavailable);
    let complete =
        current.is_some() && updated == want && updated_available == want && total == want;
    let since = |rs: Option<&Value>| {
        rs.and_then(|rs| {
            rs["metadata"]["creationTimestamp"]
                .as_str()
                .map(str::to_owned)
        })
        .or_else(|| {
            deployment["metadata"]["creationTimestamp"]
                .as_str()
                .map(str::to_owned)
        })
    };
    let deadline_ms = deployment["spec"]["progressDeadlineSeconds"]
        .as_u64()
        .unwrap_or(600)
        .saturating_mul(1000);
    let progress_ms = current.map_or(0, |rs| last_progress_ms(rs, pods));
    let progressing = if deployment["spec"]["paused"] == true {
        json!({"type": "Progressing", "status": "Unknown", "reason": "DeploymentPaused", "message": "Deployment is paused"})
    } else if complete {
        json!({"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
            "message": format!("ReplicaSet \"{}\" has successfully progressed.", current.map_or("", |rs| rs["metadata"]["name"].as_str().unwrap_or("")))})
    } else if current.is_some()
        && progress_ms > 0
        && now_ms > progress_ms.saturating_add(deadline_ms)
    {
        json!({"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
            "message": format!("ReplicaSet \"{}\" has timed out progressing.", current.map_or("", |rs| rs["metadata"]["name"].as_str().unwrap_or("")))})
    } else {
        json!({"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
            "message": format!("ReplicaSet \"{}\" is progressing.", current.map_or("", |rs| rs["metadata"]["name"].as_str().unwrap_or("")))})
    };
    let mut progressing = progressing;
    progressing["lastUpdateTime"] = match progress_ms {
        0 => json!(since(current)),
        ms => json!(rfc3339_seconds(ms)),
    };
    progressing["lastTransitionTime"] = json!(since(current));
    let available_condition = if minimum_available {
        json!({"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable", "message": "Deployment has minimum availability."})
    } else {
        json!({"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable", "message": "Deployment does not have minimum availability."})
    };
    let mut available_condition = available_condition;
    available_condition["lastUpdateTime"] = json!(since(current));
    available_condition["lastTransitionTime"] = json!(since(current));
    json!({
        "observedGeneration": observed,
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "unavailableReplicas": want.saturating_sub(available),
        "conditions": [available_condition, progressing],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(replicas: u64, image: &str, strategy: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "uid": "d1", "generation": 1},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}, "strategy": strategy,
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    /// A stored ReplicaSet from a Create action, with a uid.
    fn stored(action: &Action, uid: &str) -> Value {
        let Action::Create(rs) = action else {
            panic!("{action:?}")
        };
        let mut rs = rs.clone();
        rs["metadata"]["uid"] = json!(uid);
        rs
    }

    fn ready_pods(rs: &Value, n: usize, ready: bool) -> Vec<PodView> {
        (0..n)
            .map(|i| {
                let object = json!({"metadata": {"name": format!("{}-{i}", rs["metadata"]["name"].as_str().unwrap()),
                    "namespace": "default", "uid": format!("{}-{i}", rs["metadata"]["uid"].as_str().unwrap()),
                    "labels": rs["spec"]["template"]["metadata"]["labels"],
                    "ownerReferences": [{"uid": rs["metadata"]["uid"], "controller": true}]},
                    "spec": {"nodeName": "n1"}});
                let status = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]});
                PodView::new(&object, Some(&status))
            })
            .collect()
    }

    /// `progressDeadlineSeconds` counts from the rollout's last progress (its ReplicaSet made,
    /// a pod of it created or turned ready), not from when it began; a paused Deployment has
    /// no deadline.
    #[test]
    fn the_progress_deadline_counts_from_the_last_progress() {
        let at = |s: u64| 1_800_000_000_000 + s * 1000;
        let mut d = deployment(2, "a", Value::Null);
        d["spec"]["progressDeadlineSeconds"] = json!(10);
        let mut rs = stored(&reconcile(&d, &[], &[], 0)[0], "rs-a");
        rs["metadata"]["creationTimestamp"] = json!(rfc3339_seconds(at(0)));
        // One pod created at 2 s and ready since 8 s; the other never ready.
        let mut pods = ready_pods(&rs, 2, false);
        for p in &mut pods {
            p.created_ms = at(2);
        }
        pods[0].ready = true;
        pods[0].ready_changed_ms = Some(at(8));
        let reason = |pods: &[PodView], d: &Value, now: u64| {
            let s = status(d, std::slice::from_ref(&rs), pods, now);
            s["conditions"][1]["reason"].as_str().unwrap().to_owned()
        };
        assert_eq!(reason(&pods, &d, at(17)), "ReplicaSetUpdated");
        assert_eq!(reason(&pods, &d, at(19)), "ProgressDeadlineExceeded");
        let s = status(&d, std::slice::from_ref(&rs), &pods, at(19));
        assert_eq!(s["conditions"][1]["lastUpdateTime"], rfc3339_seconds(at(8)));
        // Without the ready pod, the last progress is the pods' creation at 2 s.
        pods[0].ready = false;
        assert_eq!(reason(&pods, &d, at(13)), "ProgressDeadlineExceeded");
        let mut paused = d.clone();
        paused["spec"]["paused"] = json!(true);
        assert_eq!(reason(&pods, &paused, at(60)), "DeploymentPaused");
        pods[0].ready = true;
        pods[1].ready = true;
        assert_eq!(reason(&pods, &d, at(60)), "NewReplicaSetAvailable");
    }

    #[test]
    fn surge_and_unavailable_arithmetic() {
        let d = |s: Value, u: Value| {
            deployment(
                10,
                "a",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": s, "maxUnavailable": u}}),
            )
        };
        assert_eq!(
            surge_and_unavailable(&d(json!("25%"), json!("25%")), 10),
            (3, 2)
        );
        assert_eq!(surge_and_unavailable(&d(json!(1), json!(0)), 10), (1, 0));
        assert_eq!(surge_and_unavailable(&d(json!(0), json!(0)), 10), (0, 1));
        assert_eq!(
            surge_and_unavailable(&d(json!("0%"), json!("100%")), 10),
            (0, 10)
        );
        assert_eq!(
            surge_and_unavailable(&deployment(3, "a", Value::Null), 3),
            (1, 0)
        );
    }

    #[test]
    fn a_first_rollout_creates_the_replica_set_at_full_size() {
        let d = deployment(3, "a", Value::Null);
        let actions = reconcile(&d, &[], &[], 0);
        let rs = stored(&actions[0], "rs-a");
        assert_eq!(rs["spec"]["replicas"], 3);
        assert_eq!(rs["metadata"]["annotations"][REVISION], "1");
        let hash = template_hash(&d["spec"]["template"]);
        assert_eq!(rs["metadata"]["name"], format!("web-{hash}"));
        assert_eq!(
            rs["spec"]["selector"]["matchLabels"]["pod-template-hash"],
            hash
        );
        assert_eq!(
            rs["spec"]["template"]["metadata"]["labels"]["pod-template-hash"],
            hash
        );
        // Nothing more to do once it exists at the right size.
        assert!(reconcile(&d, std::slice::from_ref(&rs), &ready_pods(&rs, 3, true), 0).is_empty());
        let s = status(&d, std::slice::from_ref(&rs), &ready_pods(&rs, 3, true), 0);
        assert_eq!(s["updatedReplicas"], 3);
        assert_eq!(s["conditions"][1]["reason"], "NewReplicaSetAvailable");
        assert_eq!(s["observedGeneration"], 1);
    }

    /// A rolling update with maxUnavailable 0 never drops the ready count below replicas.
    #[test]
    fn a_rolling_update_keeps_availability() {
        let strategy =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
        let old = stored(
            &reconcile(&deployment(3, "a", strategy.clone()), &[], &[], 0)[0],
            "rs-a",
        );
        let d = deployment(3, "b", strategy);
        let new = stored(
            &reconcile(
                &d,
                std::slice::from_ref(&old),
                &ready_pods(&old, 3, true),
                0,
            )[0],
            "rs-b",
        );
        assert_eq!(new["spec"]["replicas"], 1, "surge of one");
        assert_eq!(new["metadata"]["annotations"][REVISION], "2");
        // The new pod is not ready yet: no old pod may go.
        let pods: Vec<PodView> = ready_pods(&old, 3, true)
            .into_iter()
            .chain(ready_pods(&new, 1, false))
            .collect();
        let actions = reconcile(&d, &[old.clone(), new.clone()], &pods, 0);
        assert!(
            actions
                .iter()
                .all(|a| !matches!(a, Action::Update(rs) if rs["metadata"]["uid"] == "rs-a")),
            "{actions:?}"
        );
        // Once it is ready, one old replica goes.
        let pods: Vec<PodView> = ready_pods(&old, 3, true)
            .into_iter()
            .chain(ready_pods(&new, 1, true))
            .collect();
        let actions = reconcile(&d, &[old.clone(), new.clone()], &pods, 0);
        let scaled_old = actions.iter().find_map(|a| match a {
            Action::Update(rs) if rs["metadata"]["uid"] == "rs-a" => {
                rs["spec"]["replicas"].as_u64()
            }
            _ => None,
        });
        assert_eq!(scaled_old, Some(2));
        let s = status(&d, &[old.clone(), new.clone()], &pods, 0);
        assert_eq!(
            (s["replicas"].as_u64(), s["updatedReplicas"].as_u64()),
            (Some(4), Some(1))
        );
        assert_eq!(s["conditions"][1]["reason"], "ReplicaSetUpdated");
    }

    /// `minReadySeconds`: a new pod ready for less than it is not available, so with
    /// maxUnavailable 0 no old pod goes yet, and the reconcile asks to be run again when it
    /// becomes available; then one old replica goes. Status counts it ready at once and
    /// available only then; the new ReplicaSet carries the field.
    #[test]
    fn min_ready_seconds_holds_a_rollout_until_the_new_pod_is_available() {
        let at = |s: u64| 1_800_000_000_000 + s * 1000;
        let strategy =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
        let mut first = deployment(3, "a", strategy.clone());
        first["spec"]["minReadySeconds"] = json!(5);
        let old = stored(&reconcile(&first, &[], &[], at(0))[0], "rs-a");
        assert_eq!(old["spec"]["minReadySeconds"], 5);
        let mut d = deployment(3, "b", strategy);
        d["spec"]["minReadySeconds"] = json!(5);
        let mut old_pods = ready_pods(&old, 3, true);
        for p in &mut old_pods {
            p.ready_changed_ms = Some(at(0));
        }
        let new = stored(
            &reconcile(&d, std::slice::from_ref(&old), &old_pods, at(60))[0],
            "rs-b",
        );
        let mut new_pods = ready_pods(&new, 1, true);
        new_pods[0].ready_changed_ms = Some(at(100));
        let pods: Vec<PodView> = old_pods.iter().cloned().chain(new_pods).collect();
        let sets = [old.clone(), new.clone()];
        let old_scaled = |actions: &[Action]| {
            actions.iter().find_map(|a| match a {
                Action::Update(rs) if rs["metadata"]["uid"] == "rs-a" => {
                    rs["spec"]["replicas"].as_u64()
                }
                _ => None,
            })
        };
        // Ready for 2 s of 5: nothing goes; come back at 105 s.
        let actions = reconcile(&d, &sets, &pods, at(102));
        assert_eq!(old_scaled(&actions), None, "{actions:?}");
        assert!(
            actions.contains(&Action::Requeue { at_ms: at(105) }),
            "{actions:?}"
        );
        let s = status(&d, &sets, &pods, at(102));
        assert_eq!(
            (s["readyReplicas"].as_u64(), s["availableReplicas"].as_u64()),
            (Some(4), Some(3))
        );
        // At 105 s it is available: one old replica goes, and nothing is requeued.
        let actions = reconcile(&d, &sets, &pods, at(105));
        assert_eq!(old_scaled(&actions), Some(2), "{actions:?}");
        assert!(!actions.iter().any(|a| matches!(a, Action::Requeue { .. })));
        assert_eq!(status(&d, &sets, &pods, at(105))["availableReplicas"], 4);
        // A change of minReadySeconds reaches the current ReplicaSet first.
        let mut changed = d.clone();
        changed["spec"]["minReadySeconds"] = json!(1);
        let actions = reconcile(&changed, &sets, &pods, at(102));
        assert!(
            matches!(&actions[..], [.., Action::Update(rs)]
                if rs["metadata"]["uid"] == "rs-b" && rs["spec"]["minReadySeconds"] == 1),
            "{actions:?}"
        );
        // A ready pod whose node reports no transition time is never taken as available.
        let mut unknown = pods.clone();
        unknown[3].ready_changed_ms = None;
        assert_eq!(old_scaled(&reconcile(&d, &sets, &unknown, at(500))), None);
    }

    #[test]
    fn recreate_stops_the_old_pods_first() {
        let strategy = json!({"type": "Recreate"});
        let old = stored(
            &reconcile(&deployment(2, "a", strategy.clone()), &[], &[], 0)[0],
            "rs-a",
        );
        let d = deployment(2, "b", strategy);
        let new = stored(
            &reconcile(
                &d,
                std::slice::from_ref(&old),
                &ready_pods(&old, 2, true),
                0,
            )[0],
            "rs-b",
        );
        assert_eq!(new["spec"]["replicas"], 0);
        let actions = reconcile(
            &d,
            &[old.clone(), new.clone()],
            &ready_pods(&old, 2, true),
            0,
        );
        assert!(
            matches!(&actions[0], Action::Update(rs) if rs["metadata"]["uid"] == "rs-a" && rs["spec"]["replicas"] == 0)
        );
        let mut old_scaled = old.clone();
        old_scaled["spec"]["replicas"] = json!(0);
        // Old pods still running: the new set waits.
        let actions = reconcile(
            &d,
            &[old_scaled.clone(), new.clone()],
            &ready_pods(&old, 2, true),
            0,
        );
        assert!(actions.is_empty(), "{actions:?}");
        let actions = reconcile(&d, &[old_scaled, new], &[], 0);
        assert!(
            matches!(&actions[0], Action::Update(rs) if rs["metadata"]["uid"] == "rs-b" && rs["spec"]["replicas"] == 2)
        );
    }

    #[test]
    fn rollback_and_history() {
        let strategy = Value::Null;
        let a = stored(
            &reconcile(&deployment(1, "a", strategy.clone()), &[], &[], 0)[0],
            "rs-a",
        );
        let mut a0 = a.clone();
        a0["spec"]["replicas"] = json!(0);
        let mut b = stored(
            &reconcile(
                &deployment(1, "b", strategy.clone()),
                std::slice::from_ref(&a),
                &[],
                0,
            )[0],
            "rs-b",
        );
        b["spec"]["replicas"] = json!(1);
        // Back to template a: its ReplicaSet becomes revision 3.
        let actions = reconcile(
            &deployment(1, "a", strategy),
            &[a0.clone(), b.clone()],
            &[],
            0,
        );
        assert!(
            matches!(&actions[0], Action::Update(rs) if rs["metadata"]["uid"] == "rs-a" && rs["metadata"]["annotations"][REVISION] == "3")
        );
        // revisionHistoryLimit 0: an empty old set is deleted.
        let mut d = deployment(1, "b", Value::Null);
        d["spec"]["revisionHistoryLimit"] = json!(0);
        let actions = reconcile(&d, &[a0, b], &[], 0);
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Delete { uid, .. } if uid == "rs-a")),
            "{actions:?}"
        );
    }
}

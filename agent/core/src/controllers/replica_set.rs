//! The ReplicaSet controller (pure): keep exactly `spec.replicas` active pods that match the
//! selector, adopting matching orphans, releasing owned pods whose labels stop matching (the
//! Borg quarantine pattern: take a label off to take a pod out of service; a replacement
//! appears), and removing surplus pods in Kubernetes' order — so that two owners that both
//! acted during a partition remove the same surplus after the heal.

use std::cmp::Reverse;

use serde_json::{Value, json};

use super::workload::{
    Action, Phase, PodView, controller_ref, name_suffix, replicas, selector, selects,
};

/// Most pods one reconcile creates or deletes (Kubernetes' burst is 500).
pub const BURST: usize = 500;

/// Surplus removal order, most removable first: unbound before bound, pending before
/// running, not ready before ready, newer before older; the name breaks ties so every node
/// ranks alike.
pub fn removal_rank(p: &PodView) -> impl Ord + '_ {
    (
        p.node.is_some(),
        p.phase != Phase::Pending,
        p.ready,
        Reverse(p.created_ms),
        Reverse(p.name.as_str()),
    )
}

/// The pods `rs` owns (its controller reference), from all pods of its namespace.
pub fn owned<'a>(rs: &Value, pods: &'a [PodView]) -> Vec<&'a PodView> {
    let uid = rs["metadata"]["uid"].as_str().unwrap_or_default();
    pods.iter()
        .filter(|p| p.controller_uid.as_deref() == Some(uid))
        .collect()
}

/// What `rs` needs done, given the pods it may own: at least those it controls and the orphans
/// of its namespace (others' pods are ignored, so every pod of the namespace may be given).
/// `random` yields the entropy of new pods' names.
pub fn reconcile<'a>(
    rs: &Value,
    pods: impl IntoIterator<Item = &'a PodView>,
    random: &mut dyn FnMut() -> u64,
) -> Vec<Action> {
    let mut actions = Vec::new();
    if !rs["metadata"]["deletionTimestamp"].is_null() {
        return actions;
    }
    let mine = super::workload::claim_pods(rs, pods, &|_| true, &mut actions);
    // Ended pods count for nothing; they are cleaned up (their logs went with their node).
    // Terminating ones count for nothing either, and are their node's to finish.
    for pod in mine.iter().filter(|p| !p.is_active() && !p.deleting) {
        actions.push(Action::delete_pod(pod));
    }
    let mut active: Vec<&PodView> = mine.into_iter().filter(|p| p.is_active()).collect();
    let want = replicas(rs) as usize;
    if active.len() < want {
        for _ in 0..(want - active.len()).min(BURST) {
            actions.push(Action::Create(new_pod(rs, &name_suffix(random()))));
        }
    } else if active.len() > want {
        active.sort_by(|a, b| removal_rank(a).cmp(&removal_rank(b)));
        for pod in active.iter().take((active.len() - want).min(BURST)) {
            actions.push(Action::delete_pod(pod));
        }
    }
    actions
}

/// `pod` with its controller reference set to `owner` (adoption) or removed (release).
pub(crate) fn with_owner(pod: &Value, owner: Option<&Value>) -> Value {
    let mut pod = pod.clone();
    let mut refs: Vec<Value> = pod["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["controller"] != true)
        .collect();
    if let Some(owner) = owner {
        refs.push(controller_ref(owner));
    }
    pod["metadata"]["ownerReferences"] = json!(refs);
    pod
}

/// A new pod of `rs`: `<rs>-<suffix>` from its template.
pub fn new_pod(rs: &Value, suffix: &str) -> Value {
    let name = rs["metadata"]["name"].as_str().unwrap_or_default();
    let template = &rs["spec"]["template"];
    let mut metadata = json!({
        "name": format!("{name}-{suffix}"),
        "generateName": format!("{name}-"),
        "namespace": rs["metadata"]["namespace"],
        "labels": template["metadata"]["labels"],
        "ownerReferences": [controller_ref(rs)],
    });
    if template["metadata"]["annotations"].is_object() {
        metadata["annotations"] = template["metadata"]["annotations"].clone();
    }
    let mut spec = template["spec"].clone();
    shoal_model::validation::default_pod(&mut spec);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// The observed status of `rs` at `now_ms`: its pods counted (read time, from what their nodes
/// report); available are those ready for its `minReadySeconds`.
pub fn status(rs: &Value, pods: &[PodView], now_ms: u64) -> Value {
    let selector = selector(rs);
    let owned: Vec<&PodView> = owned(rs, pods)
        .into_iter()
        .filter(|p| p.is_active())
        .collect();
    let ready = owned.iter().filter(|p| p.ready).count();
    let min_ready_ms = super::workload::min_ready_ms(rs);
    let available = owned
        .iter()
        .filter(|p| p.is_available(min_ready_ms, now_ms))
        .count();
    let labeled = owned
        .iter()
        .filter(|p| selects(&selector, &p.labels))
        .count();
    json!({
        "observedGeneration": rs["metadata"]["generation"],
        "replicas": owned.len(),
        "fullyLabeledReplicas": labeled,
        "readyReplicas": ready,
        "availableReplicas": available,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rs(replicas: u64) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web", "namespace": "default", "uid": "rs1", "generation": 2},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
    }

    fn pod(
        name: &str,
        owner: Option<&str>,
        node: Option<&str>,
        phase: &str,
        ready: bool,
        created_s: u64,
    ) -> PodView {
        let mut meta = json!({"name": name, "namespace": "default", "uid": format!("u-{name}"),
            "labels": {"app": "web"},
            "creationTimestamp": humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000 + created_s)).to_string()});
        if let Some(owner) = owner {
            meta["ownerReferences"] = json!([{"uid": owner, "controller": true}]);
        }
        let object = json!({"metadata": meta, "spec": {"nodeName": node}});
        let status = json!({"phase": phase, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]});
        PodView::new(&object, Some(&status))
    }

    fn counter() -> impl FnMut() -> u64 {
        let mut n = 0;
        move || {
            n += 1;
            n
        }
    }

    #[test]
    fn creates_the_missing_pods_from_the_template() {
        let actions = reconcile(
            &rs(3),
            &[pod("web-a", Some("rs1"), Some("n1"), "Running", true, 1)],
            &mut counter(),
        );
        assert_eq!(actions.len(), 2);
        let Action::Create(p) = &actions[0] else {
            panic!("{actions:?}")
        };
        assert_eq!(p["metadata"]["name"], "web-cbbbb");
        assert_eq!(p["metadata"]["generateName"], "web-");
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "rs1");
        assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(p["spec"]["containers"][0]["image"], "i");
        assert!(
            reconcile(
                &rs(1),
                &[pod("web-a", Some("rs1"), Some("n1"), "Running", true, 1)],
                &mut counter()
            )
            .is_empty()
        );
    }

    #[test]
    fn a_terminating_pod_is_not_counted_nor_deleted_again() {
        let mut terminating = pod("web-a", Some("rs1"), Some("n1"), "Running", true, 1);
        terminating.deleting = true;
        let actions = reconcile(&rs(1), &[terminating], &mut counter());
        // Its replacement starts at once; the terminating pod is its node's to finish.
        assert_eq!(actions.len(), 1, "{actions:?}");
        assert!(matches!(&actions[0], Action::Create(_)), "{actions:?}");
    }

    #[test]
    fn surplus_goes_in_kubernetes_order() {
        let pods = [
            pod("old-ready", Some("rs1"), Some("n1"), "Running", true, 1),
            pod("new-ready", Some("rs1"), Some("n1"), "Running", true, 5),
            pod("not-ready", Some("rs1"), Some("n2"), "Running", false, 2),
            pod("pending", Some("rs1"), Some("n2"), "Pending", false, 3),
            pod("unbound", Some("rs1"), None, "Pending", false, 0),
        ];
        let deleted = |want: u64| -> Vec<String> {
            reconcile(&rs(want), &pods, &mut counter())
                .into_iter()
                .filter_map(|a| match a {
                    Action::Delete { name, .. } => Some(name),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(deleted(4), ["unbound"]);
        assert_eq!(deleted(2), ["unbound", "pending", "not-ready"]);
        assert_eq!(deleted(1), ["unbound", "pending", "not-ready", "new-ready"]);
        // The same input ranks the same everywhere (after a partition both sides agree).
        let mut shuffled = pods.to_vec();
        shuffled.reverse();
        let again: Vec<String> = reconcile(&rs(2), &shuffled, &mut counter())
            .into_iter()
            .filter_map(|a| match a {
                Action::Delete { name, .. } => Some(name),
                _ => None,
            })
            .collect();
        assert_eq!(again, deleted(2));
    }

    #[test]
    fn adopts_orphans_and_releases_pods_whose_labels_stop_matching() {
        let mut quarantined = pod("debug-me", Some("rs1"), Some("n1"), "Running", true, 1);
        quarantined.labels.clear();
        let orphan = pod("orphan", None, Some("n1"), "Running", true, 2);
        let foreign = pod("foreign", Some("other"), Some("n1"), "Running", true, 3);
        let actions = reconcile(&rs(2), &[quarantined, orphan, foreign], &mut counter());
        let updates: Vec<&Value> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Update(v) => Some(v),
                _ => None,
            })
            .collect();
        assert_eq!(updates.len(), 2);
        assert_eq!(updates[0]["metadata"]["name"], "debug-me");
        assert_eq!(updates[0]["metadata"]["ownerReferences"], json!([]));
        assert_eq!(updates[1]["metadata"]["name"], "orphan");
        assert_eq!(updates[1]["metadata"]["ownerReferences"][0]["uid"], "rs1");
        // One adopted, one released: one replacement for the quarantined pod.
        assert_eq!(
            actions
                .iter()
                .filter(|a| matches!(a, Action::Create(_)))
                .count(),
            1
        );
    }

    #[test]
    fn ended_pods_are_replaced_and_removed() {
        let pods = [
            pod("done", Some("rs1"), Some("n1"), "Failed", false, 1),
            pod("up", Some("rs1"), Some("n1"), "Running", true, 1),
        ];
        let actions = reconcile(&rs(2), &pods, &mut counter());
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::Delete { name, .. } if name == "done"))
        );
        assert_eq!(
            actions
                .iter()
                .filter(|a| matches!(a, Action::Create(_)))
                .count(),
            1
        );
        let s = status(&rs(2), &pods, 0);
        assert_eq!(
            (s["replicas"].as_u64(), s["readyReplicas"].as_u64()),
            (Some(1), Some(1))
        );
    }

    /// availableReplicas counts the pods ready for `minReadySeconds`; readyReplicas all ready.
    #[test]
    fn available_replicas_wait_for_min_ready_seconds() {
        let mut set = rs(2);
        set["spec"]["minReadySeconds"] = json!(10);
        let mut pods: Vec<PodView> = ["a", "b"]
            .into_iter()
            .map(|n| pod(n, Some("rs1"), Some("n1"), "Running", true, 0))
            .collect();
        pods[0].ready_changed_ms = Some(1_000);
        pods[1].ready_changed_ms = Some(8_000);
        let s = status(&set, &pods, 12_000);
        assert_eq!(
            (s["readyReplicas"].as_u64(), s["availableReplicas"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(status(&set, &pods, 18_000)["availableReplicas"], 2);
    }
}

//! The DaemonSet controller (pure): one pod per node that matches the DaemonSet's node
//! selector and affinity and tolerates its taints. A DaemonSet needs no auction, so each node
//! runs [`reconcile_node`] for itself every scheduling round (`crate::scheduling` is the shell
//! that feeds it the live nodes and writes its actions):
//!
//! - a node that fits a DaemonSet and has no pod of it claims one (`<daemonset>-<node>`, bound
//!   to itself), and a node that stops fitting (a label removed, a `NoExecute` taint the pod
//!   does not tolerate) deletes its pod — a `NoSchedule` taint keeps new pods off, not the one
//!   running, as in Kubernetes;
//! - a node deletes its own pods of DaemonSets that are gone;
//! - the DaemonSet's owner (the rendezvous owner of its uid, as for every workload) deletes
//!   its pods on nodes that left: nodes the membership no longer lists, as Kubernetes' pod
//!   garbage collector deletes the pods of a deleted Node (only pods older than
//!   [`JOIN_MARGIN_MS`]: a node that just joined may not be listed yet). A node only declared dead keeps its
//!   pod (the DaemonSet tolerates `unreachable`, as in Kubernetes) until it is forgotten
//!   (`dead-node-grace-period`) or comes back.
//!
//! When a DaemonSet's template changes, each node decides for itself whether to replace its
//! pod now, from the same view every node has, so the nodes agree without a controller:
//!
//! - `OnDelete`: never; a pod deleted by the user is claimed again from the new template.
//! - `RollingUpdate` (the default, `maxUnavailable` 1): an outdated pod that is not available
//!   is replaced at once (that costs no availability, as Kubernetes does it); otherwise the
//!   outdated nodes, in name order, replace theirs while fewer than `maxUnavailable` of the
//!   DaemonSet's nodes are unavailable — the first `maxUnavailable − unavailable` of them.
//!   Two nodes deciding from the same view pick the same ones; a view that lags (a replacement
//!   not yet seen as unavailable elsewhere) can exceed the budget for a moment.
//!
//! `maxSurge` is not honoured: a node's pod has one name (`<daemonset>-<node>`), so the new pod
//! starts after the old one is gone, as with `maxSurge: 0`.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::workload::{Action, PodView, min_ready_ms, template_hash};
use crate::placement::cluster::ClusterView;
use shoal_model::placement::{NodeView, PodRequest, Resources, TaintEffect};

/// The tolerations Kubernetes' DaemonSet controller adds to its pods: a daemon keeps running
/// on a cordoned node (`kubectl drain --ignore-daemonsets` leaves it there) and on one that
/// stopped answering.
const DAEMON_TOLERATIONS: &[(&str, &str)] = &[
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
];

/// The pod DaemonSet `ds` runs on node `node_name` (`<daemonset>-<node>`), before binding.
pub fn daemon_pod(ds: &Value, node_name: &str) -> Value {
    let ds_name = ds["metadata"]["name"].as_str().unwrap_or_default();
    let template = &ds["spec"]["template"];
    let mut spec = template["spec"].clone();
    if spec.is_object() {
        let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
        for (key, effect) in DAEMON_TOLERATIONS {
            if !tolerations
                .iter()
                .any(|t| t["key"] == *key && t["effect"] == *effect)
            {
                tolerations.push(json!({"key": key, "operator": "Exists", "effect": effect}));
            }
        }
        spec["tolerations"] = Value::Array(tolerations);
        shoal_model::validation::default_pod(&mut spec);
    }
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels[HASH_LABEL] = json!(current_hash(ds));
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{ds_name}-{node_name}"),
            "namespace": ds["metadata"]["namespace"].as_str().unwrap_or("default"),
            "labels": labels,
            "annotations": template["metadata"]["annotations"],
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds_name,
                "uid": ds["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": spec,
    })
}

/// What the scheduler's predicates read of `ds`'s pods (the same on every node: selectors,
/// affinity, tolerations, labels); None if its template is not a pod.
fn request_of(ds: &Value, node_name: &str) -> Option<PodRequest> {
    PodRequest::from_pod(&daemon_pod(ds, node_name)).ok()
}

/// Whether a DaemonSet pod (`request`) fits `node` of `cluster` (its node selector, affinity
/// and the taints it tolerates; resources are no reason to refuse a DaemonSet pod, it is the
/// node's to run).
fn fits(request: &PodRequest, node: &NodeView, cluster: &ClusterView) -> bool {
    crate::placement::predicates::check(request, node, Resources::default(), cluster).is_ok()
}

/// Whether a DaemonSet pod (`request`), already on `node`, may keep running there: as
/// [`fits`], but of the node's taints only the `NoExecute` ones count (Kubernetes'
/// `shouldContinueRunning`: a `NoSchedule` taint keeps new daemon pods off a node, not the one
/// it runs).
fn may_continue(request: &PodRequest, node: &NodeView, cluster: &ClusterView) -> bool {
    let mut node = node.clone();
    node.taints.retain(|t| t.effect == TaintEffect::NoExecute);
    fits(request, &node, cluster)
}

/// How old a DaemonSet pod must be before its node's absence from the membership counts: a
/// pod claimed by a node that just joined can reach the owner (by the store) before the node
/// does (by gossip).
pub const JOIN_MARGIN_MS: u64 = 10_000;

/// The live nodes `ds`'s pod fits, by name, sorted.
pub fn fitting_nodes(ds: &Value, cluster: &ClusterView) -> Vec<String> {
    let Some(request) = request_of(ds, "") else {
        return Vec::new();
    };
    let mut fitting: Vec<String> = cluster
        .nodes()
        .filter(|node| fits(&request, node, cluster))
        .map(|node| node.name.clone())
        .collect();
    fitting.sort_unstable();
    fitting
}

/// The uid of the DaemonSet controlling `pod`, if one does.
pub fn daemon_set_of(pod: &Value) -> Option<&str> {
    pod["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["kind"] == "DaemonSet" && r["controller"] == true)?["uid"]
        .as_str()
}

/// Whether `pod` is controlled by a DaemonSet (of any uid).
pub fn is_daemon_pod(pod: &Value) -> bool {
    daemon_set_of(pod).is_some()
}

/// What one node's round decides with.
pub struct Round<'a> {
    /// This node's name.
    pub me: &'a str,
    /// The live nodes with their labels, taints and cordons (`me` among them once it is known).
    pub cluster: &'a ClusterView,
    /// Whether the membership still lists a node of this name (alive, suspect or dead).
    pub listed: &'a dyn Fn(&str) -> bool,
    /// Whether the membership view is settled (a node that just started has not heard of
    /// every node yet, and must not take the ones it has not heard of for gone).
    pub settled: bool,
    /// Whether this node owns a DaemonSet (rendezvous over the live nodes).
    pub owns: &'a dyn Fn(&Value) -> bool,
    /// Now, ms since the epoch (a pod is available once ready for `minReadySeconds`).
    pub now_ms: u64,
}

/// What node `round.me` does about `daemon_sets` this round, given the DaemonSets' pods
/// (`pods`: every pod a DaemonSet controls, with the statuses their nodes report; other pods
/// are ignored).
pub fn reconcile_node(round: &Round, daemon_sets: &[Value], pods: &[PodView]) -> Vec<Action> {
    let mut actions = Vec::new();
    let pods: Vec<&PodView> = pods.iter().filter(|p| is_daemon_pod(&p.object)).collect();
    let live: HashSet<&str> = daemon_sets
        .iter()
        .filter_map(|d| d["metadata"]["uid"].as_str())
        .collect();
    // This node's pods of DaemonSets that are gone (claimed just before the deletion of the
    // DaemonSet arrived here).
    actions.extend(
        pods.iter()
            .filter(|p| p.node.as_deref() == Some(round.me))
            .filter(|p| {
                p.controller_uid
                    .as_deref()
                    .is_none_or(|uid| !live.contains(uid))
            })
            .map(|p| Action::delete_pod(p)),
    );
    let this = round.cluster.nodes().find(|n| n.name == round.me);
    for ds in daemon_sets {
        let uid = ds["metadata"]["uid"].as_str().unwrap_or_default();
        let namespace = ds["metadata"]["namespace"].as_str().unwrap_or("default");
        let owned: Vec<&PodView> = pods
            .iter()
            .copied()
            .filter(|p| p.controller_uid.as_deref() == Some(uid) && p.namespace == namespace)
            .collect();
        if round.settled && (round.owns)(ds) {
            actions.extend(
                owned
                    .iter()
                    .filter(|p| p.node.as_deref().is_some_and(|n| !(round.listed)(n)))
                    .filter(|p| p.created_ms.saturating_add(JOIN_MARGIN_MS) <= round.now_ms)
                    .map(|p| Action::delete_pod(p)),
            );
        }
        let Some(this) = this else { continue };
        if !ds["metadata"]["deletionTimestamp"].is_null()
            || !ds["spec"]["template"]["spec"].is_object()
        {
            continue;
        }
        let mut candidate = daemon_pod(ds, round.me);
        let name = candidate["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mine = owned.iter().find(|p| p.name == name);
        let Some(request) = request_of(ds, round.me) else {
            continue;
        };
        let fits = fits(&request, this, round.cluster);
        let may_continue = may_continue(&request, this, round.cluster);
        match mine {
            // The pod of the name is someone else's (or went elsewhere): nothing to claim.
            _ if pods_named(&pods, namespace, &name) && mine.is_none() => {}
            Some(pod) if pod.node.as_deref() != Some(round.me) => {}
            Some(pod) if !may_continue => actions.push(Action::delete_pod(pod)),
            Some(pod) => {
                let view = node_pods(&owned, min_ready_ms(ds), round.now_ms);
                let fitting = fitting_nodes(ds, round.cluster);
                if pod.labels.get(HASH_LABEL).map(String::as_str) != Some(current_hash(ds).as_str())
                    && !pod.deleting
                    && replace_now(ds, round.me, &fitting, &view)
                {
                    actions.push(Action::delete_pod(pod));
                }
            }
            None if fits => {
                candidate["spec"]["nodeName"] = json!(round.me);
                if let Some(meta) = candidate["metadata"].as_object_mut() {
                    meta.retain(|_, v| !v.is_null());
                }
                actions.push(Action::Create(candidate));
            }
            None => {}
        }
    }
    actions
}

/// Whether some pod of the DaemonSets' pods has this name (another DaemonSet's, say).
fn pods_named(pods: &[&PodView], namespace: &str, name: &str) -> bool {
    pods.iter()
        .any(|p| p.namespace == namespace && p.name == name)
}

/// A DaemonSet's pods on their nodes as every node sees them at `now_ms` (its rolling update's
/// view): available are those ready for `minReadySeconds` and not being deleted.
fn node_pods(owned: &[&PodView], min_ready_ms: u64, now_ms: u64) -> Vec<NodePod> {
    owned
        .iter()
        .filter_map(|p| {
            Some(NodePod {
                node: p.node.clone()?,
                hash: p.labels.get(HASH_LABEL).cloned(),
                available: p.is_available(min_ready_ms, now_ms) && !p.deleting,
            })
        })
        .collect()
}

/// A DaemonSet's status at `now_ms` as observed (DESIGN.md §3): the live nodes its pod fits
/// (`desiredNumberScheduled`), its pods on fitting nodes, on live nodes it no longer fits
/// (misscheduled), and the ready, available (ready for `minReadySeconds`) and updated ones,
/// from `pods` (its namespace's, with their reported statuses). A pod on a node that is not
/// live is in none of the counts.
pub fn status(ds: &Value, cluster: &ClusterView, pods: &[PodView], now_ms: u64) -> Value {
    let fitting: HashSet<String> = fitting_nodes(ds, cluster).into_iter().collect();
    let live: HashSet<&str> = cluster.nodes().map(|n| n.name.as_str()).collect();
    let uid = ds["metadata"]["uid"].as_str();
    let owned: Vec<&PodView> = pods
        .iter()
        .filter(|p| uid.is_some() && p.controller_uid.as_deref() == uid && !p.deleting)
        .filter(|p| p.node.as_deref().is_some_and(|n| live.contains(n)))
        .collect();
    let on_fitting: Vec<&&PodView> = owned
        .iter()
        .filter(|p| p.node.as_ref().is_some_and(|n| fitting.contains(n)))
        .collect();
    let ready = on_fitting.iter().filter(|p| p.ready).count();
    let min_ready_ms = min_ready_ms(ds);
    let available = on_fitting
        .iter()
        .filter(|p| p.is_available(min_ready_ms, now_ms))
        .count();
    let hash = current_hash(ds);
    let updated = on_fitting
        .iter()
        .filter(|p| p.labels.get(HASH_LABEL).is_some_and(|h| *h == hash))
        .count();
    json!({
        "observedGeneration": ds["metadata"]["generation"],
        "desiredNumberScheduled": fitting.len(),
        "currentNumberScheduled": on_fitting.len(),
        "updatedNumberScheduled": updated,
        "numberMisscheduled": owned.len() - on_fitting.len(),
        "numberReady": ready,
        "numberAvailable": available,
        "numberUnavailable": fitting.len().saturating_sub(available),
    })
}

/// The label of a DaemonSet pod naming its template (Kubernetes' `controller-revision-hash`).
pub const HASH_LABEL: &str = "controller-revision-hash";

/// The hash of `ds`'s current template.
pub fn current_hash(ds: &Value) -> String {
    template_hash(&ds["spec"]["template"])
}

/// One node's pod of the DaemonSet, as every node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    pub node: String,
    /// Its [`HASH_LABEL`] (None: a pod made before the label existed).
    pub hash: Option<String>,
    /// Ready for the DaemonSet's `minReadySeconds` and not being deleted.
    pub available: bool,
}

/// `maxUnavailable` of a RollingUpdate DaemonSet over `desired` nodes (absolute, or a percent
/// rounded up as Kubernetes does; at least 1), or None for `OnDelete`.
pub fn max_unavailable(ds: &Value, desired: usize) -> Option<usize> {
    let strategy = &ds["spec"]["updateStrategy"];
    if strategy["type"] == "OnDelete" {
        return None;
    }
    let value = &strategy["rollingUpdate"]["maxUnavailable"];
    let n = match value {
        Value::Number(n) => n.as_u64().map_or(1, |n| n as usize),
        Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<usize>().ok()) {
            Some(percent) => (desired.saturating_mul(percent.min(100))).div_ceil(100),
            None => s.parse().unwrap_or(1),
        },
        _ => 1,
    };
    Some(n.max(1))
}

/// Whether `me` replaces its pod (which exists, outdated or not) now; `fitting` are the nodes
/// the DaemonSet should run on, `pods` its pods on them.
pub fn replace_now(ds: &Value, me: &str, fitting: &[String], pods: &[NodePod]) -> bool {
    let hash = current_hash(ds);
    let outdated = |p: &NodePod| p.hash.as_deref() != Some(hash.as_str());
    let Some(mine) = pods.iter().find(|p| p.node == me) else {
        return false;
    };
    if !outdated(mine) {
        return false;
    }
    let Some(budget) = max_unavailable(ds, fitting.len()) else {
        return false;
    };
    if !mine.available {
        return true;
    }
    let unavailable = fitting
        .iter()
        .filter(|node| !pods.iter().any(|p| &p.node == *node && p.available))
        .count();
    let mut waiting: Vec<&str> = pods
        .iter()
        .filter(|p| p.available && outdated(p) && fitting.contains(&p.node))
        .map(|p| p.node.as_str())
        .collect();
    waiting.sort_unstable();
    waiting
        .iter()
        .take(budget.saturating_sub(unavailable))
        .any(|node| *node == me)
}

/// How many of `pods` run the current template (`updatedNumberScheduled`).
pub fn updated(ds: &Value, pods: &[NodePod]) -> usize {
    let hash = current_hash(ds);
    pods.iter()
        .filter(|p| p.hash.as_deref() == Some(hash.as_str()))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(strategy: Value, image: &str) -> Value {
        json!({"metadata": {"name": "agent"}, "spec": {"updateStrategy": strategy,
            "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    fn pods(old: &Value, new: &Value, states: &[(&str, bool, bool)]) -> Vec<NodePod> {
        states
            .iter()
            .map(|(node, updated, available)| NodePod {
                node: (*node).into(),
                hash: Some(current_hash(if *updated { new } else { old })),
                available: *available,
            })
            .collect()
    }

    #[test]
    fn a_rolling_update_replaces_one_node_at_a_time_in_name_order() {
        let rolling = json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}});
        let old = ds(rolling.clone(), "a");
        let new = ds(rolling, "b");
        let nodes: Vec<String> = ["n0", "n1", "n2"].map(String::from).to_vec();
        let deciders = |view: &[NodePod]| -> Vec<&str> {
            ["n0", "n1", "n2"]
                .into_iter()
                .filter(|me| replace_now(&new, me, &nodes, view))
                .collect()
        };
        // All available and outdated: only the first in name order goes.
        let view = pods(
            &old,
            &new,
            &[
                ("n0", false, true),
                ("n1", false, true),
                ("n2", false, true),
            ],
        );
        assert_eq!(deciders(&view), ["n0"]);
        // n0's replacement is not ready yet: nobody else goes.
        let view = pods(
            &old,
            &new,
            &[
                ("n0", true, false),
                ("n1", false, true),
                ("n2", false, true),
            ],
        );
        assert!(deciders(&view).is_empty());
        // n0 is gone for now (being replaced): nobody else goes either.
        let view = pods(&old, &new, &[("n1", false, true), ("n2", false, true)]);
        assert!(deciders(&view).is_empty());
        // n0 updated and ready: n1 next.
        let view = pods(
            &old,
            &new,
            &[("n0", true, true), ("n1", false, true), ("n2", false, true)],
        );
        assert_eq!(deciders(&view), ["n1"]);
        // An outdated pod that is not available anyway goes at once.
        let view = pods(
            &old,
            &new,
            &[
                ("n0", true, true),
                ("n1", false, true),
                ("n2", false, false),
            ],
        );
        assert_eq!(deciders(&view), ["n2"]);
        // Done: nothing to do.
        let view = pods(
            &old,
            &new,
            &[("n0", true, true), ("n1", true, true), ("n2", true, true)],
        );
        assert!(deciders(&view).is_empty());
        assert_eq!(updated(&new, &view), 3);
    }

    #[test]
    fn max_unavailable_in_percent_rounds_up_and_on_delete_never_replaces() {
        let percent = ds(
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%"}}),
            "a",
        );
        assert_eq!(max_unavailable(&percent, 3), Some(2));
        assert_eq!(max_unavailable(&percent, 0), Some(1));
        let defaulted = ds(Value::Null, "a");
        assert_eq!(max_unavailable(&defaulted, 10), Some(1));
        let on_delete = ds(json!({"type": "OnDelete"}), "b");
        let old = ds(json!({"type": "OnDelete"}), "a");
        let nodes = vec!["n0".to_owned()];
        let view = pods(&old, &on_delete, &[("n0", false, true)]);
        assert!(!replace_now(&on_delete, "n0", &nodes, &view));
        // Two at a time with 50% of 3 nodes (rounded up to 2).
        let new = ds(
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%"}}),
            "b",
        );
        let nodes: Vec<String> = ["n0", "n1", "n2"].map(String::from).to_vec();
        let view = pods(
            &percent,
            &new,
            &[
                ("n0", false, true),
                ("n1", false, true),
                ("n2", false, true),
            ],
        );
        let going: Vec<&str> = ["n0", "n1", "n2"]
            .into_iter()
            .filter(|me| replace_now(&new, me, &nodes, &view))
            .collect();
        assert_eq!(going, ["n0", "n1"]);
    }

    use shoal_model::placement::{NodeView, Taint, TaintEffect};

    const NOW: u64 = 1_800_000_000_000;

    /// A node of a test cluster: its name, labels and whether it has a `dedicated` taint.
    type TestNode<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);

    fn cluster(nodes: &[TestNode]) -> ClusterView {
        let mut cluster = ClusterView::default();
        for (i, (name, labels, tainted)) in nodes.iter().enumerate() {
            cluster.add_node(NodeView {
                id: i as u64 + 1,
                name: (*name).into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
                taints: if *tainted {
                    vec![Taint {
                        key: "dedicated".into(),
                        value: "db".into(),
                        effect: TaintEffect::NoSchedule,
                    }]
                } else {
                    Vec::new()
                },
                allocatable: Resources::new(1000, 1 << 30, 110),
                volume_bytes: None,
            });
        }
        cluster
    }

    fn daemon_set(uid: &str, selector: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "default", "uid": uid, "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}},
                    "spec": {"nodeSelector": selector,
                        "containers": [{"name": "c", "image": "i"}]}}}})
    }

    /// `ds`'s pod on `node`, as stored once claimed, with its node's report.
    fn claimed(ds: &Value, node: &str, ready: bool) -> PodView {
        let mut object = daemon_pod(ds, node);
        object["metadata"]["uid"] = json!(format!("pod-{node}"));
        object["spec"]["nodeName"] = json!(node);
        let status = json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]});
        PodView::new(&object, Some(&status))
    }

    /// Actions as (verb, pod name) pairs.
    fn summary(actions: &[Action]) -> Vec<(&'static str, String)> {
        actions
            .iter()
            .map(|a| match a {
                Action::Create(pod) => {
                    assert!(pod["spec"]["nodeName"].as_str().is_some());
                    (
                        "create",
                        pod["metadata"]["name"].as_str().unwrap().to_owned(),
                    )
                }
                Action::Delete { name, .. } => ("delete", name.clone()),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    fn round<'a>(
        me: &'a str,
        cluster: &'a ClusterView,
        listed: &'a dyn Fn(&str) -> bool,
        owns: &'a dyn Fn(&Value) -> bool,
    ) -> Round<'a> {
        Round {
            me,
            cluster,
            listed,
            settled: true,
            owns,
            now_ms: NOW,
        }
    }

    /// Each node claims its own pod where the DaemonSet's node selector and the node's taints
    /// allow, keeps it while they do, deletes it when they stop, and a cordoned node keeps its
    /// daemon (the added tolerations).
    #[test]
    fn a_node_claims_keeps_and_releases_its_own_pod() {
        let ds = daemon_set("ds1", json!({"disk": "ssd"}));
        let listed = |_: &str| true;
        let owns_none = |_: &Value| false;
        let nodes = cluster(&[
            ("n0", &[("disk", "ssd")], false),
            ("n1", &[("disk", "hdd")], false),
            ("n2", &[("disk", "ssd")], true),
        ]);
        let decide = |me: &str, pods: &[PodView]| {
            summary(&reconcile_node(
                &round(me, &nodes, &listed, &owns_none),
                std::slice::from_ref(&ds),
                pods,
            ))
        };
        // Fits: claims `<ds>-<node>`, bound to itself.
        assert_eq!(decide("n0", &[]), [("create", "agent-n0".to_owned())]);
        let created = reconcile_node(
            &round("n0", &nodes, &listed, &owns_none),
            std::slice::from_ref(&ds),
            &[],
        );
        let Action::Create(pod) = &created[0] else {
            panic!()
        };
        assert_eq!(pod["spec"]["nodeName"], "n0");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "ds1");
        assert_eq!(pod["metadata"]["labels"][HASH_LABEL], current_hash(&ds));
        // The node selector does not match, or a taint is not tolerated: nothing.
        assert!(decide("n1", &[]).is_empty());
        assert!(decide("n2", &[]).is_empty());
        // Claimed and still fitting: kept (also while other nodes' pods exist).
        let pods = vec![claimed(&ds, "n0", true), claimed(&ds, "n1", true)];
        assert!(decide("n0", &pods).is_empty());
        // n1 stopped fitting (its label changed): it deletes its own pod, nobody else does.
        assert_eq!(decide("n1", &pods), [("delete", "agent-n1".to_owned())]);
        // A NoSchedule taint the pod does not tolerate keeps new pods off, not the running one;
        // a NoExecute one removes it.
        let on_n2 = vec![claimed(&ds, "n2", true)];
        assert!(decide("n2", &on_n2).is_empty());
        let mut evicting = cluster(&[("n2", &[("disk", "ssd")], false)]);
        let mut node = evicting.nodes().next().unwrap().clone();
        node.taints.push(Taint {
            key: "dedicated".into(),
            value: "db".into(),
            effect: TaintEffect::NoExecute,
        });
        evicting.add_node(node);
        let actions = reconcile_node(
            &round("n2", &evicting, &listed, &owns_none),
            std::slice::from_ref(&ds),
            &on_n2,
        );
        assert_eq!(summary(&actions), [("delete", "agent-n2".to_owned())]);
        // A cordoned node keeps its daemon and a new one claims there.
        let mut cordoned = cluster(&[("n0", &[("disk", "ssd")], false)]);
        let mut node = cordoned.nodes().next().unwrap().clone();
        node.taints.push(Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        });
        cordoned.add_node(node);
        let actions = reconcile_node(
            &round("n0", &cordoned, &listed, &owns_none),
            std::slice::from_ref(&ds),
            &[],
        );
        assert_eq!(summary(&actions), [("create", "agent-n0".to_owned())]);
        // A node not yet in the live view claims nothing.
        assert!(decide("n9", &[]).is_empty());
    }

    /// Pods of a DaemonSet that is gone go from their own node; pods on nodes that left the
    /// membership go by the DaemonSet's owner alone, and only once the view is settled; a node
    /// only declared dead (still listed) keeps its pod.
    #[test]
    fn pods_of_gone_daemon_sets_and_of_nodes_that_left_are_deleted() {
        let ds = daemon_set("ds1", Value::Null);
        let nodes = cluster(&[("n0", &[], false), ("n1", &[], false)]);
        let pods = vec![
            claimed(&ds, "n0", true),
            claimed(&ds, "n1", true),
            claimed(&ds, "n2", true),
        ];
        let owns = |_: &Value| true;
        let owns_none = |_: &Value| false;
        let all_listed = |_: &str| true;
        let n2_left = |n: &str| n != "n2";
        // n2 is dead but listed: its pod stays.
        let r = round("n0", &nodes, &all_listed, &owns);
        assert!(reconcile_node(&r, std::slice::from_ref(&ds), &pods).is_empty());
        // n2 left: the owner deletes its pod, another node does not.
        let r = round("n0", &nodes, &n2_left, &owns);
        assert_eq!(
            summary(&reconcile_node(&r, std::slice::from_ref(&ds), &pods)),
            [("delete", "agent-n2".to_owned())]
        );
        let r = round("n1", &nodes, &n2_left, &owns_none);
        assert!(reconcile_node(&r, std::slice::from_ref(&ds), &pods).is_empty());
        // A pod claimed moments ago by a node not listed yet (it just joined) stays.
        let mut young = pods.clone();
        young[2].created_ms = NOW - 1_000;
        let r = round("n0", &nodes, &n2_left, &owns);
        assert!(reconcile_node(&r, std::slice::from_ref(&ds), &young).is_empty());
        // An unsettled view judges nobody gone.
        let mut r = round("n0", &nodes, &n2_left, &owns);
        r.settled = false;
        assert!(reconcile_node(&r, std::slice::from_ref(&ds), &pods).is_empty());
        // The DaemonSet is gone: each node deletes its own pod only.
        let r = round("n1", &nodes, &all_listed, &owns);
        assert_eq!(
            summary(&reconcile_node(&r, &[], &pods)),
            [("delete", "agent-n1".to_owned())]
        );
        // Pods no DaemonSet controls are none of this controller's business.
        let mut bare = claimed(&ds, "n1", true);
        bare.object["metadata"]["ownerReferences"] = json!([]);
        bare.controller_uid = None;
        assert!(reconcile_node(&r, &[], &[bare]).is_empty());
        // A DaemonSet being deleted claims nothing new.
        let mut deleting = ds.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let r = round("n0", &nodes, &all_listed, &owns_none);
        assert!(reconcile_node(&r, &[deleting], &[]).is_empty());
    }

    /// A template change replaces this node's outdated pod when the rolling update lets it go
    /// ([`replace_now`]), and never a pod already being deleted.
    #[test]
    fn an_outdated_pod_is_replaced_when_the_rolling_update_lets_its_node_go() {
        let old = daemon_set("ds1", Value::Null);
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("j");
        let nodes = cluster(&[("n0", &[], false), ("n1", &[], false)]);
        let listed = |_: &str| true;
        let owns_none = |_: &Value| false;
        let pods = vec![claimed(&old, "n0", true), claimed(&old, "n1", true)];
        let decide = |me: &str, pods: &[PodView]| {
            summary(&reconcile_node(
                &round(me, &nodes, &listed, &owns_none),
                std::slice::from_ref(&new),
                pods,
            ))
        };
        assert_eq!(decide("n0", &pods), [("delete", "agent-n0".to_owned())]);
        assert!(decide("n1", &pods).is_empty());
        let mut going = pods.clone();
        going[0].deleting = true;
        assert!(decide("n0", &going).is_empty());
        assert!(
            decide("n1", &going).is_empty(),
            "n0 is unavailable meanwhile"
        );
    }

    /// Status counts over the live nodes: desired are the fitting ones, misscheduled the live
    /// nodes it no longer fits, and a pod on a node that is not live counts nowhere.
    #[test]
    fn status_counts_fitting_misscheduled_ready_and_updated_pods() {
        let ds = daemon_set("ds1", json!({"disk": "ssd"}));
        let nodes = cluster(&[
            ("n0", &[("disk", "ssd")], false),
            ("n1", &[("disk", "ssd")], false),
            ("n2", &[("disk", "hdd")], false),
        ]);
        let mut old = ds.clone();
        old["spec"]["template"]["spec"]["containers"][0]["image"] = json!("old");
        let pods = vec![
            claimed(&ds, "n0", true),
            claimed(&old, "n1", false),
            claimed(&ds, "n2", true),
            claimed(&ds, "gone", true),
        ];
        let s = status(&ds, &nodes, &pods, 0);
        assert_eq!(s["desiredNumberScheduled"], 2);
        assert_eq!(s["currentNumberScheduled"], 2);
        assert_eq!(s["numberMisscheduled"], 1);
        assert_eq!(s["numberReady"], 1);
        assert_eq!(s["updatedNumberScheduled"], 1);
        assert_eq!(s["numberUnavailable"], 1);
        // minReadySeconds: n0's pod, ready since 10 s, is available from 40 s on.
        let mut slow = ds.clone();
        slow["spec"]["minReadySeconds"] = json!(30);
        let mut pods = pods;
        pods[0].ready_changed_ms = Some(10_000);
        let s = status(&slow, &nodes, &pods, 39_999);
        assert_eq!(
            (s["numberReady"].as_u64(), s["numberAvailable"].as_u64()),
            (Some(1), Some(0))
        );
        assert_eq!(status(&slow, &nodes, &pods, 40_000)["numberAvailable"], 1);
    }
}

//! DaemonSet updates (pure). Each node claims its own DaemonSet pods (`crate::scheduling`);
//! when a DaemonSet's template changes, each node decides for itself whether to replace its
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

use serde_json::Value;

use super::workload::template_hash;

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
    /// Ready and not being deleted.
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
}

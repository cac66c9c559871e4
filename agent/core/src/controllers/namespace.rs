//! Namespaces as in Kubernetes (pure): the built-in namespaces exist from the cluster's start,
//! every live namespace has a `default` ServiceAccount, and a namespace being deleted (`deletionTimestamp` set: phase `Terminating`) has everything
//! in it deleted, then itself — level-triggered, so an owner that dies midway is replaced and
//! the next one carries on.

use serde_json::{Value, json};
use shoal_state::ObjectKey;

/// Namespaces every cluster has; they cannot be deleted (`kube-node-lease` can, as in
/// Kubernetes, and is created again).
pub const BUILT_IN: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];
/// Of those, the ones the apiserver refuses to delete.
pub const UNDELETABLE: &[&str] = &["default", "kube-system", "kube-public"];

/// Set when a namespace's deletion is asked for: when it was asked (the API shows it as the
/// namespace's `deletionTimestamp`, which the store keeps for deleted objects only).
pub const DELETION_ANNOTATION: &str = "shoal.io/deletion-requested";

/// When a namespace's deletion was asked for, if it was.
pub fn deletion_requested(namespace: &Value) -> Option<&str> {
    namespace["metadata"]["annotations"][DELETION_ANNOTATION]
        .as_str()
        .or_else(|| namespace["metadata"]["deletionTimestamp"].as_str())
}

/// Whether a stored Namespace is being deleted.
pub fn terminating(namespace: &Value) -> bool {
    deletion_requested(namespace).is_some()
}

/// What a deleted namespace needs next: its contents deleted (all of them, at once), or, once
/// nothing is left in it, itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finalize {
    /// Delete these objects (key and the uid seen).
    Contents(Vec<(ObjectKey, String)>),
    /// Nothing is left: delete the namespace (its uid).
    Namespace(String),
    /// Not being deleted.
    Nothing,
}

pub fn finalize(namespace: &Value, contents: Vec<(ObjectKey, String)>) -> Finalize {
    if !terminating(namespace) {
        return Finalize::Nothing;
    }
    if contents.is_empty() {
        Finalize::Namespace(
            namespace["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    } else {
        Finalize::Contents(contents)
    }
}

/// The built-in namespaces missing from `stored` (names of the stored Namespaces), as objects.
pub fn missing_built_ins(stored: &[String]) -> Vec<Value> {
    BUILT_IN
        .iter()
        .filter(|n| !stored.iter().any(|s| s == *n))
        .map(|n| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}))
        .collect()
}

/// The `default` ServiceAccounts missing from the live namespaces (as the ServiceAccount
/// controller makes them): `namespaces` are stored Namespaces, `accounts` the (namespace,
/// name) of stored ServiceAccounts. A namespace being deleted gets none.
pub fn missing_default_accounts(namespaces: &[Value], accounts: &[(String, String)]) -> Vec<Value> {
    missing_in_each(namespaces, accounts, "default", |ns| {
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "default", "namespace": ns}})
    })
}

/// The name of the ConfigMap holding the cluster's CA in every namespace (upstream's
/// root-ca-cert-publisher's): what a pod's service-account volume projects as `ca.crt`.
pub const ROOT_CA: &str = "kube-root-ca.crt";

/// The `kube-root-ca.crt` ConfigMaps missing from the live namespaces, holding `ca_pem`
/// (`config_maps`: the (namespace, name) of stored ConfigMaps).
pub fn missing_root_ca(
    namespaces: &[Value],
    config_maps: &[(String, String)],
    ca_pem: &str,
) -> Vec<Value> {
    missing_in_each(namespaces, config_maps, ROOT_CA, |ns| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": ROOT_CA, "namespace": ns, "annotations": {
                   "kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
               "data": {"ca.crt": ca_pem}})
    })
}

/// What `make` gives each live namespace that has no object named `name` among `present`
/// ((namespace, name) pairs of the kind).
fn missing_in_each(
    namespaces: &[Value],
    present: &[(String, String)],
    name: &str,
    make: impl Fn(&str) -> Value,
) -> Vec<Value> {
    namespaces
        .iter()
        .filter(|n| !terminating(n))
        .filter_map(|n| n["metadata"]["name"].as_str())
        .filter(|ns| !present.iter().any(|(p_ns, p)| p_ns == ns && p == name))
        .map(make)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(
            shoal_state::kind::lookup("v1", "ConfigMap").unwrap(),
            "team",
            name,
        )
    }

    #[test]
    fn a_deleted_namespace_is_emptied_then_deleted_and_a_live_one_is_left_alone() {
        let live = json!({"metadata": {"name": "team", "uid": "u1"}});
        assert_eq!(
            finalize(&live, vec![(key("a"), "x".into())]),
            Finalize::Nothing
        );
        let deleted = json!({"metadata": {"name": "team", "uid": "u1", "annotations": {DELETION_ANNOTATION: "2026-12-01T22:00:00Z"}}});
        assert_eq!(
            finalize(&deleted, vec![(key("a"), "x".into())]),
            Finalize::Contents(vec![(key("a"), "x".into())])
        );
        assert_eq!(finalize(&deleted, vec![]), Finalize::Namespace("u1".into()));
    }

    #[test]
    fn live_namespaces_get_a_default_service_account_and_the_root_ca() {
        let namespaces = [
            json!({"metadata": {"name": "team"}}),
            json!({"metadata": {"name": "done"}}),
            json!({"metadata": {"name": "going", "annotations": {DELETION_ANNOTATION: "2026-12-01T22:00:00Z"}}}),
        ];
        let accounts = [
            ("done".to_owned(), "default".to_owned()),
            ("team".to_owned(), "builder".to_owned()),
        ];
        let made = missing_default_accounts(&namespaces, &accounts);
        assert_eq!(made.len(), 1, "{made:?}");
        assert_eq!(made[0]["metadata"]["namespace"], "team");
        assert_eq!(made[0]["metadata"]["name"], "default");
        let maps = vec![("done".to_owned(), ROOT_CA.to_owned())];
        let made = missing_root_ca(&namespaces, &maps, "PEM");
        assert_eq!(made.len(), 1, "{made:?}");
        assert_eq!(made[0]["metadata"]["namespace"], "team");
        assert_eq!(made[0]["data"]["ca.crt"], "PEM");
    }

    #[test]
    fn missing_built_in_namespaces_are_created() {
        let made = missing_built_ins(&["default".into(), "team".into()]);
        let names: Vec<&str> = made
            .iter()
            .map(|n| n["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["kube-system", "kube-public", "kube-node-lease"]);
        assert!(
            missing_built_ins(&BUILT_IN.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .is_empty()
        );
    }
}

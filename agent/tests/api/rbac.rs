//! Who may do what (issue #40) with real kubectl: the default roles a cluster starts with,
//! RBAC deciding every request of a user outside `system:masters` (reached here through
//! impersonation, `kubectl --as`), `kubectl auth can-i` and `kubectl auth whoami`, and the
//! apiserver's 403.

use shoal_chaos::testkit::wait_until;

use super::ApiLab;

const JANE: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: default}
rules:
- apiGroups: [""]
  resources: [pods, pods/log]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: jane-reads-pods, namespace: default}
subjects:
- {kind: User, name: jane, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: Role, name: pod-reader, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ops-view}
subjects:
- {kind: Group, name: ops, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: view, apiGroup: rbac.authorization.k8s.io}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_decides_what_each_user_may_do_and_kubectl_auth_tells() {
    let api = ApiLab::start(2).await;
    // The default roles, made at the cluster's start.
    let mut roles = String::new();
    wait_until("the default ClusterRoles", super::CONVERGE, || {
        roles = api.kubectl(1, &["get", "clusterroles"]).1;
        let ok = ["cluster-admin", "admin", "edit", "view", "system:discovery"]
            .iter()
            .all(|r| {
                roles
                    .lines()
                    .any(|l| l.split_whitespace().next() == Some(r))
            });
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {roles}"));
    let bindings = api.ok(0, &["get", "clusterrolebindings", "-o", "wide"]);
    assert!(
        bindings.contains("ClusterRole/cluster-admin") && bindings.contains("system:masters"),
        "{bindings}"
    );

    // The token's holder is the administrator.
    let whoami = api.ok(0, &["auth", "whoami"]);
    assert!(
        whoami.contains("shoal-admin") && whoami.contains("system:masters"),
        "{whoami}"
    );
    assert_eq!(
        api.ok(0, &["auth", "can-i", "delete", "nodes"]).trim(),
        "yes"
    );

    // jane, impersonated: nothing yet but discovery and self-review.
    let (ok, out, _) = api.kubectl(0, &["auth", "can-i", "list", "pods", "--as", "jane"]);
    assert!(!ok && out.trim() == "no", "{out}");
    let (ok, _, err) = api.kubectl(1, &["get", "pods", "--as", "jane"]);
    assert!(
        !ok && err.contains(
            "pods is forbidden: User \"jane\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
        ),
        "{err}"
    );
    let whoami = api.ok(1, &["auth", "whoami", "--as", "jane", "--as-group", "ops"]);
    assert!(
        whoami.contains("jane") && whoami.contains("ops"),
        "{whoami}"
    );

    // A Role and its binding, as upstream manifests write them.
    let file = api.manifest("jane.yaml", JANE);
    api.ok(0, &["apply", "-f", &file]);
    let table = api.ok(1, &["get", "rolebindings"]);
    assert!(table.contains("Role/pod-reader"), "{table}");
    let can = |agent: usize, args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        api.kubectl(agent, &all).1.trim() == "yes"
    };
    wait_until("jane may list pods", super::CONVERGE, || {
        let ok = can(1, &["list", "pods", "--as", "jane"]);
        async move { ok }
    })
    .await
    .unwrap();
    api.ok(1, &["get", "pods", "--as", "jane"]);
    // What jane may do here, listed (SelfSubjectRulesReview).
    let list = api.ok(0, &["auth", "can-i", "--list", "--as", "jane"]);
    assert!(
        list.lines()
            .any(|l| l.starts_with("pods ") && l.contains("[get list watch]")),
        "{list}"
    );
    assert!(can(0, &["get", "pods/log", "--as", "jane"]));
    assert!(!can(0, &["delete", "pods", "--as", "jane"]));
    assert!(!can(
        0,
        &["list", "pods", "-n", "kube-system", "--as", "jane"]
    ));
    assert!(!can(0, &["list", "secrets", "--as", "jane"]));
    let (ok, _, err) = api.kubectl(0, &["get", "pods", "-n", "kube-system", "--as", "jane"]);
    assert!(!ok && err.contains("forbidden"), "{err}");

    // A group bound to the aggregated `view` role: reads workloads everywhere, no secrets,
    // no writes.
    let sam = ["--as", "sam", "--as-group", "ops"];
    fn with<'a>(args: &[&'a str], sam: &[&'a str]) -> Vec<&'a str> {
        args.iter().chain(sam).copied().collect()
    }
    api.ok(0, &with(&["get", "deployments", "-A"], &sam));
    assert!(!can(0, &with(&["get", "secrets"], &sam)));
    assert!(!can(0, &with(&["create", "deployments"], &sam)));
    let (ok, _, err) = api.kubectl(
        0,
        &with(
            &["create", "configmap", "nope", "--from-literal", "a=b"],
            &sam,
        ),
    );
    assert!(
        !ok && err.contains("cannot create resource \"configmaps\""),
        "{err}"
    );

    // A binding's role cannot change; delete it and jane loses the pods again.
    let (ok, _, err) = api.kubectl(
        0,
        &[
            "patch",
            "rolebinding",
            "jane-reads-pods",
            "--type=merge",
            "-p",
            r#"{"roleRef":{"name":"other"}}"#,
        ],
    );
    let now = api.ok(0, &["get", "rolebinding", "jane-reads-pods", "-o", "yaml"]);
    assert!(
        !ok && err.contains("cannot change roleRef"),
        "{ok} {err} {now}"
    );
    api.ok(0, &["delete", "rolebinding", "jane-reads-pods"]);
    wait_until("jane may no longer list pods", super::CONVERGE, || {
        let ok = !can(1, &["list", "pods", "--as", "jane"]);
        async move { ok }
    })
    .await
    .unwrap();

    // kubectl's typed generator (a protobuf body), as README shows it.
    api.ok(
        0,
        &[
            "create",
            "rolebinding",
            "jane-view",
            "--clusterrole",
            "view",
            "--user",
            "jane",
        ],
    );
    wait_until("jane may view", super::CONVERGE, || {
        let ok = can(1, &["list", "deployments", "--as", "jane"]);
        async move { ok }
    })
    .await
    .unwrap();
    let (ok, _, err) = api.kubectl(1, &["get", "secrets", "--as", "jane"]);
    assert!(
        !ok && err.contains("cannot list resource \"secrets\""),
        "{err}"
    );

    // Escalation prevention: jane may now manage bindings in this namespace (admin's rules),
    // but may not grant what she does not hold.
    api.ok(
        0,
        &[
            "create",
            "rolebinding",
            "jane-admin",
            "--clusterrole",
            "admin",
            "--user",
            "jane",
        ],
    );
    wait_until("jane may create rolebindings", super::CONVERGE, || {
        let ok = can(1, &["create", "rolebindings", "--as", "jane"]);
        async move { ok }
    })
    .await
    .unwrap();
    let (ok, _, err) = api.kubectl(
        1,
        &[
            "create",
            "rolebinding",
            "eve-root",
            "--clusterrole",
            "cluster-admin",
            "--user",
            "eve",
            "--as",
            "jane",
        ],
    );
    assert!(
        !ok && err.contains("is attempting to grant RBAC permissions not currently held"),
        "{err}"
    );
    api.ok(
        1,
        &[
            "create",
            "rolebinding",
            "eve-view",
            "--clusterrole",
            "view",
            "--user",
            "eve",
            "--as",
            "jane",
        ],
    );
}

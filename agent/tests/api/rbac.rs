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
    // Agent 1 keeps an audit log.
    let audit_dir = tempfile::tempdir().unwrap();
    let audit = audit_dir.path().join("audit.log");
    let audit_flag = audit.to_str().unwrap().to_owned();
    let api = ApiLab::start_with(2, |i| {
        if i == 1 {
            vec!["--audit-log-path".into(), audit_flag.clone()]
        } else {
            Vec::new()
        }
    })
    .await;
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

    pod_security(&api);

    // The audit log: jane's refused list, as upstream's log backend writes it.
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let refused = events
        .iter()
        .find(|e| {
            e["impersonatedUser"]["username"] == "jane"
                && e["verb"] == "list"
                && e["objectRef"]["resource"] == "pods"
        })
        .unwrap_or_else(|| panic!("no audit event of jane's list: {events:?}"));
    assert_eq!(refused["responseStatus"]["code"], 403, "{refused}");
    assert_eq!(refused["user"]["username"], "shoal-admin", "{refused}");
    assert_eq!(
        refused["sourceIPs"],
        serde_json::json!(["127.0.0.1"]),
        "{refused}"
    );
    assert!(
        events
            .iter()
            .all(|e| !e.to_string().contains(&api_token(&api))),
        "a credential reached the audit log"
    );
}

/// The administrator's bearer token, from agent 0's kubeconfig.
fn api_token(api: &ApiLab) -> String {
    let text = std::fs::read_to_string(&api.kubeconfigs[0]).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap()
        .trim()
        .to_owned()
}

/// Pod Security admission, on the same cluster: a namespace's `enforce` level refuses a pod
/// with upstream's message, its `warn` level warns (kubectl prints the `Warning` header), and
/// a workload whose pods would be refused warns its writer.
fn pod_security(api: &ApiLab) {
    let namespaces = api.manifest(
        "pss-namespaces.yaml",
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: locked
  labels: {pod-security.kubernetes.io/enforce: restricted}
---
apiVersion: v1
kind: Namespace
metadata:
  name: watched
  labels: {pod-security.kubernetes.io/warn: baseline}
"#,
    );
    api.ok(0, &["apply", "-f", &namespaces]);
    let host_path = |ns: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: h, namespace: {ns}}}\nspec:\n  hostNetwork: true\n  containers: [{{name: c, image: shoal.local/busybox:1}}]\n  volumes: [{{name: h, hostPath: {{path: /etc}}}}]\n"
        )
    };
    let locked = api.manifest("pss-locked.yaml", &host_path("locked"));
    let (ok, _, err) = api.kubectl(1, &["create", "-f", &locked]);
    assert!(
        !ok && err.contains("pods \"h\" is forbidden: violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"c\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities")
            && err.contains("host namespaces (hostNetwork=true), restricted volume types (volume \"h\" uses restricted volume type \"hostPath\"), runAsNonRoot != true"),
        "{err}"
    );
    let watched = api.manifest("pss-watched.yaml", &host_path("watched"));
    let (ok, _, err) = api.kubectl(1, &["create", "-f", &watched]);
    assert!(
        ok && err.contains("Warning: would violate PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true), hostPath volumes (volume \"h\")"),
        "{err}"
    );
    let (ok, _, err) = api.kubectl(
        0,
        &[
            "create",
            "deployment",
            "web",
            "-n",
            "locked",
            "--image",
            "shoal.local/busybox:1",
        ],
    );
    assert!(
        ok && err.contains("Warning: would violate PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false"),
        "{err}"
    );
}

//! Service-account tokens (issue #40) with real kubectl: `kubectl create token` on one agent,
//! the token used on another (every agent verifies every agent's tokens through the keys they
//! publish), RBAC deciding what the account may do, `TokenReview`, OIDC discovery, and tokens
//! refused once what they are bound to is gone.

use serde_json::Value;
use shoal_chaos::testkit::wait_until;

use super::ApiLab;

const BOT: &str = r#"apiVersion: v1
kind: ServiceAccount
metadata: {name: bot, namespace: default}
---
apiVersion: v1
kind: Pod
metadata: {name: holder, namespace: default}
spec:
  containers:
  - {name: c, image: shoal.local/absent:1}
"#;

const BOT_VIEWS: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bot-views, namespace: default}
subjects:
- {kind: ServiceAccount, name: bot, namespace: default}
roleRef: {kind: ClusterRole, name: view, apiGroup: rbac.authorization.k8s.io}
"#;

/// What the API answers `kubectl --token token args` on agent `i`.
fn with_token(api: &ApiLab, i: usize, token: &str, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["--token", token];
    all.extend_from_slice(args);
    api.kubectl(i, &all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_authenticate_their_account_until_it_goes() {
    let api = ApiLab::start(2).await;
    let file = api.manifest("bot.yaml", BOT);
    api.ok(0, &["apply", "-f", &file]);

    // Issued on agent 0, accepted on agent 1 once its key reached there.
    let token = api.ok(0, &["create", "token", "bot"]).trim().to_owned();
    assert_eq!(token.split('.').count(), 3, "{token}");
    let mut whoami = String::new();
    wait_until("agent 1 accepts agent 0's token", super::CONVERGE, || {
        let (ok, out, _) = with_token(&api, 1, &token, &["auth", "whoami"]);
        whoami = out;
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {whoami}"));
    assert!(
        whoami.contains("system:serviceaccount:default:bot")
            && whoami.contains("system:serviceaccounts:default"),
        "{whoami}"
    );

    // RBAC: nothing until a binding, then what `view` allows and no more.
    let (ok, _, err) = with_token(&api, 1, &token, &["get", "pods"]);
    assert!(
        !ok && err
            .contains("User \"system:serviceaccount:default:bot\" cannot list resource \"pods\""),
        "{err}"
    );
    let binding = api.manifest("bot-views.yaml", BOT_VIEWS);
    api.ok(0, &["apply", "-f", &binding]);
    wait_until("the binding reaches agent 1", super::CONVERGE, || {
        let ok = with_token(&api, 1, &token, &["get", "pods"]).0;
        async move { ok }
    })
    .await
    .unwrap();
    let (ok, _, err) = with_token(&api, 1, &token, &["create", "secret", "generic", "x"]);
    assert!(
        !ok && err.contains("cannot create resource \"secrets\""),
        "{err}"
    );

    // TokenReview (as the administrator) and OIDC discovery.
    let review = api.manifest(
        "review.json",
        &serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token}})
        .to_string(),
    );
    let reviewed: Value = serde_json::from_str(&api.ok(
        1,
        &[
            "create",
            "--raw",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            "-f",
            &review,
        ],
    ))
    .unwrap();
    assert_eq!(reviewed["status"]["authenticated"], true, "{reviewed}");
    assert_eq!(
        reviewed["status"]["user"]["username"],
        "system:serviceaccount:default:bot"
    );
    let discovery: Value =
        serde_json::from_str(&api.ok(0, &["get", "--raw", "/.well-known/openid-configuration"]))
            .unwrap();
    assert_eq!(
        discovery["issuer"], "https://kubernetes.default.svc.cluster.local",
        "{discovery}"
    );
    let mut keys = Value::Null;
    wait_until("both agents' keys in the JWKS", super::CONVERGE, || {
        keys = serde_json::from_str(&api.ok(1, &["get", "--raw", "/openid/v1/jwks"]))
            .unwrap_or(Value::Null);
        let n = keys["keys"].as_array().map_or(0, Vec::len);
        async move { n == 2 }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {keys}"));
    // A ServiceAccount may read the discovery documents (upstream's default binding).
    assert!(with_token(&api, 0, &token, &["get", "--raw", "/openid/v1/jwks"]).0);

    // Lifetimes as upstream's; a forged token is a bare 401.
    let (ok, _, err) = api.kubectl(0, &["create", "token", "bot", "--duration", "5m"]);
    assert!(
        !ok && err.contains("may not specify a duration less than 10 minutes"),
        "{err}"
    );
    let mut forged: Vec<&str> = token.split('.').collect();
    forged[2] = "AAAA";
    let (ok, _, err) = with_token(&api, 0, &forged.join("."), &["get", "pods"]);
    assert!(!ok && err.contains("Unauthorized"), "{err}");

    // Bound to a pod: refused once the pod is gone.
    let bound = api
        .ok(
            1,
            &[
                "create",
                "token",
                "bot",
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                "holder",
            ],
        )
        .trim()
        .to_owned();
    assert!(with_token(&api, 0, &bound, &["get", "pods"]).0);
    let (ok, _, err) = api.kubectl(
        0,
        &[
            "create",
            "token",
            "bot",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "nope",
        ],
    );
    assert!(!ok && err.contains("not found"), "{err}");
    api.ok(
        0,
        &["delete", "pod", "holder", "--grace-period", "0", "--force"],
    );
    wait_until("the pod-bound token refused", super::CONVERGE, || {
        let (ok, _, err) = with_token(&api, 0, &bound, &["get", "pods"]);
        async move { !ok && err.contains("Unauthorized") }
    })
    .await
    .unwrap();
    assert!(with_token(&api, 0, &token, &["get", "pods"]).0);

    // And every token of the account once the account is gone (a new one of the same name
    // does not revive them).
    api.ok(0, &["delete", "serviceaccount", "bot"]);
    api.ok(0, &["create", "serviceaccount", "bot"]);
    wait_until("the account's token refused", super::CONVERGE, || {
        let (ok, _, err) = with_token(&api, 1, &token, &["get", "pods"]);
        async move { !ok && err.contains("Unauthorized") }
    })
    .await
    .unwrap();
}

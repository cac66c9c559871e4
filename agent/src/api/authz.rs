//! Who a request is and whether it may do what it asks (issue #40): the shell of
//! `shoal_model::rbac`. The cluster's admin token authenticates the administrator (group
//! `system:masters`, allowed everything, as upstream's privileged group); an administrator may
//! act as another user with the `Impersonate-User` and `Impersonate-Group` headers
//! (`kubectl --as jane --as-group ops`), and anyone may who holds the `impersonate` verb on
//! `users`/`groups`/`serviceaccounts`. Every request of a user outside `system:masters` is
//! authorized by RBAC against the stored roles and bindings, with the apiserver's 403.
//! `SelfSubjectAccessReview` (`kubectl auth can-i`), `SelfSubjectRulesReview`
//! (`kubectl auth can-i --list`) and `SelfSubjectReview` (`kubectl auth whoami`) answer for the
//! requester.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use shoal_model::rbac::{self, Attributes, Decision, Policy, User};

use super::ApiState;
use super::status::ApiError;

/// The administrator the cluster's token authenticates.
pub const ADMIN: &str = "shoal-admin";

/// The administrator's identity.
pub fn admin() -> User {
    User::new(ADMIN, &[rbac::MASTERS, rbac::AUTHENTICATED])
}

tokio::task_local! {
    /// Who the request being served acts as (set around its handling), for what admission
    /// decides by the requester: escalation prevention.
    pub static REQUESTER: User;
}

/// The identity the request being served acts as, if one was set.
pub fn requester() -> Option<User> {
    REQUESTER.try_with(User::clone).ok()
}

/// The stored roles and bindings, as last read ([`Cache`]).
pub fn policy(state: &ApiState) -> Arc<Policy> {
    state.authz.policy(&state.replication)
}

/// The most decisions kept; past it the cache starts over.
const MAX_DECISIONS: usize = 16_384;

/// The RBAC objects as last read and the decisions made from them, kept while no object of
/// the RBAC group changes (the store's change log says so without a list): a request of a
/// non-administrator lists no RBAC object and decides nothing it decided before.
#[derive(Default)]
pub struct Cache {
    state: Mutex<CacheState>,
    /// Bumped by [`Cache::follow`] at every change of an RBAC object; with a follower, a
    /// decision reads no store at all while it does not move.
    generation: std::sync::atomic::AtomicU64,
    followed: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct CacheState {
    /// The [`Cache::generation`] the policy was read at.
    generation: u64,
    /// The store's version the policy is known to be current at.
    version: u64,
    policy: Option<Arc<Policy>>,
    decisions: HashMap<(User, Attributes), Decision>,
}

impl Cache {
    /// Follows the store's change feed: an RBAC object changing makes the next decision read
    /// the policy again (a lagging feed too). Without a follower, each decision asks the
    /// store's change log instead.
    pub fn follow(self: &Arc<Self>, replication: &Arc<crate::replication::Replication>) {
        let changes = replication.subscribe();
        let cache = self.clone();
        self.followed
            .store(true, std::sync::atomic::Ordering::Release);
        crate::supervise::spawn_receiving("rbac-cache", changes, move |changes, restarted| {
            let cache = cache.clone();
            async move {
                use std::sync::atomic::Ordering;
                let mut changes = changes.lock().await;
                if restarted {
                    cache.generation.fetch_add(1, Ordering::AcqRel);
                }
                loop {
                    match changes.recv().await {
                        Ok(change) if change.key.group != rbac::GROUP => {}
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            cache.generation.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                }
            }
        });
    }

    /// The policy as stored now.
    pub fn policy(&self, replication: &crate::replication::Replication) -> Arc<Policy> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.refresh(&mut state, replication)
    }

    /// Whether `user` may do `a`, as the stored policy decides.
    pub fn authorize(
        &self,
        replication: &crate::replication::Replication,
        user: &User,
        a: &Attributes,
    ) -> Decision {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let policy = self.refresh(&mut state, replication);
        let key = (user.clone(), a.clone());
        if let Some(decision) = state.decisions.get(&key) {
            return decision.clone();
        }
        let decision = policy.authorize(user, a);
        if state.decisions.len() >= MAX_DECISIONS {
            state.decisions.clear();
        }
        state.decisions.insert(key, decision.clone());
        decision
    }

    /// The policy, read again (and the decisions dropped) if an RBAC object changed since it
    /// was read or the change log cannot tell.
    fn refresh(
        &self,
        state: &mut CacheState,
        replication: &crate::replication::Replication,
    ) -> Arc<Policy> {
        use std::sync::atomic::Ordering;
        let generation = self.generation.load(Ordering::Acquire);
        if self.followed.load(Ordering::Acquire)
            && generation == state.generation
            && let Some(policy) = &state.policy
        {
            return policy.clone();
        }
        let since = state.version;
        let known = state.policy.is_some();
        let (now, changed) = replication.read(|s| {
            let changed = if known {
                s.group_changed_since(since, rbac::GROUP)
            } else {
                None
            };
            (s.resource_version(), changed)
        });
        if let (Some(false), Some(policy)) = (changed, &state.policy) {
            state.version = now;
            state.generation = generation;
            return policy.clone();
        }
        // Read after `now` and `generation`: a change in between is seen again next time,
        // never missed.
        let policy = Arc::new(policy_of(replication));
        state.version = now;
        state.generation = generation;
        state.policy = Some(policy.clone());
        state.decisions.clear();
        policy
    }
}

/// [`policy`] from a replica.
pub fn policy_of(replication: &crate::replication::Replication) -> Policy {
    replication.read(|s| Policy {
        roles: s.list(rbac::GROUP, "Role", None),
        cluster_roles: s.list(rbac::GROUP, "ClusterRole", None),
        role_bindings: s.list(rbac::GROUP, "RoleBinding", None),
        cluster_role_bindings: s.list(rbac::GROUP, "ClusterRoleBinding", None),
    })
}

fn forbidden(message: String, a: &Attributes) -> Response {
    let mut error = ApiError::new(StatusCode::FORBIDDEN, "Forbidden", message);
    if a.resource_request {
        error.details = Some(json!({"name": a.name, "group": a.api_group, "kind": a.resource}));
    }
    error.into_response()
}

/// The impersonation the headers ask for, if any: the user it names (its groups those named,
/// and `system:authenticated`), once `user` was found allowed to impersonate them.
fn impersonated(
    state: &ApiState,
    user: &User,
    headers: &HeaderMap,
) -> Result<Option<User>, Box<Response>> {
    let Some(name) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
    else {
        if headers.contains_key("impersonate-group") {
            return Err(Box::new(
                ApiError::bad_request(
                    "requested impersonation of groups without impersonating a user",
                )
                .into_response(),
            ));
        }
        return Ok(None);
    };
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    if groups.len() > rbac::MAX_SUBJECTS {
        return Err(Box::new(
            ApiError::bad_request("too many impersonated groups").into_response(),
        ));
    }
    let mut target = User {
        name: name.to_owned(),
        groups: groups.clone(),
    };
    if !user.is_master() {
        let policy = policy(state);
        let mut asks: Vec<Attributes> = Vec::new();
        let ask = |resource: &str, namespace: &str, name: &str| Attributes {
            verb: "impersonate".into(),
            resource_request: true,
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        };
        match target.service_account() {
            Some((ns, sa)) => asks.push(ask("serviceaccounts", ns, sa)),
            None => asks.push(ask("users", "", name)),
        }
        asks.extend(groups.iter().map(|g| ask("groups", "", g)));
        for a in asks {
            if let Decision::Deny(message) = policy.authorize(user, &a) {
                return Err(Box::new(forbidden(message, &a)));
            }
        }
    }
    if !target.groups.iter().any(|g| g == rbac::AUTHENTICATED) {
        target.groups.push(rbac::AUTHENTICATED.into());
    }
    Ok(Some(target))
}

/// Whether `request` (from `user`) is allowed, as a response when not.
pub fn authorize(state: &ApiState, user: &User, request: &Request) -> Result<(), Box<Response>> {
    if user.is_master() {
        return Ok(());
    }
    let watch = request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let a = rbac::attributes(request.method().as_str(), request.uri().path(), watch);
    match state.authz.authorize(&state.replication, user, &a) {
        Decision::Allow => Ok(()),
        Decision::Deny(message) => Err(Box::new(forbidden(message, &a))),
    }
}

/// The identity a request acts as: the authenticated `user`, or whom it impersonates; then
/// authorized. The identity is handed on with the request (its extensions).
pub async fn identify(
    State(state): State<ApiState>,
    user: User,
    mut request: Request,
    next: axum::middleware::Next,
) -> Response {
    let user = match impersonated(&state, &user, request.headers()) {
        Ok(Some(target)) => target,
        Ok(None) => user,
        Err(refusal) => return *refusal,
    };
    if let Err(refusal) = authorize(&state, &user, &request) {
        return *refusal;
    }
    request.extensions_mut().insert(user);
    next.run(request).await
}

/// `SelfSubjectAccessReview` (authorization.k8s.io/v1): whether the requester may do what the
/// review's `spec` describes; the review comes back with its `status`.
pub fn self_subject_access_review(state: &ApiState, user: &User, body: &[u8]) -> Response {
    let Ok(review) = serde_json::from_slice::<Value>(body) else {
        return ApiError::bad_request("the body is not a SelfSubjectAccessReview").into_response();
    };
    access_review(state, user, review, "SelfSubjectAccessReview")
}

/// `SubjectAccessReview` (authorization.k8s.io/v1, what webhooks and proxies such as
/// kube-rbac-proxy ask): whether the user the review's `spec` names (`user`, `groups`) may do
/// what it describes.
pub fn subject_access_review(state: &ApiState, body: &[u8]) -> Response {
    let Ok(review) = serde_json::from_slice::<Value>(body) else {
        return ApiError::bad_request("the body is not a SubjectAccessReview").into_response();
    };
    let spec = &review["spec"];
    let user = User {
        name: spec["user"].as_str().unwrap_or_default().to_owned(),
        groups: spec["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .take(rbac::MAX_SUBJECTS)
            .filter_map(|g| g.as_str().map(str::to_owned))
            .collect(),
    };
    if user.name.is_empty() && user.groups.is_empty() {
        return ApiError::invalid(
            "SubjectAccessReview",
            "",
            "spec.user",
            "Invalid value: \"\": at least one of user or group must be specified",
        )
        .into_response();
    }
    access_review(state, &user, review, "SubjectAccessReview")
}

/// An access review of either kind: `review`'s spec asked for `user`, answered in its status.
fn access_review(state: &ApiState, user: &User, mut review: Value, kind: &str) -> Response {
    let spec = &review["spec"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let a = if let Some(r) = spec.get("resourceAttributes") {
        Attributes {
            verb: text(&r["verb"]),
            resource_request: true,
            api_group: text(&r["group"]),
            resource: text(&r["resource"]),
            subresource: text(&r["subresource"]),
            namespace: text(&r["namespace"]),
            name: text(&r["name"]),
            path: String::new(),
        }
    } else if let Some(n) = spec.get("nonResourceAttributes") {
        Attributes {
            verb: text(&n["verb"]),
            path: text(&n["path"]),
            ..Default::default()
        }
    } else {
        return ApiError::invalid(
            kind,
            "",
            "spec",
            "Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )
        .into_response();
    };
    let status = match policy(state).authorize(user, &a) {
        Decision::Allow => json!({"allowed": true}),
        Decision::Deny(_) => json!({"allowed": false}),
    };
    review["status"] = status;
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!(kind);
    (StatusCode::CREATED, axum::Json(review)).into_response()
}

/// `SelfSubjectRulesReview` (authorization.k8s.io/v1, `kubectl auth can-i --list`): the
/// rules that apply to the requester in the review's namespace (its ClusterRoleBindings' and
/// that namespace's RoleBindings'), resource rules and non-resource rules apart.
pub fn self_subject_rules_review(state: &ApiState, user: &User, body: &[u8]) -> Response {
    let Ok(mut review) = serde_json::from_slice::<Value>(body) else {
        return ApiError::bad_request("the body is not a SelfSubjectRulesReview").into_response();
    };
    let namespace = review["spec"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let policy = policy(state);
    let rules = policy.rules_for(user, &namespace);
    let pick = |r: &Value, fields: &[&str]| {
        let mut out = serde_json::Map::new();
        for f in fields {
            if r[*f].is_array() {
                out.insert((*f).to_owned(), r[*f].clone());
            }
        }
        Value::Object(out)
    };
    let resource: Vec<Value> = rules
        .iter()
        .filter(|r| r["nonResourceURLs"].as_array().is_none_or(Vec::is_empty))
        .map(|r| pick(r, &["verbs", "apiGroups", "resources", "resourceNames"]))
        .collect();
    let non_resource: Vec<Value> = rules
        .iter()
        .filter(|r| {
            r["nonResourceURLs"]
                .as_array()
                .is_some_and(|u| !u.is_empty())
        })
        .map(|r| pick(r, &["verbs", "nonResourceURLs"]))
        .collect();
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectRulesReview");
    review["status"] =
        json!({"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": false});
    (StatusCode::CREATED, axum::Json(review)).into_response()
}

/// `TokenReview` (authentication.k8s.io/v1): whom a token authenticates, for the audiences the
/// review names (the API's own by default). A refused token is `authenticated: false` with
/// upstream's opaque error.
pub fn token_review(state: &ApiState, body: &[u8]) -> Response {
    let Ok(mut review) = serde_json::from_slice::<Value>(body) else {
        return ApiError::bad_request("the body is not a TokenReview").into_response();
    };
    let token = review["spec"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let asked: Vec<String> = review["spec"]["audiences"]
        .as_array()
        .into_iter()
        .flatten()
        .take(16)
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    let audiences = if asked.is_empty() {
        state.tokens.audiences.clone()
    } else {
        asked
    };
    let now = super::unix_seconds();
    let status = if token == *state.token {
        let admin = admin();
        json!({"authenticated": true, "audiences": audiences,
               "user": {"username": admin.name, "groups": admin.groups}})
    } else {
        match state
            .tokens
            .authenticate_for(&state.replication, &token, &audiences, now)
        {
            Ok(claims) => {
                let user = claims.user();
                let mut extra = serde_json::Map::new();
                if let Some(pod) = &claims.kubernetes.pod {
                    extra.insert(
                        "authentication.kubernetes.io/pod-name".into(),
                        json!([pod.name]),
                    );
                    extra.insert(
                        "authentication.kubernetes.io/pod-uid".into(),
                        json!([pod.uid]),
                    );
                }
                if let Some(node) = &claims.kubernetes.node {
                    extra.insert(
                        "authentication.kubernetes.io/node-name".into(),
                        json!([node.name]),
                    );
                }
                extra.insert(
                    "authentication.kubernetes.io/credential-id".into(),
                    json!([format!("JTI={}", claims.jti)]),
                );
                let aud: Vec<&String> = audiences
                    .iter()
                    .filter(|a| claims.aud.contains(a))
                    .collect();
                json!({"authenticated": true, "audiences": aud, "user": {
                    "username": user.name,
                    "uid": claims.kubernetes.serviceaccount.uid,
                    "groups": user.groups,
                    "extra": extra,
                }})
            }
            Err(refusal) => {
                tracing::debug!(%refusal, "TokenReview: token refused");
                json!({"authenticated": false, "error": "invalid bearer token", "user": {}})
            }
        }
    };
    review["apiVersion"] = json!("authentication.k8s.io/v1");
    review["kind"] = json!("TokenReview");
    review["status"] = status;
    (StatusCode::CREATED, axum::Json(review)).into_response()
}

/// `/.well-known/openid-configuration`: the issuer's OIDC discovery document, so systems
/// outside the cluster can verify its service-account tokens (as upstream's
/// ServiceAccountIssuerDiscovery serves it).
pub fn openid_configuration(state: &ApiState) -> Response {
    let issuer = state.tokens.signer.issuer();
    axum::Json(json!({
        "issuer": issuer,
        "jwks_uri": format!("{issuer}/openid/v1/jwks"),
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
    }))
    .into_response()
}

/// `/openid/v1/jwks`: every agent's token-verifying key.
pub fn jwks(state: &ApiState) -> Response {
    let keys = state.replication.read(|s| {
        crate::tokens::published_keys(&s.list("", "ConfigMap", Some(crate::tokens::KEY_NAMESPACE)))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/jwk-set+json")],
        json!({"keys": keys}).to_string(),
    )
        .into_response()
}

/// `SelfSubjectReview` (authentication.k8s.io/v1): who the requester is.
pub fn self_subject_review(user: &User) -> Response {
    (
        StatusCode::CREATED,
        axum::Json(json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "SelfSubjectReview",
            "metadata": {"creationTimestamp": null},
            "status": {"userInfo": {"username": user.name, "groups": user.groups}},
        })),
    )
        .into_response()
}

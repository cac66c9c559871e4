//! The Kubernetes-compatible API every agent serves (DESIGN.md §10): HTTPS with a certificate
//! from the cluster CA, a bearer token every agent of the cluster accepts, Kubernetes paths,
//! discovery, OpenAPI v3, Table output, list/watch, patches and `Status` errors — so kubectl and
//! client libraries work against any agent.

pub(crate) mod admission;
pub mod audit;
pub mod authz;
mod delete;
mod discovery;
mod handlers;
mod observed;
mod openapi;
mod patch;
mod portforward;
mod protobuf;
mod read;
pub(crate) mod resources;
mod spdy;
pub(crate) mod status;
mod stream;
mod subresource;
mod table;
mod watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::Value;
use shoal_gossip::Membership;
use tracing::{debug, warn};

use crate::replication::Replication;
pub use resources::{ApiPath, parse as parse_path};
use status::ApiError;

/// What the API handlers share.
#[derive(Clone)]
pub struct ApiState {
    pub replication: Arc<Replication>,
    pub membership: Arc<Membership>,
    pub scheduling: Arc<crate::scheduling::Scheduling>,
    /// Pod statuses gossiped by the nodes running them.
    pub pod_statuses: Arc<crate::observed::pod_status::PodStatusCache>,
    /// Container logs, from this node or the one running the pod.
    pub logs: Arc<crate::kubelet::node_service::NodeService>,
    pub token: Arc<str>,
    /// Service-account tokens: issued here, verified for every agent's.
    pub tokens: Arc<crate::tokens::Tokens>,
    /// RBAC's objects and decisions, kept while they do not change.
    pub authz: Arc<authz::Cache>,
    /// Where every request is recorded (`--audit-log-path`), if anywhere.
    pub audit: Option<Arc<audit::Log>>,
    /// `host:port` clients use to reach this API.
    pub server_address: String,
    /// Where Service ClusterIPs come from.
    pub service_cidr: ipnet::Ipv4Net,
}

impl ApiState {
    /// The write path of this node ([`admission::Admission`]).
    pub fn admission(&self) -> admission::Admission<'_> {
        admission::Admission {
            replication: &self.replication,
            service_cidr: self.service_cidr,
        }
    }
}

/// DELETE of a stored object (`namespace`: `default` when the kind is namespaced and none is
/// given) exactly as the Kubernetes API's DELETE makes it, with `gracePeriodSeconds`: the
/// control socket's `shoal delete` goes through here.
pub async fn delete_stored(
    state: &ApiState,
    info: &'static shoal_state::kind::KindInfo,
    namespace: Option<&str>,
    name: &str,
    grace_period_seconds: Option<i64>,
) -> Result<axum::response::Response, status::ApiError> {
    let resource = resources::ApiResource {
        info,
        source: resources::Source::Stored(info),
    };
    let mut query = handlers::Query::new();
    if let Some(seconds) = grace_period_seconds {
        query.insert("gracePeriodSeconds".to_owned(), seconds.to_string());
    }
    let request = handlers::Request {
        state,
        resource: &resource,
        namespace: info.namespaced.then(|| namespace.unwrap_or("default")),
        query: &query,
        headers: &axum::http::HeaderMap::new(),
        body: &axum::body::Bytes::new(),
    };
    handlers::delete(&request, name).await
}

/// Paths served without a token, as the apiserver does.
fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/livez" | "/version")
}

/// The bearer token a request presents (the scheme's name is case-insensitive, RFC 7235:
/// the official Python client's in-cluster configuration sends `bearer`).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Constant-time comparison of the presented token.
fn token_ok(headers: &HeaderMap, token: &str) -> bool {
    let Some(presented) = bearer(headers) else {
        return false;
    };
    presented.len() == token.len()
        && presented
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Who the request is (the cluster's token: its administrator; a service-account token: that
/// ServiceAccount), then as whom it acts and whether that one may ([`authz::identify`]); the
/// public health and version paths need no credentials. A refused credential gets upstream's
/// bare 401: why is logged at debug level, never told.
async fn authenticate(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if is_public(request.uri().path()) {
        return next.run(request).await;
    }
    let user = who(&state, request.headers());
    let Some(log) = state.audit.clone() else {
        return match user {
            Some(user) => authz::identify(State(state), user, request, next).await,
            None => unauthorized(),
        };
    };
    // Audited: what the request was, then its answer.
    let received = std::time::SystemTime::now();
    let headers = request.headers();
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let impersonated = headers
        .get("impersonate-user")
        .map(|_| shoal_model::rbac::User {
            name: text("impersonate-user"),
            groups: headers
                .get_all("impersonate-group")
                .iter()
                .filter_map(|v| v.to_str().ok().map(str::to_owned))
                .take(shoal_model::rbac::MAX_SUBJECTS)
                .collect(),
        });
    let (method, uri, user_agent) = (
        request.method().as_str().to_owned(),
        request.uri().to_string(),
        text("user-agent"),
    );
    let source = request.extensions().get::<Peer>().map(|p| p.0.ip());
    let watch = request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let attributes = shoal_model::rbac::attributes(&method, request.uri().path(), watch);
    let response = match user.clone() {
        Some(user) => authz::identify(State(state), user, request, next).await,
        None => unauthorized(),
    };
    log.record(&audit::Request {
        method: &method,
        uri: &uri,
        user: user.as_ref(),
        impersonated: impersonated.as_ref(),
        source,
        user_agent: &user_agent,
        attributes: &attributes,
        code: response.status().as_u16(),
        received,
        done: std::time::SystemTime::now(),
    });
    response
}

/// Upstream's bare 401: why a credential was refused is logged at debug level, never told.
fn unauthorized() -> Response {
    ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized").into_response()
}

/// Who presents `headers`' credentials: the cluster's token (its administrator) or a
/// service-account token (that ServiceAccount); `None` when neither verifies.
fn who(state: &ApiState, headers: &HeaderMap) -> Option<shoal_model::rbac::User> {
    if token_ok(headers, &state.token) {
        return Some(authz::admin());
    }
    let token = bearer(headers)?;
    match state
        .tokens
        .authenticate(&state.replication, token, unix_seconds())
    {
        Ok(claims) => Some(claims.user()),
        Err(refusal) => {
            debug!(%refusal, "bearer token refused");
            None
        }
    }
}

/// The address a request's connection came from (set on every request the listener serves).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// Now, in seconds since the Unix epoch.
pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The API's routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/version",
            get(|| async { axum::Json(discovery::version()) }),
        )
        .route(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            axum::routing::post(
                |State(state): State<ApiState>,
                 axum::Extension(user): axum::Extension<shoal_model::rbac::User>,
                 body: axum::body::Bytes| async move {
                    authz::self_subject_access_review(&state, &user, &body)
                },
            ),
        )
        .route(
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            axum::routing::post(
                |State(state): State<ApiState>,
                 axum::Extension(user): axum::Extension<shoal_model::rbac::User>,
                 body: axum::body::Bytes| async move {
                    authz::self_subject_rules_review(&state, &user, &body)
                },
            ),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            axum::routing::post(
                |State(state): State<ApiState>, body: axum::body::Bytes| async move {
                    authz::subject_access_review(&state, &body)
                },
            ),
        )
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            axum::routing::post(
                |State(state): State<ApiState>, body: axum::body::Bytes| async move {
                    authz::token_review(&state, &body)
                },
            ),
        )
        .route(
            "/.well-known/openid-configuration",
            get(|State(state): State<ApiState>| async move { authz::openid_configuration(&state) }),
        )
        .route(
            "/openid/v1/jwks",
            get(|State(state): State<ApiState>| async move { authz::jwks(&state) }),
        )
        .route(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            axum::routing::post(
                |axum::Extension(user): axum::Extension<shoal_model::rbac::User>| async move {
                    authz::self_subject_review(&user)
                },
            ),
        )
        .fallback(dispatch)
        .layer(axum::extract::DefaultBodyLimit::max(
            2 * shoal_state::object::MAX_OBJECT_BYTES,
        ))
        .layer(middleware::from_fn(protobuf_bodies))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// Protobuf bodies at the edge (`protobuf.rs`): a protobuf request body is handed on as the
/// JSON it stands for, and a JSON answer to a client that asks for protobuf first goes back as
/// protobuf when the server has the kind's schema (watches stay JSON, which client-go decodes by
/// the answer's Content-Type).
async fn protobuf_bodies(request: Request, next: Next) -> Response {
    let header_text = |r: &Request, name: header::HeaderName| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let wants_protobuf = protobuf::prefers_protobuf(&header_text(&request, header::ACCEPT))
        && !request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let request = if header_text(&request, header::CONTENT_TYPE).starts_with(protobuf::MEDIA_TYPE) {
        let (mut parts, body) = request.into_parts();
        let bytes = match read_body(body).await {
            Ok(b) => b,
            Err(refusal) => return refusal,
        };
        let object = match protobuf::decode(&bytes) {
            Ok(o) => o,
            Err(e) => {
                return ApiError::bad_request(format!("the protobuf body does not decode: {e}"))
                    .into_response();
            }
        };
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        parts.headers.remove(header::CONTENT_LENGTH);
        Request::from_parts(parts, axum::body::Body::from(object.to_string()))
    } else {
        request
    };
    let response = next.run(request).await;
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/json");
    if !wants_protobuf || !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let encoded = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .filter(|v| {
            let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
            protobuf::knows(text("apiVersion"), text("kind"))
        })
        .map(|v| protobuf::encode(&v));
    match encoded {
        Some(Ok(body)) => {
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(protobuf::MEDIA_TYPE),
            );
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, axum::body::Body::from(body))
        }
        Some(Err(e)) => {
            warn!(error = %e, "an answer could not be encoded as protobuf; sent as JSON");
            Response::from_parts(parts, axum::body::Body::from(bytes))
        }
        None => Response::from_parts(parts, axum::body::Body::from(bytes)),
    }
}

/// A request's body, at most twice the largest object (a refusal naming the limit otherwise).
async fn read_body(body: axum::body::Body) -> Result<Bytes, Response> {
    let limit = 2 * shoal_state::object::MAX_OBJECT_BYTES;
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("the request body could not be read (at most {limit} bytes): {e}"),
        )
        .into_response()
    })
}

fn json(value: &Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn query_map(uri: &Uri) -> Result<handlers::Query, ApiError> {
    axum::extract::Query::<handlers::Query>::try_from_uri(uri)
        .map(|q| q.0)
        .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))
}

async fn dispatch(State(state): State<ApiState>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    // exec and port-forward take the connection over once answered.
    let upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(refusal) => return refusal,
    };
    let requester = parts
        .extensions
        .remove::<shoal_model::rbac::User>()
        .unwrap_or_else(authz::admin);
    let (method, uri, headers) = (parts.method, parts.uri, parts.headers);
    let path = uri.path().to_owned();
    let (result, warnings) = authz::REQUESTER
        .scope(
            requester,
            handlers::WARNINGS.scope(std::cell::RefCell::new(Vec::new()), async {
                let result = route(&state, &method, &uri, &headers, &body, upgrade).await;
                (result, handlers::WARNINGS.with(|w| w.take()))
            }),
        )
        .await;
    match result {
        Ok(mut response) => {
            // RFC 7234's warning format, as the apiserver sends it (kubectl prints each).
            for text in warnings {
                let quoted = text.replace('\\', "\\\\").replace('"', "\\\"");
                if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{quoted}\"")) {
                    response.headers_mut().append(header::WARNING, value);
                }
            }
            response
        }
        Err(error) => {
            debug!(%method, %path, code = error.code.as_u16(), message = %error.message, "API request refused");
            error.into_response()
        }
    }
}

async fn route(
    state: &ApiState,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
    upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response, ApiError> {
    let path = uri.path();
    let query = query_map(uri)?;
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if path == "/metrics" && *method == Method::GET {
        return Ok(metrics_text(state).await);
    }
    if path == "/openapi/v3" {
        return Ok(json(&discovery::openapi_root()));
    }
    if let Some(doc) = path.strip_prefix("/openapi/v3/") {
        return discovery::openapi_document(doc)
            .map(|d| json(&d))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("no OpenAPI document for {doc}"),
                )
            });
    }
    let aggregated = |core: bool| {
        let mut response = json(&discovery::aggregated(core));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(discovery::AGGREGATED_CONTENT_TYPE),
        );
        response
    };
    let parsed = resources::parse(path).map_err(|e| match e {
        resources::PathError::NotFound(p) => {
            ApiError::new(StatusCode::NOT_FOUND, "NotFound", format!("the server could not find the requested resource ({p})"))
        }
        resources::PathError::NoResource { group_version, plural } => ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the server could not find the requested resource: no resource {plural:?} in {group_version}"),
        ),
    })?;
    if *method != Method::GET
        && !matches!(parsed, ApiPath::Collection { .. } | ApiPath::Object { .. })
    {
        return Err(ApiError::method_not_allowed(format!(
            "{method} is not allowed on {path}"
        )));
    }
    // The streaming subresources take the connection over.
    if let ApiPath::Object {
        resource,
        namespace,
        name,
        subresource: Some(sub),
    } = &parsed
        && resource.kind == "Pod"
        && matches!(sub.as_str(), "exec" | "attach" | "portforward")
    {
        return stream::serve(
            state,
            resource,
            namespace.as_deref(),
            name,
            sub,
            method,
            uri,
            headers,
            upgrade,
        )
        .await;
    }
    // Discovery paths answer directly; resource paths go to the verbs with one Request.
    let (resource, namespace, object) = match parsed {
        ApiPath::CoreVersions if discovery::wants_aggregated(accept) => {
            return Ok(aggregated(true));
        }
        ApiPath::CoreVersions => return Ok(json(&discovery::core_versions(&state.server_address))),
        ApiPath::Groups if discovery::wants_aggregated(accept) => return Ok(aggregated(false)),
        ApiPath::Groups => return Ok(json(&discovery::group_list())),
        ApiPath::ResourceList { group, version } => {
            return Ok(json(&discovery::resource_list(&group, &version)));
        }
        ApiPath::Collection {
            resource,
            namespace,
        } => (resource, namespace, None),
        ApiPath::Object {
            resource,
            namespace,
            name,
            subresource,
        } => (resource, namespace, Some((name, subresource))),
    };
    let request = handlers::Request {
        state,
        resource: &resource,
        namespace: namespace.as_deref(),
        query: &query,
        headers,
        body,
    };
    match (object, method) {
        (Some((name, subresource)), _) => {
            handlers::object(&request, &name, subresource.as_deref(), method).await
        }
        (None, &Method::GET) => handlers::list(&request).await,
        (None, &Method::POST) => handlers::create(&request).await,
        (None, &Method::DELETE) => handlers::delete_collection(&request).await,
        (None, _) => Err(ApiError::method_not_allowed(format!(
            "{method} is not allowed on a collection"
        ))),
    }
}

/// This node's Prometheus metrics: its containers' usage (cAdvisor names), membership, store
/// and pods.
async fn metrics_text(state: &ApiState) -> Response {
    let usage = state.logs.local_usage().unwrap_or_default();
    let members = state.membership.members().await;
    let mut by_state: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for m in &members {
        *by_state
            .entry(format!("{:?}", m.state).to_lowercase())
            .or_default() += 1.0;
    }
    let (objects, rv) = state.replication.read(|s| (s.len(), s.resource_version()));
    let traffic = state.replication.traffic();
    let load =
        |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed) as f64;
    let running: f64 = usage.pods.len() as f64;
    let claims = state.logs.claim_stats();
    let claim_series = |value: fn(&crate::kubelet::volume_usage::ClaimStat) -> u64| {
        claims
            .iter()
            .map(|c| {
                (
                    format!(
                        "namespace=\"{}\",persistentvolumeclaim=\"{}\"",
                        c.namespace, c.claim
                    ),
                    value(c) as f64,
                )
            })
            .collect::<Vec<_>>()
    };
    let extra = [
        (
            "kubelet_volume_stats_used_bytes",
            "Bytes the claim's volume holds on this node (measured every 5 s).",
            claim_series(|c| c.used_bytes),
        ),
        (
            "kubelet_volume_stats_capacity_bytes",
            "The capacity of the claim's volume on this node.",
            claim_series(|c| c.capacity_bytes),
        ),
        (
            "shoal_members",
            "Cluster members as this node sees them, by state.",
            by_state
                .into_iter()
                .map(|(s, n)| (format!("state=\"{s}\""), n))
                .collect(),
        ),
        (
            "shoal_store_objects",
            "Objects in the desired-state store.",
            vec![(String::new(), objects as f64)],
        ),
        (
            "shoal_store_resource_version",
            "The store's resourceVersion on this node.",
            vec![(String::new(), rv as f64)],
        ),
        (
            "shoal_store_write_quorum",
            "Nodes that must hold a write before this node acknowledges it.",
            vec![(String::new(), state.replication.quorum_needed() as f64)],
        ),
        (
            "shoal_sync_entries_refused_total",
            "Peers' entries this node refused (clock too far ahead, unknown kind, malformed).",
            vec![(String::new(), load(&traffic.entries_refused))],
        ),
        (
            "shoal_sync_pushes_refused_total",
            "Pushes of this node's writes that a peer refused (not counted toward the quorum).",
            vec![(String::new(), load(&traffic.pushes_refused))],
        ),
        (
            "shoal_peer_handshakes_refused_total",
            "Peer connections refused at the TLS handshake (no cluster certificate), both directions.",
            vec![(String::new(), state.replication.refused_handshakes() as f64)],
        ),
        (
            "shoal_pods_running",
            "Pods with a running container on this node.",
            vec![(String::new(), running)],
        ),
        (
            "shoal_node_cpu_nanocores",
            "CPU in use on this node.",
            vec![(String::new(), usage.cpu_nanocores as f64)],
        ),
        (
            "shoal_node_memory_working_set_bytes",
            "Memory in use on this node.",
            vec![(String::new(), usage.memory_working_set_bytes as f64)],
        ),
    ];
    let text = crate::kubelet::metrics::prometheus(&usage, &extra);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
        .into_response()
}

/// What one API listener allows a client before it has proved anything.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; more are closed on accept.
    pub max_connections: usize,
    /// Connections served at once from one source address (one pod, one node): more from it
    /// are closed on accept, so no single client can hold every slot before it has
    /// authenticated.
    pub max_per_source: usize,
    /// Time a client has to finish the TLS handshake.
    pub tls_handshake: Duration,
    /// Time a client has to send a request's headers (also while a kept-alive connection
    /// waits for its next request).
    pub header_read: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_per_source: 64,
            tls_handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(30),
        }
    }
}

/// The connections open per source address, each counted while its [`SourceSlot`] lives.
/// The lock is held for a map update only (nothing in it can panic on input).
#[derive(Debug, Default)]
struct Sources {
    open: std::sync::Mutex<HashMap<std::net::IpAddr, usize>>,
}

/// One connection of a source, counted until dropped.
struct SourceSlot {
    sources: Arc<Sources>,
    ip: std::net::IpAddr,
}

impl Sources {
    /// A slot for another connection from `ip`, unless it already has `max` open.
    fn admit(self: &Arc<Self>, ip: std::net::IpAddr, max: usize) -> Option<SourceSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(SourceSlot {
            sources: self.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.sources.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `router` over TLS on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: rustls::ServerConfig,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let sources = Arc::new(Sources::default());
    let mut last_refusal: Option<std::time::Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    // Out of descriptors (EMFILE, ENFILE) or memory: accepting again at once
                    // would spin on the same error; connections closing free what it needs.
                    warn!(%error, "API accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(source_slot) = sources.admit(peer.ip(), limits.max_per_source) else {
            if last_refusal.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                last_refusal = Some(std::time::Instant::now());
                warn!(%peer, max = limits.max_per_source, "API connection refused: too many open connections from this address");
            }
            drop(stream);
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if last_refusal.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                last_refusal = Some(std::time::Instant::now());
                warn!(%peer, max = limits.max_connections, "API connection refused: too many open connections");
            }
            drop(stream);
            continue;
        };
        let acceptor = acceptor.clone();
        // Every request carries the address it came from (the audit log's `sourceIPs`).
        let service = TowerToHyperService::new(router.clone().layer(axum::Extension(Peer(peer))));
        tokio::spawn(async move {
            let _slots = (slot, source_slot);
            let tls =
                match tokio::time::timeout(limits.tls_handshake, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => {
                        debug!(%peer, %error, "API TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "API TLS handshake timed out");
                        return;
                    }
                };
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades()
                .await
            {
                debug!(%peer, %error, "API connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;

    use super::*;

    async fn listener(limits: ConnectionLimits) -> SocketAddr {
        let secret = shoal_gossip::ClusterSecret::from_bytes([3; 32]);
        let identity = shoal_gossip::ClusterIdentity::derive(&secret).unwrap();
        let cert = identity
            .issue_node_certificate("api", &["127.0.0.1".to_owned()])
            .unwrap();
        let tls = identity.api_server_config(&cert).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/healthz", get(|| async { "ok" }));
        tokio::spawn(serve(listener, tls, router, limits, std::future::pending()));
        addr
    }

    /// Bytes until the server closes the connection (or `patience` passes: `None`).
    async fn closed_within(stream: &mut tokio::net::TcpStream, patience: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(patience, stream.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// Issue #13, hole 6: a client that connects and says nothing is dropped after the
    /// handshake timeout, and connections beyond the limit are closed at once.
    #[tokio::test]
    async fn silent_clients_are_dropped_and_connections_are_bounded() {
        let addr = listener(ConnectionLimits {
            max_connections: 1,
            max_per_source: 8,
            tls_handshake: Duration::from_millis(300),
            header_read: Duration::from_millis(300),
        })
        .await;
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        // While the silent client holds the only slot, another is closed at once.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut second, Duration::from_millis(200)).await);
        assert!(
            closed_within(&mut silent, Duration::from_secs(3)).await,
            "a silent client kept its connection past the handshake timeout"
        );
        // The slot is free again: a third client gets a TLS handshake (the server speaks).
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(!closed_within(&mut third, Duration::from_millis(100)).await);
    }

    /// `GET /healthz` over TLS from `source`: the body, or why it failed.
    async fn healthz_from(addr: SocketAddr, source: std::net::IpAddr) -> Result<String, String> {
        use tokio::io::AsyncWriteExt;
        let secret = shoal_gossip::ClusterSecret::from_bytes([3; 32]);
        let identity = shoal_gossip::ClusterIdentity::derive(&secret).unwrap();
        let connector =
            tokio_rustls::TlsConnector::from(Arc::new(identity.api_client_config().unwrap()));
        let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
        socket
            .bind(SocketAddr::new(source, 0))
            .map_err(|e| e.to_string())?;
        let tcp = socket.connect(addr).await.map_err(|e| e.to_string())?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp))
            .await
            .map_err(|_| "handshake timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut answer))
            .await
            .map_err(|_| "no answer".to_owned())?
            .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }

    /// Issue #35, item 8: one source holding as many silent connections as it can (a pod
    /// flooding the API before authenticating) takes its own share of the slots only:
    /// another client's requests keep succeeding meanwhile.
    #[tokio::test]
    async fn one_source_cannot_take_every_slot() {
        let addr = listener(ConnectionLimits {
            max_connections: 16,
            max_per_source: 4,
            tls_handshake: Duration::from_secs(30),
            header_read: Duration::from_secs(30),
        })
        .await;
        let flooder: std::net::IpAddr = "127.0.0.2".parse().unwrap();
        let mut held = Vec::new();
        let mut refused = 0;
        for _ in 0..32 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::new(flooder, 0)).unwrap();
            let mut stream = socket.connect(addr).await.unwrap();
            if closed_within(&mut stream, Duration::from_millis(50)).await {
                refused += 1;
            } else {
                held.push(stream);
            }
        }
        assert_eq!(held.len(), 4, "the flooder holds its share only");
        assert_eq!(refused, 28);
        let answer = healthz_from(addr, "127.0.0.1".parse().unwrap()).await;
        assert!(
            answer
                .as_deref()
                .is_ok_and(|a| a.contains("200 OK") && a.ends_with("ok")),
            "{answer:?}"
        );
        // Its connections closed, the flooder is served again.
        drop(held);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if healthz_from(addr, flooder).await.is_ok() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the flooder's slots were not freed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

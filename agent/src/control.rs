//! The local control API: HTTP on a Unix socket (mode 0600) in the data dir. The CLI
//! (`shoal members`) and the test harness read the node's view through it; only local root (or
//! the data dir's owner) can reach it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use shoal_gossip::{Member, Membership};
use shoal_state::{KindInfo, ObjectError, ObjectKey, StoreError, WriteMode, kind};

use crate::replication::{Replication, WriteError};

/// Who this agent is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfInfo {
    pub node_id: String,
    pub name: String,
    pub generation: u64,
    pub gossip_addr: std::net::SocketAddr,
    pub cluster_id: String,
    pub agent_version: String,
    pub pid: u32,
}

#[derive(Clone)]
struct ControlState {
    membership: Arc<Membership>,
    replication: Arc<Replication>,
    self_info: Arc<SelfInfo>,
    kubeconfig: Option<Arc<KubeconfigInfo>>,
    pod_statuses: Arc<crate::observed::pod_status::PodStatusCache>,
    /// Where Service ClusterIPs come from (the write path allocates them).
    service_cidr: ipnet::Ipv4Net,
    /// The Kubernetes API's state: deletes go through its path.
    api: Arc<crate::api::ApiState>,
}

/// What a kubeconfig for this agent's API needs (served on the root-only control socket).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KubeconfigInfo {
    pub server: String,
    pub ca_pem: String,
    pub token: String,
    pub cluster_id: String,
}

/// The routes of the control socket. Objects are addressed as
/// `/v1/objects/{kind}/{name}?namespace=ns`, where `kind` is a kind, plural or short name.
pub fn router(
    api: crate::api::ApiState,
    self_info: SelfInfo,
    kubeconfig: Option<KubeconfigInfo>,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/self", get(self_info_handler))
        .route("/v1/members", get(members_handler))
        .route("/v1/store", get(store_handler))
        .route(
            "/v1/baseline",
            get(baseline_handler).put(set_baseline_handler),
        )
        .route("/v1/kubeconfig", get(kubeconfig_handler))
        .route("/v1/watch", get(watch_handler))
        .route("/v1/objects", post(create_handler).put(apply_handler))
        .route("/v1/objects/{kind}", get(list_handler))
        .route(
            "/v1/objects/{kind}/{name}",
            get(get_handler).delete(delete_handler),
        )
        // Bodies up to twice the object limit reach validation, which names the limit.
        .layer(axum::extract::DefaultBodyLimit::max(
            2 * shoal_state::object::MAX_OBJECT_BYTES,
        ))
        .with_state(ControlState {
            membership: api.membership.clone(),
            replication: api.replication.clone(),
            self_info: Arc::new(self_info),
            kubeconfig: kubeconfig.map(Arc::new),
            pod_statuses: api.pod_statuses.clone(),
            service_cidr: api.service_cidr,
            api: Arc::new(api),
        })
}

/// A pod with the status its node gossips (Pending until one does); other kinds unchanged.
fn with_observed(state: &ControlState, kind: &str, mut object: Value) -> Value {
    if kind == "Pod" {
        let status = state
            .pod_statuses
            .status_of(&object)
            .unwrap_or_else(|| json!({"phase": "Pending"}));
        object["status"] = status;
    }
    object
}

/// Every change committed on this node from now on, one JSON line each:
/// `{"resourceVersion": N, "event": "ADDED", "key": "...", "name": "...", "namespace": "..."}`.
async fn watch_handler(State(state): State<ControlState>) -> Response {
    let changes = state.replication.subscribe();
    let stream = futures_util::stream::unfold(changes, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(change) => {
                    let mut line = json!({
                        "resourceVersion": change.resource_version,
                        "event": change.event,
                        "key": change.key.to_string(),
                        "name": change.key.name,
                        "namespace": change.key.namespace,
                    })
                    .to_string();
                    line.push('\n');
                    return Some((Ok::<_, std::io::Error>(line), rx));
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

async fn kubeconfig_handler(
    State(state): State<ControlState>,
) -> Result<Json<KubeconfigInfo>, Failure> {
    state
        .kubeconfig
        .as_deref()
        .cloned()
        .map(Json)
        .ok_or_else(|| {
            failure(
                StatusCode::NOT_FOUND,
                "NotFound",
                "this agent serves no Kubernetes API; start it with --api IP:PORT".into(),
                Some("api".into()),
            )
        })
}

/// Summary of the local store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreInfo {
    /// Root digest; equal digests mean identical replicated state.
    pub digest: String,
    pub resource_version: u64,
    pub objects: usize,
    /// Entries including tombstones.
    pub entries: usize,
    /// Sync payload bytes this node sent and received (pushes and anti-entropy).
    pub sync_bytes_sent: u64,
    pub sync_bytes_received: u64,
    /// Peers' entries this node refused (clock too far ahead, unknown kind), pushed or pulled.
    #[serde(default)]
    pub entries_refused: u64,
    /// Pushes of this node's writes that peers refused (not counted toward the write quorum).
    #[serde(default)]
    pub pushes_refused: u64,
    /// Nodes that must hold a write before this node acknowledges it.
    #[serde(default)]
    pub write_quorum: usize,
    /// Peer connections this node's endpoint refused at the TLS handshake (a node without the
    /// cluster's secret), both directions, since it started.
    #[serde(default)]
    pub handshakes_refused: u64,
}

/// An error of the control API, with the field it is about when there is one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    pub reason: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

struct Failure(StatusCode, ApiError);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

fn failure(status: StatusCode, reason: &str, message: String, field: Option<String>) -> Failure {
    Failure(
        status,
        ApiError {
            reason: reason.into(),
            message,
            field,
        },
    )
}

impl From<crate::api::status::ApiError> for Failure {
    fn from(e: crate::api::status::ApiError) -> Self {
        let cause = |part: &str| {
            e.details
                .as_ref()
                .and_then(|d| d["causes"][0][part].as_str())
                .map(str::to_owned)
        };
        // An unavailable store says why (`NotDurable`, `Unavailable`, `HomeUnavailable`), as the
        // control API always did; other errors keep the Kubernetes reason (`Invalid`, ...).
        let reason = match cause("reason") {
            Some(why) if e.code == StatusCode::SERVICE_UNAVAILABLE => why,
            _ => e.reason.to_owned(),
        };
        failure(e.code, &reason, e.message, cause("field"))
    }
}

impl From<ObjectError> for Failure {
    fn from(e: ObjectError) -> Self {
        let field = e.field().map(str::to_owned);
        match e {
            ObjectError::TooLarge { .. } => failure(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                e.to_string(),
                None,
            ),
            _ => failure(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                e.to_string(),
                field,
            ),
        }
    }
}

impl From<WriteError> for Failure {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Store(e) => e.into(),
            e @ WriteError::NotDurable { .. } => failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "NotDurable",
                e.to_string(),
                None,
            ),
            e @ (WriteError::Unavailable { .. } | WriteError::Home { .. }) => failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "Unavailable",
                e.to_string(),
                None,
            ),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        let (status, reason) = match &e {
            StoreError::NotFound { .. } => (StatusCode::NOT_FOUND, "NotFound"),
            StoreError::AlreadyExists { .. } => (StatusCode::CONFLICT, "AlreadyExists"),
            StoreError::Conflict { .. } => (StatusCode::CONFLICT, "Conflict"),
            StoreError::Expired { .. } => (StatusCode::GONE, "Expired"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
        };
        failure(status, reason, e.to_string(), None)
    }
}

#[derive(Debug, Deserialize)]
struct NamespaceQuery {
    namespace: Option<String>,
    /// A pod's grace period on delete (`0`: at once), as the Kubernetes API's DELETE takes it.
    #[serde(default, rename = "gracePeriodSeconds")]
    grace_period_seconds: Option<i64>,
}

fn kind_named(name: &str) -> Result<&'static KindInfo, Failure> {
    kind::lookup_by_name(name).ok_or_else(|| {
        failure(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the server doesn't have a resource type {name:?}"),
            Some("kind".into()),
        )
    })
}

fn parse_body(body: &Bytes) -> Result<Value, Failure> {
    serde_json::from_slice(body).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("body is not valid JSON: {e}"),
            None,
        )
    })
}

/// `shoal create` and `shoal apply`: the Kubernetes API's own write path
/// ([`crate::api::admission`]), as `kubectl create` and `kubectl apply` (which asks for strict
/// field validation) would send the object: the same refusals, defaults, ClusterIPs and
/// serialized creates. `Upsert` updates the object when it exists, else creates it.
async fn write(state: &ControlState, body: Bytes, mode: WriteMode) -> Result<Response, Failure> {
    use crate::api::admission::{Admission, prepare};
    let object = parse_body(&body)?;
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource = crate::api::resources::all()
        .into_iter()
        .find(|r| r.group == group && r.version == version && r.kind == kind)
        .filter(|r| r.kind_info().is_some())
        .ok_or_else(|| {
            failure(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("kind: no kind {kind:?} is stored in apiVersion {api_version:?}"),
                Some("kind".into()),
            )
        })?;
    let namespace = resource.namespaced.then(|| {
        object["metadata"]["namespace"]
            .as_str()
            .filter(|ns| !ns.is_empty())
            .unwrap_or("default")
            .to_owned()
    });
    let strict = [("fieldValidation".to_owned(), "Strict".to_owned())].into();
    let valid = prepare(&resource, namespace.as_deref(), None, object, &strict)?;
    let admission = Admission {
        replication: &state.replication,
        service_cidr: state.service_cidr,
    };
    if resource.namespaced {
        admission.check_namespace(&valid.key.namespace)?;
    }
    let (mode, ordered) = match mode {
        WriteMode::Upsert if state.replication.read(|s| s.get(&valid.key)).is_some() => {
            (WriteMode::Update, valid.resource_version.is_some())
        }
        WriteMode::Upsert | WriteMode::Create => (WriteMode::Create, true),
        WriteMode::Update => (WriteMode::Update, valid.resource_version.is_some()),
    };
    let name = valid.key.name.clone();
    let (object, created) = admission
        .write(resource.kind, &name, valid, mode, ordered)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(object)).into_response())
}

async fn create_handler(
    State(state): State<ControlState>,
    body: Bytes,
) -> Result<Response, Failure> {
    write(&state, body, WriteMode::Create).await
}

async fn apply_handler(
    State(state): State<ControlState>,
    body: Bytes,
) -> Result<Response, Failure> {
    write(&state, body, WriteMode::Upsert).await
}

async fn list_handler(
    State(state): State<ControlState>,
    UrlPath(kind_name): UrlPath<String>,
    Query(query): Query<NamespaceQuery>,
) -> Result<Json<Value>, Failure> {
    let info = kind_named(&kind_name)?;
    let (items, rv) = state.replication.read(|s| {
        (
            s.list(info.group, info.kind, query.namespace.as_deref()),
            s.resource_version(),
        )
    });
    let items: Vec<Value> = items
        .into_iter()
        .map(|o| with_observed(&state, info.kind, o))
        .collect();
    Ok(Json(json!({
        "apiVersion": info.api_version(),
        "kind": format!("{}List", info.kind),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    })))
}

fn key_of(info: &KindInfo, name: &str, query: &NamespaceQuery) -> ObjectKey {
    ObjectKey::new(info, query.namespace.as_deref().unwrap_or("default"), name)
}

async fn get_handler(
    State(state): State<ControlState>,
    UrlPath((kind_name, name)): UrlPath<(String, String)>,
    Query(query): Query<NamespaceQuery>,
) -> Result<Json<Value>, Failure> {
    let info = kind_named(&kind_name)?;
    let key = key_of(info, &name, &query);
    state
        .replication
        .read(|s| s.get(&key))
        .map(|o| Json(with_observed(&state, info.kind, o)))
        .ok_or_else(|| StoreError::NotFound { key }.into())
}

/// A delete as `kubectl delete` makes it, through the Kubernetes API's path (one delete path,
/// issue #36): a pod on a node is marked and stopped within its grace period, an object with
/// finalizers waits for them, a Namespace turns Terminating, dependents are the garbage
/// collector's.
async fn delete_handler(
    State(state): State<ControlState>,
    UrlPath((kind_name, name)): UrlPath<(String, String)>,
    Query(query): Query<NamespaceQuery>,
) -> Result<Response, Failure> {
    let info = kind_named(&kind_name)?;
    Ok(crate::api::delete_stored(
        &state.api,
        info,
        query.namespace.as_deref(),
        &name,
        query.grace_period_seconds,
    )
    .await?)
}

async fn baseline_handler(State(state): State<ControlState>) -> Json<crate::replication::Baseline> {
    Json(state.replication.baseline().await)
}

/// The body of `PUT /v1/baseline`.
#[derive(Debug, Deserialize)]
struct SetBaseline {
    members: u64,
}

async fn set_baseline_handler(
    State(state): State<ControlState>,
    Json(body): Json<SetBaseline>,
) -> Result<Json<crate::replication::Baseline>, Failure> {
    state
        .replication
        .set_baseline(body.members)
        .await
        .map(Json)
        .map_err(|message| {
            failure(
                StatusCode::CONFLICT,
                "Conflict",
                message.to_string(),
                Some("members".into()),
            )
        })
}

async fn store_handler(State(state): State<ControlState>) -> Json<StoreInfo> {
    let traffic = state.replication.traffic();
    let load = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
    let (sync_bytes_sent, sync_bytes_received) = (load(&traffic.sent), load(&traffic.received));
    let (entries_refused, pushes_refused) = (
        load(&traffic.entries_refused),
        load(&traffic.pushes_refused),
    );
    let write_quorum = state.replication.quorum_needed();
    let handshakes_refused = state.replication.refused_handshakes();
    Json(state.replication.read(|s| StoreInfo {
        digest: s.root_digest(),
        resource_version: s.resource_version(),
        objects: s.len(),
        entries: s.entry_count(),
        sync_bytes_sent,
        sync_bytes_received,
        entries_refused,
        pushes_refused,
        write_quorum,
        handshakes_refused,
    }))
}

async fn self_info_handler(State(state): State<ControlState>) -> Json<SelfInfo> {
    Json((*state.self_info).clone())
}

async fn members_handler(State(state): State<ControlState>) -> Json<Vec<Member>> {
    Json(state.membership.members().await)
}

/// A bound control socket; the file is removed when this is dropped.
pub struct ControlSocket {
    path: PathBuf,
    listener: Option<tokio::net::UnixListener>,
}

impl ControlSocket {
    /// Binds `path`, replacing a stale socket left by a crashed agent (the caller holds the
    /// data-dir lock, so no live agent owns it).
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = tokio::net::UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Self {
            path: path.to_owned(),
            listener: Some(listener),
        })
    }

    /// Serves `router` until `shutdown` completes.
    pub async fn serve(
        mut self,
        router: Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let listener = self.listener.take().expect("serve is called once");
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

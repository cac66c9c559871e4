//! The resource verbs: get, list, create, update, patch, delete, and the status, scale and log
//! subresources. Writes go through `admission`, watches are `watch`.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use shoal_state::{ObjectError, ObjectKey, StoreError, WriteMode};

use super::ApiState;
use super::admission::prepare;
use super::observed;
use super::patch::{self, PatchError};
use super::resources::{ApiResource, Source};
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::table;
use crate::replication::WriteError;

pub type Query = HashMap<String, String>;

/// One API request's parts, as every verb reads them.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub state: &'a ApiState,
    pub resource: &'a ApiResource,
    pub namespace: Option<&'a str>,
    pub query: &'a Query,
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

pub(super) fn accept(headers: &HeaderMap) -> &str {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

pub(super) fn object_error(kind: &str, name: &str, e: ObjectError) -> ApiError {
    match e {
        ObjectError::TooLarge { .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            e.to_string(),
        ),
        ObjectError::UnknownKind { .. } => ApiError::bad_request(e.to_string()),
        ObjectError::Invalid { field, reason } => ApiError::invalid(kind, name, &field, &reason),
    }
}

pub(super) fn write_error(kind: &str, name: &str, e: WriteError) -> ApiError {
    match e {
        WriteError::Store(e) => store_error(kind, name, e),
        e @ (WriteError::NotDurable { .. }
        | WriteError::Unavailable { .. }
        | WriteError::Home { .. }) => {
            // The cause tells a client whether a retry may find the write done: `NotDurable`
            // was stored here and replicates later; `Unavailable` stored nothing.
            let cause = match e {
                WriteError::NotDurable { .. } => "NotDurable",
                WriteError::Home { .. } => "HomeUnavailable",
                _ => "Unavailable",
            };
            let message = e.to_string();
            let mut err = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                &message,
            );
            err.details = Some(json!({"name": name, "kind": kind.to_lowercase(),
                "causes": [{"reason": cause, "message": message}], "retryAfterSeconds": 1}));
            err
        }
    }
}

fn store_error(kind: &str, name: &str, e: StoreError) -> ApiError {
    let plural_kind = kind.to_lowercase();
    match e {
        StoreError::NotFound { .. } => ApiError::not_found(&plural_kind, name),
        StoreError::AlreadyExists { .. } => {
            let mut err = ApiError::new(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{plural_kind} {name:?} already exists"),
            );
            err.details = Some(json!({"name": name, "kind": plural_kind}));
            err
        }
        StoreError::Conflict { reason, .. } => {
            let mut err = ApiError::new(
                StatusCode::CONFLICT,
                "Conflict",
                format!("Operation cannot be fulfilled on {plural_kind} {name:?}: {reason}"),
            );
            err.details = Some(json!({"name": name, "kind": plural_kind}));
            err
        }
        StoreError::Expired { .. } => ApiError::new(StatusCode::GONE, "Expired", e.to_string()),
        other => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            other.to_string(),
        ),
    }
}

pub(super) fn selectors(
    query: &Query,
    kind: &str,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("labelSelector: {e}")))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str), kind)
        .map_err(|e| ApiError::bad_request(format!("fieldSelector: {e}")))?;
    Ok((labels, fields))
}

/// A Node edited through the API (`kubectl label|annotate|taint|cordon|uncordon`): the edit
/// becomes the node's stored NodeSettings; the answer is the Node as it now is.
fn node_settings_info() -> &'static shoal_state::KindInfo {
    shoal_state::kind::lookup(
        &format!("{}/v1", crate::node_settings::GROUP),
        crate::node_settings::KIND,
    )
    .expect("NodeSettings is a stored kind")
}

/// The resourceVersion of a node's stored NodeSettings (None while it has none): an edit is
/// written from it, so two edits at once cannot revert each other.
fn node_settings_version(state: &ApiState, name: &str) -> Option<String> {
    let key = ObjectKey::new(node_settings_info(), "", name);
    state
        .replication
        .read(|s| s.get(&key))
        .and_then(|o| o["metadata"]["resourceVersion"].as_str().map(str::to_owned))
}

#[allow(clippy::too_many_arguments)]
async fn edit_node(
    state: &ApiState,
    resource: &ApiResource,
    name: &str,
    before: Value,
    after: Value,
    settings_rv: Option<String>,
    query: &Query,
) -> Result<Response, ApiError> {
    let settings = crate::node_settings::from_edit(&before, &after)
        .map_err(|e| ApiError::invalid("Node", name, &e.field, &e.detail))?;
    if !dry_run(query) {
        let info = node_settings_info();
        let mut valid = shoal_state::validate(settings.to_object(name), "")
            .map_err(|e| object_error(info.kind, name, e))?;
        let mode = if settings_rv.is_some() {
            WriteMode::Update
        } else {
            WriteMode::Create
        };
        valid.resource_version = settings_rv;
        // Every live node sees a cordon or a taint before the client goes on (`kubectl drain`
        // evicts next: the replacements' auction must not place them on this node).
        state
            .replication
            .write_everywhere(valid, mode, std::time::Duration::from_secs(2))
            .await
            .map_err(|e| write_error(info.plural, name, e))?;
    }
    let view = if dry_run(query) {
        after
    } else {
        get_object(state, resource, None, name).await?
    };
    Ok(json_response(StatusCode::OK, &view))
}

/// Objects of a resource, with observed status, and the list's resourceVersion.
pub async fn list_objects(
    state: &ApiState,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> (Vec<Value>, u64) {
    match resource.source {
        Source::Stored(info) => {
            let (items, rv) = state.replication.read(|s| {
                (
                    s.list(info.group, info.kind, namespace),
                    s.resource_version(),
                )
            });
            // Statuses outside the store's lock: a workload's status reads the store again.
            let items = items
                .into_iter()
                .map(|o| observed::with_status(state, info.kind, o))
                .collect();
            (items, rv)
        }
        Source::Nodes => {
            let now = now_rfc3339();
            let members = state.membership.members().await;
            let blocks = crate::network::blocks_by_node(&state.replication, None);
            let settings = state.replication.read(crate::node_settings::stored);
            (
                members
                    .iter()
                    .map(|m| {
                        observed::node(
                            m,
                            &now,
                            blocks.get(&m.node_id).copied(),
                            settings.get(m.name()),
                        )
                    })
                    .collect(),
                state.replication.read(|s| s.resource_version()),
            )
        }
        Source::Events => {
            let view = if resource.group == "events.k8s.io" {
                crate::events::events_v1
            } else {
                crate::events::core_v1
            };
            let items = state
                .logs
                .cluster_events()
                .await
                .iter()
                .filter(|r| namespace.is_none_or(|ns| r.namespace() == ns))
                .map(view)
                .collect();
            (items, state.replication.read(|s| s.resource_version()))
        }
        Source::PodMetrics | Source::NodeMetrics => {
            let usage = state.logs.cluster_usage().await;
            let items = if resource.source == Source::PodMetrics {
                observed::pod_metrics(&usage, namespace)
            } else {
                observed::node_metrics(&usage)
            };
            (items, state.replication.read(|s| s.resource_version()))
        }
        Source::Endpoints | Source::EndpointSlices => (
            observed::service_endpoints(
                state,
                namespace,
                resource.source == Source::EndpointSlices,
            ),
            state.replication.read(|s| s.resource_version()),
        ),
    }
}

pub(super) async fn get_object(
    state: &ApiState,
    resource: &ApiResource,
    namespace: Option<&str>,
    name: &str,
) -> Result<Value, ApiError> {
    let found = match resource.source {
        Source::Stored(info) => {
            let key = ObjectKey::new(info, namespace.unwrap_or(""), name);
            state
                .replication
                .read(|s| s.get(&key))
                .map(|o| observed::with_status(state, info.kind, o))
        }
        _ => list_objects(state, resource, namespace)
            .await
            .0
            .into_iter()
            .find(|o| o["metadata"]["name"] == name),
    };
    found.ok_or_else(|| ApiError::not_found(resource.plural, name))
}

/// POST of an Event (client-go's event recorders, `kubectl create -f`): recorded in this
/// node's event log, aggregated with its repeats like the events Shoal records itself.
fn create_event(
    state: &ApiState,
    resource: &ApiResource,
    namespace: Option<&str>,
    object: Value,
) -> Result<Response, ApiError> {
    use crate::events::{EventType, NewEvent, ObjectRef};
    let v1 = resource.group == "events.k8s.io";
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    let invalid = |field: &str, detail: &str| ApiError::invalid("Event", name, field, detail);
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let (regarding_field, message_field, component) = if v1 {
        ("regarding", "note", text(&object["reportingController"]))
    } else {
        let c = text(&object["source"]["component"]);
        let c = if c.is_empty() {
            text(&object["reportingComponent"])
        } else {
            c
        };
        ("involvedObject", "message", c)
    };
    let r = &object[regarding_field];
    let regarding = ObjectRef {
        api_version: text(&r["apiVersion"]),
        kind: text(&r["kind"]),
        namespace: text(&r["namespace"]),
        name: text(&r["name"]),
        uid: text(&r["uid"]),
        field_path: text(&r["fieldPath"]),
    };
    if regarding.kind.is_empty() || regarding.name.is_empty() {
        return Err(invalid(
            &format!("{regarding_field}.name"),
            "Required value: the object the event is about",
        ));
    }
    // The event is named after the object, and peers check event names they are sent.
    shoal_state::labels::check_dns_subdomain(&regarding.name).map_err(|e| {
        invalid(
            &format!("{regarding_field}.name"),
            &format!("Invalid value: {e}"),
        )
    })?;
    if !regarding.namespace.is_empty() {
        shoal_state::labels::check_dns_label(&regarding.namespace).map_err(|e| {
            invalid(
                &format!("{regarding_field}.namespace"),
                &format!("Invalid value: {e}"),
            )
        })?;
    }
    let event_namespace = namespace.unwrap_or("default");
    if let Some(ns) = object["metadata"]["namespace"].as_str()
        && ns != event_namespace
    {
        return Err(ApiError::bad_request(format!(
            "the namespace of the provided object ({ns}) does not match the namespace sent on the request ({event_namespace})"
        )));
    }
    if !regarding.namespace.is_empty() && regarding.namespace != event_namespace {
        return Err(invalid(
            &format!("{regarding_field}.namespace"),
            &format!(
                "Invalid value: {:?}: does not match event.namespace",
                regarding.namespace
            ),
        ));
    }
    let event_type = match object["type"].as_str() {
        Some("Normal") | None => EventType::Normal,
        Some("Warning") => EventType::Warning,
        Some(other) => {
            return Err(invalid(
                "type",
                &format!("Unsupported value: {other:?}: supported values: \"Normal\", \"Warning\""),
            ));
        }
    };
    let reason = text(&object["reason"]);
    if reason.is_empty() {
        return Err(invalid("reason", "Required value"));
    }
    let component = if component.is_empty() {
        "unknown".to_owned()
    } else {
        component
    };
    let record = state.logs.events().record(NewEvent::new(
        regarding,
        event_type,
        &reason,
        text(&object[message_field]),
        &component,
    ));
    let view = if v1 {
        crate::events::events_v1(&record)
    } else {
        crate::events::core_v1(&record)
    };
    Ok(json_response(StatusCode::CREATED, &view))
}

/// GET of a collection: list, or watch with `?watch=true`.
pub async fn list(request: &Request<'_>) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        query,
        headers,
        ..
    } = *request;
    if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
        return super::watch::watch(request).await;
    }
    let (labels, fields) = selectors(query, resource.kind)?;
    let (items, rv) = list_objects(state, resource, namespace).await;
    let mut items: Vec<Value> = items
        .into_iter()
        .filter(|o| labels.matches(&o["metadata"]["labels"]) && fields.matches(o))
        .collect();
    let offset: usize = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => token
            .split_once(':')
            .and_then(|(_, o)| o.parse().ok())
            .ok_or_else(|| ApiError::bad_request(format!("continue: invalid token {token:?}")))?,
        None => 0,
    };
    items = items.into_iter().skip(offset).collect();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(limit) = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        && items.len() > limit
    {
        let remaining = items.len() - limit;
        items.truncate(limit);
        metadata["continue"] = json!(format!("{rv}:{}", offset + limit));
        metadata["remainingItemCount"] = json!(remaining);
    }
    if table::wants_table(accept(headers)) {
        return Ok(json_response(
            StatusCode::OK,
            &table::table(resource.kind, &items, &rv.to_string()),
        ));
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": format!("{}List", resource.kind), "apiVersion": resource.api_version(), "metadata": metadata, "items": items}),
    ))
}

pub async fn get(request: &Request<'_>, name: &str) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        headers,
        ..
    } = *request;
    let object = get_object(state, resource, namespace, name).await?;
    if table::wants_table(accept(headers)) {
        let rv = object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("0")
            .to_owned();
        return Ok(json_response(
            StatusCode::OK,
            &table::table(resource.kind, &[object], &rv),
        ));
    }
    Ok(json_response(StatusCode::OK, &object))
}

fn parse_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let ct = content_type(headers);
    if ct.contains("protobuf") || ct.contains("cbor") {
        // Clients fall back to JSON on 415 (client-go does, for protobuf and CBOR).
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct:?})"
            ),
        ));
    }
    if ct.contains("yaml") {
        serde_yaml_ng::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid YAML: {e}")))
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
    }
}

tokio::task_local! {
    /// The warnings of the request being answered (one `Warning: 299` header each).
    pub static WARNINGS: std::cell::RefCell<Vec<String>>;
}

/// Adds a warning to the answer of the request being served.
pub(super) fn warn(text: String) {
    let _ = WARNINGS.try_with(|w| w.borrow_mut().push(text));
}

fn dry_run(query: &Query) -> bool {
    query.get("dryRun").is_some_and(|v| v == "All")
}

/// POST to a collection.
pub async fn create(request: &Request<'_>) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        query,
        headers,
        body,
    } = *request;
    let mut object = parse_body(headers, body)?;
    if resource.source == Source::Events {
        return create_event(state, resource, namespace, object);
    }
    if object["metadata"]["name"]
        .as_str()
        .is_none_or(str::is_empty)
        && let Some(prefix) = object["metadata"]["generateName"].as_str()
    {
        let suffix: String = hex::encode(rand::random::<[u8; 3]>())
            .chars()
            .take(5)
            .collect();
        object["metadata"]["name"] = json!(format!("{prefix}{suffix}"));
    }
    let valid = prepare(resource, namespace, None, object, query)?;
    if resource.namespaced {
        state.admission().check_namespace(&valid.key.namespace)?;
    }
    let name = valid.key.name.clone();
    if dry_run(query) {
        return Ok(json_response(StatusCode::CREATED, &valid.body));
    }
    write(state, resource, &name, valid, WriteMode::Create, true).await
}

/// PUT of an object.
pub async fn update(request: &Request<'_>, name: &str) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        query,
        headers,
        body,
    } = *request;
    if resource.source == Source::Nodes {
        let settings_rv = node_settings_version(state, name);
        let before = get_object(state, resource, None, name).await?;
        let after = parse_body(headers, body)?;
        return edit_node(state, resource, name, before, after, settings_rv, query).await;
    }
    let valid = prepare(
        resource,
        namespace,
        Some(name),
        parse_body(headers, body)?,
        query,
    )?;
    if dry_run(query) {
        return Ok(json_response(StatusCode::OK, &valid.body));
    }
    let ordered = valid.resource_version.is_some();
    write(state, resource, name, valid, WriteMode::Update, ordered).await
}

fn parse_json_patch(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))
}

fn strip_server_fields(mut object: Value) -> Value {
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    object
}

/// Applies a patch body of content type `ct` to `target`.
fn apply_patch(ct: &str, body: &Bytes, target: &mut Value) -> Result<(), ApiError> {
    let patch_err =
        |e: PatchError| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e.to_string());
    if ct.starts_with("application/json-patch+json") {
        let ops: Value = parse_json_patch(body)?;
        patch::json_patch(target, &ops).map_err(patch_err)?;
    } else if ct.starts_with("application/merge-patch+json") {
        let p: Value = parse_json_patch(body)?;
        patch::merge_patch(target, &p);
    } else if ct.starts_with("application/strategic-merge-patch+json") {
        let p: Value = parse_json_patch(body)?;
        patch::strategic_merge_patch(target, &p).map_err(patch_err)?;
    } else if ct.starts_with("application/apply-patch") {
        let p: Value = serde_yaml_ng::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the apply configuration is not valid YAML: {e}"))
        })?;
        patch::strategic_merge_patch(target, &p).map_err(patch_err)?;
    } else {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {ct:?})"
            ),
        ));
    }
    Ok(())
}

/// PATCH of an object (merge, JSON, strategic merge, server-side apply).
pub async fn patch(request: &Request<'_>, name: &str) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        query,
        headers,
        body,
    } = *request;
    let ct = content_type(headers).to_owned();
    let ct = ct.as_str();
    if resource.source == Source::Nodes {
        return guaranteed_update(
            name,
            |e| e.code == StatusCode::CONFLICT,
            move || async move {
                let settings_rv = node_settings_version(state, name);
                let before = get_object(state, resource, None, name).await?;
                let mut after = before.clone();
                apply_patch(ct, body, &mut after)?;
                edit_node(state, resource, name, before, after, settings_rv, query).await
            },
        )
        .await;
    }
    let apply = ct.starts_with("application/apply-patch");
    let client_precondition = body_names_resource_version(body);
    // Read, patch, write with the read's resourceVersion as the precondition, and again from
    // the top when another write came in between (the apiserver's GuaranteedUpdate): a patch
    // changes only the fields it names, never reverting one written meanwhile (a binding, a
    // label patched through this agent at the same moment). A delete in between is retried
    // too for an apply, which then creates the object.
    let raced = |e: &ApiError| {
        !client_precondition
            && (e.code == StatusCode::CONFLICT || (apply && e.code == StatusCode::NOT_FOUND))
    };
    guaranteed_update(name, raced, move || async move {
        let current = get_object(state, resource, namespace, name).await;
        let (mut target, read_rv) = match current {
            Ok(o) => {
                let rv = o["metadata"]["resourceVersion"].as_str().map(str::to_owned);
                (strip_server_fields(o), rv)
            }
            Err(e) if apply && e.code == StatusCode::NOT_FOUND => (json!({}), None),
            Err(e) => return Err(e),
        };
        apply_patch(ct, body, &mut target)?;
        let mut valid = prepare(resource, namespace, Some(name), target, query)?;
        if !client_precondition {
            valid.resource_version = read_rv.clone();
        }
        if dry_run(query) {
            return Ok(json_response(StatusCode::OK, &valid.body));
        }
        // An apply of an object that was not there creates it; anything read is updated from
        // the version read.
        let mode = if read_rv.is_none() {
            WriteMode::Upsert
        } else {
            WriteMode::Update
        };
        write(state, resource, name, valid, mode, client_precondition).await
    })
    .await
}

/// The apiserver's GuaranteedUpdate, for every read-modify-write of the API: `update` reads
/// an object, changes it and writes it with the version it read as the precondition; when the
/// write lost a race with another (an error `raced` says is one), `update` runs again on the
/// newer version, at most [`PATCH_ATTEMPTS`] times. A change is never laid over a version it
/// did not see.
async fn guaranteed_update<F>(
    what: &str,
    raced: impl Fn(&ApiError) -> bool,
    mut update: impl FnMut() -> F,
) -> Result<Response, ApiError>
where
    F: std::future::Future<Output = Result<Response, ApiError>>,
{
    let mut attempt = 1;
    loop {
        match update().await {
            Err(e) if raced(&e) && attempt < PATCH_ATTEMPTS => {
                tracing::debug!(object = %what, attempt, "raced another write; again on the newer version");
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// How often a patch is applied again after losing a race with another write.
const PATCH_ATTEMPTS: u32 = 8;

/// Writes a validated object through [`Admission::write`] and answers with it: 201 when it
/// was created, 200 otherwise.
async fn write(
    state: &ApiState,
    resource: &ApiResource,
    name: &str,
    valid: shoal_state::ValidObject,
    mode: WriteMode,
    ordered: bool,
) -> Result<Response, ApiError> {
    let (object, created) = state
        .admission()
        .write(resource.kind, name, valid, mode, ordered)
        .await?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_response(
        code,
        &observed::with_status(state, resource.kind, object),
    ))
}

fn body_names_resource_version(body: &Bytes) -> bool {
    std::str::from_utf8(body).is_ok_and(|s| s.contains("resourceVersion"))
}

/// DELETE of an object; owned objects are deleted too unless `propagationPolicy=Orphan`.
pub async fn delete(request: &Request<'_>, name: &str) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        query,
        body,
        ..
    } = *request;
    let Some(info) = resource.kind_info() else {
        return Err(ApiError::method_not_allowed(format!(
            "{} are observed, not written",
            resource.plural
        )));
    };
    // DeleteOptions: refused when malformed (ignoring them would ignore preconditions).
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| {
                ApiError::bad_request("the request body is not a valid DeleteOptions object")
            })?
    };
    for (field, want) in [
        ("preconditions", "object"),
        ("propagationPolicy", "string"),
        ("gracePeriodSeconds", "integer"),
    ] {
        let v = &options[field];
        let ok = v.is_null()
            || match want {
                "object" => v.is_object(),
                "string" => v.is_string(),
                _ => v.is_i64(),
            };
        if !ok {
            return Err(ApiError::invalid(
                "DeleteOptions",
                "",
                field,
                &format!("Invalid value: {v}: must be of type {want}"),
            ));
        }
    }
    let policy = query
        .get("propagationPolicy")
        .cloned()
        .or_else(|| options["propagationPolicy"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "Background".into());
    if !matches!(policy.as_str(), "Background" | "Foreground" | "Orphan") {
        return Err(ApiError::invalid(
            "DeleteOptions",
            "",
            "propagationPolicy",
            &format!(
                "Unsupported value: {policy:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            ),
        ));
    }
    let uid = options["preconditions"]["uid"].as_str();
    let key = ObjectKey::new(info, namespace.unwrap_or(""), name);
    if let Some(want) = options["preconditions"]["resourceVersion"].as_str() {
        let current = get_object(state, resource, namespace, name).await?;
        let have = current["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("");
        if have != want {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({have}). The object might have been modified",
                    resource.plural
                ),
            ));
        }
    }
    if info.kind == "Namespace" {
        return terminate_namespace(state, resource, name, query).await;
    }
    if dry_run(query) {
        return get_object(state, resource, namespace, name)
            .await
            .map(|o| json_response(StatusCode::OK, &o));
    }
    if let Some(current) = state.replication.read(|s| s.get(&key)) {
        if let Some(want) = uid
            && current["metadata"]["uid"] != want
        {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {want}, UID in object meta: {}",
                    resource.plural,
                    current["metadata"]["uid"].as_str().unwrap_or("")
                ),
            ));
        }
        // An object with finalizers, or deleted in the foreground, stays (being deleted) until
        // they are gone (`controllers::garbage`); an orphaning delete says so on the object
        // first, so its tombstone tells every node to keep the dependents.
        let finalizers = current["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        // A pod on a node is deleted gracefully: its node stops it (within the grace period:
        // the DELETE's, else the pod's) and then deletes it; `--grace-period=0 --force` and
        // pods no node holds go at once.
        let grace = query
            .get("gracePeriodSeconds")
            .and_then(|g| g.parse::<i64>().ok())
            .or_else(|| options["gracePeriodSeconds"].as_i64());
        let pod = info.kind == "Pod" && info.group.is_empty();
        let pod_grace = pod
            .then(|| crate::controllers::garbage::pod_grace(&current, grace))
            .flatten();
        let graceful = pod_grace.is_some();
        let deferred = policy == "Foreground"
            || finalizers
            || graceful
            || (!pod && crate::controllers::garbage::deletion_requested(&current));
        if deferred || policy == "Orphan" {
            let marked = mark_for_deletion(
                state, resource, namespace, name, &policy, deferred, pod_grace,
            )
            .await?;
            if deferred {
                return Ok(json_response(
                    StatusCode::OK,
                    &observed::with_status(state, resource.kind, marked),
                ));
            }
        }
    }
    let object = state
        .replication
        .delete(&key, uid)
        .await
        .map_err(|e| write_error(resource.kind, name, e))?;
    // Its dependents are the garbage collector's (`controllers::garbage`): deleted, or orphaned
    // by the policy written on the object above, at its next round.
    Ok(json_response(
        StatusCode::OK,
        &observed::with_status(state, resource.kind, object),
    ))
}

/// Writes how `name` is being deleted ([`crate::controllers::garbage::mark_deleting`]; with
/// `deferred`, that it is being deleted, otherwise only the policy) over its stored version.
async fn mark_for_deletion(
    state: &ApiState,
    resource: &ApiResource,
    namespace: Option<&str>,
    name: &str,
    policy: &str,
    deferred: bool,
    grace: Option<u64>,
) -> Result<Value, ApiError> {
    let mut attempt = 1;
    loop {
        let mut current = get_object(state, resource, namespace, name).await?;
        let changed = if deferred {
            let marked =
                crate::controllers::garbage::mark_deleting(&mut current, policy, &now_rfc3339());
            let shortened =
                grace.is_some_and(|g| crate::controllers::garbage::set_grace(&mut current, g));
            marked || shortened
        } else {
            if !current["metadata"]["annotations"].is_object() {
                current["metadata"]["annotations"] = json!({});
            }
            let annotations = &mut current["metadata"]["annotations"];
            let unchanged = annotations[crate::controllers::garbage::POLICY_ANNOTATION] == policy;
            annotations[crate::controllers::garbage::POLICY_ANNOTATION] = json!(policy);
            !unchanged
        };
        if !changed {
            return Ok(current);
        }
        let read_rv = current["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_owned);
        let mut valid = prepare(
            resource,
            namespace,
            Some(name),
            strip_server_fields(current),
            &Query::default(),
        )?;
        valid.resource_version = read_rv;
        match state.replication.write(valid, WriteMode::Update).await {
            Ok((object, _)) => return Ok(object),
            Err(e) => {
                let e = write_error(resource.plural, name, e);
                if e.code != StatusCode::CONFLICT || attempt >= PATCH_ATTEMPTS {
                    return Err(e);
                }
                attempt += 1;
            }
        }
    }
}

/// DELETE of a Namespace, as Kubernetes does it: it turns `Terminating` (its deletionTimestamp
/// is set) and the namespace controller deletes what is in it, then the namespace itself.
async fn terminate_namespace(
    state: &ApiState,
    resource: &ApiResource,
    name: &str,
    query: &Query,
) -> Result<Response, ApiError> {
    if crate::controllers::namespace::UNDELETABLE.contains(&name) {
        let mut e = ApiError::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!("namespaces {name:?} is forbidden: this namespace may not be deleted"),
        );
        e.details = Some(json!({"name": name, "kind": "namespaces"}));
        return Err(e);
    }
    guaranteed_update(
        name,
        |e| e.code == StatusCode::CONFLICT,
        move || async move {
            let mut current = get_object(state, resource, None, name).await?;
            if crate::controllers::namespace::terminating(&current) || dry_run(query) {
                return Ok(json_response(StatusCode::OK, &current));
            }
            if !current["metadata"]["annotations"].is_object() {
                current["metadata"]["annotations"] = json!({});
            }
            current["metadata"]["annotations"]
                [crate::controllers::namespace::DELETION_ANNOTATION] = json!(now_rfc3339());
            let valid = prepare(
                resource,
                None,
                Some(name),
                strip_server_fields(current),
                query,
            )?;
            let (object, _) = state
                .replication
                .write(valid, WriteMode::Update)
                .await
                .map_err(|e| write_error(resource.plural, name, e))?;
            Ok(json_response(
                StatusCode::OK,
                &observed::with_status(state, resource.kind, object),
            ))
        },
    )
    .await
}

/// Subresources: status (observed, read-only), scale, log.
pub async fn subresource(
    request: &Request<'_>,
    name: &str,
    sub: &str,
    method: &Method,
) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        query,
        headers,
        body,
    } = *request;
    let allowed = resource.subresources().iter().any(|(s, _, _)| *s == sub);
    if !allowed {
        return Err(ApiError::not_found(
            &format!("{}/{sub}", resource.plural),
            name,
        ));
    }
    match (sub, method) {
        ("status", &Method::GET) => get(request, name).await,
        ("status", _) => Err(ApiError::method_not_allowed(
            "status is observed by the agents and cannot be written",
        )),
        ("scale", &Method::GET) => {
            let object = get_object(state, resource, namespace, name).await?;
            Ok(json_response(StatusCode::OK, &scale_of(&object)))
        }
        ("scale", &Method::PUT | &Method::PATCH) => {
            // Like a patch: written from the version read, again when another write raced it
            // (unless the Scale named the version it must apply to).
            let client_named = std::sync::atomic::AtomicBool::new(false);
            let client_named = &client_named;
            let raced = |e: &ApiError| {
                e.code == StatusCode::CONFLICT
                    && !client_named.load(std::sync::atomic::Ordering::Relaxed)
            };
            guaranteed_update(name, raced, move || async move {
                let object =
                    strip_server_fields(get_object(state, resource, namespace, name).await?);
                let mut scale = scale_of(&object);
                if method == Method::PUT {
                    scale = parse_body(headers, body)?;
                } else {
                    let ct = content_type(headers);
                    let p: Value = parse_json_patch(body)?;
                    if ct.starts_with("application/json-patch+json") {
                        patch::json_patch(&mut scale, &p)
                            .map_err(|e| ApiError::bad_request(e.to_string()))?;
                    } else {
                        patch::merge_patch(&mut scale, &p);
                    }
                }
                let replicas = scale["spec"]["replicas"]
                    .as_i64()
                    .filter(|r| *r >= 0)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "Scale",
                            name,
                            "spec.replicas",
                            &format!(
                                "Invalid value: {}: must be greater than or equal to 0",
                                scale["spec"]["replicas"]
                            ),
                        )
                    })?;
                let mut updated = object;
                let Some(spec) = updated.get_mut("spec").and_then(Value::as_object_mut) else {
                    return Err(ApiError::invalid(
                        resource.kind,
                        name,
                        "spec",
                        "Invalid value: must be an object",
                    ));
                };
                spec.insert("replicas".into(), json!(replicas));
                // A Scale naming a resourceVersion is the client's precondition; otherwise the
                // version read is.
                let client_rv = scale["metadata"]["resourceVersion"]
                    .as_str()
                    .map(str::to_owned);
                client_named.store(client_rv.is_some(), std::sync::atomic::Ordering::Relaxed);
                let ordered = client_rv.is_some();
                let precondition = client_rv.or_else(|| {
                    updated["metadata"]["resourceVersion"]
                        .as_str()
                        .map(str::to_owned)
                });
                if let Some(meta) = updated["metadata"].as_object_mut() {
                    meta.remove("resourceVersion");
                }
                let mut valid = prepare(resource, namespace, Some(name), updated, query)?;
                valid.resource_version = precondition;
                let written = if ordered {
                    state
                        .replication
                        .write_serialized(valid, WriteMode::Update)
                        .await
                } else {
                    state.replication.write(valid, WriteMode::Update).await
                };
                let (object, _) = written.map_err(|e| write_error(resource.kind, name, e))?;
                Ok(json_response(
                    StatusCode::OK,
                    &scale_of(&observed::with_status(state, resource.kind, object)),
                ))
            })
            .await
        }
        ("log", &Method::GET) => pod_log(state, resource, namespace, name, query).await,
        // `kubectl drain` evicts: the pod is deleted with the Eviction's DeleteOptions (no
        // PodDisruptionBudgets are served, so no eviction is refused for one).
        ("eviction", &Method::POST) => {
            let eviction = parse_body(headers, body)?;
            if let Some(named) = eviction["metadata"]["name"].as_str()
                && named != name
            {
                return Err(ApiError::bad_request(format!(
                    "name in URL does not match name in Eviction object ({named:?} is not {name:?})"
                )));
            }
            let options = eviction.get("deleteOptions").cloned().unwrap_or(json!({}));
            let options = Bytes::from(options.to_string());
            delete(
                &Request {
                    body: &options,
                    ..*request
                },
                name,
            )
            .await?;
            Ok(json_response(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {sub}"
        ))),
    }
}

fn scale_of(object: &Value) -> Value {
    let selector = object["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": object["metadata"]["name"],
            "namespace": object["metadata"]["namespace"],
            "uid": object["metadata"]["uid"],
            "resourceVersion": object["metadata"]["resourceVersion"],
            "creationTimestamp": object["metadata"]["creationTimestamp"],
        },
        "spec": {"replicas": object["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {"replicas": object["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector},
    })
}

/// `pods/{name}/log`: read from the node running the pod; `follow` streams until the
/// container ends or the client leaves.
async fn pod_log(
    state: &ApiState,
    resource: &ApiResource,
    namespace: Option<&str>,
    name: &str,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    use crate::kubelet::logs::LogQuery;
    use crate::kubelet::node_service::LogRequest;
    let pod = get_object(state, resource, namespace, name).await?;
    let container =
        super::stream::pick_container(&pod, query.get("container").map(String::as_str), name)?;
    let Some(node) = pod["spec"]["nodeName"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
    else {
        return Err(ApiError::bad_request(format!(
            "container {container:?} in pod {name:?} is waiting to start: the pod is not scheduled yet"
        )));
    };
    let number = |key: &str| -> Result<Option<usize>, ApiError> {
        query
            .get(key)
            .map(|v| {
                v.parse::<usize>()
                    .map_err(|_| ApiError::bad_request(format!("{key}: invalid value {v:?}")))
            })
            .transpose()
    };
    let flag = |key: &str| query.get(key).is_some_and(|v| v == "true");
    // A container that never ran has no log: say why it waits, as the apiserver does.
    let status = state.pod_statuses.status_of(&pod);
    let container_state = status.as_ref().and_then(|s| {
        ["containerStatuses", "initContainerStatuses"]
            .iter()
            .flat_map(|f| s[f].as_array().into_iter().flatten())
            .find(|c| c["name"] == container.as_str())
            .cloned()
    });
    let never_ran = container_state.as_ref().is_none_or(|c| {
        c["state"].get("waiting").is_some() && c["lastState"].get("terminated").is_none()
    });
    if never_ran && !flag("previous") {
        let reason = container_state
            .as_ref()
            .and_then(|c| c["state"]["waiting"]["reason"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "ContainerCreating".to_owned());
        return Err(ApiError::bad_request(format!(
            "container {container:?} in pod {name:?} is waiting to start: {reason}"
        )));
    }
    let mut request = LogRequest {
        uid: pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        container: container.clone(),
        previous: flag("previous"),
        query: LogQuery {
            tail_lines: number("tailLines")?,
            timestamps: flag("timestamps"),
            limit_bytes: number("limitBytes")?,
            from_offset: None,
        },
    };
    let (first, running) = state.logs.read(&node, request.clone()).await.map_err(|e| {
        ApiError::bad_request(format!("container {container:?} in pod {name:?}: {e}"))
    })?;
    let text_plain = [(header::CONTENT_TYPE, "text/plain")];
    if !flag("follow") || !running {
        return Ok((StatusCode::OK, text_plain, first.text).into_response());
    }
    let logs = state.logs.clone();
    request.query.tail_lines = None;
    request.query.limit_bytes = None;
    let stream = futures_util::stream::unfold(
        (Some(first), request, true),
        move |(pending, mut request, running)| {
            let logs = logs.clone();
            let node = node.clone();
            async move {
                if let Some(chunk) = pending {
                    request.query.from_offset = Some(chunk.next_offset);
                    return Some((
                        Ok::<_, std::io::Error>(Bytes::from(chunk.text)),
                        (None, request, running),
                    ));
                }
                if !running {
                    return None;
                }
                loop {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    let (chunk, still) = logs.read(&node, request.clone()).await.ok()?;
                    if !chunk.text.is_empty() || !still {
                        request.query.from_offset = Some(chunk.next_offset);
                        return Some((Ok(Bytes::from(chunk.text)), (None, request, still)));
                    }
                }
            }
        },
    );
    Ok((StatusCode::OK, text_plain, Body::from_stream(stream)).into_response())
}

/// A request on one object: its verbs, or a subresource.
pub async fn object(
    request: &Request<'_>,
    name: &str,
    subresource: Option<&str>,
    method: &Method,
) -> Result<Response, ApiError> {
    if let Some(sub) = subresource {
        return self::subresource(request, name, sub, method).await;
    }
    match *method {
        Method::GET => get(request, name).await,
        Method::PUT => update(request, name).await,
        Method::PATCH => patch(request, name).await,
        Method::DELETE => delete(request, name).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not allowed on an object"
        ))),
    }
}

/// DELETE of a collection (`deletecollection`): every object the label and field selectors
/// match is deleted as a DELETE of it by name would be (with the same DeleteOptions: grace,
/// propagation, preconditions, dry run), and the list of what was deleted is the answer, as
/// the apiserver answers.
pub async fn delete_collection(request: &Request<'_>) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        query,
        ..
    } = *request;
    if !resource.verbs().contains(&"deletecollection") {
        return Err(ApiError::method_not_allowed(format!(
            "deleting a collection of {} is not supported; delete them by name",
            resource.plural
        )));
    }
    let (labels, fields) = selectors(query, resource.kind)?;
    let (items, rv) = list_objects(state, resource, namespace).await;
    let mut deleted = Vec::new();
    for item in items
        .into_iter()
        .filter(|o| labels.matches(&o["metadata"]["labels"]) && fields.matches(o))
    {
        let Some(name) = item["metadata"]["name"].as_str().map(str::to_owned) else {
            continue;
        };
        let item_namespace = item["metadata"]["namespace"].as_str().map(str::to_owned);
        let one = Request {
            namespace: item_namespace.as_deref().or(namespace),
            ..*request
        };
        match delete(&one, &name).await {
            Ok(_) => deleted.push(item),
            // Gone meanwhile (another client, a controller): not an error of this request.
            Err(e) if e.code == StatusCode::NOT_FOUND => {}
            Err(e) => return Err(e),
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": format!("{}List", resource.kind),
            "apiVersion": resource.api_version(),
            "metadata": {"resourceVersion": rv.to_string()},
            "items": deleted,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_below_quorum_says_whether_it_was_stored() {
        let stored = write_error(
            "ConfigMap",
            "c",
            WriteError::NotDurable {
                acked: 1,
                needed: 2,
                why: "confirmed it within 5s".into(),
            },
        )
        .to_status();
        let nothing = write_error(
            "ConfigMap",
            "c",
            WriteError::Unavailable {
                reachable: 1,
                needed: 2,
            },
        )
        .to_status();
        for (status, cause) in [(&stored, "NotDurable"), (&nothing, "Unavailable")] {
            assert_eq!(status["code"], 503);
            assert_eq!(status["reason"], "ServiceUnavailable");
            assert_eq!(status["details"]["causes"][0]["reason"], cause, "{status}");
            assert_eq!(status["details"]["name"], "c");
        }
        assert!(
            nothing["message"]
                .as_str()
                .unwrap()
                .contains("nothing was written")
        );
    }
}

//! The resource verbs and what they share: create, update and patch here (writes go through
//! `admission`), reads in `read`, deletes in `delete`, subresources in `subresource`, watches
//! in `watch`.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use shoal_state::{ObjectKey, WriteMode};

use super::ApiState;
use super::admission::prepare;
use super::observed;
use super::patch::{self, PatchError};
use super::resources::{ApiResource, Source};
use super::status::ApiError;
use shoal_model::selector::{FieldSelector, LabelSelector};

pub use super::delete::{delete, delete_collection};
pub(super) use super::read::get_object;
pub use super::read::{get, list, list_objects};
pub(super) use super::status::{object_error, write_error};
pub use super::subresource::subresource;

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

pub(super) fn json_response(code: StatusCode, value: &Value) -> Response {
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

pub(super) fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
}

pub(super) fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
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

/// POST of an Event (client-go's event recorders, `kubectl create -f`): recorded in this
/// node's event log, aggregated with its repeats like the events Shoal records itself.
fn create_event(
    state: &ApiState,
    resource: &ApiResource,
    namespace: Option<&str>,
    object: Value,
) -> Result<Response, ApiError> {
    use crate::observed::events::{EventType, NewEvent, ObjectRef};
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
        crate::observed::events::events_v1(&record)
    } else {
        crate::observed::events::core_v1(&record)
    };
    Ok(json_response(StatusCode::CREATED, &view))
}

pub(super) fn parse_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
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

pub(super) fn dry_run(query: &Query) -> bool {
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

pub(super) fn parse_json_patch(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the patch is not valid JSON: {e}")))
}

pub(super) fn strip_server_fields(mut object: Value) -> Value {
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
pub(super) async fn guaranteed_update<F>(
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
pub(super) const PATCH_ATTEMPTS: u32 = 8;

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

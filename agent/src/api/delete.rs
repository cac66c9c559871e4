//! DELETE of an object and of a collection, as the apiserver does them: preconditions, graceful
//! pod deletion, finalizers and foreground deletion, a Namespace turning Terminating; dependents
//! are the garbage collector's (`controllers::garbage`).

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use shoal_state::{ObjectKey, WriteMode};

use super::ApiState;
use super::admission::prepare;
use super::handlers::{
    PATCH_ATTEMPTS, Query, Request, dry_run, guaranteed_update, json_response, now_rfc3339,
    selectors, strip_server_fields, write_error,
};
use super::observed;
use super::read::{get_object, list_objects};
use super::resources::ApiResource;
use super::status::ApiError;

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
            .then(|| shoal_core::controllers::garbage::pod_grace(&current, grace))
            .flatten();
        let graceful = pod_grace.is_some();
        let deferred = policy == "Foreground"
            || finalizers
            || graceful
            || (!pod && shoal_core::controllers::garbage::deletion_requested(&current));
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

/// Writes how `name` is being deleted ([`shoal_core::controllers::garbage::mark_deleting`]; with
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
            let marked = shoal_core::controllers::garbage::mark_deleting(
                &mut current,
                policy,
                &now_rfc3339(),
            );
            let shortened =
                grace.is_some_and(|g| shoal_core::controllers::garbage::set_grace(&mut current, g));
            marked || shortened
        } else {
            if !current["metadata"]["annotations"].is_object() {
                current["metadata"]["annotations"] = json!({});
            }
            let annotations = &mut current["metadata"]["annotations"];
            let unchanged =
                annotations[shoal_core::controllers::garbage::POLICY_ANNOTATION] == policy;
            annotations[shoal_core::controllers::garbage::POLICY_ANNOTATION] = json!(policy);
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
    if shoal_core::controllers::namespace::UNDELETABLE.contains(&name) {
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
            if shoal_core::controllers::namespace::terminating(&current) || dry_run(query) {
                return Ok(json_response(StatusCode::OK, &current));
            }
            if !current["metadata"]["annotations"].is_object() {
                current["metadata"]["annotations"] = json!({});
            }
            current["metadata"]["annotations"]
                [shoal_core::controllers::namespace::DELETION_ANNOTATION] = json!(now_rfc3339());
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

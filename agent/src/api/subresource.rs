//! Subresources: status (observed, read-only), scale, log, eviction, a ServiceAccount's token.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use shoal_state::WriteMode;

use super::ApiState;
use super::admission::prepare;
use super::delete::delete;
use super::handlers::{
    Request, content_type, guaranteed_update, json_response, parse_body, parse_json_patch,
    strip_server_fields, write_error,
};
use super::observed;
use super::patch::{self};
use super::read::{get, get_object};
use super::resources::ApiResource;
use super::status::ApiError;

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
        ("token", &Method::POST) => {
            let account = get_object(state, resource, namespace, name).await?;
            let review = parse_body(headers, body)?;
            token_request(state, &account, review)
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {sub}"
        ))),
    }
}

/// `TokenRequest` (`kubectl create token`): a token for ServiceAccount `account`, for the
/// audiences and lifetime the request's spec asks (an hour by default, at least 10 minutes),
/// bound to the pod its `boundObjectRef` names if it names one.
fn token_request(
    state: &ApiState,
    account: &Value,
    mut review: Value,
) -> Result<Response, ApiError> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let name = text(&account["metadata"]["name"]);
    let namespace = text(&account["metadata"]["namespace"]);
    let invalid =
        |field: &str, detail: String| ApiError::invalid("TokenRequest", &name, field, &detail);
    let spec = &review["spec"];
    let seconds = match &spec["expirationSeconds"] {
        Value::Null => crate::tokens::DEFAULT_SECONDS,
        v => match v.as_u64() {
            Some(s) if s < crate::tokens::MIN_SECONDS => {
                return Err(invalid(
                    "spec.expirationSeconds",
                    format!("Invalid value: {s}: may not specify a duration less than 10 minutes"),
                ));
            }
            Some(s) if s > crate::tokens::MAX_SECONDS => {
                return Err(invalid(
                    "spec.expirationSeconds",
                    format!(
                        "Invalid value: {s}: may not specify a duration larger than 2^32 seconds"
                    ),
                ));
            }
            Some(s) => s,
            None => {
                return Err(invalid(
                    "spec.expirationSeconds",
                    format!("Invalid value: {v}: must be a positive integer"),
                ));
            }
        },
    };
    let audiences: Vec<String> = match &spec["audiences"] {
        Value::Null => Vec::new(),
        Value::Array(list) if list.len() <= 16 => list
            .iter()
            .map(|a| a.as_str().filter(|a| !a.is_empty() && a.len() <= 512).map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("spec.audiences", "Invalid value: each audience must be a non-empty string of at most 512 characters".into()))?,
        _ => {
            return Err(invalid(
                "spec.audiences",
                "Invalid value: must be a list of at most 16 audiences".into(),
            ));
        }
    };
    let (pod, node) = match &spec["boundObjectRef"] {
        Value::Null => (None, None),
        bound => {
            if bound["kind"] != "Pod" {
                return Err(invalid(
                    "spec.boundObjectRef.kind",
                    format!(
                        "Unsupported value: {}: supported values: \"Pod\"",
                        bound["kind"]
                    ),
                ));
            }
            let pod_name = text(&bound["name"]);
            let pod = state
                .replication
                .read(|s| {
                    let info = shoal_state::kind::lookup("v1", "Pod")?;
                    s.get(&shoal_state::ObjectKey::new(info, &namespace, &pod_name))
                })
                .ok_or_else(|| ApiError::not_found("pods", &pod_name))?;
            let uid = text(&pod["metadata"]["uid"]);
            if let Some(asked) = bound["uid"].as_str().filter(|u| !u.is_empty())
                && asked != uid
            {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "the UID in the bound object reference ({asked}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"
                    ),
                ));
            }
            let node = pod["spec"]["nodeName"]
                .as_str()
                .map(|n| crate::tokens::Ref {
                    name: n.to_owned(),
                    uid: String::new(),
                });
            (
                Some(crate::tokens::Ref {
                    name: pod_name,
                    uid,
                }),
                node,
            )
        }
    };
    let request = crate::tokens::Request {
        namespace,
        account: crate::tokens::Ref {
            name,
            uid: text(&account["metadata"]["uid"]),
        },
        audiences,
        seconds,
        pod,
        node,
    };
    let (token, claims) = state
        .tokens
        .signer
        .issue(&request, super::unix_seconds())
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                e.to_string(),
            )
        })?;
    review["apiVersion"] = json!("authentication.k8s.io/v1");
    review["kind"] = json!("TokenRequest");
    review["spec"]["audiences"] = json!(claims.aud);
    review["spec"]["expirationSeconds"] = json!(seconds);
    review["status"] = json!({
        "token": token,
        "expirationTimestamp": shoal_core::controllers::workload::rfc3339_seconds(claims.exp.saturating_mul(1000)),
    });
    Ok(json_response(StatusCode::CREATED, &review))
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

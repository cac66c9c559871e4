//! GET and LIST of objects, stored and derived (nodes, events, endpoints, metrics).

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use shoal_state::ObjectKey;

use super::ApiState;
use super::handlers::{Request, accept, json_response, now_rfc3339, selectors};
use super::observed;
use super::resources::{ApiResource, Source};
use super::status::ApiError;
use super::table;

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
            let images = node_images(&state.membership).await;
            (
                members
                    .iter()
                    .map(|m| {
                        let mut node = observed::node(
                            m,
                            &now,
                            blocks.get(&m.node_id).copied(),
                            settings.get(m.name()),
                        );
                        if let Some(list) = images.get(&m.node_id) {
                            node["status"]["images"] = observed::node_images(list);
                        }
                        node
                    })
                    .collect(),
                state.replication.read(|s| s.resource_version()),
            )
        }
        Source::Events => {
            let view = if resource.group == "events.k8s.io" {
                crate::observed::events::events_v1
            } else {
                crate::observed::events::core_v1
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
            )
            .await,
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

/// The images each node gossips (`node.images`: tag → manifest digest), by node id.
async fn node_images(
    membership: &shoal_gossip::Membership,
) -> std::collections::HashMap<String, std::collections::BTreeMap<String, String>> {
    let key = shoal_gossip::keys::IMAGES;
    let mut out: std::collections::HashMap<_, _> = membership
        .peer_values(key)
        .await
        .into_iter()
        .filter_map(|p| Some((p.node_id, p.value?.ok()?)))
        .collect();
    if let Some(Ok(own)) = membership.own_value(key).await {
        out.insert(membership.node_id().to_owned(), own);
    }
    out
}

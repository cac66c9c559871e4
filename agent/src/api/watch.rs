//! Watches: of stored kinds, from the store's change log and live changes; of derived kinds
//! (Nodes, Endpoints, EndpointSlices), by listing again and sending what differs.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use shoal_state::{Change, EventType, ObjectKey};
use tokio::sync::broadcast::error::RecvError;

use super::ApiState;
use super::handlers::{Query, Request, accept, list_objects, selectors};
use super::observed;
use super::resources::Source;
use super::status::ApiError;
use super::table;

fn event_line(event: &str, object: Value, table_kind: Option<&str>) -> Bytes {
    let object = match table_kind {
        Some(kind) => {
            let rv = object["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("0")
                .to_owned();
            table::table(kind, &[object], &rv)
        }
        None => object,
    };
    let mut line = json!({"type": event, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// When a watch ends: `timeoutSeconds` (default an hour), at most a day (a huge one would
/// overflow the clock).
fn watch_deadline(query: &Query) -> tokio::time::Instant {
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(Duration::from_secs(3600), |s| {
            Duration::from_secs(s.min(24 * 3600))
        });
    tokio::time::Instant::now() + timeout
}

/// A watch: chunked newline-delimited JSON events.
pub(super) async fn watch(request: &Request<'_>) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        query,
        headers,
        ..
    } = *request;
    let Source::Stored(info) = resource.source else {
        return match resource.source {
            Source::Nodes | Source::Endpoints | Source::EndpointSlices | Source::Events => {
                derived_watch(request).await
            }
            _ => Err(ApiError::method_not_allowed(format!(
                "watching {} is not supported",
                resource.plural
            ))),
        };
    };
    let (labels, fields) = selectors(query, resource.kind)?;
    let table_kind = table::wants_table(accept(headers)).then_some(resource.kind);
    // Subscribe before reading the store, so no change falls between the two.
    let changes = state.replication.subscribe();
    let rv = query
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && *v != "0");
    let send_initial = query.get("sendInitialEvents").is_some_and(|v| v == "true");
    let mut initial: Vec<Bytes> = Vec::new();
    let mut last_rv = 0u64;
    let namespace = namespace.map(str::to_owned);
    let matches = {
        let namespace = namespace.clone();
        // A selector on status fields reads the observed status, as a list does.
        let status_view = fields.reads_status().then(|| state.clone());
        move |key: &ObjectKey, object: &Value| {
            key.group == info.group
                && key.kind == info.kind
                && namespace.as_deref().is_none_or(|ns| key.namespace == ns)
                && labels.matches(&object["metadata"]["labels"])
                && match &status_view {
                    Some(api) => {
                        fields.matches(&observed::with_status(api, info.kind, object.clone()))
                    }
                    None => fields.matches(object),
                }
        }
    };
    match rv {
        // Resume after a resourceVersion: replay what changed since.
        Some(rv) if !send_initial => {
            let from: u64 = rv.parse().map_err(|_| {
                ApiError::bad_request(format!("resourceVersion: invalid value {rv:?}"))
            })?;
            match state.replication.read(|s| s.changes_since(from)) {
                Ok(past) => {
                    for c in past.into_iter().filter(|c| matches(&c.key, &c.object)) {
                        last_rv = last_rv.max(c.resource_version);
                        initial.push(change_line(state, &c, info.kind, table_kind));
                    }
                    last_rv = last_rv.max(from);
                }
                Err(e) => {
                    let gone =
                        ApiError::new(StatusCode::GONE, "Expired", e.to_string()).to_status();
                    initial.push(event_line("ERROR", gone, None));
                    let body = Body::from_stream(futures_util::stream::iter(
                        initial.into_iter().map(Ok::<_, std::io::Error>),
                    ));
                    return Ok((
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "application/json")],
                        body,
                    )
                        .into_response());
                }
            }
        }
        // No resourceVersion, or initial events asked for: the current state as ADDED events.
        _ => {
            let (items, list_rv) = state.replication.read(|s| {
                (
                    s.list(info.group, info.kind, namespace.as_deref()),
                    s.resource_version(),
                )
            });
            for o in items {
                let key = ObjectKey::new(
                    info,
                    o["metadata"]["namespace"].as_str().unwrap_or(""),
                    o["metadata"]["name"].as_str().unwrap_or(""),
                );
                if matches(&key, &o) {
                    initial.push(event_line(
                        "ADDED",
                        observed::with_status(state, info.kind, o),
                        table_kind,
                    ));
                }
            }
            last_rv = list_rv;
            if send_initial {
                let bookmark = json!({
                    "kind": resource.kind, "apiVersion": resource.api_version(),
                    "metadata": {"resourceVersion": list_rv.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}},
                });
                initial.push(event_line("BOOKMARK", bookmark, None));
            }
        }
    }
    let deadline = watch_deadline(query);
    let kind = info.kind;
    let api = state.clone();
    // Pods also change when their node reports a new status (observed state, not a store
    // write): those come as MODIFIED events at the pod's current resourceVersion.
    let statuses = (info.kind == "Pod").then(|| state.pod_statuses.subscribe());
    // Deployments and ReplicaSets count their pods at read time: their status changes without
    // a store write, so a watch looks again every few hundred milliseconds and sends MODIFIED
    // for each watched object whose status changed (what `kubectl rollout status` waits on).
    let workloads = matches!(
        info.kind,
        "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet" | "Job" | "CronJob"
    )
    .then(WorkloadWatch::new);
    // `allowWatchBookmarks`: a BOOKMARK every BOOKMARK_INTERVAL with the last version seen.
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true")
        .then(|| {
            let mut ticker = tokio::time::interval_at(
                tokio::time::Instant::now() + BOOKMARK_INTERVAL,
                BOOKMARK_INTERVAL,
            );
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker
        });
    let api_version = resource.api_version();
    let live = futures_util::stream::unfold(
        (changes, last_rv, false, statuses, workloads, bookmarks),
        move |(mut rx, mut last, done, mut statuses, mut workloads, mut bookmarks)| {
            let matches = matches.clone();
            let api = api.clone();
            let api_version = api_version.clone();
            let namespace = namespace.clone();
            async move {
                if done {
                    return None;
                }
                loop {
                    if let Some(line) = workloads.as_mut().and_then(|w| w.pending.pop_front()) {
                        return Some((Ok(line), (rx, last, false, statuses, workloads, bookmarks)));
                    }
                    let workload_tick = async {
                        match workloads.as_mut() {
                            Some(w) => w.ticker.tick().await,
                            None => std::future::pending().await,
                        }
                    };
                    let status_change = async {
                        match statuses.as_mut() {
                            Some(s) => s.recv().await,
                            None => std::future::pending().await,
                        }
                    };
                    let bookmark_tick = async {
                        match bookmarks.as_mut() {
                            Some(b) => b.tick().await,
                            None => std::future::pending().await,
                        }
                    };
                    let next = tokio::select! {
                        change = rx.recv() => Some(change),
                        _ = workload_tick => {
                            let w = workloads.as_mut().expect("ticks only with a workload watch");
                            let objects = api
                                .replication
                                .read(|s| s.list(info.group, info.kind, namespace.as_deref()));
                            for o in objects {
                                let key = ObjectKey::new(
                                    info,
                                    o["metadata"]["namespace"].as_str().unwrap_or(""),
                                    o["metadata"]["name"].as_str().unwrap_or(""),
                                );
                                if !matches(&key, &o) {
                                    continue;
                                }
                                let object = observed::with_status(&api, kind, o);
                                if let Some(line) = w.changed(object, table_kind) {
                                    w.pending.push_back(line);
                                }
                            }
                            w.seeded = true;
                            None
                        }
                        status = status_change => {
                            if let Ok(c) = status {
                                let key = ObjectKey::new(info, &c.namespace, &c.name);
                                let pod = api.replication.read(|s| s.get(&key));
                                if let Some(pod) = pod.filter(|p| p["metadata"]["uid"] == c.uid.as_str() && matches(&key, p)) {
                                    let line = event_line(
                                        "MODIFIED",
                                        observed::with_status(&api, kind, pod),
                                        table_kind,
                                    );
                                    return Some((Ok(line), (rx, last, false, statuses, workloads, bookmarks)));
                                }
                            }
                            None
                        }
                        // Every change up to `last` has been sent (or did not match): a
                        // client may resume from here without relisting.
                        _ = bookmark_tick => {
                            let bookmark = json!({
                                "kind": kind, "apiVersion": api_version,
                                "metadata": {"resourceVersion": last.to_string()},
                            });
                            return Some((
                                Ok(event_line("BOOKMARK", bookmark, None)),
                                (rx, last, false, statuses, workloads, bookmarks),
                            ));
                        }
                        _ = tokio::time::sleep_until(deadline) => return None,
                    };
                    let Some(next) = next else { continue };
                    match next {
                        Ok(change) => {
                            if change.resource_version <= last {
                                continue;
                            }
                            // Seen, matching or not (a bookmark may name it).
                            last = change.resource_version;
                            if !matches(&change.key, &change.object) {
                                continue;
                            }
                            let line = change_line(&api, &change, kind, table_kind);
                            if let Some(w) = workloads.as_mut() {
                                // What this event says is what the watcher now knows.
                                w.remember(&change.object, &api, kind);
                            }
                            return Some((
                                Ok::<_, std::io::Error>(line),
                                (rx, last, false, statuses, workloads, bookmarks),
                            ));
                        }
                        Err(RecvError::Lagged(_)) => {
                            let gone = ApiError::new(
                                StatusCode::GONE,
                                "Expired",
                                "the watch fell behind; relist",
                            )
                            .to_status();
                            return Some((
                                Ok(event_line("ERROR", gone, None)),
                                (rx, last, true, statuses, workloads, bookmarks),
                            ));
                        }
                        Err(RecvError::Closed) => return None,
                    }
                }
            }
        },
    );
    let stream = futures_util::StreamExt::chain(
        futures_util::stream::iter(initial.into_iter().map(Ok::<_, std::io::Error>)),
        live,
    );
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// How often a watch that allows bookmarks gets one (the apiserver sends them about once a
/// minute; client-go only needs them to be regular).
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(10);

/// What a derived object says, without what changes on every read (a Node's heartbeat time).
fn fingerprint(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(meta) = object["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    if let Some(conditions) = object["status"]["conditions"].as_array_mut() {
        for c in conditions {
            if let Some(c) = c.as_object_mut() {
                c.remove("lastHeartbeatTime");
            }
        }
    }
    object
}

/// A watch of objects derived at read time (Nodes from membership; Endpoints and
/// EndpointSlices from Services and their pods' gossiped statuses): nothing is written when
/// they change, so the watch lists again every 250 ms and sends what differs as ADDED,
/// MODIFIED and DELETED. With a resourceVersion (a client resuming after its list), the
/// current state counts as known; without one it is sent as ADDED events first.
async fn derived_watch(request: &Request<'_>) -> Result<Response, ApiError> {
    let Request {
        state,
        resource,
        namespace,
        query,
        headers,
        ..
    } = *request;
    let (labels, fields) = selectors(query, resource.kind)?;
    let table_kind = table::wants_table(accept(headers)).then_some(resource.kind);
    let announce = query.get("sendInitialEvents").is_some_and(|v| v == "true")
        || query
            .get("resourceVersion")
            .is_none_or(|v| v.is_empty() || v == "0");
    let deadline = watch_deadline(query);
    let state = state.clone();
    let resource = *resource;
    let namespace = namespace.map(str::to_owned);
    let key = |o: &Value| {
        format!(
            "{}/{}",
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or("")
        )
    };
    let look = move |state: ApiState, namespace: Option<String>| {
        let labels = labels.clone();
        let fields = fields.clone();
        async move {
            list_objects(&state, &resource, namespace.as_deref())
                .await
                .0
                .into_iter()
                .filter(|o| labels.matches(&o["metadata"]["labels"]) && fields.matches(o))
                .map(|o| (key(&o), o))
                .collect::<std::collections::BTreeMap<String, Value>>()
        }
    };
    let mut sent: HashMap<String, Value> = HashMap::new();
    let mut pending = std::collections::VecDeque::new();
    for (k, o) in look(state.clone(), namespace.clone()).await {
        sent.insert(k, fingerprint(&o));
        if announce {
            pending.push_back(event_line("ADDED", o, table_kind));
        }
    }
    // Events are gathered from every node over QUIC: looked at once a second, not four times.
    let period = if resource.source == Source::Events {
        Duration::from_secs(1)
    } else {
        Duration::from_millis(250)
    };
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stream = futures_util::stream::unfold(
        (sent, pending, ticker),
        move |(mut sent, mut pending, mut ticker)| {
            let state = state.clone();
            let namespace = namespace.clone();
            let look = look.clone();
            async move {
                loop {
                    if let Some(line) = pending.pop_front() {
                        return Some((Ok::<_, std::io::Error>(line), (sent, pending, ticker)));
                    }
                    tokio::select! {
                        _ = ticker.tick() => {}
                        _ = tokio::time::sleep_until(deadline) => return None,
                    }
                    let now = look(state.clone(), namespace.clone()).await;
                    for (k, o) in &now {
                        let print = fingerprint(o);
                        match sent.insert(k.clone(), print.clone()) {
                            None => pending.push_back(event_line("ADDED", o.clone(), table_kind)),
                            Some(before) if before != print => {
                                pending.push_back(event_line("MODIFIED", o.clone(), table_kind))
                            }
                            Some(_) => {}
                        }
                    }
                    let gone: Vec<String> = sent
                        .keys()
                        .filter(|k| !now.contains_key(*k))
                        .cloned()
                        .collect();
                    for k in gone {
                        if let Some(last) = sent.remove(&k) {
                            pending.push_back(event_line("DELETED", last, table_kind));
                        }
                    }
                }
            }
        },
    );
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The statuses a workload watch last sent, and the MODIFIED events it owes.
struct WorkloadWatch {
    ticker: tokio::time::Interval,
    sent: HashMap<String, Value>,
    pending: std::collections::VecDeque<Bytes>,
    /// The first look only learns what the initial events said.
    seeded: bool,
}

impl WorkloadWatch {
    fn new() -> Self {
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            ticker,
            sent: HashMap::new(),
            pending: std::collections::VecDeque::new(),
            seeded: false,
        }
    }

    /// A MODIFIED line if `object`'s status differs from what was last sent for it.
    fn changed(&mut self, object: Value, table_kind: Option<&str>) -> Option<Bytes> {
        let uid = object["metadata"]["uid"].as_str()?.to_owned();
        let status = object["status"].clone();
        let before = self.sent.insert(uid, status.clone());
        (self.seeded && before.as_ref() != Some(&status))
            .then(|| event_line("MODIFIED", object, table_kind))
    }

    fn remember(&mut self, stored: &Value, state: &ApiState, kind: &str) {
        let object = observed::with_status(state, kind, stored.clone());
        if let Some(uid) = object["metadata"]["uid"].as_str() {
            self.sent.insert(uid.to_owned(), object["status"].clone());
        }
    }
}

fn change_line(state: &ApiState, change: &Change, kind: &str, table_kind: Option<&str>) -> Bytes {
    let event = match change.event {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    };
    event_line(
        event,
        observed::with_status(state, kind, change.object.clone()),
        table_kind,
    )
}

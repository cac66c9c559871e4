//! Events (core/v1 `Event` and events.k8s.io/v1): what the scheduler, the kubelet and node
//! lifecycle report about objects, for `kubectl get events`, `kubectl events` and the Events
//! section of `kubectl describe`.
//!
//! Events are **observed state owned by the node that saw them**, not desired state: each node
//! keeps its own in a bounded log (an hour by default, and at most `max_per_namespace` per
//! namespace, the least recently seen dropped first), and any agent's API gathers them from
//! every live node over QUIC when asked (as it gathers logs and metrics). Putting them in the
//! replicated store instead would make every probe failure a quorum write, a tombstone and
//! anti-entropy traffic on every node, for data whose only promise in Kubernetes is "recent and
//! best effort" (the apiserver keeps them one hour by default). The price, stated: a node that
//! dies takes its events with it.
//!
//! Like client-go's event correlator, an event that repeats (same object, reason, message,
//! type and source) is one Event whose `count` grows and whose `lastTimestamp` moves.
//!
//! [`EventLog`] is the pure core (time is an input); [`Recorder`] is the shell's handle on it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use shoal_model::event::{EventType, KUBELET, NODE_CONTROLLER, NewEvent, ObjectRef, SCHEDULER};

/// How many events a node keeps per namespace (the least recently seen go first).
pub const MAX_PER_NAMESPACE: usize = 1000;

/// The longest message kept (events.k8s.io/v1 limits `note` to 1 kB).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// The least time between two revisions of an event's text (`EventLog::revise`).
pub const REVISE_FLOOR_MS: u64 = 1_000;

/// One aggregated event, as a node keeps it and sends it to the API that asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    /// `<object name>.<hex nanoseconds of the first occurrence>`, as Kubernetes names them.
    pub name: String,
    pub regarding: ObjectRef,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
    pub component: String,
    /// The node that recorded it.
    pub host: String,
    pub count: u32,
    pub first_ms: u64,
    pub last_ms: u64,
    /// Increases with every change of this node's log: the record's resourceVersion.
    pub seq: u64,
}

impl EventRecord {
    /// The namespace it is filed in (cluster-scoped objects' events go to `default`).
    pub fn namespace(&self) -> &str {
        if self.regarding.namespace.is_empty() {
            "default"
        } else {
            &self.regarding.namespace
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    regarding: ObjectRef,
    event_type: EventType,
    reason: String,
    message: String,
    component: String,
}

/// A node's events: aggregated, bounded in time and per namespace.
#[derive(Debug)]
pub struct EventLog {
    host: String,
    ttl_ms: u64,
    max_per_namespace: usize,
    entries: HashMap<Key, EventRecord>,
    /// How many entries each namespace holds (the bound is checked without a scan).
    per_namespace: HashMap<String, usize>,
    seq: u64,
    /// When the TTL was last applied: at most once a second, not on every record (a flood of
    /// events must not cost a scan each).
    expired_at_ms: u64,
}

/// Truncates at a character boundary at most `max` bytes in.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

impl EventLog {
    pub fn new(host: &str, ttl: Duration, max_per_namespace: usize) -> Self {
        Self {
            host: host.into(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            max_per_namespace: max_per_namespace.max(1),
            entries: HashMap::new(),
            per_namespace: HashMap::new(),
            seq: 0,
            expired_at_ms: 0,
        }
    }

    fn forget(&mut self, key: &Key) {
        if let Some(r) = self.entries.remove(key) {
            let ns = r.namespace().to_owned();
            if let Some(n) = self.per_namespace.get_mut(&ns) {
                *n -= 1;
                if *n == 0 {
                    self.per_namespace.remove(&ns);
                }
            }
        }
    }

    /// Records one occurrence at `now_ms` (milliseconds since the epoch); returns the event as
    /// it now stands.
    pub fn record(&mut self, event: NewEvent, now_ms: u64) -> EventRecord {
        let key = Key {
            regarding: event.regarding,
            event_type: event.event_type,
            reason: truncate(event.reason, 128),
            message: truncate(event.message, MAX_MESSAGE_BYTES),
            component: event.component,
        };
        self.seq += 1;
        let seq = self.seq;
        let record = if let Some(existing) = self.entries.get_mut(&key) {
            existing.count = existing.count.saturating_add(1);
            existing.last_ms = existing.last_ms.max(now_ms);
            existing.seq = seq;
            existing.clone()
        } else {
            let name = format!(
                "{}.{:x}",
                key.regarding.name,
                u128::from(now_ms) * 1_000_000 + u128::from(seq % 1_000_000)
            );
            let record = EventRecord {
                name,
                regarding: key.regarding.clone(),
                event_type: key.event_type,
                reason: key.reason.clone(),
                message: key.message.clone(),
                component: key.component.clone(),
                host: self.host.clone(),
                count: 1,
                first_ms: now_ms,
                last_ms: now_ms,
                seq,
            };
            let ns = record.namespace().to_owned();
            self.entries.insert(key, record.clone());
            let count = self.per_namespace.entry(ns.clone()).or_default();
            *count += 1;
            if *count > self.max_per_namespace {
                // Over the bound: the least recently seen of the namespace goes (one scan, and
                // only when a new event overflows it).
                let oldest = self
                    .entries
                    .iter()
                    .filter(|(_, r)| r.namespace() == ns)
                    .min_by_key(|(_, r)| (r.last_ms, r.seq))
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.forget(&k);
                }
            }
            record
        };
        if now_ms.saturating_sub(self.expired_at_ms) >= 1_000 {
            self.expire(now_ms);
        }
        record
    }

    /// Revises the text of an event already recorded (found by what it was recorded with, as
    /// `event`) without counting an occurrence: a progress report, whose newest text stands
    /// (the kubelet's `Pulling` event as the bytes come). At most one revision per
    /// `REVISE_FLOOR_MS`: a text offered sooner is dropped, the next one after it stands.
    /// Nothing when no such event is kept.
    pub fn revise(&mut self, event: NewEvent, message: String, now_ms: u64) -> Option<EventRecord> {
        let key = Key {
            regarding: event.regarding,
            event_type: event.event_type,
            reason: truncate(event.reason, 128),
            message: truncate(event.message, MAX_MESSAGE_BYTES),
            component: event.component,
        };
        let record = self.entries.get_mut(&key)?;
        let message = truncate(message, MAX_MESSAGE_BYTES);
        // At most one revision a second: a watcher of events sees progress, not every tick.
        if record.message != message && now_ms >= record.last_ms.saturating_add(REVISE_FLOOR_MS) {
            self.seq += 1;
            record.message = message;
            record.seq = self.seq;
            record.last_ms = record.last_ms.max(now_ms);
        }
        Some(record.clone())
    }

    /// Drops what is older than the TTL.
    fn expire(&mut self, now_ms: u64) {
        self.expired_at_ms = now_ms;
        let ttl = self.ttl_ms;
        let old: Vec<Key> = self
            .entries
            .iter()
            .filter(|(_, r)| now_ms.saturating_sub(r.last_ms) > ttl)
            .map(|(k, _)| k.clone())
            .collect();
        for k in old {
            self.forget(&k);
        }
    }

    /// The events still kept at `now_ms`, oldest first.
    pub fn snapshot(&mut self, now_ms: u64) -> Vec<EventRecord> {
        self.expire(now_ms);
        let mut out: Vec<EventRecord> = self.entries.values().cloned().collect();
        out.sort_by_key(|r| (r.first_ms, r.seq));
        out
    }
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
        .to_string()
}

fn rfc3339_micros(ms: u64) -> String {
    humantime::format_rfc3339_micros(SystemTime::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn reference_json(r: &ObjectRef) -> Value {
    let mut v = json!({
        "apiVersion": r.api_version,
        "kind": r.kind,
        "name": r.name,
        "uid": r.uid,
    });
    if !r.namespace.is_empty() {
        v["namespace"] = json!(r.namespace);
    }
    if !r.field_path.is_empty() {
        v["fieldPath"] = json!(r.field_path);
    }
    v
}

fn metadata_json(r: &EventRecord) -> Value {
    json!({
        "name": r.name,
        "namespace": r.namespace(),
        "uid": format!("{}-{}", r.host, r.name),
        "resourceVersion": r.seq.to_string(),
        "creationTimestamp": rfc3339(r.first_ms),
    })
}

/// The core/v1 Event a record stands for.
pub fn core_v1(r: &EventRecord) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": metadata_json(r),
        "involvedObject": reference_json(&r.regarding),
        "reason": r.reason,
        "message": r.message,
        "type": r.event_type.as_str(),
        "source": {"component": r.component, "host": r.host},
        "count": r.count,
        "firstTimestamp": rfc3339(r.first_ms),
        "lastTimestamp": rfc3339(r.last_ms),
        "eventTime": null,
        "reportingComponent": r.component,
        "reportingInstance": r.host,
    })
}

/// The events.k8s.io/v1 Event a record stands for (a repeated one has a `series`).
pub fn events_v1(r: &EventRecord) -> Value {
    let mut v = json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": metadata_json(r),
        "eventTime": rfc3339_micros(r.first_ms),
        "regarding": reference_json(&r.regarding),
        "reason": r.reason,
        "note": r.message,
        "type": r.event_type.as_str(),
        "action": r.reason,
        "reportingController": r.component,
        "reportingInstance": r.host,
        "deprecatedSource": {"component": r.component, "host": r.host},
        "deprecatedFirstTimestamp": rfc3339(r.first_ms),
        "deprecatedLastTimestamp": rfc3339(r.last_ms),
        "deprecatedCount": r.count,
    });
    if r.count > 1 {
        v["series"] = json!({"count": r.count, "lastObservedTime": rfc3339_micros(r.last_ms)});
    }
    v
}

/// The shell's handle: records with the wall clock. Cheap to call from any thread; never
/// blocks on I/O.
#[derive(Debug)]
pub struct Recorder {
    log: Mutex<EventLog>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Recorder {
    pub fn new(host: &str, ttl: Duration, max_per_namespace: usize) -> Self {
        Self {
            log: Mutex::new(EventLog::new(host, ttl, max_per_namespace)),
        }
    }

    pub fn record(&self, event: NewEvent) -> EventRecord {
        tracing::debug!(
            object = %format!("{}/{}", event.regarding.kind, event.regarding.name),
            reason = %event.reason,
            message = %event.message,
            "event"
        );
        let now = now_ms();
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .record(event, now)
    }

    /// [`EventLog::revise`] at the wall clock's time.
    pub fn revise(&self, event: NewEvent, message: String) -> Option<EventRecord> {
        let now = now_ms();
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .revise(event, message, now)
    }

    pub fn snapshot(&self) -> Vec<EventRecord> {
        let now = now_ms();
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .snapshot(now)
    }
}

/// Which node reports a membership change: the alive member with the smallest name, so each
/// change is reported once however many agents see it (a pure function of the member list).
pub fn reporter<'a>(alive_names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    alive_names.into_iter().min()
}

/// Node lifecycle events: this node's `Starting` and `NodeReady`, and, on the reporter, every
/// member's `RegisteredNode`, `NodeNotReady` and `NodeReady` as membership changes.
pub async fn follow_nodes(
    recorder: std::sync::Arc<Recorder>,
    membership: std::sync::Arc<shoal_gossip::Membership>,
    self_name: String,
) {
    use shoal_gossip::MemberState;
    let node_event = |m: &shoal_gossip::Member, reason: &str, message: String, component: &str| {
        let uid = shoal_state::object::uuid_string(&hex::decode(&m.node_id).unwrap_or_default());
        NewEvent::new(
            ObjectRef::node(m.name(), &uid),
            EventType::Normal,
            reason,
            message,
            component,
        )
    };
    let mut known: HashMap<String, bool> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let members = membership.members().await;
        let alive: Vec<&str> = members
            .iter()
            .filter(|m| m.state == MemberState::Alive)
            .map(|m| m.name())
            .collect();
        let reporting = reporter(alive.iter().copied()) == Some(self_name.as_str());
        for m in &members {
            let name = m.name().to_owned();
            let is_alive = m.state == MemberState::Alive;
            let was = known.insert(name.clone(), is_alive);
            if m.is_self {
                if was.is_none() {
                    recorder.record(node_event(
                        m,
                        "Starting",
                        "Starting kubelet.".into(),
                        KUBELET,
                    ));
                }
                if is_alive && was != Some(true) {
                    recorder.record(node_event(
                        m,
                        "NodeReady",
                        format!("Node {name} status is now: NodeReady"),
                        KUBELET,
                    ));
                }
                continue;
            }
            if !reporting {
                continue;
            }
            let change = match (was, is_alive) {
                (None, true) => Some((
                    "RegisteredNode",
                    format!("Node {name} event: Registered Node {name} in Controller"),
                )),
                (Some(true), false) => Some((
                    "NodeNotReady",
                    format!("Node {name} status is now: NodeNotReady"),
                )),
                (Some(false), true) => {
                    Some(("NodeReady", format!("Node {name} status is now: NodeReady")))
                }
                _ => None,
            };
            if let Some((reason, message)) = change {
                recorder.record(node_event(m, reason, message, NODE_CONTROLLER));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduled(pod: &str) -> NewEvent {
        NewEvent::new(
            ObjectRef::pod("default", pod, "uid-1"),
            EventType::Normal,
            "Scheduled",
            format!("Successfully assigned default/{pod} to n1"),
            SCHEDULER,
        )
    }

    #[test]
    fn a_progress_report_revises_its_event_without_counting_an_occurrence() {
        let mut log = EventLog::new("n1", Duration::from_secs(3600), 100);
        let pulling = NewEvent::new(
            ObjectRef::pod("default", "web", "uid-1").container("web", false),
            EventType::Normal,
            "Pulling",
            "Pulling image \"a\" from registry r",
            KUBELET,
        );
        // Not recorded yet: nothing to revise.
        assert_eq!(log.revise(pulling.clone(), "early".into(), 500), None);
        let first = log.record(pulling.clone(), 1_000);
        let revised = log
            .revise(
                pulling.clone(),
                "Pulling image \"a\" from registry r: 1.0 MB of 4.0 MB".into(),
                2_000,
            )
            .unwrap();
        assert_eq!((revised.count, revised.last_ms), (1, 2_000));
        assert!(revised.seq > first.seq, "a watcher sees the change");
        let events = log.snapshot(2_000);
        assert_eq!(events.len(), 1);
        assert!(events[0].message.ends_with("1.0 MB of 4.0 MB"));
        // A new text within a second of the last revision waits for the floor.
        let soon = log
            .revise(
                pulling.clone(),
                "Pulling image \"a\" from registry r: 2.0 MB of 4.0 MB".into(),
                2_500,
            )
            .unwrap();
        assert_eq!((soon.seq, soon.last_ms), (revised.seq, 2_000));
        assert!(soon.message.ends_with("1.0 MB of 4.0 MB"));
        // The same text again is no change.
        let again = log
            .revise(
                pulling,
                "Pulling image \"a\" from registry r: 1.0 MB of 4.0 MB".into(),
                3_000,
            )
            .unwrap();
        assert_eq!((again.seq, again.last_ms), (revised.seq, 2_000));
    }

    #[test]
    fn a_repeated_event_is_one_event_whose_count_grows() {
        let mut log = EventLog::new("n1", Duration::from_secs(3600), 100);
        let unhealthy = NewEvent::new(
            ObjectRef::pod("default", "web", "uid-1").container("web", false),
            EventType::Warning,
            "Unhealthy",
            "Liveness probe failed: connection refused",
            KUBELET,
        );
        log.record(unhealthy.clone(), 1_000);
        log.record(scheduled("web"), 1_500);
        log.record(unhealthy.clone(), 2_000);
        log.record(unhealthy, 3_000);
        let events = log.snapshot(3_000);
        assert_eq!(events.len(), 2);
        let u = events.iter().find(|e| e.reason == "Unhealthy").unwrap();
        assert_eq!((u.count, u.first_ms, u.last_ms), (3, 1_000, 3_000));
        let v = core_v1(u);
        assert_eq!(v["count"], 3);
        assert_eq!(v["involvedObject"]["fieldPath"], "spec.containers{web}");
        assert_eq!(v["source"], json!({"component": "kubelet", "host": "n1"}));
        assert_eq!(v["firstTimestamp"], "1970-01-01T00:00:01Z");
        assert_eq!(v["lastTimestamp"], "1970-01-01T00:00:03Z");
        assert!(v["metadata"]["name"].as_str().unwrap().starts_with("web."));
        let e = events_v1(u);
        assert_eq!(e["series"]["count"], 3);
        assert_eq!(e["note"], "Liveness probe failed: connection refused");
        // Another message is another event.
        log.record(
            NewEvent::new(
                ObjectRef::pod("default", "web", "uid-1"),
                EventType::Warning,
                "Unhealthy",
                "Readiness probe failed: 503",
                KUBELET,
            ),
            3_500,
        );
        assert_eq!(log.snapshot(3_500).len(), 3);
    }

    #[test]
    fn events_expire_after_the_ttl_and_are_bounded_per_namespace() {
        let mut log = EventLog::new("n1", Duration::from_secs(60), 3);
        for i in 0..5u64 {
            log.record(scheduled(&format!("p{i}")), 1_000 * i);
        }
        let names: Vec<String> = log
            .snapshot(5_000)
            .into_iter()
            .map(|e| e.regarding.name)
            .collect();
        assert_eq!(
            names,
            ["p2", "p3", "p4"],
            "the least recently seen go first"
        );
        // A node's events go to `default` and count against it.
        log.record(
            NewEvent::new(
                ObjectRef::node("n1", "5f0c6c8e-1d2b-4c1a-9a57-3a3b2f3b9a10"),
                EventType::Normal,
                "NodeReady",
                "Node n1 status is now: NodeReady",
                KUBELET,
            ),
            6_000,
        );
        let kept = log.snapshot(6_000);
        assert_eq!(kept.len(), 3);
        assert_eq!(
            core_v1(kept.last().unwrap())["metadata"]["namespace"],
            "default"
        );
        // Another namespace has its own bound.
        log.record(
            NewEvent::new(
                ObjectRef::pod("team", "x", "u"),
                EventType::Normal,
                "Scheduled",
                "m",
                SCHEDULER,
            ),
            6_000,
        );
        assert_eq!(log.snapshot(6_000).len(), 4);
        // Everything is older than a minute at 70 s, but p-team's and the node's.
        assert_eq!(log.snapshot(65_500).len(), 2);
        assert!(log.snapshot(200_000).is_empty());
    }

    #[test]
    fn one_node_reports_each_membership_change() {
        assert_eq!(reporter(["n2", "n0", "n1"]), Some("n0"));
        assert_eq!(reporter(["n2"]), Some("n2"));
        assert_eq!(reporter(std::iter::empty()), None);
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let mut log = EventLog::new("n1", Duration::from_secs(60), 10);
        let mut e = scheduled("p");
        e.message = "é".repeat(1000);
        log.record(e, 0);
        let m = &log.snapshot(0)[0].message;
        assert!(m.len() <= MAX_MESSAGE_BYTES && m.len() >= MAX_MESSAGE_BYTES - 1);
        assert!(m.chars().all(|c| c == 'é'));
    }
}

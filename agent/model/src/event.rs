//! What an event is about and what it says, as the controllers, the scheduler and the kubelet
//! report it (core/v1 `Event`, events.k8s.io/v1). The agent's event log (`agent/src/observed/events.rs`)
//! aggregates and serves them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    /// Empty for cluster-scoped objects (their events go to `default`, as Kubernetes files them).
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.containers{web}` for an event about one container.
    pub field_path: String,
}

impl ObjectRef {
    /// A reference to a stored object (`apiVersion`, `kind` and `metadata` read from it).
    pub fn of(object: &Value) -> Self {
        let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
        Self {
            api_version: text(&object["apiVersion"]),
            kind: text(&object["kind"]),
            namespace: text(&object["metadata"]["namespace"]),
            name: text(&object["metadata"]["name"]),
            uid: text(&object["metadata"]["uid"]),
            field_path: String::new(),
        }
    }

    pub fn pod(namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            field_path: String::new(),
        }
    }

    /// A Node, by name and the uid the API shows for it (`kubectl describe node` selects its
    /// events by both).
    pub fn node(name: &str, uid: &str) -> Self {
        Self {
            api_version: "v1".into(),
            kind: "Node".into(),
            namespace: String::new(),
            name: name.into(),
            uid: uid.into(),
            field_path: String::new(),
        }
    }

    /// The same object, one of its containers.
    pub fn container(mut self, container: &str, init: bool) -> Self {
        let list = if init { "initContainers" } else { "containers" };
        self.field_path = format!("spec.{list}{{{container}}}");
        self
    }
}

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// Who reports: the component names Kubernetes uses, so `kubectl describe` reads the same.
pub const SCHEDULER: &str = "default-scheduler";
pub const KUBELET: &str = "kubelet";
pub const NODE_CONTROLLER: &str = "node-controller";

/// An event as reported, before aggregation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    pub regarding: ObjectRef,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
    pub component: String,
}

impl NewEvent {
    pub fn new(
        regarding: ObjectRef,
        event_type: EventType,
        reason: &str,
        message: impl Into<String>,
        component: &str,
    ) -> Self {
        Self {
            regarding,
            event_type,
            reason: reason.into(),
            message: message.into(),
            component: component.into(),
        }
    }
}

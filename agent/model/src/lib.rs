//! The object model of Shoal: what a Kubernetes object may say, what it says when it leaves a
//! field out, and the typed views of the fields the rest of the agent decides from. No I/O, no
//! async, no clock: every function here is a pure function of its arguments.
//!
//! Place in the data path: manifest → **model** (admission: [`validation`]) → store
//! (`crdt-state`) → controllers → placement ([`placement`] is what a pod asks of a node) →
//! kubelet ([`node_inputs`], [`environment`]: what a pod spec may make a node do) → runtime →
//! network.
//!
//! - [`validation`]: per-kind checks and defaults, as the apiserver's, with errors naming the
//!   field; the Kubernetes API and the control socket admit every write through it, and the
//!   controllers default the pods they create with it.
//! - [`selector`]: label and field selectors in their query-string form (`?labelSelector=`).
//! - [`placement`]: resources, taints, tolerations, affinity terms and the scheduling-relevant
//!   view of a pod spec, as the auction reads them.
//! - [`quantity`]: Kubernetes quantities (`250m`, `1Gi`) in their units, bounded.
//! - [`node_inputs`] and [`environment`]: the parts of a pod spec that reach a node's filesystem
//!   and arithmetic, and environment-variable expansion with its bounds; checked at the API and
//!   again at the node.
//! - [`service_ip`]: ClusterIP and NodePort allocation, as pure functions of the addresses and
//!   ports in use (the API allocates at create, the ClusterIP controller repairs races).
//! - [`event`]: what an event is about and says, before a node's log aggregates it.
//! - [`job`], [`cron`], [`hpa`]: the parsed specs of Jobs' failure policies, CronJobs' schedules
//!   and HorizontalPodAutoscalers, shared by admission and by their controllers.

pub mod cron;
pub mod environment;
pub mod event;
pub mod hpa;
pub mod job;
pub mod node_inputs;
pub mod placement;
pub mod pod_security;
pub mod quantity;
pub mod rbac;
pub mod selector;
pub mod service_ip;
pub mod storage;
pub mod validation;

/// A field and what is wrong with it, as the apiserver words it
/// (`spec.template.spec.containers[0].image`, `Required value`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct FieldError {
    pub field: String,
    pub detail: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            detail: detail.into(),
        }
    }
}

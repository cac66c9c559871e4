//! Observed state: what nodes saw, as opposed to what users asked for (the replicated store).
//! It is owned by the node that observed it and is never a quorum write: each pod's status is
//! gossiped by its node under a key of its own ([`pod_status`]), and each node keeps its events
//! in a bounded log that any agent's API gathers on demand ([`events`]). The scheduler, the
//! controllers, the service plane and the API read observed state only from here.

pub mod events;
pub mod pod_status;

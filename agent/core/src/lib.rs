//! Every decision Shoal's agents make, as pure state machines: the time, the randomness and what
//! a node has observed are inputs; what to do is the output. No sockets, no clocks, no tasks.
//! The agent's async shells (`agent/src/scheduling.rs` and the kubelet) drive these cores with
//! membership views, QUIC channels and the store; the simulators in `chaos-tests` drive the same
//! functions with a simulated world, so what a simulation shows is a statement about shipped
//! code.
//!
//! Place in the data path: manifest → model → store → **controllers** → **placement** → kubelet
//! (**pod worker**) → runtime → network.
//!
//! - [`controllers`]: the workload controllers, one file per kind (`reconcile` → actions), the
//!   only garbage collector, and the store write each action becomes.
//! - [`placement`]: the distributed auction, a node's predicates and score, the replicated view
//!   of placements, which pods a dead or fenced node loses and when ([`placement::eviction`],
//!   the one place this is decided), run leases and fencing.
//! - [`pod`]: one pod on one node: its spec as the kubelet reads it, what the runtime observed
//!   of its containers, and the pod worker that decides what to start, probe, signal and remove.

pub mod controllers;
pub mod image_gc;
pub mod placement;
pub mod pod;
pub mod storage;

//! Scheduling without a scheduler (DESIGN.md §6): pods are auctioned among the agents.
//!
//! Pure decision code only, over the object model's view of a pod and a node
//! (`shoal_model::placement`: what a pod asks for, what a node offers): [`predicates`] (a node's
//! own admission and score), [`cluster`] (the replicated view of placements), [`auction`] (the
//! per-node state machine), [`eviction`] (which pods go up for auction and when a dead node's
//! pods may move), [`partition`] and [`lease`] (fencing), [`workload`] (what a node runs, as the
//! auction counts it). The live shell, the agent's `scheduling.rs`, drives these cores with
//! membership views, the agents' QUIC channels and the desired-state bindings; the scheduler
//! simulator (`chaos-tests/src/sim/scheduler.rs`: all nodes in one deterministic process, for
//! its tests and the 1,000-node benchmark) drives the same functions.

pub mod auction;
pub mod cluster;
pub mod eviction;
pub mod lease;
pub mod partition;
pub mod predicates;
pub mod workload;

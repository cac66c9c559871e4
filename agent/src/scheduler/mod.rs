//! Scheduling without a scheduler (DESIGN.md §6): pods are auctioned among the agents.
//!
//! Pure decision code only: [`model`] (what a pod asks for, what a node offers), [`predicates`]
//! (a node's own admission and score), [`cluster`] (the replicated view of placements),
//! [`auction`] (the per-node state machine), [`eviction`] (which pods go up for auction and when
//! a dead node's pods may move), [`partition`] and [`lease`] (fencing), and [`sim`] (all nodes
//! in one deterministic process, for tests and the 1,000-node benchmark). The live shell,
//! `crate::scheduling`, drives the same cores with membership views, the agents' QUIC channels
//! and the desired-state bindings.

pub mod auction;
pub mod cluster;
pub mod eviction;
pub mod lease;
pub mod partition;
pub mod predicates;
pub mod sim;
pub mod workload;

#[cfg(test)]
mod tests;

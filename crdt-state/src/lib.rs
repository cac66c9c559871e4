//! `shoal-state`: the cluster's replicated desired state (DESIGN.md §3, §5).
//!
//! This crate will hold the object model, the CRDT store with HLC timestamps and tombstones,
//! its persistence and the anti-entropy sync protocol — all pure and storage code, no sockets.
//! It is empty until the desired-state issue lands; the workspace keeps its place so that the
//! dependency direction (`agent` → `crdt-state`) is fixed from the start.

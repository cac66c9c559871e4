//! `shoal-net`: pod networking (DESIGN.md §9) — IPAM over leased per-node pod CIDRs, the bridge
//! and a veth per pod, routes between nodes, and the embedded DNS server.
//!
//! Empty until the networking issue lands; the workspace keeps its place.

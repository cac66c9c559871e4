//! `shoal-agent`: the one binary (`shoal`) every node runs.
//!
//! This crate wires the node together: configuration ([`config`]), the node's persisted identity
//! ([`node_identity`]), membership over the authenticated QUIC endpoint ([`agent`]), and the
//! local control API on a Unix socket in the data dir ([`control`], [`client`]) that the CLI and
//! tests use. The harness that starts real `shoal` processes for integration tests and
//! benchmarks is `shoal_chaos::testkit` (`chaos-tests/`), outside the product.

pub mod agent;
pub mod api;
pub mod beneath;
pub mod client;
pub mod config;
pub mod control;
pub mod controllers;
pub mod endpoints;
pub mod events;
pub mod fault_injection;
pub mod host;
pub mod images;
pub mod kubelet;
pub mod network;
pub mod node_identity;
pub mod node_settings;
pub mod replication;
pub mod runtime;
pub mod scheduling;
pub mod services;
pub mod session;
pub mod supervise;

/// Version reported in gossip and by `shoal --version`.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// File names inside a data dir.
pub mod paths {
    use std::path::{Path, PathBuf};

    /// The control API socket.
    pub fn control_socket(data_dir: &Path) -> PathBuf {
        data_dir.join("shoal.sock")
    }

    /// The node's persisted identity (id, name, generation).
    pub fn node_identity(data_dir: &Path) -> PathBuf {
        data_dir.join("node.json")
    }

    /// The desired-state store (redb).
    pub fn store(data_dir: &Path) -> PathBuf {
        data_dir.join("state.redb")
    }

    /// The image store.
    pub fn images(data_dir: &Path) -> PathBuf {
        data_dir.join("images")
    }

    /// Per-pod runtime state: bundles, overlay mounts, container logs.
    pub fn pods(data_dir: &Path) -> PathBuf {
        data_dir.join("pods")
    }

    /// Held (flock) while an agent runs on this data dir.
    pub fn lock(data_dir: &Path) -> PathBuf {
        data_dir.join("agent.lock")
    }
}

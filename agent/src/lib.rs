//! `shoal-agent`: the one binary (`shoal`) every node runs — the async shells around the pure
//! crates `shoal-model` (what objects may say) and `shoal-core` (every decision).
//!
//! Place in the data path, and the module of each step:
//! manifest → [`api`] (the Kubernetes API; [`control`] is the local socket the CLI and
//! [`client`] use, through the same admission) → the replicated store ([`replication`] over
//! `shoal-state`) → [`controllers`] (the reconcile loop around `shoal_core::controllers`) →
//! [`scheduling`] (the auction shell around `shoal_core::placement`) → [`kubelet`] (the shell
//! around `shoal_core::pod`'s pod workers: starts, probes, logs, exec) → [`runtime`] (runc
//! through `shoal shim`, behind the `ContainerRuntime` trait) with [`images`] → the network
//! ([`network`], [`endpoints`], [`services`] over `shoal-net`).
//!
//! Around them: configuration ([`config`], [`node_settings`]), the node's persisted identity
//! ([`node_identity`]), membership over the authenticated QUIC endpoint ([`agent`], [`session`]),
//! observed state — pod statuses and events — with one owner ([`observed`]), confined file
//! operations ([`beneath`]), service-account tokens ([`tokens`]), the host's facts ([`host`]), and supervision of every long-lived
//! task ([`supervise`]). [`fault_injection`] is the chaos self-test's, in debug builds only.
//! The harness that starts real `shoal` processes for integration tests and benchmarks is
//! `shoal_chaos::testkit` (`chaos-tests/`), outside the product.

pub mod agent;
pub mod api;
pub mod beneath;
pub mod client;
pub mod config;
pub mod control;
pub mod controllers;
pub mod endpoints;
pub mod fault_injection;
pub mod host;
pub mod images;
pub mod kubelet;
pub mod network;
pub mod node_identity;
pub mod node_settings;
pub mod observed;
pub mod replication;
pub mod runtime;
pub mod scheduling;
pub mod services;
pub mod session;
pub mod storage;
pub mod supervise;
pub mod tokens;

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

    /// The volumes the built-in provisioner makes (`shoal.io/local-path`), one directory each,
    /// named after its PersistentVolume.
    pub fn volumes(data_dir: &Path) -> PathBuf {
        data_dir.join("volumes")
    }

    /// Held (flock) while an agent runs on this data dir.
    pub fn lock(data_dir: &Path) -> PathBuf {
        data_dir.join("agent.lock")
    }
}

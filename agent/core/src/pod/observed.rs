//! What a node's container runtime observes of a pod's containers, as the pod worker reads it:
//! each container attempt's identity, and whether it is being created, runs or has exited (and
//! how). The runtime writes and reads these (`started.json`, `exit.json`, `meta.json`); the
//! worker decides from them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One container attempt's identity, written next to its bundle.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContainerMeta {
    pub name: String,
    pub attempt: u32,
    pub init: bool,
    pub image: String,
    pub image_digest: String,
    pub runtime_id: String,
    pub cgroup_path: String,
}

/// A container's start, as its shim recorded it (`started.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Started {
    pub pid: i32,
    pub started_unix_ms: u64,
}

/// A container's end, as its shim recorded it (`exit.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Exited {
    pub exit_code: i32,
    /// The signal that killed the process, if one did.
    pub signal: Option<i32>,
    pub finished_unix_ms: u64,
    /// Set when the container never started: the runtime's error.
    pub start_error: Option<String>,
    /// The shim killed the container because its agent stopped renewing the fence lease.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fence_lapsed: bool,
    /// What the container wrote to its termination message file (at most 4 KiB), or with
    /// `FallbackToLogsOnError` and a failure, the end of its log: the runtime reads it when it
    /// observes the exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A container's state as the runtime observes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObservedState {
    /// The shim runs but the process has not started yet.
    Creating,
    Running(Started),
    Exited {
        started: Option<Started>,
        exited: Exited,
        oom_killed: bool,
    },
}

/// One container attempt found on the node.
#[derive(Debug, Clone)]
pub struct ObservedContainer {
    pub meta: ContainerMeta,
    pub state: ObservedState,
    pub log_path: PathBuf,
}

/// Whether `id` (a pod uid from the store, possibly from a peer) can name a directory: 1 to 64
/// ASCII alphanumerics or `-`.
pub fn is_safe_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

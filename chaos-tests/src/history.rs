//! A Jepsen-style history of the client operations a chaos run made: what was invoked, where,
//! when, and what came back. Outcomes follow Jepsen's three: `Ok` (acknowledged), `Fail`
//! (definitely had no effect: refused before anything was stored) and `Unknown` (may or may not
//! have taken effect: a timeout, a dropped connection, or a 503 NotDurable — stored on the node
//! that answered, not yet on the quorum, and replicated later).

use serde::{Deserialize, Serialize};

/// What an operation asked for. Every write carries a value no other operation writes, so the
/// final state names the write it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "lowercase")]
pub enum Request {
    /// Set the register object `key`'s value to `value`: a create (POST), replace (PUT) or
    /// merge patch (PATCH) through the Kubernetes API (the op's `detail` says which; a create of
    /// an existing object or a replace or patch of a missing one fails and changes nothing).
    Write { key: String, value: String },
    /// Delete the register object `key`.
    Delete { key: String },
}

impl Request {
    pub fn key(&self) -> &str {
        match self {
            Request::Write { key, .. } | Request::Delete { key } => key,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    Fail,
    Unknown,
}

/// One operation: invoked at `invoked_ms`, completed (or given up on) at `completed_ms`, both
/// milliseconds since the run started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub id: u64,
    /// The agent (lab host index) the request was sent to.
    pub node: usize,
    #[serde(flatten)]
    pub request: Request,
    pub invoked_ms: u64,
    pub completed_ms: u64,
    pub outcome: Outcome,
    /// The uid of the object incarnation the operation acted on, from the answer (`Ok` only).
    pub uid: Option<String>,
    /// Whether the answer said the write created that incarnation (201).
    #[serde(default)]
    pub created: bool,
    /// The HTTP status or error text, for the report.
    pub detail: String,
}

impl Op {
    /// Whether `self` completed before `other` was invoked (real-time order; otherwise the two
    /// are concurrent or `self` is later).
    pub fn precedes(&self, other: &Op) -> bool {
        self.completed_ms < other.invoked_ms
    }

    /// Whether `self` may have taken effect after `other` did: it was not over before `other`
    /// began, or its outcome is unknown (like Jepsen's `info`, it may take effect at any time
    /// after it began: a frozen agent applies it when thawed).
    pub fn may_follow(&self, other: &Op) -> bool {
        self.outcome == Outcome::Unknown || !self.precedes(other)
    }

    /// Whether the operation may have taken effect.
    pub fn may_have_happened(&self) -> bool {
        self.outcome != Outcome::Fail
    }
}

/// The history of a run, in invocation order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<Op>,
}

impl History {
    pub fn count(&self, outcome: Outcome) -> usize {
        self.ops.iter().filter(|o| o.outcome == outcome).count()
    }

    /// One JSON object per line (`history.jsonl` of a report).
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for op in &self.ops {
            out.push_str(&serde_json::to_string(op).expect("ops serialize"));
            out.push('\n');
        }
        out
    }
}

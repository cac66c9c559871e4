//! Every gossip message from a peer is checked here before chitchat sees it (issue #13,
//! hole 5). chitchat 0.11 trusts its peers: an authenticated but buggy or compromised peer
//! could stop this node's gossip task with one message — an `assert!` in
//! `NodeState::apply_delta` (a `SetMaxVersion` after key-values), an `assert!` when stale
//! key-values of equal version are sent on, a string slice of a key that starts with a
//! multi-byte character, an overflow of our own node's version, or a digest inflated past
//! the single-datagram limit (65,507 B) by made-up nodes. None of these can be caught around
//! chitchat (its loop is its own task), so the bytes are walked here, in the wire format of
//! chitchat 0.11.0, and a message that breaks any rule below is dropped whole:
//!
//! 1. Well formed: magic, version 0, a known type (Syn, SynAck, Ack, BadCluster), every
//!    length within the message, the delta's blocks at most [`MAX_DELTA_BYTES`] decompressed.
//! 2. No node delta of this node itself (same id and generation): only this node writes its
//!    own state.
//! 3. Within one node delta, no `SetMaxVersion` after a key-value (honest 0.11 senders emit
//!    it only for a node without key-values) and key-value versions strictly increasing.
//! 4. Keys are non-empty ASCII (all of Shoal's are).
//! 5. Versions, heartbeats and GC versions below 2^62 (a `u64::MAX` would poison a node's
//!    state for everyone).
//! 6. The nodes peers have named recently (digest entries and node deltas, forgotten after
//!    `ttl`) fit [`DIGEST_BUDGET_BYTES`] of our own digest: a message that would name more is
//!    dropped. That caps a gossip domain at roughly 48 KiB of node ids (~800 nodes with
//!    20-byte ids), below chitchat's one-datagram wall, with the margin chitchat's delta
//!    splitting needs.
//!
//! Pure: the caller passes the time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// chitchat's message magic number.
const MAGIC: u16 = 45_139;
/// The largest decompressed delta accepted (honest deltas fit one 64 KiB datagram).
pub const MAX_DELTA_BYTES: usize = 1 << 20;
/// What the digest of the nodes peers name may take.
pub const DIGEST_BUDGET_BYTES: usize = 48 << 10;
/// Versions, heartbeats and GC versions above this are refused.
pub const MAX_VERSION: u64 = 1 << 62;

/// Why a message was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("malformed gossip message: {0}")]
    Malformed(String),
    #[error("a node delta for this node itself ({0}); only this node writes its own state")]
    OwnNode(String),
    #[error("node {node}: SetMaxVersion after key-values (would trip chitchat's version assert)")]
    MaxVersionAfterKeyValues { node: String },
    #[error("node {node}: key-value versions not strictly increasing ({previous} then {version})")]
    VersionOrder {
        node: String,
        previous: u64,
        version: u64,
    },
    #[error("node {node}: key {key:?} is not a non-empty ASCII string")]
    BadKey { node: String, key: String },
    #[error("node {node}: {what} {value} is out of range")]
    OutOfRange {
        node: String,
        what: &'static str,
        value: u64,
    },
    #[error(
        "the message names nodes beyond this node's digest budget ({bytes} of {budget} bytes in {nodes} nodes)"
    )]
    TooManyNodes {
        nodes: usize,
        bytes: usize,
        budget: usize,
    },
}

/// (node id, generation): a chitchat node identity.
type NodeKey = (String, u64);

/// The checker of one node's incoming gossip, with the nodes its peers named recently.
#[derive(Debug)]
pub struct GossipGuard {
    own: NodeKey,
    ttl: Duration,
    budget: usize,
    /// Digest bytes each recently named node takes, and when it was last named.
    named: HashMap<NodeKey, (usize, Instant)>,
}

struct Reader<'a> {
    buf: &'a [u8],
}

fn malformed(what: &str) -> Reject {
    Reject::Malformed(format!("truncated or invalid {what}"))
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Reject> {
        if self.buf.len() < n {
            return Err(malformed(what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u8(&mut self, what: &str) -> Result<u8, Reject> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, Reject> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, Reject> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn string(&mut self, what: &str) -> Result<&'a str, Reject> {
        let len = self.u16(what)? as usize;
        std::str::from_utf8(self.take(len, what)?).map_err(|_| malformed(what))
    }
    /// A chitchat id: node id, generation, advertised address. Returns the key and the bytes
    /// it takes in a digest entry (id + heartbeat, last GC and max version).
    fn node_id(&mut self) -> Result<(NodeKey, usize), Reject> {
        let start = self.buf.len();
        let id = self.string("node id")?.to_owned();
        let generation = self.u64("generation")?;
        match self.u8("address family")? {
            4 => self.take(4, "IPv4 address")?,
            6 => self.take(16, "IPv6 address")?,
            _ => return Err(malformed("address family")),
        };
        self.u16("port")?;
        Ok(((id, generation), start - self.buf.len() + 24))
    }
}

fn in_range(node: &NodeKey, what: &'static str, value: u64) -> Result<(), Reject> {
    if value > MAX_VERSION {
        return Err(Reject::OutOfRange {
            node: node.0.clone(),
            what,
            value,
        });
    }
    Ok(())
}

impl GossipGuard {
    /// A guard for the node `(node_id, generation)`; named nodes are remembered for `ttl`
    /// (at least chitchat's dead-node grace period, so the count never runs below chitchat's).
    pub fn new(node_id: impl Into<String>, generation: u64, ttl: Duration) -> Self {
        Self {
            own: (node_id.into(), generation),
            ttl,
            budget: DIGEST_BUDGET_BYTES,
            named: HashMap::new(),
        }
    }

    /// With a smaller digest budget (tests).
    pub fn with_budget(mut self, bytes: usize) -> Self {
        self.budget = bytes;
        self
    }

    /// Checks one message; on `Ok` the nodes it names are remembered.
    pub fn check(&mut self, now: Instant, message: &[u8]) -> Result<(), Reject> {
        let mut named: Vec<(NodeKey, usize)> = Vec::new();
        let mut r = Reader { buf: message };
        if r.u16("magic")? != MAGIC {
            return Err(Reject::Malformed("not a chitchat message".into()));
        }
        if r.u8("version")? != 0 {
            return Err(Reject::Malformed("unknown protocol version".into()));
        }
        match r.u8("message type")? {
            0 => {
                self.digest(&mut r, &mut named)?;
                r.string("cluster id")?;
            }
            1 => {
                self.digest(&mut r, &mut named)?;
                self.delta(&mut r, &mut named)?;
            }
            2 => self.delta(&mut r, &mut named)?,
            3 => {}
            other => return Err(Reject::Malformed(format!("unknown message type {other}"))),
        }
        self.remember(now, named)
    }

    fn digest(&self, r: &mut Reader, named: &mut Vec<(NodeKey, usize)>) -> Result<(), Reject> {
        let count = r.u16("digest length")?;
        for _ in 0..count {
            let (key, size) = r.node_id()?;
            for what in ["heartbeat", "last GC version", "max version"] {
                in_range(&key, what, r.u64(what)?)?;
            }
            if key != self.own {
                named.push((key, size));
            }
        }
        Ok(())
    }

    fn delta(&self, r: &mut Reader, named: &mut Vec<(NodeKey, usize)>) -> Result<(), Reject> {
        let mut data = Vec::new();
        loop {
            match r.u8("delta block type")? {
                0 => break,
                kind @ (1 | 2) => {
                    let len = r.u16("delta block length")? as usize;
                    let block = r.take(len, "delta block")?;
                    if kind == 1 {
                        let bytes = zstd::bulk::decompress(block, u16::MAX as usize)
                            .map_err(|e| Reject::Malformed(format!("delta block: {e}")))?;
                        data.extend_from_slice(&bytes);
                    } else {
                        data.extend_from_slice(block);
                    }
                    if data.len() > MAX_DELTA_BYTES {
                        return Err(Reject::Malformed(format!(
                            "delta larger than {MAX_DELTA_BYTES} bytes"
                        )));
                    }
                }
                other => return Err(Reject::Malformed(format!("delta block type {other}"))),
            }
        }
        let mut ops = Reader { buf: &data };
        // The node delta being read: its key, and whether key-values / the last version seen.
        let mut current: Option<(NodeKey, bool, u64)> = None;
        while !ops.buf.is_empty() {
            match ops.u8("delta op")? {
                0 => {
                    let (key, size) = ops.node_id()?;
                    if key == self.own {
                        return Err(Reject::OwnNode(format!("{} generation {}", key.0, key.1)));
                    }
                    in_range(&key, "last GC version", ops.u64("last GC version")?)?;
                    in_range(&key, "from version", ops.u64("from version")?)?;
                    named.push((key.clone(), size));
                    current = Some((key, false, 0));
                }
                1 => {
                    let key = ops.string("key")?;
                    ops.string("value")?;
                    let version = ops.u64("version")?;
                    if ops.u8("deletion status")? > 2 {
                        return Err(malformed("deletion status"));
                    }
                    let Some((node, seen_kv, last)) = current.as_mut() else {
                        return Err(Reject::Malformed("key-value before any node".into()));
                    };
                    if key.is_empty() || !key.is_ascii() {
                        return Err(Reject::BadKey {
                            node: node.0.clone(),
                            key: key.to_owned(),
                        });
                    }
                    in_range(node, "version", version)?;
                    if *seen_kv && version <= *last {
                        return Err(Reject::VersionOrder {
                            node: node.0.clone(),
                            previous: *last,
                            version,
                        });
                    }
                    *seen_kv = true;
                    *last = version;
                }
                2 => {
                    let version = ops.u64("max version")?;
                    let Some((node, seen_kv, _)) = current.as_ref() else {
                        return Err(Reject::Malformed("SetMaxVersion before any node".into()));
                    };
                    in_range(node, "max version", version)?;
                    if *seen_kv {
                        return Err(Reject::MaxVersionAfterKeyValues {
                            node: node.0.clone(),
                        });
                    }
                }
                other => return Err(Reject::Malformed(format!("delta op {other}"))),
            }
        }
        Ok(())
    }

    /// Forgets nodes not named for `ttl`, then admits the message's nodes if they fit.
    fn remember(&mut self, now: Instant, named: Vec<(NodeKey, usize)>) -> Result<(), Reject> {
        let ttl = self.ttl;
        self.named
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) < ttl);
        let mut bytes: usize = self.named.values().map(|(size, _)| size).sum();
        let mut nodes = self.named.len();
        let mut fresh = std::collections::HashSet::new();
        for (key, size) in &named {
            if !self.named.contains_key(key) && fresh.insert(key) {
                bytes += size;
                nodes += 1;
            }
        }
        if bytes > self.budget {
            return Err(Reject::TooManyNodes {
                nodes,
                bytes,
                budget: self.budget,
            });
        }
        for (key, size) in named {
            self.named.insert(key, (size, now));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes chitchat 0.11 wire messages (for tests of the guard and of chitchat itself).
    #[derive(Default)]
    pub struct Wire(pub Vec<u8>);

    impl Wire {
        pub fn header(kind: u8) -> Self {
            let mut w = Wire::default();
            w.u16(MAGIC).u8(0).u8(kind);
            w
        }
        pub fn u8(&mut self, v: u8) -> &mut Self {
            self.0.push(v);
            self
        }
        pub fn u16(&mut self, v: u16) -> &mut Self {
            self.0.extend(v.to_le_bytes());
            self
        }
        pub fn u64(&mut self, v: u64) -> &mut Self {
            self.0.extend(v.to_le_bytes());
            self
        }
        pub fn string(&mut self, s: &str) -> &mut Self {
            self.u16(s.len() as u16);
            self.0.extend(s.as_bytes());
            self
        }
        pub fn node(&mut self, id: &str, generation: u64, port: u16) -> &mut Self {
            self.string(id).u64(generation).u8(4);
            self.0.extend([127, 0, 0, 1]);
            self.u16(port)
        }
        pub fn digest(&mut self, nodes: &[(&str, u64, u64)]) -> &mut Self {
            self.u16(nodes.len() as u16);
            for (i, (id, generation, heartbeat)) in nodes.iter().enumerate() {
                self.node(id, *generation, 7000 + i as u16)
                    .u64(*heartbeat)
                    .u64(0)
                    .u64(1);
            }
            self
        }
        /// A delta of raw ops, in one uncompressed block.
        pub fn delta(&mut self, ops: &[u8]) -> &mut Self {
            self.u8(2).u16(ops.len() as u16);
            self.0.extend(ops);
            self.u8(0)
        }
    }

    pub fn op_node(id: &str, generation: u64, last_gc: u64, from: u64) -> Vec<u8> {
        let mut w = Wire::default();
        w.u8(0).node(id, generation, 7000).u64(last_gc).u64(from);
        w.0
    }

    pub fn op_kv(key: &str, value: &str, version: u64) -> Vec<u8> {
        let mut w = Wire::default();
        w.u8(1).string(key).string(value).u64(version).u8(0);
        w.0
    }

    pub fn op_max(version: u64) -> Vec<u8> {
        let mut w = Wire::default();
        w.u8(2).u64(version);
        w.0
    }

    fn guard() -> GossipGuard {
        GossipGuard::new("me", 3, Duration::from_secs(600))
    }

    /// A SynAck whose digest introduces `nodes` and whose delta is `ops`.
    pub fn syn_ack(nodes: &[(&str, u64)], ops: &[Vec<u8>]) -> Vec<u8> {
        let mut w = Wire::header(1);
        w.u16(nodes.len() as u16);
        for (id, generation) in nodes {
            w.node(id, *generation, 7000).u64(1).u64(0).u64(0);
        }
        w.delta(&ops.concat());
        w.0
    }

    fn ack(ops: &[Vec<u8>]) -> Vec<u8> {
        let mut w = Wire::header(2);
        w.delta(&ops.concat());
        w.0
    }

    #[test]
    fn honest_shapes_pass() {
        let now = Instant::now();
        let mut g = guard();
        let mut syn = Wire::header(0);
        syn.digest(&[("me", 3, 10), ("a", 1, 5)]).string("cluster");
        g.check(now, &syn.0).unwrap();
        let msg = ack(&[
            op_node("a", 1, 0, 0),
            op_kv("node.meta", "{}", 1),
            op_kv("pod.x", "y", 4),
            op_node("b", 2, 0, 3),
            op_max(9),
        ]);
        g.check(now, &msg).unwrap();
        g.check(now, &Wire::header(3).0).unwrap();
    }

    /// Each of chitchat 0.11's crash paths, as a peer would send it, is dropped.
    #[test]
    fn the_messages_that_crash_chitchat_are_rejected() {
        let now = Instant::now();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            // The assert in NodeState::apply_delta: max_version below a key-value's version.
            (
                ack(&[op_node("a", 1, 0, 0), op_kv("k", "v", 7), op_max(6)]),
                "SetMaxVersion after key-values",
            ),
            // Two keys of one version, planted to trip the next delta built from them.
            (
                ack(&[
                    op_node("a", 1, 0, 0),
                    op_kv("k", "v", 5),
                    op_kv("l", "v", 5),
                ]),
                "not strictly increasing",
            ),
            // A key whose first byte starts a multi-byte character (a string slice panics).
            (
                ack(&[op_node("a", 1, 0, 0), op_kv("é", "v", 1)]),
                "not a non-empty ASCII",
            ),
            // Our own node's state, overwritten with u64::MAX versions.
            (
                ack(&[op_node("me", 3, 0, 0), op_kv("k", "v", u64::MAX)]),
                "this node itself",
            ),
            (
                ack(&[op_node("a", 1, 0, 0), op_kv("k", "v", u64::MAX)]),
                "out of range",
            ),
            (Wire::header(255).0, "unknown message type"),
            (vec![0x53, 0xb0, 0, 2, 2, 9, 0], "truncated"),
        ];
        for (bytes, says) in cases {
            let err = guard().check(now, &bytes).unwrap_err().to_string();
            assert!(err.contains(says), "{says}: {err}");
        }
    }

    #[test]
    fn a_digest_inflated_with_made_up_nodes_is_refused_and_forgotten_later() {
        let t0 = Instant::now();
        let mut g = guard().with_budget(2_000);
        let ids: Vec<String> = (0..40).map(|i| format!("fake-node-{i:04}")).collect();
        let nodes: Vec<(&str, u64, u64)> = ids.iter().map(|id| (id.as_str(), 1, 1)).collect();
        let mut small = Wire::header(0);
        small.digest(&nodes[..10]).string("c");
        g.check(t0, &small.0).unwrap();
        let mut big = Wire::header(0);
        big.digest(&nodes).string("c");
        let err = g.check(t0, &big.0).unwrap_err();
        assert!(matches!(err, Reject::TooManyNodes { .. }), "{err}");
        // The same ten again cost nothing new.
        g.check(t0, &small.0).unwrap();
        // After the ttl, the first ten are forgotten and another batch fits.
        let mut other = Wire::header(0);
        other.digest(&nodes[20..30]).string("c");
        g.check(t0 + Duration::from_secs(601), &other.0).unwrap();
    }

    #[test]
    fn an_oversized_compressed_delta_is_refused() {
        // 20 blocks that each inflate to 64 KiB of zeros: more than MAX_DELTA_BYTES.
        let block = zstd::bulk::compress(&vec![0u8; 65_535], 3).unwrap();
        let mut w = Wire::header(2);
        for _ in 0..20 {
            w.u8(1).u16(block.len() as u16);
            w.0.extend(&block);
        }
        w.u8(0);
        let err = guard().check(Instant::now(), &w.0).unwrap_err().to_string();
        assert!(err.contains("delta larger"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic_the_guard(
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            kind in 0u8..5,
        ) {
            let mut bytes = vec![0x53, 0xb0, 0, kind];
            bytes.extend_from_slice(&tail);
            let _ = guard().check(Instant::now(), &bytes);
            let _ = guard().check(Instant::now(), &tail);
        }
    }
}

//! chitchat's [`Transport`] over the node's QUIC endpoint: each chitchat message is one frame on
//! the [`Channel::Gossip`] channel.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use async_trait::async_trait;
use chitchat::transport::{Socket, Transport};
use chitchat::{ChitchatMessage, Deserializable, Serializable};
use tracing::warn;

use crate::endpoint::{EndpointError, IncomingFrames, PeerEndpoint};
use crate::frame::Channel;
use crate::guard::GossipGuard;

/// Gossip over an already-bound [`PeerEndpoint`]; `open` must be given that endpoint's address.
/// Every incoming message passes a [`GossipGuard`] before chitchat decodes it.
pub struct QuicTransport {
    endpoint: PeerEndpoint,
    /// Taken by the one socket `open` makes.
    guard: std::sync::Mutex<Option<GossipGuard>>,
    /// Tests only: no guard at all.
    unguarded: bool,
}

impl QuicTransport {
    /// A transport that hands chitchat whatever arrives (tests of what the guard prevents).
    #[cfg(test)]
    fn unguarded(endpoint: PeerEndpoint) -> Self {
        Self {
            endpoint,
            guard: std::sync::Mutex::new(None),
            unguarded: true,
        }
    }

    /// A transport whose guard knows this node as `(node_id, generation)` and remembers the
    /// nodes peers name for `ttl` (at least the dead-node grace period).
    pub fn new(endpoint: PeerEndpoint, node_id: &str, generation: u64, ttl: Duration) -> Self {
        Self {
            endpoint,
            guard: std::sync::Mutex::new(Some(GossipGuard::new(node_id, generation, ttl))),
            unguarded: false,
        }
    }
}

#[async_trait]
impl Transport for QuicTransport {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let bound = self.endpoint.local_addr();
        if listen_addr != bound {
            bail!("the node endpoint is bound to {bound}, not {listen_addr}");
        }
        let incoming = self.endpoint.subscribe(Channel::Gossip)?;
        let guard = self.guard.lock().expect("never held across a panic").take();
        if guard.is_none() && !self.unguarded {
            bail!("the transport was opened already");
        }
        Ok(Box::new(QuicSocket {
            endpoint: self.endpoint.clone(),
            incoming,
            buf: Vec::new(),
            guard,
            refusals: HashMap::new(),
        }))
    }
}

struct QuicSocket {
    endpoint: PeerEndpoint,
    incoming: IncomingFrames,
    buf: Vec<u8>,
    guard: Option<GossipGuard>,
    /// When each peer's refused message was last logged (one line per peer per minute).
    refusals: HashMap<SocketAddr, Instant>,
}

#[async_trait]
impl Socket for QuicSocket {
    async fn send(&mut self, to: SocketAddr, msg: ChitchatMessage) -> anyhow::Result<()> {
        self.buf.clear();
        // chitchat 0.11 asserts while serializing a delta split over blocks of a reduced size
        // (`Delta::serialize`); a panic here would end the gossip loop, so it costs one message.
        let buf = &mut self.buf;
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| msg.serialize(buf))).is_err() {
            warn!(peer = %to, "dropped a gossip message chitchat could not serialize");
            return Ok(());
        }
        match self.endpoint.send(to, Channel::Gossip, &self.buf) {
            // Gossip is lossy by design, like the UDP it was written for.
            Ok(()) | Err(EndpointError::QueueFull { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        loop {
            let frame = self
                .incoming
                .recv()
                .await
                .ok_or_else(|| anyhow!("the node endpoint is shut down"))?;
            let (from, bytes) = (frame.peer, frame.payload);
            let now = Instant::now();
            let checked = self.guard.as_mut().map(|g| g.check(now, &bytes));
            if let Some(Err(reject)) = checked {
                let last = self.refusals.get(&from).copied();
                if last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60)) {
                    self.refusals.insert(from, now);
                    warn!(peer = %from, reason = %reject, "dropped a gossip message that chitchat must not see");
                }
                continue;
            }
            match ChitchatMessage::deserialize(&mut &bytes[..]) {
                Ok(msg) => return Ok((from, msg)),
                Err(error) => warn!(peer = %from, %error, "rejected a malformed gossip message"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chitchat::{ChitchatMessage, Deserializable};
    use proptest::prelude::*;

    proptest! {
        /// Only authenticated peers reach the decoder, but a buggy or compromised one must not
        /// be able to crash us either.
        #[test]
        fn decoding_random_bytes_never_panics(
            tail in proptest::collection::vec(any::<u8>(), 0..512),
            kind in 0u8..6,
        ) {
            // Valid magic number and version, so the fuzzing reaches the message bodies.
            let mut bytes = vec![0x53, 0xb0, 0, kind];
            bytes.extend_from_slice(&tail);
            let _ = ChitchatMessage::deserialize(&mut &bytes[..]);
            let _ = ChitchatMessage::deserialize(&mut &tail[..]);
        }
    }

    use std::time::Duration;

    use crate::guard::MAX_VERSION;
    use crate::guard::tests::{op_kv, op_max, op_node, syn_ack};
    use crate::{Channel, ClusterIdentity, ClusterSecret, PeerEndpoint, QuicTransport};

    /// A real chitchat node behind a real QUIC endpoint, and a peer endpoint of the same
    /// cluster sending it raw bytes.
    struct Victim {
        handle: chitchat::ChitchatHandle,
        attacker: PeerEndpoint,
        addr: std::net::SocketAddr,
    }

    async fn victim(guarded: bool) -> Victim {
        let identity = ClusterIdentity::derive(&ClusterSecret::from_bytes([7; 32])).unwrap();
        let bind = |name: &str| crate::endpoint::test_endpoint(&identity, name);
        let endpoint = bind("victim");
        let addr = endpoint.local_addr();
        let transport = if guarded {
            QuicTransport::new(endpoint, "victim", 1, Duration::from_secs(600))
        } else {
            QuicTransport::unguarded(endpoint)
        };
        let config = chitchat::ChitchatConfig {
            chitchat_id: chitchat::ChitchatId::new("victim", 1, addr),
            cluster_id: "c".into(),
            gossip_interval: Duration::from_millis(20),
            listen_addr: addr,
            seed_nodes: vec![],
            failure_detector_config: Default::default(),
            marked_for_deletion_grace_period: Duration::from_secs(3600),
            catchup_callback: None,
            extra_liveness_predicate: None,
        };
        let handle = chitchat::spawn_chitchat(config, vec![("k".into(), "v".into())], &transport)
            .await
            .unwrap();
        Victim {
            handle,
            attacker: bind("attacker"),
            addr,
        }
    }

    impl Victim {
        fn send(&self, bytes: &[u8]) {
            self.attacker
                .send(self.addr, Channel::Gossip, bytes)
                .unwrap();
        }

        /// Whether chitchat's task still runs a while after the last message.
        async fn survives(&self) -> bool {
            tokio::time::timeout(
                Duration::from_millis(300),
                self.handle.termination_watcher(),
            )
            .await
            .is_err()
        }
    }

    fn crash() -> Vec<u8> {
        // A SetMaxVersion below the version of a key-value just sent: chitchat's
        // `assert!(node_delta.max_version >= self.max_version)`.
        syn_ack(
            &[("a", 1)],
            &[op_node("a", 1, 0, 0), op_kv("k", "v", 2), op_max(1)],
        )
    }

    /// Issue #13, hole 5, for real: without the guard one message from an authenticated peer
    /// stops chitchat's gossip task (so this harness can fail); with it, the same message is
    /// dropped and gossip goes on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_crafted_message_stops_chitchat_unless_the_guard_drops_it() {
        let unguarded = victim(false).await;
        assert!(unguarded.survives().await);
        unguarded.send(&crash());
        assert!(!unguarded.survives().await, "chitchat survived the message");

        let guarded = victim(true).await;
        guarded.send(&crash());
        assert!(
            guarded.survives().await,
            "the guard let the message through"
        );
    }

    fn structured_op() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        let node = prop_oneof![Just("a"), Just("b"), Just("victim")];
        let key = prop_oneof![Just("k"), Just("l"), Just("é"), Just("")];
        let version = prop_oneof![0u64..6, Just(u64::MAX), Just(MAX_VERSION + 1)];
        prop_oneof![
            (node, 1u64..3, version.clone(), version.clone())
                .prop_map(|(n, g, gc, from)| op_node(n, g, gc, from)),
            (key, version.clone()).prop_map(|(k, v)| op_kv(k, "value", v)),
            version.prop_map(op_max),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Structured deltas (the victim's own id, keys with a multi-byte first character,
        /// u64::MAX versions, SetMaxVersion anywhere) sent over QUIC to a guarded chitchat
        /// node: it survives every one.
        #[test]
        fn a_guarded_node_survives_structured_deltas(
            ops in proptest::collection::vec(structured_op(), 1..8),
        ) {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let message = syn_ack(&[("a", 1), ("b", 2), ("victim", 1)], &ops);
            let survived = runtime.block_on(async {
                let v = victim(true).await;
                v.send(&message);
                v.survives().await
            });
            prop_assert!(survived, "{:?}", message);
        }
    }
}

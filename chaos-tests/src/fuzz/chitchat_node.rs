//! A live chitchat node fed gossip messages in-process, for `gossip_deltas`: what the node's
//! transport hands chitchat once the gossip guard has let a message through.

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

pub(super) const VICTIM: &str = "victim";

pub(super) fn gossip_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// Delivers `messages` to a fresh chitchat node, then a probe it must answer; panics if the
/// node's task ended (it panicked) instead.
pub(super) async fn survives(messages: Vec<chitchat::ChitchatMessage>) {
    let victim: SocketAddr = "127.0.0.1:7000".parse().expect("an address");
    let peer: SocketAddr = "127.0.0.1:7001".parse().expect("an address");
    let (inbox, incoming) = tokio::sync::mpsc::unbounded_channel();
    let (outgoing, mut replies) = tokio::sync::mpsc::unbounded_channel();
    let transport = Wire(Mutex::new(Some(WireSocket { incoming, outgoing })));
    let config = chitchat::ChitchatConfig {
        chitchat_id: chitchat::ChitchatId::new(VICTIM, 1, victim),
        cluster_id: "fuzz".into(),
        gossip_interval: Duration::from_secs(3600),
        listen_addr: victim,
        seed_nodes: vec![],
        failure_detector_config: Default::default(),
        marked_for_deletion_grace_period: Duration::from_secs(3600),
        catchup_callback: None,
        extra_liveness_predicate: None,
    };
    let handle = chitchat::spawn_chitchat(config, vec![("k".into(), "v".into())], &transport)
        .await
        .expect("chitchat starts");
    for message in messages {
        let _ = inbox.send((peer, message));
    }
    let probe = chitchat::ChitchatMessage::Syn {
        cluster_id: "another cluster".into(),
        digest: Default::default(),
    };
    let _ = inbox.send((peer, probe));
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(reply) = replies.recv().await {
            if reply == chitchat::ChitchatMessage::BadCluster {
                return true;
            }
        }
        false
    })
    .await;
    let stopped = handle.shutdown().await;
    assert!(
        matches!(answered, Ok(true)) && stopped.is_ok(),
        "chitchat stopped after a message the gossip guard let through: {stopped:?}"
    );
}

/// A chitchat transport whose one socket takes messages from the harness and hands replies
/// back unserialized (the node's transport serializes them under `catch_unwind`).
struct Wire(Mutex<Option<WireSocket>>);

struct WireSocket {
    incoming: tokio::sync::mpsc::UnboundedReceiver<(SocketAddr, chitchat::ChitchatMessage)>,
    outgoing: tokio::sync::mpsc::UnboundedSender<chitchat::ChitchatMessage>,
}

#[async_trait::async_trait]
impl chitchat::transport::Transport for Wire {
    async fn open(
        &self,
        _listen_addr: SocketAddr,
    ) -> anyhow::Result<Box<dyn chitchat::transport::Socket>> {
        let socket = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        Ok(Box::new(
            socket.ok_or_else(|| anyhow::anyhow!("opened twice"))?,
        ))
    }
}

#[async_trait::async_trait]
impl chitchat::transport::Socket for WireSocket {
    async fn send(
        &mut self,
        _to: SocketAddr,
        msg: chitchat::ChitchatMessage,
    ) -> anyhow::Result<()> {
        let _ = self.outgoing.send(msg);
        Ok(())
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, chitchat::ChitchatMessage)> {
        match self.incoming.recv().await {
            Some(message) => Ok(message),
            // The harness is done: wait for the shutdown.
            None => std::future::pending().await,
        }
    }
}

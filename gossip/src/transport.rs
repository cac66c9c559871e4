//! chitchat's [`Transport`] over the node's QUIC endpoint: each chitchat message is one frame on
//! the [`Channel::Gossip`] channel.

use std::net::SocketAddr;

use anyhow::{anyhow, bail};
use async_trait::async_trait;
use chitchat::transport::{Socket, Transport};
use chitchat::{ChitchatMessage, Deserializable, Serializable};
use tracing::warn;

use crate::endpoint::{EndpointError, IncomingFrames, PeerEndpoint};
use crate::frame::Channel;

/// Gossip over an already-bound [`PeerEndpoint`]; `open` must be given that endpoint's address.
pub struct QuicTransport {
    endpoint: PeerEndpoint,
}

impl QuicTransport {
    pub fn new(endpoint: PeerEndpoint) -> Self {
        Self { endpoint }
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
        Ok(Box::new(QuicSocket {
            endpoint: self.endpoint.clone(),
            incoming,
            buf: Vec::new(),
        }))
    }
}

struct QuicSocket {
    endpoint: PeerEndpoint,
    incoming: IncomingFrames,
    buf: Vec<u8>,
}

#[async_trait]
impl Socket for QuicSocket {
    async fn send(&mut self, to: SocketAddr, msg: ChitchatMessage) -> anyhow::Result<()> {
        self.buf.clear();
        msg.serialize(&mut self.buf);
        match self.endpoint.send(to, Channel::Gossip, &self.buf) {
            // Gossip is lossy by design, like the UDP it was written for.
            Ok(()) | Err(EndpointError::QueueFull { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        loop {
            let (from, bytes) = self
                .incoming
                .recv()
                .await
                .ok_or_else(|| anyhow!("the node endpoint is shut down"))?;
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
}

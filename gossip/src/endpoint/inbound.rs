//! What peers send this node: every stream a peer opens is read one frame at a time, bounded
//! before anything is buffered, and handed to its channel's subscriber or request handler.
//!
//! A frame's fixed header is read first. A header announcing more than its channel's bound
//! ([`Channel::max_payload_bytes`]) is refused at once, and the announced length is charged to
//! the peer's share of the endpoint's [`ReadBudget`] before any payload is read; the payload is
//! then read as it arrives (a peer announcing 64 MiB and sending 10 bytes makes this node
//! allocate 64 KiB, not 64 MiB), and a byte past it refuses the frame. A refused stream is
//! stopped (a request's also reset) with a [`stream_code`]; the refusal is counted
//! ([`super::PeerEndpoint::refused_frames`]) and logged, naming the peer and the channel, at
//! most once per 30 s per peer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quinn::{Connection, VarInt};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::{IncomingFrame, IncomingRequest, IncomingSession, Inner};
use crate::budget::{Held, OverBudget, ReadBudget};
use crate::frame::{Channel, FRAME_HEADER_BYTES, Frame, FrameError};

/// The QUIC application error codes this node stops or resets a peer's stream with.
pub(crate) mod stream_code {
    /// A malformed frame: unknown version or channel, truncated, or bytes after its end.
    pub const MALFORMED: u32 = 1;
    /// No local handler for the channel, or its queue is full.
    pub const NOT_HANDLED: u32 = 2;
    /// The local handler did not answer in time.
    pub const HANDLER_TIMEOUT: u32 = 3;
    /// The local handler's answer exceeds the channel's bound.
    pub const RESPONSE_TOO_LARGE: u32 = 4;
    /// The frame would pass the peer's (or the endpoint's) buffer budget.
    pub const OVER_BUDGET: u32 = 6;
    /// The frame's header announces more than its channel's bound.
    pub const FRAME_TOO_LARGE: u32 = 7;
}

/// How long a local handler may take to answer a peer's request.
const HANDLER_TIMEOUT: Duration = Duration::from_secs(60);

/// The buffer a payload starts with; it grows (at most to the announced length) as bytes come.
const FIRST_READ_BYTES: usize = 64 << 10;

/// Why a frame was not taken.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    /// The stream broke under us (the peer reset it, the connection died): nothing to answer.
    #[error("stream unreadable: {0}")]
    Unreadable(String),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    /// An answer on another channel than the request's.
    #[error("answer to a {asked:?} request")]
    WrongChannel { asked: Channel },
}

/// A refused frame, and its channel when the header named a known one.
#[derive(Debug)]
pub(super) struct Refused {
    pub(super) channel: Option<Channel>,
    pub(super) reason: Refusal,
}

impl Refused {
    fn on(channel: Channel) -> impl Fn(Refusal) -> Refused {
        move |reason| Refused {
            channel: Some(channel),
            reason,
        }
    }

    /// The code the stream is stopped with; `None` when the stream is already gone.
    pub(super) fn code(&self) -> Option<VarInt> {
        let code = match &self.reason {
            Refusal::Unreadable(_) => return None,
            Refusal::Frame(FrameError::TooLarge { .. }) => stream_code::FRAME_TOO_LARGE,
            Refusal::Frame(_) | Refusal::WrongChannel { .. } => stream_code::MALFORMED,
            Refusal::OverBudget(_) => stream_code::OVER_BUDGET,
        };
        Some(VarInt::from_u32(code))
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.reason, self.channel) {
            (Refusal::Unreadable(_), _) => write!(f, "{}", self.reason),
            (_, Some(channel)) => write!(f, "{channel:?} frame refused: {}", self.reason),
            (_, None) => write!(f, "frame refused: {}", self.reason),
        }
    }
}

/// Refused frames: counted, and logged at most once per interval per peer, so a peer that
/// floods the endpoint with bad frames does not flood the log too.
#[derive(Default)]
pub(super) struct FrameRefusals {
    last: HashMap<Arc<str>, Instant>,
    pub(super) count: u64,
}

impl FrameRefusals {
    const INTERVAL: Duration = Duration::from_secs(30);

    fn refused(&mut self, peer: SocketAddr, node_id: &Arc<str>, refused: &Refused) {
        if matches!(refused.reason, Refusal::Unreadable(_)) {
            debug!(
                %peer, node = %node_id, channel = ?refused.channel, error = %refused.reason,
                "dropped an unreadable stream"
            );
            return;
        }
        self.count = self.count.saturating_add(1);
        let now = Instant::now();
        if self
            .last
            .get(node_id)
            .is_some_and(|at| now.duration_since(*at) < Self::INTERVAL)
        {
            return;
        }
        self.last.insert(node_id.clone(), now);
        if self.last.len() > 4096 {
            self.last
                .retain(|_, at| now.duration_since(*at) < Self::INTERVAL);
        }
        warn!(
            %peer, node = %node_id, channel = ?refused.channel, error = %refused.reason,
            "refused a peer's frame; stream stopped (logged at most every 30 s per peer)"
        );
    }
}

/// Reads one frame off `stream`: its header, then — once the channel's bound and the peer's
/// budget admit the announced length — its payload as it arrives. The stream may go on after
/// it (see [`expect_end`]). The bytes stay charged to `node_id` while the [`Held`] lives.
pub(super) async fn read_frame(
    stream: &mut quinn::RecvStream,
    budget: &Arc<ReadBudget>,
    node_id: &Arc<str>,
) -> Result<(Frame, Held), Refused> {
    let (channel, len) = read_header(stream).await?;
    let held = budget
        .reserve(node_id, len)
        .map_err(|e| Refused::on(channel)(e.into()))?;
    let payload = read_payload(stream, len)
        .await
        .map_err(Refused::on(channel))?;
    let frame = Frame {
        channel,
        payload: Bytes::from(payload),
    };
    Ok((frame, held))
}

/// Reads a peer's answer to this node's request on `channel`: one frame, all of its stream,
/// bounded by the channel. It is not charged to the peer's budget: this node's callers bound
/// how many answers it awaits, and each caller keeps its answer after.
pub(super) async fn read_answer(
    stream: &mut quinn::RecvStream,
    channel: Channel,
) -> Result<Bytes, Refused> {
    let (answered, len) = read_header(stream).await?;
    if answered != channel {
        return Err(Refused::on(answered)(Refusal::WrongChannel {
            asked: channel,
        }));
    }
    let payload = read_payload(stream, len)
        .await
        .map_err(Refused::on(channel))?;
    expect_end(stream, channel).await?;
    Ok(Bytes::from(payload))
}

/// Reads a frame's header and checks it: known version and channel, and a length within the
/// channel's bound.
async fn read_header(stream: &mut quinn::RecvStream) -> Result<(Channel, usize), Refused> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    let no_channel = |reason| Refused {
        channel: None,
        reason,
    };
    stream.read_exact(&mut header).await.map_err(|e| match e {
        quinn::ReadExactError::FinishedEarly(got) => no_channel(
            FrameError::Truncated {
                needed: FRAME_HEADER_BYTES,
                got,
            }
            .into(),
        ),
        quinn::ReadExactError::ReadError(e) => no_channel(Refusal::Unreadable(e.to_string())),
    })?;
    Frame::decode_header(&header).map_err(|e| Refused {
        channel: match e {
            FrameError::TooLarge { channel, .. } => Some(channel),
            _ => None,
        },
        reason: e.into(),
    })
}

/// Reads exactly `len` payload bytes, growing the buffer only as they arrive.
async fn read_payload(stream: &mut quinn::RecvStream, len: usize) -> Result<Vec<u8>, Refusal> {
    let mut payload = Vec::with_capacity(len.min(FIRST_READ_BYTES));
    while payload.len() < len {
        let chunk = stream
            .read_chunk(len - payload.len(), true)
            .await
            .map_err(|e| Refusal::Unreadable(e.to_string()))?;
        let Some(chunk) = chunk else {
            return Err(FrameError::Truncated {
                needed: FRAME_HEADER_BYTES + len,
                got: FRAME_HEADER_BYTES + payload.len(),
            }
            .into());
        };
        let needed = payload.len() + chunk.bytes.len();
        if needed > payload.capacity() {
            // Doubling, but never past the announced length.
            let grown = (payload.capacity() * 2).clamp(needed, len);
            payload.reserve_exact(grown - payload.len());
        }
        payload.extend_from_slice(&chunk.bytes);
    }
    Ok(payload)
}

/// Checks that the stream ends right after a frame of `channel` (anything but a session's
/// header is the only frame of its stream).
pub(super) async fn expect_end(
    stream: &mut quinn::RecvStream,
    channel: Channel,
) -> Result<(), Refused> {
    match stream.read_chunk(FIRST_READ_BYTES, true).await {
        Ok(None) => Ok(()),
        Ok(Some(chunk)) => Err(Refused::on(channel)(
            FrameError::TrailingBytes {
                extra: chunk.bytes.len(),
            }
            .into(),
        )),
        Err(e) => Err(Refused::on(channel)(Refusal::Unreadable(e.to_string()))),
    }
}

/// Reads one frame that is all of its stream.
async fn read_whole_frame(
    stream: &mut quinn::RecvStream,
    budget: &Arc<ReadBudget>,
    node_id: &Arc<str>,
) -> Result<(Frame, Held), Refused> {
    let (frame, held) = read_frame(stream, budget, node_id).await?;
    expect_end(stream, frame.channel).await?;
    Ok((frame, held))
}

/// Accepts the streams of one peer's connection until it closes.
pub(super) async fn read_loop(inner: Arc<Inner>, conn: Connection, node_id: Arc<str>) {
    let peer = conn.remote_address();
    loop {
        tokio::select! {
            stream = conn.accept_uni() => match stream {
                Ok(stream) => {
                    tokio::spawn(read_message(inner.clone(), peer, node_id.clone(), stream));
                }
                Err(error) => {
                    debug!(%peer, %error, "peer connection closed");
                    break;
                }
            },
            stream = conn.accept_bi() => match stream {
                Ok((send, recv)) => {
                    tokio::spawn(answer_request(inner.clone(), peer, node_id.clone(), send, recv));
                }
                Err(error) => {
                    debug!(%peer, %error, "peer connection closed");
                    break;
                }
            },
        }
    }
    let mut connections = inner
        .connections
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if connections
        .get(&peer)
        .is_some_and(|c| c.stable_id() == conn.stable_id())
    {
        connections.remove(&peer);
    }
}

async fn read_message(
    inner: Arc<Inner>,
    peer: SocketAddr,
    node_id: Arc<str>,
    mut stream: quinn::RecvStream,
) {
    match read_whole_frame(&mut stream, &inner.budget, &node_id).await {
        Ok((frame, held)) => inner.dispatch(peer, node_id, frame, held),
        Err(refused) => {
            // Counted before the peer can learn of it.
            inner.refuse(peer, &node_id, &refused);
            if let Some(code) = refused.code() {
                let _ = stream.stop(code);
            }
        }
    }
}

async fn answer_request(
    inner: Arc<Inner>,
    peer: SocketAddr,
    node_id: Arc<str>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    // The first frame is read by its header, so a session's stream can stay open after it.
    let first = async {
        let (frame, held) = read_frame(&mut recv, &inner.budget, &node_id).await?;
        if frame.channel != Channel::Session {
            expect_end(&mut recv, frame.channel).await?;
        }
        Ok::<_, Refused>((frame, held))
    };
    let (frame, held) = match first.await {
        Ok(first) => first,
        Err(refused) => {
            inner.refuse(peer, &node_id, &refused);
            if let Some(code) = refused.code() {
                let _ = recv.stop(code);
                let _ = send.reset(code);
            }
            return;
        }
    };
    let channel = frame.channel;
    if channel == Channel::Session {
        let sessions = inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let session = IncomingSession {
            peer,
            node_id,
            header: frame.payload,
            send,
            recv,
        };
        if let Some(tx) = sessions {
            if let Err(refused) = tx.try_send((session, held)) {
                debug!(%peer, "session queue full; stream reset");
                let (mut session, _) = refused.into_inner();
                let _ = session
                    .send
                    .reset(VarInt::from_u32(stream_code::NOT_HANDLED));
            }
        } else {
            debug!(%peer, "no session handler; stream reset");
            let mut session = session;
            let _ = session
                .send
                .reset(VarInt::from_u32(stream_code::NOT_HANDLED));
        }
        return;
    }
    let (responder, response) = oneshot::channel();
    let handler = inner
        .handlers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&channel)
        .cloned();
    let queued = handler.is_some_and(|tx| {
        tx.try_send(IncomingRequest {
            peer,
            node_id,
            payload: frame.payload,
            responder,
            _budget: held,
        })
        .is_ok()
    });
    if !queued {
        debug!(%peer, ?channel, "no request handler (or it is saturated); stream reset");
        let _ = send.reset(VarInt::from_u32(stream_code::NOT_HANDLED));
        return;
    }
    let payload = match tokio::time::timeout(HANDLER_TIMEOUT, response).await {
        Ok(Ok(payload)) => payload,
        _ => {
            let _ = send.reset(VarInt::from_u32(stream_code::HANDLER_TIMEOUT));
            return;
        }
    };
    match Frame::encode(channel, &payload) {
        Ok(bytes) => {
            if let Err(error) = send.write_all(&bytes).await {
                debug!(%peer, %error, "response not sent");
            }
            let _ = send.finish();
        }
        Err(error) => {
            warn!(%peer, %error, "response too large; stream reset");
            let _ = send.reset(VarInt::from_u32(stream_code::RESPONSE_TOO_LARGE));
        }
    }
}

impl Inner {
    /// Queues a peer's frame for its channel's subscriber; its bytes stay charged to the peer
    /// until the subscriber takes it.
    fn dispatch(&self, peer: SocketAddr, node_id: Arc<str>, frame: Frame, held: Held) {
        let subscribers = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(tx) = subscribers.get(&frame.channel) else {
            debug!(%peer, channel = ?frame.channel, "no subscriber; frame dropped");
            return;
        };
        let incoming = IncomingFrame {
            peer,
            node_id,
            payload: frame.payload,
        };
        if tx.try_send((incoming, held)).is_err() {
            debug!(%peer, channel = ?frame.channel, "subscriber queue full; frame dropped");
        }
    }

    fn refuse(&self, peer: SocketAddr, node_id: &Arc<str>, refused: &Refused) {
        self.frame_refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .refused(peer, node_id, refused);
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc::error::TryRecvError;

    use super::*;
    use crate::frame::PROTOCOL_VERSION;
    use crate::{ClusterIdentity, ClusterSecret, PeerEndpoint, PeerEndpointConfig};

    const WAIT: Duration = Duration::from_secs(10);

    /// Two endpoints of one cluster on 127.0.0.1, `beta` built with `config`.
    fn pair(config: impl FnOnce(&mut PeerEndpointConfig)) -> (PeerEndpoint, PeerEndpoint) {
        let identity = ClusterIdentity::derive(&ClusterSecret::from_bytes([7; 32])).unwrap();
        let alpha = crate::endpoint::test_endpoint(&identity, "a1pha");
        let mut beta_config = PeerEndpointConfig::new("127.0.0.1:0".parse().unwrap());
        config(&mut beta_config);
        let cert = identity.issue_node_certificate("beta", &[]).unwrap();
        let beta = PeerEndpoint::bind(&identity, &cert, beta_config).unwrap();
        (alpha, beta)
    }

    /// A frame header as any peer can write it, whatever length it announces.
    fn header(channel: Channel, len: u32) -> Vec<u8> {
        let mut header = vec![PROTOCOL_VERSION, channel as u8];
        header.extend_from_slice(&len.to_be_bytes());
        header
    }

    /// Writes `bytes` on a fresh unidirectional stream from `from` to `to`, leaving the stream
    /// unfinished (so it can end only by the receiver stopping it), and returns the code the
    /// receiver stopped it with.
    async fn stopped_with(from: &PeerEndpoint, to: SocketAddr, bytes: &[u8]) -> VarInt {
        let conn = from.inner.connection_to(to).await.unwrap();
        let mut stream = conn.open_uni().await.unwrap();
        // The receiver may stop the stream before all of it is written.
        let _ = stream.write_all(bytes).await;
        tokio::time::timeout(WAIT, stream.stopped())
            .await
            .expect("the receiver stops the stream")
            .unwrap()
            .expect("stopped, not read to its end")
    }

    /// Polls `condition` until it holds, failing after a deadline.
    async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !condition() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting until {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Issue #35, item 9: a header announcing more than the gossip channel's 65,507 bytes is
    /// refused on the header alone (none of the payload is sent, the stream never finishes),
    /// and so is a frame longer than its header says; the connection still delivers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_oversized_frame_on_a_small_channel_is_refused_and_the_connection_still_delivers() {
        let (alpha, beta) = pair(|_| {});
        let mut frames = beta.subscribe(Channel::Gossip).unwrap();
        let to = beta.local_addr();
        let oversized = header(Channel::Gossip, 1 << 20);
        assert_eq!(
            stopped_with(&alpha, to, &oversized).await,
            VarInt::from_u32(stream_code::FRAME_TOO_LARGE)
        );
        // Within the bound by its header, past it by what follows.
        let mut longer = header(Channel::Gossip, 10);
        longer.extend(std::iter::repeat_n(b'x', 70_000));
        assert_eq!(
            stopped_with(&alpha, to, &longer).await,
            VarInt::from_u32(stream_code::MALFORMED)
        );
        assert_eq!(beta.refused_frames(), 2);

        alpha.send(to, Channel::Gossip, b"legitimate").unwrap();
        let frame = tokio::time::timeout(WAIT, frames.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&frame.payload[..], b"legitimate");
        assert_eq!(&*frame.node_id, "a1pha");
        assert_eq!(
            frames.rx.try_recv().err(),
            Some(TryRecvError::Empty),
            "the refused frames were never delivered"
        );
        assert_eq!(alpha.connected_peers(), 1, "one connection throughout");
        assert_eq!(beta.inner.budget.held(), 0);
    }

    /// The same for a request: the handler never sees it, the requester sees its stream reset,
    /// and a legitimate request on the same connection is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_oversized_request_is_reset_and_never_reaches_the_handler() {
        let (alpha, beta) = pair(|_| {});
        let mut requests = beta.subscribe_requests(Channel::Fence).unwrap();
        let to = beta.local_addr();
        let conn = alpha.inner.connection_to(to).await.unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let announced = Channel::Fence.max_payload_bytes() as u32 + 1;
        send.write_all(&header(Channel::Fence, announced))
            .await
            .unwrap();
        let answer = tokio::time::timeout(WAIT, recv.read_to_end(1024))
            .await
            .unwrap();
        assert!(
            matches!(
                answer,
                Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(code)))
                    if code == VarInt::from_u32(stream_code::FRAME_TOO_LARGE)
            ),
            "{answer:?}"
        );
        assert!(matches!(
            tokio::time::timeout(WAIT, send.stopped()).await.unwrap(),
            Ok(Some(code)) if code == VarInt::from_u32(stream_code::FRAME_TOO_LARGE)
        ));

        let request = alpha.request(to, Channel::Fence, b"lease?", WAIT);
        let handle = async {
            let request = requests.recv().await.unwrap();
            assert_eq!(&request.payload[..], b"lease?");
            request.respond(b"granted".to_vec());
        };
        let (reply, ()) = tokio::join!(request, handle);
        assert_eq!(&reply.unwrap()[..], b"granted");
        assert_eq!(requests.rx.try_recv().err(), Some(TryRecvError::Empty));
        assert_eq!(beta.refused_frames(), 1);
    }

    /// What a peer's frames hold while queued for a subscriber counts against its budget: a
    /// frame that would pass it is refused (stream stopped) before its payload is read, and
    /// frames fit again once the subscriber has taken the queued ones.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_over_its_buffer_budget_is_refused_until_its_frames_are_taken() {
        let (alpha, beta) = pair(|config| config.peer_buffer_bytes = 4096);
        let mut frames = beta.subscribe(Channel::Auction).unwrap();
        let to = beta.local_addr();
        alpha.send(to, Channel::Auction, &[1; 3000]).unwrap();
        eventually("the first frame is queued", || {
            beta.inner.budget.held_by("a1pha") == 3000
        })
        .await;
        assert_eq!(
            stopped_with(&alpha, to, &header(Channel::Auction, 3000)).await,
            VarInt::from_u32(stream_code::OVER_BUDGET)
        );
        assert_eq!(beta.refused_frames(), 1);

        let first = tokio::time::timeout(WAIT, frames.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.payload.len(), 3000);
        assert_eq!(beta.inner.budget.held_by("a1pha"), 0, "taken, given back");
        alpha.send(to, Channel::Auction, &[2; 3000]).unwrap();
        let second = tokio::time::timeout(WAIT, frames.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&second.payload[..], &[2; 3000][..]);
        assert_eq!(frames.rx.try_recv().err(), Some(TryRecvError::Empty));
        assert_eq!(beta.refused_frames(), 1);
    }

    /// A request's bytes stay charged to its peer until it is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_holds_its_peers_budget_until_answered() {
        let (alpha, beta) = pair(|_| {});
        let mut requests = beta.subscribe_requests(Channel::Node).unwrap();
        let to = beta.local_addr();
        let ask = alpha.request(to, Channel::Node, &[0; 1000], WAIT);
        let handle = async {
            let request = requests.recv().await.unwrap();
            assert_eq!(beta.inner.budget.held_by("a1pha"), 1000);
            request.respond(b"ok".to_vec());
            eventually("the answer gives the bytes back", || {
                beta.inner.budget.held() == 0
            })
            .await;
        };
        let (reply, ()) = tokio::join!(ask, handle);
        assert_eq!(&reply.unwrap()[..], b"ok");
    }
}

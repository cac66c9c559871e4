//! The node's one QUIC endpoint: mutual-TLS connections to peers, one frame per unidirectional
//! stream, dispatched by [`Channel`] to whichever subsystem subscribed to it.
//!
//! Sending never blocks the caller: frames go to a bounded per-peer queue drained by a writer
//! task that owns the (cached) connection to that peer. A full queue drops the frame, which is
//! what gossip wants from a slow or silent peer.
//!
//! What a peer can make this node hold is bounded three ways: QUIC flow control bounds the
//! bytes the transport buffers per connection ([`transport_config`]); each channel bounds one
//! frame ([`Channel::max_payload_bytes`]), checked on the header before the payload is read;
//! and a byte budget per peer and for the endpoint ([`PeerEndpointConfig::peer_buffer_bytes`])
//! bounds the frames being read, queued for a subscriber or with a handler (`inbound`).

mod inbound;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, IdleTimeout, TransportConfig, VarInt};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::budget::{Held, ReadBudget};
use crate::frame::{Channel, Frame, FrameError};
use crate::identity::{ClusterIdentity, IdentityError, NODE_SERVER_NAME, NodeCertificate};

/// Tunables of the endpoint. Defaults suit a LAN cluster with 200 ms gossip.
#[derive(Debug, Clone)]
pub struct PeerEndpointConfig {
    /// UDP address to bind (port 0 picks a free port; see [`PeerEndpoint::local_addr`]).
    pub bind: SocketAddr,
    /// A connection with no traffic for this long is closed (silent peers are dropped).
    pub idle_timeout: Duration,
    /// Keep-alive pings on idle connections, well under `idle_timeout`.
    pub keep_alive: Duration,
    /// How long a connection attempt (handshake included) may take.
    pub connect_timeout: Duration,
    /// How long writing one frame may take before it is dropped.
    pub send_timeout: Duration,
    /// Frames queued per peer before new ones are dropped.
    pub queue_per_peer: usize,
    /// Frames queued per channel for the local subscriber before new ones are dropped.
    pub queue_per_channel: usize,
    /// Bytes of one peer's frames (by the node its certificate names) this node holds at once:
    /// being read, queued for a subscriber, or with a request handler until it answers. A
    /// frame that would pass it is refused (its stream stopped) with a warning naming the peer.
    /// Default 96 MiB: the largest frame (a 64 MiB sync answer) and 32 MiB of others beside it.
    pub peer_buffer_bytes: usize,
    /// The same for all peers together. Default 512 MiB (eight of the largest frames), so
    /// however many identities a holder of the cluster secret makes up, memory stays bounded.
    pub buffer_bytes: usize,
}

impl PeerEndpointConfig {
    pub fn new(bind: SocketAddr) -> Self {
        Self {
            bind,
            idle_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            send_timeout: Duration::from_secs(2),
            queue_per_peer: 128,
            queue_per_channel: 1024,
            peer_buffer_bytes: 96 << 20,
            buffer_bytes: 512 << 20,
        }
    }
}

/// Bytes a peer may send on one connection before this node reads them (QUIC flow control).
/// Quinn grants a peer credit only as this node reads, across all streams of the connection,
/// so whatever the number of streams open, the transport never holds more than this of one
/// connection unread: concurrent streams × bytes buffered per stream ≤ 32 MiB.
const CONNECTION_RECEIVE_WINDOW: u32 = 32 << 20;
/// Bytes a peer may send on one stream before this node reads them. Frames are read as they
/// arrive, so this need not hold the largest frame: 8 MiB keeps one stream at full speed at
/// 1 Gbit/s over a 64 ms round trip, and four streams can use the connection's window at once
/// without one stalled stream (a session nobody reads) blocking the others.
const STREAM_RECEIVE_WINDOW: u32 = 8 << 20;
/// Bytes of this node's writes the transport keeps per connection until the peer acknowledges
/// them (quinn's default is 10 MB): two streams at full speed, a bound on what a peer that
/// stops acknowledging leaves in memory here.
const SEND_WINDOW: u64 = 16 << 20;
/// Streams a peer may have open at once. The windows above bound their bytes whatever these
/// are, and the peer's budget bounds what is read out of them; the counts bound bookkeeping
/// and reader tasks. Unidirectional streams carry one gossip or auction frame each (a peer's
/// writer has at most its 128-frame queue in flight); bidirectional ones carry requests and
/// sessions (an exec or port-forward holds one for its life).
const MAX_CONCURRENT_UNI_STREAMS: u32 = 1024;
const MAX_CONCURRENT_BIDI_STREAMS: u32 = 256;

/// The QUIC transport settings of every connection, both directions.
fn transport_config(config: &PeerEndpointConfig) -> TransportConfig {
    let mut transport = TransportConfig::default();
    transport
        .max_idle_timeout(Some(
            IdleTimeout::try_from(config.idle_timeout).unwrap_or(VarInt::from_u32(10_000).into()),
        ))
        .keep_alive_interval(Some(config.keep_alive))
        .max_concurrent_uni_streams(VarInt::from_u32(MAX_CONCURRENT_UNI_STREAMS))
        .max_concurrent_bidi_streams(VarInt::from_u32(MAX_CONCURRENT_BIDI_STREAMS))
        .receive_window(VarInt::from_u32(CONNECTION_RECEIVE_WINDOW))
        .stream_receive_window(VarInt::from_u32(STREAM_RECEIVE_WINDOW))
        .send_window(SEND_WINDOW);
    transport
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("cannot bind the node endpoint on {addr}/udp: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("channel {0:?} already has a subscriber")]
    AlreadySubscribed(Channel),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("send queue to {peer} is full; frame dropped")]
    QueueFull { peer: SocketAddr },
    #[error("endpoint is shut down")]
    Closed,
    #[error("peer {peer} is unreachable")]
    Unreachable { peer: SocketAddr },
    #[error("peer {peer} did not answer in {timeout:?}")]
    Timeout { peer: SocketAddr, timeout: Duration },
    #[error("request to {peer} failed: {message}")]
    Request { peer: SocketAddr, message: String },
}

/// A request from a peer, waiting for its response.
pub struct IncomingRequest {
    pub peer: SocketAddr,
    /// The node id the peer's certificate names (not anything the payload claims).
    pub node_id: Arc<str>,
    pub payload: Bytes,
    responder: oneshot::Sender<Vec<u8>>,
    /// The request's bytes stay charged to the peer until it is answered or dropped.
    _budget: Held,
}

impl IncomingRequest {
    /// Sends the response (dropping the request without responding resets the stream).
    pub fn respond(self, payload: Vec<u8>) {
        let _ = self.responder.send(payload);
    }
}

/// Requests received on one channel. Dropping it unsubscribes the channel.
pub struct IncomingRequests {
    channel: Channel,
    rx: mpsc::Receiver<IncomingRequest>,
    inner: Arc<Inner>,
}

impl IncomingRequests {
    /// Next request; `None` once the endpoint is shut down. Cancel-safe.
    pub async fn recv(&mut self) -> Option<IncomingRequest> {
        self.rx.recv().await
    }
}

impl Drop for IncomingRequests {
    fn drop(&mut self) {
        self.inner
            .handlers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.channel);
    }
}

/// A session a peer opened ([`PeerEndpoint::open_session`]): its opening header, and the
/// stream's two halves, which carry the session's bytes until either side finishes or resets.
pub struct IncomingSession {
    pub peer: SocketAddr,
    /// The node id the peer's certificate names (not anything the header claims).
    pub node_id: Arc<str>,
    pub header: Bytes,
    pub send: quinn::SendStream,
    pub recv: quinn::RecvStream,
}

/// Sessions opened by peers. Dropping it refuses further sessions.
pub struct IncomingSessions {
    rx: mpsc::Receiver<(IncomingSession, Held)>,
    inner: Arc<Inner>,
}

impl IncomingSessions {
    /// Next session; `None` once the endpoint is shut down. Cancel-safe.
    pub async fn recv(&mut self) -> Option<IncomingSession> {
        // The header's bytes are the receiver's from now on: the peer's budget gets them back.
        self.rx.recv().await.map(|(session, _budget)| session)
    }
}

impl Drop for IncomingSessions {
    fn drop(&mut self) {
        *self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// One frame from a peer.
#[derive(Debug, Clone)]
pub struct IncomingFrame {
    pub peer: SocketAddr,
    /// The node id the peer's certificate names (not anything the payload claims).
    pub node_id: Arc<str>,
    pub payload: Bytes,
}

/// Frames received on one channel, with the peer they came from. Dropping it unsubscribes
/// the channel.
pub struct IncomingFrames {
    channel: Channel,
    rx: mpsc::Receiver<(IncomingFrame, Held)>,
    inner: Arc<Inner>,
}

impl IncomingFrames {
    /// Next frame; `None` once the endpoint is shut down. Cancel-safe.
    pub async fn recv(&mut self) -> Option<IncomingFrame> {
        // The frame is the subscriber's from now on: the peer's budget gets its bytes back.
        self.rx.recv().await.map(|(frame, _budget)| frame)
    }
}

impl Drop for IncomingFrames {
    fn drop(&mut self) {
        self.inner
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.channel);
    }
}

/// Cheap to clone handle on the node's endpoint.
#[derive(Clone)]
pub struct PeerEndpoint {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    config: PeerEndpointConfig,
    /// Live connections by peer address, whichever side opened them.
    connections: Mutex<HashMap<SocketAddr, Connection>>,
    writers: Mutex<HashMap<SocketAddr, mpsc::Sender<Vec<u8>>>>,
    /// Queues to the local subscribers, each frame with its bytes charged to its peer.
    subscribers: Mutex<HashMap<Channel, mpsc::Sender<(IncomingFrame, Held)>>>,
    handlers: Mutex<HashMap<Channel, mpsc::Sender<IncomingRequest>>>,
    sessions: Mutex<Option<mpsc::Sender<(IncomingSession, Held)>>>,
    /// Bytes of peers' frames this node holds, per peer and in total.
    budget: Arc<ReadBudget>,
    refusals: Mutex<RefusalLog>,
    frame_refusals: Mutex<inbound::FrameRefusals>,
    closed: AtomicBool,
}

impl PeerEndpoint {
    /// Connections refused at the TLS handshake since the endpoint was bound (a peer without the
    /// cluster's certificates, or one this node cannot verify), both directions: the evidence
    /// that a stranger tried, which the log shows only once per 30 s per peer.
    pub fn refused_handshakes(&self) -> u64 {
        self.inner
            .refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .count
    }

    /// Frames refused since the endpoint was bound: over their channel's bound or the peer's
    /// buffer budget, or malformed (the log shows one per 30 s per peer).
    pub fn refused_frames(&self) -> u64 {
        self.inner
            .frame_refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .count
    }

    /// Binds the endpoint and starts accepting authenticated peers. Must run inside a tokio
    /// runtime.
    pub fn bind(
        identity: &ClusterIdentity,
        node: &NodeCertificate,
        config: PeerEndpointConfig,
    ) -> Result<Self, EndpointError> {
        let transport = Arc::new(transport_config(&config));

        let server_tls = QuicServerConfig::try_from(identity.node_server_config(node)?)
            .map_err(|e| IdentityError::Tls(e.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_tls));
        server.transport_config(transport.clone());
        let client_tls = QuicClientConfig::try_from(identity.node_client_config(node)?)
            .map_err(|e| IdentityError::Tls(e.to_string()))?;
        let mut client = quinn::ClientConfig::new(Arc::new(client_tls));
        client.transport_config(transport);

        let mut endpoint =
            Endpoint::server(server, config.bind).map_err(|source| EndpointError::Bind {
                addr: config.bind,
                source,
            })?;
        endpoint.set_default_client_config(client);
        let budget = ReadBudget::new(config.peer_buffer_bytes, config.buffer_bytes);
        let inner = Arc::new(Inner {
            endpoint,
            config,
            connections: Mutex::new(HashMap::new()),
            writers: Mutex::new(HashMap::new()),
            subscribers: Mutex::new(HashMap::new()),
            handlers: Mutex::new(HashMap::new()),
            sessions: Mutex::new(None),
            budget,
            refusals: Mutex::new(RefusalLog::default()),
            frame_refusals: Mutex::new(inbound::FrameRefusals::default()),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(accept_loop(inner.clone()));
        Ok(Self { inner })
    }

    /// The bound UDP address (resolves port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner
            .endpoint
            .local_addr()
            .unwrap_or(self.inner.config.bind)
    }

    /// Receives the frames of `channel`. One subscriber per channel at a time.
    pub fn subscribe(&self, channel: Channel) -> Result<IncomingFrames, EndpointError> {
        let mut subscribers = self
            .inner
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if subscribers.contains_key(&channel) {
            return Err(EndpointError::AlreadySubscribed(channel));
        }
        let (tx, rx) = mpsc::channel(self.inner.config.queue_per_channel);
        subscribers.insert(channel, tx);
        Ok(IncomingFrames {
            channel,
            rx,
            inner: self.inner.clone(),
        })
    }

    /// Receives the requests of `channel` (see [`PeerEndpoint::request`]). One handler per
    /// channel at a time.
    pub fn subscribe_requests(&self, channel: Channel) -> Result<IncomingRequests, EndpointError> {
        let mut handlers = self
            .inner
            .handlers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if handlers.contains_key(&channel) {
            return Err(EndpointError::AlreadySubscribed(channel));
        }
        let (tx, rx) = mpsc::channel(self.inner.config.queue_per_channel);
        handlers.insert(channel, tx);
        Ok(IncomingRequests {
            channel,
            rx,
            inner: self.inner.clone(),
        })
    }

    /// Receives the sessions peers open (see [`PeerEndpoint::open_session`]). One receiver at
    /// a time.
    pub fn subscribe_sessions(&self) -> Result<IncomingSessions, EndpointError> {
        let mut sessions = self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if sessions.is_some() {
            return Err(EndpointError::AlreadySubscribed(Channel::Session));
        }
        let (tx, rx) = mpsc::channel(self.inner.config.queue_per_channel);
        *sessions = Some(tx);
        Ok(IncomingSessions {
            rx,
            inner: self.inner.clone(),
        })
    }

    /// Opens a session with `peer`: a bidirectional stream whose first frame is `header`; the
    /// two halves then carry whatever the session speaks. Fails if the peer cannot be reached
    /// within `timeout` (the session itself has no deadline: it lasts until either side
    /// finishes, resets, or the connection dies).
    pub async fn open_session(
        &self,
        peer: SocketAddr,
        header: &[u8],
        timeout: Duration,
    ) -> Result<(quinn::SendStream, quinn::RecvStream), EndpointError> {
        let frame = Frame::encode(Channel::Session, header)?;
        let open = async {
            let conn = self
                .inner
                .connection_to(peer)
                .await
                .ok_or(EndpointError::Unreachable { peer })?;
            let failed = |e: &dyn std::fmt::Display| EndpointError::Request {
                peer,
                message: e.to_string(),
            };
            let (mut send, recv) = conn.open_bi().await.map_err(|e| failed(&e))?;
            send.write_all(&frame).await.map_err(|e| failed(&e))?;
            Ok((send, recv))
        };
        tokio::time::timeout(timeout, open)
            .await
            .unwrap_or(Err(EndpointError::Timeout { peer, timeout }))
    }

    /// Sends a request to `peer` on a fresh bidirectional stream and waits for the response.
    pub async fn request(
        &self,
        peer: SocketAddr,
        channel: Channel,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Bytes, EndpointError> {
        let frame = Frame::encode(channel, payload)?;
        let exchange = async {
            let conn = self
                .inner
                .connection_to(peer)
                .await
                .ok_or(EndpointError::Unreachable { peer })?;
            let failed = |e: &dyn std::fmt::Display| EndpointError::Request {
                peer,
                message: e.to_string(),
            };
            let (mut send, mut recv) = conn.open_bi().await.map_err(|e| failed(&e))?;
            send.write_all(&frame).await.map_err(|e| failed(&e))?;
            send.finish().map_err(|e| failed(&e))?;
            match inbound::read_answer(&mut recv, channel).await {
                Ok(payload) => Ok(payload),
                Err(refused) => {
                    if let Some(code) = refused.code() {
                        let _ = recv.stop(code);
                    }
                    Err(failed(&refused))
                }
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(EndpointError::Timeout { peer, timeout }))
    }

    /// Queues `payload` for `peer` on `channel` and returns at once. Delivery is best effort:
    /// an unreachable or unauthenticated peer simply never receives it.
    pub fn send(
        &self,
        peer: SocketAddr,
        channel: Channel,
        payload: &[u8],
    ) -> Result<(), EndpointError> {
        let frame = Frame::encode(channel, payload)?;
        let mut writers = self
            .inner
            .writers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let frame = match writers.get(&peer) {
            None => frame,
            Some(tx) => match tx.try_send(frame) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return Err(EndpointError::QueueFull { peer });
                }
                // The writer exited after being idle: start a new one.
                Err(mpsc::error::TrySendError::Closed(frame)) => frame,
            },
        };
        if self.inner.closed.load(Ordering::Relaxed) {
            return Err(EndpointError::Closed);
        }
        let (tx, rx) = mpsc::channel(self.inner.config.queue_per_peer);
        tx.try_send(frame).expect("a new queue has room");
        writers.insert(peer, tx);
        tokio::spawn(write_loop(self.inner.clone(), peer, rx));
        Ok(())
    }

    /// Number of peers with an open connection.
    pub fn connected_peers(&self) -> usize {
        self.inner
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|c| c.close_reason().is_none())
            .count()
    }

    /// Closes every connection and stops accepting.
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Relaxed);
        self.inner
            .endpoint
            .close(VarInt::from_u32(0), b"node shutting down");
        self.inner
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.inner
            .handlers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        *self
            .inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.endpoint.wait_idle()).await;
    }
}

async fn accept_loop(inner: Arc<Inner>) {
    while let Some(incoming) = inner.endpoint.accept().await {
        let inner = inner.clone();
        tokio::spawn(async move {
            let peer = incoming.remote_address();
            match incoming.await {
                Ok(conn) => {
                    debug!(%peer, "accepted authenticated peer connection");
                    register_connection(&inner, conn);
                }
                Err(error) => inner
                    .refusals
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .refused(peer, &error, "inbound"),
            }
        });
    }
}

/// The node id the peer's certificate (verified against the cluster CA in the handshake)
/// names.
fn peer_node_id(conn: &Connection) -> Option<Arc<str>> {
    let certs = conn
        .peer_identity()?
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    crate::identity::node_id_of(certs.first()?.as_ref()).map(Arc::from)
}

/// Caches `conn` as the way to reach its peer and starts reading its streams; refuses a
/// peer whose certificate names no node. Returns whether it was kept.
fn register_connection(inner: &Arc<Inner>, conn: Connection) -> bool {
    let Some(node_id) = peer_node_id(&conn) else {
        warn!(peer = %conn.remote_address(), "refused a peer whose certificate names no node id");
        conn.close(VarInt::from_u32(5), b"certificate names no node id");
        return false;
    };
    inner
        .connections
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(conn.remote_address(), conn.clone());
    tokio::spawn(inbound::read_loop(inner.clone(), conn, node_id));
    true
}

impl Inner {
    /// A live connection to `peer`: the cached one, or a new one.
    async fn connection_to(self: &Arc<Self>, peer: SocketAddr) -> Option<Connection> {
        let cached = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&peer)
            .cloned();
        if let Some(conn) = cached.filter(|c| c.close_reason().is_none()) {
            return Some(conn);
        }
        let connecting = match self.endpoint.connect(peer, NODE_SERVER_NAME) {
            Ok(connecting) => connecting,
            Err(error) => {
                debug!(%peer, %error, "cannot start a connection");
                return None;
            }
        };
        match tokio::time::timeout(self.config.connect_timeout, connecting).await {
            Ok(Ok(conn)) => register_connection(self, conn.clone()).then_some(conn),
            Ok(Err(error)) => {
                self.refusals
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .refused(peer, &error, "outbound");
                None
            }
            Err(_) => {
                debug!(%peer, "connection attempt timed out");
                None
            }
        }
    }
}

/// Per-peer writer: owns the order of frames to one peer and exits after a quiet minute.
async fn write_loop(inner: Arc<Inner>, peer: SocketAddr, mut rx: mpsc::Receiver<Vec<u8>>) {
    const IDLE_EXIT: Duration = Duration::from_secs(60);
    while let Ok(Some(frame)) = tokio::time::timeout(IDLE_EXIT, rx.recv()).await {
        let Some(conn) = inner.connection_to(peer).await else {
            continue;
        };
        let write = async {
            let mut stream = conn.open_uni().await.map_err(|e| e.to_string())?;
            stream.write_all(&frame).await.map_err(|e| e.to_string())?;
            stream.finish().map_err(|e| e.to_string())
        };
        match tokio::time::timeout(inner.config.send_timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => debug!(%peer, %error, "frame not sent"),
            Err(_) => debug!(%peer, "frame send timed out"),
        }
    }
    // Drop our receiver first: a sender that raced us sees a closed queue and starts a new
    // writer, whose open queue we then leave in place.
    drop(rx);
    let mut writers = inner.writers.lock().unwrap_or_else(PoisonError::into_inner);
    if writers.get(&peer).is_some_and(|tx| tx.is_closed()) {
        writers.remove(&peer);
    }
}

/// Logs each refused peer (bad certificate, wrong cluster, TLS failure) at most once per
/// interval, so a stranger retrying every gossip round does not flood the log.
#[derive(Default)]
struct RefusalLog {
    last: HashMap<SocketAddr, Instant>,
    /// Handshakes refused for authentication, every one (the log shows one per interval).
    count: u64,
}

impl RefusalLog {
    const INTERVAL: Duration = Duration::from_secs(30);

    fn refused(&mut self, peer: SocketAddr, error: &quinn::ConnectionError, direction: &str) {
        let authentication = matches!(
            error,
            quinn::ConnectionError::TransportError(_) | quinn::ConnectionError::ConnectionClosed(_)
        );
        if !authentication {
            debug!(%peer, %error, direction, "connection failed");
            return;
        }
        self.count = self.count.saturating_add(1);
        let now = Instant::now();
        if self
            .last
            .get(&peer)
            .is_some_and(|at| now.duration_since(*at) < Self::INTERVAL)
        {
            return;
        }
        self.last.insert(peer, now);
        if self.last.len() > 4096 {
            self.last
                .retain(|_, at| now.duration_since(*at) < Self::INTERVAL);
        }
        warn!(
            %peer, %error, direction,
            "refused peer: TLS handshake failed, not a member of this cluster? (logged at most every 30 s per peer)"
        );
    }
}

/// An endpoint on 127.0.0.1 for node `name` of `identity`'s cluster (tests).
#[cfg(test)]
pub(crate) fn test_endpoint(identity: &ClusterIdentity, name: &str) -> PeerEndpoint {
    let cert = identity.issue_node_certificate(name, &[]).unwrap();
    PeerEndpoint::bind(
        identity,
        &cert,
        PeerEndpointConfig::new("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClusterSecret;

    /// Issue #13, hole 7: what a peer sends is attributed to the node its certificate names,
    /// whatever the payload claims.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_and_requests_carry_the_certificates_node_id() {
        let identity = ClusterIdentity::derive(&ClusterSecret::from_bytes([9; 32])).unwrap();
        let (alpha, beta) = (
            test_endpoint(&identity, "a1pha"),
            test_endpoint(&identity, "beta"),
        );
        let mut frames = beta.subscribe(Channel::Gossip).unwrap();
        let mut requests = beta.subscribe_requests(Channel::Node).unwrap();
        alpha
            .send(beta.local_addr(), Channel::Gossip, b"I am beta")
            .unwrap();
        let frame = tokio::time::timeout(Duration::from_secs(10), frames.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&*frame.node_id, "a1pha");
        assert_eq!(frame.peer, alpha.local_addr());
        let answer = tokio::spawn(async move {
            let request = requests.recv().await.unwrap();
            let who = request.node_id.to_string();
            request.respond(who.into_bytes());
        });
        let reply = alpha
            .request(
                beta.local_addr(),
                Channel::Node,
                b"?",
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(&reply[..], b"a1pha");
        answer.await.unwrap();
    }

    /// A session is a stream that stays open after its header: bytes flow both ways, each side
    /// finishes its half, and the handler learns the certificate's node id.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_carry_bytes_both_ways_until_each_side_finishes() {
        let identity = ClusterIdentity::derive(&ClusterSecret::from_bytes([9; 32])).unwrap();
        let (alpha, beta) = (
            test_endpoint(&identity, "a1pha"),
            test_endpoint(&identity, "beta"),
        );
        let mut sessions = beta.subscribe_sessions().unwrap();
        assert!(beta.subscribe_sessions().is_err(), "one receiver at a time");
        let echo = tokio::spawn(async move {
            let mut session = sessions.recv().await.unwrap();
            assert_eq!(&*session.node_id, "a1pha");
            assert_eq!(&session.header[..], b"echo, upper-cased");
            let mut buf = [0u8; 1024];
            loop {
                let Some(n) = session.recv.read(&mut buf).await.unwrap() else {
                    break;
                };
                session
                    .send
                    .write_all(&buf[..n].to_ascii_uppercase())
                    .await
                    .unwrap();
            }
            session.send.finish().unwrap();
        });
        let (mut send, mut recv) = alpha
            .open_session(
                beta.local_addr(),
                b"echo, upper-cased",
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        for word in ["one ", "two ", "three"] {
            send.write_all(word.as_bytes()).await.unwrap();
            // Each write is answered while the stream stays open.
            let mut got = vec![0u8; word.len()];
            recv.read_exact(&mut got).await.unwrap();
            assert_eq!(got, word.to_ascii_uppercase().as_bytes());
        }
        send.finish().unwrap();
        assert!(recv.read_to_end(1024).await.unwrap().is_empty());
        echo.await.unwrap();
        // Requests still work on the same endpoint, and a request with bytes after its frame
        // is refused.
        let mut requests = beta.subscribe_requests(Channel::Node).unwrap();
        let answer = tokio::spawn(async move {
            let request = requests.recv().await.unwrap();
            request.respond(b"ok".to_vec());
        });
        let reply = alpha
            .request(
                beta.local_addr(),
                Channel::Node,
                b"?",
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(&reply[..], b"ok");
        answer.await.unwrap();
    }
}

//! What one node serves other nodes on the endpoint's `Node` channel: the logs of the
//! containers it runs (any node's API fetches them from there, or reads them locally when the
//! pod runs on itself), and the manifests and blobs of its images (for peers pulling them).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shoal_gossip::{Channel, Membership, PeerEndpoint};
use tracing::debug;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::Kubelet;
use crate::session::SessionRequest;

/// The half of a session that carries messages to the node.
pub type SessionWriter = Box<dyn AsyncWrite + Unpin + Send>;
/// The half of a session that carries the node's messages.
pub type SessionReader = Box<dyn AsyncRead + Unpin + Send>;
use super::logs::{LogChunk, LogQuery};
use crate::images::ImageStore;

/// A request for one container's log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogRequest {
    pub uid: String,
    pub container: String,
    pub previous: bool,
    pub query: LogQuery,
}

/// Bytes as MessagePack's `bin` (serde's default for a `Vec<u8>` is an array of integers: up to
/// two bytes each, so an 8 MiB chunk of random bytes would not fit the channel's 9 MiB frame).
mod binary {
    use serde::{Deserializer, Serializer, de};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        deserializer.deserialize_byte_buf(Visitor)
    }
}

/// A request on the `Node` channel.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum NodeRequest {
    Logs(LogRequest),
    /// The manifest of an image reference.
    Manifest {
        reference: String,
    },
    /// Up to `BLOB_CHUNK` bytes of a blob from `offset`.
    Blob {
        digest: String,
        offset: u64,
    },
    /// The node's latest usage sample.
    Usage,
    /// The events this node keeps.
    Events,
    /// Fetch a blob from its registry, once for the cluster: this node is the blob's owner.
    RegistryBlob(RegistryBlobRequest),
}

/// A peer asks the owner of a blob (by rendezvous hashing of the blob's digest over the
/// nodes that run pods) to fetch it from the registry, with its pod's pull secrets, so that
/// the cluster fetches each blob once. Every field is checked before use.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RegistryBlobRequest {
    pub image: String,
    pub digest: String,
    pub size: u64,
    /// A manifest or index (`/manifests/<digest>`), not a blob.
    #[serde(default)]
    pub manifest: bool,
    /// The pod's namespace and `imagePullSecrets` names: the owner reads the Secrets from
    /// its own replica.
    pub namespace: String,
    pub secrets: Vec<String>,
}

/// The most pull secrets a peer's blob request may name.
const MAX_PULL_SECRETS: usize = 64;

impl RegistryBlobRequest {
    fn check(&self) -> Result<(), String> {
        crate::images::reference::Reference::parse(&self.image).map_err(|e| e.to_string())?;
        crate::images::reference::parse_digest(&self.digest).map_err(|e| e.to_string())?;
        shoal_state::labels::check_dns_label(&self.namespace)
            .map_err(|r| format!("namespace {:?}: {r}", self.namespace))?;
        if self.secrets.len() > MAX_PULL_SECRETS {
            return Err(format!("more than {MAX_PULL_SECRETS} pull secrets"));
        }
        for name in &self.secrets {
            shoal_state::labels::check_dns_subdomain(name)
                .map_err(|r| format!("pull secret {name:?}: {r}"))?;
        }
        Ok(())
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum NodeResponse {
    Logs {
        chunk: LogChunk,
        running: bool,
    },
    Manifest {
        digest: String,
        #[serde(with = "binary")]
        bytes: Vec<u8>,
    },
    Blob {
        #[serde(with = "binary")]
        bytes: Vec<u8>,
        total: u64,
    },
    Usage(super::metrics::NodeUsage),
    Events(Vec<crate::observed::events::EventRecord>),
    Error(String),
    RegistryBlob(super::image_puller::BlobAnswer),
}

/// Why a request to a node's service (this node's or a peer's) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("node {0} runs no pods (--no-runtime)")]
    NoRuntime(String),
    #[error("node {0} is not a member of the cluster")]
    NotMember(String),
    /// The node could not be asked, or its answer could not be read.
    #[error("node {node}: {message}")]
    Unreachable { node: String, message: String },
    /// The node answered with a refusal (no such container, a bad request), in its words.
    #[error("{0}")]
    Refused(String),
}

/// Blob bytes per request (the channel carries up to 9 MiB).
pub(super) const BLOB_CHUNK: usize = 8 << 20;

/// Serves this node's logs and images to peers, and fetches logs from them.
pub struct NodeService {
    kubelet: Option<Arc<Kubelet>>,
    images: Option<ImageStore>,
    membership: Arc<Membership>,
    endpoint: PeerEndpoint,
    node_name: String,
    events: Arc<crate::observed::events::Recorder>,
}

impl NodeService {
    pub fn new(
        kubelet: Option<Arc<Kubelet>>,
        images: Option<ImageStore>,
        membership: Arc<Membership>,
        endpoint: PeerEndpoint,
        node_name: String,
        events: Arc<crate::observed::events::Recorder>,
    ) -> Arc<Self> {
        Arc::new(Self {
            kubelet,
            images,
            membership,
            endpoint,
            node_name,
            events,
        })
    }

    /// Answers peers' requests and serves the sessions they open.
    pub fn start(self: &Arc<Self>) -> Result<(), shoal_gossip::EndpointError> {
        let mut sessions = self.endpoint.subscribe_sessions()?;
        let service = self.clone();
        tokio::spawn(async move {
            while let Some(session) = sessions.recv().await {
                let request = rmp_serde::from_slice::<SessionRequest>(&session.header)
                    .map_err(|e| format!("bad session request: {e}"));
                if let Err(error) = &request {
                    debug!(peer = %session.peer, node = %session.node_id, %error, "session refused");
                }
                tokio::spawn(
                    service
                        .clone()
                        .serve_session(request, session.recv, session.send),
                );
            }
        });
        let mut requests = self.endpoint.subscribe_requests(Channel::Node)?;
        let service = self.clone();
        tokio::spawn(async move {
            while let Some(request) = requests.recv().await {
                let service = service.clone();
                tokio::spawn(async move {
                    let response = match rmp_serde::from_slice::<NodeRequest>(&request.payload) {
                        Ok(NodeRequest::RegistryBlob(req)) => service.registry_blob(req).await,
                        Ok(req) => tokio::task::spawn_blocking(move || service.answer(req))
                            .await
                            .unwrap_or_else(|e| NodeResponse::Error(e.to_string())),
                        Err(e) => {
                            debug!(peer = %request.peer, error = %e, "bad node request");
                            NodeResponse::Error(format!("bad request: {e}"))
                        }
                    };
                    request.respond(rmp_serde::to_vec(&response).expect("responses encode"));
                });
            }
        });
        Ok(())
    }

    /// A peer's request to fetch a blob from its registry (this node owns the blob): waits up
    /// to [`super::image_puller::LONG_POLL`] for the fetch to end, then says where it stands.
    async fn registry_blob(&self, request: RegistryBlobRequest) -> NodeResponse {
        let Some(kubelet) = &self.kubelet else {
            return NodeResponse::Error(format!(
                "node {} runs no pods (--no-runtime)",
                self.node_name
            ));
        };
        if let Err(e) = request.check() {
            return NodeResponse::Error(format!("bad request: {e}"));
        }
        let secrets = kubelet.pull_secrets(&request.namespace, &request.secrets, "a peer's pull");
        NodeResponse::RegistryBlob(
            kubelet
                .puller
                .serve_registry_blob(
                    &request.image,
                    (&request.digest, request.size, request.manifest),
                    secrets,
                )
                .await,
        )
    }

    fn answer(&self, request: NodeRequest) -> NodeResponse {
        let no_runtime = || {
            NodeResponse::Error(format!(
                "node {} runs no pods (--no-runtime)",
                self.node_name
            ))
        };
        match request {
            NodeRequest::Logs(req) => match (&self.kubelet, check_log_request(&req)) {
                (_, Err(e)) => NodeResponse::Error(format!("bad request: {e}")),
                (Some(kubelet), Ok(())) => local(kubelet, &req),
                (None, Ok(())) => no_runtime(),
            },
            NodeRequest::Manifest { reference } => match &self.images {
                Some(images) => match images.manifest_bytes(&reference) {
                    Ok((digest, bytes)) => NodeResponse::Manifest { digest, bytes },
                    Err(e) => NodeResponse::Error(e.to_string()),
                },
                None => no_runtime(),
            },
            NodeRequest::Events => NodeResponse::Events(self.events.snapshot()),
            // Answered on the runtime (it waits for a download): `registry_blob`.
            NodeRequest::RegistryBlob(_) => NodeResponse::Error("answered elsewhere".into()),
            NodeRequest::Usage => match &self.kubelet {
                Some(kubelet) => NodeResponse::Usage(kubelet.usage()),
                None => no_runtime(),
            },
            NodeRequest::Blob { digest, offset } => match &self.images {
                Some(images) => match images.blob_chunk(&digest, offset, BLOB_CHUNK) {
                    Ok((bytes, total)) => NodeResponse::Blob { bytes, total },
                    Err(e) => NodeResponse::Error(format!("blob {digest}: {e}")),
                },
                None => no_runtime(),
            },
        }
    }

    /// Reads a container's log from `node`; returns the chunk and whether the container still
    /// runs.
    pub async fn read(
        &self,
        node: &str,
        request: LogRequest,
    ) -> Result<(LogChunk, bool), NodeError> {
        let unreachable = |message: String| NodeError::Unreachable {
            node: node.to_owned(),
            message,
        };
        if node == self.node_name {
            let kubelet = self
                .kubelet
                .clone()
                .ok_or_else(|| NodeError::NoRuntime(node.to_owned()))?;
            let response = tokio::task::spawn_blocking(move || local(&kubelet, &request))
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            return unpack(response).map_err(|e| e.at(node));
        }
        let member = self.member(node).await?;
        let response = ask(
            &self.endpoint,
            member.gossip_addr,
            &NodeRequest::Logs(request),
        )
        .await
        .map_err(|e| e.at(node))?;
        unpack(response).map_err(|e| e.at(node))
    }

    /// The live member named `node`.
    async fn member(&self, node: &str) -> Result<shoal_gossip::Member, NodeError> {
        self.membership
            .members()
            .await
            .into_iter()
            .find(|m| m.name() == node)
            .ok_or_else(|| NodeError::NotMember(node.to_owned()))
    }
}

impl NodeService {
    /// Serves one session on this node: the request is checked first, and any refusal is the
    /// session's `Status`.
    async fn serve_session<R, W>(
        self: Arc<Self>,
        request: Result<SessionRequest, String>,
        input: R,
        mut output: W,
    ) where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send,
    {
        let checked = request.and_then(|r| r.check().map(|()| r).map_err(|e| e.to_string()));
        let request = match (checked, &self.kubelet) {
            (Ok(request), Some(_)) => request,
            (Err(message), _) => return refuse(&mut output, &message).await,
            (Ok(_), None) => {
                let message = format!("node {} runs no pods (--no-runtime)", self.node_name);
                return refuse(&mut output, &message).await;
            }
        };
        let Some(kubelet) = &self.kubelet else {
            return;
        };
        match request {
            SessionRequest::Exec(req) => {
                super::exec::serve(kubelet.runtime().clone(), req, input, output).await;
            }
            SessionRequest::Attach(req) => {
                super::exec::attach(kubelet.runtime().clone(), req, input, output).await;
            }
            SessionRequest::PortForward(req) => {
                super::exec::forward(kubelet.runtime().clone(), req, input, output).await;
            }
        }
    }

    /// Opens a session with `node` (this one: an in-memory pipe to the same code that serves
    /// peers). Returns the session's two halves: messages to the node, messages from it.
    pub async fn open_session(
        self: &Arc<Self>,
        node: &str,
        request: &SessionRequest,
    ) -> Result<(SessionWriter, SessionReader), NodeError> {
        if node == self.node_name {
            let (ours, theirs) = tokio::io::duplex(64 << 10);
            let (their_read, their_write) = tokio::io::split(theirs);
            tokio::spawn(
                self.clone()
                    .serve_session(Ok(request.clone()), their_read, their_write),
            );
            let (read, write) = tokio::io::split(ours);
            return Ok((Box::new(write), Box::new(read)));
        }
        let member = self.member(node).await?;
        let header = rmp_serde::to_vec(request).expect("requests encode");
        let (send, recv) = self
            .endpoint
            .open_session(member.gossip_addr, &header, Duration::from_secs(10))
            .await
            .map_err(|e| NodeError::Unreachable {
                node: node.to_owned(),
                message: e.to_string(),
            })?;
        Ok((Box::new(send), Box::new(recv)))
    }
}

/// Ends a session that cannot run with its `Status`.
async fn refuse<W: AsyncWrite + Unpin>(output: &mut W, message: &str) {
    let status = crate::session::error_status(message).to_string();
    let _ = crate::session::write_message(output, crate::session::STATUS, status.as_bytes()).await;
    let _ = output.shutdown().await;
}

impl NodeService {
    /// This node's latest usage sample (nothing with --no-runtime).
    pub fn local_usage(&self) -> Option<super::metrics::NodeUsage> {
        self.kubelet.as_ref().map(|k| k.usage())
    }

    /// The claims' volumes of this node as last measured (none with --no-runtime).
    pub fn claim_stats(&self) -> Vec<super::volume_usage::ClaimStat> {
        self.kubelet
            .as_ref()
            .map(|k| k.claim_stats())
            .unwrap_or_default()
    }

    /// Every live node's latest usage sample (nodes that do not answer are left out).
    pub async fn cluster_usage(&self) -> Vec<super::metrics::NodeUsage> {
        let members = self.membership.members().await;
        let asks = members
            .iter()
            .filter(|m| m.state == shoal_gossip::MemberState::Alive)
            .map(|m| {
                let local = m.name() == self.node_name;
                let addr = m.gossip_addr;
                async move {
                    if local {
                        return self.local_usage();
                    }
                    match ask(&self.endpoint, addr, &NodeRequest::Usage).await {
                        Ok(NodeResponse::Usage(usage)) => Some(usage),
                        _ => None,
                    }
                }
            });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

impl NodeService {
    /// This node's recorder (the API records what clients create there).
    pub fn events(&self) -> &Arc<crate::observed::events::Recorder> {
        &self.events
    }

    /// The events of every live node (nodes that do not answer are left out), oldest first.
    pub async fn cluster_events(&self) -> Vec<crate::observed::events::EventRecord> {
        let members = self.membership.members().await;
        let asks = members
            .iter()
            .filter(|m| m.state == shoal_gossip::MemberState::Alive && !m.is_self)
            .map(|m| {
                let addr = m.gossip_addr;
                async move {
                    match ask(&self.endpoint, addr, &NodeRequest::Events).await {
                        Ok(NodeResponse::Events(events)) => events,
                        Ok(_) | Err(_) => Vec::new(),
                    }
                }
            });
        let mut all = self.events.snapshot();
        for events in futures_util::future::join_all(asks).await {
            all.extend(events.into_iter().filter(valid_record));
        }
        all.sort_by_key(|r| (r.first_ms, r.host.clone(), r.seq));
        all
    }
}

/// A peer's event names an object and a namespace the API serves under: checked like any
/// name from the network.
fn valid_record(r: &crate::observed::events::EventRecord) -> bool {
    let ok = shoal_state::labels::check_dns_subdomain(&r.name).is_ok()
        && (r.regarding.namespace.is_empty()
            || shoal_state::labels::check_dns_label(&r.regarding.namespace).is_ok());
    if !ok {
        debug!(host = %r.host, name = %r.name, "a peer's event with an invalid name was left out");
    }
    ok
}

/// Why asking a peer failed, before it is known by name.
#[derive(Debug)]
pub(super) enum AskError {
    /// The peer could not be asked, or its answer was not a response.
    Transport(String),
    /// The peer answered with an error, or with the wrong kind of answer.
    Refused(String),
}

impl AskError {
    fn at(self, node: &str) -> NodeError {
        match self {
            AskError::Transport(message) => NodeError::Unreachable {
                node: node.to_owned(),
                message,
            },
            AskError::Refused(message) => NodeError::Refused(message),
        }
    }
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::Transport(m) | AskError::Refused(m) => f.write_str(m),
        }
    }
}

/// Sends one request to a peer's node service.
pub(super) async fn ask(
    endpoint: &PeerEndpoint,
    peer: std::net::SocketAddr,
    request: &NodeRequest,
) -> Result<NodeResponse, AskError> {
    let payload = rmp_serde::to_vec(request).expect("requests encode");
    let bytes = endpoint
        .request(peer, Channel::Node, &payload, Duration::from_secs(30))
        .await
        .map_err(|e| AskError::Transport(e.to_string()))?;
    rmp_serde::from_slice(&bytes).map_err(|e| AskError::Transport(format!("bad answer: {e}")))
}

/// A peer's log request names a pod uid and a container, which become path components on
/// this node: both are checked before anything touches the filesystem.
fn check_log_request(req: &LogRequest) -> Result<(), crate::session::RequestError> {
    use crate::session::RequestError;
    if !crate::runtime::is_safe_id(&req.uid) {
        return Err(RequestError::Uid(req.uid.clone()));
    }
    shoal_state::labels::check_dns_label(&req.container).map_err(|reason| RequestError::Container {
        name: req.container.clone(),
        reason,
    })
}

fn local(kubelet: &Kubelet, req: &LogRequest) -> NodeResponse {
    match kubelet.read_log(&req.uid, &req.container, req.previous, &req.query) {
        Ok((chunk, running)) => NodeResponse::Logs { chunk, running },
        Err(e) => NodeResponse::Error(e.to_string()),
    }
}

fn unpack(response: NodeResponse) -> Result<(LogChunk, bool), AskError> {
    match response {
        NodeResponse::Logs { chunk, running } => Ok((chunk, running)),
        NodeResponse::Error(e) => Err(AskError::Refused(e)),
        other => Err(AskError::Refused(format!("unexpected answer {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_from_peers_are_checked_before_they_become_paths() {
        let req = |uid: &str, container: &str| LogRequest {
            uid: uid.into(),
            container: container.into(),
            previous: false,
            query: LogQuery::default(),
        };
        assert!(check_log_request(&req("0f5e-4c2a", "web")).is_ok());
        for (uid, container, named) in [
            ("../../../etc", "web", "uid"),
            ("/etc", "web", "uid"),
            ("", "web", "uid"),
            ("u1", "../../x", "container"),
            ("u1", "a/b", "container"),
        ] {
            let err = check_log_request(&req(uid, container))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{uid} {container}: {err}");
        }
    }

    /// A full chunk of incompressible bytes fits the Node channel's frame (as `bin`; an
    /// array of integers would take up to twice as much and be refused).
    #[test]
    fn a_full_blob_chunk_of_random_bytes_fits_the_channel() {
        let bytes: Vec<u8> = (0..BLOB_CHUNK as u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 | 0x80)
            .collect();
        let response = NodeResponse::Blob { bytes, total: 1 };
        let encoded = rmp_serde::to_vec(&response).unwrap();
        assert!(
            encoded.len() <= shoal_gossip::Channel::Node.max_payload_bytes(),
            "{} bytes",
            encoded.len()
        );
        match rmp_serde::from_slice::<NodeResponse>(&encoded).unwrap() {
            NodeResponse::Blob { bytes, .. } => assert_eq!(bytes.len(), BLOB_CHUNK),
            other => panic!("{other:?}"),
        }
    }
}

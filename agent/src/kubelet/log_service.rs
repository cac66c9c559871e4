//! Container logs across the cluster: each node serves the logs of the containers it runs on
//! the endpoint's `Node` channel, and any node's API fetches them from there (or reads them
//! locally when the pod runs on itself).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shoal_gossip::{Channel, Membership, PeerEndpoint};
use tracing::debug;

use super::Kubelet;
use super::logs::{LogChunk, LogQuery};

/// A request for one container's log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogRequest {
    pub uid: String,
    pub container: String,
    pub previous: bool,
    pub query: LogQuery,
}

#[derive(Debug, Serialize, Deserialize)]
enum LogResponse {
    Chunk { chunk: LogChunk, running: bool },
    Error(String),
}

/// Serves and fetches container logs.
pub struct LogService {
    kubelet: Option<Arc<Kubelet>>,
    membership: Arc<Membership>,
    endpoint: PeerEndpoint,
    node_name: String,
}

impl LogService {
    pub fn new(
        kubelet: Option<Arc<Kubelet>>,
        membership: Arc<Membership>,
        endpoint: PeerEndpoint,
        node_name: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            kubelet,
            membership,
            endpoint,
            node_name,
        })
    }

    /// Answers peers' log requests (only a node that runs pods has any).
    pub fn start(self: &Arc<Self>) -> Result<(), shoal_gossip::EndpointError> {
        let Some(kubelet) = self.kubelet.clone() else {
            return Ok(());
        };
        let mut requests = self.endpoint.subscribe_requests(Channel::Node)?;
        tokio::spawn(async move {
            while let Some(request) = requests.recv().await {
                let kubelet = kubelet.clone();
                tokio::spawn(async move {
                    let response = match rmp_serde::from_slice::<LogRequest>(&request.payload) {
                        Ok(req) => tokio::task::spawn_blocking(move || local(&kubelet, &req))
                            .await
                            .unwrap_or_else(|e| LogResponse::Error(e.to_string())),
                        Err(e) => {
                            debug!(peer = %request.peer, error = %e, "bad log request");
                            LogResponse::Error(format!("bad log request: {e}"))
                        }
                    };
                    request.respond(rmp_serde::to_vec(&response).expect("responses encode"));
                });
            }
        });
        Ok(())
    }

    /// Reads a container's log from `node`; returns the chunk and whether the container still
    /// runs.
    pub async fn read(&self, node: &str, request: LogRequest) -> Result<(LogChunk, bool), String> {
        if node == self.node_name {
            let kubelet = self
                .kubelet
                .clone()
                .ok_or_else(|| format!("node {node} runs no pods (--no-runtime)"))?;
            let response = tokio::task::spawn_blocking(move || local(&kubelet, &request))
                .await
                .map_err(|e| e.to_string())?;
            return unpack(response);
        }
        let member = self
            .membership
            .members()
            .await
            .into_iter()
            .find(|m| m.name() == node)
            .ok_or_else(|| format!("node {node} is not a member of the cluster"))?;
        let payload = rmp_serde::to_vec(&request).expect("requests encode");
        let bytes = self
            .endpoint
            .request(
                member.gossip_addr,
                Channel::Node,
                &payload,
                Duration::from_secs(10),
            )
            .await
            .map_err(|e| format!("node {node}: {e}"))?;
        let response: LogResponse =
            rmp_serde::from_slice(&bytes).map_err(|e| format!("node {node}: bad answer: {e}"))?;
        unpack(response)
    }
}

fn local(kubelet: &Kubelet, req: &LogRequest) -> LogResponse {
    match kubelet.read_log(&req.uid, &req.container, req.previous, &req.query) {
        Ok((chunk, running)) => LogResponse::Chunk { chunk, running },
        Err(e) => LogResponse::Error(e),
    }
}

fn unpack(response: LogResponse) -> Result<(LogChunk, bool), String> {
    match response {
        LogResponse::Chunk { chunk, running } => Ok((chunk, running)),
        LogResponse::Error(e) => Err(e),
    }
}

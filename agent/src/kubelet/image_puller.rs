//! Images between nodes: each node gossips which images it holds (`node.images`); a node
//! asked to run a pod whose image it lacks pulls the manifest and the missing blobs from a
//! peer that has it, over the QUIC endpoint, verifying every blob's sha256 before it enters
//! the store.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::PoisonError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oci_spec::image::ImageManifest;
use shoal_gossip::{Membership, PeerEndpoint, keys};
use tracing::{info, warn};

use super::node_service::{NodeRequest, NodeResponse, ask};
use crate::images::reference::{self, Reference};
use crate::images::registry::{self, Registries};
use crate::images::{ImageError, ImageStore};

/// Why a pull from a peer failed.
#[derive(Debug, thiserror::Error)]
enum PullError {
    /// The peer could not be asked, refused, or answered out of turn.
    #[error("{0}")]
    Peer(String),
    #[error("peer now has {got} for {image}, gossip said {expected}")]
    Moved {
        image: String,
        got: String,
        expected: String,
    },
    #[error("manifest {digest}: {source}")]
    Manifest {
        digest: String,
        source: serde_json::Error,
    },
    #[error("blob {digest} has {total} bytes at the peer, the manifest says {size}")]
    Size {
        digest: String,
        total: u64,
        size: u64,
    },
    #[error("receiving a blob: {0}")]
    Write(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] ImageError),
    #[error("the pull's task ended: {0}")]
    Task(#[from] tokio::task::JoinError),
}

fn answered_out_of_turn(response: NodeResponse) -> PullError {
    match response {
        NodeResponse::Error(e) => PullError::Peer(e),
        other => PullError::Peer(format!("unexpected answer {other:?}")),
    }
}

/// Where a pull stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullState {
    Pulling { from: String },
    Failed { message: String },
}

/// Pulls images from peers and advertises this node's.
pub struct ImagePuller {
    images: ImageStore,
    membership: Arc<Membership>,
    endpoint: PeerEndpoint,
    /// Which registries this node pulls from when no peer has an image.
    registries: Registries,
    pulls: Mutex<HashMap<String, PullState>>,
}

impl ImagePuller {
    pub fn new(
        images: ImageStore,
        membership: Arc<Membership>,
        endpoint: PeerEndpoint,
        registries: Registries,
    ) -> Arc<Self> {
        Arc::new(Self {
            images,
            membership,
            endpoint,
            registries,
            pulls: Mutex::new(HashMap::new()),
        })
    }

    /// Keeps `node.images` current (the store also changes under `shoal image import`).
    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        crate::supervise::spawn("image-tags", move || me.clone().publish_tags());
    }

    async fn publish_tags(self: Arc<Self>) {
        let puller = self;
        {
            let mut published: Option<BTreeMap<String, String>> = None;
            let mut ticker = tokio::time::interval(Duration::from_secs(1));
            loop {
                ticker.tick().await;
                let images = puller.images.clone();
                let Ok(Ok(tags)) = tokio::task::spawn_blocking(move || images.tags_map()).await
                else {
                    continue;
                };
                if published.as_ref() != Some(&tags) {
                    puller.membership.publish(keys::IMAGES, &tags).await;
                    published = Some(tags);
                }
            }
        }
    }

    /// The state of a pull of `image`, starting one if a peer has the image and none runs.
    /// `None`: no live peer has it.
    pub fn pull(
        self: &Arc<Self>,
        image: &str,
        handle: &tokio::runtime::Handle,
    ) -> Option<PullState> {
        let normal = reference::normalize(image).ok()?;
        if let Some(state) = self
            .pulls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&normal)
            && matches!(state, PullState::Pulling { .. })
        {
            return Some(state.clone());
        }
        let peers = handle.block_on(self.membership.peer_values(keys::IMAGES));
        let source = peers.into_iter().find_map(|p| {
            let images = p.value?.ok()?;
            images
                .get(&normal)
                .map(|digest| (p.node_id, p.addr, digest.clone()))
        });
        let Some((node_id, addr, digest)) = source else {
            // No peer has it: its registry, if this node pulls from it (a failure stays visible
            // until the next attempt, which tries again). Images under `shoal.local/` exist
            // only in the cluster.
            if let Ok(reference) = Reference::parse(image)
                && reference.domain != reference::LOCAL_DOMAIN
                && self.registries.pulls_from(reference.api_host())
            {
                return Some(self.pull_from_registry(normal, reference.api_host(), handle));
            }
            return self
                .pulls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&normal)
                .cloned();
        };
        let state = PullState::Pulling {
            from: format!("node {node_id}"),
        };
        self.pulls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(normal.clone(), state.clone());
        let puller = self.clone();
        handle.spawn(async move {
            let result = puller.fetch(addr, &normal, &digest).await;
            let mut pulls = puller.pulls.lock().unwrap_or_else(PoisonError::into_inner);
            match result {
                Ok(bytes) => {
                    info!(image = %normal, from = %node_id, bytes, "image pulled from a peer");
                    pulls.remove(&normal);
                }
                Err(error) => {
                    warn!(image = %normal, from = %node_id, %error, "image pull failed");
                    pulls.insert(
                        normal.clone(),
                        PullState::Failed {
                            message: error.to_string(),
                        },
                    );
                }
            }
        });
        Some(state)
    }

    /// Starts pulling `image` (normalised) from its registry `host` unless a pull of it runs.
    fn pull_from_registry(
        self: &Arc<Self>,
        image: String,
        host: &str,
        handle: &tokio::runtime::Handle,
    ) -> PullState {
        let state = PullState::Pulling {
            from: format!("registry {host}"),
        };
        let mut pulls = self.pulls.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running @ PullState::Pulling { .. }) = pulls.get(&image) {
            return running.clone();
        }
        pulls.insert(image.clone(), state.clone());
        drop(pulls);
        let puller = self.clone();
        let host = host.to_owned();
        handle.spawn(async move {
            let result = registry::pull(&puller.images, &image, &puller.registries).await;
            let mut pulls = puller.pulls.lock().unwrap_or_else(PoisonError::into_inner);
            match result {
                Ok((digest, bytes)) => {
                    info!(%image, registry = %host, %digest, bytes, "image pulled from its registry");
                    pulls.remove(&image);
                }
                Err(error) => {
                    warn!(%image, registry = %host, %error, "image pull failed");
                    pulls.insert(
                        image,
                        PullState::Failed {
                            message: error.to_string(),
                        },
                    );
                }
            }
        });
        state
    }

    /// Pulls manifest and blobs from `peer`; returns the bytes received.
    async fn fetch(
        &self,
        peer: std::net::SocketAddr,
        image: &str,
        expected: &str,
    ) -> Result<u64, PullError> {
        let response = ask(
            &self.endpoint,
            peer,
            &NodeRequest::Manifest {
                reference: image.to_owned(),
            },
        )
        .await
        .map_err(|e| PullError::Peer(e.to_string()))?;
        let (digest, bytes) = match response {
            NodeResponse::Manifest { digest, bytes } => (digest, bytes),
            other => return Err(answered_out_of_turn(other)),
        };
        if digest != expected {
            return Err(PullError::Moved {
                image: image.to_owned(),
                got: digest,
                expected: expected.to_owned(),
            });
        }
        let manifest: ImageManifest =
            serde_json::from_slice(&bytes).map_err(|source| PullError::Manifest {
                digest: digest.clone(),
                source,
            })?;
        let mut received = bytes.len() as u64;
        for descriptor in std::iter::once(manifest.config()).chain(manifest.layers()) {
            let blob = descriptor.digest().to_string();
            if self.images.has_blob(&blob) {
                continue;
            }
            received += self.fetch_blob(peer, &blob, descriptor.size()).await?;
        }
        // The manifest last: it is verified like any blob, then tagged.
        let mut file = self.images.incoming_blob()?;
        file.write_all(&bytes)?;
        self.images.commit_blob(&digest, file)?;
        let images = self.images.clone();
        let (image, digest) = (image.to_owned(), digest.clone());
        tokio::task::spawn_blocking(move || images.tag(&image, &digest)).await??;
        Ok(received)
    }

    async fn fetch_blob(
        &self,
        peer: std::net::SocketAddr,
        digest: &str,
        size: u64,
    ) -> Result<u64, PullError> {
        let mut file = self.images.incoming_blob()?;
        let mut offset = 0u64;
        loop {
            let response = ask(
                &self.endpoint,
                peer,
                &NodeRequest::Blob {
                    digest: digest.to_owned(),
                    offset,
                },
            )
            .await
            .map_err(|e| PullError::Peer(e.to_string()))?;
            let (bytes, total) = match response {
                NodeResponse::Blob { bytes, total } => (bytes, total),
                other => return Err(answered_out_of_turn(other)),
            };
            if total != size {
                return Err(PullError::Size {
                    digest: digest.to_owned(),
                    total,
                    size,
                });
            }
            file.write_all(&bytes)?;
            offset += bytes.len() as u64;
            if offset >= total || bytes.is_empty() {
                break;
            }
        }
        let images = self.images.clone();
        let digest = digest.to_owned();
        tokio::task::spawn_blocking(move || images.commit_blob(&digest, file)).await??;
        Ok(offset)
    }
}

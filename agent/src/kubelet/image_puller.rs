//! Images between nodes and from registries: each node gossips which images it holds
//! (`node.images`, not those pulled with credentials); a node asked to run a pod whose image
//! it lacks pulls the manifest and the missing blobs from a peer that has it, over the QUIC
//! endpoint, verifying every blob's sha256 before it enters the store, and from the image's
//! registry when no peer has it (`imagePullPolicy: Always`: from the registry each time).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oci_spec::image::ImageManifest;
use shoal_gossip::{Membership, PeerEndpoint, keys};
use tracing::{info, warn};

use super::node_service::{NodeRequest, NodeResponse, ask};
use crate::images::auth;
use crate::images::progress::Progress;
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

/// A pull running on the runtime: the bytes received, or why it failed.
type BoxedPull = std::pin::Pin<Box<dyn std::future::Future<Output = Result<u64, String>> + Send>>;

fn answered_out_of_turn(response: NodeResponse) -> PullError {
    match response {
        NodeResponse::Error(e) => PullError::Peer(e),
        other => PullError::Peer(format!("unexpected answer {other:?}")),
    }
}

/// Where a pull stands.
#[derive(Debug, Clone)]
pub enum PullState {
    Pulling {
        from: String,
        /// Its blobs' bytes as they come.
        progress: Arc<Progress>,
    },
    /// It failed (reported once: the next ask starts a new pull).
    Failed { message: String },
    /// It finished: the image is in the store (reported once).
    Done(Done),
}

/// A finished pull, as the `Pulled` event describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub from: String,
    pub bytes: u64,
    pub took: Duration,
}

/// What a container start asks of the puller.
pub struct PullRequest<'a> {
    pub image: &'a str,
    /// Ask the registry even though the node may have the image (`imagePullPolicy: Always`):
    /// the tag is resolved again and only the blobs the store lacks are fetched.
    pub refresh: bool,
    /// The entries of the pod's `imagePullSecrets`, and a key naming them: pulls of one
    /// image with different credentials are kept apart.
    pub secrets: &'a [auth::Entry],
    /// The pod's namespace and pull secrets' names, for the peer that fetches a blob for it.
    pub namespace: &'a str,
    pub secret_names: &'a [String],
    pub secrets_key: &'a str,
}

/// How long the owner of a blob holds a peer's request while it fetches the blob.
pub const LONG_POLL: Duration = Duration::from_secs(10);
/// The most blobs one node fetches from registries for peers at once.
const MAX_BLOB_FETCHES: usize = 32;

/// The owner's answer to a peer waiting for a blob from the registry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BlobAnswer {
    /// In the owner's store: fetch it from there.
    Ready,
    /// Still coming; `received` bytes so far (a waiting peer gives up when it stops growing).
    Pending { received: u64 },
    /// The owner could not fetch it (the peer fetches it itself).
    Failed(String),
}

/// One blob being fetched from its registry for the cluster.
struct BlobFetch {
    received: AtomicU64,
    done: tokio::sync::watch::Sender<Option<Result<(), String>>>,
}

/// The node that fetches blob `digest` from its registry for the cluster: the highest
/// rendezvous hash of (node id, digest) among `nodes` (those that run pods), so that every
/// node that sees the same members picks the same one, and a node's departure moves only its
/// own blobs.
pub fn blob_owner<'a>(nodes: &[&'a str], digest: &str) -> Option<&'a str> {
    use sha2::Digest as _;
    nodes.iter().copied().max_by_key(|node| {
        let mut hash = sha2::Sha256::new();
        hash.update(node.as_bytes());
        hash.update([0]);
        hash.update(digest.as_bytes());
        let out = hash.finalize();
        (
            u64::from_be_bytes(out[..8].try_into().expect("8 bytes")),
            *node,
        )
    })
}

/// Pulls images from peers and registries, and advertises this node's.
pub struct ImagePuller {
    images: ImageStore,
    membership: Arc<Membership>,
    endpoint: PeerEndpoint,
    /// Which registries this node pulls from when no peer has an image.
    registries: Registries,
    /// By image and pull-secret key.
    pulls: Mutex<HashMap<String, PullState>>,
    /// Blobs being fetched from registries for the cluster, by digest.
    blob_fetches: Mutex<HashMap<String, Arc<BlobFetch>>>,
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
            blob_fetches: Mutex::new(HashMap::new()),
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

    /// The registry this node would pull `image` from, if it pulls it from one at all
    /// (`--registry-pulls`; images under `shoal.local/` exist only in the cluster).
    pub fn registry_of(&self, image: &str) -> Option<String> {
        let reference = Reference::parse(image).ok()?;
        (reference.domain != reference::LOCAL_DOMAIN
            && self.registries.pulls_from(reference.api_host()))
        .then(|| reference.api_host().to_owned())
    }

    /// The state of a pull of `request.image`: a pull that ended is reported once (and
    /// forgotten); otherwise one is started unless one runs, from a live peer that has the
    /// image (not for a refresh) or else from its registry. `None`: neither has it.
    pub fn pull(
        self: &Arc<Self>,
        request: &PullRequest<'_>,
        handle: &tokio::runtime::Handle,
    ) -> Option<PullState> {
        let normal = reference::normalize(request.image).ok()?;
        let key = format!("{normal} {}", request.secrets_key);
        {
            let mut pulls = self.pulls.lock().unwrap_or_else(PoisonError::into_inner);
            match pulls.get(&key) {
                Some(state @ PullState::Pulling { .. }) => return Some(state.clone()),
                Some(_) => return pulls.remove(&key),
                None => {}
            }
        }
        let source = if request.refresh {
            None
        } else {
            let peers = handle.block_on(self.membership.peer_values(keys::IMAGES));
            peers.into_iter().find_map(|p| {
                let images = p.value?.ok()?;
                images
                    .get(&normal)
                    .map(|digest| (p.node_id, p.addr, digest.clone()))
            })
        };
        let progress = Arc::new(Progress::default());
        let (from, task): (String, BoxedPull) = match source {
            Some((node_id, addr, digest)) => {
                let puller = self.clone();
                let image = normal.clone();
                let progress = progress.clone();
                (
                    format!("node {node_id}"),
                    Box::pin(async move {
                        puller
                            .fetch(addr, &image, &digest, &progress)
                            .await
                            .map_err(|e| e.to_string())
                    }),
                )
            }
            None => {
                let host = self.registry_of(request.image)?;
                let puller = self.clone();
                let (image, secrets) = (normal.clone(), request.secrets.to_vec());
                let progress = progress.clone();
                let cluster = ClusterBlobs {
                    puller: self.clone(),
                    image: normal.clone(),
                    namespace: request.namespace.to_owned(),
                    secret_names: request.secret_names.to_vec(),
                    secrets: request.secrets.to_vec(),
                };
                (
                    format!("registry {host}"),
                    Box::pin(async move {
                        registry::pull_tracked(
                            &puller.images,
                            &image,
                            &puller.registries,
                            &secrets,
                            Some(&cluster),
                            Some(&progress),
                        )
                        .await
                        .map(|p| p.bytes + p.from_peers)
                        .map_err(|e| e.to_string())
                    }),
                )
            }
        };
        let state = PullState::Pulling {
            from: from.clone(),
            progress,
        };
        self.pulls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), state.clone());
        let puller = self.clone();
        handle.spawn(async move {
            let started = std::time::Instant::now();
            let result = task.await;
            let took = started.elapsed();
            let state = match result {
                Ok(bytes) => {
                    info!(image = %normal, %from, bytes, ?took, "image pulled");
                    PullState::Done(Done { from, bytes, took })
                }
                Err(message) => {
                    warn!(image = %normal, %from, error = %message, "image pull failed");
                    PullState::Failed { message }
                }
            };
            puller
                .pulls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, state);
        });
        Some(state)
    }

    /// Fetches blob `digest` of `image` from its registry for the cluster unless a fetch of it
    /// runs (at most [`MAX_BLOB_FETCHES`] at once), and waits up to [`LONG_POLL`] for it.
    pub async fn serve_registry_blob(
        self: &Arc<Self>,
        image: &str,
        (digest, size, manifest): (&str, u64, bool),
        secrets: Vec<auth::Entry>,
    ) -> BlobAnswer {
        if self.images.has_blob(digest) {
            return BlobAnswer::Ready;
        }
        let fetch = {
            let mut fetches = self
                .blob_fetches
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match fetches.get(digest) {
                Some(fetch) => fetch.clone(),
                None => {
                    if fetches.len() >= MAX_BLOB_FETCHES {
                        return BlobAnswer::Failed(format!(
                            "{MAX_BLOB_FETCHES} blobs are being fetched already"
                        ));
                    }
                    if self.registry_of(image).is_none() {
                        return BlobAnswer::Failed(format!(
                            "this node does not pull {image} from a registry (--registry-pulls)"
                        ));
                    }
                    let fetch = Arc::new(BlobFetch {
                        received: AtomicU64::new(0),
                        done: tokio::sync::watch::channel(None).0,
                    });
                    fetches.insert(digest.to_owned(), fetch.clone());
                    let (puller, running) = (self.clone(), fetch.clone());
                    let (image, digest) = (image.to_owned(), digest.to_owned());
                    tokio::spawn(async move {
                        let result = registry::fetch_blob(
                            &puller.images,
                            &image,
                            (&digest, size, manifest),
                            &puller.registries,
                            &secrets,
                            Some(&running.received),
                        )
                        .await;
                        match &result {
                            Ok(bytes) => {
                                info!(%image, %digest, bytes, "blob fetched for the cluster")
                            }
                            Err(error) => {
                                warn!(%image, %digest, %error, "blob fetch for the cluster failed")
                            }
                        }
                        puller
                            .blob_fetches
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(&digest);
                        running
                            .done
                            .send_replace(Some(result.map(|_| ()).map_err(|e| e.to_string())));
                    });
                    fetch
                }
            }
        };
        let mut done = fetch.done.subscribe();
        let _ = tokio::time::timeout(LONG_POLL, done.wait_for(Option::is_some)).await;
        match &*done.borrow() {
            Some(Ok(())) => BlobAnswer::Ready,
            Some(Err(message)) => BlobAnswer::Failed(message.clone()),
            None => BlobAnswer::Pending {
                received: fetch.received.load(Ordering::Relaxed),
            },
        }
    }

    /// The pull of `image` (with the pull-secret key `secrets_key`) that finished, if one did
    /// and was not reported yet (forgotten then).
    pub fn take_done(&self, image: &str, secrets_key: &str) -> Option<Done> {
        let key = format!("{} {secrets_key}", reference::normalize(image).ok()?);
        let mut pulls = self.pulls.lock().unwrap_or_else(PoisonError::into_inner);
        match pulls.get(&key) {
            Some(PullState::Done(_)) => match pulls.remove(&key) {
                Some(PullState::Done(done)) => Some(done),
                _ => None,
            },
            _ => None,
        }
    }

    /// Pulls manifest and blobs from `peer`; returns the bytes received.
    async fn fetch(
        &self,
        peer: std::net::SocketAddr,
        image: &str,
        expected: &str,
        progress: &Progress,
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
        progress.plan(
            std::iter::once(manifest.config())
                .chain(manifest.layers())
                .map(|d| {
                    let digest = d.digest().to_string();
                    let present = self.images.has_blob(&digest);
                    (digest, d.size(), present)
                }),
        );
        for (i, descriptor) in std::iter::once(manifest.config())
            .chain(manifest.layers())
            .enumerate()
        {
            let blob = descriptor.digest().to_string();
            if !self.images.has_blob(&blob) {
                received += self
                    .fetch_blob(peer, &blob, descriptor.size(), Some(progress))
                    .await?;
            }
            // The config first: an image for another platform is refused before its layers
            // move (a peer may run another architecture).
            if i == 0 {
                self.images.check_platform(image, &blob)?;
            }
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
        progress: Option<&Progress>,
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
            if let Some(progress) = progress {
                progress.set(digest, offset);
            }
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

/// The cluster as a source of a registry image's blobs: each blob is fetched from the
/// registry by its owner ([`blob_owner`]) and copied from there; this node waits while the
/// owner's download grows, and fetches the blob itself when the owner fails, dies, or stalls
/// for [`registry::IDLE`].
struct ClusterBlobs {
    puller: Arc<ImagePuller>,
    image: String,
    namespace: String,
    secret_names: Vec<String>,
    secrets: Vec<auth::Entry>,
}

impl registry::BlobSource for ClusterBlobs {
    fn fetch<'a>(
        &'a self,
        digest: &'a str,
        size: u64,
        manifest: bool,
        progress: Option<&'a Progress>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<registry::Moved>> + Send + 'a>>
    {
        Box::pin(self.fetch_blob(digest, size, manifest, progress))
    }
}

impl ClusterBlobs {
    /// The owner's download counts into `progress` while this node waits for it, then the
    /// copy from the owner.
    async fn fetch_blob(
        &self,
        digest: &str,
        size: u64,
        manifest: bool,
        progress: Option<&Progress>,
    ) -> Option<registry::Moved> {
        let report = |received| {
            if let Some(progress) = progress {
                progress.set(digest, received);
            }
        };
        let puller = &self.puller;
        let peers = puller.membership.peer_values(keys::IMAGES).await;
        let me = puller.membership.node_id().to_owned();
        let nodes: Vec<&str> = peers
            .iter()
            .filter(|p| p.value.is_some())
            .map(|p| p.node_id.as_str())
            .chain([me.as_str()])
            .collect();
        let owner = blob_owner(&nodes, digest)?;
        if owner == me {
            // This node fetches it, through the same single flight its peers wait on.
            loop {
                match puller
                    .serve_registry_blob(
                        &self.image,
                        (digest, size, manifest),
                        self.secrets.clone(),
                    )
                    .await
                {
                    BlobAnswer::Ready => {
                        return Some(registry::Moved {
                            from_registry: size,
                            from_peers: 0,
                        });
                    }
                    BlobAnswer::Pending { received } => report(received),
                    BlobAnswer::Failed(_) => return None,
                }
            }
        }
        let addr = peers.iter().find(|p| p.node_id == owner)?.addr;
        let request = NodeRequest::RegistryBlob(super::node_service::RegistryBlobRequest {
            image: self.image.clone(),
            digest: digest.to_owned(),
            size,
            manifest,
            namespace: self.namespace.clone(),
            secrets: self.secret_names.clone(),
        });
        let (mut seen, mut since) = (0, std::time::Instant::now());
        loop {
            match ask(&puller.endpoint, addr, &request).await {
                Ok(NodeResponse::RegistryBlob(BlobAnswer::Ready)) => {
                    return match puller.fetch_blob(addr, digest, size, progress).await {
                        Ok(bytes) => Some(registry::Moved {
                            from_registry: 0,
                            from_peers: bytes,
                        }),
                        Err(error) => {
                            warn!(%digest, %owner, %error, "blob from its owner failed; fetching it from the registry");
                            None
                        }
                    };
                }
                Ok(NodeResponse::RegistryBlob(BlobAnswer::Pending { received })) => {
                    report(received);
                    if received > seen {
                        (seen, since) = (received, std::time::Instant::now());
                    } else if since.elapsed() > registry::IDLE {
                        warn!(%digest, %owner, received, "the blob's owner stalled; fetching it from the registry");
                        return None;
                    }
                }
                Ok(NodeResponse::RegistryBlob(BlobAnswer::Failed(error))) => {
                    warn!(%digest, %owner, %error, "the blob's owner could not fetch it; fetching it from the registry");
                    return None;
                }
                Ok(other) => {
                    warn!(%digest, %owner, error = %answered_out_of_turn(other), "fetching the blob from the registry");
                    return None;
                }
                Err(error) => {
                    warn!(%digest, %owner, %error, "the blob's owner did not answer; fetching it from the registry");
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_has_one_owner_that_moves_only_when_it_leaves() {
        let nodes = ["n0", "n1", "n2", "n3", "n4"];
        let digests: Vec<String> = (0..200).map(|i| format!("sha256:{i:064x}")).collect();
        let owners: Vec<&str> = digests
            .iter()
            .map(|d| blob_owner(&nodes, d).unwrap())
            .collect();
        // Order does not matter; every node owns some.
        let mut reversed = nodes;
        reversed.reverse();
        for (d, owner) in digests.iter().zip(&owners) {
            assert_eq!(blob_owner(&reversed, d), Some(*owner));
        }
        for n in nodes {
            let owned = owners.iter().filter(|o| **o == n).count();
            assert!((15..=65).contains(&owned), "{n} owns {owned} of 200");
        }
        // n2 leaves: only its blobs move.
        let without: Vec<&str> = nodes.iter().copied().filter(|n| *n != "n2").collect();
        for (d, owner) in digests.iter().zip(&owners) {
            let now = blob_owner(&without, d).unwrap();
            if *owner != "n2" {
                assert_eq!(now, *owner);
            } else {
                assert_ne!(now, "n2");
            }
        }
        assert_eq!(blob_owner(&[], "sha256:0"), None);
    }
}

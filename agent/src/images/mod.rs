//! The node's image store (DESIGN.md §8): content-addressed blobs (sha256, verified on
//! import), tags naming manifests, and layers unpacked once into directories that containers
//! mount as overlayfs lower layers.
//!
//! Layout under `<data-dir>/images/`:
//! - `blobs/sha256/<hex>`: manifests, configs and layer blobs, named by the hash of their bytes;
//! - `layers/<hex>/`: a layer blob unpacked (whiteouts turned into overlay whiteouts);
//! - `tags.json`: normalised reference → manifest digest;
//! - `lock`: held (flock) while the store changes, so the CLI and the agent can share it.

mod archive;
pub mod auth;
pub mod layer;
pub mod progress;
pub mod reference;
pub mod registry;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest, MediaType};
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image store {path}: {source}")]
    Store { path: PathBuf, source: io::Error },
    #[error("archive {archive}: {source}")]
    Archive { archive: PathBuf, source: io::Error },
    #[error("archive {archive}: {reason}")]
    Invalid { archive: PathBuf, reason: String },
    #[error(
        "archive {archive}: blob {blob} is corrupt: its content hashes to {actual}; the archive is damaged or was altered"
    )]
    Corrupt {
        archive: PathBuf,
        blob: String,
        actual: String,
    },
    #[error("image {reference:?}: {reason}")]
    Reference { reference: String, reason: String },
    #[error("image {reference} is not present on this node (import it with `shoal image import`)")]
    NotFound { reference: String },
    #[error("image {reference}: stored {what} {digest} is unreadable: {reason}")]
    Damaged {
        reference: String,
        what: &'static str,
        digest: String,
        reason: String,
    },
    #[error("image {reference} is in use by a running container ({mount})")]
    InUse { reference: String, mount: String },
    #[error(
        "image {reference}: its layers unpack to more than {limit} bytes together (the node's --max-image-bytes)"
    )]
    TooLarge { reference: String, limit: u64 },
    #[error("image {reference}: {layers} layers (at most {limit})")]
    TooManyLayers {
        reference: String,
        layers: usize,
        limit: usize,
    },
    #[error("image {reference} is built for {found}; this node runs linux/{arch}")]
    Platform {
        reference: String,
        found: String,
        arch: &'static str,
    },
    #[error(transparent)]
    Layer(#[from] layer::LayerError),
}

/// How long a blob or layer no image needs is kept (see `collect_garbage`).
const RECENT: std::time::Duration = std::time::Duration::from_secs(600);

/// The suffix of the file beside an unpacked layer (`layers/<hex>.size`) that records the
/// apparent bytes its files hold (for `--max-image-bytes`).
const SIZE_SUFFIX: &str = ".size";

/// A layer's recorded size; 0 when missing or unreadable (the file is the node's own, small,
/// and a bad one only makes the image bound more lenient, never the layer's).
fn read_size(path: &Path) -> u64 {
    std::fs::read(path)
        .ok()
        .filter(|b| b.len() <= 20)
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// One tagged image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSummary {
    pub reference: String,
    /// `sha256:<hex>` of the manifest.
    pub digest: String,
    /// Compressed size of config and layers.
    pub size_bytes: u64,
}

/// What a container needs from its image.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    pub reference: String,
    pub digest: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    /// Unpacked layer directories, lowest first.
    pub layers: Vec<PathBuf>,
}

/// The content-addressed image store of one node.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
    layer_limits: layer::LayerLimits,
}

/// Held while the store changes.
struct StoreLock {
    _lock: nix::fcntl::Flock<File>,
}

impl ImageStore {
    /// Opens (creating) the store at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ImageError> {
        let root = root.into();
        for dir in ["blobs/sha256", "layers", "tmp", "private"] {
            let path = root.join(dir);
            std::fs::create_dir_all(&path).map_err(|source| ImageError::Store { path, source })?;
        }
        // Layer directories become overlay lower dirs: absolute paths.
        let root = std::fs::canonicalize(&root).map_err(|source| ImageError::Store {
            path: root.clone(),
            source,
        })?;
        Ok(Self {
            root,
            layer_limits: layer::LayerLimits::default(),
        })
    }

    /// Bounds what one layer may unpack to.
    /// The limits layers are unpacked under.
    pub fn layer_limits(&self) -> layer::LayerLimits {
        self.layer_limits
    }

    pub fn with_layer_limits(mut self, limits: layer::LayerLimits) -> Self {
        self.layer_limits = limits;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn store_err(&self, path: &Path) -> impl Fn(io::Error) -> ImageError {
        let path = path.to_owned();
        move |source| ImageError::Store {
            path: path.clone(),
            source,
        }
    }

    fn lock(&self) -> Result<StoreLock, ImageError> {
        let path = self.root.join("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(self.store_err(&path))?;
        // Blocks until the other holder (the CLI or the agent) is done.
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(
            |(_, errno)| ImageError::Store {
                path,
                source: io::Error::from(errno),
            },
        )?;
        Ok(StoreLock { _lock: lock })
    }

    fn blob_path(&self, hex: &str) -> PathBuf {
        self.root.join("blobs/sha256").join(hex)
    }

    /// Stores the bytes of `reader` as a blob; returns its hex digest.
    fn put_blob(&self, reader: &mut dyn Read) -> io::Result<String> {
        let (tmp, hex) = archive::spool(&self.root.join("tmp"), reader)?;
        let dest = self.blob_path(&hex);
        if dest.exists() {
            std::fs::remove_file(&tmp)?;
        } else {
            std::fs::rename(&tmp, &dest)?;
        }
        Ok(hex)
    }

    fn read_blob(&self, digest: &str, max: u64) -> io::Result<Vec<u8>> {
        let hex = reference::parse_digest(digest).map_err(io::Error::other)?;
        let mut bytes = Vec::new();
        File::open(self.blob_path(hex))?
            .take(max)
            .read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    fn tags(&self) -> Result<BTreeMap<String, String>, ImageError> {
        let path = self.root.join("tags.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|err| ImageError::Store {
                path,
                source: io::Error::new(io::ErrorKind::InvalidData, err),
            }),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(source) => Err(ImageError::Store { path, source }),
        }
    }

    fn write_tags(&self, tags: &BTreeMap<String, String>) -> Result<(), ImageError> {
        let path = self.root.join("tags.json");
        let tmp = self.root.join("tmp/tags.json");
        let bytes = serde_json::to_vec_pretty(tags).expect("tags serialize");
        std::fs::write(&tmp, bytes)
            .and_then(|()| File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(self.store_err(&path))
    }

    /// Imports every image of an OCI archive or `docker save` archive, tagging it `tag` if
    /// given (else with the names the archive carries). Returns the imported images.
    pub fn import(
        &self,
        archive_path: &Path,
        tag: Option<&str>,
    ) -> Result<Vec<ImageSummary>, ImageError> {
        let tag = tag
            .map(|t| {
                reference::normalize(t).map_err(|reason| ImageError::Reference {
                    reference: t.to_owned(),
                    reason: reason.to_string(),
                })
            })
            .transpose()?;
        let _lock = self.lock()?;
        let unpacked = archive::read(self, archive_path)?;
        let invalid = |reason: String| ImageError::Invalid {
            archive: archive_path.to_owned(),
            reason,
        };
        // (names, manifest digest)
        let mut images: Vec<(Vec<String>, String)> = Vec::new();
        if let Some(index) = &unpacked.index {
            let index: ImageIndex = serde_json::from_slice(index)
                .map_err(|err| invalid(format!("index.json: {err}")))?;
            for descriptor in index.manifests() {
                let digest = self.platform_manifest(descriptor, archive_path, 0)?;
                let names = descriptor
                    .annotations()
                    .as_ref()
                    .and_then(|a| a.get("org.opencontainers.image.ref.name"))
                    .and_then(|name| reference::normalize(name).ok())
                    .into_iter()
                    .collect();
                images.push((names, digest));
            }
        } else if let Some(manifest) = &unpacked.docker_manifest {
            images = self.import_docker(&unpacked, manifest, archive_path)?;
        } else {
            return Err(invalid(
                "neither an OCI image archive (index.json) nor a `docker save` archive (manifest.json)".into(),
            ));
        }
        if images.is_empty() {
            return Err(invalid("the archive holds no image".into()));
        }
        if let Some(tag) = &tag {
            if images.len() > 1 {
                return Err(invalid(format!(
                    "--tag names one image but the archive holds {}",
                    images.len()
                )));
            }
            images[0].0 = vec![tag.clone()];
        }
        let mut tags = self.tags()?;
        let mut imported = Vec::new();
        for (names, digest) in &images {
            let manifest = self.manifest(digest, archive_path)?;
            self.check_complete(&manifest, archive_path)?;
            if names.is_empty() {
                return Err(invalid(format!(
                    "image {digest} carries no name; pass --tag"
                )));
            }
            for name in names {
                tags.insert(name.clone(), digest.clone());
                imported.push(ImageSummary {
                    reference: name.clone(),
                    digest: digest.clone(),
                    size_bytes: size_of(&manifest),
                });
            }
        }
        self.write_tags(&tags)?;
        self.collect_garbage(&tags, &BTreeSet::new())?;
        Ok(imported)
    }

    /// The manifest digest a descriptor leads to on this platform (following nested indexes).
    fn platform_manifest(
        &self,
        descriptor: &oci_spec::image::Descriptor,
        archive: &Path,
        depth: u8,
    ) -> Result<String, ImageError> {
        let digest = descriptor.digest().to_string();
        if *descriptor.media_type() != MediaType::ImageIndex {
            return Ok(digest);
        }
        let invalid = |reason: String| ImageError::Invalid {
            archive: archive.to_owned(),
            reason,
        };
        if depth > 4 {
            return Err(invalid("image indexes nest deeper than 4".into()));
        }
        let bytes = self
            .read_blob(&digest, archive::MAX_METADATA_BYTES)
            .map_err(|err| invalid(format!("index {digest}: {err}")))?;
        let index: ImageIndex = serde_json::from_slice(&bytes)
            .map_err(|err| invalid(format!("index {digest}: {err}")))?;
        let arch = go_arch();
        let chosen = index
            .manifests()
            .iter()
            .find(|m| {
                m.platform().as_ref().is_none_or(|p| {
                    p.os().to_string() == "linux" && p.architecture().to_string() == arch
                })
            })
            .ok_or_else(|| invalid(format!("index {digest} has no linux/{arch} image")))?;
        self.platform_manifest(chosen, archive, depth + 1)
    }

    fn manifest(&self, digest: &str, archive: &Path) -> Result<ImageManifest, ImageError> {
        let bytes = self
            .read_blob(digest, archive::MAX_METADATA_BYTES)
            .map_err(|err| ImageError::Invalid {
                archive: archive.to_owned(),
                reason: format!("manifest {digest}: {err}"),
            })?;
        serde_json::from_slice(&bytes).map_err(|err| ImageError::Invalid {
            archive: archive.to_owned(),
            reason: format!("manifest {digest}: {err}"),
        })
    }

    /// Every blob a manifest names is in the store, with the size the manifest says.
    fn check_complete(&self, manifest: &ImageManifest, archive: &Path) -> Result<(), ImageError> {
        for descriptor in std::iter::once(manifest.config()).chain(manifest.layers()) {
            let digest = descriptor.digest().to_string();
            let hex = reference::parse_digest(&digest).map_err(|reason| ImageError::Invalid {
                archive: archive.to_owned(),
                reason: reason.to_string(),
            })?;
            match std::fs::metadata(self.blob_path(hex)) {
                Ok(meta) if meta.len() == descriptor.size() => {}
                Ok(meta) => {
                    return Err(ImageError::Invalid {
                        archive: archive.to_owned(),
                        reason: format!(
                            "blob {digest} has {} bytes, the manifest says {}",
                            meta.len(),
                            descriptor.size()
                        ),
                    });
                }
                Err(_) => {
                    return Err(ImageError::Invalid {
                        archive: archive.to_owned(),
                        reason: format!(
                            "the manifest names blob {digest}, which the archive lacks"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Turns `docker save` entries into OCI manifests (stored as blobs).
    fn import_docker(
        &self,
        unpacked: &archive::Unpacked,
        manifest: &[u8],
        archive: &Path,
    ) -> Result<Vec<(Vec<String>, String)>, ImageError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct DockerImage {
            config: String,
            #[serde(default)]
            repo_tags: Option<Vec<String>>,
            layers: Vec<String>,
        }
        let invalid = |reason: String| ImageError::Invalid {
            archive: archive.to_owned(),
            reason,
        };
        let images: Vec<DockerImage> = serde_json::from_slice(manifest)
            .map_err(|err| invalid(format!("manifest.json: {err}")))?;
        let mut out = Vec::new();
        for image in images {
            let find = |path: &str| {
                unpacked.digest_of(path).map(str::to_owned).ok_or_else(|| {
                    invalid(format!(
                        "manifest.json names {path}, which the archive lacks"
                    ))
                })
            };
            let descriptor = |media: &str, hex: &str| -> Result<serde_json::Value, ImageError> {
                let size = std::fs::metadata(self.blob_path(hex))
                    .map_err(self.store_err(&self.blob_path(hex)))?
                    .len();
                Ok(
                    serde_json::json!({"mediaType": media, "digest": format!("sha256:{hex}"), "size": size}),
                )
            };
            let config = find(&image.config)?;
            let layers = image
                .layers
                .iter()
                .map(|l| descriptor("application/vnd.oci.image.layer.v1.tar", &find(l)?))
                .collect::<Result<Vec<_>, _>>()?;
            let manifest = serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": descriptor("application/vnd.oci.image.config.v1+json", &config)?,
                "layers": layers,
            });
            let bytes = serde_json::to_vec(&manifest).expect("manifest serializes");
            let hex = self
                .put_blob(&mut bytes.as_slice())
                .map_err(self.store_err(&self.root))?;
            let names = image
                .repo_tags
                .unwrap_or_default()
                .iter()
                .filter_map(|t| reference::normalize(t).ok())
                .collect();
            out.push((names, format!("sha256:{hex}")));
        }
        Ok(out)
    }

    /// The layer digests (hex) that mounted overlays of this store use as lower layers.
    fn layers_in_use(&self) -> BTreeSet<String> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefix = format!("{}/", self.root.join("layers").display());
        let mut used = BTreeSet::new();
        for line in mounts.lines() {
            let mut rest = line;
            while let Some(at) = rest.find(&prefix) {
                rest = &rest[at + prefix.len()..];
                let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
                if !hex.is_empty() {
                    used.insert(hex);
                }
            }
        }
        used
    }

    /// The blobs (hex digests) the images of `tags` need: manifests, configs, layers.
    fn reachable(&self, tags: &BTreeMap<String, String>) -> BTreeSet<String> {
        let mut live = BTreeSet::new();
        for digest in tags.values() {
            let Ok(hex) = reference::parse_digest(digest) else {
                continue;
            };
            live.insert(hex.to_owned());
            let Ok(bytes) = self.read_blob(digest, archive::MAX_METADATA_BYTES) else {
                continue;
            };
            if let Ok(manifest) = serde_json::from_slice::<ImageManifest>(&bytes) {
                for d in std::iter::once(manifest.config()).chain(manifest.layers()) {
                    if let Ok(hex) = reference::parse_digest(d.digest().as_ref()) {
                        live.insert(hex.to_owned());
                    }
                }
            }
        }
        live
    }

    /// Removes the blobs and unpacked layers no tagged image reaches and no mounted container
    /// uses (a retagged image's old layers stay while its containers run): those of `doomed`
    /// (an image just removed) at once, any other only once it is older than [`RECENT`] (a
    /// pull in progress commits its blobs before it tags them, and a blob fetched for peers
    /// waits there to be copied).
    fn collect_garbage(
        &self,
        tags: &BTreeMap<String, String>,
        doomed: &BTreeSet<String>,
    ) -> Result<(), ImageError> {
        let mut live: BTreeSet<String> = self.layers_in_use();
        live.extend(self.reachable(tags));
        for dir in ["blobs/sha256", "layers"] {
            let path = self.root.join(dir);
            for entry in std::fs::read_dir(&path).map_err(self.store_err(&path))? {
                let entry = entry.map_err(self.store_err(&path))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                // A layer's recorded size lives and goes with it.
                let owner = name.strip_suffix(SIZE_SUFFIX).unwrap_or(&name);
                if live.contains(owner) {
                    continue;
                }
                let recent = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_none_or(|age| age < RECENT);
                if recent && !doomed.contains(owner) {
                    continue;
                }
                let p = entry.path();
                let result = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                result.map_err(self.store_err(&p))?;
            }
        }
        Ok(())
    }

    /// Every tagged image.
    pub fn list(&self) -> Result<Vec<ImageSummary>, ImageError> {
        let tags = self.tags()?;
        Ok(tags
            .into_iter()
            .map(|(reference, digest)| {
                let size_bytes = self
                    .read_blob(&digest, archive::MAX_METADATA_BYTES)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<ImageManifest>(&b).ok())
                    .map_or(0, |m| size_of(&m));
                ImageSummary {
                    reference,
                    digest,
                    size_bytes,
                }
            })
            .collect())
    }

    /// Whether this node holds the image.
    pub fn contains(&self, reference: &str) -> bool {
        self.lookup(reference).is_ok()
    }

    fn lookup(&self, reference: &str) -> Result<(String, String), ImageError> {
        let normal = reference::normalize(reference).map_err(|reason| ImageError::Reference {
            reference: reference.to_owned(),
            reason: reason.to_string(),
        })?;
        if let Some((_, digest)) = normal.split_once('@') {
            let hex = reference::parse_digest(digest).expect("normalize checked the digest");
            if self.blob_path(hex).exists() {
                return Ok((normal.clone(), digest.to_owned()));
            }
            return Err(ImageError::NotFound { reference: normal });
        }
        match self.tags()?.get(&normal) {
            Some(digest) => Ok((normal, digest.clone())),
            None => Err(ImageError::NotFound { reference: normal }),
        }
    }

    /// Removes a tag (and the blobs only it reached), refusing while a container uses them.
    pub fn remove(&self, reference: &str) -> Result<ImageSummary, ImageError> {
        let (normal, digest) = self.lookup(reference)?;
        let _lock = self.lock()?;
        let mut tags = self.tags()?;
        let summary = ImageSummary {
            reference: normal.clone(),
            digest: digest.clone(),
            size_bytes: 0,
        };
        tags.remove(&normal);
        let mut doomed = BTreeSet::new();
        if !tags.values().any(|d| *d == digest) {
            let manifest = self.manifest(&digest, &self.root)?;
            for d in [digest.as_str(), manifest.config().digest().as_ref()]
                .into_iter()
                .chain(manifest.layers().iter().map(|l| l.digest().as_ref()))
            {
                if let Ok(hex) = reference::parse_digest(d) {
                    doomed.insert(hex.to_owned());
                }
            }
            // Only the layers that would go: another image's (a shared base) stay anyway.
            let kept = self.reachable(&tags);
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            for layer in manifest.layers() {
                let hex = reference::parse_digest(layer.digest().as_ref())
                    .unwrap_or_default()
                    .to_owned();
                if kept.contains(&hex) {
                    continue;
                }
                let dir = self.root.join("layers").join(&hex);
                let dir = dir.to_string_lossy();
                if let Some(line) = mounts.lines().find(|l| l.contains(dir.as_ref())) {
                    let mount = line.split(' ').nth(4).unwrap_or_default().to_owned();
                    return Err(ImageError::InUse {
                        reference: normal,
                        mount,
                    });
                }
            }
        }
        self.write_tags(&tags)?;
        self.collect_garbage(&tags, &doomed)?;
        if let Ok(hex) = reference::parse_digest(&digest)
            && doomed.contains(hex)
        {
            let _ = std::fs::remove_file(self.root.join("private").join(hex));
        }
        Ok(summary)
    }

    /// Removes what no image needs any more and is not recent (see `collect_garbage`): the
    /// image collector runs it each time.
    pub fn sweep(&self) -> Result<(), ImageError> {
        let _lock = self.lock()?;
        let tags = self.tags()?;
        self.collect_garbage(&tags, &BTreeSet::new())
    }

    /// What a container needs to run `reference`, unpacking its layers on first use.
    pub fn resolve(&self, reference: &str) -> Result<ResolvedImage, ImageError> {
        let (normal, digest) = self.lookup(reference)?;
        let damaged = |what: &'static str, digest: &str, reason: String| ImageError::Damaged {
            reference: normal.clone(),
            what,
            digest: digest.to_owned(),
            reason,
        };
        let bytes = self
            .read_blob(&digest, archive::MAX_METADATA_BYTES)
            .map_err(|e| damaged("manifest", &digest, e.to_string()))?;
        let manifest: ImageManifest = serde_json::from_slice(&bytes)
            .map_err(|e| damaged("manifest", &digest, e.to_string()))?;
        let config_digest = manifest.config().digest().to_string();
        let bytes = self
            .read_blob(&config_digest, archive::MAX_METADATA_BYTES)
            .map_err(|e| damaged("config", &config_digest, e.to_string()))?;
        let config: ImageConfiguration = serde_json::from_slice(&bytes)
            .map_err(|e| damaged("config", &config_digest, e.to_string()))?;
        let diff_ids = config.rootfs().diff_ids();
        if diff_ids.len() != manifest.layers().len() {
            return Err(damaged(
                "config",
                &config_digest,
                format!(
                    "{} diff_ids for {} layers",
                    diff_ids.len(),
                    manifest.layers().len()
                ),
            ));
        }
        if manifest.layers().len() > layer::MAX_LAYERS {
            return Err(ImageError::TooManyLayers {
                reference: normal,
                layers: manifest.layers().len(),
                limit: layer::MAX_LAYERS,
            });
        }
        let mut layers = Vec::new();
        // The apparent bytes of the image's layers so far, against --max-image-bytes.
        let mut used = 0u64;
        let image_limit = self.layer_limits.max_image_bytes;
        for (descriptor, diff_id) in manifest.layers().iter().zip(diff_ids) {
            let layer_digest = descriptor.digest().to_string();
            let hex = reference::parse_digest(&layer_digest)
                .map_err(|e| damaged("layer", &layer_digest, e.to_string()))?;
            let dir = self.root.join("layers").join(hex);
            let size_file = self.root.join("layers").join(format!("{hex}{SIZE_SUFFIX}"));
            if dir.exists() {
                // Unpacked for this or another image: its recorded size counts (a layer
                // unpacked before sizes were recorded counts as empty; it passed its own bound).
                used = used.saturating_add(read_size(&size_file));
            } else {
                let left = image_limit.saturating_sub(used);
                let tmp = tempfile::Builder::new()
                    .prefix("layer-")
                    .tempdir_in(self.root.join("tmp"))
                    .map_err(self.store_err(&self.root.join("tmp")))?;
                let limits = layer::LayerLimits {
                    max_image_bytes: left,
                    ..self.layer_limits
                };
                // The blob is hashed again before it is unpacked: disk contents are input too.
                let bytes = match layer::unpack(
                    &self.blob_path(hex),
                    tmp.path(),
                    Some(hex),
                    Some(diff_id),
                    limits,
                ) {
                    Ok(bytes) => bytes,
                    Err(layer::LayerError::OverImage { .. }) => {
                        return Err(ImageError::TooLarge {
                            reference: normal,
                            limit: image_limit,
                        });
                    }
                    Err(e) => return Err(e.into()),
                };
                used = used.saturating_add(bytes);
                // Before the layer is in place: a size without its layer is harmless, a
                // layer without its size counts as empty.
                std::fs::write(&size_file, bytes.to_string())
                    .map_err(self.store_err(&size_file))?;
                let tmp = tmp.keep();
                if let Err(source) = std::fs::rename(&tmp, &dir) {
                    let _ = std::fs::remove_dir_all(&tmp);
                    if !dir.exists() {
                        return Err(ImageError::Store { path: dir, source });
                    }
                }
            }
            layers.push(dir);
        }
        let exec = config.config().clone().unwrap_or_default();
        Ok(ResolvedImage {
            reference: normal,
            digest,
            entrypoint: exec.entrypoint().clone().unwrap_or_default(),
            cmd: exec.cmd().clone().unwrap_or_default(),
            env: exec.env().clone().unwrap_or_default(),
            working_dir: exec.working_dir().clone().filter(|w| !w.is_empty()),
            user: exec.user().clone().filter(|u| !u.is_empty()),
            layers,
        })
    }
}

/// Serving and receiving images between nodes.
impl ImageStore {
    /// Every tag peers may fetch and its manifest digest (what this node gossips): images
    /// pulled with credentials are left out.
    pub fn tags_map(&self) -> Result<BTreeMap<String, String>, ImageError> {
        let mut tags = self.tags()?;
        tags.retain(|_, digest| !self.is_private(digest));
        Ok(tags)
    }

    /// Marks the manifest `digest` as pulled with credentials: peers are not given it (a
    /// pod on another node may have no right to it).
    pub fn mark_private(&self, digest: &str) -> Result<(), ImageError> {
        let hex = reference::parse_digest(digest).map_err(|reason| ImageError::Reference {
            reference: digest.to_owned(),
            reason: reason.to_string(),
        })?;
        let path = self.root.join("private").join(hex);
        File::create(&path).map_err(self.store_err(&path))?;
        Ok(())
    }

    pub fn is_private(&self, digest: &str) -> bool {
        reference::parse_digest(digest)
            .is_ok_and(|hex| self.root.join("private").join(hex).exists())
    }

    /// The manifest of `reference` for a peer: its digest and bytes (not an image pulled with
    /// credentials: [`ImageStore::mark_private`]).
    pub fn manifest_bytes(&self, reference: &str) -> Result<(String, Vec<u8>), ImageError> {
        let (normal, digest) = self.lookup(reference)?;
        if self.is_private(&digest) {
            return Err(ImageError::NotFound { reference: normal });
        }
        let bytes = self
            .read_blob(&digest, archive::MAX_METADATA_BYTES)
            .map_err(|e| ImageError::Damaged {
                reference: normal,
                what: "manifest",
                digest: digest.clone(),
                reason: e.to_string(),
            })?;
        Ok((digest, bytes))
    }

    /// Up to `max` bytes of blob `digest` from `offset`, and the blob's size.
    pub fn blob_chunk(&self, digest: &str, offset: u64, max: usize) -> io::Result<(Vec<u8>, u64)> {
        use std::io::Seek;
        let hex = reference::parse_digest(digest).map_err(io::Error::other)?;
        let mut file = File::open(self.blob_path(hex))?;
        let total = file.metadata()?.len();
        file.seek(io::SeekFrom::Start(offset.min(total)))?;
        let mut bytes = Vec::new();
        file.take(max as u64).read_to_end(&mut bytes)?;
        Ok((bytes, total))
    }

    /// The bytes of blob `digest`, at most `max`.
    pub fn blob_bytes(&self, digest: &str, max: u64) -> io::Result<Vec<u8>> {
        self.read_blob(digest, max)
    }

    pub fn has_blob(&self, digest: &str) -> bool {
        reference::parse_digest(digest).is_ok_and(|hex| self.blob_path(hex).exists())
    }

    /// A temporary file in the store, for a blob being received.
    pub fn incoming_blob(&self) -> io::Result<tempfile::NamedTempFile> {
        tempfile::NamedTempFile::new_in(self.root.join("tmp"))
    }

    /// Moves a received blob into place if its content hashes to `digest`; refuses it (naming
    /// both digests) otherwise.
    pub fn commit_blob(
        &self,
        digest: &str,
        file: tempfile::NamedTempFile,
    ) -> Result<(), ImageError> {
        let hex = reference::parse_digest(digest).map_err(|reason| ImageError::Reference {
            reference: digest.to_owned(),
            reason: reason.to_string(),
        })?;
        let mut reader = File::open(file.path()).map_err(self.store_err(file.path()))?;
        let mut hash = <sha2::Sha256 as sha2::Digest>::new();
        io::copy(&mut reader, &mut HashWriter(&mut hash)).map_err(self.store_err(file.path()))?;
        let actual = hex::encode(sha2::Digest::finalize(hash));
        if actual != hex {
            return Err(ImageError::Reference {
                reference: digest.to_owned(),
                reason: format!("received blob hashes to sha256:{actual}"),
            });
        }
        file.as_file()
            .sync_all()
            .map_err(self.store_err(file.path()))?;
        let dest = self.blob_path(hex);
        file.persist(&dest).map_err(|e| ImageError::Store {
            path: dest,
            source: e.error,
        })?;
        Ok(())
    }

    /// Refuses an image whose config (blob `config`, in the store) names another platform
    /// than this node's (an image for arm64 pulled by an amd64 node would fail at exec);
    /// a config naming none passes.
    pub fn check_platform(&self, reference: &str, config: &str) -> Result<(), ImageError> {
        let damaged = |reason: String| ImageError::Damaged {
            reference: reference.to_owned(),
            what: "config",
            digest: config.to_owned(),
            reason,
        };
        let bytes = self
            .read_blob(config, archive::MAX_METADATA_BYTES)
            .map_err(|e| damaged(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| damaged(e.to_string()))?;
        let os = value["os"].as_str().unwrap_or_default();
        let arch = value["architecture"].as_str().unwrap_or_default();
        if (os.is_empty() || os == "linux") && (arch.is_empty() || arch == go_arch()) {
            return Ok(());
        }
        Err(ImageError::Platform {
            reference: reference.to_owned(),
            found: format!("{os}/{arch}"),
            arch: go_arch(),
        })
    }

    /// Tags `reference` with a manifest already in the store (after a pull), checking that
    /// every blob it names is present and that it is for this node's platform.
    pub fn tag(&self, reference: &str, digest: &str) -> Result<(), ImageError> {
        let normal = reference::normalize(reference).map_err(|reason| ImageError::Reference {
            reference: reference.to_owned(),
            reason: reason.to_string(),
        })?;
        let _lock = self.lock()?;
        let manifest = self.manifest(digest, &self.root)?;
        self.check_complete(&manifest, &self.root)?;
        self.check_platform(&normal, manifest.config().digest().as_ref())?;
        let mut tags = self.tags()?;
        tags.insert(normal, digest.to_owned());
        self.write_tags(&tags)
    }
}

struct HashWriter<'a>(&'a mut sha2::Sha256);

impl io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        sha2::Digest::update(self.0, buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn size_of(manifest: &ImageManifest) -> u64 {
    manifest.config().size() + manifest.layers().iter().map(|l| l.size()).sum::<u64>()
}

/// The host architecture as OCI/Go names it.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_for_another_platform_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let put = |config: serde_json::Value| {
            let bytes = serde_json::to_vec(&config).unwrap();
            let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes)));
            let mut file = store.incoming_blob().unwrap();
            io::Write::write_all(&mut file, &bytes).unwrap();
            store.commit_blob(&digest, file).unwrap();
            digest
        };
        use sha2::Digest as _;
        let native = put(serde_json::json!({"os": "linux", "architecture": go_arch()}));
        let unnamed = put(serde_json::json!({"config": {}}));
        let foreign = put(serde_json::json!({"os": "linux", "architecture": "s390x"}));
        let windows = put(serde_json::json!({"os": "windows", "architecture": go_arch()}));
        assert!(store.check_platform("a", &native).is_ok());
        assert!(store.check_platform("a", &unnamed).is_ok());
        for (digest, found) in [(foreign, "linux/s390x"), (windows, "windows/")] {
            let err = store
                .check_platform("reg/app:1", &digest)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("reg/app:1") && err.contains(found) && err.contains(go_arch()),
                "{err}"
            );
        }
    }
}

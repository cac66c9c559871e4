//! The kubelet's container start, over any [`ContainerRuntime`]: the pod's volumes made and
//! filled (emptyDir modes, ConfigMap and Secret projections), its sandbox ensured, the
//! container's request built as data ([`container::build`]), the fenced pod's run-lease
//! deadline checked, then one call to the runtime. The image is resolved (or pulled) before.
//! The clock is an input, so the whole path runs against the simulated runtime in tests.

use serde_json::Value;

use super::container::{self, ConfigError};
use super::pod::{self, ContainerPlan, PodPlan, VolumeSource};
use crate::images::ResolvedImage;
use crate::runtime::{ContainerMeta, ContainerRuntime, SandboxSpec};
use std::collections::BTreeMap;

/// A fenced pod's container whose start came after the node's run lease on the pod ended.
pub const RUN_LEASE_ENDED: &str = "RunLeaseEnded";

/// One container start: what the kubelet knows when it decides it.
pub struct Start<'a> {
    pub plan: &'a PodPlan,
    pub container: &'a ContainerPlan,
    pub attempt: u32,
    pub init: bool,
    /// The container's image, present on this node.
    pub image: &'a ResolvedImage,
    pub sandbox: SandboxSpec,
    pub node_name: &'a str,
    pub host_ip: &'a str,
    /// Node policy (`--allow-privileged`).
    pub allow_privileged: bool,
    /// A ConfigMap or Secret (`kind`, name) of the pod's namespace.
    pub lookup: &'a dyn Fn(&str, &str) -> Option<Value>,
    /// A token of the pod's ServiceAccount for a projected `serviceAccountToken`.
    pub token: &'a TokenSource<'a>,
    /// The Services' link variables ([`pod::service_links`]).
    pub service_links: &'a [(String, String)],
    /// When the node's run lease on the (fenced) pod ends, if it holds one (`CLOCK_MONOTONIC`
    /// ms).
    pub fence_deadline_ms: Option<u64>,
    /// The clock of that deadline.
    pub monotonic_ms: &'a dyn Fn() -> u64,
}

/// Where a pod's projected service-account tokens come from (the kubelet's token cache).
pub type TokenSource<'a> = dyn Fn(&PodPlan, &pod::TokenFile) -> Result<String, String> + 'a;

/// The files of a configMap, secret, downwardAPI or projected volume as they are now (`None`
/// for a volume of another kind): what a start writes, and what [`refresh_files`] compares.
pub fn volume_files(
    plan: &PodPlan,
    volume: &pod::Volume,
    lookup: &dyn Fn(&str, &str) -> Option<Value>,
    token: &TokenSource<'_>,
) -> Result<Option<BTreeMap<std::path::PathBuf, Vec<u8>>>, ConfigError> {
    let object = |kind: &str, name: &str, optional: bool, items: Option<&[pod::KeyToPath]>| {
        let data = match lookup(kind, name) {
            Some(object) => container::object_data(kind, &object),
            None if optional => Default::default(),
            // As upstream's volume manager: the pod waits in ContainerCreating (FailedMount)
            // and the mount is tried again at each sync, with no back-off (a namespace's
            // `kube-root-ca.crt` may be a moment behind its first pod).
            None => {
                return Err(ConfigError {
                    reason: super::VOLUMES_PENDING,
                    message: format!(
                        "MountVolume.SetUp failed for volume {:?} : {} {:?} not found",
                        volume.name,
                        kind.to_lowercase(),
                        name
                    ),
                });
            }
        };
        container::projection(&data, items, optional).map_err(|message| ConfigError {
            reason: "CreateContainerConfigError",
            message: format!(
                "volume {}: {} {name:?} {message}",
                volume.name,
                kind.to_lowercase()
            ),
        })
    };
    Ok(Some(match &volume.source {
        VolumeSource::Projected {
            kind,
            name,
            optional,
            items,
        } => object(kind, name, *optional, items.as_deref())?,
        VolumeSource::Files { sources } => {
            let mut files = BTreeMap::new();
            for source in sources {
                match source {
                    pod::FileSource::Object {
                        kind,
                        name,
                        optional,
                        items,
                    } => files.extend(object(kind, name, *optional, items.as_deref())?),
                    pod::FileSource::Downward(items) => {
                        files.extend(container::downward_files(plan, items)?);
                    }
                    pod::FileSource::Token(file) => {
                        let path =
                            crate::beneath::normal_components(std::path::Path::new(&file.path))
                                .filter(|p| p.file_name().is_some())
                                .ok_or_else(|| ConfigError {
                                    reason: "CreateContainerConfigError",
                                    message: format!(
                                        "serviceAccountToken path {:?} names no file",
                                        file.path
                                    ),
                                })?;
                        let token = token(plan, file).map_err(|message| ConfigError {
                            reason: super::VOLUMES_PENDING,
                            message: format!(
                                "MountVolume.SetUp failed for volume {:?} : {message}",
                                volume.name
                            ),
                        })?;
                        files.insert(path, token.into_bytes());
                    }
                }
            }
            files
        }
        _ => return Ok(None),
    }))
}

/// Rewrites the configMap, secret, downwardAPI and projected volumes of a running pod whose
/// content changed since `written` (their last content's hash, by volume name), as the
/// kubelet's periodic sync does: a label added to the pod, a ConfigMap edited, show in its
/// files without a restart.
pub fn refresh_files(
    runtime: &dyn ContainerRuntime,
    plan: &PodPlan,
    lookup: &dyn Fn(&str, &str) -> Option<Value>,
    token: &TokenSource<'_>,
    written: &mut BTreeMap<String, u64>,
) {
    use std::hash::{Hash, Hasher};
    for volume in &plan.volumes {
        let Ok(Some(files)) = volume_files(plan, volume, lookup, token) else {
            continue;
        };
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        files.hash(&mut hasher);
        let hash = hasher.finish();
        if written.get(&volume.name) == Some(&hash) {
            continue;
        }
        let Ok(dir) = runtime.ensure_volume(&plan.uid, &volume.name) else {
            continue;
        };
        match container::project(&dir, &files) {
            Ok(()) => {
                written.insert(volume.name.clone(), hash);
            }
            Err(error) => {
                tracing::warn!(pod = %plan.name, volume = %volume.name, %error, "volume not refreshed");
            }
        }
    }
}

/// Starts `s.container` of `s.plan` on `runtime`; the error says why not, as Kubernetes
/// reports it in `waiting.reason`.
pub fn start(runtime: &dyn ContainerRuntime, s: &Start<'_>) -> Result<(), ConfigError> {
    let (plan, c, name, attempt) = (s.plan, s.container, s.container.name.as_str(), s.attempt);
    // Volumes: emptyDirs live as long as the pod; projected ones are refreshed per start.
    // Every directory and file is made beneath the pod's directory without following a
    // symlink (crate::beneath).
    for volume in &plan.volumes {
        if matches!(
            volume.source,
            VolumeSource::HostPath { .. }
                | VolumeSource::Claim { .. }
                | VolumeSource::Persistent { .. }
        ) {
            // Checked, made and mounted by the runtime, per container mount (a claim is
            // resolved to its volume before the start).
            continue;
        }
        let volume_error = |message: String| ConfigError {
            reason: "CreateContainerError",
            message: format!("volume {}: {message}", volume.name),
        };
        let dir = match volume.source {
            VolumeSource::EmptyDir {
                memory: true,
                size_limit,
            } => {
                // A tmpfs of the sizeLimit, at most the pod's memory limit (upstream's
                // SizeMemoryBackedVolumes); with neither, the kernel's default.
                let pod_limit = plan
                    .containers
                    .iter()
                    .map(|c| c.memory_limit_bytes)
                    .try_fold(0u64, |sum, l| Some(sum.saturating_add(l?)));
                let size = match (size_limit, pod_limit) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                runtime.ensure_memory_volume(&plan.uid, &volume.name, size)
            }
            _ => runtime.ensure_volume(&plan.uid, &volume.name),
        }
        .map_err(|e| volume_error(e.to_string()))?;
        if matches!(volume.source, VolumeSource::EmptyDir { .. }) {
            // World-writable like Kubernetes' emptyDir; with fsGroup, owned by that group
            // with the set-group-id bit so new files inherit it.
            let mode = if plan.fs_group.is_some() {
                0o2777
            } else {
                0o777
            };
            let gid = plan.fs_group.map(nix::unistd::Gid::from_raw);
            nix::unistd::fchown(dir.fd(), None, gid)
                .and_then(|()| {
                    nix::sys::stat::fchmod(dir.fd(), nix::sys::stat::Mode::from_bits_truncate(mode))
                })
                .map_err(|e| volume_error(e.to_string()))?;
        }
        if let Some(files) = volume_files(plan, volume, s.lookup, s.token)? {
            container::project(&dir, &files).map_err(|e| volume_error(e.to_string()))?;
        }
    }
    let runtime_id = format!("{}-{name}-{attempt}", plan.uid);
    // The sandbox (and so the pod's address) comes first: the downward API shows it.
    runtime
        .ensure_sandbox(&s.sandbox)
        .map_err(|e| ConfigError {
            reason: "RunContainerError",
            message: e.to_string(),
        })?;
    let pod_ip = if plan.host_network {
        s.host_ip.to_owned()
    } else {
        runtime
            .pod_network(&plan.uid)
            .map(|n| n.ip.to_string())
            .unwrap_or_default()
    };
    let ctx = container::Context {
        runtime_id: runtime_id.clone(),
        node_name: s.node_name,
        host_ip: s.host_ip,
        pod_ip: &pod_ip,
        log_path: runtime.log_path(&plan.uid, name, attempt),
        lookup: s.lookup,
        service_links: s.service_links,
        allow_privileged: s.allow_privileged,
        fence_deadline_ms: s.fence_deadline_ms,
    };
    let request = container::build(plan, c, s.image, &ctx)?;
    let meta = ContainerMeta {
        name: name.to_owned(),
        attempt,
        init: s.init,
        image: s.image.reference.clone(),
        image_digest: s.image.digest.clone(),
        cgroup_path: runtime.container_cgroup(&plan.uid, &runtime_id),
        runtime_id,
    };
    // The pass that decided this start may have taken longer than the run lease had left
    // (the sandbox, volumes and images above, a loaded host): a fenced container must not
    // start after it. Its shim checks once more, as late as it can, and kills it at the
    // deadline unless a renewal moves it (`runtime::lease`).
    if let Some(deadline) = request.fence_deadline_ms {
        let now = (s.monotonic_ms)();
        if now >= deadline {
            return Err(ConfigError {
                reason: RUN_LEASE_ENDED,
                message: format!(
                    "{name}: the node's run lease on this fenced pod ended {} ms before the container could start; it starts once the lease is held again",
                    now - deadline
                ),
            });
        }
    }
    runtime
        .start_container(&plan.uid, &meta, &request)
        .map_err(|e| ConfigError {
            reason: if e.is_config_error() {
                "CreateContainerConfigError"
            } else {
                "RunContainerError"
            },
            message: e.to_string(),
        })
}

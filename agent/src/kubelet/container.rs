//! Turning a container of a pod into a [`ContainerRequest`] for the runtime: command and args
//! over the image's entrypoint and cmd, the environment (image, `env`, `envFrom`, downward API,
//! ConfigMap and Secret keys, `$(VAR)` expansion), user, capabilities, limits and mounts.
//! Pure but for the object lookups passed in.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine;
use serde_json::Value;

use super::pod::{ContainerPlan, EnvSource, PodPlan, VolumeSource};
use crate::images::ResolvedImage;
use crate::runtime::spec::{
    ContainerRequest, DEFAULT_CAPABILITIES, Limits, Mount, MountSource, Seccomp,
};
use shoal_model::environment::{Environment, TooLarge};

/// Why a container cannot be created, as Kubernetes reports it in `waiting.reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub reason: &'static str,
    pub message: String,
}

fn config_error(message: String) -> ConfigError {
    ConfigError {
        reason: "CreateContainerConfigError",
        message,
    }
}

/// What a request needs besides the pod and the image.
pub struct Context<'a> {
    pub runtime_id: String,
    pub node_name: &'a str,
    pub host_ip: &'a str,
    pub pod_ip: &'a str,
    pub log_path: PathBuf,
    /// A ConfigMap or Secret (`kind`, name) of the pod's namespace.
    pub lookup: &'a dyn Fn(&str, &str) -> Option<Value>,
    /// The Services' link variables ([`super::pod::service_links`]).
    pub service_links: &'a [(String, String)],
    /// Node policy (`--allow-privileged`): capabilities beyond the default set, hostPID and
    /// hostIPC.
    pub allow_privileged: bool,
    /// When the node's run lease on the pod ends, if it holds one (`CLOCK_MONOTONIC` ms): a
    /// fenced pod's container starts only with it.
    pub fence_deadline_ms: Option<u64>,
}

/// Kubernetes' safe sysctls: namespaced, and isolated from other pods and the node.
pub const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_syncookies",
];

fn refused(message: String) -> ConfigError {
    config_error(format!("{message}: refused by this node's policy"))
}

/// The string data of a ConfigMap (`data`) or Secret (`data`, base64; `stringData`).
pub fn object_data(kind: &str, object: &Value) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    if let Some(map) = object["data"].as_object() {
        for (k, v) in map {
            let Some(text) = v.as_str() else { continue };
            let bytes = if kind == "Secret" {
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .unwrap_or_else(|_| text.as_bytes().to_vec())
            } else {
                text.as_bytes().to_vec()
            };
            out.insert(k.clone(), bytes);
        }
    }
    for field in ["stringData", "binaryData"] {
        if let Some(map) = object[field].as_object() {
            for (k, v) in map {
                if let Some(text) = v.as_str() {
                    let bytes = if field == "binaryData" {
                        base64::engine::general_purpose::STANDARD
                            .decode(text)
                            .unwrap_or_default()
                    } else {
                        text.as_bytes().to_vec()
                    };
                    out.insert(k.clone(), bytes);
                }
            }
        }
    }
    out
}

fn field_value(plan: &PodPlan, path: &str, ctx: &Context) -> Result<String, ConfigError> {
    let indexed = |prefix: &str, map: &BTreeMap<String, String>| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(|k| map.get(k).cloned().unwrap_or_default())
    };
    if let Some(v) = indexed("metadata.labels['", &plan.labels) {
        return Ok(v);
    }
    if let Some(v) = indexed("metadata.annotations['", &plan.annotations) {
        return Ok(v);
    }
    Ok(match path {
        "metadata.name" => plan.name.clone(),
        "metadata.namespace" => plan.namespace.clone(),
        "metadata.uid" => plan.uid.clone(),
        "spec.nodeName" => ctx.node_name.to_owned(),
        "spec.serviceAccountName" => "default".to_owned(),
        "status.hostIP" => ctx.host_ip.to_owned(),
        "status.podIP" => ctx.pod_ip.to_owned(),
        other => {
            return Err(config_error(format!(
                "fieldRef: unsupported fieldPath {other:?}"
            )));
        }
    })
}

fn resource_value(
    plan: &PodPlan,
    this: &ContainerPlan,
    container: &str,
    resource: &str,
    divisor: &str,
) -> Result<String, ConfigError> {
    let c = if container.is_empty() {
        this
    } else {
        plan.containers
            .iter()
            .chain(&plan.init_containers)
            .find(|c| c.name == container)
            .ok_or_else(|| config_error(format!("resourceFieldRef: no container {container:?}")))?
    };
    let bad = |e: shoal_model::quantity::QuantityError| {
        config_error(format!("resourceFieldRef.divisor: {e}"))
    };
    Ok(match resource {
        "requests.cpu" | "limits.cpu" => {
            let millis = if resource == "limits.cpu" {
                c.cpu_limit_millis
            } else {
                c.cpu_request_millis
            }
            .unwrap_or(0);
            let div = shoal_model::quantity::cpu_millis(divisor)
                .map_err(bad)?
                .max(1);
            millis.div_ceil(div).to_string()
        }
        "requests.memory" | "limits.memory" => {
            let bytes = if resource == "limits.memory" {
                c.memory_limit_bytes
            } else {
                c.memory_request_bytes
            }
            .unwrap_or(0);
            let div = shoal_model::quantity::bytes(divisor).map_err(bad)?.max(1);
            bytes.div_ceil(div).to_string()
        }
        other => {
            return Err(config_error(format!(
                "resourceFieldRef: unsupported resource {other:?}"
            )));
        }
    })
}

/// `uid[:gid]` or a user name looked up in the image's /etc/passwd.
fn image_user(user: &str, image: &ResolvedImage) -> Result<(u32, u32), ConfigError> {
    let (name, group) = user.split_once(':').unwrap_or((user, ""));
    // Read inside each layer as the container would see it: a symlinked /etc/passwd never
    // reaches a host file, and a FIFO or device there is refused, never opened for reading
    // (it would block the kubelet, or open a host device).
    let read_in_layer = |layer: &std::path::Path| -> Result<Option<String>, ConfigError> {
        use crate::beneath::{Resolve, Root};
        let Ok(root) = Root::open(layer) else {
            return Ok(None);
        };
        match root.read_regular(std::path::Path::new("etc/passwd"), 1 << 20, Resolve::InRoot) {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Err(config_error(format!(
                "image {}: /etc/passwd is not a regular file",
                image.reference
            ))),
            Err(_) => Ok(None),
        }
    };
    let passwd = || -> Result<String, ConfigError> {
        for layer in image.layers.iter().rev() {
            if let Some(text) = read_in_layer(layer)? {
                return Ok(text);
            }
        }
        Ok(String::new())
    };
    let uid_gid = match name.parse::<u32>() {
        Ok(uid) => (uid, uid),
        Err(_) => passwd()?
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() > 3 && f[0] == name)
            .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .ok_or_else(|| {
                config_error(format!(
                    "image user {name:?} is not in the image's /etc/passwd"
                ))
            })?,
    };
    let gid = if group.is_empty() {
        uid_gid.1
    } else {
        group
            .parse()
            .map_err(|_| config_error(format!("image group {group:?} must be numeric")))?
    };
    Ok((uid_gid.0, gid))
}

/// Why a configMap or secret volume's `items` cannot be projected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProjectionError {
    #[error("items path {path:?} {reason}")]
    Path {
        path: String,
        reason: shoal_state::labels::SyntaxError,
    },
    #[error("items path {0:?} names no file")]
    NoFile(String),
    #[error("references non-existent key {0:?}")]
    NoKey(String),
}

/// The files a configMap or secret volume holds: every key under its own name, or with
/// `items` only the keys listed, at their paths (an absent key is an error unless optional).
pub fn projection(
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[super::pod::KeyToPath]>,
    optional: bool,
) -> Result<BTreeMap<PathBuf, Vec<u8>>, ProjectionError> {
    let mut files = BTreeMap::new();
    match items {
        None => {
            for (key, bytes) in data {
                // Keys were validated by the API; one that is not a plain name is skipped.
                if shoal_state::labels::check_config_key(key).is_ok() {
                    files.insert(PathBuf::from(key), bytes.clone());
                }
            }
        }
        Some(items) => {
            for item in items {
                shoal_state::labels::check_descending_path(&item.path, true).map_err(|reason| {
                    ProjectionError::Path {
                        path: item.path.clone(),
                        reason,
                    }
                })?;
                let path = crate::beneath::normal_components(std::path::Path::new(&item.path))
                    .filter(|p| p.file_name().is_some())
                    .ok_or_else(|| ProjectionError::NoFile(item.path.clone()))?;
                match data.get(&item.key) {
                    Some(bytes) => {
                        files.insert(path, bytes.clone());
                    }
                    None if optional => {}
                    None => return Err(ProjectionError::NoKey(item.key.clone())),
                }
            }
        }
    }
    Ok(files)
}

/// A label or annotation map as the kubelet writes it in a downwardAPI file: `key="value"`
/// lines, sorted by key.
fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The files of a `downwardAPI` source: each item's path (checked to descend) holding the
/// pod's field or a container's resource.
pub fn downward_files(
    plan: &PodPlan,
    items: &[super::pod::DownwardFile],
) -> Result<BTreeMap<PathBuf, Vec<u8>>, ConfigError> {
    use super::pod::DownwardValue;
    let mut files = BTreeMap::new();
    for item in items {
        shoal_state::labels::check_descending_path(&item.path, true)
            .map_err(|reason| config_error(format!("downwardAPI path {:?} {reason}", item.path)))?;
        let path = crate::beneath::normal_components(std::path::Path::new(&item.path))
            .filter(|p| p.file_name().is_some())
            .ok_or_else(|| {
                config_error(format!("downwardAPI path {:?} names no file", item.path))
            })?;
        let value = match &item.value {
            DownwardValue::Field(field) if field == "metadata.labels" => format_map(&plan.labels),
            DownwardValue::Field(field) if field == "metadata.annotations" => {
                format_map(&plan.annotations)
            }
            DownwardValue::Field(field) => {
                let indexed = |prefix: &str, map: &BTreeMap<String, String>| {
                    field
                        .strip_prefix(prefix)
                        .and_then(|r| r.strip_suffix("']"))
                        .map(|k| map.get(k).cloned().unwrap_or_default())
                };
                match field.as_str() {
                    "metadata.name" => plan.name.clone(),
                    "metadata.namespace" => plan.namespace.clone(),
                    "metadata.uid" => plan.uid.clone(),
                    _ => indexed("metadata.labels['", &plan.labels)
                        .or_else(|| indexed("metadata.annotations['", &plan.annotations))
                        .ok_or_else(|| {
                            config_error(format!("downwardAPI: unsupported fieldPath {field:?}"))
                        })?,
                }
            }
            DownwardValue::Resource {
                container,
                resource,
                divisor,
            } => {
                let first = plan.containers.first().ok_or_else(|| {
                    config_error("downwardAPI resourceFieldRef: the pod has no container".into())
                })?;
                resource_value(plan, first, container, resource, divisor)?
            }
        };
        files.insert(path, value.into_bytes());
    }
    Ok(files)
}

/// Writes `files` into the volume directory `dir` (replacing what was there), every path
/// resolved beneath it without following a symlink.
pub fn project(
    dir: &crate::beneath::Root,
    files: &BTreeMap<PathBuf, Vec<u8>>,
) -> std::io::Result<()> {
    use crate::beneath::Resolve;
    let tops: std::collections::BTreeSet<&std::ffi::OsStr> = files
        .keys()
        .filter_map(|p| p.components().next())
        .map(|c| c.as_os_str())
        .collect();
    for name in dir.names()? {
        if !tops.contains(name.as_os_str()) {
            dir.remove_all(&name)?;
        }
    }
    for (path, bytes) in files {
        let parent = path.parent().unwrap_or(std::path::Path::new(""));
        let name = path
            .file_name()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
        dir.create_dir_all(parent, 0o755, Resolve::Beneath)?
            .write_file(name, bytes, 0o644)?;
    }
    Ok(())
}

/// The runtime request of container `c` of `plan`.
pub fn build(
    plan: &PodPlan,
    c: &ContainerPlan,
    image: &ResolvedImage,
    ctx: &Context,
) -> Result<ContainerRequest, ConfigError> {
    if c.privileged && !ctx.allow_privileged {
        return Err(refused(format!(
            "container {:?} is privileged (securityContext.privileged; start the node with --allow-privileged)",
            c.name
        )));
    }
    if !ctx.allow_privileged && (plan.host_pid || plan.host_ipc || plan.host_network) {
        return Err(refused(
            "hostPID/hostIPC/hostNetwork share the node's namespaces (start the node with --allow-privileged)"
                .into(),
        ));
    }
    if c.proc_mount.as_deref().is_some_and(|m| m != "Default") {
        return Err(refused(format!(
            "container {:?}: procMount {:?} needs user namespaces (hostUsers: false), which this node does not offer",
            c.name,
            c.proc_mount.as_deref().unwrap_or_default()
        )));
    }
    for name in plan.sysctls.keys() {
        if !SAFE_SYSCTLS.contains(&name.as_str()) {
            return Err(refused(format!(
                "sysctl {name:?} is not in the safe set ({})",
                SAFE_SYSCTLS.join(", ")
            )));
        }
    }
    // Environment: the image's, then envFrom, then env (later wins), with $(VAR) expansion
    // against what is defined before; every value bounded as it is made (`environment`).
    let too_large = |what: String, e: TooLarge| {
        config_error(format!("container {:?}: {what} {}", c.name, e.reason()))
    };
    let mut env = Environment::new();
    for entry in &image.env {
        if let Some((k, v)) = entry.split_once('=') {
            env.set(k.to_owned(), v.to_owned())
                .map_err(|e| too_large(format!("image variable {k}"), e))?;
        }
    }
    if !env.contains("PATH") {
        env.set(
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        )
        .map_err(|e| too_large("PATH".into(), e))?;
    }
    env.set("HOSTNAME".into(), plan.hostname.clone())
        .map_err(|e| too_large("HOSTNAME".into(), e))?;
    for (k, v) in ctx.service_links {
        env.set(k.clone(), v.clone())
            .map_err(|e| too_large(format!("service variable {k}"), e))?;
    }
    for from in &c.env_from {
        match (ctx.lookup)(from.kind, &from.name) {
            Some(object) => {
                for (k, v) in object_data(from.kind, &object) {
                    let name = format!("{}{k}", from.prefix);
                    env.set(name.clone(), String::from_utf8_lossy(&v).into_owned())
                        .map_err(|e| too_large(format!("variable {name} (envFrom)"), e))?;
                }
            }
            None if from.optional => {}
            None => {
                return Err(config_error(format!(
                    "{} {:?} not found",
                    from.kind.to_lowercase(),
                    from.name
                )));
            }
        }
    }
    for (key, source) in &c.env {
        let value = match source {
            EnvSource::Value(v) => env
                .expand(v)
                .map_err(|e| too_large(format!("variable {key}"), e))?,
            EnvSource::Field(path) => field_value(plan, path, ctx)?,
            EnvSource::Resource {
                container,
                resource,
                divisor,
            } => resource_value(plan, c, container, resource, divisor)?,
            EnvSource::Key {
                kind,
                name,
                key: data_key,
                optional,
            } => {
                let found = (ctx.lookup)(kind, name)
                    .map(|o| object_data(kind, &o))
                    .and_then(|d| d.get(data_key).cloned());
                match found {
                    Some(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    None if *optional => continue,
                    None => {
                        return Err(config_error(format!(
                            "couldn't find key {data_key} in {} {}/{name}",
                            kind, plan.namespace
                        )));
                    }
                }
            }
        };
        env.set(key.clone(), value)
            .map_err(|e| too_large(format!("variable {key}"), e))?;
    }
    let mut expand_all = |field: &str, list: &[String]| -> Result<Vec<String>, ConfigError> {
        list.iter()
            .enumerate()
            .map(|(i, a)| {
                let what = || format!("{field}[{i}]");
                let arg = env.expand(a).map_err(|e| too_large(what(), e))?;
                env.count_argument(arg.len())
                    .map_err(|e| too_large(what(), e))?;
                Ok(arg)
            })
            .collect()
    };
    let args: Vec<String> = match (&c.command, &c.args) {
        (Some(command), args) => {
            let mut all = expand_all("command", command)?;
            all.extend(expand_all("args", args.as_deref().unwrap_or_default())?);
            all
        }
        (None, Some(args)) => {
            let mut all = image.entrypoint.clone();
            all.extend(expand_all("args", args)?);
            all
        }
        (None, None) => image.entrypoint.iter().chain(&image.cmd).cloned().collect(),
    };
    // `subPathExpr`s, expanded with the container's variables as its command is.
    let sub_paths: Vec<Option<String>> = c
        .volume_mounts
        .iter()
        .enumerate()
        .map(|(i, m)| match &m.sub_path_expr {
            Some(expr) => env
                .expand(expr)
                .map(Some)
                .map_err(|e| too_large(format!("volumeMounts[{i}].subPathExpr"), e)),
            None => Ok(m.sub_path.clone()),
        })
        .collect::<Result<_, _>>()?;
    let env = env.to_lines();
    if args.is_empty() {
        return Err(config_error(format!(
            "container {:?}: no command given and image {} has none",
            c.name, image.reference
        )));
    }
    let (mut uid, mut gid) = match &image.user {
        Some(user) => image_user(user, image)?,
        None => (0, 0),
    };
    if let Some(u) = c.run_as_user {
        uid = u;
        if c.run_as_group.is_none() && image.user.is_none() {
            gid = 0;
        }
    }
    if let Some(g) = c.run_as_group {
        gid = g;
    }
    let normalize = |cap: &str| {
        let cap = cap.to_ascii_uppercase();
        if cap.starts_with("CAP_") {
            cap
        } else {
            format!("CAP_{cap}")
        }
    };
    let drop_all = c
        .capabilities_drop
        .iter()
        .any(|d| d.eq_ignore_ascii_case("ALL"));
    let dropped: Vec<String> = c.capabilities_drop.iter().map(|d| normalize(d)).collect();
    let mut capabilities: Vec<String> = if c.privileged {
        crate::runtime::spec::bounding_capabilities()
    } else if drop_all {
        Vec::new()
    } else {
        DEFAULT_CAPABILITIES
            .iter()
            .map(|c| c.to_string())
            .filter(|c| !dropped.contains(c))
            .collect()
    };
    for add in &c.capabilities_add {
        let cap = normalize(add);
        if !DEFAULT_CAPABILITIES.contains(&cap.as_str()) && !ctx.allow_privileged {
            return Err(refused(format!(
                "container {:?} adds {cap}, beyond the default capability set (start the node with --allow-privileged)",
                c.name
            )));
        }
        if !capabilities.contains(&cap) {
            capabilities.push(cap);
        }
    }
    if c.run_as_non_root && uid == 0 {
        return Err(config_error(format!(
            "container {:?} has runAsNonRoot and image will run as root (pod: \"{}_{}({})\", container: {})",
            c.name, plan.name, plan.namespace, plan.uid, c.name
        )));
    }
    let seccomp = match &c.seccomp {
        // A privileged container runs unfiltered, as with containerd.
        _ if c.privileged => Seccomp::Unconfined,
        super::pod::SeccompChoice::RuntimeDefault => Seccomp::RuntimeDefault,
        super::pod::SeccompChoice::Unconfined => Seccomp::Unconfined,
        // Read by the runtime beneath the node's profile directory.
        super::pod::SeccompChoice::Localhost(path) => Seccomp::Localhost(path.clone()),
    };
    let mut additional_gids = plan.supplemental_groups.clone();
    if let Some(g) = plan.fs_group
        && !additional_gids.contains(&g)
    {
        additional_gids.push(g);
    }
    const PERIOD_US: u64 = 100_000;
    let limits = Limits {
        memory_bytes: c
            .memory_limit_bytes
            .map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
        // Kubernetes' shares: 1024 per cpu of request, between 2 and the kernel's 262144.
        cpu_shares: c
            .cpu_request_millis
            .map_or(2, |m| (m.saturating_mul(1024) / 1000).clamp(2, 262_144)),
        cpu_quota_us: c.cpu_limit_millis.map(|m| {
            i64::try_from((m.saturating_mul(PERIOD_US) / 1000).max(1000)).unwrap_or(i64::MAX)
        }),
        cpu_period_us: PERIOD_US,
        pids: None,
    };
    let sandbox_file = |name: &'static str| Mount {
        source: MountSource::SandboxFile(name),
        destination: format!("/etc/{name}"),
        readonly: false,
        recursive_readonly: false,
        field: format!("{}: /etc/{name}", c.name),
    };
    let mut mounts = vec![
        sandbox_file("hosts"),
        sandbox_file("hostname"),
        sandbox_file("resolv.conf"),
    ];
    for (i, m) in c.volume_mounts.iter().enumerate() {
        let field = format!("{}.volumeMounts[{i}]", c.name);
        let volume = plan
            .volumes
            .iter()
            .find(|v| v.name == m.name)
            .ok_or_else(|| {
                config_error(format!(
                    "{field}.name: no volume {:?} in spec.volumes",
                    m.name
                ))
            })?;
        if !m.mount_path.starts_with('/') {
            return Err(config_error(format!(
                "{field}.mountPath: {:?} must be an absolute path",
                m.mount_path
            )));
        }
        let sub_path = &sub_paths[i];
        if let Some(sub) = sub_path {
            let which = if m.sub_path_expr.is_some() {
                "subPathExpr"
            } else {
                "subPath"
            };
            shoal_state::labels::check_descending_path(sub, false)
                .map_err(|reason| config_error(format!("{field}.{which}: {sub:?} {reason}")))?;
        }
        let (source, readonly, recursive_readonly) = match &volume.source {
            // A read-only host directory is read-only in its submounts too.
            VolumeSource::HostPath {
                path,
                kind,
                read_only,
            } => (
                MountSource::HostPath {
                    path: path.clone(),
                    kind: *kind,
                    sub_path: sub_path.clone(),
                },
                m.read_only || *read_only,
                m.read_only || *read_only,
            ),
            VolumeSource::Persistent { volume, read_only } => (
                MountSource::Persistent {
                    volume: volume.clone(),
                    sub_path: sub_path.clone(),
                },
                m.read_only || *read_only,
                false,
            ),
            VolumeSource::Claim { claim, .. } => {
                return Err(config_error(format!(
                    "{field}: persistentvolumeclaim {claim:?} is not resolved to a volume"
                )));
            }
            other => (
                MountSource::Volume {
                    volume: volume.name.clone(),
                    sub_path: sub_path.clone(),
                },
                m.read_only
                    || matches!(
                        other,
                        VolumeSource::Projected { .. } | VolumeSource::Files { .. }
                    ),
                false,
            ),
        };
        mounts.push(Mount {
            source,
            destination: m.mount_path.clone(),
            readonly,
            recursive_readonly,
            field,
        });
    }
    // The termination message file, unless a volume is mounted there already.
    if !c
        .volume_mounts
        .iter()
        .any(|m| m.mount_path.trim_end_matches('/') == c.termination_message_path)
    {
        mounts.push(Mount {
            source: MountSource::TerminationLog,
            destination: c.termination_message_path.clone(),
            readonly: false,
            recursive_readonly: false,
            field: format!("{}.terminationMessagePath", c.name),
        });
    }
    let fenced = shoal_core::placement::partition::Policy::parse(
        plan.annotations
            .get(shoal_core::placement::partition::ANNOTATION)
            .map(String::as_str),
    ) == shoal_core::placement::partition::Policy::Fenced;
    let fence_deadline_ms = match (fenced, ctx.fence_deadline_ms) {
        (false, _) => None,
        (true, Some(deadline)) => Some(deadline),
        (true, None) => {
            return Err(config_error(format!(
                "{}: a fenced pod's container starts only while its node holds the pod's run lease",
                c.name
            )));
        }
    };
    Ok(ContainerRequest {
        id: ctx.runtime_id.clone(),
        hostname: plan.hostname.clone(),
        args,
        env,
        working_dir: c
            .working_dir
            .clone()
            .or_else(|| image.working_dir.clone())
            .unwrap_or_else(|| "/".into()),
        uid,
        gid,
        readonly_rootfs: c.read_only_root_filesystem,
        no_new_privileges: !c.allow_privilege_escalation && !c.privileged,
        capabilities,
        limits,
        mounts,
        layers: image.layers.clone(),
        log_path: ctx.log_path.clone(),
        seccomp,
        additional_gids,
        sysctls: plan.sysctls.clone(),
        host_pid: plan.host_pid,
        host_ipc: plan.host_ipc,
        host_network: plan.host_network,
        privileged: c.privileged,
        fence_deadline_ms,
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        termination_message_from_logs: c.termination_message_from_logs,
        tty: c.tty,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::runtime::HostPathType;

    fn image() -> ResolvedImage {
        ResolvedImage {
            reference: "shoal.local/busybox:1".into(),
            digest: "sha256:x".into(),
            entrypoint: vec![],
            cmd: vec!["sh".into()],
            env: vec!["PATH=/bin".into(), "FROM_IMAGE=1".into()],
            working_dir: None,
            user: None,
            layers: vec![],
        }
    }

    fn request(
        spec: Value,
        lookup: &dyn Fn(&str, &str) -> Option<Value>,
    ) -> Result<ContainerRequest, ConfigError> {
        let pod = json!({"metadata": {"name": "web-1", "namespace": "prod", "uid": "u1", "labels": {"app": "web"}}, "spec": spec});
        request_of(&pod, lookup, None)
    }

    fn request_of(
        pod: &Value,
        lookup: &dyn Fn(&str, &str) -> Option<Value>,
        fence_deadline_ms: Option<u64>,
    ) -> Result<ContainerRequest, ConfigError> {
        let plan = PodPlan::parse(pod).unwrap();
        let ctx = Context {
            runtime_id: "u1-app-0".into(),
            node_name: "n1",
            host_ip: "10.0.0.1",
            pod_ip: "",
            log_path: "/log".into(),
            lookup,
            service_links: &[],
            allow_privileged: false,
            fence_deadline_ms,
        };
        build(&plan, &plan.containers[0], &image(), &ctx)
    }

    /// Mounts are data the runtime resolves: a subPath (opened beneath its volume by the
    /// runtime) and a read-only hostPath, read-only in its submounts too.
    #[test]
    fn mounts_name_their_sources_and_fields() {
        let none = |_: &str, _: &str| None;
        let r = request(
            json!({"containers": [{"name": "app", "image": "b",
                "volumeMounts": [{"name": "data", "mountPath": "/logs", "subPath": "logs/app"},
                                 {"name": "host", "mountPath": "/host", "readOnly": true}]}],
                "volumes": [{"name": "data", "emptyDir": {}},
                            {"name": "host", "hostPath": {"path": "/srv/x", "type": "Directory"}}]}),
            &none,
        )
        .unwrap();
        assert_eq!(
            r.mounts[3].source,
            MountSource::Volume {
                volume: "data".into(),
                sub_path: Some("logs/app".into())
            }
        );
        assert_eq!(
            r.mounts[4].source,
            MountSource::HostPath {
                path: "/srv/x".into(),
                kind: HostPathType::Directory,
                sub_path: None
            }
        );
        assert!(r.mounts[4].readonly && r.mounts[4].recursive_readonly);
        assert_eq!(r.mounts[4].field, "app.volumeMounts[1]");
        // A static volume through a read-only claim: read-only whatever the mount says.
        let pod = json!({"metadata": {"name": "web-1", "namespace": "prod", "uid": "u1"},
            "spec": {"containers": [{"name": "app", "image": "b",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c", "readOnly": true}}]}});
        let mut plan = PodPlan::parse(&pod).unwrap();
        plan.volumes[0].source = VolumeSource::HostPath {
            path: "/srv/static".into(),
            kind: HostPathType::Unchecked,
            read_only: true,
        };
        let ctx = Context {
            runtime_id: "u1-app-0".into(),
            node_name: "n1",
            host_ip: "10.0.0.1",
            pod_ip: "",
            log_path: "/log".into(),
            lookup: &none,
            service_links: &[],
            allow_privileged: false,
            fence_deadline_ms: None,
        };
        let r = build(&plan, &plan.containers[0], &image(), &ctx).unwrap();
        assert!(r.mounts[3].readonly && r.mounts[3].recursive_readonly);
        // subPathExpr: the container's variables expanded, the result checked as a subPath.
        let spec = |expr: &str| {
            json!({"containers": [{"name": "app", "image": "b",
                "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "UP", "value": ".."}],
                "volumeMounts": [{"name": "data", "mountPath": "/logs", "subPathExpr": expr}]}],
                "volumes": [{"name": "data", "emptyDir": {}}]})
        };
        let r = request(spec("logs/$(POD)"), &none).unwrap();
        assert_eq!(
            r.mounts[3].source,
            MountSource::Volume {
                volume: "data".into(),
                sub_path: Some("logs/web-1".into())
            }
        );
        let err = request(spec("$(UP)/$(UP)/etc"), &none).unwrap_err();
        assert!(
            err.message.contains("app.volumeMounts[0].subPathExpr"),
            "{err:?}"
        );
    }

    /// A fenced pod's container carries the end of the run lease its start was decided under
    /// (its shim holds it to that); without a lease it is not built at all. An unfenced pod's
    /// carries none, whatever the node holds.
    #[test]
    fn a_fenced_container_starts_only_with_its_run_lease_deadline() {
        let pod = |policy: &str| {
            json!({"metadata": {"name": "db", "namespace": "prod", "uid": "u1",
                    "annotations": {"shoal.io/partition-policy": policy}},
                   "spec": {"containers": [{"name": "app", "image": "b"}]}})
        };
        let none = |_: &str, _: &str| None;
        let fenced = request_of(&pod("fenced"), &none, Some(12_345)).unwrap();
        assert_eq!(fenced.fence_deadline_ms, Some(12_345));
        let e = request_of(&pod("fenced"), &none, None).unwrap_err();
        assert!(e.message.contains("run lease"), "{}", e.message);
        let free = request_of(&pod("available"), &none, Some(12_345)).unwrap();
        assert_eq!(free.fence_deadline_ms, None);
    }

    /// What the API cannot compute (a ConfigMap's value doubled by `$(VAR)`) the kubelet
    /// bounds, naming the variable (issue #35, item 2).
    #[test]
    fn expansion_past_the_bound_is_a_config_error_naming_the_variable() {
        let big = "x".repeat(100_000);
        let lookup = |kind: &str, name: &str| {
            (kind == "ConfigMap" && name == "cfg").then(|| json!({"data": {"k": big}}))
        };
        let e = request(
            json!({"containers": [{"name": "app", "image": "b",
                "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}},
                        {"name": "TWICE", "value": "$(K)$(K)"}]}]}),
            &lookup,
        )
        .unwrap_err();
        assert_eq!(e.reason, "CreateContainerConfigError");
        assert!(e.message.contains("variable TWICE"), "{}", e.message);
        // Eleven arguments of 100 KB pass each bound alone, not together.
        let e = request(
            json!({"containers": [{"name": "app", "image": "b", "command": vec!["$(K)"; 11],
                "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}]}]}),
            &lookup,
        )
        .unwrap_err();
        assert!(e.message.contains("command[9]"), "{}", e.message);
    }

    /// An image whose /etc/passwd is a FIFO (or a device node) is refused without opening it
    /// for a blocking read: once, that open blocked the kubelet thread forever (issue #35,
    /// item 5).
    #[test]
    fn an_image_passwd_that_is_not_a_regular_file_is_refused_unread() {
        let layer = tempfile::tempdir().unwrap();
        std::fs::create_dir(layer.path().join("etc")).unwrap();
        nix::unistd::mkfifo(
            &layer.path().join("etc/passwd"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let mut image = image();
        image.user = Some("nobody".into());
        image.layers = vec![layer.path().to_owned()];
        let e = image_user("nobody", &image).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{}", e.message);
        // A numeric user needs no lookup.
        assert_eq!(image_user("1000:1000", &image).unwrap(), (1000, 1000));
    }

    #[test]
    fn environment_downward_api_and_config_maps() {
        let lookup = |kind: &str, name: &str| match (kind, name) {
            ("ConfigMap", "cfg") => Some(json!({"data": {"mode": "fast", "level": "3"}})),
            ("Secret", "s") => Some(json!({"data": {"password": "aHVudGVyMg=="}})),
            _ => None,
        };
        let r = request(
            json!({"nodeName": "n1", "containers": [{"name": "app", "image": "b",
                "command": ["sh", "-c"], "args": ["echo $(GREETING) $$HOME"],
                "resources": {"limits": {"memory": "64Mi", "cpu": "250m"}},
                "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
                "env": [
                    {"name": "GREETING", "value": "hi-$(POD_NAME)"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
                ]}]}),
            &lookup,
        )
        .unwrap();
        let env = r.env.join(" ");
        for want in [
            "FROM_IMAGE=1",
            "CFG_mode=fast",
            "POD_NAME=web-1",
            "APP=web",
            "NODE=n1",
            "MEM_MI=64",
            "PASSWORD=hunter2",
            "HOSTNAME=web-1",
        ] {
            assert!(r.env.iter().any(|e| e == want), "{want} missing from {env}");
        }
        // $(POD_NAME) was not yet defined when GREETING was: left as written, like Kubernetes.
        assert!(
            r.env.contains(&"GREETING=hi-$(POD_NAME)".to_owned()),
            "{env}"
        );
        assert_eq!(r.args, ["sh", "-c", "echo hi-$(POD_NAME) $HOME"]);
        assert_eq!(r.limits.memory_bytes, Some(64 << 20));
        assert_eq!(r.limits.cpu_quota_us, Some(25_000));
        assert_eq!(r.limits.cpu_shares, 256);
    }

    #[test]
    fn missing_references_are_config_errors_naming_them() {
        let none = |_: &str, _: &str| None;
        let err = request(
            json!({"containers": [{"name": "app", "image": "b", "env": [
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}]}]}),
            &none,
        )
        .unwrap_err();
        assert_eq!(err.reason, "CreateContainerConfigError");
        assert!(err.message.contains("absent"), "{}", err.message);
        // A mount of a volume the pod lacks is refused when the plan is parsed, naming it.
        let pod = json!({"metadata": {"name": "p", "uid": "u1"}, "spec": {"containers": [{"name": "app", "image": "b", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}});
        let err = PodPlan::parse(&pod).unwrap_err().to_string();
        assert!(
            err.contains("spec.containers[0].volumeMounts[0].name: Not found: \"v\""),
            "{err}"
        );
    }

    #[test]
    fn security_context_and_volumes() {
        let none = |_: &str, _: &str| None;
        let r = request(
            json!({"securityContext": {"runAsUser": 1000}, "containers": [{"name": "app", "image": "b",
                "securityContext": {"readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}},
                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}, {"name": "cfg", "mountPath": "/etc/cfg"}]}],
                "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}]}),
            &none,
        )
        .unwrap();
        assert_eq!((r.uid, r.gid), (1000, 0));
        assert!(r.readonly_rootfs && r.no_new_privileges);
        assert_eq!(r.capabilities, ["CAP_NET_BIND_SERVICE"]);
        assert_eq!(r.mounts[0].source, MountSource::SandboxFile("hosts"));
        assert_eq!(
            r.mounts[3].source,
            MountSource::Volume {
                volume: "cache".into(),
                sub_path: None
            }
        );
        assert_eq!(r.mounts[3].field, "app.volumeMounts[0]");
        assert!(!r.mounts[3].readonly);
        assert!(r.mounts[4].readonly, "configMap volumes are read-only");
        assert_eq!(r.args, ["sh"], "the image's cmd");
    }
}

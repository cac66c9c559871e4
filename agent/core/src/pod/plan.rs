//! A pod's spec as the kubelet needs it, parsed once from the stored object (pure).

use shoal_model::FieldError;
use std::collections::BTreeMap;

use serde_json::Value;

use shoal_model::quantity;

/// The pod's `dnsPolicy` and `dnsConfig`, from which the node writes its resolv.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConfig {
    /// `ClusterFirst` (default), `Default`, `None` or `ClusterFirstWithHostNet`.
    pub policy: String,
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    /// `name` or `name:value`.
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// Whether a container that exited with `code` is started again.
    pub fn restarts(self, code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// Where an environment variable's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvSource {
    Value(String),
    /// `fieldRef.fieldPath`: metadata.name, metadata.namespace, metadata.uid, spec.nodeName,
    /// status.podIP, status.hostIP, metadata.labels['k'], metadata.annotations['k'], …
    Field(String),
    /// `resourceFieldRef`: (container name or empty for this one, resource, divisor).
    Resource {
        container: String,
        resource: String,
        divisor: String,
    },
    /// `configMapKeyRef` / `secretKeyRef`: (kind, object name, key, optional).
    Key {
        kind: &'static str,
        name: String,
        key: String,
        optional: bool,
    },
}

/// `envFrom` entries: every key of a ConfigMap or Secret, with a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFrom {
    pub kind: &'static str,
    pub name: String,
    pub prefix: String,
    pub optional: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    pub read_only: bool,
    pub sub_path: Option<String>,
    /// `subPathExpr`: a subPath with the container's `$(VAR)`s expanded at its start.
    pub sub_path_expr: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A directory of the pod on the node's disk, or with `memory`, a tmpfs (of `size_limit`
    /// bytes, else the pod's memory limit); a disk one over `size_limit` gets its pod evicted
    /// (`super::overuse`).
    EmptyDir {
        memory: bool,
        size_limit: Option<u64>,
    },
    /// (kind ConfigMap|Secret, name, optional, items): every key as a file named after it,
    /// or with `items`, only the keys listed, each at its relative path.
    Projected {
        kind: &'static str,
        name: String,
        optional: bool,
        items: Option<Vec<KeyToPath>>,
    },
    /// A path of the node (`hostPath`), checked against the node's policy and its `type`.
    HostPath {
        path: String,
        kind: HostPathType,
        /// Mounted read-only in every container (a static volume through a claim with
        /// `readOnly: true`).
        read_only: bool,
    },
    /// A PersistentVolumeClaim of the pod's namespace; the node resolves it to its volume at
    /// each start ([`VolumeSource::Persistent`] or [`VolumeSource::HostPath`]).
    Claim { claim: String, read_only: bool },
    /// A volume the built-in provisioner made on this node, by its PersistentVolume's name.
    Persistent { volume: String, read_only: bool },
    /// `downwardAPI` and `projected` volumes: files from each source, written together,
    /// read-only in the container.
    Files { sources: Vec<FileSource> },
}

/// One source of a [`VolumeSource::Files`] volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// A ConfigMap's or Secret's keys (as a configMap or secret volume).
    Object {
        kind: &'static str,
        name: String,
        optional: bool,
        items: Option<Vec<KeyToPath>>,
    },
    /// The pod's own fields (`downwardAPI` items).
    Downward(Vec<DownwardFile>),
    /// A token of the pod's ServiceAccount (`serviceAccountToken`), bound to the pod.
    Token(TokenFile),
}

/// A projected `serviceAccountToken`: the token for `audience` (the API's when `None`),
/// valid `seconds`, written at `path`; the kubelet replaces it at 80 % of its life.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenFile {
    pub path: String,
    pub audience: Option<String>,
    pub seconds: u64,
}

/// The variables the kubelet gives every container for `services` (Docker links' style, as
/// upstream's `getServiceEnvVarMap`): each Service with a ClusterIP as `NAME_SERVICE_HOST`,
/// `NAME_SERVICE_PORT` (its first port), `NAME_SERVICE_PORT_PORTNAME`, `NAME_PORT` and
/// `NAME_PORT_443_TCP{,_PROTO,_PORT,_ADDR}`. The caller passes the pod's namespace's Services
/// (when `enableServiceLinks` is on) and `default/kubernetes` (always).
pub fn service_links(services: &[&Value]) -> Vec<(String, String)> {
    let mut vars = Vec::new();
    for s in services {
        let ip = s["spec"]["clusterIP"].as_str().unwrap_or_default();
        if ip.is_empty() || ip == "None" {
            continue;
        }
        let name = s["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_uppercase()
            .replace('-', "_");
        let ports: Vec<(&str, u64, String)> = s["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some((
                    p["name"].as_str().unwrap_or_default(),
                    p["port"].as_u64()?,
                    p["protocol"].as_str().unwrap_or("TCP").to_owned(),
                ))
            })
            .collect();
        let Some((_, first, first_protocol)) = ports.first() else {
            continue;
        };
        vars.push((format!("{name}_SERVICE_HOST"), ip.to_owned()));
        vars.push((format!("{name}_SERVICE_PORT"), first.to_string()));
        for (port_name, port, _) in &ports {
            if !port_name.is_empty() {
                let suffix = port_name.to_uppercase().replace('-', "_");
                vars.push((format!("{name}_SERVICE_PORT_{suffix}"), port.to_string()));
            }
        }
        let url = |protocol: &str, port: u64| format!("{}://{ip}:{port}", protocol.to_lowercase());
        vars.push((format!("{name}_PORT"), url(first_protocol, *first)));
        for (_, port, protocol) in &ports {
            let prefix = format!("{name}_PORT_{port}_{}", protocol.to_uppercase());
            vars.push((prefix.clone(), url(protocol, *port)));
            vars.push((format!("{prefix}_PROTO"), protocol.to_lowercase()));
            vars.push((format!("{prefix}_PORT"), port.to_string()));
            vars.push((format!("{prefix}_ADDR"), ip.to_owned()));
        }
    }
    vars
}

/// The shortest life a projected token may ask for (upstream's validation).
pub const MIN_TOKEN_SECONDS: u64 = 600;

/// One `downwardAPI` item: the file at `path` holds a field of the pod or a resource of one of
/// its containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownwardFile {
    pub path: String,
    pub value: DownwardValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownwardValue {
    /// `fieldRef.fieldPath`: metadata.name, namespace, uid, labels, annotations, and one
    /// label or annotation (`metadata.labels['k']`).
    Field(String),
    /// `resourceFieldRef`: (container, resource, divisor).
    Resource {
        container: String,
        resource: String,
        divisor: String,
    },
}

/// A projected `serviceAccountToken` source (`at`: its field path), checked as upstream does.
fn token_file(source: &Value, at: &str) -> Result<TokenFile, FieldError> {
    let path = source["path"].as_str().unwrap_or_default();
    if path.is_empty() {
        return Err(FieldError::new(format!("{at}.path"), "Required value"));
    }
    shoal_state::labels::check_descending_path(path, true).map_err(|reason| {
        FieldError::new(
            format!("{at}.path"),
            format!("Invalid value: {path:?}: {reason}"),
        )
    })?;
    let seconds = match &source["expirationSeconds"] {
        Value::Null => 3600,
        v => match v.as_u64() {
            Some(s) if s < MIN_TOKEN_SECONDS => {
                return Err(FieldError::new(
                    format!("{at}.expirationSeconds"),
                    format!("Invalid value: {s}: may not specify a duration less than 10 minutes"),
                ));
            }
            Some(s) if s > 1 << 32 => {
                return Err(FieldError::new(
                    format!("{at}.expirationSeconds"),
                    format!(
                        "Invalid value: {s}: may not specify a duration larger than 2^32 seconds"
                    ),
                ));
            }
            Some(s) => s,
            None => {
                return Err(FieldError::new(
                    format!("{at}.expirationSeconds"),
                    format!("Invalid value: {v}: must be a positive integer"),
                ));
            }
        },
    };
    let audience = match &source["audience"] {
        Value::Null => None,
        Value::String(a) if a.is_empty() => None,
        Value::String(a) if a.len() <= 512 => Some(a.clone()),
        _ => {
            return Err(FieldError::new(
                format!("{at}.audience"),
                "Invalid value: must be a string of at most 512 characters",
            ));
        }
    };
    Ok(TokenFile {
        path: path.to_owned(),
        audience,
        seconds,
    })
}

/// The `downwardAPI` items of `source` (a `downwardAPI` volume, or a projected source).
fn downward_items(source: &Value, at: &str) -> Result<Vec<DownwardFile>, FieldError> {
    source["items"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(j, item)| {
            let path = item["path"].as_str().unwrap_or_default().to_owned();
            let value = if let Some(field) = item["fieldRef"]["fieldPath"].as_str() {
                let allowed = matches!(
                    field,
                    "metadata.name"
                        | "metadata.namespace"
                        | "metadata.uid"
                        | "metadata.labels"
                        | "metadata.annotations"
                ) || field.starts_with("metadata.labels['")
                    || field.starts_with("metadata.annotations['");
                if !allowed {
                    return Err(FieldError::new(
                        format!("{at}.items[{j}].fieldRef.fieldPath"),
                        format!(
                            "Unsupported value: {field:?}: supported values: \"metadata.annotations\", \"metadata.labels\", \"metadata.name\", \"metadata.namespace\", \"metadata.uid\""
                        ),
                    ));
                }
                DownwardValue::Field(field.to_owned())
            } else if let Some(r) = item.get("resourceFieldRef") {
                DownwardValue::Resource {
                    container: r["containerName"].as_str().unwrap_or_default().to_owned(),
                    resource: r["resource"].as_str().unwrap_or_default().to_owned(),
                    divisor: r["divisor"].as_str().unwrap_or("1").to_owned(),
                }
            } else {
                return Err(FieldError::new(
                    format!("{at}.items[{j}]"),
                    "Required value: one of fieldRef and resourceFieldRef",
                ));
            };
            Ok(DownwardFile { path, value })
        })
        .collect()
}

pub use shoal_model::node_inputs::HostPathType;

/// `items[]` of a configMap or secret volume: one key written at `path` (checked to
/// descend, [`shoal_model::node_inputs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyToPath {
    pub key: String,
    pub path: String,
}

fn key_to_paths(source: &Value) -> Option<Vec<KeyToPath>> {
    source["items"].as_array().map(|items| {
        items
            .iter()
            .map(|i| KeyToPath {
                key: i["key"].as_str().unwrap_or_default().to_owned(),
                path: i["path"].as_str().unwrap_or_default().to_owned(),
            })
            .collect()
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub source: VolumeSource,
}

/// A probe's action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    Exec(Vec<String>),
    /// (port, path, scheme, host header)
    HttpGet {
        port: u16,
        path: String,
    },
    TcpSocket {
        port: u16,
    },
}

/// A lifecycle hook's handler (`lifecycle.postStart`, `lifecycle.preStop`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    /// A command run in the container.
    Exec(Vec<String>),
    /// An HTTP GET to the pod's own address (its loopback, from its network namespace).
    HttpGet { port: u16, path: String },
    /// A pause of the kubelet's (`sleep.seconds`), the container untouched.
    Sleep { ms: u64 },
}

/// The most a `sleep` handler may ask (s): what a grace period may be at most here.
const MAX_SLEEP_S: u64 = 86_400;

fn handler(value: &Value, field: &str) -> Result<Option<Handler>, FieldError> {
    if value.is_null() {
        return Ok(None);
    }
    if let Some(exec) = value.get("exec") {
        Ok(Some(Handler::Exec(
            strings(&exec["command"]).unwrap_or_default(),
        )))
    } else if let Some(http) = value.get("httpGet") {
        Ok(Some(Handler::HttpGet {
            port: port(&http["port"], &format!("{field}.httpGet.port"))?,
            path: http["path"].as_str().unwrap_or("/").to_owned(),
        }))
    } else if let Some(sleep) = value.get("sleep") {
        let seconds = sleep["seconds"]
            .as_u64()
            .filter(|s| *s <= MAX_SLEEP_S)
            .ok_or_else(|| {
                FieldError::new(
                    format!("{field}.sleep.seconds"),
                    format!("must be a number of seconds from 0 to {MAX_SLEEP_S}"),
                )
            })?;
        Ok(Some(Handler::Sleep {
            ms: seconds.saturating_mul(1000),
        }))
    } else {
        Err(FieldError::new(field, "needs exec, httpGet or sleep"))
    }
}

/// A liveness, readiness or startup probe (Kubernetes field names and defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub action: ProbeAction,
    pub initial_delay_ms: u64,
    pub period_ms: u64,
    pub timeout_ms: u64,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPlan {
    pub name: String,
    pub image: String,
    /// `imagePullPolicy` (the apiserver's default when absent: Always for `:latest` or no
    /// tag, else IfNotPresent).
    pub image_pull_policy: PullPolicy,
    pub command: Option<Vec<String>>,
    pub args: Option<Vec<String>>,
    pub working_dir: Option<String>,
    pub env: Vec<(String, EnvSource)>,
    pub env_from: Vec<EnvFrom>,
    pub volume_mounts: Vec<VolumeMount>,
    pub cpu_request_millis: Option<u64>,
    pub cpu_limit_millis: Option<u64>,
    pub memory_request_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub read_only_root_filesystem: bool,
    pub allow_privilege_escalation: bool,
    pub privileged: bool,
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    pub liveness: Option<Probe>,
    pub readiness: Option<Probe>,
    pub startup: Option<Probe>,
    /// `lifecycle.preStop`: run before SIGTERM, within the grace period.
    pub pre_stop: Option<Handler>,
    /// `lifecycle.postStart`: run once the container started; it counts as started (probes,
    /// readiness, the next init container) only when this has succeeded, and is killed if it
    /// fails.
    pub post_start: Option<Handler>,
    /// A native sidecar: an init container with `restartPolicy: Always` (started in its turn,
    /// not waited on to complete, restarted whatever the pod's policy, stopped after the main
    /// containers).
    pub sidecar: bool,
    /// `securityContext.runAsNonRoot` (container, else pod).
    pub run_as_non_root: bool,
    /// `securityContext.seccompProfile` (container, else pod; RuntimeDefault when unset).
    pub seccomp: SeccompChoice,
    /// `securityContext.procMount` (`Default` or `Unmasked`).
    pub proc_mount: Option<String>,
    /// `stdin`, `stdinOnce`, `tty`: the container's standard input stays open for
    /// `kubectl attach -i` (closed after the first attach ends with `stdinOnce`), on a terminal
    /// with `tty`.
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
    /// `terminationMessagePath` (default `/dev/termination-log`): a file the container may
    /// write why it ended into; the node shows it as the terminated state's `message`.
    pub termination_message_path: String,
    /// `terminationMessagePolicy: FallbackToLogsOnError`: with no message written and a
    /// failure, the end of the container's log stands in.
    pub termination_message_from_logs: bool,
}

/// `imagePullPolicy`: when the kubelet asks a registry for the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    /// At every container start (the tag is resolved again; blobs present are not fetched).
    Always,
    /// Only when the node does not have it.
    IfNotPresent,
    /// Never: the image must be in this node's store already (not fetched from a peer
    /// either).
    Never,
}

impl PullPolicy {
    /// The policy a container spec states, defaulted as the apiserver does.
    fn of(container: &Value, image: &str) -> Self {
        match container["imagePullPolicy"].as_str() {
            Some("Always") => Self::Always,
            Some("Never") => Self::Never,
            Some(_) => Self::IfNotPresent,
            None if shoal_model::validation::default_pull_policy(image) == "Always" => Self::Always,
            None => Self::IfNotPresent,
        }
    }
}

/// `seccompProfile.type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeccompChoice {
    RuntimeDefault,
    Unconfined,
    /// `localhostProfile`: a path below the node's `<data-dir>/seccomp/`.
    Localhost(String),
}

fn seccomp_choice(value: &Value, field: &str) -> Result<Option<SeccompChoice>, FieldError> {
    if value.is_null() {
        return Ok(None);
    }
    Ok(Some(match value["type"].as_str() {
        Some("RuntimeDefault") => SeccompChoice::RuntimeDefault,
        Some("Unconfined") => SeccompChoice::Unconfined,
        Some("Localhost") => {
            let path = value["localhostProfile"].as_str().unwrap_or_default();
            if path.is_empty() {
                return Err(FieldError::new(
                    format!("{field}.localhostProfile"),
                    "Required value",
                ));
            }
            shoal_state::labels::check_descending_path(path, false)
                .map_err(|r| FieldError::new(format!("{field}.localhostProfile"), r.to_string()))?;
            SeccompChoice::Localhost(path.to_owned())
        }
        other => {
            return Err(FieldError::new(
                format!("{field}.type"),
                format!(
                    "Unsupported value: {other:?}: supported values: \"Localhost\", \"RuntimeDefault\", \"Unconfined\""
                ),
            ));
        }
    }))
}

/// Everything the kubelet acts on for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node_name: String,
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub init_containers: Vec<ContainerPlan>,
    pub containers: Vec<ContainerPlan>,
    pub volumes: Vec<Volume>,
    pub restart_policy: RestartPolicy,
    pub termination_grace_ms: u64,
    pub creation_timestamp: Option<String>,
    /// `securityContext.supplementalGroups` and `fsGroup`.
    pub supplemental_groups: Vec<u32>,
    pub fs_group: Option<u32>,
    /// `securityContext.sysctls`.
    pub sysctls: BTreeMap<String, String>,
    pub host_pid: bool,
    pub host_ipc: bool,
    /// `imagePullSecrets[].name`: Secrets of this namespace with registry credentials.
    pub image_pull_secrets: Vec<String>,
    /// `spec.serviceAccountName` (`default` when none is named).
    pub service_account: String,
    /// `spec.enableServiceLinks` (on unless `false`): the namespace's Services as variables.
    pub service_links: bool,
    /// `hostNetwork`: the pod uses the node's network namespace.
    pub host_network: bool,
    /// `dnsPolicy` and `dnsConfig`.
    pub dns: DnsConfig,
    /// The pod's requests as the auction and admission count them (recorded with its sandbox,
    /// so admission still counts a pod that runs here after its object is gone).
    pub requests: shoal_model::placement::Resources,
}

fn strings(value: &Value) -> Option<Vec<String>> {
    value.as_array().map(|a| {
        a.iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect()
    })
}

fn port(value: &Value, field: &str) -> Result<u16, FieldError> {
    value
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            FieldError::new(
                field,
                "must be a port number (named ports are not supported)",
            )
        })
}

fn probe(value: &Value, field: &str) -> Result<Option<Probe>, FieldError> {
    if value.is_null() {
        return Ok(None);
    }
    let action = if let Some(exec) = value.get("exec") {
        ProbeAction::Exec(strings(&exec["command"]).unwrap_or_default())
    } else if let Some(http) = value.get("httpGet") {
        ProbeAction::HttpGet {
            port: port(&http["port"], &format!("{field}.httpGet.port"))?,
            path: http["path"].as_str().unwrap_or("/").to_owned(),
        }
    } else if let Some(tcp) = value.get("tcpSocket") {
        ProbeAction::TcpSocket {
            port: port(&tcp["port"], &format!("{field}.tcpSocket.port"))?,
        }
    } else {
        return Err(FieldError::new(field, "needs exec, httpGet or tcpSocket"));
    };
    let seconds =
        |name: &str, default: u64| value[name].as_u64().unwrap_or(default).saturating_mul(1000);
    let count = |name: &str, default: u32| {
        value[name]
            .as_u64()
            .map_or(default, |v| v.clamp(1, u32::MAX as u64) as u32)
    };
    Ok(Some(Probe {
        action,
        initial_delay_ms: seconds("initialDelaySeconds", 0),
        period_ms: seconds("periodSeconds", 10).max(1000),
        timeout_ms: seconds("timeoutSeconds", 1).max(1000),
        success_threshold: count("successThreshold", 1),
        failure_threshold: count("failureThreshold", 3),
    }))
}

fn container(value: &Value, field: &str) -> Result<ContainerPlan, FieldError> {
    let name = value["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| FieldError::new(format!("{field}.name"), "required"))?
        .to_owned();
    let image = value["image"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| FieldError::new(format!("{field}.image"), "required"))?
        .to_owned();
    let mut env = Vec::new();
    for (i, e) in value["env"].as_array().into_iter().flatten().enumerate() {
        let at = format!("{field}.env[{i}]");
        let key = e["name"]
            .as_str()
            .ok_or_else(|| FieldError::new(format!("{at}.name"), "required"))?;
        let from = &e["valueFrom"];
        let source = if from.is_null() {
            EnvSource::Value(e["value"].as_str().unwrap_or_default().to_owned())
        } else if let Some(path) = from["fieldRef"]["fieldPath"].as_str() {
            EnvSource::Field(path.to_owned())
        } else if let Some(r) = from.get("resourceFieldRef") {
            EnvSource::Resource {
                container: r["containerName"].as_str().unwrap_or_default().to_owned(),
                resource: r["resource"].as_str().unwrap_or_default().to_owned(),
                divisor: r["divisor"].as_str().unwrap_or("1").to_owned(),
            }
        } else if let Some((kind, r)) = from
            .get("configMapKeyRef")
            .map(|r| ("ConfigMap", r))
            .or_else(|| from.get("secretKeyRef").map(|r| ("Secret", r)))
        {
            EnvSource::Key {
                kind,
                name: r["name"].as_str().unwrap_or_default().to_owned(),
                key: r["key"].as_str().unwrap_or_default().to_owned(),
                optional: r["optional"].as_bool().unwrap_or(false),
            }
        } else {
            return Err(FieldError::new(
                format!("{at}.valueFrom"),
                "unsupported source",
            ));
        };
        env.push((key.to_owned(), source));
    }
    let mut env_from = Vec::new();
    for e in value["envFrom"].as_array().into_iter().flatten() {
        let (kind, r) = match (e.get("configMapRef"), e.get("secretRef")) {
            (Some(r), _) => ("ConfigMap", r),
            (None, Some(r)) => ("Secret", r),
            _ => continue,
        };
        env_from.push(EnvFrom {
            kind,
            name: r["name"].as_str().unwrap_or_default().to_owned(),
            prefix: e["prefix"].as_str().unwrap_or_default().to_owned(),
            optional: r["optional"].as_bool().unwrap_or(false),
        });
    }
    let volume_mounts = value["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| VolumeMount {
            name: m["name"].as_str().unwrap_or_default().to_owned(),
            mount_path: m["mountPath"].as_str().unwrap_or_default().to_owned(),
            read_only: m["readOnly"].as_bool().unwrap_or(false),
            sub_path: m["subPath"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
            sub_path_expr: m["subPathExpr"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        })
        .collect();
    let resources = &value["resources"];
    // Quantities as strings or bare numbers (`cpu: 2`), parsed exactly and bounded.
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    let cpu = |v: &Value, f: &str| {
        text(v)
            .map(|q| {
                quantity::cpu_millis(&q)
                    .map_err(|e| FieldError::new(format!("{field}.resources.{f}"), e.to_string()))
            })
            .transpose()
    };
    let mem = |v: &Value, f: &str| {
        text(v)
            .map(|q| {
                quantity::bytes(&q)
                    .map_err(|e| FieldError::new(format!("{field}.resources.{f}"), e.to_string()))
            })
            .transpose()
    };
    let limits = &resources["limits"];
    let requests = &resources["requests"];
    let cpu_limit_millis = cpu(&limits["cpu"], "limits.cpu")?;
    let memory_limit_bytes = mem(&limits["memory"], "limits.memory")?;
    let security = &value["securityContext"];
    let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    Ok(ContainerPlan {
        name,
        image_pull_policy: PullPolicy::of(value, &image),
        image,
        command: strings(&value["command"]),
        args: strings(&value["args"]),
        working_dir: value["workingDir"]
            .as_str()
            .filter(|w| !w.is_empty())
            .map(str::to_owned),
        env,
        env_from,
        volume_mounts,
        // As in Kubernetes, a limit without a request makes the request equal to the limit.
        cpu_request_millis: cpu(&requests["cpu"], "requests.cpu")?.or(cpu_limit_millis),
        cpu_limit_millis,
        memory_request_bytes: mem(&requests["memory"], "requests.memory")?.or(memory_limit_bytes),
        memory_limit_bytes,
        run_as_user: id(&security["runAsUser"]),
        run_as_group: id(&security["runAsGroup"]),
        read_only_root_filesystem: security["readOnlyRootFilesystem"]
            .as_bool()
            .unwrap_or(false),
        allow_privilege_escalation: security["allowPrivilegeEscalation"]
            .as_bool()
            .unwrap_or(false),
        privileged: security["privileged"].as_bool().unwrap_or(false),
        capabilities_add: strings(&security["capabilities"]["add"]).unwrap_or_default(),
        capabilities_drop: strings(&security["capabilities"]["drop"]).unwrap_or_default(),
        liveness: probe(&value["livenessProbe"], &format!("{field}.livenessProbe"))?,
        readiness: probe(&value["readinessProbe"], &format!("{field}.readinessProbe"))?,
        startup: probe(&value["startupProbe"], &format!("{field}.startupProbe"))?,
        pre_stop: handler(
            &value["lifecycle"]["preStop"],
            &format!("{field}.lifecycle.preStop"),
        )?,
        post_start: handler(
            &value["lifecycle"]["postStart"],
            &format!("{field}.lifecycle.postStart"),
        )?,
        sidecar: false,
        run_as_non_root: security["runAsNonRoot"].as_bool().unwrap_or(false),
        seccomp: seccomp_choice(
            &security["seccompProfile"],
            &format!("{field}.securityContext.seccompProfile"),
        )?
        .unwrap_or(SeccompChoice::RuntimeDefault),
        proc_mount: security["procMount"].as_str().map(str::to_owned),
        stdin: value["stdin"].as_bool().unwrap_or(false),
        stdin_once: value["stdinOnce"].as_bool().unwrap_or(false),
        tty: value["tty"].as_bool().unwrap_or(false),
        termination_message_path: match value["terminationMessagePath"].as_str() {
            None | Some("") => "/dev/termination-log".to_owned(),
            Some(path) if path.starts_with('/') && !path.split('/').any(|p| p == "..") => {
                path.to_owned()
            }
            Some(path) => {
                return Err(FieldError::new(
                    format!("{field}.terminationMessagePath"),
                    format!("Invalid value: {path:?}: must be an absolute path without '..'"),
                ));
            }
        },
        termination_message_from_logs: match value["terminationMessagePolicy"].as_str() {
            None | Some("File") => false,
            Some("FallbackToLogsOnError") => true,
            Some(other) => {
                return Err(FieldError::new(
                    format!("{field}.terminationMessagePolicy"),
                    format!(
                        "Unsupported value: {other:?}: supported values: \"File\", \"FallbackToLogsOnError\""
                    ),
                ));
            }
        },
    })
}

use shoal_model::placement::string_map;

impl PodPlan {
    /// Parses a stored pod; errors name the field.
    pub fn parse(pod: &Value) -> Result<Self, FieldError> {
        let meta = &pod["metadata"];
        let spec = &pod["spec"];
        // Again at the node: the API checked this, but a stored pod may come from a peer that
        // did not (or an older version of this check).
        shoal_model::node_inputs::check(spec, "spec")?;
        let uid = meta["uid"].as_str().unwrap_or_default();
        if !uid.is_empty() && !super::observed::is_safe_id(uid) {
            return Err(FieldError::new(
                "metadata.uid",
                format!("Invalid value: {uid:?}: not a uid"),
            ));
        }
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let pod_security = &spec["securityContext"];
        let mut containers = Vec::new();
        let mut init_containers = Vec::new();
        for (list, field, out) in [
            (
                &spec["initContainers"],
                "spec.initContainers",
                &mut init_containers,
            ),
            (&spec["containers"], "spec.containers", &mut containers),
        ] {
            for (i, c) in list.as_array().into_iter().flatten().enumerate() {
                let mut plan = container(c, &format!("{field}[{i}]"))?;
                let policy = &c["restartPolicy"];
                if !policy.is_null() && (field == "spec.containers" || policy != "Always") {
                    return Err(FieldError::new(
                        format!("{field}[{i}].restartPolicy"),
                        format!(
                            "Unsupported value: {policy}: only \"Always\", and only for an init container (a sidecar)"
                        ),
                    ));
                }
                plan.sidecar = policy == "Always";
                // Pod-level securityContext supplies what the container does not set.
                let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
                plan.run_as_user = plan.run_as_user.or(id(&pod_security["runAsUser"]));
                plan.run_as_group = plan.run_as_group.or(id(&pod_security["runAsGroup"]));
                let container_security = &c["securityContext"];
                if container_security["runAsNonRoot"].is_null() {
                    plan.run_as_non_root = pod_security["runAsNonRoot"].as_bool().unwrap_or(false);
                }
                if container_security["seccompProfile"].is_null()
                    && let Some(choice) = seccomp_choice(
                        &pod_security["seccompProfile"],
                        "spec.securityContext.seccompProfile",
                    )?
                {
                    plan.seccomp = choice;
                }
                out.push(plan);
            }
        }
        if containers.is_empty() {
            return Err(FieldError::new(
                "spec.containers",
                "at least one container is required",
            ));
        }
        let volumes = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, v)| {
                let name = text(&v["name"]);
                let source = if let Some(e) = v.get("emptyDir") {
                    let e =
                        shoal_model::node_inputs::empty_dir(e, &format!("spec.volumes[{i}].emptyDir"))?;
                    VolumeSource::EmptyDir {
                        memory: e.memory,
                        size_limit: e.size_limit,
                    }
                } else if let Some(c) = v.get("configMap") {
                    VolumeSource::Projected {
                        kind: "ConfigMap",
                        name: text(&c["name"]),
                        optional: c["optional"].as_bool().unwrap_or(false),
                        items: key_to_paths(c),
                    }
                } else if let Some(s) = v.get("secret") {
                    VolumeSource::Projected {
                        kind: "Secret",
                        name: text(&s["secretName"]),
                        optional: s["optional"].as_bool().unwrap_or(false),
                        items: key_to_paths(s),
                    }
                } else if let Some(d) = v.get("downwardAPI") {
                    VolumeSource::Files {
                        sources: vec![FileSource::Downward(downward_items(
                            d,
                            &format!("spec.volumes[{i}].downwardAPI"),
                        )?)],
                    }
                } else if let Some(p) = v.get("projected") {
                    let mut sources = Vec::new();
                    for (j, s) in p["sources"].as_array().into_iter().flatten().enumerate() {
                        let at = format!("spec.volumes[{i}].projected.sources[{j}]");
                        sources.push(if let Some(c) = s.get("configMap") {
                            FileSource::Object {
                                kind: "ConfigMap",
                                name: text(&c["name"]),
                                optional: c["optional"].as_bool().unwrap_or(false),
                                items: key_to_paths(c),
                            }
                        } else if let Some(c) = s.get("secret") {
                            FileSource::Object {
                                kind: "Secret",
                                name: text(&c["name"]),
                                optional: c["optional"].as_bool().unwrap_or(false),
                                items: key_to_paths(c),
                            }
                        } else if let Some(d) = s.get("downwardAPI") {
                            FileSource::Downward(downward_items(d, &format!("{at}.downwardAPI"))?)
                        } else if let Some(t) = s.get("serviceAccountToken") {
                            FileSource::Token(token_file(t, &format!("{at}.serviceAccountToken"))?)
                        } else {
                            return Err(FieldError::new(
                                at,
                                "only configMap, secret, downwardAPI and serviceAccountToken sources are supported",
                            ));
                        });
                    }
                    VolumeSource::Files { sources }
                } else if let Some(c) = v.get("persistentVolumeClaim") {
                    VolumeSource::Claim {
                        claim: text(&c["claimName"]),
                        read_only: c["readOnly"].as_bool().unwrap_or(false),
                    }
                } else if v.get("ephemeral").is_some() {
                    // A generic ephemeral volume: the claim made for the pod from its template.
                    VolumeSource::Claim {
                        claim: shoal_model::storage::ephemeral_claim_name(
                            pod["metadata"]["name"].as_str().unwrap_or_default(),
                            &name,
                        ),
                        read_only: false,
                    }
                } else if let Some(h) = v.get("hostPath") {
                    let kind = h["type"].as_str().unwrap_or_default();
                    VolumeSource::HostPath {
                        path: text(&h["path"]),
                        kind: HostPathType::parse(kind).ok_or_else(|| {
                            FieldError::new(
                                format!("spec.volumes[{i}].hostPath.type"),
                                format!("Unsupported value: {kind:?}"),
                            )
                        })?,
                        read_only: false,
                    }
                } else {
                    return Err(FieldError::new(
                        format!("spec.volumes[{i}]"),
                        "only emptyDir, configMap, secret, downwardAPI, projected, hostPath, persistentVolumeClaim and ephemeral volumes are supported",
                    ));
                };
                Ok(Volume { name, source })
            })
            .collect::<Result<Vec<_>, FieldError>>()?;
        let restart_policy = match spec["restartPolicy"].as_str() {
            None | Some("Always") => RestartPolicy::Always,
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            Some(other) => {
                return Err(FieldError::new(
                    "spec.restartPolicy",
                    format!("unsupported value {other:?}"),
                ));
            }
        };
        let name = text(&meta["name"]);
        // Unparsable quantities failed in `container` above already.
        let requests = shoal_model::placement::PodRequest::from_pod(pod)
            .map_or(shoal_model::placement::Resources::new(0, 0, 1), |r| {
                r.requests
            });
        Ok(Self {
            requests,
            uid: text(&meta["uid"]),
            namespace: meta["namespace"].as_str().unwrap_or("default").to_owned(),
            hostname: spec["hostname"]
                .as_str()
                .map_or_else(|| name.clone(), str::to_owned),
            name,
            node_name: text(&spec["nodeName"]),
            labels: string_map(&meta["labels"]),
            annotations: string_map(&meta["annotations"]),
            init_containers,
            containers,
            volumes,
            restart_policy,
            termination_grace_ms: spec["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30)
                .saturating_mul(1000),
            creation_timestamp: meta["creationTimestamp"].as_str().map(str::to_owned),
            supplemental_groups: pod_security["supplementalGroups"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| {
                    g.as_u64()
                        .and_then(|g| u32::try_from(g).ok())
                        .ok_or_else(|| {
                            FieldError::new(
                                "spec.securityContext.supplementalGroups",
                                format!("Invalid value: {g}"),
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
            fs_group: match &pod_security["fsGroup"] {
                Value::Null => None,
                g => Some(
                    g.as_u64()
                        .and_then(|g| u32::try_from(g).ok())
                        .ok_or_else(|| {
                            FieldError::new(
                                "spec.securityContext.fsGroup",
                                format!("Invalid value: {g}"),
                            )
                        })?,
                ),
            },
            sysctls: pod_security["sysctls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    (
                        s["name"].as_str().unwrap_or_default().to_owned(),
                        s["value"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect(),
            host_pid: spec["hostPID"].as_bool().unwrap_or(false),
            image_pull_secrets: spec["imagePullSecrets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["name"].as_str().filter(|n| !n.is_empty()))
                .map(str::to_owned)
                .collect(),
            service_links: spec["enableServiceLinks"].as_bool().unwrap_or(true),
            service_account: spec["serviceAccountName"]
                .as_str()
                .filter(|a| !a.is_empty())
                .unwrap_or("default")
                .to_owned(),
            host_ipc: spec["hostIPC"].as_bool().unwrap_or(false),
            host_network: spec["hostNetwork"].as_bool().unwrap_or(false),
            dns: DnsConfig {
                policy: spec["dnsPolicy"]
                    .as_str()
                    .unwrap_or("ClusterFirst")
                    .to_owned(),
                nameservers: strings(&spec["dnsConfig"]["nameservers"]).unwrap_or_default(),
                searches: strings(&spec["dnsConfig"]["searches"]).unwrap_or_default(),
                options: spec["dnsConfig"]["options"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|o| {
                        let name = o["name"].as_str()?;
                        Some(match o["value"].as_str() {
                            Some(v) => format!("{name}:{v}"),
                            None => name.to_owned(),
                        })
                    })
                    .collect(),
            },
        })
    }

    /// Kubernetes' QoS class.
    pub fn qos_class(&self) -> &'static str {
        let all = || self.containers.iter().chain(&self.init_containers);
        let none = all().all(|c| {
            c.cpu_request_millis.is_none()
                && c.memory_request_bytes.is_none()
                && c.cpu_limit_millis.is_none()
                && c.memory_limit_bytes.is_none()
        });
        if none {
            return "BestEffort";
        }
        let guaranteed = all().all(|c| {
            c.cpu_limit_millis.is_some()
                && c.memory_limit_bytes.is_some()
                && c.cpu_request_millis == c.cpu_limit_millis
                && c.memory_request_bytes == c.memory_limit_bytes
        });
        if guaranteed {
            "Guaranteed"
        } else {
            "Burstable"
        }
    }

    /// The pod cgroup's memory cap: the sum of the containers' limits if every one has one
    /// (init containers run alone, so the biggest of them counts against the same cap).
    pub fn memory_limit_bytes(&self) -> Option<i64> {
        // Saturating: two containers with `memory: 9E` are "unlimited", never a wrapped
        // negative number.
        let sum: Option<u64> = self
            .containers
            .iter()
            .map(|c| c.memory_limit_bytes)
            .try_fold(0u64, |acc, m| Some(acc.saturating_add(m?)));
        let init = self
            .init_containers
            .iter()
            .map(|c| c.memory_limit_bytes)
            .collect::<Option<Vec<u64>>>()?
            .into_iter()
            .max()
            .unwrap_or(0);
        sum.map(|s| i64::try_from(s.max(init)).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn services_become_link_variables_as_the_kubelet_names_them() {
        let api = json!({"metadata": {"name": "kubernetes"}, "spec": {"clusterIP": "10.96.0.1",
            "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}});
        let db = json!({"metadata": {"name": "my-db"}, "spec": {"clusterIP": "10.96.3.4",
            "ports": [{"port": 5432}, {"name": "metrics", "port": 9187, "protocol": "UDP"}]}});
        let headless = json!({"metadata": {"name": "peers"}, "spec": {"clusterIP": "None",
            "ports": [{"port": 80}]}});
        let vars: BTreeMap<String, String> =
            service_links(&[&api, &db, &headless]).into_iter().collect();
        let want = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("MY_DB_SERVICE_HOST", "10.96.3.4"),
            ("MY_DB_SERVICE_PORT", "5432"),
            ("MY_DB_SERVICE_PORT_METRICS", "9187"),
            ("MY_DB_PORT", "tcp://10.96.3.4:5432"),
            ("MY_DB_PORT_9187_UDP", "udp://10.96.3.4:9187"),
            ("MY_DB_PORT_9187_UDP_ADDR", "10.96.3.4"),
        ];
        for (k, v) in want {
            assert_eq!(vars.get(k).map(String::as_str), Some(v), "{k}: {vars:?}");
        }
        assert!(!vars.keys().any(|k| k.starts_with("PEERS_")), "{vars:?}");
    }

    #[test]
    fn pull_policies_default_as_the_apiserver_and_pull_secrets_are_named() {
        let pod = json!({"metadata": {"name": "p", "uid": "u"}, "spec": {
        "imagePullSecrets": [{"name": "regcred"}, {"name": ""}],
        "containers": [
            {"name": "a", "image": "busybox"},
            {"name": "b", "image": "reg:5000/app:1"},
            {"name": "c", "image": "reg:5000/app:1", "imagePullPolicy": "Never"},
            {"name": "d", "image": "reg:5000/app:1", "imagePullPolicy": "Always"},
        ]}});
        let plan = PodPlan::parse(&pod).unwrap();
        let policies: Vec<PullPolicy> = plan
            .containers
            .iter()
            .map(|c| c.image_pull_policy)
            .collect();
        assert_eq!(
            policies,
            [
                PullPolicy::Always,
                PullPolicy::IfNotPresent,
                PullPolicy::Never,
                PullPolicy::Always
            ]
        );
        assert_eq!(plan.image_pull_secrets, ["regcred"]);
    }

    #[test]
    fn parses_containers_env_resources_and_probes() {
        let pod = json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u1", "labels": {"app": "web"}},
            "spec": {
                "nodeName": "n1",
                "restartPolicy": "OnFailure",
                "terminationGracePeriodSeconds": 5,
                "initContainers": [{"name": "setup", "image": "busybox", "command": ["true"]}],
                "containers": [{
                    "name": "app", "image": "shoal.local/httpd:1",
                    "env": [
                        {"name": "A", "value": "1"},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}},
                    ],
                    "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
                    "securityContext": {"readOnlyRootFilesystem": true, "runAsUser": 1000},
                    "livenessProbe": {"httpGet": {"port": 8080, "path": "/healthz"}, "periodSeconds": 2},
                }],
                "volumes": [{"name": "cache", "emptyDir": {}}],
            },
        });
        let plan = PodPlan::parse(&pod).unwrap();
        assert_eq!(plan.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(plan.termination_grace_ms, 5000);
        assert_eq!(plan.init_containers[0].name, "setup");
        let app = &plan.containers[0];
        assert_eq!(app.cpu_request_millis, Some(500));
        assert_eq!(app.memory_limit_bytes, Some(64 << 20));
        assert_eq!(app.env[1].1, EnvSource::Field("metadata.name".into()));
        assert!(matches!(
            &app.env[2].1,
            EnvSource::Key {
                kind: "ConfigMap",
                ..
            }
        ));
        assert_eq!(app.run_as_user, Some(1000));
        let probe = app.liveness.as_ref().unwrap();
        assert_eq!(probe.period_ms, 2000);
        assert_eq!(probe.failure_threshold, 3);
        assert_eq!(plan.qos_class(), "Burstable");
        assert_eq!(plan.memory_limit_bytes(), None);
    }

    #[test]
    fn errors_name_the_field() {
        let pod = json!({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(
            PodPlan::parse(&pod).unwrap_err().to_string(),
            "spec.containers[0].image: required"
        );
        let pod = json!({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "a", "image": "b",
            "livenessProbe": {"tcpSocket": {"port": "http"}}}]}});
        assert!(
            PodPlan::parse(&pod)
                .unwrap_err()
                .field
                .ends_with("livenessProbe.tcpSocket.port")
        );
    }
}

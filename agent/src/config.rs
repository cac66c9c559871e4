//! Agent configuration: typed, from a TOML file and/or flags (flags win), validated with errors
//! that name the field.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use shoal_state::labels;

/// Default UDP port of the node endpoint.
pub const DEFAULT_PORT: u16 = 7600;

/// `shoal agent` flags. Every one may also be set in the config file (same name, kebab-case).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct AgentFlags {
    /// TOML config file; flags override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Node name (a DNS-1123 subdomain, e.g. `node-1`). Default: the host name.
    #[arg(long)]
    pub name: Option<String>,
    /// Directory for this node's state (identity, store, control socket).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Cluster secret written by `shoal init`.
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<PathBuf>,
    /// UDP address of the node endpoint (all node-to-node traffic). Port 0 picks a free port.
    #[arg(long, value_name = "IP:PORT")]
    pub bind: Option<SocketAddr>,
    /// Address peers use to reach this node. Default: the bound address.
    #[arg(long, value_name = "IP:PORT")]
    pub advertise: Option<SocketAddr>,
    /// An existing member to join through (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    pub join: Vec<String>,
    /// Serve the Kubernetes API (HTTPS) on this TCP address, e.g. `0.0.0.0:6443`.
    #[arg(long, value_name = "IP:PORT")]
    pub api: Option<SocketAddr>,
    /// Address clients use to reach the API. Default: the API address (or this node's
    /// advertised IP when the API binds 0.0.0.0).
    #[arg(long, value_name = "IP:PORT")]
    pub api_advertise: Option<SocketAddr>,
    /// Record every API request as a JSON line (upstream's audit `Event`s, level Metadata).
    #[arg(long, value_name = "PATH")]
    pub audit_log_path: Option<PathBuf>,
    /// Node labels, `k=v,k2=v2`.
    #[arg(long, value_name = "K=V,...")]
    pub labels: Option<String>,
    /// Node taints, `key=value:Effect,...` (Effect: NoSchedule, PreferNoSchedule, NoExecute).
    #[arg(long, value_name = "K=V:EFFECT,...")]
    pub taints: Option<String>,
    /// Gossip round period, e.g. `200ms`.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub gossip_interval: Option<Duration>,
    /// Nodes that must hold a write before it is acknowledged (capped by live nodes).
    #[arg(long, value_name = "N")]
    pub write_quorum: Option<usize>,
    /// How long a node must be seen dead before its pods are auctioned again, e.g. `5s`.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub eviction_delay: Option<Duration>,
    /// How long a node without a majority keeps its `fenced` pods, e.g. `5s`.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub fence_timeout: Option<Duration>,
    /// How often a HorizontalPodAutoscaler this node owns is synced (default 15s, as
    /// kube-controller-manager's --horizontal-pod-autoscaler-sync-period).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub hpa_sync_period: Option<Duration>,
    /// Period of desired-state anti-entropy, e.g. `1s`.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub anti_entropy_interval: Option<Duration>,
    /// First delay before restarting a crashed container; it doubles per restart up to 300 s
    /// (CrashLoopBackOff), e.g. `10s`.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub restart_backoff: Option<Duration>,
    /// How long this node keeps the events it records (default 1h, as the apiserver's
    /// --event-ttl).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub event_ttl: Option<Duration>,
    /// Do not run pods on this node (no container runtime); it still gossips, stores,
    /// schedules and serves the API.
    #[arg(long)]
    pub no_runtime: bool,
    /// Let pods on this node add capabilities beyond the default set and share the node's
    /// PID or IPC namespace (`hostPID`, `hostIPC`); refused otherwise.
    #[arg(long)]
    pub allow_privileged: bool,
    /// Most processes all containers of one pod may run together (default 4096).
    #[arg(long, value_name = "N")]
    pub pod_pids_limit: Option<u64>,
    /// Most bytes one image layer may unpack to, uncompressed (default 32 GiB).
    #[arg(long, value_name = "BYTES")]
    pub max_layer_bytes: Option<u64>,
    /// Most entries (files, directories, links) one image layer may hold (default 1,000,000).
    #[arg(long, value_name = "N")]
    pub max_layer_entries: Option<u64>,
    /// Most bytes all the layers of one image may unpack to together (default 64 GiB).
    #[arg(long, value_name = "BYTES")]
    pub max_image_bytes: Option<u64>,
    /// A host path prefix `hostPath` volumes may name (repeatable; default: any path but this
    /// agent's data dir and what contains it).
    #[arg(long = "host-path-allow", value_name = "PREFIX")]
    pub host_path_allow: Vec<PathBuf>,
    /// A host path prefix `hostPath` volumes may never name, whatever the API allowed
    /// (repeatable; the data dir and the secret files are always refused).
    #[arg(long = "host-path-deny", value_name = "PREFIX")]
    pub host_path_deny: Vec<PathBuf>,
    /// What the built-in provisioner (`local-path` claims) may give out on this node in all, a
    /// quantity (`20Gi`); default the size of the filesystem holding the data dir. The
    /// auction counts it; nothing enforces it on disk (see README's "Storage").
    #[arg(long, value_name = "QUANTITY", value_parser = parse_bytes)]
    pub volume_capacity: Option<u64>,
    /// A registry (`host` or `host:port`, as image names write it) pulled from over plain
    /// HTTP (repeatable); registries on loopback addresses always are, as Docker does.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registry: Vec<String>,
    /// Which registries this node pulls images from when no peer has them: `all` (the
    /// default), `local` (loopback and --insecure-registry ones only) or `none`.
    #[arg(long, value_name = "all|local|none")]
    pub registry_pulls: Option<crate::images::registry::RegistryPulls>,
    /// A CA certificate file (PEM) trusted for registries besides the system's (repeatable).
    #[arg(long = "registry-ca", value_name = "FILE")]
    pub registry_ca: Vec<PathBuf>,
    /// Registry mirrors, CA files, credentials and a docker config, per registry (TOML; see
    /// README's "Registries").
    #[arg(long, value_name = "FILE")]
    pub registry_config: Option<PathBuf>,
    /// Percent of the image filesystem used at which unused images are removed (default 85;
    /// 100 turns image garbage collection off).
    #[arg(long, value_name = "PERCENT")]
    pub image_gc_high_threshold: Option<u8>,
    /// Percent of the image filesystem image garbage collection frees down to (default 80).
    #[arg(long, value_name = "PERCENT")]
    pub image_gc_low_threshold: Option<u8>,
    /// An image younger than this is never collected (default 2m, as the kubelet's
    /// --minimum-image-ttl-duration).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub image_minimum_gc_age: Option<Duration>,
    /// Pod networking: `bridge` (one IP per pod from this node's block of the cluster CIDR;
    /// the default) or `none` (pods have only loopback).
    #[arg(long, value_name = "bridge|none")]
    pub pod_network: Option<PodNetworkMode>,
    /// The pods' address range, cut into one block per node (default 10.88.0.0/16).
    #[arg(long, value_name = "CIDR")]
    pub cluster_cidr: Option<ipnet::Ipv4Net>,
    /// Prefix length of each node's block of the cluster CIDR (default 24: 253 pods).
    #[arg(long, value_name = "BITS")]
    pub node_cidr_size: Option<u8>,
    /// Where Service ClusterIPs come from (default 10.96.0.0/16); the same on every node.
    #[arg(long, value_name = "CIDR")]
    pub service_cidr: Option<ipnet::Ipv4Net>,
    /// The DNS domain of Services and pods (default cluster.local).
    #[arg(long, value_name = "DOMAIN")]
    pub cluster_domain: Option<String>,
    /// On shutdown, stop this node's pods and remove what it made on the host (pod network
    /// bridge and routes) and its pod CIDR lease.
    #[arg(long)]
    pub cleanup: bool,
}

/// How pods are networked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PodNetworkMode {
    #[default]
    Bridge,
    None,
}

/// The `[network]` table of the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct NetworkFile {
    pub pod_network: Option<PodNetworkMode>,
    pub cluster_cidr: Option<ipnet::Ipv4Net>,
    pub node_cidr_size: Option<u8>,
    pub service_cidr: Option<ipnet::Ipv4Net>,
    pub cluster_domain: Option<String>,
}

/// The `[state]` table of the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct StateFile {
    pub write_quorum: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    pub anti_entropy_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub tombstone_horizon: Option<Duration>,
}

/// The `[gossip]` table of the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct GossipFile {
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    pub phi_threshold: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub dead_node_grace_period: Option<Duration>,
}

/// The config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct AgentFile {
    pub name: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub secret_file: Option<PathBuf>,
    pub bind: Option<SocketAddr>,
    pub advertise: Option<SocketAddr>,
    pub api: Option<SocketAddr>,
    pub api_advertise: Option<SocketAddr>,
    pub audit_log_path: Option<PathBuf>,
    #[serde(default)]
    pub join: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<String>,
    #[serde(default)]
    pub gossip: GossipFile,
    #[serde(default)]
    pub state: StateFile,
    #[serde(default)]
    pub scheduling: SchedulingFile,
    #[serde(default)]
    pub kubelet: KubeletFile,
    #[serde(default)]
    pub network: NetworkFile,
}

/// The `[kubelet]` table of the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct KubeletFile {
    #[serde(default, with = "humantime_serde")]
    pub restart_backoff: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub event_ttl: Option<Duration>,
    #[serde(default)]
    pub no_runtime: Option<bool>,
    #[serde(default)]
    pub allow_privileged: Option<bool>,
    #[serde(default)]
    pub pod_pids_limit: Option<u64>,
    #[serde(default)]
    pub max_layer_bytes: Option<u64>,
    #[serde(default)]
    pub max_layer_entries: Option<u64>,
    #[serde(default)]
    pub max_image_bytes: Option<u64>,
    #[serde(default)]
    pub host_path_allow: Option<Vec<PathBuf>>,
    #[serde(default)]
    pub host_path_deny: Option<Vec<PathBuf>>,
    /// A quantity, as `--volume-capacity`.
    #[serde(default)]
    pub volume_capacity: Option<String>,
    #[serde(default)]
    pub insecure_registries: Option<Vec<String>>,
    #[serde(default)]
    pub registry_pulls: Option<crate::images::registry::RegistryPulls>,
    #[serde(default)]
    pub registry_ca: Option<Vec<PathBuf>>,
    #[serde(default)]
    pub registry_config: Option<PathBuf>,
    #[serde(default)]
    pub image_gc_high_threshold: Option<u8>,
    #[serde(default)]
    pub image_gc_low_threshold: Option<u8>,
    #[serde(default, with = "humantime_serde")]
    pub image_minimum_gc_age: Option<Duration>,
}

/// The `[scheduling]` table of the config file.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SchedulingFile {
    #[serde(default, with = "humantime_serde")]
    pub eviction_delay: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub fence_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub hpa_sync_period: Option<Duration>,
}

/// The resolved configuration the agent runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub name: String,
    pub data_dir: PathBuf,
    pub secret_file: PathBuf,
    /// Default `0.0.0.0:7600`.
    pub bind: SocketAddr,
    pub advertise: Option<SocketAddr>,
    /// The Kubernetes API's listen address; none means no API.
    pub api: Option<SocketAddr>,
    pub api_advertise: Option<SocketAddr>,
    /// Where the API's audit log goes; none means no audit log.
    pub audit_log_path: Option<PathBuf>,
    pub join: Vec<String>,
    /// The user's labels (the well-known `kubernetes.io/*` labels are added by the agent).
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<shoal_gossip::NodeTaint>,
    /// Default 200 ms.
    pub gossip_interval: Duration,
    /// Default 6.0: dead after ~6 mean heartbeat intervals of silence (1.2 s at 200 ms).
    pub phi_threshold: f64,
    /// Default 10 min.
    pub dead_node_grace_period: Duration,
    /// Default 2.
    pub write_quorum: usize,
    /// Default 1 s.
    pub anti_entropy_interval: Duration,
    /// Default 24 h.
    pub tombstone_horizon: Duration,
    /// Default 5 s.
    pub eviction_delay: Duration,
    /// Default 5 s.
    pub fence_timeout: Duration,
    /// Default 15 s.
    pub hpa_sync: Duration,
    /// Default 10 s.
    pub restart_backoff: Duration,
    /// Default 1 h.
    pub event_ttl: Duration,
    /// Default false: pods run in containers.
    pub no_runtime: bool,
    /// Default false: extra capabilities, hostPID and hostIPC are refused.
    pub allow_privileged: bool,
    /// Default 4096.
    pub pod_pids_limit: u64,
    /// Default: [`crate::images::layer::LayerLimits::default`].
    pub layer_limits: crate::images::layer::LayerLimits,
    /// Default empty: any host path but the data dir.
    pub host_path_allow: Vec<PathBuf>,
    /// Default empty: only the data dir and the secrets are refused.
    pub host_path_deny: Vec<PathBuf>,
    /// Default none: the size of the data dir's filesystem.
    pub volume_capacity: Option<u64>,
    /// Registries pulled from over plain HTTP besides loopback ones (default none).
    pub insecure_registries: Vec<String>,
    /// Default all.
    pub registry_pulls: crate::images::registry::RegistryPulls,
    /// Default none (the system's roots only).
    pub registry_ca: Vec<PathBuf>,
    /// Default none.
    pub registry_config: Option<PathBuf>,
    /// Default 85 %, 80 %, 2m.
    pub image_gc: shoal_core::image_gc::Thresholds,
    /// Default bridge.
    pub pod_network: PodNetworkMode,
    /// Default false.
    pub cleanup: bool,
    /// Default 10.96.0.0/16.
    pub service_cidr: ipnet::Ipv4Net,
    /// Default cluster.local.
    pub cluster_domain: String,
    /// The cluster CIDR and node block size, checked together (default 10.88.0.0/16, /24).
    pub pod_cidrs: shoal_net::lease::Pool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

/// A Kubernetes quantity of bytes (`20Gi`), for clap and the config file.
fn parse_bytes(text: &str) -> Result<u64, String> {
    shoal_model::quantity::bytes(text).map_err(|e| format!("{text:?}: {e}"))
}

fn invalid(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        message: message.into(),
    }
}

impl AgentFile {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }
}

impl AgentConfig {
    /// Merges the config file (if `flags.config` names one) under the flags, then validates.
    pub fn resolve(flags: &AgentFlags) -> Result<Self, ConfigError> {
        let file = match &flags.config {
            Some(path) => AgentFile::load(path)?,
            None => AgentFile::default(),
        };
        let name = match flags.name.clone().or(file.name) {
            Some(name) => name,
            None => default_node_name()?,
        };
        let labels = match &flags.labels {
            Some(list) => labels::parse_list(list).map_err(|e| invalid("labels", e.to_string()))?,
            None => file.labels,
        };
        let taint_specs: Vec<String> = match &flags.taints {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
            None => file.taints.clone(),
        };
        let taints = taint_specs
            .iter()
            .map(|t| parse_taint(t))
            .collect::<Result<Vec<_>, _>>()?;
        let volume_capacity = match (flags.volume_capacity, &file.kubelet.volume_capacity) {
            (Some(bytes), _) => Some(bytes),
            (None, Some(text)) => {
                Some(parse_bytes(text).map_err(|e| invalid("kubelet.volume-capacity", e))?)
            }
            (None, None) => None,
        };
        let config = AgentConfig {
            volume_capacity,
            taints,
            name,
            data_dir: flags.data_dir.clone().or(file.data_dir).ok_or_else(|| {
                invalid("data-dir", "required (flag --data-dir or config data-dir)")
            })?,
            secret_file: flags
                .secret_file
                .clone()
                .or(file.secret_file)
                .ok_or_else(|| {
                    invalid(
                        "secret-file",
                        "required; create one with `shoal init --secret-file PATH`",
                    )
                })?,
            bind: flags
                .bind
                .or(file.bind)
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))),
            advertise: flags.advertise.or(file.advertise),
            api: flags.api.or(file.api),
            api_advertise: flags.api_advertise.or(file.api_advertise),
            audit_log_path: flags.audit_log_path.clone().or(file.audit_log_path.clone()),
            join: if flags.join.is_empty() {
                file.join
            } else {
                flags.join.clone()
            },
            labels,
            gossip_interval: flags
                .gossip_interval
                .or(file.gossip.interval)
                .unwrap_or(Duration::from_millis(200)),
            phi_threshold: file.gossip.phi_threshold.unwrap_or(6.0),
            dead_node_grace_period: file
                .gossip
                .dead_node_grace_period
                .unwrap_or(Duration::from_secs(600)),
            write_quorum: flags.write_quorum.or(file.state.write_quorum).unwrap_or(2),
            anti_entropy_interval: flags
                .anti_entropy_interval
                .or(file.state.anti_entropy_interval)
                .unwrap_or(Duration::from_secs(1)),
            tombstone_horizon: file
                .state
                .tombstone_horizon
                .unwrap_or(Duration::from_secs(24 * 3600)),
            eviction_delay: flags
                .eviction_delay
                .or(file.scheduling.eviction_delay)
                .unwrap_or(Duration::from_secs(5)),
            fence_timeout: flags
                .fence_timeout
                .or(file.scheduling.fence_timeout)
                .unwrap_or(Duration::from_secs(5)),
            hpa_sync: flags
                .hpa_sync_period
                .or(file.scheduling.hpa_sync_period)
                .filter(|d| !d.is_zero())
                .unwrap_or(Duration::from_secs(15)),
            restart_backoff: flags
                .restart_backoff
                .or(file.kubelet.restart_backoff)
                .unwrap_or(Duration::from_secs(10)),
            event_ttl: flags
                .event_ttl
                .or(file.kubelet.event_ttl)
                .unwrap_or(Duration::from_secs(3600)),
            no_runtime: flags.no_runtime || file.kubelet.no_runtime.unwrap_or(false),
            allow_privileged: flags.allow_privileged
                || file.kubelet.allow_privileged.unwrap_or(false),
            pod_pids_limit: flags
                .pod_pids_limit
                .or(file.kubelet.pod_pids_limit)
                .unwrap_or(4096),
            host_path_allow: if flags.host_path_allow.is_empty() {
                file.kubelet.host_path_allow.clone().unwrap_or_default()
            } else {
                flags.host_path_allow.clone()
            },
            host_path_deny: if flags.host_path_deny.is_empty() {
                file.kubelet.host_path_deny.clone().unwrap_or_default()
            } else {
                flags.host_path_deny.clone()
            },
            insecure_registries: if flags.insecure_registry.is_empty() {
                file.kubelet.insecure_registries.clone().unwrap_or_default()
            } else {
                flags.insecure_registry.clone()
            },
            registry_pulls: flags
                .registry_pulls
                .or(file.kubelet.registry_pulls)
                .unwrap_or_default(),
            registry_ca: if flags.registry_ca.is_empty() {
                file.kubelet.registry_ca.clone().unwrap_or_default()
            } else {
                flags.registry_ca.clone()
            },
            registry_config: flags
                .registry_config
                .clone()
                .or_else(|| file.kubelet.registry_config.clone()),
            image_gc: {
                let default = shoal_core::image_gc::Thresholds::default();
                shoal_core::image_gc::Thresholds {
                    high_percent: flags
                        .image_gc_high_threshold
                        .or(file.kubelet.image_gc_high_threshold)
                        .unwrap_or(default.high_percent),
                    low_percent: flags
                        .image_gc_low_threshold
                        .or(file.kubelet.image_gc_low_threshold)
                        .unwrap_or(default.low_percent),
                    min_age_ms: flags
                        .image_minimum_gc_age
                        .or(file.kubelet.image_minimum_gc_age)
                        .map_or(default.min_age_ms, |d| d.as_millis() as u64),
                }
            },
            cleanup: flags.cleanup,
            service_cidr: flags
                .service_cidr
                .or(file.network.service_cidr)
                .unwrap_or_else(|| {
                    shoal_model::service_ip::DEFAULT_SERVICE_CIDR
                        .parse()
                        .expect("the default parses")
                }),
            cluster_domain: flags
                .cluster_domain
                .clone()
                .or(file.network.cluster_domain.clone())
                .unwrap_or_else(|| "cluster.local".to_owned()),
            pod_network: flags
                .pod_network
                .or(file.network.pod_network)
                .unwrap_or_default(),
            pod_cidrs: {
                let cluster = flags
                    .cluster_cidr
                    .or(file.network.cluster_cidr)
                    .unwrap_or_else(|| {
                        shoal_net::DEFAULT_CLUSTER_CIDR
                            .parse()
                            .expect("the default parses")
                    });
                let size = flags
                    .node_cidr_size
                    .or(file.network.node_cidr_size)
                    .unwrap_or(shoal_net::DEFAULT_NODE_CIDR_SIZE);
                shoal_net::lease::Pool::new(cluster, size)
                    .map_err(|e| invalid("network.cluster-cidr", e.to_string()))?
            },
            layer_limits: {
                let default = crate::images::layer::LayerLimits::default();
                crate::images::layer::LayerLimits {
                    max_bytes: flags
                        .max_layer_bytes
                        .or(file.kubelet.max_layer_bytes)
                        .unwrap_or(default.max_bytes),
                    max_entries: flags
                        .max_layer_entries
                        .or(file.kubelet.max_layer_entries)
                        .unwrap_or(default.max_entries),
                    max_image_bytes: flags
                        .max_image_bytes
                        .or(file.kubelet.max_image_bytes)
                        .unwrap_or(default.max_image_bytes),
                }
            },
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        labels::check_dns_subdomain(&self.name).map_err(|m| invalid("name", m.to_string()))?;
        labels::validate(&self.labels).map_err(|e| invalid("labels", e.to_string()))?;
        if let Some(key) = self.labels.keys().find(|k| k.starts_with("kubernetes.io/")) {
            return Err(invalid(
                "labels",
                format!(
                    "{key}: the kubernetes.io/ prefix is reserved; the agent sets these labels itself"
                ),
            ));
        }
        if let Some(advertise) = self.advertise
            && (advertise.ip().is_unspecified() || advertise.port() == 0)
        {
            return Err(invalid(
                "advertise",
                format!("{advertise} is not an address peers can reach"),
            ));
        }
        if self.gossip_interval < Duration::from_millis(10)
            || self.gossip_interval > Duration::from_secs(60)
        {
            return Err(invalid("gossip.interval", "must be between 10ms and 60s"));
        }
        if !(self.phi_threshold.is_finite() && self.phi_threshold >= 1.0) {
            return Err(invalid("gossip.phi-threshold", "must be a number >= 1"));
        }
        if self.write_quorum == 0 {
            return Err(invalid("state.write-quorum", "must be at least 1"));
        }
        self.image_gc
            .check()
            .map_err(|m| invalid("kubelet.image-gc-high-threshold", m))?;
        if self.anti_entropy_interval < Duration::from_millis(10) {
            return Err(invalid(
                "state.anti-entropy-interval",
                "must be at least 10ms",
            ));
        }
        if self.tombstone_horizon < Duration::from_secs(60) {
            return Err(invalid("state.tombstone-horizon", "must be at least 1m"));
        }
        for (field, list) in [
            ("kubelet.host-path-allow", &self.host_path_allow),
            ("kubelet.host-path-deny", &self.host_path_deny),
        ] {
            if let Some(bad) = list.iter().find(|p| !p.is_absolute()) {
                return Err(invalid(
                    field,
                    format!("{} is not an absolute path", bad.display()),
                ));
            }
        }
        if let Err(e) = shoal_model::service_ip::check(
            self.service_cidr,
            std::net::Ipv4Addr::from(u32::from(self.service_cidr.network()) + 2),
        ) {
            return Err(invalid("network.service-cidr", e.to_string()));
        }
        if self.service_cidr.trunc() != self.service_cidr {
            return Err(invalid(
                "network.service-cidr",
                format!("{} is not a network address", self.service_cidr),
            ));
        }
        if self
            .cluster_domain
            .split('.')
            .any(|l| labels::check_dns_label(l).is_err())
        {
            return Err(invalid(
                "network.cluster-domain",
                "must be DNS labels joined by dots, like cluster.local",
            ));
        }
        if self.pod_pids_limit < 16 {
            return Err(invalid("kubelet.pod-pids-limit", "must be at least 16"));
        }
        if self.layer_limits.max_bytes == 0
            || self.layer_limits.max_entries == 0
            || self.layer_limits.max_image_bytes == 0
        {
            return Err(invalid(
                "kubelet.max-layer-bytes",
                "layer limits must be greater than 0",
            ));
        }
        for seed in &self.join {
            if !seed.contains(':') {
                return Err(invalid("join", format!("{seed:?} is not HOST:PORT")));
            }
        }
        Ok(())
    }
}

/// `key=value:Effect` or `key:Effect`.
fn parse_taint(spec: &str) -> Result<shoal_gossip::NodeTaint, ConfigError> {
    let (kv, effect) = spec
        .rsplit_once(':')
        .ok_or_else(|| invalid("taints", format!("{spec:?}: expected key=value:Effect")))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(invalid(
            "taints",
            format!("{spec:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute"),
        ));
    }
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    labels::validate_key(key).map_err(|e| invalid("taints", e.to_string()))?;
    if !value.is_empty() {
        labels::validate_value(key, value).map_err(|e| invalid("taints", e.to_string()))?;
    }
    Ok(shoal_gossip::NodeTaint {
        key: key.to_owned(),
        value: value.to_owned(),
        effect: effect.to_owned(),
    })
}

fn default_node_name() -> Result<String, ConfigError> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .map_err(|e| {
            invalid(
                "name",
                format!("not given and the host name is unreadable: {e}"),
            )
        })?;
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> AgentFlags {
        AgentFlags {
            name: Some("n1".into()),
            data_dir: Some("/tmp/x".into()),
            secret_file: Some("/tmp/s".into()),
            ..Default::default()
        }
    }

    #[test]
    fn defaults() {
        let c = AgentConfig::resolve(&flags()).unwrap();
        assert_eq!(c.bind.port(), DEFAULT_PORT);
        assert_eq!(c.gossip_interval, Duration::from_millis(200));
        assert!(c.labels.is_empty());
    }

    #[test]
    fn file_values_are_overridden_by_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shoal.toml");
        std::fs::write(
            &path,
            r#"
            name = "from-file"
            data-dir = "/var/lib/shoal"
            secret-file = "/etc/shoal/secret"
            bind = "127.0.0.1:7000"
            join = ["127.0.0.1:7001"]
            labels = { zone = "a" }
            [gossip]
            interval = "100ms"
            dead-node-grace-period = "5m"
            [network]
            pod-network = "none"
            cluster-cidr = "10.200.0.0/16"
            node-cidr-size = 26
            service-cidr = "10.201.0.0/20"
            cluster-domain = "shoal.test"
            [kubelet]
            insecure-registries = ["reg.lan:5000"]
            registry-pulls = "local"
            registry-ca = ["/etc/shoal/reg-ca.pem"]
            "#,
        )
        .unwrap();
        let mut f = AgentFlags {
            config: Some(path.clone()),
            ..Default::default()
        };
        let c = AgentConfig::resolve(&f).unwrap();
        assert_eq!(c.name, "from-file");
        assert_eq!(c.gossip_interval, Duration::from_millis(100));
        assert_eq!(c.dead_node_grace_period, Duration::from_secs(300));
        assert_eq!(c.labels["zone"], "a");
        assert_eq!(c.pod_network, PodNetworkMode::None);
        assert_eq!(c.pod_cidrs.cluster().to_string(), "10.200.0.0/16");
        assert_eq!(c.pod_cidrs.node_prefix(), 26);
        assert_eq!(c.service_cidr.to_string(), "10.201.0.0/20");
        assert_eq!(c.cluster_domain, "shoal.test");
        assert_eq!(c.insecure_registries, ["reg.lan:5000"]);
        assert_eq!(
            c.registry_pulls,
            crate::images::registry::RegistryPulls::Local
        );
        assert_eq!(c.registry_ca, [PathBuf::from("/etc/shoal/reg-ca.pem")]);
        f.name = Some("from-flag".into());
        f.insecure_registry = vec!["mirror.lan".into()];
        f.labels = Some("zone=b".into());
        let c = AgentConfig::resolve(&f).unwrap();
        assert_eq!(c.name, "from-flag");
        assert_eq!(c.labels["zone"], "b");
        assert_eq!(c.insecure_registries, ["mirror.lan"]);
    }

    #[test]
    fn errors_name_the_field() {
        let cases: Vec<(AgentFlags, &str)> = vec![
            (
                AgentFlags {
                    name: Some("Bad_Name".into()),
                    ..flags()
                },
                "name:",
            ),
            (
                AgentFlags {
                    data_dir: None,
                    ..flags()
                },
                "data-dir:",
            ),
            (
                AgentFlags {
                    secret_file: None,
                    ..flags()
                },
                "secret-file:",
            ),
            (
                AgentFlags {
                    labels: Some("a=b c".into()),
                    ..flags()
                },
                "labels:",
            ),
            (
                AgentFlags {
                    labels: Some("kubernetes.io/os=x".into()),
                    ..flags()
                },
                "reserved",
            ),
            (
                AgentFlags {
                    advertise: Some("0.0.0.0:1".parse().unwrap()),
                    ..flags()
                },
                "advertise:",
            ),
            (
                AgentFlags {
                    join: vec!["nohost".into()],
                    ..flags()
                },
                "join:",
            ),
            (
                AgentFlags {
                    gossip_interval: Some(Duration::from_millis(1)),
                    ..flags()
                },
                "gossip.interval:",
            ),
            (
                AgentFlags {
                    cluster_cidr: Some("10.88.0.0/16".parse().unwrap()),
                    node_cidr_size: Some(12),
                    ..flags()
                },
                "network.cluster-cidr:",
            ),
            (
                AgentFlags {
                    service_cidr: Some("10.96.0.0/30".parse().unwrap()),
                    ..flags()
                },
                "network.service-cidr:",
            ),
            (
                AgentFlags {
                    cluster_domain: Some("Bad_Domain".into()),
                    ..flags()
                },
                "network.cluster-domain:",
            ),
        ];
        for (f, expected) in cases {
            let err = AgentConfig::resolve(&f).unwrap_err().to_string();
            assert!(err.contains(expected), "expected {expected:?} in {err:?}");
        }
    }

    #[test]
    fn unknown_file_fields_are_rejected_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shoal.toml");
        std::fs::write(&path, "nmae = \"typo\"\n").unwrap();
        let f = AgentFlags {
            config: Some(path),
            ..flags()
        };
        let err = AgentConfig::resolve(&f).unwrap_err().to_string();
        assert!(err.contains("shoal.toml") && err.contains("nmae"), "{err}");
    }
}

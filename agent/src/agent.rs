//! Running an agent: identity, endpoint, membership and the control socket, until a signal.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;

use shoal_gossip::{
    ClusterIdentity, ClusterSecret, EndpointError, IdentityError, Membership, MembershipConfig,
    MembershipError, NodeAddresses, NodeMeta, PeerEndpoint, PeerEndpointConfig, QuicTransport,
    SecretError,
};
use shoal_state::{Store, StoreConfig, StoreError};
use tracing::info;

use crate::config::AgentConfig;
use crate::control::{self, ControlSocket, SelfInfo};
use crate::host;
use crate::node_identity::{NodeIdentity, NodeIdentityError};
use crate::paths;
use crate::replication::{Replication, ReplicationConfig};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot create data dir {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("another agent is running with data dir {path} (it holds {lock})")]
    AlreadyRunning { path: PathBuf, lock: PathBuf },
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    ServiceAccountKey(#[from] crate::tokens::KeyError),
    #[error("audit log {path}: {source}")]
    AuditLog {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    NodeIdentity(#[from] NodeIdentityError),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error(transparent)]
    Membership(#[from] MembershipError),
    #[error(
        "advertise: the endpoint is bound to {bound}, which peers cannot dial; set --advertise IP:PORT"
    )]
    NoAdvertiseAddress { bound: std::net::SocketAddr },
    #[error("cannot read host capacity: {0}")]
    Host(std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("api: cannot listen on {addr}: {source}")]
    Api {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("container runtime: {0} (or start the agent with --no-runtime)")]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error(transparent)]
    Images(#[from] crate::images::ImageError),
    #[error(transparent)]
    Registry(#[from] crate::images::registry::RegistryError),
    #[error("control socket {path}: {source}")]
    ControlSocket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "name {name:?} is already held by live node {node_id} at {addr}: give this node another --name (or stop that one)"
    )]
    NameTaken {
        name: String,
        node_id: String,
        addr: std::net::SocketAddr,
    },
}

/// Refuses to run under a name a live node already holds (two Nodes of one name would confuse
/// the API, scheduling and every controller). Waits for peers' metadata first: until every
/// peer heard of has published its metadata and been judged (no longer `joining`), or three
/// gossip rounds after the first peer is heard of, at most 10 s.
async fn ensure_unique_name(
    membership: &shoal_gossip::Membership,
    name: &str,
    interval: std::time::Duration,
) -> Result<(), AgentError> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let step = (interval / 8).max(std::time::Duration::from_millis(5));
    let mut heard_at = None;
    loop {
        let members = membership.members().await;
        if let Some(holder) = members.iter().find(|m| {
            !m.is_self
                && m.node_id != membership.node_id()
                && m.state == shoal_gossip::MemberState::Alive
                && m.meta.as_ref().is_some_and(|meta| meta.name == name)
        }) {
            return Err(AgentError::NameTaken {
                name: name.to_owned(),
                node_id: holder.node_id.clone(),
                addr: holder.gossip_addr,
            });
        }
        let mut peers = members.iter().filter(|m| !m.is_self).peekable();
        let now = tokio::time::Instant::now();
        if peers.peek().is_some() {
            let heard_at = *heard_at.get_or_insert(now);
            let all_judged =
                peers.all(|m| m.meta.is_some() && m.state != shoal_gossip::MemberState::Joining);
            if all_judged || now >= heard_at + interval * 3 {
                return Ok(());
            }
        }
        if now >= deadline {
            return Ok(());
        }
        tokio::time::sleep(step).await;
    }
}

/// Holds an exclusive `flock` on the data dir's lock file for the agent's lifetime.
struct DataDirLock {
    _lock: nix::fcntl::Flock<File>,
}

impl DataDirLock {
    fn acquire(config: &AgentConfig) -> Result<Self, AgentError> {
        let dir = &config.data_dir;
        let data_dir_err = |source| AgentError::DataDir {
            path: dir.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(data_dir_err)?;
        // 0700 whoever created it (`shoal image import` may have, with the umask's mode): the
        // data dir holds pod volumes, secrets and the node's keys.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(data_dir_err)?;
        let lock = paths::lock(dir);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|source| AgentError::DataDir {
                path: lock.clone(),
                source,
            })?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| AgentError::AlreadyRunning {
                path: dir.clone(),
                lock,
            })?;
        Ok(Self { _lock: lock })
    }
}

/// Runs the agent until SIGINT or SIGTERM.
pub async fn run(config: AgentConfig) -> Result<(), AgentError> {
    // The registry config is read first: a mistake in it stops the agent before it joins.
    let mut registries = crate::images::registry::Registries {
        pulls: config.registry_pulls,
        insecure: config.insecure_registries.clone(),
        ca_files: config.registry_ca.clone(),
        ..Default::default()
    };
    if let Some(path) = &config.registry_config {
        registries.load_config(path)?;
    }
    let _lock = DataDirLock::acquire(&config)?;
    #[cfg(debug_assertions)]
    if crate::fault_injection::enabled() {
        tracing::warn!(
            "fault injection is on ({}): this agent acknowledges writes annotated {} and stores them nowhere",
            crate::fault_injection::ENV,
            crate::fault_injection::DROP_ANNOTATION
        );
    }
    let secret = ClusterSecret::load_file(&config.secret_file)?;
    let identity = ClusterIdentity::derive(&secret)?;
    let node = NodeIdentity::load_and_bump(&config.data_dir, &config.name)?;
    let tokens = Arc::new(crate::tokens::Tokens::new(
        crate::tokens::Signer::load_or_create(
            &config.data_dir,
            crate::tokens::issuer_url(&config.cluster_domain),
        )?,
    ));
    let certificate = identity.issue_node_certificate(&node.node_id, &[])?;

    let mut endpoint_config = PeerEndpointConfig::new(config.bind);
    endpoint_config.keep_alive = config
        .gossip_interval
        .max(std::time::Duration::from_millis(500));
    let endpoint = PeerEndpoint::bind(&identity, &certificate, endpoint_config)?;
    let bound = endpoint.local_addr();
    let advertise = config.advertise.unwrap_or(bound);
    if advertise.ip().is_unspecified() {
        return Err(AgentError::NoAdvertiseAddress { bound });
    }

    let api_listener = match config.api {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| AgentError::Api { addr, source })?,
        ),
        None => None,
    };
    let api_advertise = match (&api_listener, config.api_advertise) {
        (_, Some(addr)) => Some(addr),
        (Some(listener), None) => {
            let bound = listener.local_addr().map_err(|source| AgentError::Api {
                addr: config.api.expect("bound"),
                source,
            })?;
            Some(if bound.ip().is_unspecified() {
                std::net::SocketAddr::new(advertise.ip(), bound.port())
            } else {
                bound
            })
        }
        (None, None) => None,
    };
    let runtime = if config.no_runtime {
        None
    } else {
        Some(crate::runtime::Runtime::new(&config.data_dir)?)
    };
    // One IP per pod from this node's block of the cluster CIDR (`--pod-network bridge`).
    let bridge = match (&runtime, config.pod_network) {
        (Some(runtime), crate::config::PodNetworkMode::Bridge) => {
            let uplink = match advertise.ip() {
                std::net::IpAddr::V4(ip) => Some(ip),
                std::net::IpAddr::V6(_) => None,
            };
            Some(Arc::new(shoal_net::linux::BridgeNetwork::new(
                runtime.scope(),
                uplink,
            )))
        }
        _ => None,
    };
    let runtime = match (runtime, &bridge) {
        (Some(runtime), Some(bridge)) => Some(runtime.with_network(bridge.clone())),
        (runtime, _) => runtime,
    }
    .map(|r| {
        r.with_cluster_domain(&config.cluster_domain)
            .with_fence_timeout(config.fence_timeout)
            .with_host_paths(crate::runtime::HostPathPolicy {
                allow: config.host_path_allow.clone(),
                deny: config
                    .host_path_deny
                    .iter()
                    .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
                    .collect(),
                protected: std::iter::once(&config.secret_file)
                    .chain(&registries.credential_files)
                    .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
                    .collect(),
            })
    });
    let runtime_scope = runtime.as_ref().map(|r| r.scope().to_owned());
    let mut labels = config.labels.clone();
    labels.extend(host::well_known_labels(&config.name));
    let meta = NodeMeta {
        name: config.name.clone(),
        labels,
        addresses: NodeAddresses {
            gossip: advertise,
            api: api_advertise,
        },
        capacity: shoal_gossip::Capacity {
            // Only a node that runs pods provisions their volumes.
            volume_bytes: match &runtime {
                Some(_) => Some(
                    host::volume_capacity(&config.data_dir, config.volume_capacity)
                        .map_err(AgentError::Host)?,
                ),
                None => None,
            },
            ..host::detect_capacity(host::DEFAULT_MAX_PODS).map_err(AgentError::Host)?
        },
        agent_version: crate::AGENT_VERSION.to_owned(),
        info: Some(shoal_gossip::NodeInfo {
            container_runtime: runtime
                .as_ref()
                .map(|r| r.runtime_version())
                .unwrap_or_default(),
            ..host::node_info(&node.node_id)
        }),
        taints: config.taints.clone(),
    };
    let mut membership_config = MembershipConfig::new(
        node.node_id.clone(),
        node.generation,
        identity.cluster_id(),
        advertise,
    );
    membership_config.listen_addr = bound;
    membership_config.seeds = config.join.clone();
    membership_config.gossip_interval = config.gossip_interval;
    membership_config.phi_threshold = config.phi_threshold;
    membership_config.dead_node_grace_period = config.dead_node_grace_period;
    // Named nodes are remembered as long as chitchat keeps dead ones (and then some).
    let transport = QuicTransport::new(
        endpoint.clone(),
        &node.node_id,
        node.generation,
        config.dead_node_grace_period * 2,
    );
    let membership = Arc::new(Membership::start(membership_config, &meta, &transport).await?);
    if !config.join.is_empty() {
        ensure_unique_name(&membership, &config.name, config.gossip_interval).await?;
    }

    let store_path = paths::store(&config.data_dir);
    let mut store_config = StoreConfig::new(&store_path, node.numeric_id());
    store_config.tombstone_horizon = config.tombstone_horizon;
    // Group commit by a writer thread (`Replication::start`), outside the store's lock.
    store_config.write_behind = Some(Arc::default());
    let store = Store::open(store_config)?;
    info!(path = %store_path.display(), objects = store.len(), resource_version = store.resource_version(), "desired-state store opened");
    let replication = Replication::new(
        store,
        endpoint.clone(),
        membership.clone(),
        ReplicationConfig {
            write_quorum: config.write_quorum,
            expected_members: if config.join.is_empty() { 1 } else { 2 },
            anti_entropy_interval: config.anti_entropy_interval,
            ..ReplicationConfig::default()
        },
    );
    replication.start()?;
    let node_network = if let (Some(runtime), Some(bridge)) = (&runtime, &bridge) {
        let network = crate::network::NodeNetwork::new(
            config.pod_cidrs,
            bridge.clone(),
            runtime.clone(),
            replication.clone(),
            membership.clone(),
            node.node_id.clone(),
            config.name.clone(),
            advertise.ip(),
        );
        network.start();
        Some(network)
    } else {
        None
    };
    let events = Arc::new(crate::observed::events::Recorder::new(
        &config.name,
        config.event_ttl,
        crate::observed::events::MAX_PER_NAMESPACE,
    ));
    {
        let (events, membership, name) = (events.clone(), membership.clone(), config.name.clone());
        crate::supervise::spawn("node-events", move || {
            crate::observed::events::follow_nodes(events.clone(), membership.clone(), name.clone())
        });
    }
    let pod_statuses = Arc::new(crate::observed::pod_status::PodStatusCache::default());
    {
        let (statuses, membership) = (pod_statuses.clone(), membership.clone());
        crate::supervise::spawn("pod-statuses", move || {
            statuses
                .clone()
                .follow(membership.clone(), std::time::Duration::from_millis(100))
        });
    }
    let scheduling = crate::scheduling::Scheduling::new(
        node.numeric_id(),
        replication.clone(),
        membership.clone(),
        endpoint.clone(),
        crate::scheduling::SchedulingConfig {
            eviction_delay: config.eviction_delay,
            // Detection bound: twice what the phi threshold needs at a steady heartbeat.
            fence: shoal_core::placement::partition::FenceConfig::new(
                config.gossip_interval.mul_f64(config.phi_threshold * 2.0),
                config.fence_timeout,
            ),
            ..Default::default()
        },
        events.clone(),
        pod_statuses.clone(),
    );
    scheduling.start()?;
    let service_plane = if let Some(bridge) = &bridge {
        let name = bridge.bridge_name().to_owned();
        let bridge = bridge.clone();
        Some(crate::services::start(
            replication.clone(),
            pod_statuses.clone(),
            config.cluster_domain.clone(),
            move || bridge.gateway(),
            crate::services::PlaneNetwork {
                table: shoal_net::nft::table_name(runtime_scope.as_deref().unwrap_or("")),
                cluster: config.pod_cidrs.cluster(),
                bridge: name,
            },
            config.name.clone(),
            membership.clone(),
        ))
    } else {
        None
    };
    let images = if config.no_runtime {
        None
    } else {
        Some(
            crate::images::ImageStore::open(paths::images(&config.data_dir))?
                .with_layer_limits(config.layer_limits),
        )
    };
    let runtime_for_cleanup = runtime.clone();
    let kubelet = if let (Some(images), Some(runtime)) = (images.clone(), runtime) {
        let puller = crate::kubelet::image_puller::ImagePuller::new(
            images.clone(),
            membership.clone(),
            endpoint.clone(),
            registries,
        );
        puller.start();
        let kubelet = crate::kubelet::Kubelet::new(
            config.name.clone(),
            advertise.ip().to_string(),
            Arc::new(runtime),
            images,
            replication.clone(),
            membership.clone(),
            scheduling.clone(),
            pod_statuses.clone(),
            puller,
            events.clone(),
            crate::kubelet::KubeletConfig {
                worker: shoal_core::pod::worker::WorkerConfig {
                    backoff_base_ms: config.restart_backoff.as_millis() as u64,
                    ..Default::default()
                },
                allow_privileged: config.allow_privileged,
                pod_pids_limit: Some(config.pod_pids_limit),
                allocatable: shoal_model::placement::Resources::new(
                    meta.capacity.cpu_millis,
                    meta.capacity.memory_bytes,
                    u64::from(meta.capacity.pods),
                ),
                image_gc: config.image_gc,
                tokens: Some(tokens.clone()),
                ..Default::default()
            },
        );
        kubelet.start();
        crate::storage::Binder::new(
            config.name.clone(),
            config.data_dir.clone(),
            replication.clone(),
            events.clone(),
        )
        .start();
        Some(kubelet)
    } else {
        info!("--no-runtime: this node runs no pods");
        None
    };
    let logs = crate::kubelet::node_service::NodeService::new(
        kubelet.clone(),
        images,
        membership.clone(),
        endpoint.clone(),
        config.name.clone(),
        events.clone(),
    );
    logs.start()?;
    crate::controllers::Controllers::new(
        node.numeric_id(),
        replication.clone(),
        membership.clone(),
        pod_statuses.clone(),
        crate::controllers::ControllerConfig {
            service_cidr: config.service_cidr,
            hpa_sync: config.hpa_sync,
            published: crate::controllers::Published {
                root_ca: identity.ca_certificate_pem().to_owned(),
                token_key: Some(tokens.signer.key_object(&config.name)),
            },
            ..Default::default()
        },
        events.clone(),
        Some(logs.clone()),
    )
    .start();

    let socket_path = paths::control_socket(&config.data_dir);
    let socket = ControlSocket::bind(&socket_path).map_err(|source| AgentError::ControlSocket {
        path: socket_path.clone(),
        source,
    })?;
    let self_info = SelfInfo {
        node_id: node.node_id.clone(),
        name: config.name.clone(),
        generation: node.generation,
        gossip_addr: advertise,
        cluster_id: identity.cluster_id().to_owned(),
        agent_version: crate::AGENT_VERSION.to_owned(),
        pid: std::process::id(),
    };
    let (api_stop_tx, api_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let kubeconfig = api_advertise.map(|addr| control::KubeconfigInfo {
        server: format!("https://{addr}"),
        ca_pem: identity.ca_certificate_pem().to_owned(),
        token: identity.api_token().to_owned(),
        cluster_id: identity.cluster_id().to_owned(),
    });
    // The Kubernetes API's state: served on its listener (when there is one), and the control
    // socket's object writes and deletes go through the same path.
    let authz = Arc::new(crate::api::authz::Cache::default());
    authz.follow(&replication);
    let api_state =
        crate::api::ApiState {
            replication: replication.clone(),
            membership: membership.clone(),
            scheduling: scheduling.clone(),
            pod_statuses: pod_statuses.clone(),
            logs: logs.clone(),
            token: identity.api_token().into(),
            tokens: tokens.clone(),
            authz,
            audit: match &config.audit_log_path {
                Some(path) => Some(crate::api::audit::Log::open(path).map_err(|source| {
                    AgentError::AuditLog {
                        path: path.clone(),
                        source,
                    }
                })?),
                None => None,
            },
            server_address: api_advertise.map(|a| a.to_string()).unwrap_or_default(),
            service_cidr: config.service_cidr,
        };
    if let (Some(listener), Some(addr)) = (api_listener, api_advertise) {
        let mut names = vec![
            addr.ip().to_string(),
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
            config.name.clone(),
        ];
        if let Some(bind) = config.api.filter(|a| !a.ip().is_unspecified()) {
            names.push(bind.ip().to_string());
        }
        // Reached from pods as the `kubernetes` Service: its address and names.
        let domain = &config.cluster_domain;
        names.push(
            std::net::Ipv4Addr::from(u32::from(config.service_cidr.network()) + 1).to_string(),
        );
        names.extend(
            ["kubernetes", "kubernetes.default", "kubernetes.default.svc"].map(str::to_owned),
        );
        names.push(format!("kubernetes.default.svc.{domain}"));
        names.dedup();
        let api_cert = identity.issue_node_certificate(&node.node_id, &names)?;
        let tls = identity.api_server_config(&api_cert)?;
        info!(%addr, "Kubernetes API listening");
        tokio::spawn(crate::api::serve(
            listener,
            tls,
            crate::api::router(api_state.clone()),
            crate::api::ConnectionLimits::default(),
            async move {
                let _ = api_stop_rx.await;
            },
        ));
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(socket.serve(
        control::router(api_state, self_info, kubeconfig),
        async move {
            let _ = stop_rx.await;
        },
    ));
    info!(
        name = %config.name, id = %node.node_id, generation = node.generation,
        addr = %advertise, cluster = identity.cluster_id(), seeds = ?config.join,
        "agent started"
    );

    wait_for_signal().await;
    info!("shutting down");
    if config.cleanup {
        if let Some(kubelet) = kubelet.clone() {
            let _ = tokio::task::spawn_blocking(move || {
                kubelet.stop(std::time::Duration::from_secs(30))
            })
            .await;
        }
        if let Some(plane) = &service_plane {
            plane.cleanup().await;
        }
        cleanup(runtime_for_cleanup, node_network.as_deref()).await;
    }
    let _ = stop_tx.send(());
    let _ = api_stop_tx.send(());
    membership.shutdown().await;
    endpoint.shutdown().await;
    // Graceful shutdown waits for open requests; a follower of /v1/watch never ends its own.
    match tokio::time::timeout(std::time::Duration::from_secs(2), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(source))) => {
            return Err(AgentError::ControlSocket {
                path: socket_path,
                source,
            });
        }
        Ok(Err(join)) => tracing::warn!(error = %join, "control server task failed"),
        Err(_) => info!("closing control connections still open after 2 s"),
    }
    Ok(())
}

/// `--cleanup`: this node's pods, its pod network on the host and its lease go.
async fn cleanup(
    runtime: Option<crate::runtime::Runtime>,
    network: Option<&crate::network::NodeNetwork>,
) {
    if let Some(runtime) = runtime {
        match tokio::task::spawn_blocking(move || runtime.reset()).await {
            Ok(Ok(n)) => info!(pods = n, "--cleanup: pods removed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "--cleanup: removing pods"),
            Err(e) => tracing::warn!(error = %e, "--cleanup"),
        }
    }
    if let Some(network) = network {
        network.cleanup().await;
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

//! Services on this node: the DNS server for its pods (`shoal_net::dns`), listening on the
//! bridge's address (every pod's gateway, and the nameserver of its resolv.conf), and the
//! nftables table that load-balances ClusterIPs to ready endpoints (`shoal_net::nft`). Both
//! are rebuilt from the Services and endpoints this agent derives (`crate::endpoints`)
//! whenever those change: no controller, no store writes, the same answer on every node.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::PoisonError;
use std::time::Duration;

use shoal_net::dns::{DnsEndpoint, DnsPort, DnsService, Records};
use tracing::{info, warn};

use crate::endpoints::Backend;
use crate::observed::pod_status::PodStatusCache;
use crate::replication::Replication;

/// The ClusterIP ports of one Service and the endpoints each leads to: ready ones, or when
/// none is ready those still serving while they terminate (as kube-proxy falls back).
pub fn service_ports(
    service: &serde_json::Value,
    backends: &[Backend],
) -> Vec<shoal_net::nft::ServicePort> {
    let Some(cluster_ip) = service["spec"]["clusterIP"]
        .as_str()
        .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
    else {
        return Vec::new();
    };
    let any_ready = backends.iter().any(|b| b.ready);
    let chosen: Vec<&Backend> = backends
        .iter()
        .filter(|b| {
            if any_ready {
                b.ready
            } else {
                b.serving && b.terminating
            }
        })
        .collect();
    service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let name = p["name"].as_str().unwrap_or_default();
            let protocol = p["protocol"].as_str().unwrap_or("TCP");
            let port = u16::try_from(p["port"].as_u64()?).ok()?;
            let mut endpoints: Vec<(Ipv4Addr, u16)> = chosen
                .iter()
                .filter_map(|b| {
                    let target = b
                        .ports
                        .iter()
                        .find(|e| e.name == name && e.protocol == protocol)?;
                    Some((b.ip.parse().ok()?, target.port))
                })
                .collect();
            endpoints.sort();
            endpoints.dedup();
            let node_port = shoal_core::controllers::service_ip::wants_node_ports(service)
                .then(|| p["nodePort"].as_u64().and_then(|n| u16::try_from(n).ok()))
                .flatten();
            let affinity_seconds = (service["spec"]["sessionAffinity"] == "ClientIP").then(|| {
                service["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"]
                    .as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .filter(|t| (1..=86_400).contains(t))
                    .unwrap_or(10_800)
            });
            Some(shoal_net::nft::ServicePort {
                affinity_seconds,
                node_port,
                cluster_ip,
                port,
                protocol: protocol.to_ascii_lowercase(),
                endpoints,
            })
        })
        .collect()
}

/// The host ports this node serves: those of the pods it runs on the pod network — its own
/// published status (`status_here`) has their IP and they have not ended — each
/// (hostIP or every address, port, protocol) to the pod's IP and container port. Pods on the
/// host's network bind their ports themselves; IPv6 hostIPs are left out (the table is IPv4).
pub fn host_port_rules(
    pods: &[serde_json::Value],
    status_here: impl Fn(&str) -> Option<serde_json::Value>,
) -> Vec<shoal_net::nft::HostPortRule> {
    let mut rules = Vec::new();
    for pod in pods {
        let spec = &pod["spec"];
        if spec["hostNetwork"] == true {
            continue;
        }
        let Ok(mappings) = shoal_model::placement::port_mappings(spec) else {
            continue;
        };
        if mappings.is_empty() {
            continue;
        }
        let Some(status) = pod["metadata"]["uid"].as_str().and_then(&status_here) else {
            continue;
        };
        if matches!(status["phase"].as_str(), Some("Succeeded" | "Failed")) {
            continue;
        }
        let Some(pod_ip) = status["podIP"].as_str().and_then(|ip| ip.parse().ok()) else {
            continue;
        };
        for (host, container_port) in mappings {
            let host_ip = match host.ip {
                None => None,
                Some(std::net::IpAddr::V4(ip)) => Some(ip),
                Some(std::net::IpAddr::V6(_)) => continue,
            };
            rules.push(shoal_net::nft::HostPortRule {
                host_ip,
                port: host.port,
                protocol: host.protocol.to_ascii_lowercase(),
                pod_ip,
                container_port,
            });
        }
    }
    rules.sort();
    rules
}

/// How often the record set is compared with the store and the pods' statuses.
const REFRESH: Duration = Duration::from_millis(100);

/// The DNS view of one Service and its backends.
pub fn dns_service(service: &serde_json::Value, backends: &[Backend]) -> DnsService {
    let spec = &service["spec"];
    let cluster_ip = spec["clusterIP"].as_str().unwrap_or_default();
    DnsService {
        namespace: service["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned(),
        name: service["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        cluster_ip: cluster_ip.parse().ok(),
        headless: cluster_ip == "None",
        ports: spec["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some(DnsPort {
                    name: p["name"].as_str().unwrap_or_default().to_owned(),
                    protocol: p["protocol"].as_str().unwrap_or("TCP").to_owned(),
                    port: u16::try_from(p["port"].as_u64()?).ok()?,
                })
            })
            .collect(),
        endpoints: backends
            .iter()
            .filter_map(|b| {
                Some(DnsEndpoint {
                    ip: b.ip.parse().ok()?,
                    hostname: b.hostname.clone(),
                    ready: b.ready,
                })
            })
            .collect(),
    }
}

/// The running service plane; [`ServicePlane::cleanup`] stops it and removes its table.
pub struct ServicePlane {
    stop: tokio::sync::watch::Sender<bool>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    table: String,
}

impl ServicePlane {
    /// Stops the loop and the DNS server, then removes the nftables table.
    pub async fn cleanup(&self) {
        self.stop.send_replace(true);
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let table = self.table.clone();
        match tokio::task::spawn_blocking(move || shoal_net::nft::delete_table(&table)).await {
            Ok(Ok(())) => info!(table = %self.table, "--cleanup: service rules removed"),
            Ok(Err(e)) => warn!(error = %e, "--cleanup: removing the service rules"),
            Err(e) => warn!(error = %e, "--cleanup"),
        }
    }
}

/// Where the service plane's rules go: the agent's nftables table, the pods' cluster CIDR,
/// and the pods' bridge.
pub struct PlaneNetwork {
    pub table: String,
    pub cluster: ipnet::Ipv4Net,
    pub bridge: String,
}

/// Starts the server and keeps its records current. `gateway` says where to listen (the
/// bridge's address, once the node holds a block; it moves if the node is renumbered).
pub fn start(
    replication: Arc<Replication>,
    statuses: Arc<PodStatusCache>,
    domain: String,
    gateway: impl Fn() -> Option<Ipv4Addr> + Send + Sync + 'static,
    network: PlaneNetwork,
    node: String,
    membership: Arc<shoal_gossip::Membership>,
) -> Arc<ServicePlane> {
    let PlaneNetwork {
        table,
        cluster,
        bridge,
    } = network;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let plane_table = table.clone();
    // Bridged traffic (a pod answering a pod on its own bridge) must pass conntrack, or the
    // reply to a ClusterIP connection would skip its un-DNAT.
    let _ = std::fs::write("/proc/sys/net/bridge/bridge-nf-call-iptables", "1");
    let gateway: Arc<Gateway> = Arc::new(gateway);
    // Supervised: a panic restarts the loop, which derives everything again from the store
    // (its DNS server stops with the run that started it).
    let task = crate::supervise::spawn("service-plane", move || {
        run(
            Sources {
                replication: replication.clone(),
                statuses: statuses.clone(),
                node: node.clone(),
                membership: membership.clone(),
            },
            domain.clone(),
            gateway.clone(),
            (table.clone(), bridge.clone()),
            cluster,
            stopped.clone(),
        )
    });
    Arc::new(ServicePlane {
        stop,
        task: std::sync::Mutex::new(Some(task)),
        table: plane_table,
    })
}

/// Where the DNS server listens: the bridge's address (none yet: no block leased).
type Gateway = dyn Fn() -> Option<Ipv4Addr> + Send + Sync;

/// What the service plane derives its rules and records from: the store, the pods' statuses,
/// and this node's name (whose pods' host ports it serves).
struct Sources {
    replication: Arc<Replication>,
    statuses: Arc<PodStatusCache>,
    node: String,
    /// The agents' API servers (the `kubernetes` Service's endpoints).
    membership: Arc<shoal_gossip::Membership>,
}

type ApiServers = Vec<(String, SocketAddr)>;

/// The live agents' API servers, by node name, sorted (the `kubernetes` Service's endpoints).
pub async fn api_servers(membership: &shoal_gossip::Membership) -> Vec<(String, SocketAddr)> {
    use shoal_gossip::MemberState;
    let mut servers: Vec<(String, SocketAddr)> = membership
        .members()
        .await
        .into_iter()
        .filter(|m| matches!(m.state, MemberState::Alive | MemberState::Suspect))
        .filter_map(|m| Some((m.name().to_owned(), m.meta.as_ref()?.addresses.api?)))
        .collect();
    servers.sort();
    servers
}

/// The service plane's loop: nftables rules and DNS records derived from the store and the
/// pods' statuses, and the DNS server on the gateway.
async fn run(
    sources: Sources,
    domain: String,
    gateway: Arc<Gateway>,
    (table, bridge): (String, String),
    cluster: ipnet::Ipv4Net,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let Sources {
        replication,
        statuses,
        node,
        membership,
    } = sources;
    type Rules = (
        Vec<shoal_net::nft::ServicePort>,
        Vec<shoal_net::nft::HostPortRule>,
    );
    let mut applied: Option<Rules> = None;
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(Records::build(&domain, &[])));
    let upstreams =
        shoal_net::dns::upstreams(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default());
    let mut last: Vec<DnsService> = Vec::new();
    // Aborted when dropped: a panicking run does not leave its server behind.
    let mut serving: Option<(Ipv4Addr, crate::supervise::AbortOnDrop)> = None;
    // The store's version and the statuses' when the rules and records last matched them:
    // while neither moves there is nothing to derive again.
    let mut derived_from: Option<(u64, u64, ApiServers)> = None;
    loop {
        if *stopped.borrow() {
            return;
        }
        let api = api_servers(&membership).await;
        let inputs = (
            replication.read(|s| s.resource_version()),
            statuses.version(),
            api.clone(),
        );
        if derived_from.as_ref() != Some(&inputs) {
            // One read of the store for both: the pods' host ports, then the Services' backends.
            let (service_objects, pods) =
                replication.read(|s| (s.list("", "Service", None), s.list("", "Pod", None)));
            let host_ports = host_port_rules(&pods, |uid| statuses.get(uid, &node));
            let mut derived =
                crate::endpoints::services_with_backends_of(service_objects, pods, &statuses);
            crate::endpoints::with_api_servers(&mut derived, &api);
            let services: Vec<DnsService> =
                derived.iter().map(|(s, b)| dns_service(s, b)).collect();
            let ports: Vec<shoal_net::nft::ServicePort> = derived
                .iter()
                .flat_map(|(s, b)| service_ports(s, b))
                .collect();
            let wanted = (ports.clone(), host_ports);
            if applied.as_ref() != Some(&wanted) {
                let table_name = table.clone();
                let bridge = bridge.clone();
                let attempt = wanted.clone();
                // UDP flows whose target the new rules no longer lead to: forgotten once the
                // rules are in, so a client's next datagram follows them.
                let stale = applied
                    .as_ref()
                    .map_or_else(Vec::new, |(services, host_ports)| {
                        shoal_net::conntrack::stale((services, host_ports), (&wanted.0, &wanted.1))
                    });
                let loaded = tokio::task::spawn_blocking(move || {
                    // The rebuild flushes what is loaded and keeps the sets of clients pinned
                    // by ClientIP affinity (only this task changes the table).
                    let current = shoal_net::nft::loaded(&table_name);
                    shoal_net::nft::apply(&shoal_net::nft::ruleset(
                        &table_name,
                        cluster,
                        &attempt.0,
                        &attempt.1,
                        &current,
                    ))?;
                    // Loopback host ports need it; the table just loaded guards it.
                    shoal_net::linux::set_route_localnet(
                        &bridge,
                        shoal_net::nft::route_localnet(&attempt.1),
                    )?;
                    match shoal_net::conntrack::delete(&stale) {
                        Ok(0) => {}
                        Ok(n) => tracing::debug!(flows = n, "stale UDP flows forgotten"),
                        // The rules are in; a flow left behind expires on its own.
                        Err(e) => warn!(error = %e, "stale UDP flows not forgotten"),
                    }
                    Ok::<_, shoal_net::NetError>(())
                })
                .await;
                match loaded {
                    Ok(Ok(())) => {
                        tracing::debug!(table = %table, ports = ports.len(), host_ports = wanted.1.len(), "service rules loaded");
                        applied = Some(wanted.clone());
                    }
                    Ok(Err(e)) => {
                        warn!(table = %table, error = %e, "service rules not loaded; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => warn!(error = %e, "service rules task"),
                }
            }
            if services != last {
                tx.send_replace(Arc::new(Records::build(&domain, &services)));
                last = services;
            }
            // Derived again next round unless the rules loaded.
            if applied.as_ref() == Some(&wanted) {
                derived_from = Some(inputs);
            }
        }
        let want = gateway();
        let running = serving
            .as_ref()
            .is_some_and(|(_, task)| !task.0.is_finished());
        if want != serving.as_ref().map(|(ip, _)| *ip) || (!running && want.is_some()) {
            serving = None;
            if let Some(ip) = want {
                let addr = SocketAddr::from((ip, 53));
                let rx = rx.clone();
                let upstreams = upstreams.clone();
                info!(%addr, ?upstreams, "cluster DNS listening");
                serving = Some((
                    ip,
                    crate::supervise::AbortOnDrop(tokio::spawn(async move {
                        if let Err(e) = shoal_net::dns::serve(addr, rx, upstreams).await {
                            warn!(%addr, error = %e, "cluster DNS stopped; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    })),
                ));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(REFRESH) => {}
            _ = stopped.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// Only pods this node runs on the pod network and that have not ended get their host
    /// ports served; every address or one IPv4 hostIP, to the pod's container port.
    #[test]
    fn host_ports_are_served_for_the_pods_running_here() {
        let pod = |uid: &str, host_network: bool, port: Value| {
            json!({"metadata": {"uid": uid, "name": uid, "namespace": "default"},
                   "spec": {"hostNetwork": host_network, "containers": [{"name": "c", "image": "i", "ports": [port]}]}})
        };
        let pods = [
            pod("web", false, json!({"containerPort": 80, "hostPort": 8080})),
            pod(
                "dns",
                false,
                json!({"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "192.0.2.1"}),
            ),
            pod(
                "v6",
                false,
                json!({"containerPort": 80, "hostPort": 81, "hostIP": "::1"}),
            ),
            pod("host", true, json!({"containerPort": 82, "hostPort": 82})),
            pod(
                "elsewhere",
                false,
                json!({"containerPort": 80, "hostPort": 83}),
            ),
            pod("done", false, json!({"containerPort": 80, "hostPort": 84})),
            pod("plain", false, json!({"containerPort": 80})),
        ];
        let here = |uid: &str| match uid {
            "elsewhere" => None,
            "done" => Some(json!({"phase": "Succeeded", "podIP": "10.88.0.9"})),
            _ => Some(json!({"phase": "Running", "podIP": "10.88.0.5"})),
        };
        let rules = host_port_rules(&pods, here);
        let got: Vec<(Option<String>, u16, &str, u16)> = rules
            .iter()
            .map(|r| {
                assert_eq!(r.pod_ip.to_string(), "10.88.0.5");
                (
                    r.host_ip.map(|ip| ip.to_string()),
                    r.port,
                    r.protocol.as_str(),
                    r.container_port,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (None, 8080, "tcp", 80),
                (Some("192.0.2.1".into()), 53, "udp", 53)
            ]
        );
    }
}

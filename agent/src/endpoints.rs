//! Endpoints and EndpointSlices, derived (DESIGN.md §9): every agent computes them for each
//! Service from the pods in desired state (their labels, container ports, deletion) joined with
//! what their nodes gossip about them (IP and readiness, `crate::observed::pod_status`). No
//! controller writes them and nothing is stored: a node that dies takes its pods' endpoints
//! with it, on every agent at once.
//!
//! Pure: the caller passes the Service and the pods with their observed statuses.
//!
//! Rules, as Kubernetes' endpoints and EndpointSlice controllers apply them:
//! - only Services with a non-empty selector get endpoints; pods of the Service's namespace
//!   whose labels match, that have an IP and are neither Succeeded nor Failed;
//! - ready = the pod's Ready condition is True and it is not terminating
//!   (`publishNotReadyAddresses` makes every such pod ready); serving ignores terminating;
//! - a port's `targetPort` is a number, a container port's name (looked up in each pod: a pod
//!   without that name gets no endpoint for that port), or absent (= `port`);
//! - pods are grouped by the ports they resolve to: one Endpoints subset and one EndpointSlice
//!   per group.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sha2::Digest;

/// Every Service in `namespace` (all when `None`) with its backends, read from the store and
/// the pods' gossiped statuses.
pub fn services_with_backends(
    replication: &crate::replication::Replication,
    statuses: &crate::observed::pod_status::PodStatusCache,
    namespace: Option<&str>,
) -> Vec<(Value, Vec<Backend>)> {
    let (services, pods) = replication.read(|s| {
        (
            s.list("", "Service", namespace),
            s.list("", "Pod", namespace),
        )
    });
    services_with_backends_of(services, pods, statuses)
}

/// [`services_with_backends`] over Services and pods already read from the store (a caller
/// that needs the pods for something else too reads them once).
pub fn services_with_backends_of(
    services: Vec<Value>,
    pods: Vec<Value>,
    statuses: &crate::observed::pod_status::PodStatusCache,
) -> Vec<(Value, Vec<Backend>)> {
    if services.is_empty() {
        return Vec::new();
    }
    let mut by_namespace: BTreeMap<String, Vec<(Value, Option<Value>)>> = BTreeMap::new();
    for mut pod in pods {
        // A pod being deleted is terminating (its `deletionTimestamp`, as the API shows it).
        shoal_core::controllers::garbage::render_deletion(&mut pod);
        let status = statuses.status_of(&pod);
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        by_namespace.entry(ns).or_default().push((pod, status));
    }
    let none = Vec::new();
    services
        .into_iter()
        .map(|service| {
            let ns = service["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            let backends = backends(&service, by_namespace.get(ns).unwrap_or(&none));
            (service, backends)
        })
        .collect()
}

/// One resolved Service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EndpointPort {
    pub name: String,
    pub port: u16,
    pub protocol: String,
}

/// One pod behind a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub ip: String,
    pub node_name: String,
    pub pod_name: String,
    pub pod_uid: String,
    /// `spec.hostname` when the pod's `spec.subdomain` is the Service's name.
    pub hostname: Option<String>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub ports: Vec<EndpointPort>,
}

/// The Service every cluster has, whose endpoints are the agents' API servers.
pub const API_SERVICE: (&str, &str) = ("default", "kubernetes");

/// The `default/kubernetes` Service with the ClusterIP `ip` (the service CIDR's first
/// address, which no other Service is given), as the apiserver makes it.
pub fn api_service(ip: std::net::Ipv4Addr) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": API_SERVICE.1, "namespace": API_SERVICE.0,
            "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip.to_string(), "clusterIPs": [ip.to_string()],
            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
    })
}

/// Gives the `default/kubernetes` Service among `derived` the live agents' API servers
/// (`api`: each node's name and API address) as its endpoints: it selects no pods, its
/// endpoints are the agents (IPv4 ones: the service plane is IPv4).
pub fn with_api_servers(
    derived: &mut [(Value, Vec<Backend>)],
    api: &[(String, std::net::SocketAddr)],
) {
    let is_api = |s: &Value| {
        s["metadata"]["namespace"] == API_SERVICE.0 && s["metadata"]["name"] == API_SERVICE.1
    };
    let Some((_, backends)) = derived.iter_mut().find(|(s, _)| is_api(s)) else {
        return;
    };
    *backends = api
        .iter()
        .filter(|(_, a)| a.is_ipv4())
        .map(|(node, a)| Backend {
            ip: a.ip().to_string(),
            node_name: node.clone(),
            pod_name: String::new(),
            pod_uid: String::new(),
            hostname: None,
            ready: true,
            serving: true,
            terminating: false,
            ports: vec![EndpointPort {
                name: "https".into(),
                port: a.port(),
                protocol: "TCP".into(),
            }],
        })
        .collect();
}

fn protocol(v: &Value) -> String {
    v.as_str().unwrap_or("TCP").to_owned()
}

fn port_number(v: &Value) -> Option<u16> {
    v.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
}

/// Resolves a Service port's target in one pod.
fn target_port(service_port: &Value, pod: &Value) -> Option<u16> {
    let target = &service_port["targetPort"];
    if target.is_null() {
        return port_number(&service_port["port"]);
    }
    if let Some(n) = port_number(target) {
        return Some(n);
    }
    // A string: a number in a string (`"8080"`) or a container port's name.
    let name = target.as_str()?;
    if let Ok(n) = name.parse::<u16>() {
        return (n > 0).then_some(n);
    }
    let wanted = protocol(&service_port["protocol"]);
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .find(|p| p["name"].as_str() == Some(name) && protocol(&p["protocol"]) == wanted)
        .and_then(|p| port_number(&p["containerPort"]))
}

fn selector_matches(selector: &serde_json::Map<String, Value>, labels: &Value) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
}

/// The pods behind `service`, sorted by IP. `pods` are the stored pods with the status their
/// node reports (`None`: no report yet).
pub fn backends(service: &Value, pods: &[(Value, Option<Value>)]) -> Vec<Backend> {
    let Some(selector) = service["spec"]["selector"]
        .as_object()
        .filter(|s| !s.is_empty())
    else {
        return Vec::new();
    };
    let namespace = service["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let service_name = service["metadata"]["name"].as_str().unwrap_or_default();
    let publish_not_ready = service["spec"]["publishNotReadyAddresses"]
        .as_bool()
        .unwrap_or(false);
    let ports: Vec<&Value> = service["spec"]["ports"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (pod, status) in pods {
        if pod["metadata"]["namespace"].as_str().unwrap_or("default") != namespace
            || !selector_matches(selector, &pod["metadata"]["labels"])
        {
            continue;
        }
        let Some(status) = status else { continue };
        let Some(ip) = status["podIP"].as_str().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        if matches!(status["phase"].as_str(), Some("Succeeded" | "Failed")) {
            continue;
        }
        let terminating = !pod["metadata"]["deletionTimestamp"].is_null();
        let pod_ready = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let serving = pod_ready || publish_not_ready;
        let mut resolved: Vec<EndpointPort> = ports
            .iter()
            .filter_map(|p| {
                Some(EndpointPort {
                    name: p["name"].as_str().unwrap_or_default().to_owned(),
                    port: target_port(p, pod)?,
                    protocol: protocol(&p["protocol"]),
                })
            })
            .collect();
        resolved.sort();
        let hostname = (pod["spec"]["subdomain"].as_str() == Some(service_name))
            .then(|| pod["spec"]["hostname"].as_str().map(str::to_owned))
            .flatten();
        out.push(Backend {
            ip: ip.to_owned(),
            node_name: pod["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            pod_name: pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            pod_uid: pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            hostname,
            ready: serving && (!terminating || publish_not_ready),
            serving,
            terminating,
            ports: resolved,
        });
    }
    out.sort_by(|a, b| {
        let key = |x: &Backend| x.ip.parse::<std::net::IpAddr>().ok();
        key(a)
            .cmp(&key(b))
            .then_with(|| a.pod_name.cmp(&b.pod_name))
    });
    out
}

/// Backends grouped by the ports they resolve to.
fn groups(backends: &[Backend]) -> BTreeMap<Vec<EndpointPort>, Vec<&Backend>> {
    let mut groups: BTreeMap<Vec<EndpointPort>, Vec<&Backend>> = BTreeMap::new();
    for b in backends {
        groups.entry(b.ports.clone()).or_default().push(b);
    }
    groups
}

/// The pod behind an endpoint (none for an agent's API server).
fn target_ref(b: &Backend, namespace: &str) -> Value {
    if b.pod_name.is_empty() {
        return Value::Null;
    }
    json!({"kind": "Pod", "namespace": namespace, "name": b.pod_name, "uid": b.pod_uid})
}

fn drop_null_target(endpoint: &mut Value) {
    if let Some(map) = endpoint.as_object_mut()
        && map.get("targetRef").is_some_and(Value::is_null)
    {
        map.remove("targetRef");
    }
}

fn ports_json(ports: &[EndpointPort]) -> Vec<Value> {
    ports
        .iter()
        .map(|p| {
            let mut v = json!({"port": p.port, "protocol": p.protocol});
            if !p.name.is_empty() {
                v["name"] = json!(p.name);
            }
            v
        })
        .collect()
}

/// The metadata a derived object shares with its Service.
fn metadata_from(service: &Value, name: &str) -> serde_json::Map<String, Value> {
    let m = &service["metadata"];
    let mut meta = serde_json::Map::new();
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), m["namespace"].clone());
    meta.insert("resourceVersion".into(), m["resourceVersion"].clone());
    meta.insert("creationTimestamp".into(), m["creationTimestamp"].clone());
    meta
}

/// The core/v1 Endpoints object of `service`.
pub fn endpoints(service: &Value, backends: &[Backend]) -> Value {
    let namespace = service["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let name = service["metadata"]["name"].as_str().unwrap_or_default();
    let mut meta = metadata_from(service, name);
    meta.insert("uid".into(), json!(derived_uid(service, "endpoints")));
    if let Some(labels) = service["metadata"]["labels"].as_object() {
        meta.insert("labels".into(), json!(labels));
    }
    let subsets: Vec<Value> = groups(backends)
        .into_iter()
        .filter(|(ports, _)| !ports.is_empty())
        .filter_map(|(ports, members)| {
            let address = |b: &&Backend| {
                let mut a = json!({"ip": b.ip, "nodeName": b.node_name, "targetRef": target_ref(b, namespace)});
                if let Some(h) = &b.hostname {
                    a["hostname"] = json!(h);
                }
                drop_null_target(&mut a);
                a
            };
            // Terminating pods leave the Endpoints object (they stay in slices, `serving`).
            let ready: Vec<Value> = members.iter().filter(|b| b.ready).map(address).collect();
            let not_ready: Vec<Value> = members
                .iter()
                .filter(|b| !b.ready && !b.terminating)
                .map(address)
                .collect();
            if ready.is_empty() && not_ready.is_empty() {
                return None;
            }
            let mut subset = json!({"ports": ports_json(&ports)});
            if !ready.is_empty() {
                subset["addresses"] = json!(ready);
            }
            if !not_ready.is_empty() {
                subset["notReadyAddresses"] = json!(not_ready);
            }
            Some(subset)
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta, "subsets": subsets})
}

/// A stable uid for an object derived from `service` (so clients see one object, not a new
/// one per read).
fn derived_uid(service: &Value, what: &str) -> String {
    let mut hash = sha2::Sha256::new();
    hash.update(service["metadata"]["uid"].as_str().unwrap_or_default());
    hash.update([0]);
    hash.update(what.as_bytes());
    shoal_state::object::uuid_string(&hash.finalize()[..16])
}

/// The discovery.k8s.io/v1 EndpointSlices of `service`: one per group of ports (one with no
/// endpoints when no pod is behind it).
pub fn endpoint_slices(service: &Value, backends: &[Backend]) -> Vec<Value> {
    let name = service["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = service["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    if service["spec"]["selector"]
        .as_object()
        .is_none_or(|s| s.is_empty())
    {
        return Vec::new();
    }
    let mut groups = groups(backends);
    if groups.is_empty() {
        groups.insert(Vec::new(), Vec::new());
    }
    groups
        .into_iter()
        .map(|(ports, members)| {
            let port_key: String = ports
                .iter()
                .map(|p| format!("{}/{}/{};", p.name, p.port, p.protocol))
                .collect();
            let mut hash = sha2::Sha256::new();
            hash.update(port_key.as_bytes());
            let slice_name = format!("{name}-{}", &hex::encode(hash.finalize())[..5]);
            let mut meta = metadata_from(service, &slice_name);
            meta.insert(
                "uid".into(),
                json!(derived_uid(service, &format!("slice {port_key}"))),
            );
            meta.insert(
                "labels".into(),
                json!({
                    "kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice.shoal.io",
                }),
            );
            meta.insert(
                "ownerReferences".into(),
                json!([{"apiVersion": "v1", "kind": "Service", "name": name,
                        "uid": service["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]),
            );
            let endpoints: Vec<Value> = members
                .iter()
                .map(|b| {
                    let mut e = json!({
                        "addresses": [b.ip],
                        "conditions": {"ready": b.ready, "serving": b.serving, "terminating": b.terminating},
                        "nodeName": b.node_name,
                        "targetRef": target_ref(b, namespace),
                    });
                    if let Some(h) = &b.hostname {
                        e["hostname"] = json!(h);
                    }
                    drop_null_target(&mut e);
                    e
                })
                .collect();
            json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": meta,
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": ports_json(&ports),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(spec: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "default", "uid": "svc-uid", "resourceVersion": "7"}, "spec": spec})
    }

    fn pod(name: &str, labels: Value, ports: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid"), "labels": labels},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": ports}]}})
    }

    fn status(ip: &str, ready: bool) -> Option<Value> {
        Some(json!({"phase": "Running", "podIP": ip,
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}))
    }

    fn web_pods() -> Vec<(Value, Option<Value>)> {
        let ports = json!([{"name": "http", "containerPort": 8080}]);
        vec![
            (
                pod("a", json!({"app": "web"}), ports.clone()),
                status("10.88.1.10", true),
            ),
            (
                pod("b", json!({"app": "web"}), ports.clone()),
                status("10.88.1.9", false),
            ),
            (
                pod("c", json!({"app": "db"}), ports.clone()),
                status("10.88.1.11", true),
            ),
            (pod("d", json!({"app": "web"}), ports.clone()), None),
            (
                pod("e", json!({"app": "web", "x": "y"}), ports),
                status("10.88.2.3", true),
            ),
        ]
    }

    #[test]
    fn ready_and_not_ready_pods_matching_the_selector() {
        let svc = service(
            json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}),
        );
        let b = backends(&svc, &web_pods());
        let ips: Vec<(&str, bool)> = b.iter().map(|b| (b.ip.as_str(), b.ready)).collect();
        assert_eq!(
            ips,
            [
                ("10.88.1.9", false),
                ("10.88.1.10", true),
                ("10.88.2.3", true)
            ],
            "sorted by address, not as text; no IP yet or other labels: left out"
        );
        let ep = endpoints(&svc, &b);
        assert_eq!(
            ep["subsets"][0]["ports"],
            json!([{"port": 8080, "protocol": "TCP"}])
        );
        assert_eq!(ep["subsets"][0]["addresses"][0]["ip"], "10.88.1.10");
        assert_eq!(ep["subsets"][0]["addresses"][0]["targetRef"]["name"], "a");
        assert_eq!(ep["subsets"][0]["notReadyAddresses"][0]["ip"], "10.88.1.9");
        let slices = endpoint_slices(&svc, &b);
        assert_eq!(slices.len(), 1);
        assert_eq!(
            slices[0]["metadata"]["labels"]["kubernetes.io/service-name"],
            "web"
        );
        assert_eq!(
            slices[0]["endpoints"][0]["conditions"],
            json!({"ready": false, "serving": false, "terminating": false})
        );
        assert_eq!(slices[0]["endpoints"][1]["nodeName"], "n1");
    }

    #[test]
    fn publish_not_ready_addresses_makes_every_pod_ready() {
        let svc = service(
            json!({"selector": {"app": "web"}, "publishNotReadyAddresses": true, "ports": [{"port": 80}]}),
        );
        let b = backends(&svc, &web_pods());
        assert!(b.iter().all(|b| b.ready));
        assert_eq!(
            b[0].ports,
            vec![EndpointPort {
                name: "".into(),
                port: 80,
                protocol: "TCP".into()
            }],
            "targetPort defaults to port"
        );
        assert!(endpoints(&svc, &b)["subsets"][0]["notReadyAddresses"].is_null());
    }

    #[test]
    fn named_ports_resolve_per_pod_and_group_subsets() {
        let svc = service(json!({"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "metrics", "port": 9090, "targetPort": 9100},
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "http"}]}));
        let pods = vec![
            (
                pod(
                    "a",
                    json!({"app": "web"}),
                    json!([{"name": "http", "containerPort": 8080}]),
                ),
                status("10.88.1.2", true),
            ),
            (
                pod(
                    "b",
                    json!({"app": "web"}),
                    json!([{"name": "http", "containerPort": 9000}]),
                ),
                status("10.88.1.3", true),
            ),
            (
                pod("c", json!({"app": "web"}), json!([])),
                status("10.88.1.4", true),
            ),
        ];
        let b = backends(&svc, &pods);
        let ports = |i: usize| {
            b[i].ports
                .iter()
                .map(|p| (p.name.as_str(), p.port))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ports(0),
            [("http", 8080), ("metrics", 9100)],
            "no UDP port named http"
        );
        assert_eq!(ports(1), [("http", 9000), ("metrics", 9100)]);
        assert_eq!(
            ports(2),
            [("metrics", 9100)],
            "a pod without the name gets only the numeric port"
        );
        assert_eq!(endpoints(&svc, &b)["subsets"].as_array().unwrap().len(), 3);
        let slices = endpoint_slices(&svc, &b);
        assert_eq!(slices.len(), 3);
        let names: std::collections::BTreeSet<_> = slices
            .iter()
            .map(|s| s["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names.len(), 3, "distinct, stable slice names");
    }

    #[test]
    fn terminating_finished_and_selectorless() {
        let svc = service(json!({"selector": {"app": "web"}, "ports": [{"port": 80}]}));
        let mut pods = web_pods();
        pods[0].0["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        pods[4].1.as_mut().unwrap()["phase"] = json!("Succeeded");
        let b = backends(&svc, &pods);
        assert_eq!(b.len(), 2);
        let a = b.iter().find(|b| b.pod_name == "a").unwrap();
        assert!(a.terminating && a.serving && !a.ready);
        let ep = endpoints(&svc, &b);
        assert!(ep["subsets"][0]["addresses"].is_null(), "{ep}");
        assert_eq!(
            ep["subsets"][0]["notReadyAddresses"]
                .as_array()
                .unwrap()
                .len(),
            1,
            "the terminating pod left"
        );
        let none = service(json!({"ports": [{"port": 80}]}));
        assert!(backends(&none, &pods).is_empty());
        assert!(endpoint_slices(&none, &[]).is_empty());
        let empty = endpoint_slices(&svc, &[]);
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0]["endpoints"], json!([]));
    }

    #[test]
    fn hostnames_for_pods_of_the_subdomain() {
        let svc = service(
            json!({"selector": {"app": "web"}, "clusterIP": "None", "ports": [{"port": 80}]}),
        );
        let mut pods = web_pods();
        pods[0].0["spec"]["hostname"] = json!("web-0");
        pods[0].0["spec"]["subdomain"] = json!("web");
        pods[1].0["spec"]["hostname"] = json!("other");
        let b = backends(&svc, &pods);
        let a = b.iter().find(|b| b.pod_name == "a").unwrap();
        assert_eq!(a.hostname.as_deref(), Some("web-0"));
        assert!(
            b.iter()
                .find(|b| b.pod_name == "b")
                .unwrap()
                .hostname
                .is_none()
        );
    }
}

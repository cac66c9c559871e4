//! The Service ClusterIP controller: gives every Service that needs one an address from the
//! service CIDR, and moves the later-created of two Services that hold one address (two agents
//! allocated at once, or on two sides of a partition) to a free one. The API allocates at
//! create time with the same allocator ([`shoal_model::service_ip::allocate`]); this covers what
//! arrives by other paths and repairs races. Pure: `reconcile` decides, the shell writes.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde_json::Value;
use shoal_model::service_ip::{self, Claim};

/// A Service's address as its spec states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterIp {
    /// `ExternalName` Services have none.
    NotApplicable,
    /// `clusterIP: None`.
    Headless,
    /// Not set yet.
    Unset,
    Set(Ipv4Addr),
    /// Not an address of the service CIDR (left alone, served by nothing).
    Invalid(String),
}

pub fn cluster_ip(service: &Value, cidr: Ipv4Net) -> ClusterIp {
    if service["spec"]["type"].as_str() == Some("ExternalName") {
        return ClusterIp::NotApplicable;
    }
    match service["spec"]["clusterIP"].as_str() {
        None | Some("") => ClusterIp::Unset,
        Some("None") => ClusterIp::Headless,
        Some(s) => match s.parse::<Ipv4Addr>() {
            Ok(ip) if service_ip::check(cidr, ip).is_ok() => ClusterIp::Set(ip),
            _ => ClusterIp::Invalid(s.to_owned()),
        },
    }
}

fn claim(service: &Value) -> Claim {
    let m = &service["metadata"];
    Claim {
        created: m["creationTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        uid: m["uid"].as_str().unwrap_or_default().to_owned(),
        key: format!(
            "{}/{}",
            m["namespace"].as_str().unwrap_or("default"),
            m["name"].as_str().unwrap_or_default()
        ),
    }
}

/// The addresses held, each by the Service that keeps it.
pub fn used(services: &[Value], cidr: Ipv4Net) -> BTreeSet<Ipv4Addr> {
    services
        .iter()
        .filter_map(|s| match cluster_ip(s, cidr) {
            ClusterIp::Set(ip) => Some(ip),
            _ => None,
        })
        .collect()
}

/// `(index into services, address to set)` for every Service that needs one.
pub fn reconcile(services: &[Value], cidr: Ipv4Net) -> Vec<(usize, Ipv4Addr)> {
    let (owners, losers) =
        service_ip::owners(services.iter().filter_map(|s| match cluster_ip(s, cidr) {
            ClusterIp::Set(ip) => Some((ip, claim(s))),
            _ => None,
        }));
    let losing: BTreeSet<String> = losers.into_iter().map(|c| c.uid).collect();
    let mut used: BTreeSet<Ipv4Addr> = owners.keys().copied().collect();
    let mut out = Vec::new();
    // In creation order, so every agent assigns the same addresses.
    let mut order: Vec<usize> = (0..services.len()).collect();
    order.sort_by_key(|&i| claim(&services[i]));
    for i in order {
        let s = &services[i];
        let needs = match cluster_ip(s, cidr) {
            ClusterIp::Unset => true,
            ClusterIp::Set(_) => losing.contains(&claim(s).uid),
            _ => false,
        };
        if !needs {
            continue;
        }
        let m = &s["metadata"];
        if let Ok(ip) = service_ip::allocate(
            cidr,
            m["namespace"].as_str().unwrap_or("default"),
            m["name"].as_str().unwrap_or_default(),
            &used,
        ) {
            used.insert(ip);
            out.push((i, ip));
        }
    }
    out
}

/// Whether a Service's ports get node ports.
pub fn wants_node_ports(service: &Value) -> bool {
    matches!(
        service["spec"]["type"].as_str(),
        Some("NodePort" | "LoadBalancer")
    )
}

/// The node ports held, by the Service created first when two name one.
fn held_node_ports(services: &[Value]) -> (BTreeSet<u16>, BTreeSet<(String, u16)>) {
    let mut order: Vec<&Value> = services.iter().filter(|s| wants_node_ports(s)).collect();
    order.sort_by_key(|s| claim(s));
    let mut held = BTreeSet::new();
    let mut lost = BTreeSet::new();
    for s in order {
        for p in s["spec"]["ports"].as_array().into_iter().flatten() {
            let Some(n) = p["nodePort"].as_u64().and_then(|n| u16::try_from(n).ok()) else {
                continue;
            };
            if !service_ip::NODE_PORTS.contains(&n) {
                continue;
            }
            if !held.insert(n) {
                lost.insert((claim(s).uid, n));
            }
        }
    }
    (held, lost)
}

/// Node ports in use by Services other than `except` (namespace/name).
pub fn used_node_ports(services: &[Value], except: (&str, &str)) -> BTreeSet<u16> {
    let others: Vec<Value> = services
        .iter()
        .filter(|s| {
            (
                s["metadata"]["namespace"].as_str().unwrap_or("default"),
                s["metadata"]["name"].as_str().unwrap_or(""),
            ) != except
        })
        .cloned()
        .collect();
    held_node_ports(&others).0
}

/// Gives every port of `service` that lacks one (or whose node port `lost` names) a node port
/// not in `used` (which it extends). Returns the new ports, or `None` when nothing changes.
pub fn fill_node_ports(
    service: &Value,
    used: &mut BTreeSet<u16>,
    lost: &BTreeSet<(String, u16)>,
) -> Option<Vec<Value>> {
    let uid = claim(service).uid;
    let m = &service["metadata"];
    let mut ports = service["spec"]["ports"].as_array()?.clone();
    let mut changed = false;
    for (i, p) in ports.iter_mut().enumerate() {
        let current = p["nodePort"].as_u64().and_then(|n| u16::try_from(n).ok());
        let ok = current.is_some_and(|n| {
            service_ip::NODE_PORTS.contains(&n) && !lost.contains(&(uid.clone(), n))
        });
        if ok {
            continue;
        }
        let port_name = p["name"]
            .as_str()
            .map_or_else(|| i.to_string(), str::to_owned);
        let n = service_ip::allocate_node_port(
            m["namespace"].as_str().unwrap_or("default"),
            m["name"].as_str().unwrap_or_default(),
            &port_name,
            used,
        )?;
        used.insert(n);
        p["nodePort"] = serde_json::json!(n);
        changed = true;
    }
    changed.then_some(ports)
}

/// `(index into services, new ports)` for every NodePort/LoadBalancer Service that needs
/// node ports (missing, or the later-created holder of a duplicate).
pub fn reconcile_node_ports(services: &[Value]) -> Vec<(usize, Vec<Value>)> {
    let (mut used, lost) = held_node_ports(services);
    let mut order: Vec<usize> = (0..services.len())
        .filter(|&i| wants_node_ports(&services[i]))
        .collect();
    order.sort_by_key(|&i| claim(&services[i]));
    order
        .into_iter()
        .filter_map(|i| Some((i, fill_node_ports(&services[i], &mut used, &lost)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(name: &str, created: &str, ip: Option<&str>, kind: &str) -> Value {
        let mut s = json!({"metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"), "creationTimestamp": created},
                           "spec": {"type": kind}});
        if let Some(ip) = ip {
            s["spec"]["clusterIP"] = json!(ip);
        }
        s
    }

    #[test]
    fn unset_services_get_addresses_and_the_later_of_a_duplicate_moves() {
        let cidr: Ipv4Net = "10.96.0.0/16".parse().unwrap();
        let services = vec![
            svc("a", "2026-01-02T00:00:00Z", Some("10.96.0.9"), "ClusterIP"),
            svc("b", "2026-01-01T00:00:00Z", Some("10.96.0.9"), "ClusterIP"),
            svc("c", "2026-01-03T00:00:00Z", None, "NodePort"),
            svc("d", "2026-01-03T00:00:00Z", Some("None"), "ClusterIP"),
            svc("e", "2026-01-03T00:00:00Z", None, "ExternalName"),
            svc("f", "2026-01-03T00:00:00Z", Some("10.96.0.10"), "ClusterIP"),
        ];
        let actions = reconcile(&services, cidr);
        let moved: Vec<usize> = actions.iter().map(|(i, _)| *i).collect();
        assert_eq!(
            moved,
            [0, 2],
            "a (later than b) moves; c gets one; headless, ExternalName and f stay"
        );
        let ips: BTreeSet<Ipv4Addr> = actions.iter().map(|(_, ip)| *ip).collect();
        assert_eq!(ips.len(), 2);
        assert!(!ips.contains(&"10.96.0.9".parse().unwrap()));
        assert!(!ips.contains(&"10.96.0.10".parse().unwrap()));
        assert_eq!(reconcile(&services, cidr), actions, "deterministic");
    }

    #[test]
    fn node_ports_are_filled_and_duplicates_move() {
        let mut a = svc("a", "2026-01-01T00:00:00Z", None, "NodePort");
        a["spec"]["ports"] = json!([{"name": "http", "port": 80, "nodePort": 30080}]);
        let mut b = svc("b", "2026-01-02T00:00:00Z", None, "NodePort");
        b["spec"]["ports"] =
            json!([{"name": "http", "port": 80, "nodePort": 30080}, {"name": "x", "port": 81}]);
        let c = svc("c", "2026-01-02T00:00:00Z", None, "ClusterIP");
        let actions = reconcile_node_ports(&[a, b, c]);
        assert_eq!(actions.len(), 1, "only b: a keeps 30080, c needs none");
        let (i, ports) = &actions[0];
        assert_eq!(*i, 1);
        let got: Vec<u64> = ports
            .iter()
            .map(|p| p["nodePort"].as_u64().unwrap())
            .collect();
        assert!(
            got.iter()
                .all(|n| (30000..=32767).contains(n) && *n != 30080),
            "{got:?}"
        );
        assert_ne!(got[0], got[1]);
    }
}

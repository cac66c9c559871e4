//! The Service ClusterIP controller: gives every Service that needs one an address from the
//! service CIDR, and moves the later-created of two Services that hold one address (two agents
//! allocated at once, or on two sides of a partition) to a free one. The API allocates at
//! create time with the same allocator ([`shoal_net::service_ip::allocate`]); this covers what
//! arrives by other paths and repairs races. Pure: `reconcile` decides, the shell writes.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde_json::Value;
use shoal_net::service_ip::{self, Claim};

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
}

//! Service load balancing on every node: one nftables table per agent (`ip shoal_<scope>`)
//! that DNATs each ClusterIP:port to one of its ready endpoints (chosen per connection with
//! `numgen random`, as kube-proxy's nftables mode does), rejects ClusterIP:ports with no
//! endpoint at once, and masquerades pod traffic leaving the cluster CIDR.
//!
//! The ruleset is generated whole ([`ruleset`], pure) and loaded with `nft -f -`, which
//! applies a file as one transaction: the table is replaced atomically, never seen half made.
//! The clients that `sessionAffinity: ClientIP` pinned to an endpoint live in the table's sets;
//! a rebuild reads them first ([`current_affinity`]) and declares them again with the time they
//! had left, so a change to any Service does not reshuffle the clients of the others.
//! (The `nftables` crate wraps the same `nft` binary with JSON; the native syntax is shorter
//! to generate and to read back with `nft list table`.)

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use ipnet::Ipv4Net;

use crate::NetError;

/// One ClusterIP port and where it leads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServicePort {
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// Ready endpoints: (pod IP, target port).
    pub endpoints: Vec<(Ipv4Addr, u16)>,
    /// The port on every node's addresses that leads here too (NodePort Services).
    pub node_port: Option<u16>,
    /// `sessionAffinity: ClientIP`: a client keeps its endpoint for this long (seconds).
    pub affinity_seconds: Option<u32>,
}

/// The packet mark of connections masqueraded on the way out (NodePort, hairpin).
pub const NODE_PORT_MARK: u32 = 0x5348_0000;

/// An endpoint of a ClusterIP port: (ClusterIP, port, protocol, (pod IP, target port)).
pub type EndpointKey = (Ipv4Addr, u16, String, (Ipv4Addr, u16));

/// The clients pinned to each endpoint by ClientIP affinity, with the seconds each has left.
pub type Affinity = BTreeMap<EndpointKey, Vec<(Ipv4Addr, u64)>>;

/// The ports a ruleset serves, in its order (set and chain names are indices into this).
fn served(ports: &[ServicePort]) -> Vec<&ServicePort> {
    let mut ports: Vec<&ServicePort> = ports
        .iter()
        .filter(|p| matches!(p.protocol.as_str(), "tcp" | "udp"))
        .collect();
    ports.sort();
    ports
}

fn endpoint_key(p: &ServicePort, endpoint: (Ipv4Addr, u16)) -> EndpointKey {
    (p.cluster_ip, p.port, p.protocol.clone(), endpoint)
}

/// The agent's table name.
pub fn table_name(scope: &str) -> String {
    format!("shoal_{scope}")
}

/// The whole table for `ports` (pods' block `cluster`), as an `nft -f` script that replaces the
/// table in one transaction; `affinity` holds the clients pinned so far (they keep their
/// endpoint if it is still there).
pub fn ruleset(
    table: &str,
    cluster: Ipv4Net,
    ports: &[ServicePort],
    affinity: &Affinity,
) -> String {
    let ports = served(ports);
    let mut s = String::new();
    // Declare (so the delete cannot fail), delete, define: one atomic replacement.
    let _ = writeln!(
        s,
        "table ip {table} {{}}\ndelete table ip {table}\ntable ip {table} {{"
    );
    s.push_str("  chain prerouting {\n    type nat hook prerouting priority -100; policy accept;\n    jump services\n  }\n");
    s.push_str("  chain output {\n    type nat hook output priority -100; policy accept;\n    jump services\n  }\n");
    // Pod traffic leaving the cluster CIDR, and NodePort traffic (marked below: its reply must
    // come back through this node to be un-DNATed), leave with this node's address.
    let _ = writeln!(
        s,
        "  chain postrouting {{\n    type nat hook postrouting priority 100; policy accept;\n    ip saddr {cluster} ip daddr != {cluster} masquerade\n    meta mark & {NODE_PORT_MARK:#x} == {NODE_PORT_MARK:#x} masquerade\n  }}"
    );
    // ClusterIP:ports without an endpoint are refused at once (as kube-proxy does), from pods
    // (forward) and from the node itself (output).
    let empty: Vec<&&ServicePort> = ports.iter().filter(|p| p.endpoints.is_empty()).collect();
    for (chain, hook) in [("reject_forward", "forward"), ("reject_output", "output")] {
        let _ = writeln!(
            s,
            "  chain {chain} {{\n    type filter hook {hook} priority -1; policy accept;"
        );
        for p in &empty {
            let _ = writeln!(
                s,
                "    ip daddr {} {} dport {} reject",
                p.cluster_ip, p.protocol, p.port
            );
        }
        s.push_str("  }\n");
    }
    s.push_str("  chain services {\n");
    for (i, p) in ports.iter().enumerate() {
        if !p.endpoints.is_empty() {
            let _ = writeln!(
                s,
                "    ip daddr {} {} dport {} goto svc_{i}",
                p.cluster_ip, p.protocol, p.port
            );
            if let Some(node_port) = p.node_port {
                let _ = writeln!(
                    s,
                    "    fib daddr type local {} dport {node_port} meta mark set meta mark | {NODE_PORT_MARK:#x} goto svc_{i}",
                    p.protocol
                );
            }
        }
    }
    s.push_str("  }\n");
    for (i, p) in ports.iter().enumerate() {
        if p.endpoints.is_empty() {
            continue;
        }
        let n = p.endpoints.len();
        if let Some(timeout) = p.affinity_seconds {
            // A client seen lately goes to the endpoint it went to (kube-proxy's shape: one
            // set of recent clients per endpoint, refreshed on every new connection).
            for (j, endpoint) in p.endpoints.iter().enumerate() {
                let _ = write!(
                    s,
                    "  set svc_{i}_ep_{j}_clients {{\n    type ipv4_addr; flags dynamic,timeout; timeout {timeout}s;\n"
                );
                let clients = affinity
                    .get(&endpoint_key(p, *endpoint))
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                if !clients.is_empty() {
                    let elements: Vec<String> = clients
                        .iter()
                        .map(|(ip, left)| {
                            format!(
                                "{ip} timeout {timeout}s expires {}s",
                                (*left).min(u64::from(timeout)).max(1)
                            )
                        })
                        .collect();
                    let _ = writeln!(s, "    elements = {{ {} }}", elements.join(", "));
                }
                s.push_str("  }\n");
            }
            let _ = writeln!(s, "  chain svc_{i}_affinity {{");
            for j in 0..n {
                let _ = writeln!(
                    s,
                    "    ip saddr @svc_{i}_ep_{j}_clients goto svc_{i}_ep_{j}"
                );
            }
            s.push_str("  }\n");
        }
        let _ = writeln!(s, "  chain svc_{i} {{");
        if p.affinity_seconds.is_some() {
            let _ = writeln!(s, "    jump svc_{i}_affinity");
        }
        let _ = write!(s, "    numgen random mod {n} vmap {{ ");
        let arms: Vec<String> = (0..n)
            .map(|j| format!("{j} : goto svc_{i}_ep_{j}"))
            .collect();
        let _ = writeln!(s, "{} }}\n  }}", arms.join(", "));
        for (j, (ip, port)) in p.endpoints.iter().enumerate() {
            let _ = writeln!(s, "  chain svc_{i}_ep_{j} {{");
            // Hairpin: an endpoint reaching itself through the Service is masqueraded, or its
            // reply would go to itself directly and never be un-DNATed.
            let _ = writeln!(
                s,
                "    ip saddr {ip} meta mark set meta mark | {NODE_PORT_MARK:#x}"
            );
            if p.affinity_seconds.is_some() {
                let _ = writeln!(s, "    update @svc_{i}_ep_{j}_clients {{ ip saddr }}");
            }
            let _ = writeln!(
                s,
                "    meta l4proto {} dnat to {ip}:{port}\n  }}",
                p.protocol
            );
        }
    }
    s.push_str("}\n");
    s
}

fn nft(script: &str) -> Result<(), NetError> {
    let io = |source| NetError::Io {
        op: "run nft (install the nftables package)",
        path: "nft".into(),
        source,
    };
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io)?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(io)?;
    let out = child.wait_with_output().map_err(io)?;
    if !out.status.success() {
        return Err(NetError::Netlink {
            op: "nft -f".into(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// The pinned clients in `json` (`nft -j list table` of a table made by [`ruleset`] for
/// `ports`), by endpoint. Sets it does not know, or malformed entries, are skipped.
pub fn affinity_from_json(json: &str, ports: &[ServicePort]) -> Affinity {
    let ports = served(ports);
    let mut affinity = Affinity::new();
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(json) else {
        return affinity;
    };
    let items = doc["nftables"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for set in items.iter().filter_map(|item| item.get("set")) {
        let Some(name) = set["name"].as_str() else {
            continue;
        };
        // svc_<i>_ep_<j>_clients
        let parts: Vec<&str> = name.split('_').collect();
        let (Some(i), Some(j)) = (
            parts.get(1).and_then(|v| v.parse::<usize>().ok()),
            parts.get(3).and_then(|v| v.parse::<usize>().ok()),
        ) else {
            continue;
        };
        if parts.len() != 5 || parts[0] != "svc" || parts[2] != "ep" || parts[4] != "clients" {
            continue;
        }
        let Some(endpoint) = ports.get(i).and_then(|p| Some((*p, *p.endpoints.get(j)?))) else {
            continue;
        };
        let clients: Vec<(Ipv4Addr, u64)> = set["elem"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let elem = &e["elem"];
                let ip = elem["val"].as_str()?.parse().ok()?;
                Some((ip, elem["expires"].as_u64()?))
            })
            .collect();
        if !clients.is_empty() {
            affinity.insert(endpoint_key(endpoint.0, endpoint.1), clients);
        }
    }
    affinity
}

/// The clients pinned in `table` as loaded now, which was made for `ports` (empty if it cannot
/// be read).
pub fn current_affinity(table: &str, ports: &[ServicePort]) -> Affinity {
    match Command::new("nft")
        .args(["-j", "list", "table", "ip", table])
        .stderr(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => {
            affinity_from_json(&String::from_utf8_lossy(&out.stdout), ports)
        }
        _ => Affinity::new(),
    }
}

/// Loads a ruleset made by [`ruleset`].
pub fn apply(script: &str) -> Result<(), NetError> {
    nft(script)
}

/// Removes the agent's table if it exists.
pub fn delete_table(table: &str) -> Result<(), NetError> {
    nft(&format!("table ip {table} {{}}\ndelete table ip {table}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ruleset_balances_rejects_and_masquerades() {
        let ports = vec![
            ServicePort {
                cluster_ip: "10.96.0.20".parse().unwrap(),
                port: 80,
                protocol: "tcp".into(),
                endpoints: vec![
                    ("10.88.1.2".parse().unwrap(), 8080),
                    ("10.88.2.3".parse().unwrap(), 8080),
                ],
                node_port: Some(30080),
                affinity_seconds: Some(10800),
            },
            ServicePort {
                cluster_ip: "10.96.0.21".parse().unwrap(),
                port: 53,
                protocol: "udp".into(),
                endpoints: vec![],
                node_port: None,
                affinity_seconds: None,
            },
            ServicePort {
                cluster_ip: "10.96.0.22".parse().unwrap(),
                port: 9,
                protocol: "sctp".into(),
                endpoints: vec![("10.88.1.2".parse().unwrap(), 9)],
                node_port: None,
                affinity_seconds: None,
            },
        ];
        let s = ruleset(
            "shoal_t",
            "10.88.0.0/16".parse().unwrap(),
            &ports,
            &Affinity::new(),
        );
        assert!(s.starts_with("table ip shoal_t {}\ndelete table ip shoal_t\n"));
        assert!(s.contains("ip daddr 10.96.0.20 tcp dport 80 goto svc_0"));
        assert!(
            s.contains("numgen random mod 2 vmap { 0 : goto svc_0_ep_0, 1 : goto svc_0_ep_1 }")
        );
        assert!(s.contains("meta l4proto tcp dnat to 10.88.2.3:8080"));
        assert!(s.contains("ip daddr 10.96.0.21 udp dport 53 reject"));
        assert!(s.contains(
            "fib daddr type local tcp dport 30080 meta mark set meta mark | 0x53480000 goto svc_0"
        ));
        assert!(s.contains("meta mark & 0x53480000 == 0x53480000 masquerade"));
        assert!(
            s.contains("ip saddr 10.88.2.3 meta mark set meta mark | 0x53480000"),
            "hairpin"
        );
        assert!(s.contains("type ipv4_addr; flags dynamic,timeout; timeout 10800s;"));
        assert!(s.contains("ip saddr @svc_0_ep_1_clients goto svc_0_ep_1"));
        assert!(s.contains("update @svc_0_ep_0_clients { ip saddr }"));
        assert!(!s.contains("svc_1_affinity"), "only with ClientIP affinity");
        assert!(
            !s.contains("10.96.0.22"),
            "unsupported protocols are left out"
        );
        assert!(s.contains("ip saddr 10.88.0.0/16 ip daddr != 10.88.0.0/16 masquerade"));
        assert_eq!(
            s,
            ruleset(
                "shoal_t",
                "10.88.0.0/16".parse().unwrap(),
                &ports,
                &Affinity::new()
            ),
            "deterministic"
        );
    }

    fn affine(endpoints: &[(&str, u16)]) -> ServicePort {
        ServicePort {
            cluster_ip: "10.96.0.20".parse().unwrap(),
            port: 80,
            protocol: "tcp".into(),
            endpoints: endpoints
                .iter()
                .map(|(ip, port)| (ip.parse().unwrap(), *port))
                .collect(),
            node_port: None,
            affinity_seconds: Some(100),
        }
    }

    /// A rebuild keeps the clients pinned to endpoints that remain, under the endpoints' new
    /// positions, with the time they had left (nft's JSON as `nft -j list table` prints it).
    #[test]
    fn pinned_clients_survive_a_rebuild() {
        let before = vec![affine(&[("10.88.1.2", 8080), ("10.88.2.3", 8080)])];
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
            {"set": {"family": "ip", "name": "svc_0_ep_1_clients", "table": "shoal_t", "type": "ipv4_addr",
                     "flags": ["timeout"], "timeout": 100, "elem": [{"elem": {"val": "10.88.0.9", "expires": 42}}]}},
            {"set": {"family": "ip", "name": "svc_0_ep_0_clients", "table": "shoal_t", "type": "ipv4_addr"}},
            {"set": {"family": "ip", "name": "svc_7_ep_0_clients", "table": "shoal_t", "type": "ipv4_addr",
                     "elem": [{"elem": {"val": "10.88.0.8", "expires": 5}}]}}]}"#;
        let affinity = affinity_from_json(json, &before);
        assert_eq!(affinity.len(), 1, "{affinity:?}");
        // The first endpoint goes: 10.88.2.3 is now endpoint 0, and its client stays on it.
        let after = vec![affine(&[("10.88.2.3", 8080)])];
        let s = ruleset(
            "shoal_t",
            "10.88.0.0/16".parse().unwrap(),
            &after,
            &affinity,
        );
        assert!(
            s.contains("set svc_0_ep_0_clients {\n    type ipv4_addr; flags dynamic,timeout; timeout 100s;\n    elements = { 10.88.0.9 timeout 100s expires 42s }\n  }"),
            "{s}"
        );
        assert!(affinity_from_json("not json", &before).is_empty());
    }
}

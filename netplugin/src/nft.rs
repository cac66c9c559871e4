//! Service load balancing on every node: one nftables table per agent (`ip shoal_<scope>`)
//! that DNATs each ClusterIP:port to one of its ready endpoints (chosen per connection with
//! `numgen random`, as kube-proxy's nftables mode does), rejects ClusterIP:ports with no
//! endpoint at once, and masquerades pod traffic leaving the cluster CIDR. The same table
//! serves the host ports (`hostPort`) of the pods this node runs, as CNI's portmap does: the
//! node's own addresses (`fib daddr type local`, or only `hostIP`) and the port DNAT to the
//! pod, from outside and from the node itself; traffic from pods is masqueraded so a pod can
//! reach itself or a neighbour through it. A loopback `hostIP` (`127.0.0.1`) serves the node's
//! own clients, as portmap does: it needs `route_localnet` on the bridge, and the table drops
//! new connections to 127.0.0.0/8 that arrive elsewhere than on `lo`, so pods cannot use that
//! to reach the node's loopback services.
//!
//! The ruleset is generated whole ([`ruleset`], pure) and loaded with `nft -f -`, which
//! applies a file as one transaction: the table is never seen half made. A rebuild flushes the
//! table's chains and defines them again, but it never recreates the sets of clients that
//! `sessionAffinity: ClientIP` pinned to an endpoint: each set is named after its endpoint
//! ([`affinity_set`]) and left in place while the endpoint stays, so a client pinned while the
//! rebuild was being made keeps its endpoint (copying the sets' contents into a new table
//! would lose it), and a change to one Service does not reshuffle the clients of the others.
//! (The `nftables` crate wraps the same `nft` binary with JSON; the native syntax is shorter
//! to generate and to read back with `nft list table`.)

use std::collections::BTreeSet;
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

/// A host port of a pod running on this node: (`hostIP` or every address, `port`,
/// `protocol`) leads to `pod_ip:container_port`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPortRule {
    /// `None`: every address of the node (no `hostIP`, or `0.0.0.0`).
    pub host_ip: Option<Ipv4Addr>,
    pub port: u16,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    pub pod_ip: Ipv4Addr,
    pub container_port: u16,
}

/// The packet mark of connections masqueraded on the way out (NodePort, hairpin).
pub const NODE_PORT_MARK: u32 = 0x5348_0000;

/// The chains and sets a loaded table holds (from `nft -j list table`): what a rebuild must
/// flush, and remove when the new ruleset no longer has them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loaded {
    pub chains: BTreeSet<String>,
    pub sets: BTreeSet<String>,
}

/// The ports a ruleset serves, in its order (set and chain names are indices into this).
fn served(ports: &[ServicePort]) -> Vec<&ServicePort> {
    let mut ports: Vec<&ServicePort> = ports
        .iter()
        .filter(|p| matches!(p.protocol.as_str(), "tcp" | "udp"))
        .collect();
    ports.sort();
    ports
}

/// The set of clients pinned to `endpoint` of `p`, named after everything that identifies it
/// (the timeout too: a changed timeout makes a new set), so it outlives rebuilds.
pub fn affinity_set(p: &ServicePort, endpoint: (Ipv4Addr, u16), timeout: u32) -> String {
    format!(
        "aff_{:08x}_{}_{}_{:08x}_{}_{timeout}",
        u32::from(p.cluster_ip),
        p.port,
        p.protocol,
        u32::from(endpoint.0),
        endpoint.1
    )
}

/// Whether `host_ports` need `route_localnet` on the pods' bridge: one of them is on a loopback
/// `hostIP`. (The table's guard chain keeps pods from using it to reach the node's loopback.)
pub fn route_localnet(host_ports: &[HostPortRule]) -> bool {
    host_ports
        .iter()
        .any(|h| h.host_ip.is_some_and(|ip| ip.is_loopback()))
}

/// The agent's table name.
pub fn table_name(scope: &str) -> String {
    format!("shoal_{scope}")
}

/// The whole table for `ports` (pods' block `cluster`), as an `nft -f` script that rebuilds
/// the table `loaded` describes in one transaction: every chain is flushed and defined again
/// (or removed), sets no endpoint needs any more are removed, and the others keep their
/// pinned clients.
pub fn ruleset(
    table: &str,
    cluster: Ipv4Net,
    ports: &[ServicePort],
    host_ports: &[HostPortRule],
    loaded: &Loaded,
) -> String {
    let ports = served(ports);
    let mut body = Body::default();
    // Host ports only for the node's own addresses (a hostIP of 1.1.1.1 must not capture
    // traffic the node forwards, portmap's lesson) and never for loopback ones.
    let host_ports_jump = "\n    fib daddr type local ip daddr != 127.0.0.0/8 jump hostports";
    body.chain(
        "prerouting",
        &format!(
            "type nat hook prerouting priority -100; policy accept;\n    jump services{host_ports_jump}"
        ),
    );
    // A host port on a loopback hostIP (`127.0.0.1`) is for the node's own clients: reached
    // from the output hook only (see [`route_localnet`] and the guard below).
    body.chain(
        "output",
        &format!(
            "type nat hook output priority -100; policy accept;\n    jump services{host_ports_jump}\n    ip daddr 127.0.0.0/8 jump hostports_lo"
        ),
    );
    // With `route_localnet` on the bridge (which loopback host ports need: the un-NATed reply
    // to 127.0.0.1 arrives there), a pod could send to the node's 127.0.0.1 and reach its
    // loopback-only services (CVE-2020-8558): new connections to 127.0.0.0/8 that did not
    // arrive on `lo` are dropped, as kube-proxy does. Replies of the node's own connections
    // are established and pass.
    body.chain(
        "localnet_guard",
        "type filter hook input priority 0; policy accept;\n    iifname != \"lo\" ip daddr 127.0.0.0/8 ct state != { established, related } drop",
    );
    let mut host_ports: Vec<&HostPortRule> = host_ports
        .iter()
        .filter(|h| matches!(h.protocol.as_str(), "tcp" | "udp" | "sctp"))
        .collect();
    host_ports.sort();
    host_ports.dedup();
    let (mut jumps, mut loopback_jumps) = (Vec::new(), Vec::new());
    for (i, h) in host_ports.iter().enumerate() {
        let address = h
            .host_ip
            .map(|ip| format!("ip daddr {ip} "))
            .unwrap_or_default();
        let loopback = h.host_ip.is_some_and(|ip| ip.is_loopback());
        let jump = format!("{address}{} dport {} goto hp_{i}", h.protocol, h.port);
        // From a pod (itself, or one on the same bridge): masqueraded, so the reply comes
        // back through the node to be un-DNATed. From loopback: always (127.0.0.1 cannot
        // leave the node as a source).
        let from = if loopback {
            loopback_jumps.push(jump);
            String::new()
        } else {
            jumps.push(jump);
            format!("ip saddr {cluster} ")
        };
        body.chain(
            &format!("hp_{i}"),
            &format!(
                "{from}meta mark set meta mark | {NODE_PORT_MARK:#x}\n    meta l4proto {} dnat to {}:{}",
                h.protocol, h.pod_ip, h.container_port
            ),
        );
    }
    body.chain("hostports", &jumps.join("\n    "));
    body.chain("hostports_lo", &loopback_jumps.join("\n    "));
    // Pod traffic leaving the cluster CIDR, and NodePort traffic (marked below: its reply must
    // come back through this node to be un-DNATed), leave with this node's address.
    body.chain(
        "postrouting",
        &format!(
            "type nat hook postrouting priority 100; policy accept;\n    ip saddr {cluster} ip daddr != {cluster} masquerade\n    meta mark & {NODE_PORT_MARK:#x} == {NODE_PORT_MARK:#x} masquerade"
        ),
    );
    // ClusterIP:ports without an endpoint are refused at once (as kube-proxy does), from pods
    // (forward) and from the node itself (output).
    let empty: Vec<&&ServicePort> = ports.iter().filter(|p| p.endpoints.is_empty()).collect();
    for (name, hook) in [("reject_forward", "forward"), ("reject_output", "output")] {
        let mut rules = format!("type filter hook {hook} priority -1; policy accept;");
        for p in &empty {
            let _ = write!(
                rules,
                "\n    ip daddr {} {} dport {} reject",
                p.cluster_ip, p.protocol, p.port
            );
        }
        body.chain(name, &rules);
    }
    let mut services = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        if !p.endpoints.is_empty() {
            services.push(format!(
                "ip daddr {} {} dport {} goto svc_{i}",
                p.cluster_ip, p.protocol, p.port
            ));
            if let Some(node_port) = p.node_port {
                services.push(format!(
                    "fib daddr type local {} dport {node_port} meta mark set meta mark | {NODE_PORT_MARK:#x} goto svc_{i}",
                    p.protocol
                ));
            }
        }
    }
    body.chain("services", &services.join("\n    "));
    for (i, p) in ports.iter().enumerate() {
        if p.endpoints.is_empty() {
            continue;
        }
        let n = p.endpoints.len();
        let mut rules = Vec::new();
        if let Some(timeout) = p.affinity_seconds {
            // A client seen lately goes to the endpoint it went to (kube-proxy's shape: one
            // set of recent clients per endpoint, refreshed on every new connection).
            for (j, endpoint) in p.endpoints.iter().enumerate() {
                let set = affinity_set(p, *endpoint, timeout);
                rules.push(format!("ip saddr @{set} goto svc_{i}_ep_{j}"));
                body.set(
                    &set,
                    &format!("type ipv4_addr; flags dynamic,timeout; timeout {timeout}s;"),
                );
            }
        }
        let arms: Vec<String> = (0..n)
            .map(|j| format!("{j} : goto svc_{i}_ep_{j}"))
            .collect();
        rules.push(format!(
            "numgen random mod {n} vmap {{ {} }}",
            arms.join(", ")
        ));
        body.chain(&format!("svc_{i}"), &rules.join("\n    "));
        for (j, (ip, port)) in p.endpoints.iter().enumerate() {
            // Hairpin: an endpoint reaching itself through the Service is masqueraded, or its
            // reply would go to itself directly and never be un-DNATed.
            let mut rules = vec![format!(
                "ip saddr {ip} meta mark set meta mark | {NODE_PORT_MARK:#x}"
            )];
            if let Some(timeout) = p.affinity_seconds {
                let set = affinity_set(p, (*ip, *port), timeout);
                rules.push(format!("update @{set} {{ ip saddr }}"));
            }
            rules.push(format!("meta l4proto {} dnat to {ip}:{port}", p.protocol));
            body.chain(&format!("svc_{i}_ep_{j}"), &rules.join("\n    "));
        }
    }
    // Declare the table (so the flushes cannot fail on a first load), flush every loaded chain
    // (which drops the rules that refer to other chains and sets), remove what is gone, then
    // define the rest: existing sets are declared again unchanged, keeping their elements.
    let mut s = format!("table ip {table} {{}}\n");
    for c in &loaded.chains {
        let _ = writeln!(s, "flush chain ip {table} {c}");
    }
    for c in loaded.chains.difference(&body.chains) {
        let _ = writeln!(s, "delete chain ip {table} {c}");
    }
    for set in loaded.sets.difference(&body.sets) {
        let _ = writeln!(s, "delete set ip {table} {set}");
    }
    let _ = write!(s, "table ip {table} {{\n{}}}\n", body.text);
    s
}

/// A table's definition as it is generated, with the names of what it defines.
#[derive(Default)]
struct Body {
    text: String,
    chains: BTreeSet<String>,
    sets: BTreeSet<String>,
}

impl Body {
    fn chain(&mut self, name: &str, rules: &str) {
        let _ = writeln!(self.text, "  chain {name} {{\n    {rules}\n  }}");
        self.chains.insert(name.to_owned());
    }

    fn set(&mut self, name: &str, definition: &str) {
        if self.sets.insert(name.to_owned()) {
            let _ = writeln!(self.text, "  set {name} {{\n    {definition}\n  }}");
        }
    }
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

/// The chains and sets of the table in `json` (`nft -j list table`); anything else, or
/// malformed entries, are skipped.
pub fn loaded_from_json(json: &str) -> Loaded {
    let mut loaded = Loaded::default();
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(json) else {
        return loaded;
    };
    for item in doc["nftables"].as_array().into_iter().flatten() {
        if let Some(name) = item["chain"]["name"].as_str() {
            loaded.chains.insert(name.to_owned());
        }
        if let Some(name) = item["set"]["name"].as_str() {
            loaded.sets.insert(name.to_owned());
        }
    }
    loaded
}

/// What `table` holds as loaded now (nothing if it does not exist or cannot be read).
pub fn loaded(table: &str) -> Loaded {
    match Command::new("nft")
        .args(["-j", "list", "table", "ip", table])
        .stderr(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => loaded_from_json(&String::from_utf8_lossy(&out.stdout)),
        _ => Loaded::default(),
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
            &[],
            &Loaded::default(),
        );
        assert!(
            s.starts_with("table ip shoal_t {}\ntable ip shoal_t {\n"),
            "a first load flushes nothing: {s}"
        );
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
        assert!(s.contains("ip saddr @aff_0a600014_80_tcp_0a580203_8080_10800 goto svc_0_ep_1"));
        assert!(s.contains("update @aff_0a600014_80_tcp_0a580102_8080_10800 { ip saddr }"));
        assert!(
            !s.contains("aff_0a600015"),
            "sets only with ClientIP affinity"
        );
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
                &[],
                &Loaded::default()
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

    /// A rebuild flushes every loaded chain, removes the chains and sets that are gone, and
    /// leaves the sets of endpoints that remain alone (they keep the clients they pinned).
    #[test]
    fn a_rebuild_keeps_the_client_sets_of_endpoints_that_remain() {
        let before = affine(&[("10.88.1.2", 8080), ("10.88.2.3", 8080)]);
        let set_a = affinity_set(&before, before.endpoints[0], 100);
        let set_b = affinity_set(&before, before.endpoints[1], 100);
        let json = format!(
            r#"{{"nftables": [{{"metainfo": {{"version": "1.0.6"}}}},
            {{"table": {{"family": "ip", "name": "shoal_t"}}}},
            {{"set": {{"family": "ip", "name": "{set_b}", "table": "shoal_t", "type": "ipv4_addr",
                     "flags": ["timeout"], "timeout": 100, "elem": [{{"elem": {{"val": "10.88.0.9", "expires": 42}}}}]}}}},
            {{"set": {{"family": "ip", "name": "{set_a}", "table": "shoal_t", "type": "ipv4_addr"}}}},
            {{"set": {{"family": "ip", "name": "svc_0_ep_0_clients", "table": "shoal_t", "type": "ipv4_addr"}}}},
            {{"chain": {{"family": "ip", "table": "shoal_t", "name": "prerouting", "type": "nat"}}}},
            {{"chain": {{"family": "ip", "table": "shoal_t", "name": "svc_0"}}}},
            {{"chain": {{"family": "ip", "table": "shoal_t", "name": "svc_0_ep_1"}}}},
            {{"chain": {{"family": "ip", "table": "shoal_t", "name": "svc_3"}}}},
            {{"rule": {{"family": "ip", "table": "shoal_t", "chain": "svc_3"}}}}]}}"#
        );
        let loaded = loaded_from_json(&json);
        assert_eq!(loaded.chains.len(), 4, "{loaded:?}");
        assert_eq!(loaded.sets.len(), 3, "{loaded:?}");
        // The first endpoint goes: 10.88.2.3 is now endpoint 0, and its set stays as it is.
        let after = vec![affine(&[("10.88.2.3", 8080)])];
        let s = ruleset(
            "shoal_t",
            "10.88.0.0/16".parse().unwrap(),
            &after,
            &[],
            &loaded,
        );
        for chain in ["prerouting", "svc_0", "svc_0_ep_1", "svc_3"] {
            assert!(
                s.contains(&format!("flush chain ip shoal_t {chain}\n")),
                "{s}"
            );
        }
        assert!(s.contains("delete chain ip shoal_t svc_0_ep_1\n"), "{s}");
        assert!(s.contains("delete chain ip shoal_t svc_3\n"), "{s}");
        assert!(!s.contains("delete chain ip shoal_t svc_0\n"), "{s}");
        assert!(
            s.contains(&format!("delete set ip shoal_t {set_a}\n")),
            "{s}"
        );
        assert!(
            s.contains("delete set ip shoal_t svc_0_ep_0_clients\n"),
            "{s}"
        );
        assert!(
            !s.contains(&format!("delete set ip shoal_t {set_b}")),
            "{s}"
        );
        assert!(
            s.contains(&format!("ip saddr @{set_b} goto svc_0_ep_0")),
            "the remaining endpoint's clients still lead to it: {s}"
        );
        assert!(!s.contains("elements"), "a set is never refilled: {s}");
        // Deletions come after every flush (a chain cannot go while a rule jumps to it) and
        // before the definitions.
        let last_flush = s.rfind("flush chain").unwrap();
        let first_delete = s.find("delete ").unwrap();
        let definitions = s.find("table ip shoal_t {\n").unwrap();
        assert!(
            last_flush < first_delete && first_delete < definitions,
            "{s}"
        );
        assert_eq!(loaded_from_json("not json"), Loaded::default());
    }

    /// Host ports as portmap serves them: on the node's own addresses (loopback only when
    /// `hostIP` names it, from the node itself), one address when `hostIP` names it, DNAT to
    /// the pod, masquerade from pods.
    #[test]
    fn host_ports_dnat_the_node_s_addresses_to_their_pods() {
        let rule = |host_ip: Option<&str>, port, protocol: &str| HostPortRule {
            host_ip: host_ip.map(|ip| ip.parse().unwrap()),
            port,
            protocol: protocol.into(),
            pod_ip: "10.88.1.5".parse().unwrap(),
            container_port: 80,
        };
        let rules = [
            rule(None, 8080, "tcp"),
            rule(Some("192.0.2.10"), 5353, "udp"),
            rule(None, 8080, "tcp"),
            rule(None, 9, "icmp"),
        ];
        let s = ruleset(
            "shoal_t",
            "10.88.0.0/16".parse().unwrap(),
            &[],
            &rules,
            &Loaded::default(),
        );
        assert_eq!(
            s.matches("fib daddr type local ip daddr != 127.0.0.0/8 jump hostports")
                .count(),
            2,
            "prerouting and output: {s}"
        );
        assert!(s.contains("tcp dport 8080 goto hp_0\n"), "{s}");
        assert!(
            s.contains("ip daddr 192.0.2.10 udp dport 5353 goto hp_1\n"),
            "{s}"
        );
        assert!(s.contains("meta l4proto tcp dnat to 10.88.1.5:80"), "{s}");
        assert!(s.contains("meta l4proto udp dnat to 10.88.1.5:80"), "{s}");
        assert!(
            s.contains("ip saddr 10.88.0.0/16 meta mark set meta mark | 0x53480000"),
            "{s}"
        );
        assert!(
            !s.contains("hp_2"),
            "duplicates and unknown protocols are left out: {s}"
        );
        assert!(!route_localnet(&rules));
        // A loopback hostIP: reached from the output hook only, masqueraded from any source,
        // and the guard is always there.
        let lo = [rule(Some("127.0.0.1"), 8081, "tcp")];
        let s = ruleset(
            "shoal_t",
            "10.88.0.0/16".parse().unwrap(),
            &[],
            &lo,
            &Loaded::default(),
        );
        assert!(route_localnet(&lo));
        assert!(
            s.contains(
                "  chain hostports_lo {\n    ip daddr 127.0.0.1 tcp dport 8081 goto hp_0\n  }"
            ),
            "{s}"
        );
        assert!(s.contains("  chain hostports {\n    \n  }"), "{s}");
        assert!(
            s.contains("  chain hp_0 {\n    meta mark set meta mark | 0x53480000\n"),
            "{s}"
        );
        assert_eq!(
            s.matches("jump hostports_lo").count(),
            1,
            "output only: {s}"
        );
        assert!(
            s.contains(
                "iifname != \"lo\" ip daddr 127.0.0.0/8 ct state != { established, related } drop"
            ),
            "{s}"
        );
        // With none, the chain is there (the hooks jump to it) and empty.
        let none = ruleset(
            "shoal_t",
            "10.88.0.0/16".parse().unwrap(),
            &[],
            &[],
            &Loaded::default(),
        );
        assert!(none.contains("  chain hostports {\n    \n  }"), "{none}");
    }

    #[test]
    fn a_changed_timeout_makes_a_new_set() {
        let p = affine(&[("10.88.1.2", 8080)]);
        assert_ne!(
            affinity_set(&p, p.endpoints[0], 100),
            affinity_set(&p, p.endpoints[0], 200)
        );
    }
}

//! A network lab of real hosts: one network namespace per agent, each with a veth into a hub
//! namespace holding bridges, and no route anywhere else. Partitions move hosts' links onto
//! separate bridges (a clean L2 split, both directions at once); healing moves them back.
//! Finer faults — one-way and bridge partitions, packet loss — are nftables rules in the
//! receiving host's namespace ([`NetLab::set_filters`]).
//! Everything is removed on drop, also when a test fails. Needs root (CI is root).

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};

/// The lab's hosts live in 10.213.<lab>.0/24, inside namespaces this lab created.
const SUBNET: &str = "10.213";

pub struct NetLab {
    prefix: String,
    lab: u32,
    hosts: usize,
    bridges: usize,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl NetLab {
    /// Creates `hosts` hosts on one bridge.
    pub fn new(hosts: usize) -> anyhow::Result<Self> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // Interface names are limited to 15 bytes: "sh<pid>x<n>v<i>" stays well under.
        Self::with_prefix(
            &format!("sh{}x{n}", pid % 100_000),
            (pid + n) % 250 + 1,
            hosts,
        )
    }

    /// Creates `hosts` hosts whose namespaces and links are named after `prefix` (at most 9
    /// bytes), in subnet 10.213.`lab`.0/24.
    pub fn with_prefix(prefix: &str, lab: u32, hosts: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(
            prefix.len() <= 9,
            "lab prefix {prefix:?} is longer than 9 bytes"
        );
        let prefix = prefix.to_owned();
        let mut this = Self {
            prefix,
            lab,
            hosts: 0,
            bridges: 0,
        };
        let hub = this.hub();
        ip(&["netns", "add", &hub])?;
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        this.add_bridge()?;
        for i in 0..hosts {
            let ns = this.host(i);
            let outer = format!("{}v{i}", this.prefix);
            ip(&["netns", "add", &ns])?;
            this.hosts = i + 1;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n", &hub, "link", "add", &outer, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])?;
            ip(&["-n", &hub, "link", "set", &outer, "master", "br0", "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", this.address(i)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(this)
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    fn add_bridge(&mut self) -> anyhow::Result<String> {
        let name = format!("br{}", self.bridges);
        ip(&["-n", &self.hub(), "link", "add", &name, "type", "bridge"])?;
        ip(&["-n", &self.hub(), "link", "set", &name, "up"])?;
        self.bridges += 1;
        Ok(name)
    }

    /// The network namespace of host `i`.
    pub fn host(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }

    /// Host `i`'s address.
    pub fn address(&self, i: usize) -> std::net::IpAddr {
        format!("{SUBNET}.{}.{}", self.lab, i + 1)
            .parse()
            .expect("valid address")
    }

    /// Splits the hosts into groups that cannot reach each other (each on its own bridge).
    pub fn partition(&mut self, groups: &[&[usize]]) -> anyhow::Result<()> {
        while self.bridges < groups.len() {
            self.add_bridge()?;
        }
        for (g, hosts) in groups.iter().enumerate() {
            for h in *hosts {
                let outer = format!("{}v{h}", self.prefix);
                ip(&[
                    "-n",
                    &self.hub(),
                    "link",
                    "set",
                    &outer,
                    "master",
                    &format!("br{g}"),
                ])?;
            }
        }
        Ok(())
    }

    /// Puts every host back on one bridge.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        let all: Vec<usize> = (0..self.hosts).collect();
        self.partition(&[&all])
    }

    /// Replaces every host's packet filter: packets from `a` to `b` are dropped for each
    /// `(a, b)` of `blocked`, and `percent`% of all packets into `host` for each
    /// `(host, percent)` of `loss`. Empty lists remove the filters.
    pub fn set_filters(
        &self,
        blocked: &[(usize, usize)],
        loss: &[(usize, u8)],
    ) -> anyhow::Result<()> {
        for host in 0..self.hosts {
            let sources: Vec<String> = blocked
                .iter()
                .filter(|(_, to)| *to == host)
                .map(|(from, _)| self.address(*from).to_string())
                .collect();
            let percent = loss.iter().find(|(h, _)| *h == host).map(|(_, p)| *p);
            nft(&self.host(host), &filter_ruleset(&sources, percent))?;
        }
        Ok(())
    }

    /// The lab's hosts.
    pub fn hosts(&self) -> usize {
        self.hosts
    }
}

/// The nftables table the lab owns in each host namespace.
const FILTER_TABLE: &str = "shoalchaos";

/// A ruleset that (re)creates the lab's filter with these drops, or only deletes it.
fn filter_ruleset(sources: &[String], loss_percent: Option<u8>) -> String {
    // Declaring the table first makes the delete valid whether or not it exists.
    let mut rules = format!("table inet {FILTER_TABLE}\ndelete table inet {FILTER_TABLE}\n");
    if sources.is_empty() && loss_percent.is_none() {
        return rules;
    }
    rules.push_str(&format!(
        "table inet {FILTER_TABLE} {{\n  chain input {{\n    type filter hook input priority -10; policy accept;\n"
    ));
    if !sources.is_empty() {
        rules.push_str(&format!("    ip saddr {{ {} }} drop\n", sources.join(", ")));
    }
    if let Some(p) = loss_percent {
        // From the network only: a client on the node itself (loopback) and the node's pods
        // (its bridge) are not on the lossy link.
        rules.push_str(&format!(
            "    iifname \"eth0\" numgen random mod 100 < {p} drop\n"
        ));
    }
    rules.push_str("  }\n}\n");
    rules
}

/// Loads `ruleset` into network namespace `ns` (`nft -f -` inside it).
fn nft(ns: &str, ruleset: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running nft (nftables) in a lab namespace")?;
    child
        .stdin
        .take()
        .context("nft stdin")?
        .write_all(ruleset.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft in {ns}: {}\nruleset:\n{ruleset}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Network namespaces whose names start with `prefix` (what a killed lab left).
pub fn namespaces_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// Deletes network namespaces (and with them their veths, bridges and nftables rules).
pub fn delete_namespaces(names: &[String]) -> Vec<String> {
    let mut failed = Vec::new();
    for name in names {
        if let Err(e) = ip(&["netns", "del", name]) {
            failed.push(format!("{name}: {e}"));
        }
    }
    failed
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for i in 0..self.hosts {
            let _ = ip(&["netns", "del", &self.host(i)]);
        }
        let _ = ip(&["netns", "del", &self.hub()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_drop_the_blocked_sources_and_lose_packets_only_from_the_link() {
        let healed = filter_ruleset(&[], None);
        assert!(
            healed.ends_with("delete table inet shoalchaos\n"),
            "{healed}"
        );
        let cut = filter_ruleset(&["10.0.0.2".into(), "10.0.0.3".into()], Some(30));
        assert!(
            cut.contains("ip saddr { 10.0.0.2, 10.0.0.3 } drop"),
            "{cut}"
        );
        // Loopback (a client on the node) and the node's bridge (its pods) are not the link.
        assert!(
            cut.contains("iifname \"eth0\" numgen random mod 100 < 30 drop"),
            "{cut}"
        );
    }
}

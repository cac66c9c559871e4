//! A network lab of real hosts: one network namespace per agent, each with a veth into a hub
//! namespace holding bridges, and no route anywhere else. Partitions move hosts' links onto
//! separate bridges (a clean L2 split, both directions at once); healing moves them back.
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
        let lab = (pid + n) % 250 + 1;
        // Interface names are limited to 15 bytes: "sh<pid>x<n>v<i>" stays well under.
        let prefix = format!("sh{}x{n}", pid % 100_000);
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
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for i in 0..self.hosts {
            let _ = ip(&["netns", "del", &self.host(i)]);
        }
        let _ = ip(&["netns", "del", &self.hub()]);
    }
}

//! Pod network and DNS benchmarks (root; release build).
//!
//! 1. Pod network setup: in a network namespace this benchmark creates (and removes), a
//!    `BridgeNetwork` on a /24; for `--pods` pods, the time to make the pod's namespace and wire
//!    it (veth pair, address, routes: what the runtime does per sandbox), then to tear it down.
//! 2. DNS queries/s: the same client (`--clients` UDP sockets, one query outstanding each, for
//!    `--seconds`) against Shoal's DNS server (`shoal_net::dns`, in a child process) and against
//!    Debian's dnsmasq, both on loopback and both serving the same `--services` A records.
//!
//! 3. TCP throughput (`--throughput-mib N`): two "node" namespaces joined by a veth link, each
//!    with its bridge, block and a route to the other's block, and a pod namespace on each:
//!    one TCP stream pod→pod across the nodes against one host→host over the same link, same
//!    client and sizes (std sockets, 256 KiB writes), 3 runs each.
//! 4. Endpoint propagation (`--propagation N`): three agents in the netns lab (release `shoal`),
//!    a headless and a ClusterIP Service over N pods, unready until the benchmark creates each
//!    one's file in a hostPath directory (an exec readiness probe, every second). Each pod in
//!    turn is made ready, and the time from its node's API reporting it Ready (polled every
//!    2 ms on that node) until its IP is in the headless Service's DNS answer on all three
//!    nodes (UDP queries every 2 ms from the lab), and until its DNAT rule is in all three
//!    nodes' nftables tables (`nft list ruleset`, every 20 ms; both polled in one loop, each time
//!    taken when its own condition holds), is recorded. Then each pod in turn is deleted through
//!    one agent, and the same two times from the acknowledged delete until it has left them.
//!
//! Usage: cargo build --release -p shoal-agent --bin shoal &&
//!        cargo run --release -p shoal-chaos --bin net-bench -- --pods 100 --services 100 --propagation 30

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RecordType};
use shoal_net::dns::{DnsService, Records};
use shoal_net::linux::BridgeNetwork;
use shoal_net::{PodNetworkPlugin, PodRef, netns};

#[derive(Parser)]
struct Args {
    /// Pods wired for the setup figures.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// A records both DNS servers hold.
    #[arg(long, default_value_t = 100)]
    services: usize,
    /// Concurrent UDP clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds of queries per server.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// MiB sent per throughput run (0: skip).
    #[arg(long, default_value_t = 0)]
    throughput_mib: usize,
    /// Pods deleted one by one for the propagation figures (0: skip).
    #[arg(long, default_value_t = 0)]
    propagation: usize,
    /// Internal: serve Shoal's DNS on this port (the benchmark runs itself with it).
    #[arg(long, hide = true)]
    serve_dns: Option<u16>,
    /// Toy sizes, a few seconds: what CI runs to prove the benchmark still runs and prints
    /// its table (the figures mean nothing; peers not installed are skipped).
    #[arg(long)]
    smoke: bool,
}

fn services(n: usize) -> Vec<DnsService> {
    (0..n)
        .map(|i| DnsService {
            namespace: "default".into(),
            name: format!("svc{i}"),
            cluster_ip: Some(Ipv4Addr::from(
                u32::from(Ipv4Addr::new(10, 96, 0, 10)) + i as u32,
            )),
            headless: false,
            ports: Vec::new(),
            endpoints: Vec::new(),
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn summary(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{what}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples)",
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
        samples.len()
    );
}

/// Removes the namespaces on drop.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = netns::delete(n);
        }
    }
}

fn pod_network(pods: usize) -> anyhow::Result<()> {
    let tag = format!("snb{}", std::process::id() % 100_000);
    let mut names = Namespaces(vec![format!("{tag}-node")]);
    let node = netns::create(&names.0[0])?;
    let node_file = std::fs::File::open(&node)?;
    let result = std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
            nix::sched::setns(node_file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
            let net = BridgeNetwork::new(&tag, None);
            net.set_block("10.251.0.0/24".parse()?, &[])?;
            let mut setup = Vec::new();
            let mut teardown = Vec::new();
            let mut refs = Vec::new();
            for i in 0..pods {
                let name = format!("{tag}-p{i}");
                let start = Instant::now();
                let path = netns::create(&name)?;
                let pod = PodRef {
                    uid: format!("pod-{i}"),
                    netns: path,
                };
                net.setup(&pod)?;
                setup.push(start.elapsed());
                refs.push((name, pod));
            }
            for (name, pod) in &refs {
                let start = Instant::now();
                net.teardown(pod)?;
                netns::delete(name)?;
                teardown.push(start.elapsed());
            }
            net.cleanup(None)?;
            Ok((setup, teardown))
        })
        .join()
        .expect("bench thread")
    });
    names.0.extend((0..pods).map(|i| format!("{tag}-p{i}")));
    let (setup, teardown) = result?;
    summary(
        "pod network setup (namespace + veth + address + route)",
        setup,
    );
    summary("pod network teardown", teardown);
    Ok(())
}

fn query_bytes(name: &str, id: u16) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(
        Name::from_ascii(name).expect("valid name"),
        RecordType::A,
    ));
    m.to_vec().expect("encodes")
}

/// Queries/s the server at `addr` answers, `clients` sockets each with one query in flight.
async fn load(addr: SocketAddr, names: &[String], clients: usize, seconds: u64) -> (f64, u64) {
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let names = names.to_vec();
        let answered = answered.clone();
        let failed = failed.clone();
        tasks.push(tokio::spawn(async move {
            let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            socket.connect(addr).await.unwrap();
            let mut buf = [0u8; 1500];
            let mut i = c;
            while Instant::now() < deadline {
                let id = (i % 65_536) as u16;
                let q = query_bytes(&names[i % names.len()], id);
                i += clients;
                socket.send(&q).await.unwrap();
                match tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut buf)).await
                {
                    Ok(Ok(n)) if n > 12 && buf[..2] == id.to_be_bytes() && buf[7] > 0 => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (
        answered.load(Ordering::Relaxed) as f64 / seconds as f64,
        failed.load(Ordering::Relaxed),
    )
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills the child on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_answering(addr: SocketAddr, name: &str) -> anyhow::Result<()> {
    let names = [name.to_owned()];
    for _ in 0..100 {
        if load(addr, &names, 1, 1).await.0 > 0.0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("no DNS server answering on {addr}")
}

async fn dns(args: &Args) -> anyhow::Result<()> {
    let names: Vec<String> = (0..args.services)
        .map(|i| format!("svc{i}.default.svc.cluster.local."))
        .collect();
    let shoal_port = free_port();
    let _shoal = Child(
        Command::new(std::env::current_exe()?)
            .args([
                "--serve-dns",
                &shoal_port.to_string(),
                "--services",
                &args.services.to_string(),
            ])
            .stdout(Stdio::null())
            .spawn()?,
    );
    let shoal_addr = SocketAddr::from(([127, 0, 0, 1], shoal_port));
    wait_answering(shoal_addr, &names[0]).await?;
    let dnsmasq_port = free_port();
    let mut dnsmasq = Command::new("dnsmasq");
    dnsmasq.args([
        "--keep-in-foreground",
        "--no-resolv",
        "--no-hosts",
        "--no-daemon",
        "--log-facility=/dev/null",
        "--listen-address=127.0.0.1",
        "--bind-interfaces",
        "--cache-size=10000",
        &format!("--port={dnsmasq_port}"),
        "--local=/cluster.local/",
        "--auth-ttl=5",
        "--local-ttl=5",
    ]);
    for (i, s) in services(args.services).iter().enumerate() {
        dnsmasq.arg(format!(
            "--host-record={},{}",
            names[i].trim_end_matches('.'),
            s.cluster_ip.unwrap()
        ));
    }
    let _dnsmasq = Child(
        dnsmasq
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting dnsmasq (apt-get install dnsmasq-base)")?,
    );
    let dnsmasq_addr = SocketAddr::from(([127, 0, 0, 1], dnsmasq_port));
    wait_answering(dnsmasq_addr, &names[0]).await?;
    let (shoal_qps, shoal_failed) = load(shoal_addr, &names, args.clients, args.seconds).await;
    let (dnsmasq_qps, dnsmasq_failed) =
        load(dnsmasq_addr, &names, args.clients, args.seconds).await;
    println!(
        "DNS, {} A records, {} clients, {} s each: shoal {:.0} q/s ({} unanswered), dnsmasq {:.0} q/s ({} unanswered), ratio {:.2}",
        args.services,
        args.clients,
        args.seconds,
        shoal_qps,
        shoal_failed,
        dnsmasq_qps,
        dnsmasq_failed,
        shoal_qps / dnsmasq_qps
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.pods = 2;
        args.services = 2;
        args.clients = 1;
        args.seconds = 1;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Some(port) = args.serve_dns {
        let records = Records::build("cluster.local", &services(args.services));
        let (_tx, rx) = tokio::sync::watch::channel(Arc::new(records));
        // All of the benchmark's clients are one source (127.0.0.1): the per-source limit is
        // lifted out of reach, but its bookkeeping stays in the measured path.
        let limits = shoal_net::dns::DnsLimits {
            per_source: Some(shoal_net::dns::RateLimit {
                queries_per_second: u32::MAX,
                burst: u32::MAX,
                ..Default::default()
            }),
            ..Default::default()
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        return runtime.block_on(async move {
            let udp = tokio::net::UdpSocket::bind(addr).await?;
            let tcp = tokio::net::TcpListener::bind(addr).await?;
            Ok(shoal_net::dns::serve_on(udp, tcp, rx, Vec::new(), limits).await?)
        });
    }
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "net-bench needs root (network namespaces)"
    );
    pod_network(args.pods)?;
    runtime.block_on(dns(&args))?;
    if args.throughput_mib > 0 {
        throughput(args.throughput_mib)?;
    }
    if args.propagation > 0 {
        runtime.block_on(propagation(args.propagation))?;
    }
    Ok(())
}

/// The A records `server` gives for `name`, asked from inside namespace `ns`.
fn lookup_in(ns: &std::path::Path, server: Ipv4Addr, name: &str) -> Option<BTreeSet<Ipv4Addr>> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(ns).ok()?;
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
            let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
            socket
                .set_read_timeout(Some(Duration::from_millis(200)))
                .ok()?;
            // EDNS: thirty A records do not fit the 512 bytes of plain DNS over UDP.
            let mut query = Message::from_vec(&query_bytes(name, 1)).ok()?;
            let mut edns = hickory_proto::op::Edns::new();
            edns.set_max_payload(1232);
            query.set_edns(edns);
            socket.send_to(&query.to_vec().ok()?, (server, 53)).ok()?;
            let mut buf = [0u8; 1500];
            let n = socket.recv(&mut buf).ok()?;
            let reply = Message::from_vec(&buf[..n]).ok()?;
            Some(
                reply
                    .answers
                    .iter()
                    .filter_map(|r| match &r.data {
                        hickory_proto::rr::RData::A(a) => Some(a.0),
                        _ => None,
                    })
                    .collect(),
            )
        })
        .join()
        .ok()
        .flatten()
    })
}

fn nft_rules(ns: &str) -> String {
    Command::new("ip")
        .args(["netns", "exec", ns, "nft", "list", "ruleset"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Polls, from `start`, until `ip` is in (`present`) or out of the headless Service's DNS answer
/// of every server (every 2 ms) and, separately, in or out of the DNAT rules of every lab host
/// (every 20 ms); returns the two times, each taken when its own condition held.
fn until_propagated(
    lab: &shoal_chaos::lab::NetLab,
    host0: &std::path::Path,
    servers: &[Ipv4Addr],
    ip: Ipv4Addr,
    present: bool,
    start: Instant,
    limit: Duration,
) -> anyhow::Result<(Duration, Duration)> {
    let needle = format!("dnat to {ip}:80");
    let mut dns_pending: Vec<Ipv4Addr> = servers.to_vec();
    let mut nft_pending: Vec<usize> = (0..lab.hosts()).collect();
    let (mut dns, mut nft) = (None, None);
    let mut round = 0u64;
    while dns.is_none() || nft.is_none() {
        dns_pending.retain(|s| {
            lookup_in(host0, *s, "bench.default.svc.cluster.local.")
                .is_none_or(|a| a.contains(&ip) != present)
        });
        if dns.is_none() && dns_pending.is_empty() {
            dns = Some(start.elapsed());
        }
        if round.is_multiple_of(10) {
            nft_pending.retain(|h| nft_rules(&lab.host(*h)).contains(&needle) != present);
            if nft.is_none() && nft_pending.is_empty() {
                nft = Some(start.elapsed());
            }
        }
        anyhow::ensure!(
            start.elapsed() < limit,
            "{ip} not {} everywhere after {limit:?}",
            if present { "in" } else { "out" }
        );
        round += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok((dns.unwrap_or_default(), nft.unwrap_or_default()))
}

async fn propagation(pods: usize) -> anyhow::Result<()> {
    use serde_json::json;
    use shoal_chaos::testkit::wait_until;
    let lab = shoal_chaos::lab::NetLab::new(3)?;
    let (_root, agents) = shoal_chaos::start_cluster(
        &lab,
        3,
        &[
            "--pod-network",
            "bridge",
            "--anti-entropy-interval",
            "200ms",
            "--cleanup",
        ],
    )
    .await?;
    for a in &agents {
        shoal_chaos::import_busybox(a)?;
    }
    for (name, ip) in [("bench", "None"), ("bench-ip", "")] {
        let mut spec = json!({"selector": {"app": "bench"}, "ports": [{"name": "p", "port": 80}]});
        if !ip.is_empty() {
            spec["clusterIP"] = json!(ip);
        }
        agents[0]
            .apply(&json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
            .await?;
    }
    // Each pod is ready once the benchmark creates its file in this host directory (a
    // hostPath volume of every pod).
    let ready_dir = tempfile::tempdir()?;
    let ready_path = ready_dir.path().to_str().context("a UTF-8 temp path")?;
    for i in 0..pods {
        agents[0].apply(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("b{i}"), "namespace": "default", "labels": {"app": "bench"}},
            "spec": {"nodeName": format!("n{}", i % 3), "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "r", "hostPath": {"path": ready_path, "type": "Directory"}}],
                "containers": [{
                "name": "c", "image": "shoal.local/busybox:1", "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "r", "mountPath": "/r"}],
                "readinessProbe": {"exec": {"command": ["test", "-e", format!("/r/b{i}")]},
                    "periodSeconds": 1, "failureThreshold": 1}}]}})).await?;
    }
    let limit = Duration::from_secs(120);
    let mut ips = Vec::new();
    for i in 0..pods {
        let name = format!("b{i}");
        let ip = || async {
            agents[0]
                .object("pods", "default", &name)
                .await
                .ok()
                .flatten()
                .and_then(|p| p["status"]["podIP"].as_str()?.parse::<Ipv4Addr>().ok())
        };
        wait_until("the pod's IP", limit, || async { ip().await.is_some() }).await?;
        ips.push(ip().await.expect("waited"));
    }
    // Each node's DNS server: its bridge address (the first host of its block).
    let mut servers = Vec::new();
    let (_, list) = agents[0]
        .call(hyper::Method::GET, "/v1/objects/podcidrblocks", None)
        .await?;
    for o in list["items"].as_array().into_iter().flatten() {
        let block: ipnet::Ipv4Net = o["spec"]["cidr"].as_str().unwrap_or("").parse()?;
        servers.push(block.hosts().next().expect("a host"));
    }
    let host0 = std::path::PathBuf::from(format!("/run/netns/{}", lab.host(0)));
    // Readiness: each pod in turn is made ready; from the moment its node's API reports it
    // Ready (polled on that node), until its IP is in the headless Service's DNS answer of all
    // three nodes, and its DNAT rule in all three nodes' nftables tables.
    let mut dns_ready = Vec::new();
    let mut nft_ready = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let name = format!("b{i}");
        std::fs::write(ready_dir.path().join(&name), b"")?;
        let node = &agents[i % 3];
        let deadline = Instant::now() + limit;
        let start = loop {
            let pod = node.object("pods", "default", &name).await.ok().flatten();
            let ready = pod.as_ref().is_some_and(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            if ready {
                break Instant::now();
            }
            anyhow::ensure!(Instant::now() < deadline, "{name} never ready");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let (dns, nft) = until_propagated(&lab, &host0, &servers, *ip, true, start, limit)?;
        dns_ready.push(dns);
        nft_ready.push(nft);
    }
    summary(
        "pod Ready on its node -> in the DNS answers of all 3 nodes",
        dns_ready,
    );
    summary(
        "pod Ready on its node -> in the nftables rules of all 3 nodes",
        nft_ready,
    );
    let all: BTreeSet<Ipv4Addr> = ips.iter().copied().collect();
    wait_until("every pod in every node's DNS", limit, || async {
        servers.iter().all(|s| {
            lookup_in(&host0, *s, "bench.default.svc.cluster.local.").as_ref() == Some(&all)
        })
    })
    .await?;
    let mut dns_all = Vec::new();
    let mut nft_all = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let start = Instant::now();
        let (code, _) = agents[0]
            .call(
                hyper::Method::DELETE,
                &format!("/v1/objects/pods/b{i}?namespace=default&gracePeriodSeconds=0"),
                None,
            )
            .await?;
        anyhow::ensure!(code == 200, "delete b{i}: {code}");
        let (dns, nft) = until_propagated(&lab, &host0, &servers, *ip, false, start, limit)?;
        dns_all.push(dns);
        nft_all.push(nft);
    }
    summary(
        "pod deleted -> gone from the DNS answers of all 3 nodes",
        dns_all,
    );
    summary(
        "pod deleted -> gone from the nftables rules of all 3 nodes",
        nft_all,
    );
    Ok(())
}

/// Runs `f` on a thread inside namespace `path`.
fn inside<T: Send>(path: &std::path::Path, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(path).expect("namespace");
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("thread")
    })
}

/// Seconds to send `bytes` over one TCP connection from namespace `from` to `to_addr`, which a
/// listener in namespace `to` accepts and drains.
fn one_stream(
    from: &std::path::Path,
    to: &std::path::Path,
    to_addr: SocketAddr,
    bytes: usize,
) -> anyhow::Result<f64> {
    use std::io::{Read, Write};
    let listener = inside(to, || std::net::TcpListener::bind(to_addr))?;
    let server = std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut conn, _) = listener.accept()?;
        let mut buf = vec![0u8; 256 << 10];
        let mut total = 0;
        loop {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
        }
    });
    let start = Instant::now();
    inside(from, || -> std::io::Result<()> {
        let mut conn = std::net::TcpStream::connect(to_addr)?;
        let chunk = vec![7u8; 256 << 10];
        let mut sent = 0;
        while sent < bytes {
            conn.write_all(&chunk)?;
            sent += chunk.len();
        }
        conn.shutdown(std::net::Shutdown::Write)
    })?;
    let received = server.join().expect("server")?;
    anyhow::ensure!(received >= bytes, "received {received} of {bytes}");
    Ok(start.elapsed().as_secs_f64())
}

fn throughput(mib: usize) -> anyhow::Result<()> {
    let tag = format!("snt{}", std::process::id() % 100_000);
    let names = Namespaces(
        ["na", "nb", "pa", "pb"]
            .iter()
            .map(|n| format!("{tag}-{n}"))
            .collect(),
    );
    let paths: Vec<std::path::PathBuf> = names
        .0
        .iter()
        .map(|n| netns::create(n))
        .collect::<Result<_, _>>()?;
    let ip = |args: &[&str]| -> anyhow::Result<()> {
        let out = Command::new("ip").args(args).output()?;
        anyhow::ensure!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    // The link between the two nodes.
    ip(&[
        "link",
        "add",
        &format!("{tag}a"),
        "netns",
        &names.0[0],
        "type",
        "veth",
        "peer",
        "name",
        &format!("{tag}b"),
        "netns",
        &names.0[1],
    ])?;
    for (ns, dev, addr) in [
        (&names.0[0], format!("{tag}a"), "10.252.0.1/24"),
        (&names.0[1], format!("{tag}b"), "10.252.0.2/24"),
    ] {
        ip(&["-n", ns, "addr", "add", addr, "dev", &dev])?;
        ip(&["-n", ns, "link", "set", &dev, "up"])?;
    }
    // As the agent does (`services.rs`): bridged packets pass netfilter in the node namespaces.
    for path in &paths[..2] {
        let set = inside(path, || {
            std::fs::write("/proc/sys/net/bridge/bridge-nf-call-iptables", b"1").and_then(|()| {
                std::fs::read_to_string("/proc/sys/net/bridge/bridge-nf-call-iptables")
            })
        });
        match set {
            Ok(value) => println!(
                "bridge-nf-call-iptables in node namespace {}: {}",
                path.display(),
                value.trim()
            ),
            Err(e) => println!(
                "bridge-nf-call-iptables not set in {} ({e}): is br_netfilter loaded?",
                path.display()
            ),
        }
    }
    let node = |i: usize,
                block: &str,
                peer_block: &str,
                peer: &str,
                own: &str|
     -> anyhow::Result<shoal_net::PodNetwork> {
        let pod = PodRef {
            uid: format!("tp-{i}"),
            netns: paths[2 + i].clone(),
        };
        inside(&paths[i], || -> anyhow::Result<shoal_net::PodNetwork> {
            let net = BridgeNetwork::new(&format!("{tag}{i}"), Some(own.parse()?));
            net.set_block(block.parse()?, &[])?;
            net.sync_routes(&[shoal_net::linux::Route {
                block: peer_block.parse()?,
                via: peer.parse()?,
            }])?;
            Ok(net.setup(&pod)?.expect("a bridge network gives addresses"))
        })
    };
    let a = node(
        0,
        "10.251.1.0/24",
        "10.251.2.0/24",
        "10.252.0.2",
        "10.252.0.1",
    )?;
    let b = node(
        1,
        "10.251.2.0/24",
        "10.251.1.0/24",
        "10.252.0.1",
        "10.252.0.2",
    )?;
    let bytes = mib << 20;
    let mut pod_rates = Vec::new();
    let mut host_rates = Vec::new();
    for run in 0..3u16 {
        let t = one_stream(
            &paths[2],
            &paths[3],
            SocketAddr::from((b.ip, 5001 + run)),
            bytes,
        )?;
        pod_rates.push(bytes as f64 * 8.0 / t / 1e9);
        let t = one_stream(
            &paths[0],
            &paths[1],
            SocketAddr::from(([10, 252, 0, 2], 5101 + run)),
            bytes,
        )?;
        host_rates.push(bytes as f64 * 8.0 / t / 1e9);
    }
    let _ = a;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, h) = (median(&mut pod_rates), median(&mut host_rates));
    println!(
        "TCP, one stream of {mib} MiB, median of 3: pod->pod across nodes {p:.2} Gbit/s, host->host on the same link {h:.2} Gbit/s, ratio {:.2} (runs: pod {:?}, host {:?})",
        p / h,
        pod_rates
            .iter()
            .map(|r| (r * 100.0).round() / 100.0)
            .collect::<Vec<_>>(),
        host_rates
            .iter()
            .map(|r| (r * 100.0).round() / 100.0)
            .collect::<Vec<_>>(),
    );
    Ok(())
}

//! Membership benchmark: Shoal agents side by side with HashiCorp Serf, as real processes on
//! loopback, in the same run, observed by the same method.
//!
//! **compare** (default): for each cluster size N and each run, start N agents and wait until
//! they agree; count the bytes each agent's port sends and receives over a quiet window; start
//! one more agent and time until all N+1 see it alive; SIGSTOP it (a silent failure) and time
//! until all N see it dead; SIGCONT, wait until it is alive again, kill -9 it and time until all N
//! see it dead. Agent RSS is sampled once the N agents have converged, agent CPU (utime + stime
//! from /proc) over the quiet window.
//!
//! Both systems are observed the same way: every agent is asked for its member list over its
//! local RPC interface every `--poll-ms` (Shoal: `GET /v1/members` on the control socket, what
//! `shoal members` does; Serf: the `members` command of its msgpack RPC, what `serf members`
//! does), one fresh connection per request, all agents polled concurrently. An earlier version
//! timed Serf through event handlers, which Serf's agent coalesces before running them, and so
//! reported Serf a second slower than it is.
//!
//! Gossip cost: an nftables table in this (root) namespace counts, on loopback, every packet
//! whose source or destination port is an agent's gossip port (Shoal: its one QUIC port, which
//! also carries the idle store's anti-entropy; Serf: its memberlist UDP and TCP port), bytes
//! with IP headers. The table is removed at the end, also on failure.
//!
//! **--soak**: N Shoal agents, a CPU hog per core and a stream of store writes, for `--minutes`;
//! counts every suspect or dead transition of a node that was alive all along (false suspicions),
//! from each agent's own membership log, and every poll (once a second, every agent) that shows a
//! member not alive. `--stall-ms` stops one agent on purpose, to show both counts catch it.
//!
//! **--in-memory N**: N memberships in this process over chitchat's in-memory transport:
//! bytes/s of gossip per node and the digest size, against chitchat's one-message limit.
//!
//! Usage:
//!   membership-bench --sizes 10,30 --runs 3
//!   membership-bench --soak --nodes 10 --minutes 10 [--stall-ms 2000]
//!   membership-bench --in-memory 100 --seconds 20

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_trait::async_trait;
use chitchat::transport::{Socket, Transport};
use chitchat::{ChitchatMessage, Serializable};
use clap::Parser;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use shoal_agent::client::ControlClient;
use shoal_chaos::testkit::{AgentProcess, AgentSpec, init_secret, rss_bytes_of, wait_until};
use shoal_gossip::{
    Capacity, ChannelTransport, MemberState, Membership, MembershipConfig, NodeAddresses, NodeMeta,
};

#[derive(Parser)]
struct Args {
    /// Cluster sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "10,30")]
    sizes: Vec<usize>,
    /// Runs per size (medians are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Period at which every agent of either system is asked for its members.
    #[arg(long, default_value_t = 50)]
    poll_ms: u64,
    /// Quiet window over which gossip traffic is counted.
    #[arg(long, default_value_t = 10)]
    traffic_seconds: u64,
    /// The `shoal` binary (default: next to this benchmark's binary).
    #[arg(long)]
    shoal: Option<PathBuf>,
    /// The `serf` binary.
    #[arg(long, default_value = "serf")]
    serf: PathBuf,
    /// Skip Serf (e.g. where it is not installed).
    #[arg(long)]
    no_serf: bool,
    /// Extra arguments for every Shoal agent (e.g. `--gossip-interval=100ms`).
    #[arg(long, allow_hyphen_values = true)]
    shoal_arg: Vec<String>,
    /// Run the false-suspicion soak instead of the comparison.
    #[arg(long)]
    soak: bool,
    /// Soak: agents.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// Soak: duration.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// Soak: CPU hogs (busy processes); default one per core.
    #[arg(long)]
    hogs: Option<usize>,
    /// Soak: store writes per second, each to a random agent.
    #[arg(long, default_value_t = 20)]
    writes_per_sec: u64,
    /// Soak: SIGSTOP one agent for this long halfway through — a deliberate violation, to show
    /// that the count of false suspicions is not blind.
    #[arg(long)]
    stall_ms: Option<u64>,
    /// Run N memberships in this process over the in-memory transport instead.
    #[arg(long)]
    in_memory: Option<usize>,
    /// In-memory: seconds of steady gossip measured.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Toy sizes, a few seconds: what CI runs to prove the benchmark still runs and prints
    /// its table (the figures mean nothing; peers not installed are skipped).
    #[arg(long)]
    smoke: bool,
}

/// One run's figures, in seconds (RSS in bytes, traffic in bytes/s per node).
#[derive(Debug, Default, Clone)]
struct Run {
    join_seen_by_all: f64,
    stop_seen_dead_by_all: f64,
    kill_seen_dead_by_all: f64,
    rss_bytes: f64,
    sent_per_node: f64,
    received_per_node: f64,
    /// CPU time per agent over the quiet window, % of one core.
    cpu_percent: f64,
}

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.sizes = vec![3];
        args.runs = 1;
        args.traffic_seconds = 1;
        args.no_serf |= !shoal_chaos::testkit::on_path(&args.serf);
    }
    if let Some(n) = args.in_memory {
        return in_memory(n, Duration::from_secs(args.seconds)).await;
    }
    let shoal = match args.shoal.clone() {
        Some(path) => path,
        None => std::env::current_exe()?
            .parent()
            .context("benchmark binary has a directory")?
            .join("shoal"),
    };
    if !shoal.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p shoal-agent`",
            shoal.display()
        );
    }
    if args.soak {
        return soak(&shoal, &args).await;
    }
    let period = Duration::from_millis(args.poll_ms);
    let window = Duration::from_secs(args.traffic_seconds);
    let mut rows = Vec::new();
    for &n in &args.sizes {
        let mut shoal_runs = Vec::new();
        let mut serf_runs = Vec::new();
        for run in 0..args.runs {
            eprintln!("N={n} run {}/{}: shoal", run + 1, args.runs);
            shoal_runs.push(shoal_run(&shoal, &args.shoal_arg, n, period, window).await?);
            eprintln!("  {:?}", shoal_runs.last().unwrap());
            if !args.no_serf {
                eprintln!("N={n} run {}/{}: serf", run + 1, args.runs);
                serf_runs.push(serf_run(&args.serf, n, period, window).await?);
                eprintln!("  {:?}", serf_runs.last().unwrap());
            }
        }
        rows.push((
            n,
            median_run(&shoal_runs),
            (!serf_runs.is_empty()).then(|| median_run(&serf_runs)),
        ));
    }
    println!(
        "| N | figure (median of {}, polled every {} ms) | Shoal | Serf | Shoal / Serf |",
        args.runs, args.poll_ms
    );
    println!("|---|---|---|---|---|");
    for (n, shoal, serf) in rows {
        type Figure = (&'static str, fn(&Run) -> f64, &'static str);
        let figures: [Figure; 7] = [
            ("new node seen alive by all", |r| r.join_seen_by_all, "s"),
            (
                "stopped node (SIGSTOP) seen dead by all",
                |r| r.stop_seen_dead_by_all,
                "s",
            ),
            (
                "killed node (kill -9) seen dead by all",
                |r| r.kill_seen_dead_by_all,
                "s",
            ),
            ("agent RSS", |r| r.rss_bytes / 1e6, "MB"),
            ("agent CPU, idle cluster", |r| r.cpu_percent, "% of a core"),
            (
                "gossip port, bytes sent per node",
                |r| r.sent_per_node / 1e3,
                "kB/s",
            ),
            (
                "gossip port, bytes received per node",
                |r| r.received_per_node / 1e3,
                "kB/s",
            ),
        ];
        for (name, pick, unit) in figures {
            let ours = pick(&shoal);
            let (theirs_s, ratio) = match &serf {
                Some(s) => (
                    format!("{:.2} {unit}", pick(s)),
                    format!("{:.2}", ours / pick(s)),
                ),
                None => ("–".into(), "–".into()),
            };
            println!("| {n} | {name} | {ours:.2} {unit} | {theirs_s} | {ratio} |");
        }
    }
    Ok(())
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    if xs.is_empty() {
        return f64::NAN;
    }
    let mid = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        (xs[mid - 1] + xs[mid]) / 2.0
    }
}

fn median_run(runs: &[Run]) -> Run {
    let pick = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    Run {
        join_seen_by_all: pick(|r| r.join_seen_by_all),
        stop_seen_dead_by_all: pick(|r| r.stop_seen_dead_by_all),
        kill_seen_dead_by_all: pick(|r| r.kill_seen_dead_by_all),
        rss_bytes: pick(|r| r.rss_bytes),
        sent_per_node: pick(|r| r.sent_per_node),
        received_per_node: pick(|r| r.received_per_node),
        cpu_percent: pick(|r| r.cpu_percent),
    }
}

// ---------------------------------------------------------------- observing, the same for both

/// How a member looks to one observer, in terms both systems share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Alive,
    Dead,
    /// Joining or suspect (Shoal), leaving or left (Serf), or not listed.
    Other,
}

/// One agent's member list, reached over its local RPC interface.
#[derive(Clone)]
enum Probe {
    Shoal(ControlClient),
    Serf(SocketAddr),
}

impl Probe {
    /// Every member this agent lists, by name; `None` if the agent did not answer.
    async fn members(&self) -> Option<BTreeMap<String, Seen>> {
        match self {
            Probe::Shoal(client) => {
                let members = client.members().await.ok()?;
                Some(
                    members
                        .iter()
                        .map(|m| {
                            let seen = match m.state {
                                MemberState::Alive => Seen::Alive,
                                MemberState::Dead => Seen::Dead,
                                MemberState::Joining | MemberState::Suspect => Seen::Other,
                            };
                            (m.name().to_owned(), seen)
                        })
                        .collect(),
                )
            }
            Probe::Serf(rpc) => {
                let rpc = *rpc;
                let members = tokio::task::spawn_blocking(move || serf_members(rpc))
                    .await
                    .ok()?
                    .ok()?;
                Some(
                    members
                        .into_iter()
                        .map(|m| {
                            let seen = match m.status.as_str() {
                                "alive" => Seen::Alive,
                                "failed" => Seen::Dead,
                                _ => Seen::Other,
                            };
                            (m.name, seen)
                        })
                        .collect(),
                )
            }
        }
    }
}

/// Polls every probe every `period` (concurrently, one request per probe per period) until each
/// sees `name` as `want`; returns the time from `since` to the last observer's first sight.
async fn seen_by_all(
    probes: &[Probe],
    name: &str,
    want: Seen,
    since: Instant,
    period: Duration,
) -> anyhow::Result<f64> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, probe) in probes.iter().enumerate() {
        let (probe, name) = (probe.clone(), name.to_owned());
        tasks.spawn(async move {
            let mut ticker = tokio::time::interval(period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let members = probe.members().await;
                if members.is_some_and(|m| m.get(&name) == Some(&want)) {
                    return Ok(since.elapsed().as_secs_f64());
                }
                if since.elapsed() > LIMIT {
                    bail!("observer {i} never saw {name} {want:?} in {LIMIT:?}");
                }
            }
        });
    }
    let mut last = 0f64;
    while let Some(result) = tasks.join_next().await {
        last = last.max(result??);
    }
    Ok(last)
}

/// Waits until every probe lists exactly `n` alive members.
async fn converged(probes: &[Probe], n: usize, period: Duration) -> anyhow::Result<()> {
    for (i, probe) in probes.iter().enumerate() {
        wait_until(&format!("observer {i} to see {n} alive"), LIMIT, || async {
            tokio::time::sleep(period).await;
            probe
                .members()
                .await
                .is_some_and(|m| m.values().filter(|s| **s == Seen::Alive).count() == n)
        })
        .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------- gossip traffic (nftables)

/// Byte counters on loopback for a set of ports, in a table of this process's own; removed on
/// drop.
struct PortCounters {
    table: String,
}

impl PortCounters {
    fn new(ports: &[u16]) -> anyhow::Result<Self> {
        let table = format!("shoalbench{}", std::process::id());
        let mut script = format!(
            "table inet {table} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n"
        );
        for port in ports {
            script.push_str(&format!(
                "    oifname \"lo\" meta l4proto {{ tcp, udp }} th sport {port} counter comment \"s{port}\"\n    oifname \"lo\" meta l4proto {{ tcp, udp }} th dport {port} counter comment \"r{port}\"\n"
            ));
        }
        script.push_str("  }\n}\n");
        nft(&script, &[])?;
        Ok(Self { table })
    }

    /// (bytes sent, bytes received) summed over all ports.
    fn totals(&self) -> anyhow::Result<(u64, u64)> {
        let out = Command::new("nft")
            .args(["-j", "list", "table", "inet", &self.table])
            .output()
            .context("running nft (apt-get install nftables)")?;
        if !out.status.success() {
            bail!("nft list: {}", String::from_utf8_lossy(&out.stderr));
        }
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let (mut sent, mut received) = (0, 0);
        for item in json["nftables"].as_array().into_iter().flatten() {
            let Some(rule) = item.get("rule") else {
                continue;
            };
            let comment = rule["comment"].as_str().unwrap_or("");
            let bytes = rule["expr"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|e| e["counter"]["bytes"].as_u64())
                .unwrap_or(0);
            if comment.starts_with('s') {
                sent += bytes;
            } else if comment.starts_with('r') {
                received += bytes;
            }
        }
        Ok((sent, received))
    }
}

impl Drop for PortCounters {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

fn nft(script: &str, args: &[&str]) -> anyhow::Result<()> {
    let mut child = Command::new("nft")
        .args(args)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft (apt-get install nftables; root needed)")?;
    child
        .stdin
        .take()
        .context("nft stdin")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft -f: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Over a quiet `window`: mean bytes/s sent and received per port, and the median CPU use of
/// the processes (% of one core).
async fn traffic(ports: &[u16], pids: &[u32], window: Duration) -> anyhow::Result<(f64, f64, f64)> {
    let counters = PortCounters::new(ports)?;
    let before: Vec<Option<u64>> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    tokio::time::sleep(window).await;
    let after: Vec<Option<u64>> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    let (sent, received) = counters.totals()?;
    let per = |b: u64| b as f64 / window.as_secs_f64() / ports.len() as f64;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpu = median(
        before
            .iter()
            .zip(&after)
            .filter_map(|(b, a)| Some((a.as_ref()? - b.as_ref()?) as f64))
            .map(|ticks| ticks / hz / window.as_secs_f64() * 100.0)
            .collect(),
    );
    Ok((per(sent), per(received), cpu))
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = &stat[stat.rfind(") ")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

// ---------------------------------------------------------------- Shoal

async fn shoal_run(
    binary: &Path,
    extra: &[String],
    n: usize,
    period: Duration,
    window: Duration,
) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("secret");
    init_secret(binary, &secret)?;
    let spec = |name: &str| {
        let mut spec = AgentSpec::new(binary, dir.path(), name, &secret);
        for arg in extra {
            spec = spec.arg(arg.clone());
        }
        spec
    };
    let seed = AgentProcess::start(spec("a0")).await?;
    let seed_addr = seed.gossip_addr();
    let mut agents = vec![seed];
    for i in 1..n {
        agents.push(AgentProcess::start(spec(&format!("a{i}")).join(seed_addr)).await?);
    }
    let probe = |a: &AgentProcess| Probe::Shoal(a.client().clone());
    let mut probes: Vec<Probe> = agents.iter().map(probe).collect();
    converged(&probes, n, period).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss = median(
        agents
            .iter()
            .filter_map(|a| a.rss_bytes())
            .map(|b| b as f64)
            .collect(),
    );
    let ports: Vec<u16> = agents.iter().map(|a| a.gossip_addr().port()).collect();
    let pids: Vec<u32> = agents.iter().filter_map(|a| a.pid()).collect();
    let (sent, received, cpu) = traffic(&ports, &pids, window).await?;

    let join_target = agents[n / 2].gossip_addr();
    let start = Instant::now();
    let mut new = AgentProcess::start(spec("new").join(join_target)).await?;
    eprintln!(
        "  new agent's control socket answered after {:.3} s",
        start.elapsed().as_secs_f64()
    );
    probes.push(probe(&new));
    let join = seen_by_all(&probes, "new", Seen::Alive, start, period).await?;
    probes.pop();

    let start = Instant::now();
    new.pause()?;
    let stop = seen_by_all(&probes, "new", Seen::Dead, start, period).await?;
    new.resume()?;
    seen_by_all(&probes, "new", Seen::Alive, Instant::now(), period).await?;
    let start = Instant::now();
    new.kill()?;
    let kill = seen_by_all(&probes, "new", Seen::Dead, start, period).await?;
    Ok(Run {
        join_seen_by_all: join,
        stop_seen_dead_by_all: stop,
        kill_seen_dead_by_all: kill,
        rss_bytes: rss,
        sent_per_node: sent,
        received_per_node: received,
        cpu_percent: cpu,
    })
}

// ---------------------------------------------------------------- Serf

struct SerfAgent {
    child: Option<Child>,
    rpc: SocketAddr,
    port: u16,
}

impl Drop for SerfAgent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Continued, so that SIGKILL takes effect.
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A port free on both TCP and UDP (Serf uses both), never handed out twice by this process.
fn free_port() -> anyhow::Result<u16> {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    if NEXT.load(Ordering::Relaxed) == 0 {
        let base = 20_000 + (std::process::id() % 20_000) as u16;
        let _ = NEXT.compare_exchange(0, base, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..1000 {
        let port = NEXT.fetch_add(1, Ordering::Relaxed);
        if port < 1024 {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return Ok(port);
        }
    }
    bail!("no free port")
}

fn start_serf(
    binary: &Path,
    dir: &Path,
    name: &str,
    join: Option<u16>,
) -> anyhow::Result<SerfAgent> {
    let port = free_port()?;
    let rpc_port = free_port()?;
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let mut cmd = Command::new(binary);
    cmd.arg("agent")
        .arg(format!("-node={name}"))
        .arg(format!("-bind=127.0.0.1:{port}"))
        .arg(format!("-rpc-addr=127.0.0.1:{rpc_port}"))
        .arg("-log-level=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(j) = join {
        cmd.arg(format!("-join=127.0.0.1:{j}"));
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    Ok(SerfAgent {
        child: Some(child),
        rpc: ([127, 0, 0, 1], rpc_port).into(),
        port,
    })
}

#[derive(Serialize)]
struct SerfRequest<'a> {
    #[serde(rename = "Command")]
    command: &'a str,
    #[serde(rename = "Seq")]
    seq: u64,
}

#[derive(Serialize)]
struct SerfHandshake {
    #[serde(rename = "Version")]
    version: i32,
}

#[derive(Deserialize)]
struct SerfResponse {
    #[serde(rename = "Seq")]
    seq: u64,
    #[serde(rename = "Error")]
    error: String,
}

#[derive(Deserialize)]
struct SerfMembers {
    #[serde(rename = "Members")]
    members: Vec<SerfMember>,
}

#[derive(Deserialize)]
struct SerfMember {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "Status")]
    status: String,
}

/// `serf members` over Serf's RPC protocol (msgpack headers and bodies on a TCP stream,
/// handshake first), on a fresh connection like the CLI's.
fn serf_members(rpc: SocketAddr) -> anyhow::Result<Vec<SerfMember>> {
    let stream = TcpStream::connect_timeout(&rpc, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_nodelay(true)?;
    let mut request = Vec::new();
    rmp_serde::encode::write_named(
        &mut request,
        &SerfRequest {
            command: "handshake",
            seq: 0,
        },
    )?;
    rmp_serde::encode::write_named(&mut request, &SerfHandshake { version: 1 })?;
    rmp_serde::encode::write_named(
        &mut request,
        &SerfRequest {
            command: "members",
            seq: 1,
        },
    )?;
    (&stream).write_all(&request)?;
    let mut reader = BufReader::new(&stream);
    for seq in [0, 1] {
        let header: SerfResponse = rmp_serde::from_read(&mut reader)?;
        if header.seq != seq || !header.error.is_empty() {
            bail!(
                "serf rpc {rpc}: seq {} error {:?}",
                header.seq,
                header.error
            );
        }
    }
    let body: SerfMembers = rmp_serde::from_read(&mut reader)?;
    Ok(body.members)
}

async fn serf_run(
    binary: &Path,
    n: usize,
    period: Duration,
    window: Duration,
) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    let seed = start_serf(binary, dir.path(), "s0", None)?;
    let seed_port = seed.port;
    // Like Shoal's test kit, wait for each agent to answer before starting the next: a Serf
    // agent whose -join finds nobody listening gives up.
    let answers = |a: &SerfAgent| {
        let probe = Probe::Serf(a.rpc);
        async move {
            wait_until("serf agent to answer", LIMIT, || async {
                probe.members().await.is_some()
            })
            .await
        }
    };
    answers(&seed).await?;
    let mut agents = vec![seed];
    for i in 1..n {
        let agent = start_serf(binary, dir.path(), &format!("s{i}"), Some(seed_port))?;
        answers(&agent).await?;
        agents.push(agent);
    }
    let mut probes: Vec<Probe> = agents.iter().map(|a| Probe::Serf(a.rpc)).collect();
    converged(&probes, n, period).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss = median(
        agents
            .iter()
            .filter_map(|a| rss_bytes_of(a.child.as_ref()?.id()))
            .map(|b| b as f64)
            .collect(),
    );
    let ports: Vec<u16> = agents.iter().map(|a| a.port).collect();
    let pids: Vec<u32> = agents
        .iter()
        .filter_map(|a| Some(a.child.as_ref()?.id()))
        .collect();
    let (sent, received, cpu) = traffic(&ports, &pids, window).await?;

    let start = Instant::now();
    let mut new = start_serf(binary, dir.path(), "new", Some(agents[n / 2].port))?;
    probes.push(Probe::Serf(new.rpc));
    let join = seen_by_all(&probes, "new", Seen::Alive, start, period).await?;
    probes.pop();

    let pid = Pid::from_raw(new.child.as_ref().context("running")?.id() as i32);
    let start = Instant::now();
    kill(pid, Signal::SIGSTOP)?;
    let stop = seen_by_all(&probes, "new", Seen::Dead, start, period).await?;
    kill(pid, Signal::SIGCONT)?;
    seen_by_all(&probes, "new", Seen::Alive, Instant::now(), period).await?;
    let start = Instant::now();
    let mut child = new.child.take().context("running")?;
    let killed = child.kill();
    child.wait()?;
    killed?;
    let kill = seen_by_all(&probes, "new", Seen::Dead, start, period).await?;
    Ok(Run {
        join_seen_by_all: join,
        stop_seen_dead_by_all: stop,
        kill_seen_dead_by_all: kill,
        rss_bytes: rss,
        sent_per_node: sent,
        received_per_node: received,
        cpu_percent: cpu,
    })
}

// ---------------------------------------------------------------- soak

/// A busy process (killed on drop).
struct Hog(Child);

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn soak(binary: &Path, args: &Args) -> anyhow::Result<()> {
    let n = args.nodes;
    let period = Duration::from_millis(args.poll_ms.max(100));
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("secret");
    init_secret(binary, &secret)?;
    let spec = |name: &str| {
        let mut spec = AgentSpec::new(binary, dir.path(), name, &secret);
        for arg in &args.shoal_arg {
            spec = spec.arg(arg.clone());
        }
        spec
    };
    let seed = AgentProcess::start(spec("a0")).await?;
    let seed_addr = seed.gossip_addr();
    let mut agents = vec![seed];
    for i in 1..n {
        agents.push(AgentProcess::start(spec(&format!("a{i}")).join(seed_addr)).await?);
    }
    let probes: Vec<Probe> = agents
        .iter()
        .map(|a| Probe::Shoal(a.client().clone()))
        .collect();
    converged(&probes, n, period).await?;
    // Transitions logged before this point (joins) are not counted.
    let skip: Vec<usize> = agents.iter().map(|a| a.log().lines().count()).collect();

    let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
    let hogs: Vec<Hog> = (0..args.hogs.unwrap_or(cores))
        .map(|_| {
            Command::new("sha256sum")
                .arg("/dev/zero")
                .stdout(Stdio::null())
                .spawn()
                .map(Hog)
        })
        .collect::<Result<_, _>>()
        .context("starting sha256sum /dev/zero as a CPU hog")?;
    eprintln!(
        "soak: {n} agents, {} hogs, {} writes/s, {} min",
        hogs.len(),
        args.writes_per_sec,
        args.minutes
    );
    let end = Instant::now() + Duration::from_secs(args.minutes * 60);
    let (mut writes, mut failed_writes) = (0u64, 0u64);
    let mut ticker = tokio::time::interval(Duration::from_micros(
        1_000_000 / args.writes_per_sec.max(1),
    ));
    // Every agent polled once a second, concurrently with the writes.
    let poller = {
        let probes = probes.clone();
        tokio::spawn(async move {
            let mut not_alive = 0u64;
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_secs(1)).await;
                // Concurrently, each with a deadline: a stopped agent does not answer.
                let answers = futures_util::future::join_all(probes.iter().map(|probe| {
                    tokio::time::timeout(Duration::from_millis(500), probe.members())
                }))
                .await;
                for members in answers.into_iter().flatten().flatten() {
                    not_alive += members.values().filter(|s| **s != Seen::Alive).count() as u64
                        + n.saturating_sub(members.len()) as u64;
                }
            }
            not_alive
        })
    };
    let mut stall = args.stall_ms.map(|ms| {
        (
            end - Duration::from_secs(args.minutes * 30),
            Duration::from_millis(ms),
        )
    });
    while Instant::now() < end {
        ticker.tick().await;
        if let Some((at, length)) = stall
            && Instant::now() >= at
        {
            eprintln!(
                "soak: stopping {} for {length:?} (deliberate)",
                agents[1].name()
            );
            let pid = Pid::from_raw(agents[1].pid().context("a1 runs")? as i32);
            kill(pid, Signal::SIGSTOP)?;
            // Continued from a task, so writes and polls go on meanwhile.
            tokio::spawn(async move {
                tokio::time::sleep(length).await;
                let _ = kill(pid, Signal::SIGCONT);
            });
            stall = None;
        }
        let agent = &agents[(writes as usize) % n];
        let object = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("soak-{}", writes % 500), "namespace": "default"},
            "data": {"value": writes.to_string()},
        });
        match agent.apply(&object).await {
            Ok((status, _)) if status < 300 => {}
            _ => failed_writes += 1,
        }
        writes += 1;
    }
    drop(hogs);
    let polls_not_alive = poller.await?;
    let mut transitions: BTreeMap<String, u64> = BTreeMap::new();
    for (agent, skip) in agents.iter().zip(skip) {
        for line in agent.log().lines().skip(skip) {
            if !line.contains("member changed") {
                continue;
            }
            let to = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("to="))
                .unwrap_or("?");
            *transitions.entry(to.to_owned()).or_default() += 1;
        }
    }
    println!(
        "| agents | CPU hogs | minutes | store writes (failed) | member-state transitions of live nodes | polled not-alive sightings |"
    );
    println!("|---|---|---|---|---|---|");
    let summary = if transitions.is_empty() {
        "0".to_owned()
    } else {
        transitions
            .iter()
            .map(|(to, count)| format!("{count} to {to}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "| {n} | {} | {} | {writes} ({failed_writes}) | {summary} | {polls_not_alive} |",
        args.hogs.unwrap_or(cores),
        args.minutes
    );
    Ok(())
}

// ---------------------------------------------------------------- in memory

/// Counts what every socket opened on it sends (serialized bytes, as on the wire before QUIC)
/// and remembers the largest digest.
#[derive(Clone)]
struct Counting {
    inner: ChannelTransport,
    bytes: Arc<AtomicU64>,
    largest_syn: Arc<AtomicUsize>,
}

#[async_trait]
impl Transport for Counting {
    async fn open(&self, addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        Ok(Box::new(CountingSocket {
            inner: self.inner.open(addr).await?,
            bytes: self.bytes.clone(),
            largest_syn: self.largest_syn.clone(),
        }))
    }
}

struct CountingSocket {
    inner: Box<dyn Socket>,
    bytes: Arc<AtomicU64>,
    largest_syn: Arc<AtomicUsize>,
}

#[async_trait]
impl Socket for CountingSocket {
    async fn send(&mut self, to: SocketAddr, msg: ChitchatMessage) -> anyhow::Result<()> {
        let len = msg.serialized_len();
        self.bytes.fetch_add(len as u64, Ordering::Relaxed);
        if matches!(msg, ChitchatMessage::Syn { .. }) {
            self.largest_syn.fetch_max(len, Ordering::Relaxed);
        }
        self.inner.send(to, msg).await
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        self.inner.recv().await
    }
}

fn sim_meta(i: usize, addr: SocketAddr) -> NodeMeta {
    NodeMeta {
        name: format!("node-{i:03}"),
        labels: [("kubernetes.io/hostname".to_owned(), format!("node-{i:03}"))].into(),
        addresses: NodeAddresses {
            gossip: addr,
            api: None,
        },
        capacity: Capacity {
            cpu_millis: 2000,
            memory_bytes: 24 << 30,
            pods: 110,
            volume_bytes: None,
        },
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        info: None,
        taints: Vec::new(),
    }
}

async fn in_memory(n: usize, window: Duration) -> anyhow::Result<()> {
    let transport = Counting {
        inner: ChannelTransport::with_mtu(65_507),
        bytes: Arc::new(AtomicU64::new(0)),
        largest_syn: Arc::new(AtomicUsize::new(0)),
    };
    let mut nodes = Vec::new();
    let seed: SocketAddr = ([127, 0, 0, 1], 20_000).into();
    for i in 0..n {
        let addr: SocketAddr = ([127, 0, 0, 1], 20_000 + i as u16).into();
        // Node ids shaped like real ones (16 hex digits).
        let mut config = MembershipConfig::new(format!("{:016x}", 0xabc0_0000 + i), 1, "sim", addr);
        if i > 0 {
            config.seeds = vec![seed.to_string()];
        }
        nodes.push(Membership::start(config, &sim_meta(i, addr), &transport).await?);
    }
    wait_until("all nodes to see all alive", LIMIT * 2, || async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        for node in &nodes {
            let alive = node
                .members()
                .await
                .iter()
                .filter(|m| m.state == MemberState::Alive)
                .count();
            if alive != n {
                return false;
            }
        }
        true
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = transport.bytes.load(Ordering::Relaxed);
    transport.largest_syn.store(0, Ordering::Relaxed);
    tokio::time::sleep(window).await;
    let sent = transport.bytes.load(Ordering::Relaxed) - before;
    let syn = transport.largest_syn.load(Ordering::Relaxed);
    let per_node = sent as f64 / window.as_secs_f64() / n as f64;
    // A Syn is the cluster id plus one digest entry per node; the digest must leave room for a
    // delta in the 65,507-byte message (chitchat's MAX_UDP_DATAGRAM_PAYLOAD_SIZE).
    let per_entry = syn as f64 / n as f64;
    println!(
        "| nodes (one process, in-memory transport) | gossip sent per node | largest digest (Syn) | bytes per node in the digest | nodes at which the digest alone fills 65,507 B |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| {n} | {:.2} kB/s | {syn} B | {per_entry:.1} B | ~{:.0} |",
        per_node / 1e3,
        65_507.0 / per_entry
    );
    for node in nodes {
        node.shutdown().await;
    }
    Ok(())
}

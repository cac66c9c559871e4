//! Membership benchmark: Shoal agents side by side with HashiCorp Serf, as real processes on
//! loopback, in the same run.
//!
//! For each cluster size N and each run: start N agents and wait until they agree; start one more
//! and time until all N+1 see it alive; SIGSTOP it (silent failure) and time until all N see it
//! dead; SIGCONT, wait until it is alive again, kill -9 it and time until all N see it dead.
//! Agent RSS is sampled once the N agents have converged. Medians go to stdout as Markdown.
//!
//! Shoal is observed by polling each agent's control socket every 20 ms; Serf by an event
//! handler on every agent that timestamps `member-join` / `member-failed` events (polling 30
//! Serf agents through its CLI would load the 2 cores more than the agents themselves).
//!
//! Usage: cargo run --release -p shoal-chaos --bin membership-bench -- --sizes 10,30 --runs 5

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Parser;
use shoal_agent::testkit::{AgentProcess, AgentSpec, init_secret, rss_bytes_of, wait_until};
use shoal_gossip::MemberState;

#[derive(Parser)]
struct Args {
    /// Cluster sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "10,30")]
    sizes: Vec<usize>,
    /// Runs per size (medians are reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The `shoal` binary (default: next to this benchmark's binary).
    #[arg(long)]
    shoal: Option<PathBuf>,
    /// The `serf` binary.
    #[arg(long, default_value = "serf")]
    serf: PathBuf,
    /// Skip Serf (e.g. where it is not installed).
    #[arg(long)]
    no_serf: bool,
}

/// One run's figures, in seconds (RSS in bytes).
#[derive(Debug, Default, Clone)]
struct Run {
    join_seen_by_all: f64,
    stop_seen_dead_by_all: f64,
    kill_seen_dead_by_all: f64,
    rss_bytes: f64,
}

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
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
    let mut rows = Vec::new();
    for &n in &args.sizes {
        let mut shoal_runs = Vec::new();
        let mut serf_runs = Vec::new();
        for run in 0..args.runs {
            eprintln!("N={n} run {}/{}: shoal", run + 1, args.runs);
            shoal_runs.push(shoal_run(&shoal, n).await?);
            eprintln!("  {:?}", shoal_runs.last().unwrap());
            if !args.no_serf {
                eprintln!("N={n} run {}/{}: serf", run + 1, args.runs);
                serf_runs.push(serf_run(&args.serf, n).await?);
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
        "| N | figure (median of {}) | Shoal | Serf | Shoal / Serf |",
        args.runs
    );
    println!("|---|---|---|---|---|");
    for (n, shoal, serf) in rows {
        let figures: [(&str, f64, Option<f64>, &str); 4] = [
            (
                "new node seen alive by all",
                shoal.join_seen_by_all,
                serf.as_ref().map(|s| s.join_seen_by_all),
                "s",
            ),
            (
                "stopped node (SIGSTOP) seen dead by all",
                shoal.stop_seen_dead_by_all,
                serf.as_ref().map(|s| s.stop_seen_dead_by_all),
                "s",
            ),
            (
                "killed node (kill -9) seen dead by all",
                shoal.kill_seen_dead_by_all,
                serf.as_ref().map(|s| s.kill_seen_dead_by_all),
                "s",
            ),
            (
                "agent RSS",
                shoal.rss_bytes / 1e6,
                serf.as_ref().map(|s| s.rss_bytes / 1e6),
                "MB",
            ),
        ];
        for (name, ours, theirs, unit) in figures {
            let (theirs_s, ratio) = match theirs {
                Some(t) => (format!("{t:.2} {unit}"), format!("{:.2}", ours / t)),
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
    }
}

// ---------------------------------------------------------------- Shoal

/// Waits until every observer sees `name` in `state`, polling all of them concurrently every
/// 20 ms; returns the time since `since`.
async fn shoal_seen_by_all(
    observers: &[AgentProcess],
    name: &str,
    state: MemberState,
    since: Instant,
) -> anyhow::Result<f64> {
    let mut tasks = tokio::task::JoinSet::new();
    for observer in observers {
        let client = observer.client().clone();
        let (who, name) = (observer.name().to_owned(), name.to_owned());
        tasks.spawn(async move {
            wait_until(&format!("{who} to see {name} {state}"), LIMIT, || async {
                client
                    .members()
                    .await
                    .is_ok_and(|ms| ms.iter().any(|m| m.name() == name && m.state == state))
            })
            .await
        });
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    Ok(since.elapsed().as_secs_f64())
}

async fn shoal_run(binary: &Path, n: usize) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("secret");
    init_secret(binary, &secret)?;
    let spec = |name: &str| AgentSpec::new(binary, dir.path(), name, &secret);
    let seed = AgentProcess::start(spec("a0")).await?;
    let seed_addr = seed.gossip_addr();
    let mut agents = vec![seed];
    for i in 1..n {
        agents.push(AgentProcess::start(spec(&format!("a{i}")).join(seed_addr)).await?);
    }
    for i in 0..n {
        let name = format!("a{i}");
        shoal_seen_by_all(&agents, &name, MemberState::Alive, Instant::now()).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss = median(
        agents
            .iter()
            .filter_map(|a| a.rss_bytes())
            .map(|b| b as f64)
            .collect(),
    );

    let join_target = agents[n / 2].gossip_addr();
    let start = Instant::now();
    let new = AgentProcess::start(spec("new").join(join_target)).await?;
    let mut all: Vec<AgentProcess> = agents;
    all.push(new);
    let join = shoal_seen_by_all(&all, "new", MemberState::Alive, start).await?;
    let new = all.pop().unwrap();

    let start = Instant::now();
    new.pause()?;
    let stop = shoal_seen_by_all(&all, "new", MemberState::Dead, start).await?;
    new.resume()?;
    all.push(new);
    shoal_seen_by_all(&all, "new", MemberState::Alive, Instant::now()).await?;
    let mut new = all.pop().unwrap();
    let start = Instant::now();
    new.kill()?;
    let kill = shoal_seen_by_all(&all, "new", MemberState::Dead, start).await?;
    Ok(Run {
        join_seen_by_all: join,
        stop_seen_dead_by_all: stop,
        kill_seen_dead_by_all: kill,
        rss_bytes: rss,
    })
}

// ---------------------------------------------------------------- Serf

struct SerfAgent {
    name: String,
    child: Option<Child>,
    rpc: String,
    events: PathBuf,
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
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
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

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn start_serf(
    binary: &Path,
    dir: &Path,
    name: &str,
    join: Option<u16>,
) -> anyhow::Result<(SerfAgent, u16)> {
    let port = free_port()?;
    let rpc_port = free_port()?;
    let events = dir.join(format!("{name}.events"));
    let handler = dir.join("handler.sh");
    if !handler.exists() {
        std::fs::write(
            &handler,
            "#!/bin/sh\nwhile read -r line; do echo \"$(date +%s.%N) $SERF_EVENT $line\" >> \"$EVENTS\"; done\n",
        )?;
        std::fs::set_permissions(
            &handler,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
    }
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let mut cmd = Command::new(binary);
    cmd.arg("agent")
        .arg(format!("-node={name}"))
        .arg(format!("-bind=127.0.0.1:{port}"))
        .arg(format!("-rpc-addr=127.0.0.1:{rpc_port}"))
        .arg(format!(
            "-event-handler=member-join,member-failed={}",
            handler.display()
        ))
        .arg("-log-level=warn")
        .env("EVENTS", &events)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some(j) = join {
        cmd.arg(format!("-join=127.0.0.1:{j}"));
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    Ok((
        SerfAgent {
            name: name.into(),
            child: Some(child),
            rpc: format!("127.0.0.1:{rpc_port}"),
            events,
        },
        port,
    ))
}

fn serf_alive_count(binary: &Path, agent: &SerfAgent) -> usize {
    let out = Command::new(binary)
        .args([
            "members",
            "-status=alive",
            &format!("-rpc-addr={}", agent.rpc),
        ])
        .output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    })
    .unwrap_or(0)
}

/// When `agent`'s handler saw `event` about `name`, as a Unix time.
fn serf_event_time(agent: &SerfAgent, event: &str, name: &str, after: f64) -> Option<f64> {
    let text = std::fs::read_to_string(&agent.events).ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.split_whitespace();
        let t: f64 = parts.next()?.parse().ok()?;
        let ev = parts.next()?;
        let who = parts.next()?;
        (ev == event && who == name && t >= after).then_some(t)
    })
}

async fn serf_seen_by_all(
    observers: &[SerfAgent],
    event: &str,
    name: &str,
    since: f64,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + LIMIT;
    loop {
        let times: Vec<Option<f64>> = observers
            .iter()
            .map(|o| serf_event_time(o, event, name, since))
            .collect();
        if times.iter().all(Option::is_some) {
            let last = times.into_iter().flatten().fold(f64::MIN, f64::max);
            return Ok(last - since);
        }
        if Instant::now() > deadline {
            let missing: Vec<&str> = observers
                .iter()
                .zip(&times)
                .filter(|(_, t)| t.is_none())
                .map(|(o, _)| o.name.as_str())
                .collect();
            bail!("serf: {missing:?} never reported {event} for {name}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn serf_run(binary: &Path, n: usize) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    let (seed, seed_port) = start_serf(binary, dir.path(), "s0", None)?;
    // Like Shoal's test kit, wait for each agent to answer before starting the next: a Serf
    // agent whose -join finds nobody listening gives up.
    wait_until("serf seed to answer", LIMIT, || async {
        serf_alive_count(binary, &seed) >= 1
    })
    .await?;
    let mut agents = vec![seed];
    let mut ports = vec![seed_port];
    for i in 1..n {
        let (a, p) = start_serf(binary, dir.path(), &format!("s{i}"), Some(seed_port))?;
        wait_until("serf agent to answer", LIMIT, || async {
            serf_alive_count(binary, &a) >= 1
        })
        .await?;
        agents.push(a);
        ports.push(p);
    }
    for agent in &agents {
        wait_until("serf convergence", LIMIT, || async {
            serf_alive_count(binary, agent) == n
        })
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss = median(
        agents
            .iter()
            .filter_map(|a| rss_bytes_of(a.child.as_ref()?.id()))
            .map(|b| b as f64)
            .collect(),
    );

    let t0 = now_unix();
    let (new, _) = start_serf(binary, dir.path(), "new", Some(ports[n / 2]))?;
    agents.push(new);
    let join = serf_seen_by_all(&agents, "member-join", "new", t0).await?;
    let new = agents.pop().unwrap();

    let pid = Pid::from_raw(new.child.as_ref().unwrap().id() as i32);
    let t1 = now_unix();
    kill(pid, Signal::SIGSTOP)?;
    let stop = serf_seen_by_all(&agents, "member-failed", "new", t1).await?;
    let t2 = now_unix();
    kill(pid, Signal::SIGCONT)?;
    serf_seen_by_all(&agents, "member-join", "new", t2).await?;
    let mut new = new;
    let t3 = now_unix();
    let mut child = new.child.take().unwrap();
    let killed = child.kill();
    child.wait()?;
    killed?;
    let kill = serf_seen_by_all(&agents, "member-failed", "new", t3).await?;
    Ok(Run {
        join_seen_by_all: join,
        stop_seen_dead_by_all: stop,
        kill_seen_dead_by_all: kill,
        rss_bytes: rss,
    })
}

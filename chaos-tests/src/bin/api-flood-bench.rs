//! API flood benchmark (issue #35, item 8; run as root or not, release build): one agent's
//! Kubernetes API on loopback, and the latency of another client's requests — each on a fresh
//! TLS connection, as a new client's first request is — while silent connections (a flood
//! before authentication, as a hostile pod can send) hold the API's slots:
//!
//! 1. idle;
//! 2. one source address (127.0.0.2) opening `--per-source-attempts` connections and holding
//!    what the API lets it (its per-source share, 64);
//! 3. `--sources` source addresses (127.0.0.2 …) doing the same: together they hold up to their
//!    shares' sum, below the global 1,024 when `--sources` × 64 is.
//!
//! For each phase: `--requests` sequential GETs of `/api/v1/namespaces/default/configmaps` from
//! 127.0.0.1: p50 / p99 and the failures.
//!
//! Usage: cargo build --release -p shoal-agent -p shoal-chaos && ./target/release/api-flood-bench

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use clap::Parser;
use shoal_chaos::kube::KubeClient;
use shoal_chaos::testkit::{AgentProcess, AgentSpec, init_secret};

#[derive(Parser)]
struct Args {
    /// Requests of the measured client per phase.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// Source addresses flooding in the last phase.
    #[arg(long, default_value_t = 15)]
    sources: u8,
    /// Connections each flooding source tries to open.
    #[arg(long, default_value_t = 100)]
    per_source_attempts: usize,
    /// Toy sizes, a few seconds: what CI runs to prove the benchmark still runs and prints
    /// its table (the figures mean nothing; peers not installed are skipped).
    #[arg(long)]
    smoke: bool,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Opens `attempts` silent connections from each of `sources` at once; returns those still open
/// a moment later (the API closes, as it accepts them, what is over a source's share or over
/// its global count; it closes the others after its 10 s TLS handshake timeout, so the phase is
/// measured within it).
async fn flood(
    sources: &[IpAddr],
    api: SocketAddr,
    attempts: usize,
) -> anyhow::Result<Vec<tokio::net::TcpStream>> {
    let connect = |source: IpAddr| async move {
        let mut open = Vec::new();
        for _ in 0..attempts {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(source, 0))?;
            if let Ok(stream) = socket.connect(api).await {
                open.push(stream);
            }
        }
        anyhow::Ok(open)
    };
    let mut open = Vec::new();
    for opened in futures_util::future::join_all(sources.iter().map(|s| connect(*s))).await {
        open.extend(opened?);
    }
    // The API accepts them one by one; give it time to close what is over a share.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut held = Vec::new();
    for stream in open {
        let mut byte = [0u8; 1];
        // Closed by the server: end of stream (or a reset); open and silent: would block.
        if matches!(stream.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        {
            held.push(stream);
        }
    }
    Ok(held)
}

async fn measure(client: &KubeClient, requests: usize) -> (Vec<f64>, usize) {
    let mut ms = Vec::new();
    let mut failed = 0;
    for _ in 0..requests {
        let started = Instant::now();
        match client
            .send(
                hyper::Method::GET,
                "/api/v1/namespaces/default/configmaps",
                "application/json",
                None,
            )
            .await
        {
            Ok((200, _)) => ms.push(started.elapsed().as_secs_f64() * 1000.0),
            _ => failed += 1,
        }
    }
    (ms, failed)
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        return f64::NAN;
    }
    values[(((values.len() - 1) as f64) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.requests = 20;
        args.sources = 2;
        args.per_source_attempts = 5;
    }
    let shoal = shoal_chaos::shoal_binary()?;
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("secret");
    init_secret(&shoal, &secret)?;
    let api = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
    let agent = AgentProcess::start(
        AgentSpec::new(&shoal, dir.path(), "n0", &secret)
            .arg("--api")
            .arg(api.to_string()),
    )
    .await?;
    let identity =
        shoal_gossip::ClusterIdentity::derive(&shoal_gossip::ClusterSecret::load_file(&secret)?)?;
    let client = KubeClient::new("", api, &identity)?;
    // Warm up (the first request builds the API's caches).
    let _ = measure(&client, 20).await;
    println!(
        "# api-flood-bench: requests={} sources={} attempts per source={} (one agent on loopback; each request a fresh TLS connection from 127.0.0.1)",
        args.requests, args.sources, args.per_source_attempts
    );
    println!();
    println!("| phase | connections held by the flood | p50 | p99 | failed |");
    println!("|---|---|---|---|---|");
    let report = |phase: &str, held: usize, (mut ms, failed): (Vec<f64>, usize)| {
        println!(
            "| {phase} | {held} | {:.2} ms | {:.2} ms | {failed} of {} |",
            percentile(&mut ms, 0.5),
            percentile(&mut ms, 0.99),
            args.requests
        );
    };
    report("idle", 0, measure(&client, args.requests).await);
    let source = |i: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i));
    let one = flood(&[source(0)], api, args.per_source_attempts).await?;
    report(
        "one source floods",
        one.len(),
        measure(&client, args.requests).await,
    );
    drop(one);
    // The first flood's connections gone (closed here; the API frees their slots at once).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sources: Vec<IpAddr> = (0..args.sources).map(source).collect();
    let many = flood(&sources, api, args.per_source_attempts).await?;
    report(
        &format!("{} sources flood at once", args.sources),
        many.len(),
        measure(&client, args.requests).await,
    );
    drop(many);
    drop(agent);
    Ok(())
}

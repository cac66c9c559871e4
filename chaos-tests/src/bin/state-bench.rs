//! Desired-state benchmark on real agents (release build), side by side with a 3-member etcd.
//!
//! 1. Latency: sequential writes at one agent of a 5-agent cluster; time to acknowledgement
//!    (durable on the write quorum of 2), to the change event on another agent, and on all four
//!    others (watch streams on their control sockets). etcd: puts at member 1 of 3, time to
//!    acknowledgement and to the watch event on member 3 (v3 JSON gateway).
//! 2. Bulk: `--objects` ConfigMaps written with 16 concurrent clients; RSS and disk afterwards.
//! 3. Anti-entropy: one agent is stopped while `--objects` more are written, then restarted:
//!    time until its digest matches, and the sync bytes it received — compared with what a fresh
//!    agent receives to copy the whole state.
//!
//! 4. Serialized writes through the Kubernetes API of agent 0 (`--writes` each, sequential, a
//!    fresh TLS connection per request): creates, and replaces with the resourceVersion just
//!    read, of ConfigMaps whose home node is agent 0 (decided there) and of ConfigMaps whose home
//!    is another agent (forwarded to it), so the cost of the forwarding shows by the same method.
//!    `--serialized-only` runs only this part.
//!
//! Usage: cargo run --release -p shoal-chaos --bin state-bench -- --writes 200 --objects 10000

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use shoal_chaos::testkit::{AgentProcess, AgentSpec, alive_count, init_secret, wait_until};

#[derive(Parser)]
struct Args {
    /// Sequential writes for the latency figures.
    #[arg(long, default_value_t = 200)]
    writes: usize,
    /// Objects for the bulk and anti-entropy figures.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    #[arg(long)]
    shoal: Option<PathBuf>,
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
    #[arg(long)]
    no_etcd: bool,
    /// Only part 4, the serialized writes through the Kubernetes API.
    #[arg(long)]
    serialized_only: bool,
    /// Toy sizes, a few seconds: what CI runs to prove the benchmark still runs and prints
    /// its table (the figures mean nothing; peers not installed are skipped).
    #[arg(long)]
    smoke: bool,
}

const LIMIT: Duration = Duration::from_secs(120);

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        return f64::NAN;
    }
    let idx = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[idx.min(values.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "default", "labels": {"bench": "state"}},
           "data": {"payload": "x".repeat(512)}})
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.writes = 5;
        args.objects = 50;
        args.no_etcd |= !shoal_chaos::testkit::on_path(&args.etcd);
    }
    let shoal = match args.shoal.clone() {
        Some(p) => p,
        None => std::env::current_exe()?
            .parent()
            .context("exe dir")?
            .join("shoal"),
    };
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("secret");
    init_secret(&shoal, &secret)?;
    let spec = |name: &str| {
        AgentSpec::new(&shoal, dir.path(), name, &secret)
            .arg("--api")
            .arg("127.0.0.1:0")
    };
    let mut agents = vec![AgentProcess::start(spec("a0")).await?];
    let seed = agents[0].gossip_addr();
    for i in 1..5 {
        agents.push(AgentProcess::start(spec(&format!("a{i}")).join(seed)).await?);
    }
    for a in &agents {
        wait_until("5 alive", LIMIT, || async { alive_count(a).await == 5 }).await?;
    }

    if args.serialized_only {
        return serialized(&shoal, &agents, &secret, args.writes).await;
    }

    // ---- 1. latency: agents 1..4 are followed through their watch streams.
    let mut watches = Vec::new();
    for a in &agents[1..] {
        watches.push(a.client().watch().await?);
    }
    let (mut ack, mut one, mut all) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.writes {
        let name = format!("lat-{i}");
        let start = Instant::now();
        let (status, body) = agents[0].apply(&config_map(&name)).await?;
        if status != 201 {
            bail!("write {name}: {status} {body}");
        }
        ack.push(ms(start.elapsed()));
        let mut seen = Vec::new();
        for rx in &mut watches {
            loop {
                let (at, change) = tokio::time::timeout(LIMIT, rx.recv())
                    .await?
                    .context("watch ended")?;
                if change["name"] == name.as_str() {
                    seen.push(at.duration_since(start));
                    break;
                }
            }
        }
        one.push(ms(seen[1]));
        all.push(ms(seen.iter().max().copied().unwrap()));
    }
    println!("## Write latency, {} sequential writes (ms)\n", args.writes);
    println!("| system | figure | p50 | p99 |");
    println!("|---|---|---|---|");
    let shoal_one_p50 = percentile(&mut one, 0.5);
    println!(
        "| Shoal, 5 agents | acknowledged (durable on 2) | {:.2} | {:.2} |",
        percentile(&mut ack, 0.5),
        percentile(&mut ack, 0.99)
    );
    println!(
        "| Shoal, 5 agents | watch event on another agent | {:.2} | {:.2} |",
        shoal_one_p50,
        percentile(&mut one, 0.99)
    );
    println!(
        "| Shoal, 5 agents | watch event on all 4 others | {:.2} | {:.2} |",
        percentile(&mut all, 0.5),
        percentile(&mut all, 0.99)
    );
    if !args.no_etcd {
        let (mut e_ack, mut e_watch) = etcd_latency(&args.etcd, dir.path(), args.writes).await?;
        let etcd_p50 = percentile(&mut e_watch, 0.5);
        println!(
            "| etcd 3.4, 3 members | acknowledged (put) | {:.2} | {:.2} |",
            percentile(&mut e_ack, 0.5),
            percentile(&mut e_ack, 0.99)
        );
        println!(
            "| etcd 3.4, 3 members | watch event on another member | {:.2} | {:.2} |",
            etcd_p50,
            percentile(&mut e_watch, 0.99)
        );
        println!(
            "\nShoal / etcd, p50 of the watch event on another member: {:.2}",
            shoal_one_p50 / etcd_p50
        );
    }

    // ---- 2. bulk
    let start = Instant::now();
    load(&agents[0], "bulk", args.objects).await?;
    let load_secs = start.elapsed().as_secs_f64();
    wait_equal(&agents).await?;
    let rss: Vec<f64> = agents
        .iter()
        .filter_map(|a| a.rss_bytes())
        .map(|b| b as f64 / 1e6)
        .collect();
    let disk = std::fs::metadata(agents[0].data_dir().join("state.redb"))?.len() as f64 / 1e6;
    let total = args.objects + args.writes;
    println!(
        "\n## Bulk: {} ConfigMaps (~0.6 KB each) written at one agent, 16 concurrent clients\n",
        args.objects
    );
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| write throughput (acknowledged, quorum 2) | {:.0} objects/s |",
        args.objects as f64 / load_secs
    );
    println!(
        "| agent RSS with {total} objects (median of 5) | {:.1} MB |",
        median(rss)
    );
    println!("| store file (state.redb) with {total} objects | {disk:.1} MB |");

    // ---- 3. anti-entropy
    agents[4].terminate()?;
    load(&agents[0], "divergent", args.objects).await?;
    let start = Instant::now();
    agents[4].restart().await?;
    wait_equal(&agents).await?;
    let diverged_secs = start.elapsed().as_secs_f64();
    let diverged_bytes = agents[4].store_info().await?.sync_bytes_received;
    let start = Instant::now();
    let fresh = AgentProcess::start(spec("fresh").join(seed)).await?;
    agents.push(fresh);
    wait_equal(&agents).await?;
    let fresh_secs = start.elapsed().as_secs_f64();
    let fresh_bytes = agents[5].store_info().await?.sync_bytes_received;
    let info = agents[0].store_info().await?;
    println!(
        "\n## Anti-entropy ({} objects in the store)\n",
        info.entries
    );
    println!("| case | time to identical digests | sync bytes received |");
    println!("|---|---|---|");
    println!(
        "| restarted agent that missed {} writes | {diverged_secs:.2} s | {:.1} MB |",
        args.objects,
        diverged_bytes as f64 / 1e6
    );
    println!(
        "| fresh agent copying the whole state | {fresh_secs:.2} s | {:.1} MB |",
        fresh_bytes as f64 / 1e6
    );
    println!(
        "\nbytes(divergent) / bytes(full copy): {:.2}",
        diverged_bytes as f64 / fresh_bytes as f64
    );
    serialized(&shoal, &agents, &secret, args.writes).await
}

/// Part 4: creates and preconditioned replaces through agent 0's Kubernetes API, of objects
/// homed on agent 0 and of objects homed elsewhere.
async fn serialized(
    shoal: &Path,
    agents: &[AgentProcess],
    secret: &Path,
    writes: usize,
) -> anyhow::Result<()> {
    let out = Command::new(shoal)
        .args(["kubeconfig", "--data-dir"])
        .arg(agents[0].data_dir())
        .output()?;
    let kubeconfig = String::from_utf8_lossy(&out.stdout);
    let addr: std::net::SocketAddr = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .context("the kubeconfig names no server")?
        .parse()?;
    let identity =
        shoal_gossip::ClusterIdentity::derive(&shoal_gossip::ClusterSecret::load_file(secret)?)?;
    let kube = shoal_chaos::kube::KubeClient::new("", addr, &identity)?;
    let mut ids = Vec::new();
    for a in agents {
        let me = a.members().await?.into_iter().find(|m| m.is_self);
        let id = me.context("an agent does not list itself")?.node_id;
        ids.push(u64::from_str_radix(&id, 16)?);
    }
    let info = shoal_state::KINDS
        .iter()
        .find(|k| k.kind == "ConfigMap")
        .context("ConfigMap kind")?;
    let local = |name: &str| {
        let key = shoal_state::ObjectKey::new(info, "default", name).to_string();
        shoal_core::placement::auction::auctioneer(&key, ids.iter().copied()) == Some(ids[0])
    };
    let path = "/api/v1/namespaces/default/configmaps";
    let mut creates: [Vec<f64>; 2] = Default::default();
    let mut replaces: [Vec<f64>; 2] = Default::default();
    let mut names: [Vec<String>; 2] = Default::default();
    let mut i = 0;
    while names.iter().any(|n| n.len() < writes) {
        let name = format!("home-{i}");
        i += 1;
        let side = usize::from(!local(&name));
        if names[side].len() >= writes {
            continue;
        }
        let body = serde_json::to_vec(&config_map(&name))?;
        let start = Instant::now();
        let (status, answer) = kube
            .send(hyper::Method::POST, path, "application/json", Some(body))
            .await?;
        creates[side].push(ms(start.elapsed()));
        if status != 201 {
            bail!(
                "create {name}: {status} {}",
                String::from_utf8_lossy(&answer)
            );
        }
        names[side].push(name);
    }
    for side in 0..2 {
        for name in &names[side] {
            let object = format!("{path}/{name}");
            let (status, body) = kube
                .send(hyper::Method::GET, &object, "application/json", None)
                .await?;
            if status != 200 {
                bail!("get {name}: {status}");
            }
            let mut current: Value = serde_json::from_slice(&body)?;
            current["data"]["payload"] = json!("y".repeat(512));
            let body = serde_json::to_vec(&current)?;
            let start = Instant::now();
            let (status, answer) = kube
                .send(hyper::Method::PUT, &object, "application/json", Some(body))
                .await?;
            replaces[side].push(ms(start.elapsed()));
            if status != 200 {
                bail!(
                    "replace {name}: {status} {}",
                    String::from_utf8_lossy(&answer)
                );
            }
        }
    }
    println!(
        "\n## Serialized writes through agent 0's Kubernetes API, {writes} of each, sequential (ms)\n"
    );
    println!("| write | home | p50 | p99 |");
    println!("|---|---|---|---|");
    for (what, times) in [
        ("create", &mut creates),
        ("replace with resourceVersion", &mut replaces),
    ] {
        for (side, home) in [
            (0, "agent 0 (decided there)"),
            (1, "another agent (forwarded)"),
        ] {
            println!(
                "| {what} | {home} | {:.2} | {:.2} |",
                percentile(&mut times[side], 0.5),
                percentile(&mut times[side], 0.99)
            );
        }
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    percentile(&mut v, 0.5)
}

async fn load(agent: &AgentProcess, prefix: &str, n: usize) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let clients = 16;
    for c in 0..clients {
        let client = agent.client().clone();
        let prefix = prefix.to_owned();
        tasks.spawn(async move {
            for i in (c..n).step_by(clients) {
                let body = serde_json::to_vec(&config_map(&format!("{prefix}-{i}")))?;
                let (status, answer) = client
                    .send(hyper::Method::PUT, "/v1/objects", Some(body))
                    .await?;
                if status != 201 {
                    bail!(
                        "{prefix}-{i}: {status} {}",
                        String::from_utf8_lossy(&answer)
                    );
                }
            }
            Ok::<_, anyhow::Error>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

async fn wait_equal(agents: &[AgentProcess]) -> anyhow::Result<()> {
    wait_until("identical digests", LIMIT, || async {
        let mut digests = Vec::new();
        for a in agents {
            match a.store_info().await {
                Ok(i) => digests.push(i.digest),
                Err(_) => return false,
            }
        }
        digests.windows(2).all(|w| w[0] == w[1])
    })
    .await?;
    Ok(())
}

// ---------------------------------------------------------------- etcd

fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

struct Etcd(Vec<Child>);

impl Drop for Etcd {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn http_post(
    port: u16,
    path: &str,
    body: &Value,
) -> anyhow::Result<(u16, hyper::body::Incoming)> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, format!("127.0.0.1:{port}"))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
    let response = sender.send_request(request).await?;
    Ok((response.status().as_u16(), response.into_body()))
}

async fn etcd_latency(
    binary: &Path,
    dir: &Path,
    writes: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let ports: Vec<(u16, u16)> = (0..3)
        .map(|_| Ok((free_port()?, free_port()?)))
        .collect::<anyhow::Result<_>>()?;
    let cluster = ports
        .iter()
        .enumerate()
        .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut children = Vec::new();
    for (i, (client, peer)) in ports.iter().enumerate() {
        let log = std::fs::File::create(dir.join(format!("etcd-{i}.log")))?;
        children.push(
            Command::new(binary)
                .arg(format!("--name=m{i}"))
                .arg(format!(
                    "--data-dir={}",
                    dir.join(format!("etcd-{i}")).display()
                ))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!("--initial-cluster={cluster}"))
                .arg("--initial-cluster-state=new")
                .arg("--initial-cluster-token=shoal-bench")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?,
        );
    }
    let _etcd = Etcd(children);
    let (c1, c3) = (ports[0].0, ports[2].0);
    wait_until("etcd to accept writes", LIMIT, || async {
        let body = json!({"key": b64(b"warmup"), "value": b64(b"1")});
        matches!(http_post(c1, "/v3/kv/put", &body).await, Ok((200, _)))
    })
    .await?;
    let (status, mut watch) = http_post(
        c3,
        "/v3/watch",
        &json!({"create_request": {"key": b64(b"lat-"), "range_end": b64(b"lat.")}}),
    )
    .await?;
    if status != 200 {
        bail!("etcd watch: {status}");
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    tokio::spawn(async move {
        let mut buf: Vec<u8> = Vec::new();
        while let Some(Ok(frame)) = watch.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let now = Instant::now();
            buf.extend_from_slice(&data);
            let mut stream = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
            let mut consumed = 0;
            while let Some(Ok(msg)) = stream.next() {
                consumed = stream.byte_offset();
                for event in msg["result"]["events"].as_array().into_iter().flatten() {
                    if let Some(key) = event["kv"]["key"].as_str() {
                        let _ = tx.send((key.to_owned(), now));
                    }
                }
            }
            buf.drain(..consumed);
        }
    });
    let (mut acks, mut watches) = (Vec::new(), Vec::new());
    for i in 0..writes {
        let key = format!("lat-{i}");
        let value = serde_json::to_vec(&config_map(&key))?;
        let start = Instant::now();
        let (status, body) = http_post(
            c1,
            "/v3/kv/put",
            &json!({"key": b64(key.as_bytes()), "value": b64(&value)}),
        )
        .await?;
        body.collect().await?;
        if status != 200 {
            bail!("etcd put: {status}");
        }
        acks.push(ms(start.elapsed()));
        let wanted = b64(key.as_bytes());
        loop {
            let (k, at) = tokio::time::timeout(LIMIT, rx.recv())
                .await?
                .context("watch ended")?;
            if k == wanted {
                watches.push(ms(at.duration_since(start)));
                break;
            }
        }
    }
    Ok((acks, watches))
}

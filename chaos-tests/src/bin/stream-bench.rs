//! Streaming benchmark (run as root, release build), on 3 agents on loopback with real kubectl:
//!
//! 1. `kubectl exec shell -- true` through agent n0 for a pod on n2 (the session crosses QUIC),
//!    `--execs` times: p50/p99. By the same method (one command, wall time, sequential): `runc
//!    exec <container> true` on n2 (the node's work alone) and `kubectl get pod shell` (kubectl's
//!    own start and one API request), so the cost of the exec path itself shows.
//! 2. `kubectl port-forward pod/source :9000` through n0 for a pod on n2 whose busybox httpd
//!    serves a `--mib` MiB file: MB/s of the download, best of 3; the peer is the same download
//!    from the pod's IP directly (host → pod over n2's bridge, no API).
//!
//! Usage: cargo build --release -p shoal-agent -p shoal-chaos && ./target/release/stream-bench

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use shoal_chaos::testkit::{AgentProcess, AgentSpec, alive_count, init_secret, wait_until};

#[derive(Parser)]
struct Args {
    /// Exec round trips per method.
    #[arg(long, default_value_t = 50)]
    execs: usize,
    /// MiB per port-forward download.
    #[arg(long, default_value_t = 512)]
    mib: u64,
    /// Toy sizes, a few seconds: what CI runs to prove the benchmark still runs and prints
    /// its table (the figures mean nothing; peers not installed are skipped).
    #[arg(long)]
    smoke: bool,
}

const PODS: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: shell}
spec:
  nodeSelector: {kubernetes.io/hostname: n2}
  containers:
  - {name: main, image: shoal.local/busybox:1, command: [sh, -c, "while true; do sleep 1; done"]}
---
apiVersion: v1
kind: Pod
metadata: {name: source}
spec:
  nodeSelector: {kubernetes.io/hostname: n2}
  containers:
  - name: main
    image: shoal.local/busybox:1
    command: [sh, -c, "head -c $BYTES /dev/zero > /tmp/big && exec httpd -f -p 9000 -h /tmp"]
    env: [{name: BYTES, value: "BYTES_VALUE"}]
    readinessProbe: {tcpSocket: {port: 9000}, periodSeconds: 1}
"#;

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        return f64::NAN;
    }
    values[(((values.len() - 1) as f64) * p).round() as usize]
}

fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| program.into())
}

/// Wall time of `n` sequential runs of `command`, in ms (each must succeed).
fn timed(n: usize, mut command: impl FnMut() -> Command) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let out = command().stdin(Stdio::null()).output()?;
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr));
        }
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(times)
}

fn report(what: &str, times: &mut [f64]) -> f64 {
    let p50 = percentile(times, 0.5);
    println!(
        "{what}: p50 {p50:.1} ms, p99 {:.1} ms, max {:.1} ms (n={})",
        percentile(times, 0.99),
        percentile(times, 1.0),
        times.len()
    );
    p50
}

/// GETs the `bytes`-byte file from busybox httpd at `addr` (which sends it with sendfile):
/// MB/s (10^6 bytes per second) of the whole answer.
fn download(addr: std::net::SocketAddr, bytes: u64) -> anyhow::Result<f64> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.write_all(b"GET /big HTTP/1.0\r\n\r\n")?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut got, start) = (0u64, Instant::now());
    while got < bytes {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            bail!("the connection ended after {got} of {bytes} bytes");
        }
        got += n as u64;
    }
    Ok(got as f64 / start.elapsed().as_secs_f64() / 1e6)
}

async fn cluster(root: &Path, images: &Path) -> anyhow::Result<Vec<AgentProcess>> {
    let binary = shoal_chaos::shoal_binary()?;
    let secret = root.join("secret");
    init_secret(&binary, &secret)?;
    let mut agents: Vec<AgentProcess> = Vec::new();
    for i in 0..3 {
        let name = format!("n{i}");
        let out = Command::new(&binary)
            .args(["image", "import", "--data-dir"])
            .arg(root.join(&name))
            .arg(images.join("busybox-1.oci.tar"))
            .output()?;
        if !out.status.success() {
            bail!("image import: {}", String::from_utf8_lossy(&out.stderr));
        }
        // The pod network on (the direct download reaches the pod's IP over n2's bridge),
        // removed when the agents stop.
        let mut spec = AgentSpec::new(&binary, root, &name, &secret)
            .arg("--api")
            .arg("127.0.0.1:0")
            .arg("--pod-network")
            .arg("bridge")
            .arg("--cleanup");
        if let Some(seed) = agents.first() {
            spec = spec.join(seed.gossip_addr());
        }
        agents.push(AgentProcess::start(spec).await?);
    }
    for a in &agents {
        wait_until("all alive", Duration::from_secs(60), || async {
            alive_count(a).await == 3
        })
        .await?;
    }
    Ok(agents)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.execs = 2;
        args.mib = 1;
    }
    let images = shoal_chaos::test_images().context("building the test images")?;
    let binary = shoal_chaos::shoal_binary()?;
    let root = tempfile::tempdir()?;
    let agents = cluster(root.path(), &images).await?;
    let out = Command::new(&binary)
        .args(["kubeconfig", "--data-dir"])
        .arg(agents[0].data_dir())
        .output()?;
    let kubeconfig = root.path().join("n0.kubeconfig");
    std::fs::write(&kubeconfig, &out.stdout)?;
    let kubectl = which("kubectl");
    let k = |args: &[&str]| {
        let mut c = Command::new(&kubectl);
        c.arg("--kubeconfig").arg(&kubeconfig).args(args);
        c
    };
    let manifest = root.path().join("pods.yaml");
    std::fs::write(
        &manifest,
        PODS.replace("BYTES_VALUE", &(args.mib << 20).to_string()),
    )?;
    let out = k(&["apply", "-f", manifest.to_str().unwrap()]).output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = k(&[
        "wait",
        "--for=condition=Ready",
        "pod/shell",
        "pod/source",
        "--timeout=120s",
    ])
    .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "# stream-bench: execs={} mib={} (3 agents on loopback; kubectl talks to n0, the pods run on n2)",
        args.execs, args.mib
    );

    println!("\n## 1. exec round trip");
    // Warm up (the first connection to n2's QUIC endpoint, kubectl's discovery cache).
    timed(3, || k(&["exec", "shell", "--", "true"]))?;
    let mut exec = timed(args.execs, || k(&["exec", "shell", "--", "true"]))?;
    let exec_p50 = report("kubectl exec shell -- true (via n0)", &mut exec);
    let mut get = timed(args.execs, || k(&["get", "pod", "shell", "-o", "name"]))?;
    let get_p50 = report(
        "kubectl get pod shell (kubectl's start + one request)",
        &mut get,
    );
    let runc_root = agents[2].data_dir().join("runc");
    let list = Command::new("runc")
        .arg("--root")
        .arg(&runc_root)
        .args(["list", "-q"])
        .output()?;
    let ids: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    // The shell pod's container: the one that runs no httpd.
    let id = ids
        .iter()
        .find(|id| {
            Command::new("runc")
                .arg("--root")
                .arg(&runc_root)
                .args(["ps", id])
                .output()
                .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).contains("httpd"))
        })
        .context("the shell pod's container in runc list")?
        .clone();
    let mut runc = timed(args.execs, || {
        let mut c = Command::new("runc");
        c.arg("--root").arg(&runc_root).args(["exec", &id, "true"]);
        c
    })?;
    let runc_p50 = report("runc exec <container> true (on n2)", &mut runc);
    println!(
        "exec path beyond kubectl's start and runc: {:.1} ms (p50 exec − p50 get − p50 runc); exec/runc = {:.2}",
        exec_p50 - get_p50 - runc_p50,
        exec_p50 / runc_p50
    );

    println!("\n## 2. port-forward download, {} MiB", args.mib);
    let bytes = args.mib << 20;
    let mut child = k(&["port-forward", "pod/source", ":9000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().transpose()?.unwrap_or_default();
    let local: u16 = first
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("kubectl port-forward said {first:?}"))?;
    std::thread::spawn(move || lines.for_each(drop));
    let mut forwarded = Vec::new();
    for _ in 0..3 {
        forwarded.push(download(([127, 0, 0, 1], local).into(), bytes)?);
    }
    let _ = child.kill();
    let _ = child.wait();
    let out = k(&["get", "pod", "source", "-o", "jsonpath={.status.podIP}"]).output()?;
    let ip: std::net::Ipv4Addr = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("the source pod's IP")?;
    let mut direct = Vec::new();
    for _ in 0..3 {
        direct.push(download((ip, 9000).into(), bytes)?);
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!(
        "kubectl port-forward via n0: best {:.0} MB/s (runs {:?})",
        best(&forwarded),
        forwarded.iter().map(|v| v.round()).collect::<Vec<_>>()
    );
    println!(
        "direct to the pod IP {ip}: best {:.0} MB/s (runs {:?}); port-forward/direct = {:.2}",
        best(&direct),
        direct.iter().map(|v| v.round()).collect::<Vec<_>>(),
        best(&forwarded) / best(&direct)
    );
    drop(agents);
    Ok(())
}

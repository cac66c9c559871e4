//! Registry pull benchmark (issue #38), side by side in one run against one registry on
//! loopback (Debian's `docker-registry`, started here):
//!
//! 1. An image of `--layers` layers of `--layer-mb` MiB each (random bytes: incompressible,
//!    uncompressed tar layers) pulled cold (empty store) and warm (everything present) by
//!    Shoal's registry client (manifest and blobs into a fresh image store, digests verified
//!    while streaming), by `skopeo copy docker://… oci:DIR`, and by containerd's
//!    `ctr content fetch` (its daemon started here with a root of its own; content only, no
//!    unpack, as Shoal's pull stores blobs and unpacks on first use). `--runs` interleaved
//!    runs, medians, and the ratio of Shoal to the faster peer. Peers not installed are
//!    skipped.
//! 2. Memory while pulling: the peak RSS (VmHWM) of this process before and after one pull of
//!    a single `--big-mb` MiB layer by Shoal's client (streaming, not buffering: the peak
//!    should not grow with the layer).
//!
//! 3. A cluster starting one new image at once: for 1, 3 and 5 agents on loopback, one pod
//!    per node of an image no node has (the busybox test image plus `--layers` random layers
//!    of `--layer-mb` MiB), applied together; the registry's egress (bytes it served for the
//!    image, from its access log) against the image's size, and the time until every pod runs
//!    against the single node's.
//!
//! Usage: cargo run --release -p shoal-chaos --bin pull-bench -- --runs 5

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use sha2::Digest as _;
use shoal_agent::images::ImageStore;
use shoal_agent::images::registry::{self, Registries};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[arg(long, default_value_t = 5)]
    layers: usize,
    #[arg(long, default_value_t = 20)]
    layer_mb: u64,
    /// The single layer of the memory section (MiB).
    #[arg(long, default_value_t = 1024)]
    big_mb: u64,
    /// Toy sizes (seconds): what CI runs to prove the benchmark still runs.
    #[arg(long)]
    smoke: bool,
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A registry on a free loopback port, storage in `dir`; killed on drop.
struct Registry {
    child: std::process::Child,
    addr: String,
    log: PathBuf,
}

impl Registry {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        std::fs::create_dir_all(dir)?;
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.join("data").display()
            ),
        )?;
        // The access log (on stdout) counts the cluster section's egress.
        let log = std::fs::File::create(dir.join("access.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .context("docker-registry (apt-get install docker-registry)")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            if Instant::now() > deadline {
                bail!("the registry did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            child,
            addr,
            log: dir.join("access.log"),
        })
    }

    /// Bytes served with 200 for repository `name` (manifests and blobs), from the access log.
    fn egress(&self, name: &str) -> u64 {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let prefix = format!("\"GET /v2/{name}/");
        log.lines()
            .filter(|l| l.contains(&prefix))
            .filter_map(|l| {
                let after = l.rsplit_once("HTTP/1.1\" ")?.1;
                let mut fields = after.split_whitespace();
                (fields.next()? == "200").then_some(())?;
                fields.next()?.parse::<u64>().ok()
            })
            .sum()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes an OCI layout at `dir` with `layers` uncompressed tar layers of `mb` MiB of random
/// bytes each, streamed to disk (this process's memory stays small).
fn build_image(dir: &Path, layers: usize, mb: u64) -> anyhow::Result<()> {
    build_image_on(dir, layers, mb, None, 0)
}

/// [`build_image`] over the layers of the OCI archive `base` (a runnable image), with `seed`
/// choosing the random bytes.
fn build_image_on(
    dir: &Path,
    layers: usize,
    mb: u64,
    base: Option<&Path>,
    seed: u64,
) -> anyhow::Result<()> {
    use rand::{Rng as _, SeedableRng as _};
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let mut base_layers: Vec<serde_json::Value> = Vec::new();
    let mut base_diff_ids: Vec<serde_json::Value> = Vec::new();
    let mut base_config = serde_json::json!({"config": {"Cmd": ["sh"]}});
    if let Some(base) = base {
        tar::Archive::new(std::fs::File::open(base)?).unpack(dir)?;
        let read = |digest: &str| -> anyhow::Result<serde_json::Value> {
            let hex = digest.trim_start_matches("sha256:");
            Ok(serde_json::from_slice(&std::fs::read(blobs.join(hex))?)?)
        };
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("index.json"))?)?;
        let manifest = read(index["manifests"][0]["digest"].as_str().unwrap_or_default())?;
        base_config = read(manifest["config"]["digest"].as_str().unwrap_or_default())?;
        base_layers = manifest["layers"].as_array().cloned().unwrap_or_default();
        base_diff_ids = base_config["rootfs"]["diff_ids"]
            .as_array()
            .cloned()
            .unwrap_or_default();
    }
    let put = |bytes: &[u8]| -> anyhow::Result<(String, u64)> {
        let hex = hex::encode(sha2::Sha256::digest(bytes));
        std::fs::write(blobs.join(&hex), bytes)?;
        Ok((format!("sha256:{hex}"), bytes.len() as u64))
    };
    let mut descriptors = base_layers;
    let mut diff_ids = base_diff_ids;
    // Seeded per layer and size: a new image each time the sizes change, the same bytes
    // across runs (not that it matters to the figures).
    let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(seed ^ mb ^ (layers as u64) << 32);
    for i in 0..layers {
        // A tar of one file, written and hashed in chunks.
        let size = mb << 20;
        let tmp = dir.join("layer.tmp");
        let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        let mut hash = sha2::Sha256::new();
        let mut header = tar::Header::new_gnu();
        header.set_path(format!("data-{i}"))?;
        header.set_size(size);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        let mut write = |bytes: &[u8]| -> anyhow::Result<()> {
            hash.update(bytes);
            file.write_all(bytes)?;
            Ok(())
        };
        write(header.as_bytes())?;
        let mut chunk = vec![0u8; 1 << 16];
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            rng.fill_bytes(&mut chunk[..n]);
            write(&chunk[..n])?;
            left -= n as u64;
        }
        write(&[0u8; 1024])?;
        file.flush()?;
        drop(file);
        let digest = format!("sha256:{}", hex::encode(hash.finalize()));
        let total = std::fs::metadata(&tmp)?.len();
        std::fs::rename(&tmp, blobs.join(digest.trim_start_matches("sha256:")))?;
        descriptors.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": digest, "size": total}));
        diff_ids.push(serde_json::json!(digest));
    }
    let mut config = base_config;
    config["architecture"] = serde_json::json!(shoal_agent::images::go_arch());
    config["os"] = serde_json::json!("linux");
    config["rootfs"] = serde_json::json!({"type": "layers", "diff_ids": diff_ids});
    let (config_digest, config_size) = put(&serde_json::to_vec(&config)?)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": descriptors});
    let (manifest_digest, manifest_size) = put(&serde_json::to_vec(&manifest)?)?;
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": manifest_digest, "size": manifest_size}]}))?,
    )?;
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(())
}

/// Section 3 for `n` agents: a fresh cluster, one pod per node of `image` (pushed already),
/// all applied at once; the seconds until every pod runs.
async fn cluster_run(root: &Path, n: usize, image: &str) -> anyhow::Result<f64> {
    use shoal_chaos::testkit::{start_cluster, wait_until};
    let mut agents = start_cluster(root, n, |spec, _| Ok(spec)).await?;
    // Every node has published its images (none yet): they agree on the owners.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start = Instant::now();
    for i in 0..n {
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pull-{i}"), "namespace": "default"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": format!("n{i}")},
                     "containers": [{"name": "c", "image": image, "command": ["sleep", "3600"]}]}});
        let (status, body) = agents[0].apply(&pod).await?;
        if status >= 300 {
            bail!("apply: {status} {body}");
        }
    }
    wait_until("every pod Running", Duration::from_secs(600), || async {
        let Ok((_, list)) = agents[0]
            .call(
                hyper::Method::GET,
                "/v1/objects/pods?namespace=default",
                None,
            )
            .await
        else {
            return false;
        };
        let items = list["items"].as_array().cloned().unwrap_or_default();
        items.len() == n && items.iter().all(|p| p["status"]["phase"] == "Running")
    })
    .await?;
    let took = start.elapsed().as_secs_f64();
    if std::env::var_os("PULL_BENCH_LOGS").is_some() {
        for agent in &agents {
            for line in agent
                .log()
                .lines()
                .filter(|l| l.contains("blob") || l.contains("pull"))
            {
                eprintln!("{}: {line}", agent.name());
            }
        }
    }
    for agent in &mut agents {
        let _ = agent.terminate();
        let _ = agent.reset_node();
    }
    Ok(took)
}

fn push(layout: &Path, registry: &Registry, name: &str) -> anyhow::Result<()> {
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci:{}", layout.display()))
        .arg(format!("docker://{}/{name}", registry.addr))
        .output()
        .context("skopeo (apt-get install skopeo)")?;
    if !out.status.success() {
        bail!("skopeo push: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn installed(binary: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {binary}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Seconds a command takes; an error if it fails.
fn timed(command: &mut Command) -> anyhow::Result<f64> {
    let start = Instant::now();
    let out = command.output()?;
    let took = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("{command:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(took)
}

/// containerd with a root, state and socket of its own under `dir`; killed on drop.
struct Containerd {
    child: std::process::Child,
    socket: PathBuf,
}

impl Containerd {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        std::fs::write(&config, "version = 2\n")?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .arg("--root")
            .arg(dir.join("root"))
            .arg("--state")
            .arg(dir.join("state"))
            .arg("--address")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline {
                bail!("containerd did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self { child, socket })
    }

    fn fetch(&self, image: &str) -> anyhow::Result<f64> {
        timed(
            Command::new("ctr")
                .arg("--address")
                .arg(&self.socket)
                .args(["content", "fetch", "--plain-http", image]),
        )
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This process's peak resident memory (VmHWM), bytes.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        (args.runs, args.layers, args.layer_mb, args.big_mb) = (1, 2, 1, 8);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let work = tempfile::tempdir()?;
    let registry = Registry::start(&work.path().join("registry"))?;
    let layout = work.path().join("layout");
    build_image(&layout, args.layers, args.layer_mb)?;
    push(&layout, &registry, "bench/image:1")?;
    std::fs::remove_dir_all(&layout)?;
    let image = format!("{}/bench/image:1", registry.addr);
    let size_mb = args.layers as u64 * args.layer_mb;
    println!(
        "1. Pull of {size_mb} MiB ({} layers, uncompressed, random) from a registry on loopback, {} runs, medians",
        args.layers, args.runs
    );

    let (skopeo, ctr) = (
        installed("skopeo"),
        installed("ctr") && installed("containerd"),
    );
    let mut shoal_times: [Vec<f64>; 2] = Default::default();
    let mut skopeo_times: [Vec<f64>; 2] = Default::default();
    let mut ctr_times: [Vec<f64>; 2] = Default::default();
    let registries = Registries::default();
    for run in 0..args.runs {
        let dir = work.path().join(format!("run-{run}"));
        // Shoal: a fresh store, then the same again.
        let store = ImageStore::open(dir.join("shoal"))?;
        for times in &mut shoal_times {
            let start = Instant::now();
            rt.block_on(registry::pull(&store, &image, &registries, &[], None))?;
            times.push(start.elapsed().as_secs_f64());
        }
        if skopeo {
            let dest = format!("oci:{}:bench", dir.join("skopeo").display());
            for times in &mut skopeo_times {
                times.push(timed(
                    Command::new("skopeo")
                        .args(["copy", "--quiet", "--src-tls-verify=false"])
                        .arg(format!("docker://{image}"))
                        .arg(&dest),
                )?);
            }
        }
        if ctr {
            let containerd = Containerd::start(&dir.join("containerd"))?;
            for times in &mut ctr_times {
                times.push(containerd.fetch(&image)?);
            }
        }
        std::fs::remove_dir_all(&dir)?;
    }
    let row = |name: &str, times: &mut [Vec<f64>; 2]| -> Option<(f64, f64)> {
        if times[0].is_empty() {
            println!("{name:<34} (not installed: skipped)");
            return None;
        }
        let (cold, warm) = (median(&mut times[0]), median(&mut times[1]));
        println!(
            "{name:<34} cold {:>8.1} ms ({:>6.0} MiB/s)   warm {:>7.1} ms",
            cold * 1000.0,
            size_mb as f64 / cold,
            warm * 1000.0
        );
        Some((cold, warm))
    };
    let shoal = row("shoal (registry client)", &mut shoal_times);
    let peers = [
        row("skopeo copy docker:// oci:", &mut skopeo_times),
        row("ctr content fetch (containerd)", &mut ctr_times),
    ];
    if let Some((cold, warm)) = shoal {
        let best_cold = peers.iter().flatten().map(|p| p.0).fold(f64::NAN, f64::min);
        let best_warm = peers.iter().flatten().map(|p| p.1).fold(f64::NAN, f64::min);
        if best_cold.is_finite() {
            println!(
                "ratio shoal / faster peer: cold {:.2}, warm {:.2} (goal <= 1.0)",
                cold / best_cold,
                warm / best_warm
            );
        }
    }

    println!();
    println!(
        "2. Peak RSS of this process around one pull of a {} MiB layer (shoal)",
        args.big_mb
    );
    let layout = work.path().join("big");
    build_image(&layout, 1, args.big_mb)?;
    push(&layout, &registry, "bench/big:1")?;
    std::fs::remove_dir_all(&layout)?;
    let store = ImageStore::open(work.path().join("big-store"))?;
    let before = peak_rss();
    let start = Instant::now();
    rt.block_on(registry::pull(
        &store,
        &format!("{}/bench/big:1", registry.addr),
        &registries,
        &[],
        None,
    ))?;
    let took = start.elapsed().as_secs_f64();
    let after = peak_rss();
    println!(
        "peak RSS before {:.1} MiB, after {:.1} MiB (+{:.1} MiB for {} MiB pulled in {:.1} s)",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        after.saturating_sub(before) as f64 / 1048576.0,
        args.big_mb,
        took
    );

    println!();
    println!(
        "3. A cluster starting one new image at once (busybox + {} x {} MiB random layers), one pod per node",
        args.layers, args.layer_mb
    );
    let base = shoal_chaos::test_images()?.join("busybox-1.oci.tar");
    let sizes: &[usize] = if args.smoke { &[1, 2] } else { &[1, 3, 5] };
    let mut single = None;
    for (k, &n) in sizes.iter().enumerate() {
        let name = format!("bench/cluster{n}");
        let layout = work.path().join(format!("cluster-layout-{n}"));
        build_image_on(
            &layout,
            args.layers,
            args.layer_mb,
            Some(&base),
            1000 + k as u64,
        )?;
        push(&layout, &registry, &format!("{name}:1"))?;
        let image_bytes = walk_size(&layout.join("blobs/sha256"))?;
        std::fs::remove_dir_all(&layout)?;
        let before = registry.egress(&name);
        let root = work.path().join(format!("cluster-{n}"));
        let took = rt.block_on(cluster_run(
            &root,
            n,
            &format!("{}/{name}:1", registry.addr),
        ))?;
        let egress = registry.egress(&name) - before;
        let single_took = *single.get_or_insert(took);
        println!(
            "{n} node(s): every pod Running after {took:.2} s ({:.2}x one node's), registry egress {:.1} MiB = {:.2}x the image ({:.1} MiB)",
            took / single_took,
            egress as f64 / 1048576.0,
            egress as f64 / image_bytes as f64,
            image_bytes as f64 / 1048576.0
        );
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(())
}

/// The bytes of the files in `dir` (one level).
fn walk_size(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        total += entry?.metadata()?.len();
    }
    Ok(total)
}

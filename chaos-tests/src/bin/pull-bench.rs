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
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.join("data").display()
            ),
        )?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
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
        Ok(Self { child, addr })
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
    use rand::{Rng as _, SeedableRng as _};
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let put = |bytes: &[u8]| -> anyhow::Result<(String, u64)> {
        let hex = hex::encode(sha2::Sha256::digest(bytes));
        std::fs::write(blobs.join(&hex), bytes)?;
        Ok((format!("sha256:{hex}"), bytes.len() as u64))
    };
    let mut descriptors = Vec::new();
    let mut diff_ids = Vec::new();
    // Seeded per layer and size: a new image each time the sizes change, the same bytes
    // across runs (not that it matters to the figures).
    let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(mb ^ (layers as u64) << 32);
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
        diff_ids.push(digest);
    }
    let config = serde_json::json!({
        "architecture": shoal_agent::images::go_arch(), "os": "linux",
        "config": {"Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids}});
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
    Ok(())
}

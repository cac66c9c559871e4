//! `shoal-chaos`: the network-namespace lab ([`lab::NetLab`]) that puts real `shoal` agents on
//! real, breakable networks, the recorded histories and invariant checkers chaos runs are
//! judged by ([`history`], [`checker`]), and the benchmarks that drive real agents (`src/bin`).
//! Also the simulators ([`sim`]: the auction at scale, partitions, a simulated container
//! runtime), which drive `shoal-core`'s decisions themselves, and the integration tests' harness
//! ([`testkit`]).
//!
//! Place in the data path: beside it — it starts real agents and breaks what lies between
//! manifest → model → store → controllers → placement → kubelet → runtime → network, or drives
//! the pure steps of that path in simulation.

pub mod checker;
pub mod cpu;
pub mod fuzz;
pub mod history;
pub mod kube;
pub mod lab;
pub mod poison;
pub mod report;
pub mod run;
pub mod scenario;
pub mod sim;
pub mod testkit;

/// The `shoal` binary of this build (`target/<profile>/shoal`, next to the test or bench
/// executable's `deps/` directory), or `$SHOAL_BIN`.
pub fn shoal_binary() -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("SHOAL_BIN") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(std::path::Path::to_path_buf);
    while let Some(d) = dir {
        let candidate = d.join("shoal");
        if candidate.is_file() {
            return Ok(candidate);
        }
        dir = d.parent().map(std::path::Path::to_path_buf);
    }
    anyhow::bail!(
        "no shoal binary near {}: run `cargo build -p shoal-agent` (or set SHOAL_BIN)",
        exe.display()
    )
}

/// The slow-disk library (`preload/slowdisk.c`), compiled with the system's `cc` into
/// `target/chaos-preload/` when missing or older than its source, for the slow-disk scenario.
pub fn slow_disk_library() -> anyhow::Result<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = root.join("preload/slowdisk.c");
    let out_dir = root.join("../target/chaos-preload");
    let library = out_dir.join("libshoal-slowdisk.so");
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if modified(&library).is_some() && modified(&library) >= modified(&source) {
        return Ok(library);
    }
    std::fs::create_dir_all(&out_dir)?;
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .status()?;
    anyhow::ensure!(status.success(), "cc {} failed", source.display());
    Ok(library)
}

/// The project's test images (`examples/images/build.sh`), built into `target/test-images`.
pub fn test_images() -> anyhow::Result<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = root.join("target/test-images");
    let status = std::process::Command::new("bash")
        .arg(root.join("examples/images/build.sh"))
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "examples/images/build.sh failed");
    Ok(out)
}

/// Imports the busybox test image into an agent's node (the agent may be running).
pub fn import_busybox(agent: &crate::testkit::AgentProcess) -> anyhow::Result<()> {
    import_image(agent, &test_images()?.join("busybox-1.oci.tar"))
}

/// `shoal image import` of the image archive `archive` into `agent`'s node.
pub fn import_image(
    agent: &crate::testkit::AgentProcess,
    archive: &std::path::Path,
) -> anyhow::Result<()> {
    let out = std::process::Command::new(shoal_binary()?)
        .args(["image", "import", "--data-dir"])
        .arg(agent.data_dir())
        .arg(archive)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "shoal image import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Starts `n` agents in `lab`'s hosts (host 0 is the seed), each with `flags`, and waits until
/// all see all alive. The returned directory holds the secret and the data dirs.
pub async fn start_cluster(
    lab: &lab::NetLab,
    n: usize,
    flags: &[&str],
) -> anyhow::Result<(tempfile::TempDir, Vec<crate::testkit::AgentProcess>)> {
    let root = tempfile::tempdir()?;
    let binary = shoal_binary()?;
    let agents = start_agents(&binary, root.path(), lab, n, flags, false, &|_| Vec::new()).await?;
    Ok((root, agents))
}

/// Like [`start_cluster`], with the data dirs under `root`, and every agent (host 0 too, through
/// host 1) started with `--join`, as an operator lists seeds on every node: a host whose data
/// dir is wiped rejoins the cluster instead of starting a new one. Agent `i` also gets the
/// environment `env(i)`. The agents run `binary`.
pub async fn start_cluster_in(
    binary: &std::path::Path,
    root: &std::path::Path,
    lab: &lab::NetLab,
    n: usize,
    flags: &[&str],
    env: &dyn Fn(usize) -> Vec<(String, String)>,
) -> anyhow::Result<Vec<crate::testkit::AgentProcess>> {
    start_agents(binary, root, lab, n, flags, true, env).await
}

/// The agent of `lab`'s host `i` (named `n<i>`, gossip on port 7600 of its address, data dir and
/// the cluster secret under `root`), with `flags`, `env`, and `--join` to each host of `seeds`.
pub fn lab_agent_spec(
    binary: &std::path::Path,
    root: &std::path::Path,
    lab: &lab::NetLab,
    i: usize,
    flags: &[&str],
    env: Vec<(String, String)>,
    seeds: &[usize],
) -> crate::testkit::AgentSpec {
    let addr = |i: usize| std::net::SocketAddr::new(lab.address(i), 7600);
    let mut spec =
        crate::testkit::AgentSpec::new(binary, root, &format!("n{i}"), &root.join("secret"))
            .bind(addr(i))
            .netns(&lab.host(i));
    for flag in flags {
        spec = spec.arg(*flag);
    }
    for (key, value) in env {
        spec = spec.env(key, value);
    }
    for seed in seeds {
        spec = spec.join(addr(*seed));
    }
    spec
}

async fn start_agents(
    binary: &std::path::Path,
    root: &std::path::Path,
    lab: &lab::NetLab,
    n: usize,
    flags: &[&str],
    seed_joins: bool,
    env: &dyn Fn(usize) -> Vec<(String, String)>,
) -> anyhow::Result<Vec<crate::testkit::AgentProcess>> {
    use crate::testkit::{AgentProcess, alive_count, init_secret, wait_until};
    let secret = root.join("secret");
    init_secret(binary, &secret)?;
    let mut agents = Vec::new();
    for i in 0..n {
        let seeds: &[usize] = if i > 0 {
            &[0]
        } else if seed_joins && n > 1 {
            &[1]
        } else {
            &[]
        };
        let spec = lab_agent_spec(binary, root, lab, i, flags, env(i), seeds);
        agents.push(AgentProcess::start(spec).await?);
    }
    for a in &agents {
        wait_until("all alive", std::time::Duration::from_secs(60), || async {
            alive_count(a).await == n
        })
        .await?;
    }
    Ok(agents)
}

//! Container runtime benchmark (run as root, release build).
//!
//! 1. Cycle: create + start + exit + delete of `sh -c 'echo hello'` in the busybox test image,
//!    median of `--cycles`: through Shoal's runtime (shim + runc, overlay rootfs, pod netns) and
//!    with runc (and crun, where it runs here) alone on the same bundle (`runc run` + `delete`).
//! 2. Apply → Running: `--pods` pods applied one after another at one agent of a 3-agent
//!    cluster on loopback; time from the apply until that agent reports the pod Running
//!    (auction, binding, replication, container start, status gossip).
//!    As many pods with a required spread over the nodes (maxSkew 1) are applied in turn with
//!    them (one of each, one after the other, so both meet the same cluster): the constrained
//!    path's latency, and its ratio to the first. Each pod's apply → bound time, and where
//!    the pods ran, are printed too (a pod on another node than the one read is seen Running
//!    only once gossip brings its status).
//! 3. Memory: one agent's RSS with no pod and with `--pods` running pods, and the shims' RSS.
//! 4. A Deployment of `--replicas` on 3 agents: apply → all Ready, then a rollout.
//! 5. Storage (issue #39), 3 agents: apply → Running of a pod with a new claim (provisioned
//!    and bound on the node it wins) against a pod with an emptyDir, `--stateful` pods each,
//!    in turn; then a StatefulSet of `--stateful` OrderedReady replicas with a claim each:
//!    apply → all Ready, against `--stateful` × one pod's apply → Running + 1 s.
//!
//! Usage: cargo run --release -p shoal-chaos --bin runtime-bench -- --cycles 20 --pods 100

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};
use shoal_agent::images::ImageStore;
use shoal_agent::runtime::{
    ContainerMeta, ContainerRequest, Limits, ObservedState, Runtime, SandboxSpec,
};
use shoal_chaos::testkit::{AgentProcess, rss_bytes_of, wait_until};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 20)]
    cycles: usize,
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Replicas of the Deployment of section 4.
    #[arg(long, default_value_t = 100)]
    replicas: usize,
    /// Run only section 4 (the Deployment).
    #[arg(long)]
    deployment_only: bool,
    /// Pods of each kind, and replicas of the StatefulSet, of section 5.
    #[arg(long, default_value_t = 10)]
    stateful: usize,
    /// Run only section 5 (storage).
    #[arg(long)]
    stateful_only: bool,
    /// Toy sizes, a few seconds: what CI runs to prove the benchmark still runs and prints
    /// its table (the figures mean nothing; peers not installed are skipped).
    #[arg(long)]
    smoke: bool,
}

fn median(values: &mut [f64]) -> f64 {
    percentile(values, 0.5)
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        return f64::NAN;
    }
    values[(((values.len() - 1) as f64) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn request(id: &str, layers: Vec<PathBuf>, log: PathBuf) -> ContainerRequest {
    ContainerRequest {
        id: id.into(),
        hostname: "bench".into(),
        args: vec!["sh".into(), "-c".into(), "echo hello".into()],
        env: vec!["PATH=/bin".into()],
        working_dir: "/".into(),
        uid: 0,
        gid: 0,
        readonly_rootfs: false,
        no_new_privileges: true,
        capabilities: shoal_agent::runtime::spec::DEFAULT_CAPABILITIES
            .iter()
            .map(|c| c.to_string())
            .collect(),
        limits: Limits {
            cpu_shares: 2,
            cpu_period_us: 100_000,
            ..Limits::default()
        },
        mounts: vec![],
        layers,
        log_path: log,
        seccomp: shoal_agent::runtime::spec::Seccomp::RuntimeDefault,
        additional_gids: vec![],
        sysctls: Default::default(),
        host_pid: false,
        host_ipc: false,
        host_network: false,
        privileged: false,
        fence_deadline_ms: None,
        stdin: false,
        stdin_once: false,
        termination_message_from_logs: false,
        tty: false,
    }
}

/// Shoal's runtime: start through the shim, wait for the exit, remove.
fn shoal_cycles(dir: &Path, images: &Path, cycles: usize) -> anyhow::Result<Vec<f64>> {
    let store = ImageStore::open(dir.join("images"))?;
    store.import(&images.join("busybox-1.oci.tar"), None)?;
    let image = store.resolve("shoal.local/busybox:1")?;
    let runtime = Runtime::new(dir)?.with_shoal_binary(shoal_chaos::shoal_binary()?);
    let uid = "bench-cycle";
    runtime.ensure_sandbox(&SandboxSpec {
        uid: uid.into(),
        namespace: "default".into(),
        name: "bench".into(),
        hostname: "bench".into(),
        memory_limit_bytes: None,
        pids_limit: None,
        host_network: false,
        dns: Default::default(),
        cpu_request_millis: 0,
        memory_request_bytes: 0,
    })?;
    let mut times = Vec::new();
    for attempt in 0..cycles as u32 {
        let id = format!("{uid}-c-{attempt}");
        let meta = ContainerMeta {
            name: "c".into(),
            attempt,
            init: false,
            image: image.reference.clone(),
            image_digest: image.digest.clone(),
            runtime_id: id.clone(),
            cgroup_path: format!("{}/{id}", runtime.pod_cgroup(uid)),
        };
        let req = request(
            &id,
            image.layers.clone(),
            runtime.log_path(uid, "c", attempt),
        );
        let start = Instant::now();
        runtime.start_container(uid, &meta, &req)?;
        let started = start.elapsed();
        loop {
            let exited = runtime.list().iter().flat_map(|p| &p.containers).any(|c| {
                c.meta.attempt == attempt && matches!(c.state, ObservedState::Exited { .. })
            });
            if exited {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("container {id} did not exit");
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        let exited = start.elapsed();
        runtime.remove_container(uid, "c", attempt)?;
        if std::env::var_os("BENCH_PHASES").is_some() {
            eprintln!(
                "cycle {attempt}: start {:.1} ms, exit seen {:.1} ms, removed {:.1} ms",
                ms(started),
                ms(exited),
                ms(start.elapsed())
            );
        }
        times.push(ms(start.elapsed()));
    }
    runtime.remove_sandbox(uid)?;
    Ok(times)
}

/// An OCI runtime binary alone on a plain bundle: `run` (create + start + wait) and `delete`.
fn binary_cycles(
    binary: &str,
    dir: &Path,
    images: &Path,
    cycles: usize,
) -> anyhow::Result<Vec<f64>> {
    let found = Command::new(binary).arg("--version").output();
    if !found.is_ok_and(|o| o.status.success()) {
        bail!("{binary} is not installed");
    }
    let store = ImageStore::open(dir.join("images"))?;
    store.import(&images.join("busybox-1.oci.tar"), None)?;
    let image = store.resolve("shoal.local/busybox:1")?;
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle)?;
    let status = Command::new("cp")
        .arg("-a")
        .arg(&image.layers[0])
        .arg(bundle.join("rootfs"))
        .status()?;
    if !status.success() {
        bail!("copying the rootfs failed");
    }
    let netns = format!("shoal-bench-{binary}");
    let _ = Command::new("ip").args(["netns", "add", &netns]).status();
    let req = request("x", vec![], dir.join("log"));
    let resolved = shoal_agent::runtime::spec::Resolved {
        mounts: vec![],
        netns: PathBuf::from(format!("/run/netns/{netns}")),
        cgroup_path: format!("/shoal/bench-{binary}"),
        seccomp_profile: None,
    };
    let spec = shoal_agent::runtime::spec::runtime_spec(&req, &resolved);
    std::fs::write(
        bundle.join("config.json"),
        serde_json::to_vec_pretty(&spec)?,
    )?;
    let root = dir.join(format!("{binary}-root"));
    let mut times = Vec::new();
    let mut result = Ok(());
    for i in 0..cycles {
        let id = format!("bench-{i}");
        let start = Instant::now();
        let out = Command::new(binary)
            .arg("--root")
            .arg(&root)
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            result = Err(anyhow::anyhow!(
                "{binary} run: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            break;
        }
        let out = Command::new(binary)
            .arg("--root")
            .arg(&root)
            .args(["delete", "--force", &id])
            .output()?;
        if !out.status.success() {
            result = Err(anyhow::anyhow!(
                "{binary} delete: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            break;
        }
        times.push(ms(start.elapsed()));
    }
    let _ = Command::new("ip")
        .args(["netns", "delete", &netns])
        .status();
    let _ = shoal_agent::runtime::cgroup::remove(
        shoal_agent::runtime::cgroup::Layout::detect(),
        &resolved.cgroup_path,
    );
    result.map(|()| times)
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": {"bench": "runtime"}},
           "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
               "name": "c", "image": "shoal.local/busybox:1",
               "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}]}})
}

/// A bench pod that must spread evenly over the nodes with the other pods of its kind.
fn spread_pod(name: &str) -> Value {
    let mut pod = pod(name);
    pod["metadata"]["labels"]["spread"] = json!("bench");
    pod["spec"]["topologySpreadConstraints"] = json!([{
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"spread": "bench"}}}]);
    pod
}

/// Applies `n` pods one after another at `agent`, each after the previous one is Running;
/// returns each one's time from apply to Running, and from apply to bound (its node seen at
/// `agent`), in milliseconds.
async fn apply_to_running(
    agent: &AgentProcess,
    n: usize,
    pod: impl Fn(usize) -> Value,
) -> anyhow::Result<Vec<Applied>> {
    let mut applied = Vec::new();
    for i in 0..n {
        // A pod, or {"claim": …, "pod": …}: the claim applied first, the time counted from it.
        let given = pod(i);
        let (claim, pod) = match given.get("pod") {
            Some(pod) => (Some(given["claim"].clone()), pod.clone()),
            None => (None, given),
        };
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let start = Instant::now();
        if let Some(claim) = &claim {
            let (status, body) = agent.apply(claim).await?;
            if !(200..300).contains(&status) {
                bail!("apply claim {name}: {status} {body}");
            }
        }
        let (status, body) = agent.apply(&pod).await?;
        if !(200..300).contains(&status) {
            bail!("apply {name}: {status} {body}");
        }
        let mut bound_at = None;
        loop {
            let (node, phase) = state(agent, &name).await;
            if bound_at.is_none() && node.is_some() {
                bound_at = Some(start.elapsed());
            }
            if phase.as_deref() == Some("Running") {
                applied.push(Applied {
                    running: ms(start.elapsed()),
                    bound: ms(bound_at.unwrap_or_else(|| start.elapsed())),
                    node: node.unwrap_or_default(),
                });
                break;
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("pod {name} not Running after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    Ok(applied)
}

/// One pod of [`apply_to_running`]: apply → Running and apply → bound (ms), and its node.
struct Applied {
    running: f64,
    bound: f64,
    node: String,
}

/// "p50 …, p90 …, p99 …, max … ms (apply → bound: p50 … ms; pods per node: …)", and the p50.
fn summary(pods: &[&Applied]) -> (String, f64) {
    let mut running: Vec<f64> = pods.iter().map(|p| p.running).collect();
    let mut bound: Vec<f64> = pods.iter().map(|p| p.bound).collect();
    let mut nodes = std::collections::BTreeMap::<&str, usize>::new();
    for p in pods {
        *nodes.entry(&p.node).or_default() += 1;
    }
    let p50 = percentile(&mut running, 0.5);
    (
        format!(
            "p50 {p50:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms (apply → bound: p50 {:.0} ms; pods per node: {nodes:?})",
            percentile(&mut running, 0.9),
            percentile(&mut running, 0.99),
            percentile(&mut running, 1.0),
            percentile(&mut bound, 0.5),
        ),
        p50,
    )
}

/// The pod's node and phase as `agent` shows them.
async fn state(agent: &AgentProcess, name: &str) -> (Option<String>, Option<String>) {
    let Ok((_, value)) = agent
        .call(
            hyper::Method::GET,
            &format!("/v1/objects/pods/{name}?namespace=default"),
            None,
        )
        .await
    else {
        return (None, None);
    };
    let text = |v: &Value| v.as_str().map(str::to_owned);
    (
        text(&value["spec"]["nodeName"]),
        text(&value["status"]["phase"]),
    )
}

async fn cluster(root: &Path, n: usize, images: &Path) -> anyhow::Result<Vec<AgentProcess>> {
    let binary = shoal_chaos::shoal_binary()?;
    shoal_chaos::testkit::start_cluster(root, n, |spec, i| {
        for image in ["busybox-1.oci.tar", "httpd-1.oci.tar"] {
            let out = Command::new(&binary)
                .args(["image", "import", "--data-dir"])
                .arg(root.join(format!("n{i}")))
                .arg(images.join(image))
                .output()?;
            if !out.status.success() {
                bail!("image import: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        Ok(spec)
    })
    .await
}

fn shim_pss_bytes() -> (usize, u64) {
    let out = Command::new("pgrep").args(["-f", "shoal shim"]).output();
    let pids: Vec<u32> = out
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // Proportional set size: the shims share the binary's pages, which RSS counts per process.
    let pss = pids
        .iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).ok()?;
            let kb: u64 = text
                .lines()
                .find(|l| l.starts_with("Pss:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(kb * 1024)
        })
        .sum();
    (pids.len(), pss)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.cycles = 2;
        args.pods = 3;
        args.replicas = 3;
        args.stateful = 2;
    }
    let images = shoal_chaos::test_images().context("building the test images")?;
    println!(
        "# runtime-bench: cycles={} pods={} replicas={}",
        args.cycles, args.pods, args.replicas
    );
    if args.deployment_only {
        return deployment(&images, args.replicas).await;
    }
    if args.stateful_only {
        return stateful(&images, args.stateful).await;
    }

    println!(
        "\n## 1. create + start + exit + delete (`sh -c 'echo hello'`), median of {}",
        args.cycles
    );
    let dir = tempfile::tempdir()?;
    let (cycles, images2) = (args.cycles, images.clone());
    let path = dir.path().to_owned();
    let mut shoal =
        tokio::task::spawn_blocking(move || shoal_cycles(&path, &images2, cycles)).await??;
    let shoal_median = median(&mut shoal);
    println!(
        "shoal (shim + runc, overlay, pod netns): median {shoal_median:.1} ms, p90 {:.1} ms",
        percentile(&mut shoal, 0.9)
    );
    for binary in ["runc", "crun"] {
        let dir = tempfile::tempdir()?;
        let (path, images2) = (dir.path().to_owned(), images.clone());
        let b = binary.to_owned();
        match tokio::task::spawn_blocking(move || binary_cycles(&b, &path, &images2, cycles))
            .await?
        {
            Ok(mut times) => {
                let m = median(&mut times);
                println!(
                    "{binary} alone (run + delete): median {m:.1} ms → shoal/{binary} = {:.2}",
                    shoal_median / m
                );
            }
            Err(e) => println!("{binary}: does not run here: {e:#}"),
        }
    }

    println!(
        "\n## 2. apply → Running, {} pods and {0} with a spread constraint, in turn, one after another, 3 agents on loopback",
        args.pods
    );
    let root = tempfile::tempdir()?;
    let agents = cluster(root.path(), 3, &images).await?;
    // Every other pod has a required spread over the nodes (maxSkew 1, DoNotSchedule) among
    // its kind: a constraint over many domains, so each is auctioned by the constraint's
    // auctioneer, one at a time, and checked against its view (issue #37). Taken in turn, so
    // both kinds meet the same cluster (as many pods running, the same moment).
    let applied = apply_to_running(&agents[0], 2 * args.pods, |i| {
        if i % 2 == 0 {
            pod(&format!("lat-{}", i / 2))
        } else {
            spread_pod(&format!("spread-{}", i / 2))
        }
    })
    .await?;
    let (line, unconstrained) = summary(&applied.iter().step_by(2).collect::<Vec<_>>());
    println!("apply → Running: {line}");
    let (line, constrained) = summary(&applied.iter().skip(1).step_by(2).collect::<Vec<_>>());
    println!(
        "apply → Running with a required spread over the nodes: {line}; p50 constrained / unconstrained = {:.2}",
        constrained / unconstrained
    );
    drop(agents);

    println!(
        "\n## 3. memory: one agent, 0 then {} running pods",
        args.pods
    );
    let root = tempfile::tempdir()?;
    let agents = cluster(root.path(), 1, &images).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = rss_bytes_of(agents[0].pid().unwrap()).unwrap_or(0);
    for i in 0..args.pods {
        agents[0].apply(&pod(&format!("mem-{i}"))).await?;
    }
    let started = Instant::now();
    wait_until("all pods Running", Duration::from_secs(300), || async {
        let items = default_pods(&agents[0]).await;
        items.len() == args.pods && items.iter().all(|p| p["status"]["phase"] == "Running")
    })
    .await?;
    let all_running = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let busy = rss_bytes_of(agents[0].pid().unwrap()).unwrap_or(0);
    let (shims, shim_rss) = shim_pss_bytes();
    println!(
        "agent RSS: {:.1} MB with 0 pods, {:.1} MB with {} running ({} applied at once, all Running after {:.1} s)",
        idle as f64 / 1e6,
        busy as f64 / 1e6,
        args.pods,
        args.pods,
        all_running.as_secs_f64()
    );
    println!(
        "shims: {shims} processes, {:.1} MB PSS in all ({:.2} MB each)",
        shim_rss as f64 / 1e6,
        shim_rss as f64 / 1e6 / shims.max(1) as f64
    );
    drop(agents);
    deployment(&images, args.replicas).await?;
    stateful(&images, args.stateful).await
}

/// A claim of the built-in class and a pod that mounts it.
fn claim_and_pod(name: &str) -> (Value, Value) {
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}}});
    let mut pod = pod(name);
    pod["spec"]["volumes"] =
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": name}}]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    (claim, pod)
}

fn empty_dir_pod(name: &str) -> Value {
    let mut pod = pod(name);
    pod["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    pod
}

/// Section 5: claims and StatefulSets (issue #39).
async fn stateful(images: &Path, n: usize) -> anyhow::Result<()> {
    println!(
        "\n## 5. storage, 3 agents: a pod with a new claim against one with an emptyDir ({n} each, in turn), then a StatefulSet of {n} OrderedReady replicas with a claim each"
    );
    let root = tempfile::tempdir()?;
    let agents = cluster(root.path(), 3, images).await?;
    // The built-in StorageClass is made by one agent at the cluster's start.
    wait_until(
        "the built-in StorageClass",
        Duration::from_secs(60),
        || async {
            agents[0]
                .object("storageclasses", "", "local-path")
                .await
                .ok()
                .flatten()
                .is_some()
        },
    )
    .await?;
    // The claim is applied just before its pod, both counted from the claim's apply.
    let applied = apply_to_running(&agents[0], 2 * n, |i| {
        if i % 2 == 0 {
            empty_dir_pod(&format!("empty-{}", i / 2))
        } else {
            let (claim, pod) = claim_and_pod(&format!("claim-{}", i / 2));
            json!({"claim": claim, "pod": pod})
        }
    })
    .await?;
    let (line, empty) = summary(&applied.iter().step_by(2).collect::<Vec<_>>());
    println!("apply → Running, pod with an emptyDir: {line}");
    let (line, claimed) = summary(&applied.iter().skip(1).step_by(2).collect::<Vec<_>>());
    println!(
        "apply → Running, pod with a new claim (claim made, volume provisioned and bound on the pod's node): {line}; p50 claim / emptyDir = {:.2} (goal ≤ 1.2)",
        claimed / empty
    );
    // A StatefulSet's pods are fenced (at most one per identity): each starts only with its
    // node's run lease. The same single pod with a claim, fenced, is the StatefulSet's
    // per-pod baseline (the first ones also wait out the grantors' refusal after their start).
    let fenced = apply_to_running(&agents[0], n, |i| {
        let (claim, mut pod) = claim_and_pod(&format!("fenced-{i}"));
        pod["metadata"]["annotations"] = json!({"shoal.io/partition-policy": "fenced"});
        json!({"claim": claim, "pod": pod})
    })
    .await?;
    let (line, fenced_p50) = summary(&fenced.iter().collect::<Vec<_>>());
    println!("apply → Running, fenced pod with a new claim (a StatefulSet pod's way): {line}");
    let sts = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "bench", "namespace": "default"},
        "spec": {"replicas": n, "serviceName": "bench",
            "selector": {"matchLabels": {"app": "bench-sts"}},
            "template": {"metadata": {"labels": {"app": "bench-sts"}},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c",
                    "image": "shoal.local/busybox:1",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}}}]}});
    let start = Instant::now();
    let (status, body) = agents[0].apply(&sts).await?;
    if !(200..300).contains(&status) {
        bail!("apply: {status} {body}");
    }
    // Each ordinal's way: when its pod was first seen, bound, Running and Ready (ms).
    let mut seen: std::collections::BTreeMap<String, [Option<f64>; 4]> = Default::default();
    loop {
        let pods = default_pods(&agents[0]).await;
        let now = ms(start.elapsed());
        let mut ready = 0;
        for p in pods
            .iter()
            .filter(|p| p["metadata"]["labels"]["app"] == "bench-sts")
        {
            let name = p["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let is_ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            ready += usize::from(is_ready);
            let at = seen.entry(name).or_default();
            for (i, reached) in [
                true,
                p["spec"]["nodeName"]
                    .as_str()
                    .is_some_and(|n| !n.is_empty()),
                p["status"]["phase"] == "Running",
                is_ready,
            ]
            .into_iter()
            .enumerate()
            {
                if reached && at[i].is_none() {
                    at[i] = Some(now);
                }
            }
        }
        if ready >= n {
            let mut ordered: Vec<(&String, &[Option<f64>; 4])> = seen.iter().collect();
            ordered.sort_by(|a, b| {
                a.1[0]
                    .partial_cmp(&b.1[0])
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
            for (name, at) in ordered {
                println!(
                    "  {name}: seen {} ms, bound {}, Running {}, Ready {}",
                    f(at[0]),
                    f(at[1]),
                    f(at[2]),
                    f(at[3])
                );
            }
            break;
        }
        if start.elapsed() > Duration::from_secs(300) {
            bail!("{ready} of {n} StatefulSet pods Ready after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let total = ms(start.elapsed());
    let goal = n as f64 * fenced_p50 + 1000.0;
    println!(
        "StatefulSet of {n} (OrderedReady, a claim each): apply → all Ready {:.2} s; goal ≤ {n} × {fenced_p50:.0} ms (the fenced pod's p50) + 1 s = {:.2} s; ratio {:.2}",
        total / 1000.0,
        goal / 1000.0,
        total / goal
    );
    drop(agents);
    Ok(())
}

fn deployment_object(replicas: usize, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "bench", "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "bench"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {"metadata": {"labels": {"app": "bench"}},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "web", "image": image,
                    "command": ["httpd", "-f", "-p", "8080", "-h", "/"]}]}}}})
}

/// One pod of the bench Deployment: (name, image, ready, bound, running).
type BenchPod = (String, String, bool, bool, bool);

/// The default namespace's pods (with observed status) through an agent's control socket.
async fn default_pods(agent: &AgentProcess) -> Vec<Value> {
    let (_, list) = agent
        .call(
            hyper::Method::GET,
            "/v1/objects/pods?namespace=default",
            None,
        )
        .await
        .unwrap_or_default();
    list["items"].as_array().cloned().unwrap_or_default()
}

async fn bench_pods(agent: &AgentProcess) -> Vec<BenchPod> {
    default_pods(agent)
        .await
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "bench")
        .map(|p| {
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                p["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                ready,
                p["spec"]["nodeName"]
                    .as_str()
                    .is_some_and(|n| !n.is_empty()),
                p["status"]["phase"] == "Running",
            )
        })
        .collect()
}

/// Section 4: a Deployment of `replicas` on 3 agents, apply → every pod Ready (per pod and in
/// all), then a rollout to another image (25% surge / 25% unavailable) until every pod is new
/// and Ready. Polled every 20 ms through one agent's control socket.
async fn deployment(images: &Path, replicas: usize) -> anyhow::Result<()> {
    println!(
        "\n## 4. Deployment of {replicas} replicas on 3 agents: apply → all Ready, then a rollout"
    );
    let root = tempfile::tempdir()?;
    let agents = cluster(root.path(), 3, images).await?;
    let start = Instant::now();
    let (status, body) = agents[0]
        .apply(&deployment_object(replicas, "shoal.local/httpd:1"))
        .await?;
    if !(200..300).contains(&status) {
        bail!("apply: {status} {body}");
    }
    let mut ready_at: std::collections::HashMap<String, f64> = Default::default();
    // When all pods first existed, were bound, ran (the phases of the way to Ready).
    let (mut created, mut bound, mut running) = (None, None, None);
    loop {
        let pods = bench_pods(&agents[0]).await;
        let now = ms(start.elapsed());
        let all = |f: &dyn Fn(&BenchPod) -> bool| pods.len() >= replicas && pods.iter().all(f);
        if created.is_none() && pods.len() >= replicas {
            created = Some(now);
        }
        if bound.is_none() && all(&|p| p.3) {
            bound = Some(now);
        }
        if running.is_none() && all(&|p| p.4) {
            running = Some(now);
        }
        for (name, _, ready, _, _) in pods {
            if ready {
                ready_at.entry(name).or_insert(now);
            }
        }
        if ready_at.len() >= replicas {
            break;
        }
        if start.elapsed() > Duration::from_secs(300) {
            bail!("{} of {replicas} Ready after 300 s", ready_at.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let total = ms(start.elapsed());
    let mut per_pod: Vec<f64> = ready_at.into_values().collect();
    println!(
        "apply → Ready per pod: p50 {:.0} ms, p99 {:.0} ms; all {replicas} Ready after {:.2} s \
         (all created after {:.2} s, bound {:.2} s, Running {:.2} s)",
        percentile(&mut per_pod, 0.5),
        percentile(&mut per_pod, 0.99),
        total / 1000.0,
        created.unwrap_or(total) / 1000.0,
        bound.unwrap_or(total) / 1000.0,
        running.unwrap_or(total) / 1000.0,
    );
    let start = Instant::now();
    agents[0]
        .apply(&deployment_object(replicas, "shoal.local/busybox:1"))
        .await?;
    loop {
        let pods = bench_pods(&agents[0]).await;
        let done = pods.len() == replicas
            && pods
                .iter()
                .all(|(_, image, ready, _, _)| *ready && image == "shoal.local/busybox:1");
        if done {
            break;
        }
        if start.elapsed() > Duration::from_secs(300) {
            bail!("rollout not done after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "rollout to a new image: all {replicas} new pods Ready, old ones gone, after {:.2} s",
        start.elapsed().as_secs_f64()
    );
    drop(agents);
    Ok(())
}

//! One chaos run: N real agents in a network-namespace lab, a seeded fault schedule played
//! against them, a workload through their APIs recorded as a history, and the checkers' verdicts
//! written up as a report. Everything the run made is removed when it ends — also on an error or
//! when its future is dropped (Ctrl-C): the agents, the namespaces with their links and nftables
//! rules, and the data directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::testkit::AgentProcess;
use anyhow::Context;
use serde_json::{Value, json};
use shoal_agent::client::ControlClient;

use crate::checker::{
    self, DigestSample, Final, Intrusion, JobSeen, Leftovers, PodSeen, ReplicaSample, Violation,
};
use crate::history::{History, Op, Outcome, Request};
use crate::lab::{self, NetLab};
use crate::poison;
use crate::scenario::{self, Fault, Scenario, Step};

/// Names of everything a chaos run makes start with this (namespaces `shc<pid>-h<i>`, the data
/// directory `/tmp/shoal-chaos-*`), so `shoal-chaos clean` finds what a killed run left.
pub const PREFIX: &str = "shc";
pub const DATA_PREFIX: &str = "shoal-chaos-";

/// The workload's Deployment and DaemonSet (checker 3), and the agent without the secret
/// (checker 6).
const APP: &str = "chaos-app";
const DAEMON: &str = "chaos-daemon";
const INTRUDER: &str = "intruder";
/// Every agent serves the Kubernetes API here, inside its host's namespace (checker 6 calls it
/// without a token).
const API_PORT: u16 = 6443;
/// The most replicas the scaler asks for.
const MAX_REPLICAS: u64 = 4;
/// The workload's fenced pods (checker 4), and what each agent runs them with: a fence timeout
/// that the kill and pause faults outlast, so the majority does replace them.
const FENCED_PODS: usize = 3;
const FENCE_TIMEOUT: &str = "2s";
/// Checker 5's Deployment: real containers with cpu requests, more than one node holds, so
/// the auction and the nodes' admission have something to get wrong. 10 × 600m: three fit a
/// node of 2 cpus, a fourth does not.
const HEAVY: &str = "chaos-heavy";
/// Checker 3's Job: Indexed, [`JOB_COMPLETIONS`] completions two at a time, each pod 3 s of
/// busybox, so it runs through the first faults.
const JOB: &str = "chaos-job";
const JOB_COMPLETIONS: u64 = 8;
const HEAVY_REPLICAS: u64 = 10;
const HEAVY_CPU: &str = "600m";
/// How often checker 5 reads the agents' cgroups.
const CPU_SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// Each node's disk in the scenarios that fill disks: a tmpfs this large on its data dir (a
/// node's busybox image, sandboxes and store take ~15 MiB).
const DISK_SIZE: &str = "256m";
/// libfaketime (Debian's `faketime` package), preloaded into every agent of the scenarios that
/// move clocks; the multi-threaded build, for tokio's workers.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// The file a disk-full fault fills a node's disk with.
const FILLER: &str = "chaos-filler";

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub nodes: usize,
    pub duration: Duration,
    pub seed: u64,
    pub scenario: &'static Scenario,
    /// Where `report.md`, `timeline.svg` and `history.jsonl` go (none: not written).
    pub report_dir: Option<PathBuf>,
    /// Stores must agree within this long after the last fault is healed.
    pub converge_bound: Duration,
    /// Concurrent workload clients and the register objects they write.
    pub clients: usize,
    pub keys: usize,
    /// The checkers' self-test: the run breaks five invariants on purpose — the agent meant
    /// to be without the secret is given the cluster's; once the faults are healed a pod of a
    /// foreign controller joins the Deployment's; an unfenced twin of a fenced pod writes that
    /// pod's heartbeats; a process granted 4 cpus of shares runs in host 0's agent's pod
    /// cgroups; and a write of [`DROPPED_KEY`] is sent, which the agents, started with
    /// fault injection on ([`shoal_agent::fault_injection`]), acknowledge and drop — so
    /// checkers 1, 3, 4, 5 and 6 must report them (1 only when the agent is a debug build).
    pub sabotage: bool,
    /// The agent binary (none: [`crate::shoal_binary`]).
    pub binary: Option<PathBuf>,
    /// Keep the agents' logs and the workload's objects in the report directory also when the
    /// run passes (a failed run always keeps them).
    pub keep_evidence: bool,
}

impl RunConfig {
    pub fn new(scenario: &'static Scenario, nodes: usize, duration: Duration, seed: u64) -> Self {
        Self {
            nodes,
            duration,
            seed,
            scenario,
            report_dir: None,
            keep_evidence: false,
            converge_bound: Duration::from_secs(60),
            clients: 4,
            keys: 8,
            sabotage: false,
            binary: None,
        }
    }
}

/// What a run found.
#[derive(Debug)]
pub struct RunReport {
    pub config: RunConfig,
    pub steps: Vec<Step>,
    /// (ms since start, what the fault driver did).
    pub fault_log: Vec<(u64, String)>,
    pub history: History,
    pub samples: Vec<DigestSample>,
    /// When the last fault was healed and the workload's last operation had ended.
    pub quiet_ms: u64,
    pub convergence_ms: Option<u64>,
    pub violations: Vec<Violation>,
    pub checkers: Vec<(&'static str, usize)>,
    /// Scale requests acknowledged and not.
    pub scales: (usize, usize),
    /// From the heal to exact replica counts (checker 3).
    pub replicas_ms: Option<u64>,
    /// What checker 6 judged from, in a line.
    pub intrusion_evidence: String,
    /// The fenced pods' runs, from their heartbeats (checker 4).
    pub fenced_runs: Vec<checker::Instance>,
    /// What checker 5 judged from, in a line.
    pub overcommit_evidence: String,
    /// The hostile objects sent and what they got (checker 8).
    pub hostile: Vec<poison::Outcome>,
}

impl RunReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// Operations acknowledged per second while a fault was active.
    pub fn acked_per_second_during_faults(&self) -> f64 {
        let fault_ms: u64 = self.steps.iter().map(|s| s.end_ms - s.start_ms).sum();
        let acked = self
            .history
            .ops
            .iter()
            .filter(|o| o.outcome == Outcome::Ok)
            .filter(|o| {
                self.steps
                    .iter()
                    .any(|s| (s.start_ms..=s.end_ms).contains(&o.completed_ms))
            })
            .count();
        if fault_ms == 0 {
            0.0
        } else {
            acked as f64 * 1000.0 / fault_ms as f64
        }
    }
}

/// Fails unless this process may create network namespaces and nftables rules.
pub fn require_root() -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "shoal-chaos needs root: it creates network namespaces, veths and nftables rules, and runs agents inside them (run it with sudo)"
    );
    for tool in ["ip", "nft", "curl"] {
        let found = std::process::Command::new(tool)
            .arg("-V")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok();
        anyhow::ensure!(
            found,
            "shoal-chaos needs `{tool}` (apt-get install iproute2 nftables curl)"
        );
    }
    Ok(())
}

/// The register object a workload key names. A `blob-*` key (written once, in the scenarios
/// that fill disks) also carries [`BLOB_BYTES`] of padding, so the stores keep growing and a
/// full disk is met by writes that need room, not only by rewrites of pages the store holds.
fn register(key: &str, value: &str) -> Value {
    let mut object = json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": key, "namespace": "default", "labels": {"shoal-chaos": "register"}},
           "data": {"v": value}});
    if key == DROPPED_KEY {
        object["metadata"]["annotations"] =
            json!({shoal_agent::fault_injection::DROP_ANNOTATION: "true"});
    }
    if key.starts_with(BLOB_PREFIX) {
        object["data"]["pad"] = json!(format!("{value}:").repeat(BLOB_BYTES / (value.len() + 1)));
    }
    object
}

/// The self-test's register: an agent with fault injection on acknowledges its write and
/// stores it nowhere ([`shoal_agent::fault_injection`]), so checker 1 must report it.
pub const DROPPED_KEY: &str = "reg-dropped";

/// Keys of the workload's one-off large writes.
const BLOB_PREFIX: &str = "blob-";
const BLOB_BYTES: usize = 64 * 1024;

/// The workload's Deployment: pods of an image no node has, so they exist in desired state and
/// on their nodes (pulling, backing off) without running anything, which is what the counts need.
fn deployment(replicas: u64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": APP, "namespace": "default"},
           "spec": {"replicas": replicas,
                    "selector": {"matchLabels": {"app": APP}},
                    "template": {"metadata": {"labels": {"app": APP}},
                                 "spec": {"containers": [{"name": "c", "image": "chaos.invalid/none:1"}]}}}})
}

/// A fenced pod of the workload (checker 4). Its container draws an id when it starts and
/// appends the host's uptime (10 ms ticks, one clock for every node of the lab) to its own file
/// of the shared heartbeat directory every 100 ms: the evidence of where and when it ran, which
/// outlives the container, its node's agent and a wiped data dir. PID 1 of the container (the
/// shell) ignores SIGTERM: only a kill stops it, as the fence must. `as_pod` is the pod whose
/// heartbeats it writes (the self-test's twin writes another's).
fn fenced_pod(name: &str, as_pod: &str, fenced: bool, heartbeats: &Path) -> Value {
    let script = "id=$(cat /proc/sys/kernel/random/uuid); f=/hb/${POD}_${NODE}_${id}; \
                  while true; do read up rest < /proc/uptime; echo $up >> $f; sleep 0.1; done";
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default",
                        "annotations": {"shoal.io/partition-policy": if fenced { "fenced" } else { "available" }}},
           "spec": {"terminationGracePeriodSeconds": 30,
                    "volumes": [{"name": "hb", "hostPath": {"path": heartbeats, "type": "Directory"}}],
                    "containers": [{"name": "c", "image": "shoal.local/busybox:1",
                                    "command": ["sh", "-c", script],
                                    "env": [{"name": "POD", "value": as_pod},
                                            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                                    "volumeMounts": [{"name": "hb", "mountPath": "/hb"}]}]}})
}

fn fenced_name(i: usize) -> String {
    format!("chaos-fenced-{i}")
}

/// The workload's StatefulSet (issue #39): its pods are fenced by their controller, each
/// identity `chaos-db-k` one pod to fence (checker 4), with the fenced pods' heartbeats.
const STATEFUL: &str = "chaos-db";
const STATEFUL_REPLICAS: usize = 2;

fn stateful_set(heartbeats: &Path) -> Value {
    let mut pod = fenced_pod("template", "", true, heartbeats);
    // The pod's own name, whichever incarnation writes it.
    pod["spec"]["containers"][0]["env"][0] =
        json!({"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}});
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": STATEFUL, "namespace": "default"},
           "spec": {"replicas": STATEFUL_REPLICAS, "serviceName": STATEFUL,
                    "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": {"app": STATEFUL}},
                    "template": {"metadata": {"labels": {"app": STATEFUL}},
                                 "spec": pod["spec"]}}})
}

/// The fenced pods there are before the faults: the bare ones and the StatefulSet's.
fn steady_fenced_names() -> Vec<String> {
    (0..FENCED_PODS)
        .map(fenced_name)
        .chain((0..STATEFUL_REPLICAS).map(|k| format!("{STATEFUL}-{k}")))
        .collect()
}

/// The fenced pods created inside the first fault.
fn late_fenced_name(i: usize) -> String {
    format!("chaos-fenced-late-{i}")
}

/// The host's uptime in ms (the heartbeats' clock).
fn uptime_ms() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/uptime")?;
    parse_uptime_ms(text.split_whitespace().next().unwrap_or_default())
        .context("reading /proc/uptime")
}

fn parse_uptime_ms(text: &str) -> Option<u64> {
    let (secs, frac) = text.trim().split_once('.').unwrap_or((text.trim(), "0"));
    let secs: u64 = secs.parse().ok()?;
    let frac = format!("{frac:0<3}");
    let ms: u64 = frac.get(..3)?.parse().ok()?;
    secs.checked_mul(1000)?.checked_add(ms)
}

/// The fenced pods' runs from the heartbeat directory, on the run's clock (`start_uptime_ms`
/// is the host's uptime when the run's clock started). A file whose name or lines do not parse
/// is an error: the evidence must not be dropped silently.
fn fenced_runs(dir: &Path, start_uptime_ms: u64) -> anyhow::Result<Vec<checker::Instance>> {
    let mut runs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.rsplitn(3, '_');
        let (Some(id), Some(node), Some(pod)) = (parts.next(), parts.next(), parts.next()) else {
            anyhow::bail!("heartbeat file {name:?} is not <pod>_<node>_<id>");
        };
        let text = std::fs::read_to_string(entry.path())?;
        let mut beats: Vec<u64> = Vec::new();
        for line in text.lines() {
            // The last line may be cut short by a write in progress.
            if let Some(ms) = parse_uptime_ms(line) {
                beats.push(ms.saturating_sub(start_uptime_ms));
            }
        }
        runs.push(checker::Instance {
            pod: pod.to_owned(),
            node: node.to_owned(),
            id: id.to_owned(),
            first_ms: beats.iter().copied().min().unwrap_or(0),
            last_ms: beats.iter().copied().max().unwrap_or(0),
            beats: beats.len(),
        });
    }
    runs.sort_by(|a, b| (&a.pod, a.first_ms).cmp(&(&b.pod, b.first_ms)));
    Ok(runs)
}

/// Checker 3's Job ([`JOB`]).
fn job() -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": JOB, "namespace": "default"},
           "spec": {"completions": JOB_COMPLETIONS, "parallelism": 2, "completionMode": "Indexed",
                    "backoffLimit": 100,
                    "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                                          "containers": [{"name": "c", "image": "shoal.local/busybox:1",
                                                          "command": ["sleep", "3"]}]}}}})
}

/// Checker 5's Deployment: busybox sleeping with a cpu request (PID 1 ignores SIGTERM, so a
/// removed pod holds its share for its grace period, as a slow-stopping one would).
fn heavy_deployment() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": HEAVY, "namespace": "default"},
           "spec": {"replicas": HEAVY_REPLICAS,
                    "selector": {"matchLabels": {"app": HEAVY}},
                    "template": {"metadata": {"labels": {"app": HEAVY}},
                                 "spec": {"terminationGracePeriodSeconds": 3,
                                          "containers": [{"name": "c", "image": "shoal.local/busybox:1",
                                                          "command": ["sleep", "100000"],
                                                          "resources": {"requests": {"cpu": HEAVY_CPU}}}]}}}})
}

/// Reads every agent's granted cpu ([`crate::cpu`]) every [`CPU_SAMPLE_EVERY`] until `stop`.
/// `nodes` are (name, allocatable millicores, the cgroup directory of its pods).
fn cpu_sampler(
    nodes: Vec<(String, u64, PathBuf)>,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<checker::CpuSample>> {
    let layout = shoal_agent::runtime::cgroup::Layout::detect();
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for (node, allocatable_millis, dir) in &nodes {
                samples.push(checker::CpuSample {
                    at_ms: started.elapsed().as_millis() as u64,
                    node: node.clone(),
                    allocatable_millis: *allocatable_millis,
                    granted: crate::cpu::granted(layout, dir),
                });
            }
            std::thread::sleep(CPU_SAMPLE_EVERY);
        }
        samples
    })
}

/// Stops a sampler thread when the run ends, also on an error.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The self-test's breach of checker 5: a process granted 4 cpus of shares in a container
/// cgroup of an agent's pods, as a node that admitted far too much would run. Removed on drop.
struct CpuBreach {
    child: std::process::Child,
    dirs: Vec<PathBuf>,
}

impl CpuBreach {
    fn start(scope_dir: &Path) -> anyhow::Result<Self> {
        use shoal_agent::runtime::cgroup::Layout;
        let pod = scope_dir.join("podchaos-breach");
        let container = pod.join("c");
        std::fs::create_dir_all(&container)
            .with_context(|| format!("creating {}", container.display()))?;
        let child = std::process::Command::new("sleep").arg("600").spawn()?;
        let breach = Self {
            child,
            dirs: vec![container.clone(), pod],
        };
        let (file, value) = match Layout::detect() {
            Layout::V1 => ("cpu.shares", "4096"),
            // runc's weight for 4096 shares.
            Layout::V2 => ("cpu.weight", "156"),
        };
        std::fs::write(container.join(file), value)?;
        std::fs::write(
            container.join("cgroup.procs"),
            breach.child.id().to_string(),
        )?;
        Ok(breach)
    }
}

impl Drop for CpuBreach {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn daemon_set() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
           "metadata": {"name": DAEMON, "namespace": "default"},
           "spec": {"selector": {"matchLabels": {"app": DAEMON}},
                    "template": {"metadata": {"labels": {"app": DAEMON}},
                                 "spec": {"containers": [{"name": "c", "image": "chaos.invalid/none:1"}]}}}})
}

/// How an answer (or its absence) counts in the history.
pub fn classify(
    answer: &Result<(u16, Value), String>,
    connect_failed: bool,
) -> (Outcome, Option<String>, String) {
    match answer {
        Ok((status @ (200 | 201), body)) => (
            Outcome::Ok,
            body["metadata"]["uid"].as_str().map(str::to_owned),
            status.to_string(),
        ),
        // Too few nodes reachable: refused before anything was stored (the control API says
        // so in `reason`, the Kubernetes API in its Status's cause).
        Ok((503, body))
            if body["reason"] == "Unavailable"
                || body["details"]["causes"][0]["reason"] == "Unavailable" =>
        {
            (Outcome::Fail, None, "503 Unavailable".to_owned())
        }
        // Stored on the answering node, not yet on the quorum: may take effect.
        Ok((status, body)) if *status >= 500 => (
            Outcome::Unknown,
            None,
            format!("{status} {}", body["reason"].as_str().unwrap_or_default()),
        ),
        // Refused before anything was stored (validation, conflict, not found).
        Ok((status, body)) => (
            Outcome::Fail,
            None,
            format!("{status} {}", body["reason"].as_str().unwrap_or_default()),
        ),
        Err(error) if connect_failed => (Outcome::Fail, None, error.clone()),
        Err(error) => (Outcome::Unknown, None, error.clone()),
    }
}

/// How a workload write goes to the Kubernetes API: create, replace, or patch the register's
/// value (JSON merge patch), as kubectl create, replace and patch do.
#[derive(Debug, Clone, Copy)]
enum Via {
    Post,
    Put,
    Patch,
}

struct Workload {
    /// Each agent's control socket (membership samples) and Kubernetes API (the operations).
    clients: Vec<ControlClient>,
    kube: Vec<crate::kube::KubeClient>,
    keys: usize,
    /// Whether 15% of the writes are one-off 64 KiB objects (`blob-<id>`).
    blobs: bool,
    started: Instant,
    next_id: AtomicU64,
    stop: AtomicBool,
    ops: Mutex<Vec<Op>>,
    /// Checker 7's reads (the slow-disk scenario only).
    reads: Mutex<Vec<checker::Read>>,
    scales: Mutex<(usize, usize)>,
    /// The lab's agent names, and the agent without the secret with its gossip address.
    names: Vec<String>,
    intruder: ControlClient,
    intruder_addr: std::net::SocketAddr,
    intrusion: Mutex<Intrusion>,
}

impl Workload {
    fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    async fn client_loop(self: Arc<Self>, seed: u64) {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(seed);
        while !self.stop.load(Ordering::Relaxed) {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let node = rng.random_range(0..self.clients.len());
            let key = format!("reg-{}", rng.random_range(0..self.keys));
            let roll = rng.random_range(0..100);
            let request = if self.blobs && roll < 15 {
                Request::Write {
                    key: format!("{BLOB_PREFIX}{id}"),
                    value: format!("v{id}"),
                }
            } else if roll < 85 {
                Request::Write {
                    key,
                    value: format!("v{id}"),
                }
            } else {
                Request::Delete { key }
            };
            // Blobs are created whole; a register is created, replaced or patched.
            let via = match (request.key().starts_with(BLOB_PREFIX), roll % 3) {
                (true, _) | (false, 0) => Via::Post,
                (false, 1) => Via::Put,
                _ => Via::Patch,
            };
            let op = self.perform(id, node, request, via).await;
            self.ops.lock().unwrap().push(op);
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..150))).await;
        }
    }

    /// Sends one operation to agent `node`'s Kubernetes API and records how it ended.
    async fn perform(&self, id: u64, node: usize, request: Request, via: Via) -> Op {
        let invoked_ms = self.ms();
        let client = &self.kube[node];
        const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
        const JSON: &str = "application/json";
        let call = async {
            match (&request, via) {
                (Request::Write { key, value }, Via::Post) => {
                    let body = serde_json::to_vec(&register(key, value)).expect("json");
                    let method = hyper::Method::POST;
                    client.send(method, CONFIGMAPS, JSON, Some(body)).await
                }
                (Request::Write { key, value }, Via::Put) => {
                    let body = serde_json::to_vec(&register(key, value)).expect("json");
                    let path = format!("{CONFIGMAPS}/{key}");
                    client
                        .send(hyper::Method::PUT, &path, JSON, Some(body))
                        .await
                }
                (Request::Write { key, value }, Via::Patch) => {
                    let body = serde_json::to_vec(&json!({"data": {"v": value}})).expect("json");
                    let path = format!("{CONFIGMAPS}/{key}");
                    let merge = "application/merge-patch+json";
                    client
                        .send(hyper::Method::PATCH, &path, merge, Some(body))
                        .await
                }
                (Request::Delete { key }, _) => {
                    let path = format!("{CONFIGMAPS}/{key}");
                    client.send(hyper::Method::DELETE, &path, JSON, None).await
                }
            }
        };
        let (answer, connect_failed) =
            match tokio::time::timeout(Duration::from_secs(10), call).await {
                Ok(Ok((status, bytes))) => (
                    Ok((
                        status,
                        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                    )),
                    false,
                ),
                Ok(Err(e @ crate::kube::KubeError::Connect { .. })) => (Err(e.to_string()), true),
                Ok(Err(e)) => (Err(e.to_string()), false),
                Err(_) => (Err("no answer within 10 s".into()), false),
            };
        let created = matches!(answer, Ok((201, _)));
        let (outcome, uid, detail) = classify(&answer, connect_failed);
        let method = match (&request, via) {
            (Request::Delete { .. }, _) => "DELETE",
            (_, Via::Post) => "POST",
            (_, Via::Put) => "PUT",
            (_, Via::Patch) => "PATCH",
        };
        Op {
            id,
            node,
            request,
            invoked_ms,
            completed_ms: self.ms(),
            outcome,
            uid,
            created,
            detail: format!("{method} {detail}"),
        }
    }
}

impl Workload {
    /// Sets the Deployment's replicas to a random count through a random agent's Kubernetes
    /// API, every 1–3 s (a merge patch of its `scale` subresource, as `kubectl scale` sends).
    async fn scaler_loop(self: Arc<Self>, seed: u64) {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(seed);
        while !self.stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
            let client = &self.kube[rng.random_range(0..self.kube.len())];
            let replicas = rng.random_range(0..=MAX_REPLICAS);
            let scale = async {
                let path = format!("/apis/apps/v1/namespaces/default/deployments/{APP}/scale");
                let body = serde_json::to_vec(&json!({"spec": {"replicas": replicas}})).ok()?;
                let merge = "application/merge-patch+json";
                let (status, _) = client
                    .send(hyper::Method::PATCH, &path, merge, Some(body))
                    .await
                    .ok()?;
                (status == 200).then_some(())
            };
            let done = tokio::time::timeout(Duration::from_secs(10), scale).await;
            let mut scales = self.scales.lock().unwrap();
            match done {
                Ok(Some(())) => scales.0 += 1,
                _ => scales.1 += 1,
            }
        }
    }

    /// Creates `pods` (fenced) `at_ms` into the run — inside the first fault, so they are
    /// auctioned and bound while the views disagree — through the agents in turn, each until
    /// one acknowledges it or the workload stops. Returns the names acknowledged (checker 4
    /// holds those to its rule).
    async fn fenced_during_faults(self: Arc<Self>, at_ms: u64, pods: Vec<Value>) -> Vec<String> {
        let wait = at_ms.saturating_sub(self.ms());
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let mut acknowledged = Vec::new();
        let mut next = 0usize;
        for pod in pods {
            let body = serde_json::to_vec(&pod).expect("json");
            while !self.stop.load(Ordering::Relaxed) {
                let client = &self.clients[next % self.clients.len()];
                next += 1;
                let put = client.send(hyper::Method::PUT, "/v1/objects", Some(body.clone()));
                if let Ok(Ok((200 | 201, _))) =
                    tokio::time::timeout(Duration::from_secs(5), put).await
                {
                    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
                    acknowledged.push(name.to_owned());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        acknowledged
    }

    /// Checker 8's requests: at each poison fault's start, the hostile set to the fault's node,
    /// once each (a transport error is recorded as status 0).
    async fn poison_during_faults(self: Arc<Self>, steps: Vec<Step>) -> Vec<poison::Outcome> {
        let mut outcomes = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let Fault::Poison { node } = step.fault else {
                continue;
            };
            let wait = step.start_ms.saturating_sub(self.ms());
            tokio::time::sleep(Duration::from_millis(wait)).await;
            for hostile in poison::hostile_set(&i.to_string()) {
                let post = self.kube[node].send(
                    hyper::Method::POST,
                    &hostile.path,
                    "application/json",
                    Some(hostile.body.clone()),
                );
                let (status, message) =
                    match tokio::time::timeout(Duration::from_secs(15), post).await {
                        Ok(Ok((status @ 200..=299, _))) => (status, "created".to_owned()),
                        Ok(Ok((status, body))) => {
                            let message = serde_json::from_slice::<Value>(&body)
                                .ok()
                                .and_then(|v| v["message"].as_str().map(str::to_owned))
                                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
                            (status, message)
                        }
                        Ok(Err(e)) => (0, e.to_string()),
                        Err(_) => (0, "no answer within 15 s".to_owned()),
                    };
                outcomes.push((hostile, node, status, message));
            }
        }
        outcomes
            .into_iter()
            .map(|(hostile, node, status, message)| poison::Outcome {
                name: hostile.name,
                node,
                expect: hostile.expect,
                status,
                message,
                pods: hostile.pods.map(|_| Vec::new()).unwrap_or_default(),
            })
            .collect()
    }

    /// Checker 7's reader: LISTs the workload's ConfigMaps on every agent, one agent after
    /// another, each read given up on after 15 s.
    async fn reader_loop(self: Arc<Self>) {
        const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
        let this = &*self;
        while !this.stop.load(Ordering::Relaxed) {
            let reads = this
                .kube
                .iter()
                .enumerate()
                .map(|(node, client)| async move {
                    let invoked_ms = this.ms();
                    let answer = tokio::time::timeout(
                        Duration::from_secs(15),
                        client.send(hyper::Method::GET, CONFIGMAPS, "application/json", None),
                    )
                    .await;
                    checker::Read {
                        node,
                        invoked_ms,
                        completed_ms: this.ms(),
                        ok: matches!(answer, Ok(Ok((200, _)))),
                    }
                });
            let reads = futures_util::future::join_all(reads).await;
            this.reads.lock().unwrap().extend(reads);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every 500 ms until the workload stops: whom each agent and the intruder list as members
    /// (checker 6).
    async fn membership_sampler(self: Arc<Self>) {
        loop {
            self.sample_membership().await;
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn sample_membership(&self) {
        let ask = Duration::from_secs(1);
        for (name, client) in self.names.iter().zip(&self.clients) {
            // A paused or killed agent does not answer; that is no evidence either way.
            if let Ok(Ok(members)) = tokio::time::timeout(ask, client.members()).await {
                let names = self.member_names(&members);
                let at = self.ms();
                self.intrusion
                    .lock()
                    .unwrap()
                    .views
                    .push((name.clone(), at, names));
            }
        }
        if let Ok(Ok(members)) = tokio::time::timeout(ask, self.intruder.members()).await {
            let names = self.member_names(&members);
            let at = self.ms();
            self.intrusion
                .lock()
                .unwrap()
                .intruder_views
                .push((at, names));
        }
    }

    /// Member names; one at the intruder's address counts as the intruder whatever it calls
    /// itself.
    fn member_names(&self, members: &[shoal_gossip::Member]) -> Vec<String> {
        members
            .iter()
            .map(|m| {
                if m.gossip_addr == self.intruder_addr {
                    INTRUDER.to_owned()
                } else {
                    m.name().to_owned()
                }
            })
            .collect()
    }
}

/// Plays the fault schedule against the lab and the agents.
struct FaultDriver<'a> {
    lab: &'a NetLab,
    agents: &'a mut Vec<AgentProcess>,
    /// The agent a [`Fault::PartitionAndJoin`] starts (host `agents.len()`), until it does.
    joiner: Option<crate::testkit::AgentSpec>,
    started: Instant,
    log: Vec<(u64, String)>,
    /// The fenced pods' heartbeat directory and the host's uptime when the run's clock
    /// started, to find a node that runs a fenced pod ([`Scenario::targets_fenced`]).
    heartbeats: PathBuf,
    start_uptime_ms: u64,
    targets_fenced: bool,
    /// The kubelet thread a [`Fault::KubeletStuck`] stopped, until it ends.
    stuck: Option<crate::testkit::ThreadStop>,
}

impl FaultDriver<'_> {
    fn note(&mut self, text: String) {
        let at = self.started.elapsed().as_millis() as u64;
        tracing_line(at, &text);
        self.log.push((at, text));
    }

    fn filters(&mut self, fault: &Fault) -> anyhow::Result<()> {
        let blocked = scenario::blocked_pairs(fault, self.agents.len());
        let loss = match fault {
            Fault::Loss { node, percent } => vec![(*node, *percent)],
            _ => Vec::new(),
        };
        self.lab.set_filters(&blocked, &loss)
    }

    async fn start(&mut self, fault: &Fault) -> anyhow::Result<()> {
        self.note(format!("start {}: {}", fault.name(), describe(fault)));
        match fault {
            Fault::Partition { .. }
            | Fault::OneWay { .. }
            | Fault::Bridge { .. }
            | Fault::Loss { .. }
            | Fault::Flap { .. } => self.filters(fault)?,
            Fault::Kill { node } => self.agents[*node].kill()?,
            Fault::Pause { node } => self.agents[*node].pause()?,
            Fault::KubeletStuck { node } => {
                let pid = self.agents[*node]
                    .pid()
                    .with_context(|| format!("n{node}'s agent is not running"))?;
                let tid = crate::testkit::thread_named(pid, "kubelet").with_context(|| {
                    format!("n{node}'s agent (pid {pid}) has no kubelet thread")
                })?;
                self.stuck = Some(crate::testkit::ThreadStop::new(tid)?);
                self.filters(fault)?;
            }
            // Sent by the workload (`poison_during_faults`), which holds the API clients.
            Fault::Poison { .. } => {}
            Fault::Restart { node } => {
                self.agents[*node].terminate()?;
                self.agents[*node].restart().await?;
            }
            Fault::Wipe { node } => {
                self.agents[*node].kill()?;
                wipe(self.agents[*node].data_dir())?;
                // The node's images went with its data dir; its fenced pods need busybox.
                crate::import_busybox(&self.agents[*node])?;
            }
            Fault::ClockSkew { node, offset_s } => {
                set_clock(self.agents[*node].data_dir(), *offset_s)?;
                self.await_clock(*node, 0, *offset_s).await?;
            }
            Fault::SlowDisk { node, delay_ms } => {
                set_slow_disk(self.agents[*node].data_dir(), *delay_ms)?;
            }
            Fault::DiskFull { node } => {
                let filled = fill(self.agents[*node].data_dir())?;
                self.note(format!(
                    "n{node}'s disk full ({} MiB written)",
                    filled >> 20
                ));
            }
            Fault::PartitionAndKill { node, .. } => {
                self.filters(fault)?;
                self.agents[*node].kill()?;
            }
            Fault::PartitionAndJoin { node, .. } => {
                self.filters(fault)?;
                // Later such faults find it running: then they only partition.
                if let Some(spec) = self.joiner.take() {
                    anyhow::ensure!(
                        self.agents.len() == *node,
                        "the joiner is host {node}, but {} agents run",
                        self.agents.len()
                    );
                    let agent = AgentProcess::start(spec).await?;
                    crate::import_busybox(&agent)?;
                    self.agents.push(agent);
                    self.note(format!("n{node} started, joining through its side's nodes"));
                }
            }
        }
        Ok(())
    }

    async fn end(&mut self, fault: &Fault) -> anyhow::Result<()> {
        match fault {
            Fault::Partition { .. }
            | Fault::OneWay { .. }
            | Fault::Bridge { .. }
            | Fault::Loss { .. }
            | Fault::Flap { .. } => self.lab.set_filters(&[], &[])?,
            Fault::Kill { node } | Fault::Wipe { node } => self.agents[*node].restart().await?,
            Fault::Pause { node } => self.agents[*node].resume()?,
            Fault::KubeletStuck { .. } => {
                self.lab.set_filters(&[], &[])?;
                self.stuck = None;
            }
            Fault::Restart { .. } | Fault::Poison { .. } => {}
            Fault::ClockSkew { node, offset_s } => {
                set_clock(self.agents[*node].data_dir(), 0)?;
                self.await_clock(*node, *offset_s, 0).await?;
            }
            Fault::SlowDisk { node, .. } => set_slow_disk(self.agents[*node].data_dir(), 0)?,
            Fault::DiskFull { node } => {
                let filler = self.agents[*node].data_dir().join(FILLER);
                std::fs::remove_file(&filler)
                    .with_context(|| format!("freeing n{node}'s disk: {}", filler.display()))?;
            }
            Fault::PartitionAndKill { node, .. } => {
                self.lab.set_filters(&[], &[])?;
                self.agents[*node].restart().await?;
            }
            Fault::PartitionAndJoin { .. } => self.lab.set_filters(&[], &[])?,
        }
        self.note(format!("end {}", fault.name()));
        Ok(())
    }

    /// Confirms that node `node`'s agent, whose clock moves from `from_s` to `to_s` seconds off,
    /// tells the time `to_s` off (±2 s: the Date header has whole seconds), read from its API's
    /// `Date` header, and notes it; a step that does not take is a harness error, not a quiet
    /// pass. Only a step from a right clock forward is checked: hyper renders each worker
    /// thread's Date header again only once the clock passes the second it last rendered, so
    /// after any step back (this fault's, or an earlier one's on the node) some threads keep
    /// answering with a later date until the clock catches up. Each probe is a new connection.
    async fn await_clock(&mut self, node: usize, from_s: i32, to_s: i32) -> anyhow::Result<()> {
        if from_s != 0 || to_s <= 0 {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = Vec::new();
        loop {
            let offset = clock_offset(&self.lab.host(node), self.lab.address(node));
            if let Some(offset) = offset
                && (offset - i64::from(to_s)).abs() <= 2
            {
                self.note(format!(
                    "n{node}'s API answers with a Date {offset:+} s off"
                ));
                return Ok(());
            }
            seen.push(offset);
            anyhow::ensure!(
                Instant::now() < deadline,
                "n{node}'s clock did not move to {to_s:+} s (its API's Date headers were {seen:?} s off)"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Points a node fault at a node that runs a fenced pod now, if the scenario wants that:
    /// one that runs a StatefulSet's pod if any does (an identity must move, never run
    /// twice), else the schedule's node if it runs a fenced pod, else the next that does.
    fn retarget(&mut self, fault: &mut Fault) -> anyhow::Result<()> {
        if !self.targets_fenced {
            return Ok(());
        }
        let (Fault::Pause { node } | Fault::KubeletStuck { node }) = fault else {
            return Ok(());
        };
        let now_ms = uptime_ms()?.saturating_sub(self.start_uptime_ms);
        let runs = fenced_runs(&self.heartbeats, self.start_uptime_ms)?;
        let n = self.agents.len();
        let running = |i: &usize| checker::running_on(&runs, self.agents[*i].name(), now_ms);
        let chosen = (0..n)
            .map(|k| (*node + k) % n)
            .find(|i| running(i).iter().any(|pod| pod.starts_with(STATEFUL)))
            .or_else(|| {
                (0..n)
                    .map(|k| (*node + k) % n)
                    .find(|i| !running(i).is_empty())
            });
        match chosen {
            Some(i) => {
                if i != *node {
                    self.note(format!(
                        "n{i} runs a fenced pod (n{} does not): the fault goes there",
                        *node
                    ));
                }
                *node = i;
            }
            // Checker 9 reports a fault that silenced no fenced pod.
            None => self.note("no node runs a fenced pod now".to_owned()),
        }
        Ok(())
    }

    async fn play(&mut self, steps: &mut [Step]) -> anyhow::Result<()> {
        for step in steps {
            sleep_until(self.started, step.start_ms).await;
            self.retarget(&mut step.fault)?;
            self.start(&step.fault).await?;
            if let Fault::Flap { node, period_ms } = &step.fault {
                // Cut at the start; then reconnected and cut again in turns until the end.
                let mut cut = true;
                let mut at = step.start_ms + period_ms;
                while at < step.end_ms {
                    sleep_until(self.started, at).await;
                    cut = !cut;
                    if cut {
                        self.filters(&step.fault)?;
                    } else {
                        self.lab.set_filters(&[], &[])?;
                    }
                    self.note(format!(
                        "n{node} {}",
                        if cut { "cut off" } else { "reconnected" }
                    ));
                    at += period_ms;
                }
            }
            sleep_until(self.started, step.end_ms).await;
            self.end(&step.fault).await?;
        }
        Ok(())
    }
}

fn tracing_line(at_ms: u64, text: &str) {
    eprintln!("[{:>7.1}s] {text}", at_ms as f64 / 1000.0);
}

fn describe(fault: &Fault) -> String {
    let names = |v: &[usize]| {
        v.iter()
            .map(|i| format!("n{i}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let sides = |groups: &[Vec<usize>]| {
        groups
            .iter()
            .map(|g| names(g))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    match fault {
        Fault::Partition { groups } => sides(groups),
        Fault::OneWay { from, to } => format!("{} -/-> {}", names(from), names(to)),
        Fault::Bridge {
            middle,
            left,
            right,
        } => {
            format!("{} <- n{middle} -> {}", names(left), names(right))
        }
        Fault::Loss { node, percent } => format!("{percent}% into n{node}"),
        Fault::Kill { node }
        | Fault::Pause { node }
        | Fault::KubeletStuck { node }
        | Fault::Restart { node }
        | Fault::Wipe { node }
        | Fault::DiskFull { node }
        | Fault::Poison { node } => {
            format!("n{node}")
        }
        Fault::ClockSkew { node, offset_s } => format!("n{node} {offset_s:+} s"),
        Fault::SlowDisk { node, delay_ms } => format!("n{node} +{delay_ms} ms per fsync"),
        Fault::Flap { node, period_ms } => format!("n{node} every {period_ms} ms"),
        Fault::PartitionAndJoin { groups, node } => format!("{}, n{node} joins", sides(groups)),
        Fault::PartitionAndKill { groups, node } => format!("{}, n{node} killed", sides(groups)),
    }
}

async fn sleep_until(started: Instant, at_ms: u64) {
    tokio::time::sleep_until((started + Duration::from_millis(at_ms)).into()).await;
}

/// Each node's data dir on its own tmpfs of [`DISK_SIZE`], for the scenarios that fill disks;
/// unmounted on drop, after the agents (whose drop removes their containers' mounts).
struct Disks(Vec<PathBuf>);

impl Disks {
    fn mount(root: &Path, nodes: usize) -> anyhow::Result<Self> {
        use nix::mount::{MsFlags, mount};
        let mut disks = Disks(Vec::new());
        for i in 0..nodes {
            let dir = root.join(format!("n{i}"));
            std::fs::create_dir_all(&dir)?;
            let options = format!("size={DISK_SIZE},mode=0700");
            mount(
                Some("shoal-chaos-disk"),
                &dir,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(options.as_str()),
            )
            .with_context(|| format!("mounting a tmpfs on {}", dir.display()))?;
            disks.0.push(dir);
        }
        Ok(disks)
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for dir in &self.0 {
            if let Err(error) = nix::mount::umount(dir) {
                eprintln!("unmounting {}: {error}; detaching it", dir.display());
                let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// The libfaketime offset file of node `i` (beside its data dir, as its log is).
fn clock_file(root: &Path, i: usize) -> PathBuf {
    root.join(format!("n{i}.faketime"))
}

/// Sets the wall clock of the agent whose data dir is `data_dir` `offset_s` seconds off (0:
/// right); libfaketime re-reads the file within a second.
fn set_clock(data_dir: &Path, offset_s: i32) -> anyhow::Result<()> {
    let mut name = data_dir.file_name().unwrap_or_default().to_owned();
    name.push(".faketime");
    let file = data_dir.with_file_name(name);
    std::fs::write(&file, format!("{offset_s:+}\n"))
        .with_context(|| format!("setting the clock in {}", file.display()))
}

/// The pods of `selector` as they wait: (node, reason, message) of each pod's first waiting
/// container, polled until every pod waits with a reason, at most 60 s.
async fn poison_pods(
    client: &crate::kube::KubeClient,
    selector: &str,
) -> Vec<(String, String, String)> {
    let path = format!("/api/v1/namespaces/default/pods?labelSelector={selector}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        if let Ok((200, body)) = client
            .send(hyper::Method::GET, &path, "application/json", None)
            .await
            && let Ok(list) = serde_json::from_slice::<Value>(&body)
        {
            seen = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|pod| {
                    let waiting = &pod["status"]["containerStatuses"][0]["state"]["waiting"];
                    (
                        pod["spec"]["nodeName"].as_str().unwrap_or("").to_owned(),
                        waiting["reason"].as_str().unwrap_or("").to_owned(),
                        waiting["message"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect();
        }
        let settled = !seen.is_empty() && seen.iter().all(|(_, reason, _)| !reason.is_empty());
        if settled || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The slow-disk library's delay file of the agent of `data_dir` (beside it, as its log is).
fn slow_disk_file(data_dir: &Path) -> PathBuf {
    let mut name = data_dir.file_name().unwrap_or_default().to_owned();
    name.push(".slowdisk");
    data_dir.with_file_name(name)
}

/// Makes every fsync of the agent of `data_dir` take `delay_ms` longer (0: no longer).
fn set_slow_disk(data_dir: &Path, delay_ms: u64) -> anyhow::Result<()> {
    let file = slow_disk_file(data_dir);
    std::fs::write(&file, format!("{delay_ms}\n"))
        .with_context(|| format!("setting the disk's delay in {}", file.display()))
}

/// Fills the filesystem of `data_dir` with one file until the kernel refuses more (ENOSPC);
/// returns the bytes written.
fn fill(data_dir: &Path) -> anyhow::Result<u64> {
    use std::io::Write;
    let path = data_dir.join(FILLER);
    let mut file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    for size in [chunk.len(), 4096, 1] {
        loop {
            match file.write(&chunk[..size]) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(e).with_context(|| format!("filling {}", path.display())),
            }
        }
    }
    Ok(written)
}

/// Empties an agent's data dir: the node lost its disk, so its containers go too (`shoal
/// reset` stops them and removes their mounts, cgroups and namespaces, which would also keep
/// the directory busy). Its log is beside the data dir, not in it.
fn wipe(data_dir: &Path) -> anyhow::Result<()> {
    let out = std::process::Command::new(crate::shoal_binary()?)
        .args(["reset", "--data-dir"])
        .arg(data_dir)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "shoal reset --data-dir {}: {}",
        data_dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    for entry in std::fs::read_dir(data_dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .with_context(|| format!("wiping {}", path.display()))?;
    }
    Ok(())
}

/// Runs one chaos run and checks it. Errors are failures of the harness (the lab could not be
/// built, an agent would not start); broken invariants are in the report.
pub async fn run(config: RunConfig) -> anyhow::Result<RunReport> {
    require_root()?;
    let mut steps = scenario::schedule(
        config.scenario,
        config.nodes,
        config.duration.as_millis() as u64,
        config.seed,
    );
    let pid = std::process::id();
    let prefix = format!("{PREFIX}{}", pid % 100_000);
    let root = tempfile::Builder::new().prefix(DATA_PREFIX).tempdir()?;
    let lab = NetLab::with_prefix(&prefix, pid % 250 + 1, config.nodes)?;
    let disks = if config.scenario.needs_disks() {
        Some(Disks::mount(root.path(), config.nodes)?)
    } else {
        None
    };
    let api = format!("0.0.0.0:{API_PORT}");
    let heartbeats = root.path().join("heartbeats");
    std::fs::create_dir_all(&heartbeats)?;
    let allow = heartbeats.to_string_lossy().into_owned();
    let clocks = config.scenario.needs_clocks();
    if clocks {
        anyhow::ensure!(
            Path::new(LIBFAKETIME).is_file(),
            "the clock-skew scenario needs {LIBFAKETIME} (apt-get install faketime)"
        );
        for i in 0..config.nodes {
            std::fs::write(clock_file(root.path(), i), "+0\n")?;
        }
    }
    let slow_disk = if config.scenario.slows_disks() {
        Some(crate::slow_disk_library()?)
    } else {
        None
    };
    let clock_env = |i: usize| -> Vec<(String, String)> {
        let mut env = Vec::new();
        let mut preload = Vec::new();
        if clocks {
            preload.push(LIBFAKETIME.to_owned());
            env.extend([
                (
                    "FAKETIME_TIMESTAMP_FILE",
                    clock_file(root.path(), i).to_string_lossy().into_owned(),
                ),
                // Re-read every second, so a fault moves the clock within a second.
                ("FAKETIME_CACHE_DURATION", "1".to_owned()),
                // Timers, timeouts and leases run on the monotonic clock, as on a host whose
                // wall clock is wrong.
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
            ]);
        }
        if let Some(library) = &slow_disk {
            preload.push(library.to_string_lossy().into_owned());
            // The agents' data dirs are `root/n<i>` (`crate::lab_agent_spec`).
            let file = slow_disk_file(&root.path().join(format!("n{i}")));
            env.push(("SHOAL_SLOW_DISK_FILE", file.to_string_lossy().into_owned()));
        }
        if !preload.is_empty() {
            env.push(("LD_PRELOAD", preload.join(" ")));
        }
        if config.sabotage {
            env.push((
                shoal_agent::fault_injection::ENV,
                shoal_agent::fault_injection::DROP_ACKNOWLEDGED_WRITES.to_owned(),
            ));
        }
        env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    };
    let binary = match &config.binary {
        Some(path) => path.clone(),
        None => crate::shoal_binary()?,
    };
    let mut flags = vec![
        "--api".to_owned(),
        api,
        "--fence-timeout".to_owned(),
        FENCE_TIMEOUT.to_owned(),
        "--host-path-allow".to_owned(),
        allow,
    ];
    if let Some(grace_ms) = config.scenario.dead_node_grace_ms {
        // The agents' config file, for what has no flag.
        let file = root.path().join("agent.toml");
        std::fs::write(
            &file,
            format!("[gossip]\ndead-node-grace-period = \"{grace_ms}ms\"\n"),
        )?;
        flags.push("--config".to_owned());
        flags.push(file.to_string_lossy().into_owned());
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // A scenario whose last host joins inside a fault starts without it.
    let joins_late = config.scenario.joins_late();
    let initial = config.nodes - usize::from(joins_late);
    let mut agents =
        crate::start_cluster_in(&binary, root.path(), &lab, initial, &flags, &clock_env).await?;
    let joiner = joins_late.then(|| {
        let seeds: Vec<usize> = (0..initial).collect();
        crate::lab_agent_spec(
            &binary,
            root.path(),
            &lab,
            initial,
            &flags,
            clock_env(initial),
            &seeds,
        )
    });
    for agent in &agents {
        crate::import_busybox(agent)?;
    }
    // Checker 6's agent: another cluster's secret, the same seeds, beside host 0's agent.
    let intruder_addr = std::net::SocketAddr::new(lab.address(0), 7601);
    let intruder_secret = if config.sabotage {
        root.path().join("secret")
    } else {
        let secret = root.path().join("intruder-secret");
        crate::testkit::init_secret(&binary, &secret)?;
        secret
    };
    let mut intruder_spec =
        crate::testkit::AgentSpec::new(&binary, root.path(), INTRUDER, &intruder_secret)
            .bind(intruder_addr)
            .netns(&lab.host(0));
    for agent in &agents {
        intruder_spec = intruder_spec.join(agent.gossip_addr());
    }
    let intruder = AgentProcess::start(intruder_spec).await?;
    // Checker 3's and 4's objects, before any fault.
    let fenced_pods: Vec<Value> = (0..FENCED_PODS)
        .map(|i| fenced_pod(&fenced_name(i), &fenced_name(i), true, &heartbeats))
        .collect();
    for object in [
        deployment(2),
        daemon_set(),
        heavy_deployment(),
        job(),
        stateful_set(&heartbeats),
    ]
    .iter()
    .chain(&fenced_pods)
    {
        // A 503 says no write quorum was reachable from that node at that moment (a loaded host
        // may suspect a peer for a moment): a client tries again, as the answer asks.
        let asked = Instant::now();
        loop {
            let (status, answer) = agents[0].apply(object).await?;
            if status == 503 && asked.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            anyhow::ensure!(
                status == 200 || status == 201,
                "creating the workload's {}: {status} {answer}",
                object["kind"]
            );
            break;
        }
    }
    // The faults start from a steady state: each fenced pod runs somewhere (its first
    // heartbeat is written), so the time to move one is measured from a known place. More
    // fenced pods are created inside the first fault (below).
    let steady = Instant::now();
    loop {
        // The same reading of the evidence as checker 4's: a run with a heartbeat.
        let running: std::collections::BTreeSet<String> = fenced_runs(&heartbeats, 0)?
            .into_iter()
            .filter(|run| run.beats > 0)
            .map(|run| run.pod)
            .collect();
        if steady_fenced_names().iter().all(|n| running.contains(n)) {
            break;
        }
        anyhow::ensure!(
            steady.elapsed() < Duration::from_secs(90),
            "the fenced pods did not all start within 90 s (running: {running:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = Instant::now();
    let start_uptime_ms = uptime_ms()?;
    // Checker 5 reads what each node granted from the kernel, all through the run.
    let mut cpu_nodes = Vec::new();
    for agent in &agents {
        let members = agent.members().await?;
        let capacity = members
            .iter()
            .find(|m| m.is_self)
            .and_then(|m| m.meta.as_ref())
            .map(|meta| meta.capacity.cpu_millis)
            .with_context(|| format!("{} does not publish its capacity", agent.name()))?;
        let data_dir = std::fs::canonicalize(agent.data_dir())?;
        let scope = shoal_agent::runtime::scope_of(&data_dir);
        cpu_nodes.push((
            agent.name().to_owned(),
            capacity,
            crate::cpu::scope_dir(shoal_agent::runtime::cgroup::Layout::detect(), &scope),
        ));
    }
    let stop_cpu = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let cpu_breach_dir = cpu_nodes[0].2.clone();
    let cpu = cpu_sampler(cpu_nodes, started, stop_cpu.0.clone());
    // The workload's operations go through each agent's Kubernetes API, as kubectl's would.
    let identity = shoal_gossip::ClusterIdentity::derive(&shoal_gossip::ClusterSecret::load_file(
        &root.path().join("secret"),
    )?)?;
    let kube = (0..agents.len())
        .map(|i| {
            let addr = std::net::SocketAddr::new(lab.address(i), API_PORT);
            crate::kube::KubeClient::new(&lab.host(i), addr, &identity)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let workload = Arc::new(Workload {
        clients: agents
            .iter()
            .map(|a| ControlClient::for_data_dir(a.data_dir()))
            .collect(),
        kube,
        keys: config.keys,
        blobs: config.scenario.needs_disks(),
        started,
        next_id: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        ops: Mutex::new(Vec::new()),
        reads: Mutex::new(Vec::new()),
        scales: Mutex::new((0, 0)),
        names: agents.iter().map(|a| a.name().to_owned()).collect(),
        intruder: ControlClient::for_data_dir(intruder.data_dir()),
        intruder_addr,
        intrusion: Mutex::new(Intrusion {
            intruder: INTRUDER.to_owned(),
            ..Intrusion::default()
        }),
    });
    let clients: Vec<_> = (0..config.clients)
        .map(|c| {
            tokio::spawn(
                workload
                    .clone()
                    .client_loop(config.seed ^ (c as u64 + 1) << 32),
            )
        })
        .collect();
    let scaler = tokio::spawn(workload.clone().scaler_loop(config.seed ^ 0x5ca1e));
    let sampler = tokio::spawn(workload.clone().membership_sampler());
    let reader = config
        .scenario
        .slows_disks()
        .then(|| tokio::spawn(workload.clone().reader_loop()));
    let poisoner = tokio::spawn(workload.clone().poison_during_faults(steps.clone()));
    let late_fenced = tokio::spawn(
        workload.clone().fenced_during_faults(
            steps.first().map_or(0, |s| s.start_ms) + 500,
            (0..FENCED_PODS)
                .map(|i| {
                    fenced_pod(
                        &late_fenced_name(i),
                        &late_fenced_name(i),
                        true,
                        &heartbeats,
                    )
                })
                .collect(),
        ),
    );
    let mut driver = FaultDriver {
        lab: &lab,
        agents: &mut agents,
        joiner,
        started,
        log: Vec::new(),
        heartbeats: heartbeats.clone(),
        start_uptime_ms,
        targets_fenced: config.scenario.targets_fenced,
        stuck: None,
    };
    let played = driver.play(&mut steps).await;
    let mut fault_log = std::mem::take(&mut driver.log);
    // The workload stops with the last heal, so the time the stores take to agree is the
    // time to repair what the faults did.
    workload.stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = client.await;
    }
    let _ = scaler.await;
    let _ = sampler.await;
    if let Some(reader) = reader {
        let _ = reader.await;
    }
    let mut poisoned = poisoner.await.unwrap_or_default();
    let late_fenced = late_fenced.await.unwrap_or_default();
    played?;
    if config.sabotage {
        // Recorded like any write: a fault-injection agent acknowledges it and drops it.
        let id = workload.next_id.fetch_add(1, Ordering::Relaxed);
        let request = Request::Write {
            key: DROPPED_KEY.to_owned(),
            value: format!("v{id}"),
        };
        let op = workload.perform(id, 0, request, Via::Post).await;
        workload.ops.lock().unwrap().push(op);
    }
    let quiet_ms = started.elapsed().as_millis() as u64;

    // Checker 2: the stores agree within the bound.
    let mut samples = Vec::new();
    let deadline = Instant::now() + config.converge_bound;
    loop {
        let mut sample = DigestSample {
            at_ms: started.elapsed().as_millis() as u64,
            digests: Vec::new(),
            unanswered: 0,
        };
        for agent in &agents {
            match agent.store_info().await {
                Ok(info) => sample.digests.push(info.digest),
                Err(_) => sample.unanswered += 1,
            }
        }
        let agree = sample.agree();
        samples.push(sample);
        if agree || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut violations = Vec::new();
    let mut checkers = Vec::new();
    let convergence =
        checker::convergence(&samples, quiet_ms, config.converge_bound.as_millis() as u64);
    let convergence_ms = convergence.as_ref().ok().copied();
    checkers.push((checker::CONVERGENCE, usize::from(convergence.is_err())));
    violations.extend(convergence.err());

    // Checker 7: reads of a node whose disk is slow never wait for it.
    if config.scenario.slows_disks() {
        let slow: Vec<checker::SlowDisk> = steps
            .iter()
            .filter_map(|step| match step.fault {
                Fault::SlowDisk { node, delay_ms } => Some(checker::SlowDisk {
                    node,
                    start_ms: step.start_ms,
                    end_ms: step.end_ms,
                    delay_ms,
                }),
                _ => None,
            })
            .collect();
        let reads = std::mem::take(&mut *workload.reads.lock().unwrap());
        let blocked = checker::reads_unblocked(&reads, &slow);
        checkers.push((checker::READS, blocked.len()));
        violations.extend(blocked);
    }

    // Checker 8: each hostile object refused by name, or its pods waiting with the cause.
    if config.scenario.poisons() {
        let selectors: Vec<Option<String>> = steps
            .iter()
            .enumerate()
            .filter(|(_, step)| matches!(step.fault, Fault::Poison { .. }))
            .flat_map(|(i, _)| poison::hostile_set(&i.to_string()))
            .map(|h| h.pods)
            .collect();
        for (outcome, selector) in poisoned.iter_mut().zip(&selectors) {
            if let (Some(selector), 200..=299) = (selector, outcome.status) {
                outcome.pods = poison_pods(&workload.kube[0], selector).await;
            }
        }
        let hostile = checker::hostile_objects(&poisoned);
        checkers.push((checker::HOSTILE, hostile.len()));
        violations.extend(hostile);
    }

    // Checker 1 over the final state as the agents hold it (all of them, once they agree).
    let ops = std::mem::take(&mut *workload.ops.lock().unwrap());
    let mut history = History { ops };
    history.ops.sort_by_key(|o| (o.invoked_ms, o.id));
    let keys: std::collections::BTreeSet<String> = (0..config.keys)
        .map(|k| format!("reg-{k}"))
        .chain(history.ops.iter().map(|o| o.request.key().to_owned()))
        .collect();
    let finals = final_state(&agents[0], &keys).await?;
    let acked = checker::acknowledged_writes(&history.ops, &finals);
    checkers.push((checker::ACKNOWLEDGED_WRITES, acked.len()));
    violations.extend(acked);

    let mut breach = None;
    if config.sabotage {
        let stray = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "chaos-app-stray", "namespace": "default", "labels": {"app": APP},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "name": "not-the-deployments", "uid": "00000000-0000-0000-0000-00000000dead",
                             "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "chaos.invalid/none:1"}]}});
        let (status, answer) = agents[0].apply(&stray).await?;
        anyhow::ensure!(status == 201, "sabotage: the stray pod: {status} {answer}");
        // An unfenced pod that writes the first fenced pod's heartbeats: two runs at once.
        let twin = fenced_pod("chaos-fenced-twin", &fenced_name(0), false, &heartbeats);
        let (status, answer) = agents[0].apply(&twin).await?;
        anyhow::ensure!(status == 201, "sabotage: the twin pod: {status} {answer}");
        // 4 cpus of shares granted on host 0, beside what its agent admitted.
        breach = Some(CpuBreach::start(&cpu_breach_dir)?);
    }
    // Checker 3: replica counts exact within the bound (controllers act after the stores agree).
    let mut replica_samples = Vec::new();
    let nodes: Vec<String> = agents.iter().map(|a| a.name().to_owned()).collect();
    let deadline = Instant::now() + config.converge_bound;
    loop {
        let sample = replica_sample(&agents[0], &nodes, started).await?;
        let exact = sample.problems().is_empty();
        replica_samples.push(sample);
        if exact || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let replicas = checker::replicas(
        &replica_samples,
        quiet_ms,
        config.converge_bound.as_millis() as u64,
    );
    let replicas_ms = replicas.as_ref().ok().copied();
    checkers.push((checker::REPLICAS, usize::from(replicas.is_err())));
    violations.extend(replicas.err());

    // Checker 4, from the fenced containers' own heartbeats (they have run all along; the
    // self-test's twin has run for the replica checker's wait at least).
    let names: Vec<String> = steady_fenced_names()
        .into_iter()
        .chain(late_fenced.iter().cloned())
        .collect();
    // Those created during the faults may still be waiting for their node's run lease: each
    // must leave a heartbeat (checker 4 says so if one never does).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let running: std::collections::BTreeSet<String> = fenced_runs(&heartbeats, 0)?
            .into_iter()
            .filter(|run| run.beats > 0)
            .map(|run| run.pod)
            .collect();
        if names.iter().all(|n| running.contains(n)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let fenced_runs = fenced_runs(&heartbeats, start_uptime_ms)?;
    let fence = checker::fenced(&names, &fenced_runs);
    checkers.push((checker::FENCED, fence.len()));
    violations.extend(fence);
    // Checker 9: what a fault silenced moved.
    if config.scenario.targets_fenced {
        let silenced: Vec<checker::Silenced> = steps
            .iter()
            .filter_map(|step| match step.fault {
                Fault::Pause { node } | Fault::KubeletStuck { node } => Some(checker::Silenced {
                    fault: step.fault.name(),
                    node: agents[node].name().to_owned(),
                    start_ms: step.start_ms,
                    end_ms: step.end_ms,
                }),
                _ => None,
            })
            .collect();
        let moved = checker::replaced(&fenced_runs, &silenced);
        checkers.push((checker::REPLACED, moved.len()));
        violations.extend(moved);
    }

    // Checker 5, over every sample of the run (the self-test's breach has been there for the
    // replica checker's wait; one more sample period makes sure it is read).
    tokio::time::sleep(CPU_SAMPLE_EVERY * 2).await;
    stop_cpu.0.store(true, Ordering::Relaxed);
    let cpu_samples = cpu
        .join()
        .map_err(|_| anyhow::anyhow!("the cpu sampler panicked"))?;
    drop(breach);
    let over = checker::overcommit(&cpu_samples);
    checkers.push((checker::OVERCOMMIT, over.len()));
    violations.extend(over);
    let overcommit_evidence = cpu_evidence(&cpu_samples);

    // Checker 6: the intruder stayed out, and the API wants a token. It has had the whole run
    // and the convergence to get in: one more look now.
    workload.sample_membership().await;
    let mut intrusion = std::mem::take(&mut *workload.intrusion.lock().unwrap());
    for k in 0..config.keys {
        let key = format!("reg-{k}");
        if intruder
            .object("configmaps", "default", &key)
            .await?
            .is_some()
        {
            intrusion.intruder_objects.push(format!("configmaps/{key}"));
        }
    }
    if intruder
        .object("deployments", "default", APP)
        .await?
        .is_some()
    {
        intrusion
            .intruder_objects
            .push(format!("deployments/{APP}"));
    }
    for (i, agent) in agents.iter().enumerate() {
        for (what, status) in unauthenticated_calls(&lab.host(i), lab.address(i)) {
            intrusion
                .unauthenticated
                .push((agent.name().to_owned(), what, status));
        }
    }
    if let Some(grace_ms) = config.scenario.dead_node_grace_ms {
        // The scenario is about what happens once members are forgotten: show that they were.
        let lab_names: Vec<String> = agents.iter().map(|a| a.name().to_owned()).collect();
        let mut forgot = std::collections::BTreeMap::new();
        for (agent, at, names) in &intrusion.views {
            let missing: Vec<&str> = lab_names
                .iter()
                .filter(|n| !names.contains(n))
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                forgot
                    .entry(agent.clone())
                    .or_insert_with(|| (*at, missing.join(",")));
            }
        }
        anyhow::ensure!(
            !forgot.is_empty(),
            "no agent ever forgot a member: the faults did not outlast the {grace_ms} ms dead-node grace period"
        );
        for (agent, (at, missing)) in forgot {
            fault_log.push((
                at,
                format!("{agent} first listed no {missing} (dead-node grace {grace_ms} ms)"),
            ));
        }
        fault_log.sort_by_key(|(at, _)| *at);
    }
    let secret = checker::secret(&intrusion);
    checkers.push((checker::SECRET, secret.len()));
    violations.extend(secret);
    let intrusion_evidence = format!(
        "{} membership samples of the agents and {} of the intruder; API calls without a valid token: {}",
        intrusion.views.len(),
        intrusion.intruder_views.len(),
        intrusion
            .unauthenticated
            .iter()
            .map(|(_, _, status)| status.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let scales = *workload.scales.lock().unwrap();

    // Checker 7: teardown leaves nothing, and no agent panicked.
    let logs: Vec<(String, String)> = agents
        .iter()
        .chain([&intruder])
        .map(|a| (a.name().to_owned(), a.log()))
        .collect();
    // A failed run keeps what a person needs to find out why: the agents' logs and the
    // workload's controller objects as the first agent that answers holds them.
    if (!violations.is_empty() || config.keep_evidence)
        && let Some(dir) = &config.report_dir
    {
        keep_evidence(dir, &agents, &logs).await;
    }
    drop(agents);
    drop(intruder);
    drop(disks);
    drop(lab);
    let leftovers = leftovers(&prefix, root.path());
    let teardown = checker::teardown(&leftovers, &logs);
    checkers.push((checker::TEARDOWN, teardown.len()));
    violations.extend(teardown);

    let report = RunReport {
        config,
        steps,
        fault_log,
        history,
        samples,
        quiet_ms,
        convergence_ms,
        violations,
        checkers,
        scales,
        replicas_ms,
        intrusion_evidence,
        fenced_runs,
        overcommit_evidence,
        hostile: poisoned,
    };
    if let Some(dir) = &report.config.report_dir {
        crate::report::write(&report, dir)?;
    }
    Ok(report)
}

/// Writes `logs` to `dir/logs/<agent>.log` and the workload's Deployments, ReplicaSets,
/// DaemonSets and Jobs to `dir/objects.json`. Best effort: evidence for a person, not a check.
async fn keep_evidence(dir: &Path, agents: &[AgentProcess], logs: &[(String, String)]) {
    let logs_dir = dir.join("logs");
    if let Err(e) = std::fs::create_dir_all(&logs_dir) {
        eprintln!(
            "shoal-chaos: cannot keep the agents' logs in {}: {e}",
            logs_dir.display()
        );
        return;
    }
    for (name, log) in logs {
        let _ = std::fs::write(logs_dir.join(format!("{name}.log")), log);
    }
    for agent in agents {
        let mut objects = serde_json::Map::new();
        for kind in ["deployments", "replicasets", "daemonsets", "jobs"] {
            let path = format!("/v1/objects/{kind}?namespace=default");
            if let Ok((200, list)) = agent.call(hyper::Method::GET, &path, None).await {
                objects.insert(kind.to_owned(), list["items"].clone());
            }
        }
        if !objects.is_empty() {
            objects.insert("read from".to_owned(), json!(agent.name()));
            let text = serde_json::to_string_pretty(&Value::Object(objects)).unwrap_or_default();
            let _ = std::fs::write(dir.join("objects.json"), text);
            return;
        }
    }
}

/// Checker 5's evidence in a line: the samples and each node's peak grant.
fn cpu_evidence(samples: &[checker::CpuSample]) -> String {
    let mut peaks: BTreeMap<&str, (u64, u64, usize)> = BTreeMap::new();
    for s in samples {
        let peak = peaks.entry(&s.node).or_insert((
            0,
            crate::cpu::shares_of_millis(s.allocatable_millis),
            0,
        ));
        peak.0 = peak.0.max(s.requested_shares());
        peak.2 = peak
            .2
            .max(s.granted.iter().filter(|g| g.shares > 2).count());
    }
    format!(
        "{} samples of the nodes' cgroups; most cpu shares granted (of the node's) and containers with a request: {}",
        samples.len(),
        peaks
            .iter()
            .map(|(node, (peak, of, n))| format!("{node} {peak}/{of} ({n})"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Every workload key's live state on `agent`.
async fn final_state(
    agent: &AgentProcess,
    keys: &std::collections::BTreeSet<String>,
) -> anyhow::Result<BTreeMap<String, Final>> {
    let mut finals = BTreeMap::new();
    for key in keys {
        if let Some(object) = agent.object("configmaps", "default", key).await? {
            finals.insert(
                key.clone(),
                Final {
                    uid: object["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    value: object["data"]["v"].as_str().unwrap_or_default().to_owned(),
                },
            );
        }
    }
    Ok(finals)
}

/// The Deployment's and the DaemonSet's pods as `agent`'s store holds them.
async fn replica_sample(
    agent: &AgentProcess,
    nodes: &[String],
    started: Instant,
) -> anyhow::Result<ReplicaSample> {
    let list = |kind: &'static str| async move {
        let path = format!("/v1/objects/{kind}?namespace=default");
        let (status, list) = agent.call(hyper::Method::GET, &path, None).await?;
        anyhow::ensure!(status == 200, "{path}: {status} {list}");
        Ok::<Vec<Value>, anyhow::Error>(list["items"].as_array().cloned().unwrap_or_default())
    };
    let uid = |o: &Value| o["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    let controller = |o: &Value| {
        o["metadata"]["ownerReferences"]
            .as_array()?
            .iter()
            .find(|r| r["controller"] == true)
            .and_then(|r| r["uid"].as_str())
            .map(str::to_owned)
    };
    let deployment = agent.object("deployments", "default", APP).await?;
    // The Job's counts as the API serves them: from the completions its owners recorded in the
    // Job object (durable, merged across partitions), not from pods, which are cleaned up.
    let job = agent.object("jobs", "default", JOB).await?.map(|job| {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let status = shoal_core::controllers::job::status(&job, &[], now_ms);
        JobSeen {
            completions: job["spec"]["completions"].as_u64().unwrap_or(1),
            succeeded: status["succeeded"].as_u64().unwrap_or(0),
            completed_indexes: status["completedIndexes"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            complete: status["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Complete" && c["status"] == "True")
            }),
        }
    });
    let daemon_set = agent.object("daemonsets", "default", DAEMON).await?;
    let deployment_uid = deployment.as_ref().map(uid);
    let replica_sets = list("replicasets")
        .await?
        .iter()
        .filter(|rs| deployment_uid.is_some() && controller(rs) == deployment_uid)
        .map(uid)
        .collect();
    let mut pods = Vec::new();
    let mut daemon_pods = Vec::new();
    for pod in list("pods").await? {
        if !pod["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let seen = PodSeen {
            name: pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            controller: controller(&pod),
            node: pod["spec"]["nodeName"].as_str().map(str::to_owned),
        };
        match pod["metadata"]["labels"]["app"].as_str() {
            Some(APP) => pods.push(seen),
            Some(DAEMON) => daemon_pods.push(seen),
            _ => {}
        }
    }
    Ok(ReplicaSample {
        at_ms: started.elapsed().as_millis() as u64,
        desired: deployment
            .as_ref()
            .and_then(|d| d["spec"]["replicas"].as_u64()),
        replica_sets,
        pods,
        daemon_set: daemon_set.as_ref().map(uid),
        nodes: nodes.to_vec(),
        daemon_pods,
        job,
    })
}

/// Calls host `host`'s API without a token and with a wrong one, from inside its namespace (the
/// lab has no route in from outside): each request and the status it got (0: no answer).
fn unauthenticated_calls(host: &str, address: std::net::IpAddr) -> Vec<(String, u16)> {
    let url = format!("https://{address}:{API_PORT}/api/v1/namespaces/default/configmaps");
    let wrong = "Authorization: Bearer not-the-cluster-token";
    let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"intruded"}}"#;
    let calls: [(&str, Vec<&str>); 3] = [
        ("GET configmaps without a token", vec![]),
        ("GET configmaps with a wrong token", vec!["-H", wrong]),
        (
            "POST a configmap with a wrong token",
            vec![
                "-H",
                wrong,
                "-H",
                "Content-Type: application/json",
                "-d",
                body,
            ],
        ),
    ];
    calls
        .into_iter()
        .map(|(what, args)| {
            let status = std::process::Command::new("ip")
                .args(["netns", "exec", host, "curl", "-sk", "-m", "10"])
                .args(["-o", "/dev/null", "-w", "%{http_code}"])
                .args(&args)
                .arg(&url)
                .output()
                .ok()
                .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
                .unwrap_or(0);
            (what.to_owned(), status)
        })
        .collect()
}

/// How far (in whole seconds) the clock of the agent at `address` in namespace `host` is from
/// this process's, by the `Date` header of its API's answer (any answer: no token needed).
fn clock_offset(host: &str, address: std::net::IpAddr) -> Option<i64> {
    let url = format!("https://{address}:{API_PORT}/version");
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            host,
            "curl",
            "-sk",
            "-m",
            "3",
            "-o",
            "/dev/null",
            "-D",
            "-",
        ])
        .arg(&url)
        .output()
        .ok()?;
    let now = std::time::SystemTime::now();
    let headers = String::from_utf8_lossy(&out.stdout).into_owned();
    let date = headers.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("date")
            .then(|| value.trim().to_owned())
    })?;
    let told = httpdate::parse_http_date(&date).ok()?;
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    Some((secs(told) - secs(now)).round() as i64)
}

/// What is left of a lab named `prefix` with data under `root`: namespaces, processes, mounts.
pub fn leftovers(prefix: &str, root: &Path) -> Leftovers {
    let root_text = root.to_string_lossy().into_owned();
    let mut processes = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&root_text) {
                processes.push(format!(
                    "{} {}",
                    entry.file_name().to_string_lossy(),
                    cmdline.trim()
                ));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&root_text))
        .map(str::to_owned)
        .collect();
    Leftovers {
        processes,
        namespaces: lab::namespaces_with_prefix(&format!("{prefix}-")),
        mounts,
    }
}

/// Removes what killed runs left: agents running from `/tmp/shoal-chaos-*`, namespaces named
/// `shc*-h*` / `shc*-hub`, mounts below the data directories (nodes' disks), and the data
/// directories. Returns what it removed.
pub fn clean() -> anyhow::Result<Vec<String>> {
    require_root()?;
    let mut removed = Vec::new();
    let tmp = std::env::temp_dir();
    let marker = tmp.join(DATA_PREFIX).to_string_lossy().into_owned();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&marker) && pid != std::process::id() as i32 {
                let pid = nix::unistd::Pid::from_raw(pid);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
                removed.push(format!("process {pid}: {}", cmdline.trim()));
            }
        }
    }
    let namespaces: Vec<String> = lab::namespaces_with_prefix(PREFIX)
        .into_iter()
        .filter(|n| n.contains("-h"))
        .collect();
    let failed = lab::delete_namespaces(&namespaces);
    removed.extend(namespaces.iter().map(|n| format!("network namespace {n}")));
    anyhow::ensure!(failed.is_empty(), "could not delete: {}", failed.join("; "));
    // Mounts left under the data directories (a node's disk, a container's rootfs), deepest
    // first.
    let mut mount_points: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|point| point.starts_with(&marker))
        .collect();
    mount_points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in mount_points {
        if nix::mount::umount2(point.as_str(), nix::mount::MntFlags::MNT_DETACH).is_ok() {
            removed.push(format!("mount {point}"));
        }
    }
    for entry in std::fs::read_dir(&tmp)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with(DATA_PREFIX) {
            std::fs::remove_dir_all(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
            removed.push(format!("directory {}", entry.path().display()));
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_like_jepsen_outcomes() {
        let ok = Ok((201, json!({"metadata": {"uid": "u1"}})));
        assert_eq!(
            classify(&ok, false),
            (Outcome::Ok, Some("u1".into()), "201".into())
        );
        let not_durable = Ok((503, json!({"reason": "NotDurable"})));
        assert_eq!(classify(&not_durable, false).0, Outcome::Unknown);
        let unavailable = Ok((503, json!({"reason": "Unavailable"})));
        assert_eq!(classify(&unavailable, false).0, Outcome::Fail);
        // The Kubernetes API's Status says which in its cause.
        let status = |cause: &str| {
            Ok((
                503,
                json!({"kind": "Status", "reason": "ServiceUnavailable",
                       "details": {"causes": [{"reason": cause}]}}),
            ))
        };
        assert_eq!(classify(&status("Unavailable"), false).0, Outcome::Fail);
        assert_eq!(classify(&status("NotDurable"), false).0, Outcome::Unknown);
        let not_found = Ok((404, json!({"reason": "NotFound"})));
        assert_eq!(classify(&not_found, false).0, Outcome::Fail);
        assert_eq!(classify(&Err("refused".into()), true).0, Outcome::Fail);
        assert_eq!(classify(&Err("reset".into()), false).0, Outcome::Unknown);
    }
}

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

use anyhow::Context;
use serde_json::{Value, json};
use shoal_agent::client::{ClientError, ControlClient};
use shoal_agent::testkit::AgentProcess;

use crate::checker::{self, DigestSample, Final, Leftovers, Violation};
use crate::history::{History, Op, Outcome, Request};
use crate::lab::{self, NetLab};
use crate::scenario::{self, Fault, Scenario, Step};

/// Names of everything a chaos run makes start with this (namespaces `shc<pid>-h<i>`, the data
/// directory `/tmp/shoal-chaos-*`), so `shoal-chaos clean` finds what a killed run left.
pub const PREFIX: &str = "shc";
pub const DATA_PREFIX: &str = "shoal-chaos-";

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
}

impl RunConfig {
    pub fn new(scenario: &'static Scenario, nodes: usize, duration: Duration, seed: u64) -> Self {
        Self {
            nodes,
            duration,
            seed,
            scenario,
            report_dir: None,
            converge_bound: Duration::from_secs(60),
            clients: 4,
            keys: 8,
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
    for tool in ["ip", "nft"] {
        let found = std::process::Command::new(tool)
            .arg("-V")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok();
        anyhow::ensure!(
            found,
            "shoal-chaos needs `{tool}` (apt-get install iproute2 nftables)"
        );
    }
    Ok(())
}

/// The register object a workload key names.
fn register(key: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": key, "namespace": "default", "labels": {"shoal-chaos": "register"}},
           "data": {"v": value}})
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
        // Too few nodes reachable: refused before anything was stored.
        Ok((503, body)) if body["reason"] == "Unavailable" => {
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

struct Workload {
    clients: Vec<ControlClient>,
    keys: usize,
    started: Instant,
    next_id: AtomicU64,
    stop: AtomicBool,
    ops: Mutex<Vec<Op>>,
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
            let request = if rng.random_range(0..100) < 85 {
                Request::Write {
                    key,
                    value: format!("v{id}"),
                }
            } else {
                Request::Delete { key }
            };
            let invoked_ms = self.ms();
            let client = &self.clients[node];
            let call = async {
                match &request {
                    Request::Write { key, value } => {
                        let body = serde_json::to_vec(&register(key, value)).expect("json");
                        client
                            .send(hyper::Method::PUT, "/v1/objects", Some(body))
                            .await
                    }
                    Request::Delete { key } => {
                        let path = format!("/v1/objects/configmaps/{key}?namespace=default");
                        client.send(hyper::Method::DELETE, &path, None).await
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
                    Ok(Err(e @ ClientError::Connect { .. })) => (Err(e.to_string()), true),
                    Ok(Err(e)) => (Err(e.to_string()), false),
                    Err(_) => (Err("no answer within 10 s".into()), false),
                };
            let (outcome, uid, detail) = classify(&answer, connect_failed);
            self.ops.lock().unwrap().push(Op {
                id,
                node,
                request,
                invoked_ms,
                completed_ms: self.ms(),
                outcome,
                uid,
                created: detail == "201",
                detail,
            });
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..150))).await;
        }
    }
}

/// Plays the fault schedule against the lab and the agents.
struct FaultDriver<'a> {
    lab: &'a NetLab,
    agents: &'a mut [AgentProcess],
    started: Instant,
    log: Vec<(u64, String)>,
}

impl FaultDriver<'_> {
    fn note(&mut self, text: String) {
        let at = self.started.elapsed().as_millis() as u64;
        tracing_line(at, &text);
        self.log.push((at, text));
    }

    fn filters(&mut self, fault: &Fault) -> anyhow::Result<()> {
        let blocked = scenario::blocked_pairs(fault);
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
            | Fault::Loss { .. } => self.filters(fault)?,
            Fault::Kill { node } => self.agents[*node].kill()?,
            Fault::Pause { node } => self.agents[*node].pause()?,
            Fault::Restart { node } => {
                self.agents[*node].terminate()?;
                self.agents[*node].restart().await?;
            }
            Fault::Wipe { node } => {
                self.agents[*node].kill()?;
                wipe(self.agents[*node].data_dir())?;
            }
            Fault::PartitionAndKill { node, .. } => {
                self.filters(fault)?;
                self.agents[*node].kill()?;
            }
        }
        Ok(())
    }

    async fn end(&mut self, fault: &Fault) -> anyhow::Result<()> {
        match fault {
            Fault::Partition { .. }
            | Fault::OneWay { .. }
            | Fault::Bridge { .. }
            | Fault::Loss { .. } => self.lab.set_filters(&[], &[])?,
            Fault::Kill { node } | Fault::Wipe { node } => self.agents[*node].restart().await?,
            Fault::Pause { node } => self.agents[*node].resume()?,
            Fault::Restart { .. } => {}
            Fault::PartitionAndKill { node, .. } => {
                self.lab.set_filters(&[], &[])?;
                self.agents[*node].restart().await?;
            }
        }
        self.note(format!("end {}", fault.name()));
        Ok(())
    }

    async fn play(&mut self, steps: &[Step]) -> anyhow::Result<()> {
        for step in steps {
            sleep_until(self.started, step.start_ms).await;
            self.start(&step.fault).await?;
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
    match fault {
        Fault::Partition { groups } => groups
            .iter()
            .map(|g| names(g))
            .collect::<Vec<_>>()
            .join(" | "),
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
        | Fault::Restart { node }
        | Fault::Wipe { node } => {
            format!("n{node}")
        }
        Fault::PartitionAndKill { groups, node } => format!(
            "{}, n{node} killed",
            groups
                .iter()
                .map(|g| names(g))
                .collect::<Vec<_>>()
                .join(" | ")
        ),
    }
}

async fn sleep_until(started: Instant, at_ms: u64) {
    tokio::time::sleep_until((started + Duration::from_millis(at_ms)).into()).await;
}

/// Empties an agent's data dir, keeping its log (read by the panic checker).
fn wipe(data_dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(data_dir)? {
        let entry = entry?;
        if entry.file_name() == "agent.log" {
            continue;
        }
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
    let steps = scenario::schedule(
        config.scenario,
        config.nodes,
        config.duration.as_millis() as u64,
        config.seed,
    );
    let pid = std::process::id();
    let prefix = format!("{PREFIX}{}", pid % 100_000);
    let root = tempfile::Builder::new().prefix(DATA_PREFIX).tempdir()?;
    let lab = NetLab::with_prefix(&prefix, pid % 250 + 1, config.nodes)?;
    let mut agents = crate::start_cluster_in(root.path(), &lab, config.nodes, &[]).await?;
    let started = Instant::now();
    let workload = Arc::new(Workload {
        clients: agents
            .iter()
            .map(|a| ControlClient::for_data_dir(a.data_dir()))
            .collect(),
        keys: config.keys,
        started,
        next_id: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        ops: Mutex::new(Vec::new()),
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
    let mut driver = FaultDriver {
        lab: &lab,
        agents: &mut agents,
        started,
        log: Vec::new(),
    };
    let played = driver.play(&steps).await;
    let fault_log = std::mem::take(&mut driver.log);
    // The workload stops with the last heal, so the time the stores take to agree is the
    // time to repair what the faults did.
    workload.stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = client.await;
    }
    played?;
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

    // Checker 1 over the final state as the agents hold it (all of them, once they agree).
    let ops = std::mem::take(&mut *workload.ops.lock().unwrap());
    let mut history = History { ops };
    history.ops.sort_by_key(|o| (o.invoked_ms, o.id));
    let finals = final_state(&agents[0], config.keys).await?;
    let acked = checker::acknowledged_writes(&history.ops, &finals);
    checkers.push((checker::ACKNOWLEDGED_WRITES, acked.len()));
    violations.extend(acked);

    // Checker 7: teardown leaves nothing, and no agent panicked.
    let logs: Vec<(String, String)> = agents
        .iter()
        .map(|a| (a.name().to_owned(), a.log()))
        .collect();
    drop(agents);
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
    };
    if let Some(dir) = &report.config.report_dir {
        crate::report::write(&report, dir)?;
    }
    Ok(report)
}

/// Every workload key's live state on `agent`.
async fn final_state(agent: &AgentProcess, keys: usize) -> anyhow::Result<BTreeMap<String, Final>> {
    let mut finals = BTreeMap::new();
    for k in 0..keys {
        let key = format!("reg-{k}");
        if let Some(object) = agent.object("configmaps", "default", &key).await? {
            finals.insert(
                key,
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
/// `shc*-h*` / `shc*-hub`, and the data directories. Returns what it removed.
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
        let not_found = Ok((404, json!({"reason": "NotFound"})));
        assert_eq!(classify(&not_found, false).0, Outcome::Fail);
        assert_eq!(classify(&Err("refused".into()), true).0, Outcome::Fail);
        assert_eq!(classify(&Err("reset".into()), false).0, Outcome::Unknown);
    }
}

//! Real `shoal` agent processes for integration tests, chaos tests and benchmarks: started on
//! loopback in their own data dirs, killed, stopped and restarted for real, queried through the
//! same control socket the CLI uses. Killed on drop, so a failing test leaks no process.

use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use shoal_gossip::{Member, MemberState};

use shoal_agent::client::ControlClient;

/// How to start one agent.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    pub binary: PathBuf,
    pub name: String,
    pub data_dir: PathBuf,
    pub secret_file: PathBuf,
    /// Gossip bind address; port 0 picks one (kept across restarts).
    pub bind: SocketAddr,
    pub join: Vec<SocketAddr>,
    pub extra_args: Vec<String>,
    /// Run inside this network namespace (joined before exec), for the chaos lab.
    pub netns: Option<String>,
    /// Extra environment (the chaos lab's libfaketime, for clock faults).
    pub env: Vec<(String, String)>,
}

impl AgentSpec {
    pub fn new(binary: &Path, root: &Path, name: &str, secret_file: &Path) -> Self {
        Self {
            binary: binary.to_owned(),
            name: name.to_owned(),
            data_dir: root.join(name),
            secret_file: secret_file.to_owned(),
            bind: "127.0.0.1:0".parse().expect("literal address"),
            join: Vec::new(),
            extra_args: Vec::new(),
            netns: None,
            env: Vec::new(),
        }
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Binds the gossip endpoint to `bind` (e.g. a lab host's address).
    pub fn bind(mut self, bind: SocketAddr) -> Self {
        self.bind = bind;
        self
    }

    /// Runs the agent inside network namespace `netns`.
    pub fn netns(mut self, netns: &str) -> Self {
        self.netns = Some(netns.to_owned());
        self
    }

    pub fn join(mut self, seed: SocketAddr) -> Self {
        self.join.push(seed);
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }
}

/// A running (or killed) agent process.
pub struct AgentProcess {
    spec: AgentSpec,
    child: Option<Child>,
    client: ControlClient,
    gossip_addr: Option<SocketAddr>,
    generation: u64,
}

/// Creates a cluster secret with the real CLI.
pub fn init_secret(binary: &Path, path: &Path) -> anyhow::Result<()> {
    let status = Command::new(binary)
        .args(["init", "--secret-file"])
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("running {} init", binary.display()))?;
    if !status.success() {
        bail!("shoal init failed: {status}");
    }
    Ok(())
}

impl AgentProcess {
    /// Starts the agent and waits until its control socket answers.
    pub async fn start(spec: AgentSpec) -> anyhow::Result<Self> {
        let client = ControlClient::for_data_dir(&spec.data_dir);
        let mut agent = Self {
            spec,
            child: None,
            client,
            gossip_addr: None,
            generation: 0,
        };
        agent.spawn().await?;
        Ok(agent)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.spec.data_dir)?;
        let log_path = self.log_path();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let bind = self.gossip_addr.unwrap_or(self.spec.bind);
        let mut cmd = Command::new(&self.spec.binary);
        cmd.envs(self.spec.env.iter().map(|(k, v)| (k, v)));
        if let Some(ns) = &self.spec.netns {
            // Join only the network namespace (`ip netns exec` would also give the agent a
            // fresh /sys without the cgroup mounts its containers need).
            use std::os::unix::process::CommandExt;
            let netns = std::fs::File::open(format!("/run/netns/{ns}"))
                .with_context(|| format!("network namespace {ns}"))?;
            // SAFETY: the closure runs between fork and exec and only calls setns, which is
            // async-signal-safe; the descriptor stays open (moved into the closure) until the
            // exec.
            unsafe {
                cmd.pre_exec(move || {
                    nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)
                });
            }
        }
        cmd.arg("agent")
            .args(["--name", &self.spec.name])
            .arg("--data-dir")
            .arg(&self.spec.data_dir)
            .arg("--secret-file")
            .arg(&self.spec.secret_file)
            .args(["--bind", &bind.to_string()]);
        for seed in &self.spec.join {
            cmd.args(["--join", &seed.to_string()]);
        }
        // Defaults of test agents, unless a test sets them: pods have only loopback (a test
        // that asks for a pod network runs its agents in namespaces of its own, where bridges
        // and routes stay), and images are pulled only from registries the tests start on
        // loopback (no test reaches out to a public registry: `image: busybox` in a test is
        // never pulled).
        for (flag, value) in [("--pod-network", "none"), ("--registry-pulls", "local")] {
            if !self.spec.extra_args.iter().any(|a| a.starts_with(flag)) {
                cmd.args([flag, value]);
            }
        }
        cmd.args(&self.spec.extra_args)
            .env(
                "RUST_LOG",
                std::env::var("SHOAL_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.spec.binary.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "agent {} exited with {status} while starting; log:\n{}",
                    self.spec.name,
                    self.log()
                );
            }
            match self.client.self_info().await {
                Ok(info) if Some(info.pid) == self.pid() => {
                    self.gossip_addr = Some(info.gossip_addr);
                    self.generation = info.generation;
                    return Ok(());
                }
                _ if Instant::now() > deadline => {
                    bail!(
                        "agent {} did not answer in 15 s; log:\n{}",
                        self.spec.name,
                        self.log()
                    )
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn data_dir(&self) -> &Path {
        &self.spec.data_dir
    }

    pub fn secret_file(&self) -> &Path {
        &self.spec.secret_file
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The gossip address this agent advertises (known once started).
    pub fn gossip_addr(&self) -> SocketAddr {
        self.gossip_addr.expect("the agent was started")
    }

    /// Generation the running process reported at start.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn client(&self) -> &ControlClient {
        &self.client
    }

    pub async fn members(&self) -> anyhow::Result<Vec<Member>> {
        Ok(self.client.members().await?)
    }

    /// Applies (creates or updates) an object; returns the HTTP status and the answer.
    pub async fn apply(
        &self,
        object: &serde_json::Value,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        self.call(
            hyper::Method::PUT,
            "/v1/objects",
            Some(serde_json::to_vec(object)?),
        )
        .await
    }

    /// A request to the control API; returns the HTTP status and the JSON answer.
    pub async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        let (status, bytes) = self.client.send(method, path, body).await?;
        let value = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{path}: answer is not JSON: {}",
                String::from_utf8_lossy(&bytes)
            )
        })?;
        Ok((status, value))
    }

    /// An object by kind (any name the CLI accepts), namespace and name, if this agent has it.
    pub async fn object(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<Option<serde_json::Value>> {
        let path = format!("/v1/objects/{kind}/{name}?namespace={namespace}");
        let (status, value) = self.call(hyper::Method::GET, &path, None).await?;
        match status {
            200 => Ok(Some(value)),
            404 => Ok(None),
            other => bail!("{path}: {other} {value}"),
        }
    }

    /// The local store's digest and counters.
    pub async fn store_info(&self) -> anyhow::Result<shoal_agent::control::StoreInfo> {
        Ok(self.client.store_info().await?)
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> anyhow::Result<()> {
        let pid = self.pid().context("agent is not running")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)
            .with_context(|| format!("kill({pid}, {signal})"))
    }

    /// `shoal reset` on this agent's data dir (the agent must be stopped): stops and removes
    /// every container and pod sandbox it left.
    pub fn reset_node(&self) -> anyhow::Result<()> {
        let mut command = Command::new(&self.spec.binary);
        command
            .arg("reset")
            .arg("--data-dir")
            .arg(&self.spec.data_dir);
        let output = command.stdin(Stdio::null()).output()?;
        if !output.status.success() {
            bail!(
                "shoal reset: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }

    /// `kill -9` and reap.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, then wait up to 10 s for a clean exit (SIGKILL after that).
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        self.signal(nix::sys::signal::Signal::SIGTERM)?;
        let mut child = self.child.take().context("agent is not running")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                child.kill()?;
                bail!("agent {} ignored SIGTERM for 10 s", self.spec.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGSTOP: a silent failure, sockets stay open.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// SIGCONT.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal(nix::sys::signal::Signal::SIGCONT)
    }

    /// Starts the agent again with the same data dir and gossip address.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("agent {} is still running", self.spec.name);
        }
        self.spawn().await
    }

    /// Resident set size from /proc, in bytes.
    pub fn rss_bytes(&self) -> Option<u64> {
        rss_bytes_of(self.pid()?)
    }

    /// `<data dir>.log`, beside the data dir rather than in it: a test that fills or wipes the
    /// node's disk keeps its log (as a node's journal is not on its data disk).
    fn log_path(&self) -> PathBuf {
        let mut name = self
            .spec
            .data_dir
            .file_name()
            .unwrap_or_default()
            .to_owned();
        name.push(".log");
        self.spec.data_dir.with_file_name(name)
    }

    /// The agent's log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process must be continued to die promptly on some kernels' accounting.
            let _ = child.kill();
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
            let _ = child.wait();
        }
        // Containers outlive their agent by design (the shim supervises them): a test's
        // agent takes its pods with it.
        if shoal_agent::paths::pods(&self.spec.data_dir).exists() {
            let _ = self.reset_node();
        }
    }
}

/// `n` agents named `n0`… under `root` with a new cluster secret, each joining the first,
/// every one seeing all `n` alive. `configure` gets each agent's spec (and its index) before it
/// starts: extra flags, or work in its data dir.
pub async fn start_cluster(
    root: &Path,
    n: usize,
    configure: impl Fn(AgentSpec, usize) -> anyhow::Result<AgentSpec>,
) -> anyhow::Result<Vec<AgentProcess>> {
    let binary = crate::shoal_binary()?;
    std::fs::create_dir_all(root)?;
    let secret = root.join("secret");
    init_secret(&binary, &secret)?;
    let mut agents: Vec<AgentProcess> = Vec::new();
    for i in 0..n {
        let mut spec = AgentSpec::new(&binary, root, &format!("n{i}"), &secret);
        if let Some(seed) = agents.first() {
            spec = spec.join(seed.gossip_addr());
        }
        agents.push(AgentProcess::start(configure(spec, i)?).await?);
    }
    for a in &agents {
        wait_until("all alive", Duration::from_secs(60), || async {
            alive_count(a).await == n
        })
        .await?;
    }
    Ok(agents)
}

/// VmRSS of a process, in bytes.
pub fn rss_bytes_of(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Polls `check` every 20 ms until it holds; returns how long that took, or an error naming
/// `what` after `timeout`.
pub async fn wait_until<F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every agent's desired-state store has the same root digest.
pub async fn wait_for_identical_digests(
    agents: &[&AgentProcess],
    timeout: Duration,
) -> anyhow::Result<Duration> {
    wait_until("identical store digests", timeout, || async {
        let mut digests = Vec::new();
        for agent in agents {
            match agent.store_info().await {
                Ok(info) => digests.push(info.digest),
                Err(_) => return false,
            }
        }
        digests.windows(2).all(|w| w[0] == w[1])
    })
    .await
}

/// The state in which `observer` sees the node named `name`, if it knows it.
pub async fn state_of(observer: &AgentProcess, name: &str) -> Option<(MemberState, u64)> {
    let members = observer.members().await.ok()?;
    members
        .iter()
        .find(|m| m.name() == name)
        .map(|m| (m.state, m.generation))
}

/// Number of members `observer` sees alive.
pub async fn alive_count(observer: &AgentProcess) -> usize {
    observer
        .members()
        .await
        .map(|ms| ms.iter().filter(|m| m.state == MemberState::Alive).count())
        .unwrap_or(0)
}

/// Stops one thread of another process with ptrace (`PTRACE_SEIZE` + `PTRACE_INTERRUPT`: only
/// that thread stops, the rest of the process runs on) until dropped: a stuck thread, as a
/// blocking call that never returns would leave it. The tracer is a thread of its own, as
/// ptrace binds a tracee to the thread that attached it.
pub struct ThreadStop {
    resume: Option<std::sync::mpsc::Sender<()>>,
    tracer: Option<std::thread::JoinHandle<()>>,
}

impl ThreadStop {
    /// Stops thread `tid`; returns once it is stopped.
    pub fn new(tid: i32) -> anyhow::Result<Self> {
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
        let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
        let tracer = std::thread::spawn(move || {
            // SAFETY: plain ptrace requests on a thread id; the pointers passed are null or a
            // local status integer.
            unsafe {
                let seized = libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) == 0
                    && libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) == 0;
                let mut status = 0;
                let stopped = seized && libc::waitpid(tid, &mut status, libc::__WALL) == tid;
                let error = std::io::Error::last_os_error();
                let _ = stopped_tx.send(stopped.then_some(()).ok_or(error));
                let _ = resume_rx.recv();
                if seized {
                    libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0);
                }
            }
        });
        let stop = Self {
            resume: Some(resume_tx),
            tracer: Some(tracer),
        };
        match stopped_rx.recv() {
            Ok(Ok(())) => Ok(stop),
            Ok(Err(error)) => Err(anyhow::anyhow!("could not stop thread {tid}: {error}")),
            Err(_) => Err(anyhow::anyhow!("the tracer of thread {tid} ended")),
        }
    }
}

impl Drop for ThreadStop {
    fn drop(&mut self) {
        drop(self.resume.take());
        if let Some(t) = self.tracer.take() {
            let _ = t.join();
        }
    }
}

/// The id of `pid`'s thread named `name`.
pub fn thread_named(pid: u32, name: &str) -> Option<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(Result::ok)
        .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))?
        .file_name()
        .to_str()?
        .parse()
        .ok()
}

/// Whether `program` names an executable file, directly or found on `PATH` (benchmarks skip
/// a peer that is not installed in `--smoke` runs).
pub fn on_path(program: &Path) -> bool {
    if program.components().count() > 1 {
        return program.is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

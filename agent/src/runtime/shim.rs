//! `shoal shim`: the per-container supervisor, one small single-threaded process per running
//! container (like containerd's shim or conmon). It lets the agent restart without touching
//! its containers:
//!
//! 1. it becomes a child subreaper, so the container's first process (started by
//!    `runc run --detach`, whose own process exits) is re-parented to it and it can collect its exit
//!    status;
//! 2. it runs `runc run --detach` with the container's stdout and stderr on pipes it
//!    reads, writing them to the log file in the CRI format (`<RFC 3339 time> stdout F line`),
//!    rotating it at a size bound;
//! 3. it writes `started.json` once the process runs and `exit.json` when it ends (or when
//!    runc failed to start it, with runc's error), atomically, then exits.
//!
//! The agent learns everything from those files, so it can die and come back at any time.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

/// What the agent passes to `shoal shim`.
#[derive(Debug, Clone, clap::Args)]
pub struct ShimArgs {
    /// The runc binary.
    #[arg(long)]
    pub runc: PathBuf,
    /// runc's state root.
    #[arg(long)]
    pub root: PathBuf,
    #[arg(long)]
    pub id: String,
    /// The bundle (config.json and rootfs); state files are written here too.
    #[arg(long)]
    pub bundle: PathBuf,
    /// The container log file.
    #[arg(long)]
    pub log: PathBuf,
    /// Rotate the log when it reaches this many bytes (one rotated file is kept).
    #[arg(long, default_value_t = 10 << 20)]
    pub log_max_bytes: u64,
    /// A `fenced` container's lease (see [`super::lease`]): the container is killed once this
    /// file has not changed for `--fence-timeout-ms`.
    #[arg(long, requires = "fence_timeout_ms")]
    pub fence_lease: Option<PathBuf>,
    #[arg(long)]
    pub fence_timeout_ms: Option<u64>,
}

/// `started.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Started {
    pub pid: i32,
    pub started_unix_ms: u64,
}

/// `exit.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Exited {
    pub exit_code: i32,
    /// The signal that killed the process, if one did.
    pub signal: Option<i32>,
    pub finished_unix_ms: u64,
    /// Set when the container never started: runc's error.
    pub start_error: Option<String>,
    /// The shim killed the container because its agent stopped renewing the fence lease.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fence_lapsed: bool,
}

pub const STARTED_FILE: &str = "started.json";
pub const EXIT_FILE: &str = "exit.json";
/// The shim's [`ShimIdentity`] (pid and start time), beside the bundle.
pub const SHIM_PID_FILE: &str = "shim.json";

pub fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes `value` as JSON to `dir/name` atomically (temp file, fsync, rename).
pub fn write_state<T: Serialize>(dir: &Path, name: &str, value: &T) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = File::create(&tmp)?;
    file.write_all(&serde_json::to_vec(value).map_err(io::Error::other)?)?;
    file.sync_all()?;
    std::fs::rename(tmp, dir.join(name))
}

/// `exit.json` for a container that never started.
fn write_start_error(bundle: &Path, message: String) -> io::Result<()> {
    write_state(
        bundle,
        EXIT_FILE,
        &Exited {
            exit_code: 128,
            signal: None,
            finished_unix_ms: unix_ms(SystemTime::now()),
            start_error: Some(message),
            fence_lapsed: false,
        },
    )
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// The log writer: CRI lines, size-based rotation.
struct LogWriter {
    path: PathBuf,
    file: File,
    written: u64,
    max_bytes: u64,
}

impl LogWriter {
    fn open(path: &Path, max_bytes: u64) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let written = file.metadata()?.len();
        Ok(Self {
            path: path.to_owned(),
            file,
            written,
            max_bytes,
        })
    }

    fn line(&mut self, stream: &str, partial: bool, text: &[u8]) -> io::Result<()> {
        if self.written >= self.max_bytes {
            let rotated = self.path.with_extension("log.1");
            std::fs::rename(&self.path, rotated)?;
            *self = Self::open(&self.path, self.max_bytes)?;
        }
        let now = humantime::format_rfc3339_nanos(SystemTime::now());
        let tag = if partial { "P" } else { "F" };
        let mut out = Vec::with_capacity(text.len() + 48);
        write!(out, "{now} {stream} {tag} ")?;
        out.extend_from_slice(text);
        out.push(b'\n');
        self.file.write_all(&out)?;
        self.written += out.len() as u64;
        Ok(())
    }
}

/// One output stream of the container: a pipe and the bytes of an unfinished line.
struct Stream {
    name: &'static str,
    fd: Option<OwnedFd>,
    pending: Vec<u8>,
}

/// Lines longer than this are written in parts (tagged `P`), as the CRI log format allows.
const MAX_LINE: usize = 16 << 10;

impl Stream {
    fn read(&mut self, log: &mut LogWriter) -> io::Result<()> {
        let Some(fd) = &self.fd else { return Ok(()) };
        let mut buf = [0u8; 16 << 10];
        let n = match nix::unistd::read(fd, &mut buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => return Ok(()),
            Err(e) => return Err(io::Error::from(e)),
        };
        if n == 0 {
            self.fd = None;
            if !self.pending.is_empty() {
                let rest = std::mem::take(&mut self.pending);
                log.line(self.name, false, &rest)?;
            }
            return Ok(());
        }
        self.pending.extend_from_slice(&buf[..n as usize]);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            log.line(self.name, false, &line[..line.len() - 1])?;
        }
        while self.pending.len() >= MAX_LINE {
            let part: Vec<u8> = self.pending.drain(..MAX_LINE).collect();
            log.line(self.name, true, &part)?;
        }
        Ok(())
    }
}

/// The last `msg` runc wrote to its JSON log.
fn runc_error(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["level"] == "error")
        .and_then(|v| v["msg"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "runc failed without a message".to_owned())
}

fn runc(args: &ShimArgs) -> Command {
    let mut command = Command::new(&args.runc);
    command
        .arg("--root")
        .arg(&args.root)
        .arg("--log")
        .arg(args.bundle.join("runc.log"))
        .arg("--log-format")
        .arg("json");
    command
}

/// Runs the shim; returns only when the container has ended (or never started).
pub fn run(args: &ShimArgs) -> io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(io::Error::from)?;
    write_state(&args.bundle, SHIM_PID_FILE, &ShimIdentity::of_self()?)?;
    let fail = |message: String| write_start_error(&args.bundle, message);
    let mut log = LogWriter::open(&args.log, args.log_max_bytes)?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    // The container's stdin: an empty pipe whose write end is closed (never the host's
    // /dev/null, which runtimes may swap for their own).
    let (in_r, in_w) = pipe()?;
    drop(in_w);
    let pid_file = args.bundle.join("init.pid");
    // `run --detach` creates and starts in one runc execution (two cost ~10 ms more). The
    // container's first process outlives runc and is re-parented to this subreaper (as a
    // zombie too, if it is already done), so its exit status is never lost.
    let status = runc(args)
        .arg("run")
        .arg("--detach")
        .arg("--bundle")
        .arg(&args.bundle)
        .arg("--pid-file")
        .arg(&pid_file)
        .arg(&args.id)
        .stdin(Stdio::from(in_r))
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w))
        .status()?;
    if !status.success() {
        return fail(format!(
            "runc run: {}",
            runc_error(&args.bundle.join("runc.log"))
        ));
    }
    let pid: i32 = std::fs::read_to_string(&pid_file)?
        .trim()
        .parse()
        .map_err(io::Error::other)?;
    write_state(
        &args.bundle,
        STARTED_FILE,
        &Started {
            pid,
            started_unix_ms: unix_ms(SystemTime::now()),
        },
    )?;

    let mut streams = [
        Stream {
            name: "stdout",
            fd: Some(out_r),
            pending: Vec::new(),
        },
        Stream {
            name: "stderr",
            fd: Some(err_r),
            pending: Vec::new(),
        },
    ];
    let mut exit: Option<(i32, Option<i32>)> = None;
    let mut drain_deadline: Option<Instant> = None;
    let mut lease = args
        .fence_lease
        .as_ref()
        .zip(args.fence_timeout_ms)
        .map(|(path, ms)| {
            (
                path,
                super::lease::LeaseWatch::new(Duration::from_millis(ms), Instant::now()),
            )
        });
    let mut lease_checked = Instant::now();
    let mut fence_lapsed = false;
    loop {
        if exit.is_none()
            && !fence_lapsed
            && let Some((path, watch)) = lease.as_mut()
            && lease_checked.elapsed() >= super::lease::POLL
        {
            lease_checked = Instant::now();
            if watch.observe(std::fs::read_to_string(path.as_path()).ok(), lease_checked) {
                eprintln!(
                    "shoal shim {}: the fence lease {} lapsed: killing the fenced container",
                    args.id,
                    path.display()
                );
                fence_lapsed = true;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let open: Vec<&OwnedFd> = streams.iter().filter_map(|s| s.fd.as_ref()).collect();
        if open.is_empty() {
            if exit.is_none() {
                // Both streams are closed: nothing to read, only the exit to wait for.
                exit = reap(pid, true)?;
            }
            break;
        }
        let mut polls: Vec<nix::poll::PollFd> = open
            .iter()
            .map(|fd| nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN))
            .collect();
        // The timeout bounds how late an exit is noticed while a stream is still open.
        let n = match nix::poll::poll(&mut polls, 10u8) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(io::Error::from(e)),
        };
        let ready: Vec<RawFd> = open
            .iter()
            .zip(&polls)
            .filter(|(_, p)| p.any().unwrap_or(true))
            .map(|(fd, _)| fd.as_raw_fd())
            .collect();
        drop(polls);
        if n > 0 {
            for stream in streams.iter_mut() {
                if stream
                    .fd
                    .as_ref()
                    .is_some_and(|fd| ready.contains(&fd.as_raw_fd()))
                {
                    stream.read(&mut log)?;
                }
            }
        }
        if exit.is_none() {
            exit = reap(pid, false)?;
            if exit.is_some() {
                // Other holders of the pipes (children that escaped the PID namespace
                // cannot exist; stragglers die with init) get a moment to flush.
                drain_deadline = Some(Instant::now() + Duration::from_secs(1));
            }
        }
        if drain_deadline.is_some_and(|d| Instant::now() > d) {
            break;
        }
    }
    let (exit_code, signal) = exit.unwrap_or((255, None));
    write_state(
        &args.bundle,
        EXIT_FILE,
        &Exited {
            exit_code,
            signal,
            finished_unix_ms: unix_ms(SystemTime::now()),
            start_error: None,
            fence_lapsed,
        },
    )
}

/// Reaps exited children; returns the container process's (exit code, signal) once it ended.
fn reap(pid: i32, block: bool) -> io::Result<Option<(i32, Option<i32>)>> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let flags = (!block).then_some(WaitPidFlag::WNOHANG);
    loop {
        match waitpid(None, flags) {
            Ok(WaitStatus::StillAlive) => return Ok(None),
            Ok(WaitStatus::Exited(reaped, code)) if reaped.as_raw() == pid => {
                return Ok(Some((code, None)));
            }
            Ok(WaitStatus::Signaled(reaped, signal, _)) if reaped.as_raw() == pid => {
                let signal = signal as i32;
                return Ok(Some((128 + signal, Some(signal))));
            }
            // Another child (a re-parented orphan, a stop or continue): reaped, go on.
            Ok(_) => {}
            // Not our child any more (cannot happen as subreaper); treat as gone.
            Err(nix::errno::Errno::ECHILD) => return Ok(Some((255, None))),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(io::Error::from(e)),
        }
    }
}

/// Who a shim is: its pid and the kernel's start time of that pid (clock ticks since boot),
/// so a pid reused by another process after the shim died is not taken for the shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShimIdentity {
    pub pid: i32,
    pub start_ticks: u64,
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in clock ticks since boot.
pub fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: fields after the
    // last ')' are plain.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl ShimIdentity {
    fn of_self() -> io::Result<Self> {
        let pid = std::process::id() as i32;
        let start_ticks = start_ticks(pid).ok_or_else(|| {
            io::Error::other("cannot read this process's start time from /proc/self/stat")
        })?;
        Ok(Self { pid, start_ticks })
    }

    /// Whether this very process still runs (not merely a process with its pid).
    pub fn is_alive(&self) -> bool {
        self.pid > 0 && start_ticks(self.pid) == Some(self.start_ticks)
    }
}

/// `shoal shim`'s entry: detaches (the agent's wait returns at once), then supervises.
pub fn main(args: &ShimArgs) -> io::Result<()> {
    // SAFETY: called before any thread exists in this process (no async runtime is started
    // for `shoal shim`), so the child is a complete copy and may run any code.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Child => {}
        // SAFETY: part of the fork: the parent leaves at once, without running destructors or
        // exit handlers whose state the child shares (nix offers no _exit).
        nix::unistd::ForkResult::Parent { .. } => unsafe { libc::_exit(0) },
    }
    if let Err(err) = run(args) {
        eprintln!("shoal shim {}: {err}", args.id);
        if !args.bundle.join(EXIT_FILE).exists() {
            let _ = write_start_error(&args.bundle, format!("shim: {err}"));
        }
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shim is its pid *and* that pid's start time: a pid the kernel gave to another process
    /// after the shim died does not make a dead container look Running.
    #[test]
    fn a_reused_pid_is_not_the_shim() {
        let me = ShimIdentity::of_self().unwrap();
        assert!(me.is_alive());
        let reused = ShimIdentity {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(!reused.is_alive(), "another process with the shim's pid");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        let gone = ShimIdentity {
            pid,
            start_ticks: 0,
        };
        assert!(!gone.is_alive());
        assert!(start_ticks(i32::MAX).is_none());
    }
}

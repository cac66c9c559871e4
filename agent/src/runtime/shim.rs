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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
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
}

pub const STARTED_FILE: &str = "started.json";
pub const EXIT_FILE: &str = "exit.json";
pub const SHIM_PID_FILE: &str = "shim.pid";

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
        },
    )
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
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
        // SAFETY: reading into a buffer we own, from a descriptor we own.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted || err.kind() == io::ErrorKind::WouldBlock {
                return Ok(());
            }
            return Err(err);
        }
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
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    write_state(&args.bundle, SHIM_PID_FILE, &std::process::id())?;
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
    loop {
        let mut polls: Vec<libc::pollfd> = streams
            .iter()
            .filter_map(|s| s.fd.as_ref())
            .map(|fd| libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        if polls.is_empty() {
            if exit.is_none() {
                // Both streams are closed: nothing to read, only the exit to wait for.
                exit = reap(pid, true)?;
            }
            break;
        }
        // SAFETY: polling descriptors we own; the array outlives the call. The timeout bounds
        // how late an exit is noticed while a stream is still open.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 10) };
        if n > 0 {
            for stream in streams.iter_mut() {
                let ready = stream.fd.as_ref().is_some_and(|fd| {
                    polls
                        .iter()
                        .any(|p| p.fd == fd.as_raw_fd() && p.revents != 0)
                });
                if ready {
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
        },
    )
}

/// Reaps exited children; returns the container process's (exit code, signal) once it ended.
fn reap(pid: i32, block: bool) -> io::Result<Option<(i32, Option<i32>)>> {
    loop {
        let mut status = 0;
        let flags = if block { 0 } else { libc::WNOHANG };
        // SAFETY: waitpid with a status we own.
        let reaped = unsafe { libc::waitpid(-1, &mut status, flags) };
        if reaped == 0 {
            return Ok(None);
        }
        if reaped < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ECHILD) {
                // Not our child any more (cannot happen as subreaper); treat as gone.
                return Ok(Some((255, None)));
            }
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if reaped == pid {
            return Ok(Some(if libc::WIFSIGNALED(status) {
                let signal = libc::WTERMSIG(status);
                (128 + signal, Some(signal))
            } else {
                (libc::WEXITSTATUS(status), None)
            }));
        }
    }
}

/// `shoal shim`'s entry: detaches (the agent's wait returns at once), then supervises.
pub fn main(args: &ShimArgs) -> io::Result<()> {
    // SAFETY: called before any thread exists in this process (no async runtime is started
    // for `shoal shim`), so the child is a complete copy.
    match unsafe { libc::fork() } {
        -1 => return Err(io::Error::last_os_error()),
        0 => {}
        // SAFETY: the parent leaves at once without running destructors the child shares.
        _ => unsafe { libc::_exit(0) },
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

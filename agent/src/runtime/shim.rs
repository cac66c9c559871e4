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
//! 4. for a container with `stdin` it keeps the write end of its stdin pipe, for one with
//!    `tty` the master of its terminal (runc hands it over on `console.sock`, the output is
//!    logged as stdout); attaches connect to `attach.sock` in the bundle and send it input,
//!    sizes and the close of stdin ([`Attach`]).
//!
//! The agent learns everything from those files, so it can die and come back at any time.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::session::{CLOSE, MAX_MESSAGE, RESIZE, STDIN};

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
    /// When the agent's run lease on the fenced pod ends, as the agent knew it when it
    /// decided the start ([`super::lease::monotonic_ms`]): the container is not started at or
    /// after it, and is killed then unless a renewal of the lease moves it.
    #[arg(long, requires = "fence_lease")]
    pub fence_deadline_ms: Option<u64>,
    /// Keep the container's stdin open for attaches (`stdin: true`): what clients of
    /// [`ATTACH_SOCKET`] send on [`STDIN`] reaches it.
    #[arg(long)]
    pub stdin: bool,
    /// Close the container's stdin once the first attach has ended (`stdinOnce: true`).
    #[arg(long)]
    pub stdin_once: bool,
    /// Run the container on a terminal (`tty: true`): runc hands its master over
    /// [`CONSOLE_SOCKET`]; the terminal's output is the container's stdout, attaches' input
    /// and sizes go to it.
    #[arg(long)]
    pub tty: bool,
}

pub use shoal_core::pod::observed::{Exited, Started};

pub const STARTED_FILE: &str = "started.json";
/// How a shim's start error begins when the run lease of a fenced pod ended before its
/// container started (`--fence-deadline-ms`).
pub const FENCE_LAPSED_BEFORE_START: &str =
    "not started: the node's run lease on this fenced pod ended before the container could start";
pub const EXIT_FILE: &str = "exit.json";
/// The shim's [`ShimIdentity`] (pid and start time), beside the bundle.
pub const SHIM_PID_FILE: &str = "shim.json";
/// The socket in the bundle that attaches connect to (containers with `stdin` or `tty`): they
/// send session messages (`[channel][length u32 BE][bytes]`, see [`crate::session`]):
/// [`STDIN`] bytes, [`RESIZE`] sizes, [`CLOSE`] of stdin. Output is read from the log.
pub const ATTACH_SOCKET: &str = "attach.sock";
/// The socket in the bundle on which runc hands over a `tty` container's terminal master.
const CONSOLE_SOCKET: &str = "console.sock";

/// A path to `name` in the directory open as `dir`, short whatever the directory's own path
/// (a unix socket's path is limited to 108 bytes; bundles are deeper than that).
fn short_path(dir: &File, name: &str) -> String {
    format!("/proc/self/fd/{}/{name}", dir.as_raw_fd())
}

/// Connects to the attach socket of the container whose bundle is `bundle`.
pub fn connect_attach(bundle: &Path) -> io::Result<UnixStream> {
    let dir = File::open(bundle)?;
    UnixStream::connect(short_path(&dir, ATTACH_SOCKET))
}

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
            message: None,
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
            // A terminal's master reads EIO once nothing holds its other side: the end.
            Err(nix::errno::Errno::EIO) => 0,
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
    // The container's stdin: a pipe whose write end is closed (never the host's /dev/null,
    // which runtimes may swap for their own), or kept for attaches with `--stdin`.
    let (in_r, in_w) = pipe()?;
    let in_w = (args.stdin && !args.tty).then_some(in_w);
    let bundle_dir = File::open(&args.bundle)?;
    let listen = |name: &str| -> io::Result<UnixListener> {
        let path = short_path(&bundle_dir, name);
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    };
    let console = args.tty.then(|| listen(CONSOLE_SOCKET)).transpose()?;
    let pid_file = args.bundle.join("init.pid");
    // A start decided while the node held the pod's run lease may come after that lease ended
    // (a slow pass, a loaded host): the container must not run then, not even until the first
    // look at the lease below.
    if let Some(deadline) = args.fence_deadline_ms
        && super::lease::monotonic_ms() >= deadline
    {
        return fail(format!(
            "{FENCE_LAPSED_BEFORE_START}: its deadline was {deadline} ms (CLOCK_MONOTONIC), now is {} ms",
            super::lease::monotonic_ms()
        ));
    }
    // `run --detach` creates and starts in one runc execution (two cost ~10 ms more). The
    // container's first process outlives runc and is re-parented to this subreaper (as a
    // zombie too, if it is already done), so its exit status is never lost.
    let mut command = runc(args);
    command
        .arg("run")
        .arg("--detach")
        .arg("--bundle")
        .arg(&args.bundle)
        .arg("--pid-file")
        .arg(&pid_file);
    if console.is_some() {
        // runc, another process, reaches the socket through this one's directory descriptor.
        command.arg("--console-socket").arg(format!(
            "/proc/{}/fd/{}/{CONSOLE_SOCKET}",
            std::process::id(),
            bundle_dir.as_raw_fd()
        ));
    }
    command
        .arg(&args.id)
        .stdin(Stdio::from(in_r))
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w));
    let (status, master) = match &console {
        None => run_detached(command)?,
        Some(console) => run_with_console(command, console)?,
    };
    drop(console);
    let _ = std::fs::remove_file(short_path(&bundle_dir, CONSOLE_SOCKET));
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

    let mut streams = vec![
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
    // A terminal's output is the container's stdout.
    if let Some(master) = &master {
        streams.push(Stream {
            name: "stdout",
            fd: Some(master.try_clone()?),
            pending: Vec::new(),
        });
    }
    let mut attach = if args.stdin || args.tty {
        let sink = match master {
            Some(master) => Some(master),
            None => in_w,
        };
        if let Some(sink) = &sink {
            nix::fcntl::fcntl(
                sink,
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
            )
            .map_err(io::Error::from)?;
        }
        Some(Attach {
            listener: listen(ATTACH_SOCKET)?,
            clients: Vec::new(),
            sink,
            pending: Vec::new(),
            tty: args.tty,
            once: args.stdin_once,
        })
    } else {
        None
    };
    let mut exit: Option<(i32, Option<i32>)> = None;
    let mut drain_deadline: Option<Instant> = None;
    let mut lease = args
        .fence_lease
        .as_ref()
        .zip(args.fence_timeout_ms)
        .map(|(path, ms)| {
            (
                path,
                super::lease::LeaseWatch::new(
                    Duration::from_millis(ms),
                    Instant::now(),
                    super::lease::monotonic_ms(),
                    args.fence_deadline_ms,
                ),
            )
        });
    // The first look is at once: the deadline may have passed while runc ran.
    let mut lease_checked: Option<Instant> = None;
    let mut fence_lapsed = false;
    loop {
        if exit.is_none()
            && !fence_lapsed
            && let Some((path, watch)) = lease.as_mut()
            && lease_checked.is_none_or(|at| at.elapsed() >= super::lease::POLL)
        {
            let now = Instant::now();
            lease_checked = Some(now);
            if watch.observe(
                std::fs::read_to_string(path.as_path()).ok(),
                now,
                super::lease::monotonic_ms(),
            ) {
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
        let mut watched: Vec<BorrowedFd> = open.iter().map(|fd| fd.as_fd()).collect();
        if let Some(attach) = &attach {
            watched.extend(attach.fds());
        }
        let mut polls: Vec<nix::poll::PollFd> = watched
            .iter()
            .map(|fd| nix::poll::PollFd::new(*fd, nix::poll::PollFlags::POLLIN))
            .collect();
        // The timeout bounds how late an exit is noticed while a stream is still open.
        let n = match nix::poll::poll(&mut polls, 10u8) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(io::Error::from(e)),
        };
        let ready: Vec<RawFd> = watched
            .iter()
            .zip(&polls)
            .filter(|(_, p)| p.any().unwrap_or(true))
            .map(|(fd, _)| fd.as_raw_fd())
            .collect();
        drop(polls);
        drop(watched);
        if let Some(attach) = attach.as_mut() {
            attach.serve(&ready);
        }
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
    drop(attach);
    let _ = std::fs::remove_file(short_path(&bundle_dir, ATTACH_SOCKET));
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
            message: None,
        },
    )
}

/// Runs `command` (`runc run --detach …`) to its end and drops it. A `Command` keeps the
/// descriptors given to it as stdio after it ran, so dropping it here is what closes the
/// shim's copies of the write ends of the container's stdout and stderr: kept, the shim
/// itself would hold its log pipes open and never see their end after the container exits.
fn run_detached(mut command: Command) -> io::Result<(std::process::ExitStatus, Option<OwnedFd>)> {
    let status = command.status()?;
    drop(command);
    Ok((status, None))
}

/// Runs `command` (`runc run --detach --console-socket …`) while taking the terminal master
/// runc sends on `console` (SCM_RIGHTS) once it has made the container's terminal.
fn run_with_console(
    mut command: Command,
    console: &UnixListener,
) -> io::Result<(std::process::ExitStatus, Option<OwnedFd>)> {
    let mut child = command.spawn()?;
    let mut master = None;
    loop {
        let exited = child.try_wait()?;
        match console.accept() {
            Ok((conn, _)) => master = Some(receive_fd(&conn)?),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if let Some(status) = exited {
            return Ok((status, master));
        }
        if master.is_some() {
            return Ok((child.wait()?, master));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The one descriptor a peer sends with its message on `conn` (runc's console handover).
fn receive_fd(conn: &UnixStream) -> io::Result<OwnedFd> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut name = [0u8; 4096];
    let mut iov = [io::IoSliceMut::new(&mut name)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    for cmsg in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            let mut fds = fds.into_iter();
            if let Some(fd) = fds.next() {
                for extra in fds {
                    // SAFETY: received just now, owned by nobody else; closed here.
                    drop(unsafe { OwnedFd::from_raw_fd(extra) });
                }
                // SAFETY: the descriptor arrived with this message: this process owns it.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Err(io::Error::other(
        "runc sent no terminal on the console socket",
    ))
}

/// The attach side of a container with `--stdin` or `--tty`: the listening socket, the
/// clients connected to it, and where their input goes.
struct Attach {
    listener: UnixListener,
    clients: Vec<Client>,
    /// The pipe to the process's stdin, or the terminal's master; `None` once stdin is closed.
    sink: Option<OwnedFd>,
    /// Input not written yet (the sink is non-blocking: a process that does not read its
    /// stdin never stalls the log).
    pending: Vec<u8>,
    tty: bool,
    /// `stdinOnce`: stdin closes when the first attach ends.
    once: bool,
}

struct Client {
    stream: UnixStream,
    buf: Vec<u8>,
}

/// Input kept for a process that does not read it, at most.
const MAX_PENDING_INPUT: usize = 1 << 20;

impl Attach {
    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        std::iter::once(self.listener.as_fd())
            .chain(self.clients.iter().map(|c| c.stream.as_fd()))
            .collect()
    }

    /// Accepts new clients, reads the ready ones, writes what input it can.
    fn serve(&mut self, ready: &[RawFd]) {
        if ready.contains(&self.listener.as_raw_fd()) {
            while let Ok((stream, _)) = self.listener.accept() {
                if stream.set_nonblocking(true).is_ok() {
                    self.clients.push(Client {
                        stream,
                        buf: Vec::new(),
                    });
                }
            }
        }
        let mut i = 0;
        while i < self.clients.len() {
            let fd = self.clients[i].stream.as_raw_fd();
            let open = !ready.contains(&fd) || self.read_client(i);
            if open {
                i += 1;
            } else {
                self.clients.swap_remove(i);
                if self.once && !self.tty {
                    self.sink = None;
                }
            }
        }
        self.flush();
    }

    /// Reads what client `i` sent and acts on its whole messages; false once it is gone (or
    /// broke the framing).
    fn read_client(&mut self, i: usize) -> bool {
        let mut chunk = [0u8; 16 << 10];
        loop {
            match self.clients[i].stream.read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => self.clients[i].buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        loop {
            let buf = &self.clients[i].buf;
            if buf.len() < 5 {
                return true;
            }
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len > MAX_MESSAGE {
                return false;
            }
            if buf.len() < 5 + len {
                return true;
            }
            let message: Vec<u8> = self.clients[i].buf.drain(..5 + len).collect();
            self.act(message[0], &message[5..]);
        }
    }

    fn act(&mut self, channel: u8, bytes: &[u8]) {
        match channel {
            STDIN if self.sink.is_some() => {
                let room = MAX_PENDING_INPUT.saturating_sub(self.pending.len());
                self.pending
                    .extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            RESIZE if self.tty => {
                #[derive(Deserialize)]
                struct Size {
                    #[serde(rename = "Width")]
                    width: u16,
                    #[serde(rename = "Height")]
                    height: u16,
                }
                if let (Ok(size), Some(master)) =
                    (serde_json::from_slice::<Size>(bytes), &self.sink)
                {
                    let ws = libc::winsize {
                        ws_row: size.height,
                        ws_col: size.width,
                        ws_xpixel: 0,
                        ws_ypixel: 0,
                    };
                    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which lives
                    // across the call; the descriptor is the terminal's master.
                    unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
                }
            }
            CLOSE if bytes == [STDIN] && !self.tty => {
                self.flush();
                self.sink = None;
            }
            _ => {}
        }
    }

    /// Writes pending input to the sink as far as it takes it.
    fn flush(&mut self) {
        let Some(sink) = &self.sink else {
            self.pending.clear();
            return;
        };
        while !self.pending.is_empty() {
            match nix::unistd::write(sink, &self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => return,
                // The process closed its stdin (or ended): nothing more reaches it.
                Err(_) => {
                    self.sink = None;
                    self.pending.clear();
                    return;
                }
            }
        }
    }
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

    fn frame(channel: u8, bytes: &[u8]) -> Vec<u8> {
        let mut m = vec![channel];
        m.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        m.extend_from_slice(bytes);
        m
    }

    /// Attach input reaches the container's stdin only as whole messages (however the bytes
    /// arrive), a close of stdin ends it, and a client breaking the framing is dropped.
    #[test]
    fn attach_input_reaches_stdin_in_whole_messages_and_its_close_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("attach.sock")).unwrap();
        listener.set_nonblocking(true).unwrap();
        let (stdin_r, stdin_w) = pipe().unwrap();
        let mut attach = Attach {
            listener,
            clients: Vec::new(),
            sink: Some(stdin_w),
            pending: Vec::new(),
            tty: false,
            once: false,
        };
        let (mut client, server) = UnixStream::pair().unwrap();
        server.set_nonblocking(true).unwrap();
        let fd = server.as_raw_fd();
        attach.clients.push(Client {
            stream: server,
            buf: Vec::new(),
        });
        let hello = frame(STDIN, b"hello\n");
        client.write_all(&hello[..3]).unwrap();
        attach.serve(&[fd]);
        assert!(attach.pending.is_empty() && attach.clients.len() == 1);
        client.write_all(&hello[3..]).unwrap();
        // A size for a container without a terminal is ignored.
        client
            .write_all(&frame(RESIZE, br#"{"Width":80,"Height":24}"#))
            .unwrap();
        client.write_all(&frame(CLOSE, &[STDIN])).unwrap();
        attach.serve(&[fd]);
        assert!(attach.sink.is_none(), "stdin closed");
        let mut got = String::new();
        File::from(stdin_r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "hello\n", "whole, then the end of the pipe");

        let (mut rogue, server) = UnixStream::pair().unwrap();
        server.set_nonblocking(true).unwrap();
        let fd = server.as_raw_fd();
        attach.clients.push(Client {
            stream: server,
            buf: Vec::new(),
        });
        let mut huge = vec![STDIN];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        rogue.write_all(&huge).unwrap();
        attach.serve(&[fd]);
        assert_eq!(
            attach.clients.len(),
            1,
            "the client breaking the framing is gone"
        );
    }

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

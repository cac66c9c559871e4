//! The node side of `kubectl exec` and `kubectl port-forward`. exec runs a command in one of this node's containers through
//! `runc exec` and relays it as session messages (`crate::session`). Without a tty the
//! process's stdin, stdout and stderr are pipes; with one, runc runs on a pseudo-terminal of
//! ours (it puts the container's own terminal behind it and forwards resizes and the exit
//! code).
//!
//! Every source of bytes is pumped by its own task into one queue, and one loop owns the
//! writer, so a process that does not read its stdin can never stall its output. When the
//! client goes away first, the process is killed (by the pid runc records), not left behind.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::Arc;

use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use crate::runtime::{ContainerRuntime, ExecProcess};
use crate::session::{
    self, AttachRequest, CLOSE, ExecRequest, PortForwardRequest, RESIZE, STATUS, STDERR, STDIN,
    STDOUT,
};

/// What the pumps report to the session's loop.
enum Event {
    Output(u8, Vec<u8>),
    /// One output source reached its end.
    Closed,
    Exited(i32),
    /// The client went away (its half of the session ended before the process did).
    ClientGone,
}

/// Runs `req` and relays it over `input`/`output` until the process ends or the client goes;
/// always ends with one `Status` message (unless the client is gone) and the end of `output`.
pub async fn serve<R, W>(
    runtime: Arc<dyn ContainerRuntime>,
    req: ExecRequest,
    input: R,
    mut output: W,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send,
{
    let status = match run(runtime.as_ref(), &req, input, &mut output).await {
        Ok(Some(status)) => status,
        Ok(None) => return,
        Err(message) => session::error_status(&message),
    };
    let _ = session::write_message(&mut output, STATUS, status.to_string().as_bytes()).await;
    let _ = output.shutdown().await;
}

/// The process's `Status`, `None` if the client left, or why it could not run.
async fn run<R, W>(
    runtime: &dyn ContainerRuntime,
    req: &ExecRequest,
    input: R,
    output: &mut W,
) -> Result<Option<serde_json::Value>, String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send,
{
    let meta = runtime
        .pod(&req.uid)
        .and_then(|pod| pod.running(&req.container).map(|c| c.meta.clone()))
        .ok_or_else(|| {
            format!(
                "container {:?} of pod {} is not running on this node",
                req.container, req.uid
            )
        })?;
    // The process runs as the container's own, with the command (and terminal size) given;
    // the runtime keeps its own errors apart from the process's stderr, and can kill the
    // process (not only its client) if the client leaves.
    let prepare = |size: Option<Option<(u16, u16)>>| -> Result<ExecProcess, String> {
        runtime
            .exec_stream(&req.uid, &meta, &req.command, size)
            .map_err(|e| e.to_string())
    };
    let (tx, mut events) = mpsc::channel::<Event>(64);
    let mut sources = 0;
    let mut process;
    let mut child = if req.tty {
        let pty = nix::pty::openpty(None, None).map_err(|e| format!("openpty: {e}"))?;
        let master = Arc::new(Pty::new(pty.master).map_err(|e| format!("pty: {e}"))?);
        // runc sizes the container's terminal from ours when it starts: wait (briefly) for
        // the client's first size, which kubectl sends at once, so the process never sees 0x0.
        let (sized, first_size) = oneshot::channel();
        tokio::spawn(pump_input(
            input,
            Stdin::Pty(master.clone()),
            tx.clone(),
            Some(sized),
        ));
        let size = tokio::time::timeout(Duration::from_secs(1), first_size)
            .await
            .ok()
            .and_then(Result::ok);
        process = prepare(Some(size))?;
        let command = &mut process.command;
        let slave = |pty: &OwnedFd| -> Result<Stdio, String> {
            Ok(Stdio::from(
                pty.try_clone().map_err(|e| format!("pty: {e}"))?,
            ))
        };
        command
            .stdin(slave(&pty.slave)?)
            .stdout(slave(&pty.slave)?)
            .stderr(slave(&pty.slave)?);
        // SAFETY: between fork and exec only setsid and ioctl run, both async-signal-safe: runc
        // gets a session of its own whose controlling terminal is the pty's slave, so it can
        // make it raw, relay to the container's terminal and get SIGWINCH on resizes.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, || {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                if libc::ioctl(0, libc::TIOCSCTTY as _, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = spawn(command)?;
        drop(pty.slave);
        sources += 1;
        tokio::spawn(pump_pty(master, tx.clone()));
        child
    } else {
        process = prepare(None)?;
        process
            .command
            .stdin(if req.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(if req.stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(if req.stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut child = spawn(&mut process.command)?;
        if let Some(out) = child.stdout.take() {
            sources += 1;
            tokio::spawn(pump(out, STDOUT, tx.clone()));
        }
        if let Some(err) = child.stderr.take() {
            sources += 1;
            tokio::spawn(pump(err, STDERR, tx.clone()));
        }
        let stdin = child.stdin.take().map_or(Stdin::None, Stdin::Pipe);
        tokio::spawn(pump_input(input, stdin, tx.clone(), None));
        child
    };
    {
        let tx = tx.clone();
        tokio::spawn(async move {
            let code = match child.wait().await {
                Ok(status) => status.code().unwrap_or_else(|| {
                    128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
                }),
                Err(_) => 128,
            };
            let _ = tx.send(Event::Exited(code)).await;
        });
    }
    drop(tx);
    let mut exited = None;
    while sources > 0 || exited.is_none() {
        match events.recv().await {
            Some(Event::Output(channel, bytes)) => {
                if session::write_message(output, channel, &bytes)
                    .await
                    .is_err()
                {
                    process.kill();
                    return Ok(None);
                }
            }
            Some(Event::Closed) => sources -= 1,
            Some(Event::Exited(code)) => exited = Some(code),
            Some(Event::ClientGone) | None => {
                debug!(pod = %req.uid, container = %req.container, "exec client left; killing the process");
                process.kill();
                return Ok(None);
            }
        }
    }
    let code = exited.unwrap_or(128);
    // The runtime failing to start the process (no such binary, say) is not its exit.
    if let Some(error) = process.failure() {
        return Err(format!("error executing command in container: {error}"));
    }
    Ok(Some(session::exit_status(code)))
}

/// Connects to `req.port` inside the pod's network namespace (as the kubelet does, so ports
/// bound to the pod's localhost are reachable) and relays until the pod closes the connection
/// or the client goes.
pub async fn forward<R, W>(
    runtime: Arc<dyn ContainerRuntime>,
    req: PortForwardRequest,
    mut input: R,
    mut output: W,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send,
{
    let stream = match dial(runtime.as_ref(), &req).await {
        Ok(stream) => stream,
        Err(message) => {
            let _ = session::write_message(&mut output, STATUS, message.as_bytes()).await;
            let _ = output.shutdown().await;
            return;
        }
    };
    let (mut from_pod, mut to_pod) = stream.into_split();
    let client = async {
        while let Ok(Some((channel, bytes))) = session::read_message(&mut input).await {
            match channel {
                STDIN if to_pod.write_all(&bytes).await.is_err() => break,
                // The client's end: the pod reads EOF, and may still answer.
                CLOSE => {
                    let _ = to_pod.shutdown().await;
                }
                _ => {}
            }
        }
    };
    let pod = async {
        // Large reads: each becomes one session message, one QUIC write and one SPDY frame
        // (32 KiB reads gave 172 MB/s through kubectl port-forward, 256 KiB 217–228 MB/s).
        let mut buf = vec![0u8; 256 << 10];
        loop {
            match from_pod.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    if session::write_message(&mut output, STDOUT, &buf[..n])
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    let message = format!("reading from port {}: {e}", req.port);
                    let _ = session::write_message(&mut output, STATUS, message.as_bytes()).await;
                    break;
                }
            }
        }
        let _ = output.shutdown().await;
    };
    // The pod closing ends the session; the client leaving drops the connection.
    tokio::select! {
        () = client => {}
        () = pod => {}
    }
}

/// Follows the container's log from its end: what it writes from now on goes out on the
/// stream it was written to, until it exits (then `Success`) or the client goes.
pub async fn attach<R, W>(
    runtime: Arc<dyn ContainerRuntime>,
    req: AttachRequest,
    mut input: R,
    mut output: W,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send,
{
    let latest = |runtime: &dyn ContainerRuntime| {
        runtime
            .pod(&req.uid)
            .and_then(|pod| pod.latest(&req.container).cloned())
    };
    let Some(container) = latest(runtime.as_ref())
        .filter(|c| matches!(c.state, crate::runtime::ObservedState::Running(_)))
    else {
        let message = format!(
            "container {:?} of pod {} is not running on this node",
            req.container, req.uid
        );
        let status = session::error_status(&message).to_string();
        let _ = session::write_message(&mut output, STATUS, status.as_bytes()).await;
        let _ = output.shutdown().await;
        return;
    };
    // Input goes to the shim's attach socket (a container created with stdin or tty).
    let mut sink = None;
    if req.stdin || req.tty {
        let connected = runtime
            .attach_input(&req.uid, &container.meta)
            .and_then(|s| {
                s.set_nonblocking(true)?;
                tokio::net::UnixStream::from_std(s)
            });
        match connected {
            Ok(stream) => sink = Some(stream),
            Err(e) => {
                let message = format!(
                    "container {:?} of pod {} takes no input: {e}",
                    req.container, req.uid
                );
                let status = session::error_status(&message).to_string();
                let _ = session::write_message(&mut output, STATUS, status.as_bytes()).await;
                let _ = output.shutdown().await;
                return;
            }
        }
    }
    let path = container.log_path.clone();
    let mut offset = std::fs::metadata(&path).map_or(0, |m| m.len());
    // An interactive attach echoes through the log: read it often.
    let period = if sink.is_some() { 20 } else { 200 };
    let follow = async {
        let mut tick = tokio::time::interval(Duration::from_millis(period));
        let mut checked = std::time::Instant::now();
        loop {
            tick.tick().await;
            let (raw, next) = match super::logs::read_raw(&path, offset) {
                Ok(read) => read,
                Err(e) => return session::error_status(&format!("reading the log: {e}")),
            };
            offset = next;
            for (stderr, bytes) in super::logs::by_stream(&raw) {
                let (wanted, channel) = if stderr {
                    (req.stderr, STDERR)
                } else {
                    (req.stdout, STDOUT)
                };
                if wanted
                    && session::write_message(&mut output, channel, &bytes)
                        .await
                        .is_err()
                {
                    return session::exit_status(0);
                }
            }
            // Whether the attempt still runs, once a second (after its last words are out).
            if raw.is_empty() && checked.elapsed() >= Duration::from_secs(1) {
                checked = std::time::Instant::now();
                let same =
                    latest(runtime.as_ref()).filter(|c| c.meta.attempt == container.meta.attempt);
                if !same
                    .is_some_and(|c| matches!(c.state, crate::runtime::ObservedState::Running(_)))
                {
                    return session::exit_status(0);
                }
            }
        }
    };
    // The client's input, relayed as it came (the shim reads the same messages); without a
    // sink only its end matters.
    let client_gone = async {
        while let Ok(Some((channel, bytes))) = session::read_message(&mut input).await {
            if let Some(sink) = sink.as_mut()
                && session::write_message(sink, channel, &bytes).await.is_err()
            {
                break;
            }
        }
        if let Some(mut sink) = sink {
            let _ = sink.shutdown().await;
        }
    };
    tokio::select! {
        status = follow => {
            let _ = session::write_message(&mut output, STATUS, status.to_string().as_bytes()).await;
            let _ = output.shutdown().await;
        }
        () = client_gone => {}
    }
}

/// A connection to the pod's port from inside its network namespace (the node's, for
/// `hostNetwork` pods).
async fn dial(
    runtime: &dyn ContainerRuntime,
    req: &PortForwardRequest,
) -> Result<tokio::net::TcpStream, String> {
    let pod = runtime
        .pod(&req.uid)
        .ok_or_else(|| format!("pod {} does not run on this node", req.uid))?;
    let netns = (!pod.sandbox.host_network).then(|| runtime.netns_path(&req.uid));
    let port = req.port;
    let (tx, rx) = oneshot::channel();
    // A thread of its own: entering the pod's namespace must not leak into a pooled thread.
    std::thread::Builder::new()
        .name("port-forward".into())
        .spawn(move || {
            let connect = || -> Result<std::net::TcpStream, String> {
                if let Some(netns) = &netns {
                    let file = std::fs::File::open(netns)
                        .map_err(|e| format!("{}: {e}", netns.display()))?;
                    nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| format!("entering {}: {e}", netns.display()))?;
                }
                let timeout = Duration::from_secs(5);
                let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
                std::net::TcpStream::connect_timeout(&v4, timeout)
                    .or_else(|e4| {
                        std::net::TcpStream::connect_timeout(&v6, timeout).map_err(|_| e4)
                    })
                    .map_err(|e| format!("dial tcp 127.0.0.1:{port}: {e}"))
            };
            let _ = tx.send(connect());
        })
        .map_err(|e| e.to_string())?;
    let stream = rx
        .await
        .map_err(|_| "the dialing thread died".to_owned())??;
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    tokio::net::TcpStream::from_std(stream).map_err(|e| e.to_string())
}

/// Spawns the runtime's exec command (killed if the session is dropped).
fn spawn(command: &mut std::process::Command) -> Result<tokio::process::Child, String> {
    let program = command.get_program().to_string_lossy().into_owned();
    tokio::process::Command::from(std::mem::replace(
        command,
        std::process::Command::new(&program),
    ))
    .kill_on_drop(true)
    .spawn()
    .map_err(|e| format!("{program}: {e}"))
}

/// Where the client's stdin goes.
enum Stdin {
    None,
    Pipe(tokio::process::ChildStdin),
    Pty(Arc<Pty>),
}

/// Reads the client's messages: stdin bytes, its close, and terminal sizes (`sized` hears of
/// the first).
async fn pump_input<R: AsyncRead + Unpin>(
    mut input: R,
    mut stdin: Stdin,
    tx: mpsc::Sender<Event>,
    mut sized: Option<oneshot::Sender<(u16, u16)>>,
) {
    loop {
        match session::read_message(&mut input).await {
            Ok(Some((STDIN, bytes))) => match &mut stdin {
                Stdin::Pipe(pipe) => {
                    if pipe.write_all(&bytes).await.is_err() {
                        stdin = Stdin::None;
                    }
                }
                Stdin::Pty(pty) => {
                    if pty.write_all(&bytes).await.is_err() {
                        stdin = Stdin::None;
                    }
                }
                Stdin::None => {}
            },
            // Closing a terminal's input would hang up the session: only pipes are closed.
            Ok(Some((CLOSE, which))) if which == [STDIN] => {
                if matches!(stdin, Stdin::Pipe(_)) {
                    stdin = Stdin::None;
                }
            }
            Ok(Some((RESIZE, bytes))) => {
                if let (Stdin::Pty(pty), Some((cols, rows))) =
                    (&stdin, session::parse_resize(&bytes))
                {
                    pty.resize(cols, rows);
                    if let Some(sized) = sized.take() {
                        let _ = sized.send((cols, rows));
                    }
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                let _ = tx.send(Event::ClientGone).await;
                return;
            }
        }
    }
}

/// Relays one pipe of the process as messages on `channel`.
async fn pump<R: AsyncRead + Unpin>(mut from: R, channel: u8, tx: mpsc::Sender<Event>) {
    let mut buf = vec![0u8; 32 << 10];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send(Event::Output(channel, buf[..n].to_vec()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
    let _ = tx.send(Event::Closed).await;
}

/// The terminal's output: EIO from the master is its end (every process holding the slave is
/// gone).
async fn pump_pty(pty: Arc<Pty>, tx: mpsc::Sender<Event>) {
    let mut buf = vec![0u8; 32 << 10];
    while let Ok(n) = pty.read(&mut buf).await {
        if n == 0
            || tx
                .send(Event::Output(STDOUT, buf[..n].to_vec()))
                .await
                .is_err()
        {
            break;
        }
    }
    let _ = tx.send(Event::Closed).await;
}

/// The master side of a pseudo-terminal, non-blocking under tokio's reactor.
struct Pty {
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
}

impl Pty {
    fn new(master: OwnedFd) -> std::io::Result<Self> {
        let flags = nix::fcntl::fcntl(master.as_fd(), nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(master.as_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))?;
        // SAFETY: the OwnedFd is moved into the AsyncFd and stays open, the same descriptor,
        // until the AsyncFd drops it.
        let fd =
            unsafe { tokio::io::unix::AsyncFd::register(master) }.map_err(|e| e.into_parts().1)?;
        Ok(Self { fd })
    }

    async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| {
                nix::unistd::read(fd.get_ref().as_fd(), buf).map_err(std::io::Error::from)
            }) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    async fn write_all(&self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| {
                nix::unistd::write(fd.get_ref().as_fd(), bytes).map_err(std::io::Error::from)
            }) {
                Ok(Ok(n)) => bytes = &bytes[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Sets the terminal's size; the kernel signals SIGWINCH to runc, which resizes the
    /// container's terminal.
    fn resize(&self, cols: u16, rows: u16) {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which outlives the call.
        unsafe {
            libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size);
        }
    }
}

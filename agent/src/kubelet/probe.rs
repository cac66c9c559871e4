//! Running one probe: TCP connect or HTTP GET from inside the pod's network namespace (the
//! probing thread joins it), or a command run in the container.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use super::pod::{Handler, Probe, ProbeAction};

/// Moves the calling thread into the network namespace at `netns`. The thread must not be
/// reused for anything else afterwards.
fn enter_netns(netns: &Path) -> Result<(), String> {
    let file = std::fs::File::open(netns).map_err(|e| format!("{}: {e}", netns.display()))?;
    // Affects only this thread's network namespace.
    if let Err(e) = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET) {
        return Err(format!("setns {}: {e}", netns.display()));
    }
    Ok(())
}

fn http_get(port: u16, path: &str, timeout: Duration) -> Result<String, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("dial {addr}: {e}"))?;
    stream.set_read_timeout(Some(timeout)).ok();
    stream.set_write_timeout(Some(timeout)).ok();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: shoal-probe/{}\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        crate::AGENT_VERSION
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).map_err(|e| format!("read: {e}"))?;
    let line = String::from_utf8_lossy(&head[..n]);
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            format!(
                "not an HTTP answer: {:?}",
                line.lines().next().unwrap_or("")
            )
        })?;
    if (200..400).contains(&code) {
        Ok(format!("HTTP {code}"))
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

/// Runs `probe`; `exec` runs a command in the container with a timeout and returns its exit
/// code and output. Returns (success, message).
pub fn run<E: std::fmt::Display>(
    probe: &Probe,
    netns: Option<&Path>,
    exec: impl FnOnce(&[String], Duration) -> Result<(i32, String), E>,
) -> (bool, String) {
    let timeout = Duration::from_millis(probe.timeout_ms);
    let result = match &probe.action {
        ProbeAction::Exec(command) => match exec(command, timeout) {
            Ok((0, output)) => Ok(output),
            Ok((code, output)) => Err(format!("command exited with {code}: {}", output.trim())),
            Err(error) => Err(error.to_string()),
        },
        ProbeAction::TcpSocket { port } => netns.map_or(Ok(()), enter_netns).and_then(|()| {
            let addr = SocketAddr::from(([127, 0, 0, 1], *port));
            TcpStream::connect_timeout(&addr, timeout)
                .map(|_| format!("connected to {addr}"))
                .map_err(|e| format!("dial {addr}: {e}"))
        }),
        ProbeAction::HttpGet { port, path } => netns
            .map_or(Ok(()), enter_netns)
            .and_then(|()| http_get(*port, path, timeout)),
    };
    match result {
        Ok(message) => (true, message),
        Err(message) => (false, message),
    }
}

/// Runs a lifecycle hook's `handler` (`exec` runs a command in the container) within
/// `timeout`: `Err` says why it failed. The calling thread may be moved into the pod's network
/// namespace (an httpGet hook): it must not be reused.
pub fn run_handler<E: std::fmt::Display>(
    handler: &Handler,
    netns: Option<&Path>,
    timeout: Duration,
    exec: impl FnOnce(&[String], Duration) -> Result<(i32, String), E>,
) -> Result<(), String> {
    match handler {
        Handler::Exec(command) => match exec(command, timeout) {
            Ok((0, _)) => Ok(()),
            Ok((code, output)) => Err(format!("command exited with {code}: {}", output.trim())),
            Err(error) => Err(error.to_string()),
        },
        Handler::HttpGet { port, path } => netns
            .map_or(Ok(()), enter_netns)
            .and_then(|()| http_get(*port, path, timeout))
            .map(|_| ()),
        Handler::Sleep { ms } => {
            std::thread::sleep(Duration::from_millis(*ms).min(timeout));
            Ok(())
        }
    }
}

//! Sessions between the API agent a client talks to and the node that runs the pod
//! (`kubectl exec`, `attach`): what a session asks for ([`SessionRequest`]), the messages both
//! ways, and the `Status` that ends one. The node side runs in `kubelet::exec`; the API side in
//! `api::stream`. The same bytes flow whether the pod runs on the API's own node (an in-memory
//! pipe) or on another (a QUIC stream on the `Session` channel), so there is one code path.
//!
//! A message is `[channel u8][length u32 BE][bytes]`, with the channel numbers of Kubernetes'
//! `v5.channel.k8s.io` ([`STDIN`] … [`CLOSE`]), so the API relays WebSocket messages without
//! translating them. The node ends a session with exactly one [`STATUS`] message, then the end
//! of its stream.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Client → node: the process's standard input.
pub const STDIN: u8 = 0;
/// Node → client: standard output (a terminal's output with a tty).
pub const STDOUT: u8 = 1;
/// Node → client: standard error (never sent with a tty).
pub const STDERR: u8 = 2;
/// Node → client: the `Status` that ends the session.
pub const STATUS: u8 = 3;
/// Client → node: a terminal size, `{"Width":W,"Height":H}`.
pub const RESIZE: u8 = 4;
/// Client → node: `[CLOSE, STDIN]` closes the process's standard input (v5).
pub const CLOSE: u8 = 255;

/// The largest message either side accepts (WebSocket clients send at most 32 KiB).
pub const MAX_MESSAGE: usize = 1 << 20;
/// Most arguments and bytes of a command.
const MAX_ARGS: usize = 1024;
const MAX_COMMAND_BYTES: usize = 32 << 10;

/// What a session asks of the node running the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionRequest {
    /// Run `command` in a container (`pods/exec`).
    Exec(ExecRequest),
    /// Connect to `port` in the pod's network namespace (`pods/portforward`): the node sends
    /// the pod's bytes on [`STDOUT`], takes the client's on [`STDIN`] and their end as
    /// [`CLOSE`], and ends with the end of its stream, or with one [`STATUS`] message holding
    /// the error's text.
    PortForward(PortForwardRequest),
    /// Follow a running container's output (`pods/attach`): what it writes from now on, on
    /// [`STDOUT`] and [`STDERR`], until it exits.
    Attach(AttachRequest),
}

/// `pods/attach`: the container's output from now on, and with `stdin` (a container created
/// with `stdin: true`) what the client sends on [`STDIN`] to its stdin, sizes on [`RESIZE`] to
/// its terminal with `tty`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachRequest {
    pub uid: String,
    pub container: String,
    pub stdout: bool,
    pub stderr: bool,
    #[serde(default)]
    pub stdin: bool,
    #[serde(default)]
    pub tty: bool,
}

/// `pods/portforward`: one connection to one port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortForwardRequest {
    pub uid: String,
    pub port: u16,
}

/// `pods/exec`: the options of `PodExecOptions` the node needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub uid: String,
    pub container: String,
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// Why a session request (possibly a peer's) is refused before anything runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("uid {0:?} is not a pod uid")]
    Uid(String),
    #[error("container {name:?} is not a container name: {reason}")]
    Container {
        name: String,
        reason: shoal_state::labels::SyntaxError,
    },
    #[error("command: required value (an exec needs a command)")]
    NoCommand,
    #[error(
        "command: too long ({args} arguments, {bytes} bytes; at most {MAX_ARGS} and {MAX_COMMAND_BYTES})"
    )]
    CommandTooLong { args: usize, bytes: usize },
    #[error("command: an argument contains a NUL byte")]
    CommandNul,
    #[error("port: must be between 1 and 65535")]
    Port,
}

impl SessionRequest {
    /// A session request from a peer names a pod uid and a container, which become paths on
    /// the node, and a command: all are checked before anything runs.
    pub fn check(&self) -> Result<(), RequestError> {
        let uid = |uid: &str| {
            if crate::runtime::is_safe_id(uid) {
                Ok(())
            } else {
                Err(RequestError::Uid(uid.to_owned()))
            }
        };
        let container = |name: &str| {
            shoal_state::labels::check_dns_label(name).map_err(|reason| RequestError::Container {
                name: name.to_owned(),
                reason,
            })
        };
        match self {
            SessionRequest::Exec(req) => {
                uid(&req.uid)?;
                container(&req.container)?;
                if req.command.is_empty() {
                    return Err(RequestError::NoCommand);
                }
                let bytes: usize = req.command.iter().map(String::len).sum();
                if req.command.len() > MAX_ARGS || bytes > MAX_COMMAND_BYTES {
                    return Err(RequestError::CommandTooLong {
                        args: req.command.len(),
                        bytes,
                    });
                }
                if req.command.iter().any(|a| a.contains('\0')) {
                    return Err(RequestError::CommandNul);
                }
                Ok(())
            }
            SessionRequest::Attach(req) => {
                uid(&req.uid)?;
                container(&req.container)
            }
            SessionRequest::PortForward(req) => {
                uid(&req.uid)?;
                if req.port == 0 {
                    return Err(RequestError::Port);
                }
                Ok(())
            }
        }
    }
}

/// Writes one message.
pub async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    channel: u8,
    bytes: &[u8],
) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|n| *n as usize <= MAX_MESSAGE)
        .ok_or_else(|| std::io::Error::other("session message too large"))?;
    let mut head = [0u8; 5];
    head[0] = channel;
    head[1..].copy_from_slice(&len.to_be_bytes());
    w.write_all(&head).await?;
    w.write_all(bytes).await?;
    w.flush().await
}

/// Reads one message; `None` at a clean end of the stream. A message over [`MAX_MESSAGE`] or
/// a stream cut inside a message is an error.
pub async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_MESSAGE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("session message of {len} bytes exceeds {MAX_MESSAGE}"),
        ));
    }
    let mut bytes = vec![0u8; len];
    r.read_exact(&mut bytes).await?;
    Ok(Some((head[0], bytes)))
}

/// Reads `reader`'s messages in a task of their own into a queue, so a `select!` over the
/// queue never drops a message half read; the queue ends with the stream (or its first error).
pub fn spawn_reader<R: AsyncRead + Unpin + Send + 'static>(
    mut reader: R,
) -> tokio::sync::mpsc::Receiver<(u8, Vec<u8>)> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok(Some(message)) = read_message(&mut reader).await {
            if tx.send(message).await.is_err() {
                break;
            }
        }
    });
    rx
}

/// The `Status` of a process that ended with `code`, as the kubelet sends it: kubectl exits
/// with the code of a `NonZeroExitCode` (which must be 0–255).
pub fn exit_status(code: i32) -> Value {
    if code == 0 {
        return json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"});
    }
    let code = code.clamp(0, 255);
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: exit status {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// The `Status` of a session that could not run, or broke.
pub fn error_status(message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "code": 500,
    })
}

/// A terminal size message (`{"Width":W,"Height":H}`, client-go's `TerminalSize`), as
/// (columns, rows); sizes of 0 or over 10,000 are refused.
pub fn parse_resize(bytes: &[u8]) -> Option<(u16, u16)> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    let dim = |k: &str| {
        v[k].as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| (1..=10_000).contains(n))
    };
    Some((dim("Width")?, dim("Height")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(uid: &str, container: &str, command: &[&str]) -> SessionRequest {
        SessionRequest::Exec(ExecRequest {
            uid: uid.into(),
            container: container.into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            stdin: false,
            stdout: true,
            stderr: true,
            tty: false,
        })
    }

    #[test]
    fn requests_from_peers_are_checked_before_anything_runs() {
        assert!(exec("0f5e-4c2a", "web", &["sh"]).check().is_ok());
        for (req, named) in [
            (exec("../../etc", "web", &["sh"]), "uid"),
            (exec("u1", "a/b", &["sh"]), "container"),
            (exec("u1", "web", &[]), "command"),
            (exec("u1", "web", &["a\0b"]), "NUL"),
            (exec("u1", "web", &vec!["x"; 2000]), "too long"),
            (
                SessionRequest::PortForward(PortForwardRequest {
                    uid: "/etc".into(),
                    port: 80,
                }),
                "uid",
            ),
            (
                SessionRequest::PortForward(PortForwardRequest {
                    uid: "u1".into(),
                    port: 0,
                }),
                "port",
            ),
        ] {
            let err = req.check().unwrap_err().to_string();
            assert!(err.contains(named), "{req:?}: {err}");
        }
    }

    #[tokio::test]
    async fn messages_round_trip_and_bad_streams_are_errors() {
        let mut buf = Vec::new();
        write_message(&mut buf, STDOUT, b"hello").await.unwrap();
        write_message(&mut buf, CLOSE, &[STDIN]).await.unwrap();
        let mut r = &buf[..];
        assert_eq!(
            read_message(&mut r).await.unwrap(),
            Some((STDOUT, b"hello".to_vec()))
        );
        assert_eq!(read_message(&mut r).await.unwrap(), Some((CLOSE, vec![0])));
        assert_eq!(read_message(&mut r).await.unwrap(), None);
        // Cut anywhere inside a message: an error, never a message or a panic.
        for cut in 1..buf.len() - 6 {
            let mut r = &buf[..cut];
            let first = read_message(&mut r).await;
            assert!(first.is_err(), "cut {cut}: {first:?}");
        }
        let mut huge = vec![STDIN];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(read_message(&mut &huge[..]).await.is_err());
    }

    #[test]
    fn statuses_are_what_kubectl_reads() {
        assert_eq!(exit_status(0)["status"], "Success");
        let failed = exit_status(3);
        assert_eq!(failed["reason"], "NonZeroExitCode");
        // client-go reads the cause's type from "reason" and the code with ParseUint(…, 8).
        assert_eq!(failed["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(failed["details"]["causes"][0]["message"], "3");
        assert_eq!(exit_status(300)["details"]["causes"][0]["message"], "255");
        assert_eq!(error_status("boom")["message"], "boom");
    }

    #[test]
    fn resizes_are_parsed_and_bounded() {
        assert_eq!(
            parse_resize(br#"{"Width":100,"Height":30}"#),
            Some((100, 30))
        );
        assert_eq!(parse_resize(br#"{"Width":0,"Height":30}"#), None);
        assert_eq!(parse_resize(br#"{"Width":70000,"Height":30}"#), None);
        assert_eq!(parse_resize(b"garbage"), None);
    }
}

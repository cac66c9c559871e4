//! `pods/exec`, `pods/attach` and `pods/portforward` over WebSockets, as kubectl ≥ 1.31
//! speaks them. exec and attach (`v5.channel.k8s.io`, and v4):
//! the request is checked like the apiserver checks it (pod, container, phase, running), a
//! session is opened with the node that runs the pod (`crate::session`), and only then is the
//! connection upgraded; WebSocket messages and session messages are relayed unchanged (both
//! use the channel numbers of the protocol). A session ends with the node's one `Status`
//! message and a Close frame with code 1000, which is what lets kubectl read the exit code.
//!
//! port-forward (`SPDY/3.1+portforward.k8s.io`) is `api::portforward`.
//!
//! kubectl falls back to SPDY (a POST) when the WebSocket upgrade is refused; that request
//! gets the same checks and the same `Status`, so the user sees the real reason.

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tracing::debug;

use super::ApiState;
use super::resources::ApiResource;
use super::status::ApiError;
use crate::kubelet::node_service::{SessionReader, SessionWriter};
use crate::session::{self, AttachRequest, ExecRequest, SessionRequest};

/// The subprotocols served, preferred first (v5 adds the close of stdin).
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// RFC 6455's key suffix.
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `PodExecOptions` from the query string (`command` repeats, one key per argument).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub container: Option<String>,
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl ExecOptions {
    /// `PodAttachOptions` (stdin and tty are checked against the container in [`serve`]).
    pub fn parse_attach(uri: &Uri) -> Result<Self, ApiError> {
        let mut options = Self::parse_pairs(uri)?;
        if !(options.stdout || options.stderr) {
            options.stdout = true;
            options.stderr = true;
        }
        Ok(options)
    }

    pub fn parse(uri: &Uri) -> Result<Self, ApiError> {
        let options = Self::parse_pairs(uri)?;
        // The apiserver's validation of PodExecOptions.
        if options.command.is_empty() {
            return Err(ApiError::bad_request("you must specify at least 1 command"));
        }
        if !(options.stdin || options.stdout || options.stderr) {
            return Err(ApiError::bad_request(
                "you must specify at least 1 of stdin, stdout, stderr",
            ));
        }
        Ok(options)
    }

    fn parse_pairs(uri: &Uri) -> Result<Self, ApiError> {
        let pairs = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?
            .0;
        let mut options = ExecOptions::default();
        for (key, value) in pairs {
            let flag = || match value.as_str() {
                "true" | "1" => Ok(true),
                "false" | "0" | "" => Ok(false),
                other => Err(ApiError::bad_request(format!(
                    "{key}: invalid value {other:?} (true or false)"
                ))),
            };
            match key.as_str() {
                "command" => options.command.push(value),
                "container" => options.container = Some(value),
                "stdin" => options.stdin = flag()?,
                "stdout" => options.stdout = flag()?,
                "stderr" => options.stderr = flag()?,
                "tty" => options.tty = flag()?,
                _ => {}
            }
        }
        if options.tty && options.stderr {
            // A terminal has one output stream (kubectl leaves stderr out with -t).
            options.stderr = false;
        }
        Ok(options)
    }
}

/// `PodPortForwardOptions.ports` (`?ports=80,8080` or repeated): empty for kubectl, which
/// names its ports per stream. At most 128, each 1–65535, none twice.
pub fn forward_ports(uri: &Uri) -> Result<Vec<u16>, ApiError> {
    let pairs = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
        .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?
        .0;
    let mut ports = Vec::new();
    for value in pairs.iter().filter(|(k, _)| k == "ports").map(|(_, v)| v) {
        for text in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let port = text.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "ports: {text:?} is not a valid port number (1-65535)"
                ))
            })?;
            if ports.contains(&port) {
                return Err(ApiError::bad_request(format!(
                    "ports: {port} is named twice"
                )));
            }
            ports.push(port);
        }
    }
    if ports.len() > 128 {
        return Err(ApiError::bad_request(format!(
            "ports: {} ports; at most 128 per connection",
            ports.len()
        )));
    }
    Ok(ports)
}

/// The subprotocol to answer with, from the client's offer.
pub fn choose_protocol(offered: &str) -> Option<&'static str> {
    let offered: Vec<&str> = offered.split(',').map(str::trim).collect();
    PROTOCOLS.into_iter().find(|p| offered.contains(p))
}

/// `Sec-WebSocket-Accept` for a client's key.
pub fn accept_key(key: &str) -> String {
    use base64::Engine as _;
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}{WEBSOCKET_GUID}").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// The container a pod's exec names (or its only one), as kubectl and the apiserver pick it.
pub fn pick_container(pod: &Value, wanted: Option<&str>, name: &str) -> Result<String, ApiError> {
    let containers: Vec<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|f| pod["spec"][f].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    match wanted {
        Some(c) if containers.contains(&c) => Ok(c.to_owned()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None => match pod["spec"]["containers"].as_array().map(Vec::len) {
            Some(1) => Ok(pod["spec"]["containers"][0]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()),
            _ => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            ))),
        },
    }
}

/// Whether `container` of the pod runs, from its observed status: `Ok` or the apiserver's
/// and kubelet's refusal.
pub fn check_running(
    pod: &Value,
    status: Option<&Value>,
    container: &str,
    name: &str,
) -> Result<String, ApiError> {
    let phase = status
        .and_then(|s| s["phase"].as_str())
        .unwrap_or("Pending");
    if matches!(phase, "Succeeded" | "Failed") {
        return Err(ApiError::bad_request(format!(
            "cannot exec into a container in a completed pod; current phase is {phase}"
        )));
    }
    let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    };
    let running = status.is_some_and(|s| {
        ["containerStatuses", "initContainerStatuses"]
            .iter()
            .flat_map(|f| s[f].as_array().into_iter().flatten())
            .any(|c| c["name"] == container && c["state"].get("running").is_some())
    });
    if !running {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: container {container} not found in pod {name} (it is not running)"
        )));
    }
    Ok(node.to_owned())
}

/// The subprotocol of `kubectl port-forward` (SPDY tunnelled in the WebSocket).
const PORT_FORWARD_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

/// Serves `pods/{name}/{exec|attach|portforward}`.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    state: &ApiState,
    resource: &ApiResource,
    namespace: Option<&str>,
    name: &str,
    sub: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    upgrade: Option<OnUpgrade>,
) -> Result<Response, ApiError> {
    if !matches!(*method, Method::GET | Method::POST) {
        return Err(ApiError::method_not_allowed(format!(
            "{method} is not allowed on pods/{sub}"
        )));
    }
    // The pod first (a missing one is 404 whatever the options), as the apiserver does.
    let pod = super::handlers::get_object(state, resource, namespace, name).await?;
    let exec = match sub {
        "exec" => Some(ExecOptions::parse(uri)?),
        "attach" => Some(ExecOptions::parse_attach(uri)?),
        _ => None,
    };
    let ports = if sub == "portforward" {
        forward_ports(uri)?
    } else {
        Vec::new()
    };
    let status = state.pod_statuses.status_of(&pod);
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let header = |h: header::HeaderName| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let offered = header(header::SEC_WEBSOCKET_PROTOCOL);
    // Checked as the apiserver and the kubelet check, before any upgrade, so the refusal
    // reaches kubectl as a Status (also through its SPDY fallback).
    let (node, protocol, request) = match exec {
        Some(options) => {
            let container = pick_container(&pod, options.container.as_deref(), name)?;
            let node = check_running(&pod, status.as_ref(), &container, name)?;
            let request = if sub == "attach" {
                let spec = ["initContainers", "containers"]
                    .iter()
                    .flat_map(|f| pod["spec"][f].as_array().into_iter().flatten())
                    .find(|c| c["name"] == container.as_str())
                    .cloned()
                    .unwrap_or_default();
                let enabled = |field: &str| spec[field].as_bool().unwrap_or(false);
                if options.stdin && !enabled("stdin") {
                    return Err(ApiError::bad_request(format!(
                        "container {container} of pod {name} was not created with stdin: true, so nothing can be sent to it: attach without -i (kubectl run -i sets it)"
                    )));
                }
                SessionRequest::Attach(AttachRequest {
                    uid: uid.clone(),
                    container,
                    stdout: options.stdout,
                    // A terminal has one output (kubectl leaves stderr out with -t); a tty
                    // asked of a container without one is only its output (kubectl warns).
                    stderr: options.stderr && !(options.tty && enabled("tty")),
                    stdin: options.stdin,
                    tty: options.tty && enabled("tty"),
                })
            } else {
                SessionRequest::Exec(ExecRequest {
                    uid: uid.clone(),
                    container,
                    command: options.command,
                    stdin: options.stdin,
                    stdout: options.stdout,
                    stderr: options.stderr,
                    tty: options.tty,
                })
            };
            (node, choose_protocol(&offered), Some(request))
        }
        None => {
            let phase = status
                .as_ref()
                .and_then(|s| s["phase"].as_str())
                .unwrap_or("Pending");
            let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
            if phase != "Running" || node.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "unable to forward port because pod is not running. Current status={phase}"
                )));
            }
            // kubectl: SPDY in the WebSocket; other clients: `?ports=` on channels.
            let protocol = if ports.is_empty() {
                offered
                    .split(',')
                    .map(str::trim)
                    .any(|p| p == PORT_FORWARD_PROTOCOL)
                    .then_some(PORT_FORWARD_PROTOCOL)
            } else {
                choose_protocol(&offered)
            };
            (node.to_owned(), protocol, None)
        }
    };
    let is_websocket = *method == Method::GET
        && header(header::UPGRADE).eq_ignore_ascii_case("websocket")
        && header(header::SEC_WEBSOCKET_VERSION) == "13";
    if !is_websocket {
        return Err(ApiError::bad_request(format!(
            "Shoal serves pods/{sub} over WebSockets only (what kubectl 1.31 and later use unless KUBECTL_REMOTE_COMMAND_WEBSOCKETS or KUBECTL_PORT_FORWARD_WEBSOCKETS is false), not SPDY"
        )));
    }
    let key = header(header::SEC_WEBSOCKET_KEY);
    if key.is_empty() {
        return Err(ApiError::bad_request("Sec-WebSocket-Key: required"));
    }
    let Some(protocol) = protocol else {
        let served = if sub == "exec" {
            PROTOCOLS.join(", ")
        } else {
            PORT_FORWARD_PROTOCOL.to_owned()
        };
        return Err(ApiError::bad_request(format!(
            "Sec-WebSocket-Protocol: none of {served} offered"
        )));
    };
    let Some(upgrade) = upgrade else {
        return Err(ApiError::bad_request("this connection cannot be upgraded"));
    };
    let pod_name = name.to_owned();
    match request {
        Some(request) => {
            let (to_node, from_node) =
                state
                    .logs
                    .open_session(&node, &request)
                    .await
                    .map_err(|e| {
                        ApiError::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "ServiceUnavailable",
                            format!("error dialing the node running pod {name}: {e}"),
                        )
                    })?;
            tokio::spawn(async move {
                if let Some(ws) = accept(upgrade, &pod_name).await {
                    relay(ws, to_node, from_node).await;
                }
            });
        }
        None => {
            let target = super::portforward::Target {
                nodes: state.logs.clone(),
                node,
                uid,
                name: pod_name.clone(),
            };
            tokio::spawn(async move {
                if let Some(ws) = accept(upgrade, &pod_name).await {
                    if ports.is_empty() {
                        super::portforward::relay(ws, target).await;
                    } else {
                        super::portforward::relay_channels(ws, target, ports).await;
                    }
                }
            });
        }
    }
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = response.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(protocol),
    );
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept_key(&key))
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
    );
    Ok(response)
}

/// The WebSocket once the 101 has gone out.
async fn accept(
    upgrade: OnUpgrade,
    pod: &str,
) -> Option<WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>> {
    match upgrade.await {
        Ok(upgraded) => {
            Some(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await)
        }
        Err(error) => {
            debug!(%pod, %error, "the upgrade did not complete");
            None
        }
    }
}

/// Relays until the node ends the session (then Close 1000) or the client leaves (then the
/// node's half is dropped, which ends the process there).
async fn relay<S>(mut ws: WebSocketStream<S>, mut to_node: SessionWriter, from_node: SessionReader)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // The node's messages arrive through a task, so a message half read is never dropped by
    // the select below; the WebSocket is read all the time (which also answers pings).
    let mut node_messages = session::spawn_reader(from_node);
    let mut status_sent = false;
    let mut writable = true;
    loop {
        tokio::select! {
            incoming = ws.next() => match incoming {
                // Text frames too: the Python client sends str data as text (the kubelet's
                // channel protocols take either).
                Some(Ok(message @ (Message::Binary(_) | Message::Text(_)))) => {
                    let bytes = message.into_data();
                    let Some((&channel, data)) = bytes.split_first() else { continue };
                    // A node that stopped reading still sends its Status: read on.
                    if writable && matches!(channel, session::STDIN | session::RESIZE | session::CLOSE) {
                        writable = session::write_message(&mut to_node, channel, data).await.is_ok();
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
            message = node_messages.recv() => match message {
                Some((channel, data)) => {
                    if channel == session::STATUS {
                        if status_sent {
                            continue;
                        }
                        status_sent = true;
                    }
                    let mut frame = Vec::with_capacity(data.len() + 1);
                    frame.push(channel);
                    frame.extend_from_slice(&data);
                    if ws.send(Message::Binary(frame.into())).await.is_err() {
                        return;
                    }
                }
                None => break,
            },
        }
    }
    drop(to_node);
    if !status_sent {
        let status = session::error_status("the session with the node ended early");
        let mut frame = vec![session::STATUS];
        frame.extend_from_slice(status.to_string().as_bytes());
        let _ = ws.send(Message::Binary(frame.into())).await;
    }
    // A normal close is what makes kubectl read the status to its end.
    let _ = ws
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(Ok(message)) = ws.next().await {
            if message.is_close() {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn uri(q: &str) -> Uri {
        format!("/api/v1/namespaces/default/pods/p/exec?{q}")
            .parse()
            .unwrap()
    }

    #[test]
    fn exec_options_are_parsed_like_the_apiserver() {
        let o = ExecOptions::parse(&uri(
            "command=sh&command=-c&command=echo+hi%20there&container=c&stderr=true&stdin=true&stdout=true",
        ))
        .unwrap();
        assert_eq!(o.command, ["sh", "-c", "echo hi there"]);
        assert_eq!(o.container.as_deref(), Some("c"));
        assert!(o.stdin && o.stdout && o.stderr && !o.tty);
        // kubectl -t leaves stderr out; a client asking for both gets one output stream.
        let tty = ExecOptions::parse(&uri("command=sh&stdout=true&stderr=true&tty=true")).unwrap();
        assert!(tty.tty && !tty.stderr);
        for (q, says) in [
            ("stdout=true", "at least 1 command"),
            ("command=ls", "at least 1 of stdin"),
            ("command=ls&stdout=maybe", "stdout"),
        ] {
            let err = ExecOptions::parse(&uri(q)).unwrap_err();
            assert!(err.message.contains(says), "{q}: {}", err.message);
        }
    }

    #[test]
    fn forwarded_ports_are_checked() {
        let uri = |q: &str| -> Uri {
            format!("/api/v1/namespaces/d/pods/p/portforward?{q}")
                .parse()
                .unwrap()
        };
        assert_eq!(forward_ports(&uri("ports=80,8080")).unwrap(), [80, 8080]);
        assert_eq!(forward_ports(&uri("ports=80&ports=81")).unwrap(), [80, 81]);
        assert!(forward_ports(&uri("")).unwrap().is_empty());
        for bad in ["ports=0", "ports=70000", "ports=http", "ports=80,80"] {
            assert!(forward_ports(&uri(bad)).is_err(), "{bad}");
        }
        let many: Vec<String> = (1..=129).map(|p| p.to_string()).collect();
        assert!(forward_ports(&uri(&format!("ports={}", many.join(",")))).is_err());
    }

    #[test]
    fn the_subprotocol_and_accept_key_are_the_rfcs() {
        assert_eq!(
            choose_protocol("v4.channel.k8s.io, v5.channel.k8s.io"),
            Some("v5.channel.k8s.io")
        );
        assert_eq!(
            choose_protocol("v4.channel.k8s.io"),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(choose_protocol("channel.k8s.io"), None);
        // RFC 6455 §1.3's example.
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn the_container_must_exist_and_run() {
        let pod = json!({"spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(pick_container(&pod, Some("b"), "p").unwrap(), "b");
        assert!(
            pick_container(&pod, None, "p")
                .unwrap_err()
                .message
                .contains("choose one of: [a b]")
        );
        assert!(pick_container(&pod, Some("z"), "p").is_err());
        let running = json!({"phase": "Running", "containerStatuses": [
            {"name": "a", "state": {"running": {}}}, {"name": "b", "state": {"waiting": {}}}]});
        assert_eq!(check_running(&pod, Some(&running), "a", "p").unwrap(), "n1");
        assert!(
            check_running(&pod, Some(&running), "b", "p")
                .unwrap_err()
                .message
                .contains("not running")
        );
        let done = json!({"phase": "Succeeded"});
        assert!(
            check_running(&pod, Some(&done), "a", "p")
                .unwrap_err()
                .message
                .contains("completed pod")
        );
        let unbound = json!({"spec": {"containers": [{"name": "a"}]}});
        assert!(check_running(&unbound, Some(&running), "a", "p").is_err());
    }
}

//! `kubectl port-forward` (1.37): SPDY/3.1 streams tunnelled in a WebSocket
//! (`SPDY/3.1+portforward.k8s.io`). Each local connection kubectl accepts becomes a request id
//! with two streams, `error` and `data`; once both exist, a session with the pod's node
//! (`crate::session`, `PortForward`) connects to the port inside the pod and the data stream
//! is relayed both ways. An error (nothing listens, say) is written on the error stream, as the
//! kubelet writes it, and kubectl prints it.
//!
//! The connection's loop owns the WebSocket and the SPDY state; each forwarded connection is a
//! task that talks to it through queues, so one slow connection never holds the frames of
//! another in a half-read state.
//!
//! Other clients (the official Python client's `portforward`) speak the kubelet's older
//! channel protocol instead ([`relay_channels`]): `?ports=A,B` over `v4`/`v5.channel.k8s.io`,
//! one connection per port for the WebSocket's life, on channels `2i` (data) and `2i+1`
//! (error), each opened by a frame holding the port (little-endian u16).

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tracing::debug;

use super::spdy::{self, Frame, Writer};
use crate::kubelet::node_service::NodeService;
use crate::session::{self, PortForwardRequest, SessionRequest};

/// The pod a connection forwards to.
#[derive(Clone)]
pub struct Target {
    pub nodes: Arc<NodeService>,
    pub node: String,
    pub uid: String,
    pub name: String,
}

/// What a forwarded connection's task hears from the client.
enum FromClient {
    Data(Vec<u8>),
    End,
}

/// One request id's streams.
#[derive(Default)]
struct Pair {
    port: u16,
    error: Option<u32>,
    data: Option<u32>,
    /// The task's queue once both streams exist (bytes that came before wait in `early`).
    task: Option<mpsc::Sender<FromClient>>,
    early: Vec<FromClient>,
}

/// Serves one port-forward connection until the client closes it.
pub async fn relay<S>(mut ws: WebSocketStream<S>, target: Target)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut reader = spdy::Reader::new();
    let mut writer = Writer::default();
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    // Frames the tasks want sent.
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(64);
    'connection: loop {
        tokio::select! {
            incoming = ws.next() => match incoming {
                Some(Ok(Message::Binary(bytes))) => {
                    reader.push(&bytes);
                    loop {
                        let frame = match reader.next_frame() {
                            Ok(Some(frame)) => frame,
                            Ok(None) => break,
                            Err(error) => {
                                debug!(pod = %target.name, %error, "port-forward: bad SPDY; closing");
                                break 'connection;
                            }
                        };
                        let mut replies = Vec::new();
                        handle(frame, &target, &mut writer, &mut pairs, &out_tx, &mut replies).await;
                        for reply in replies {
                            if ws.send(Message::Binary(reply.into())).await.is_err() {
                                break 'connection;
                            }
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
            Some(frame) = out_rx.recv() => {
                if ws.send(Message::Binary(frame.into())).await.is_err() {
                    break;
                }
            }
        }
    }
    // Dropping the pairs' queues ends their tasks and with them the node sessions.
    drop(pairs);
    let _ = ws
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
}

/// Serves the channel protocol: one connection to each of `ports`, relayed until all of them
/// end (then the WebSocket is closed, as the kubelet closes it) or the client leaves.
pub async fn relay_channels<S>(mut ws: WebSocketStream<S>, target: Target, ports: Vec<u16>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(64);
    let mut to_ports = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        // Channel numbers are one byte: at most 128 ports (checked by the caller).
        let data = (2 * i) as u8;
        for channel in [data, data + 1] {
            let mut opening = vec![channel];
            opening.extend_from_slice(&port.to_le_bytes());
            if ws.send(Message::Binary(opening.into())).await.is_err() {
                return;
            }
        }
        let (tx, rx) = mpsc::channel(64);
        to_ports.push(Some(tx));
        tokio::spawn(forward_channel(
            target.clone(),
            *port,
            data,
            rx,
            out_tx.clone(),
        ));
    }
    drop(out_tx);
    loop {
        tokio::select! {
            incoming = ws.next() => match incoming {
                // Text frames too: the Python client sends str data as text (the kubelet's
                // channel protocols take either).
                Some(Ok(message @ (Message::Binary(_) | Message::Text(_)))) => {
                    let bytes = message.into_data();
                    let Some((&channel, data)) = bytes.split_first() else { continue };
                    let message = if channel == session::CLOSE {
                        // v5: [255, channel] closes the client's side of that channel.
                        data.first().filter(|c| *c % 2 == 0).map(|c| (usize::from(*c / 2), FromClient::End))
                    } else if channel % 2 == 0 {
                        Some((usize::from(channel / 2), FromClient::Data(data.to_vec())))
                    } else {
                        None
                    };
                    if let Some((i, message)) = message
                        && let Some(Some(tx)) = to_ports.get(i)
                        && tx.send(message).await.is_err()
                    {
                        to_ports[i] = None;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
            frame = out_rx.recv() => match frame {
                Some(frame) => {
                    if ws.send(Message::Binary(frame.into())).await.is_err() {
                        return;
                    }
                }
                // Every port's connection has ended.
                None => break,
            },
        }
    }
    let _ = ws
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
}

/// One port of the channel protocol: a session with the pod's node, its bytes on channel
/// `data` and its error's text on `data + 1`.
async fn forward_channel(
    target: Target,
    port: u16,
    data: u8,
    mut from_client: mpsc::Receiver<FromClient>,
    out: mpsc::Sender<Vec<u8>>,
) {
    let framed = |channel: u8, bytes: &[u8]| {
        let mut frame = Vec::with_capacity(bytes.len() + 1);
        frame.push(channel);
        frame.extend_from_slice(bytes);
        frame
    };
    let ended = relay_port(&target, port, &mut from_client, &out, |b| framed(data, b)).await;
    if let Ended::Pod(Some(error)) = ended {
        let _ = out.send(framed(data + 1, error.as_bytes())).await;
    }
}

/// How a forwarded connection ended.
enum Ended {
    /// The client reset it or closed the connection: nothing more goes out.
    Client,
    /// The pod's side ended, with the error's text if it failed.
    Pod(Option<String>),
}

/// One forwarded connection, whatever the protocol: a session with the pod's node (which dials
/// the port inside the pod), the client's bytes to it, and the pod's to `out`, each chunk
/// framed by `frame`. A node that stopped reading (it failed to dial, say) still says why:
/// its messages are read to their end.
async fn relay_port(
    target: &Target,
    port: u16,
    from_client: &mut mpsc::Receiver<FromClient>,
    out: &mpsc::Sender<Vec<u8>>,
    frame: impl Fn(&[u8]) -> Vec<u8>,
) -> Ended {
    let request = SessionRequest::PortForward(PortForwardRequest {
        uid: target.uid.clone(),
        port,
    });
    let failure = match target.nodes.open_session(&target.node, &request).await {
        Err(e) => Some(e.to_string()),
        Ok((mut to_node, from_node)) => {
            let mut node_messages = session::spawn_reader(from_node);
            let mut failure = None;
            let mut writable = true;
            loop {
                tokio::select! {
                    message = from_client.recv() => match message {
                        Some(FromClient::Data(bytes)) if writable => {
                            writable = session::write_message(&mut to_node, session::STDIN, &bytes).await.is_ok();
                        }
                        Some(FromClient::End) if writable => {
                            writable = session::write_message(&mut to_node, session::CLOSE, &[session::STDIN]).await.is_ok();
                        }
                        Some(_) => {}
                        None => return Ended::Client,
                    },
                    message = node_messages.recv() => match message {
                        Some((session::STDOUT, bytes)) => {
                            if out.send(frame(&bytes)).await.is_err() {
                                return Ended::Client;
                            }
                        }
                        Some((session::STATUS, text)) => {
                            failure = Some(String::from_utf8_lossy(&text).into_owned());
                        }
                        Some(_) => {}
                        None => break,
                    },
                }
            }
            failure
        }
    };
    Ended::Pod(failure.map(|error| {
        format!(
            "error forwarding port {port} to pod {}, uid {}: {error}",
            target.name, target.uid
        )
    }))
}

/// Acts on one client frame; `replies` are sent at once, in order.
async fn handle(
    frame: Frame,
    target: &Target,
    writer: &mut Writer,
    pairs: &mut HashMap<String, Pair>,
    out: &mpsc::Sender<Vec<u8>>,
    replies: &mut Vec<Vec<u8>>,
) {
    match frame {
        Frame::SynStream { id, headers, .. } => {
            let get = |name: &str| {
                headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.as_str())
            };
            let port = get("port")
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|p| *p > 0);
            let (Some(kind), Some(port), Some(request)) =
                (get("streamtype"), port, get("requestid"))
            else {
                debug!(pod = %target.name, ?headers, "port-forward: a stream without streamtype, port or requestid");
                replies.push(Writer::rst_stream(id, spdy::REFUSED_STREAM));
                return;
            };
            replies.push(writer.syn_reply(id));
            let pair = pairs.entry(request.to_owned()).or_default();
            pair.port = port;
            match kind {
                "error" => pair.error = Some(id),
                "data" => pair.data = Some(id),
                _ => {
                    replies.push(Writer::rst_stream(id, spdy::REFUSED_STREAM));
                    return;
                }
            }
            if let (Some(error), Some(data), None) = (pair.error, pair.data, &pair.task) {
                let (tx, rx) = mpsc::channel(64);
                for early in pair.early.drain(..) {
                    let _ = tx.try_send(early);
                }
                pair.task = Some(tx);
                tokio::spawn(forward(
                    target.clone(),
                    pair.port,
                    error,
                    data,
                    rx,
                    out.clone(),
                ));
            }
        }
        Frame::Data { id, fin, data } => {
            // Only the data streams carry bytes (the client just half-closes error streams).
            let Some(pair) = pairs.values_mut().find(|p| p.data == Some(id)) else {
                return;
            };
            let mut messages = Vec::new();
            if !data.is_empty() {
                messages.push(FromClient::Data(data));
            }
            if fin {
                messages.push(FromClient::End);
            }
            match &pair.task {
                Some(tx) => {
                    let tx = tx.clone();
                    for message in messages {
                        let _ = tx.send(message).await;
                    }
                }
                // kubectl opens the error stream first; a client that sends much before it
                // does is not waited for.
                None if pair.early.len() < 64 => pair.early.extend(messages),
                None => replies.push(Writer::rst_stream(id, spdy::REFUSED_STREAM)),
            }
        }
        Frame::RstStream { id, .. } => {
            // The client gave the connection up: its task (and node session) goes.
            pairs.retain(|_, p| p.data != Some(id) && p.error != Some(id));
        }
        Frame::Ping(id) => replies.push(Writer::ping(id)),
        Frame::GoAway | Frame::Ignored => {}
    }
}

/// One kubectl connection: relayed on its data stream, its error (if any) on its error
/// stream, then both streams finished.
async fn forward(
    target: Target,
    port: u16,
    error_stream: u32,
    data_stream: u32,
    mut from_client: mpsc::Receiver<FromClient>,
    out: mpsc::Sender<Vec<u8>>,
) {
    let ended = relay_port(&target, port, &mut from_client, &out, |b| {
        Writer::data(data_stream, false, b)
    })
    .await;
    let Ended::Pod(failure) = ended else {
        return;
    };
    if let Some(error) = failure {
        let _ = out
            .send(Writer::data(error_stream, false, error.as_bytes()))
            .await;
    }
    // kubectl reads the error stream to its end before it closes the local connection.
    let _ = out.send(Writer::data(data_stream, true, &[])).await;
    let _ = out.send(Writer::data(error_stream, true, &[])).await;
}

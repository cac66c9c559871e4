//! Client of the local control API (a Unix socket in the data dir).

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

use crate::control::SelfInfo;
use crate::paths;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach the agent at {socket}: {source} (is `shoal agent` running with this data dir?)"
    )]
    Connect {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("request {path} to {socket} failed: {message}")]
    Http {
        socket: PathBuf,
        path: String,
        message: String,
    },
    #[error("agent answered {path} with {status}: {body}")]
    Status {
        path: String,
        status: u16,
        body: String,
    },
    #[error("agent answered {path} with an unreadable body: {source}")]
    Decode {
        path: String,
        source: serde_json::Error,
    },
}

/// Talks to the agent that owns a data dir.
#[derive(Debug, Clone)]
pub struct ControlClient {
    socket: PathBuf,
}

impl ControlClient {
    pub fn for_data_dir(data_dir: &Path) -> Self {
        Self {
            socket: paths::control_socket(data_dir),
        }
    }

    pub async fn self_info(&self) -> Result<SelfInfo, ClientError> {
        self.get_json("/v1/self").await
    }

    pub async fn members(&self) -> Result<Vec<shoal_gossip::Member>, ClientError> {
        self.get_json("/v1/members").await
    }

    pub async fn store_info(&self) -> Result<crate::control::StoreInfo, ClientError> {
        self.get_json("/v1/store").await
    }

    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let (status, body) = self.send(hyper::Method::GET, path, None).await?;
        if !(200..300).contains(&status) {
            return Err(ClientError::Status {
                path: path.to_owned(),
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        serde_json::from_slice(&body).map_err(|source| ClientError::Decode {
            path: path.to_owned(),
            source,
        })
    }

    /// Follows `/v1/watch`: each committed change's JSON line goes to the returned channel
    /// as soon as its bytes arrive, with the instant they did.
    pub async fn watch(
        &self,
    ) -> Result<
        tokio::sync::mpsc::UnboundedReceiver<(std::time::Instant, serde_json::Value)>,
        ClientError,
    > {
        let mut body = self
            .request(hyper::Method::GET, "/v1/watch", None)
            .await?
            .into_body();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut buf: Vec<u8> = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let at = std::time::Instant::now();
                buf.extend_from_slice(&data);
                while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=end).collect();
                    if let Ok(value) = serde_json::from_slice(&line)
                        && tx.send((at, value)).is_err()
                    {
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }

    /// Sends one request on a fresh connection to the socket.
    async fn request(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let http = |message: String| ClientError::Http {
            socket: self.socket.clone(),
            path: path.to_owned(),
            message,
        };
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| ClientError::Connect {
                socket: self.socket.clone(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| http(e.to_string()))?;
        tokio::spawn(conn);
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| http(e.to_string()))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| http(e.to_string()))
    }

    /// One HTTP request; returns the status and body whatever the status.
    pub async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), ClientError> {
        let response = self.request(method, path, body).await?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Http {
                socket: self.socket.clone(),
                path: path.to_owned(),
                message: e.to_string(),
            })?
            .to_bytes();
        Ok((status, body))
    }
}

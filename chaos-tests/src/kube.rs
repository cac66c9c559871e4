//! A Kubernetes API client for the lab's agents, as kubectl would be one on the node: HTTPS to
//! the agent's API, the server verified against the cluster CA, the cluster's bearer token.
//! The lab's namespaces have no route from this process's, so each request opens its TCP
//! connection from a short-lived thread that entered the node's network namespace (a socket
//! keeps the namespace it was made in); the thread ends right after, so no other work runs in a
//! namespace it did not ask for.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

/// How a request failed before an answer came.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// No connection: nothing was sent.
    #[error("connecting to {addr} in {netns}: {source}")]
    Connect {
        netns: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The request may have been sent.
    #[error("{method} {path} on {addr}: {message}")]
    Http {
        method: hyper::Method,
        path: String,
        addr: SocketAddr,
        message: String,
    },
}

/// One agent's Kubernetes API.
#[derive(Clone)]
pub struct KubeClient {
    netns: String,
    addr: SocketAddr,
    token: String,
    tls: tokio_rustls::TlsConnector,
}

impl KubeClient {
    /// The API at `addr` inside network namespace `netns` (`""`: this process's own), for the
    /// cluster of `identity`.
    pub fn new(
        netns: &str,
        addr: SocketAddr,
        identity: &shoal_gossip::ClusterIdentity,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            netns: netns.to_owned(),
            addr,
            token: identity.api_token().to_owned(),
            tls: tokio_rustls::TlsConnector::from(Arc::new(identity.api_client_config()?)),
        })
    }

    /// One request on a fresh connection; the status and body, whatever the status.
    pub async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        content_type: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), KubeError> {
        let http = |message: String| KubeError::Http {
            method: method.clone(),
            path: path.to_owned(),
            addr: self.addr,
            message,
        };
        let connect = |source| KubeError::Connect {
            netns: self.netns.clone(),
            addr: self.addr,
            source,
        };
        let (netns, addr) = (self.netns.clone(), self.addr);
        let tcp = tokio::task::spawn_blocking(move || connect_in(&netns, addr))
            .await
            .map_err(|e| connect(std::io::Error::other(e.to_string())))?
            .map_err(connect)?;
        let tcp = tokio::net::TcpStream::from_std(tcp).map_err(connect)?;
        let tls = self
            .tls
            .connect(ServerName::IpAddress(self.addr.ip().into()), tcp)
            .await
            .map_err(connect)?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| http(e.to_string()))?;
        tokio::spawn(conn);
        let request = hyper::Request::builder()
            .method(method.clone())
            .uri(path)
            .header(hyper::header::HOST, self.addr.to_string())
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(hyper::header::CONTENT_TYPE, content_type)
            .header(hyper::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| http(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| http(e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| http(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    }
}

/// A TCP connection to `addr` made inside network namespace `netns` (`/run/netns/<netns>`),
/// from a thread of its own that ends once the socket exists; `""` connects from here.
fn connect_in(netns: &str, addr: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    if netns.is_empty() {
        let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        stream.set_nonblocking(true)?;
        return Ok(stream);
    }
    let path = std::path::Path::new("/run/netns").join(netns);
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = std::fs::File::open(&path)?;
                nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
                stream.set_nonblocking(true)?;
                Ok(stream)
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the connecting thread panicked")))
    })
}

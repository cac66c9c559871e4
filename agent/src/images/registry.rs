//! Pulling an image from an OCI distribution registry into the store (issue #38).
//!
//! The distribution API's manifest and blob endpoints over HTTP/1.1 (hyper's client
//! connection and rustls with ring, both already in the tree: the `oci-client` crate would
//! bring reqwest, a second base64 and aws-lc), anonymous pulls, OCI and Docker schema 2
//! manifests, image indexes and manifest lists (the entry for this node's platform: linux, its
//! architecture, and its variant where one is named; a clear error listing what the index has
//! otherwise), tags and digests, redirects to another host (registries hand blobs to storage),
//! and every manifest and blob verified against its digest and size while it streams, before
//! it enters the store. Bodies are bounded (a manifest or index by [`MAX_MANIFEST_BYTES`], a
//! blob by the size its descriptor states) and so is waiting ([`IDLE`] per read, connects).
//!
//! HTTPS by default, verified against the system's roots (`/etc/ssl/certs`) and the CA files
//! given. A registry on a loopback address (as Docker and containerd allow) or named insecure
//! is tried over HTTPS first and over plain HTTP when it does not speak TLS (a certificate
//! that fails verification is an error, never a reason to fall back).
//!
//! Authentication as the distribution API asks for it (`super::auth`): a `401` with a
//! `Basic` challenge is answered with credentials, a `Bearer` challenge with a token fetched
//! from its realm (with the credentials, if any, as Basic; anonymously otherwise, as Docker
//! Hub's public images need). The authorization is sent only to the host that asked for it
//! (never along a redirect to another host, such as a blob store). Credentials come from the
//! pod's `imagePullSecrets` first, then the node's registry config, each matching entry tried
//! in turn; anonymous when none matches.
//!
//! A registry may have mirrors (`--registry-config`): each is tried first, in order, and the
//! registry itself when none has the image.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use oci_spec::image::{ImageIndex, ImageManifest};
use rustls::pki_types::pem::PemObject as _;
use sha2::Digest as _;
use std::io::Write as _;

use super::auth::{self, Challenge, Credentials};
use super::progress::Progress;
use super::reference::{Reference, ReferenceError};
use super::{ImageError, ImageStore};

/// The largest manifest or index accepted (distribution's own limit is 4 MiB).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 5;
/// The longest wait for a connection, a response or the next bytes of a body.
pub const IDLE: Duration = Duration::from_secs(30);
/// The slowest a body may come on average (a registry that drips a byte every few seconds
/// would otherwise hold a pull forever): a body of N bytes gets `IDLE + N / MIN_RATE`.
pub const MIN_RATE: u64 = 16 << 10;

/// The time a body of `bytes` may take ([`MIN_RATE`]).
fn body_deadline(bytes: u64) -> Duration {
    IDLE + Duration::from_secs(bytes / MIN_RATE)
}
/// Where Linux distributions keep the system's CA bundle (the first that exists is read).
const SYSTEM_ROOTS: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// Why a pull from a registry failed; each names the image, registry or URL concerned.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error(
        "{host}: not fetched over plain HTTP (only registries on loopback addresses or named \
         with --insecure-registry are)"
    )]
    PlainHttp { host: String },
    #[error("{url}: TLS: {message}")]
    Tls { url: String, message: String },
    #[error("{url}: does not speak TLS: {message}")]
    NotTls { url: String, message: String },
    #[error("CA file {path}: {message}")]
    Ca { path: PathBuf, message: String },
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("{url}: the registry answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: unauthorized ({who}): {detail}")]
    Unauthorized {
        url: String,
        /// `anonymously` or `as "user"`.
        who: String,
        detail: String,
    },
    #[error("registry config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{url}: more than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error("{url}: received {got}, the reference or descriptor says {expected}")]
    Digest {
        url: String,
        got: String,
        expected: String,
    },
    #[error("{url}: {size} bytes received, the descriptor says {expected}")]
    Size {
        url: String,
        size: u64,
        expected: u64,
    },
    #[error("{url}: not a manifest or index: {reason}")]
    Manifest { url: String, reason: String },
    #[error("{image}: no manifest for linux/{arch} in its index (it has: {available})")]
    Platform {
        image: String,
        arch: String,
        available: String,
    },
    #[error(transparent)]
    Store(#[from] ImageError),
    #[error("receiving a blob: {0}")]
    Io(#[from] std::io::Error),
}

/// Which registries may be pulled from over plain HTTP: those on loopback addresses (as
/// Docker and containerd allow) and those listed.
#[derive(Debug, Clone, Default)]
pub struct Registries {
    /// Which registries a node pulls from at all.
    pub pulls: RegistryPulls,
    /// `host` or `host:port`, as the image reference names the registry.
    pub insecure: Vec<String>,
    /// CA certificates (PEM) trusted besides the system's, for registries with their own CA.
    pub ca_files: Vec<PathBuf>,
    /// Per registry, keyed by its domain as image names write it (`docker.io`, `reg:5000`):
    /// mirrors, CA files, credentials (`--registry-config`).
    pub hosts: BTreeMap<String, HostConfig>,
    /// The entries of a docker config file (`docker-config` in the registry config): tried
    /// for any registry their keys match, after the pod's `imagePullSecrets`.
    pub docker_config: Vec<auth::Entry>,
    /// The files credentials were read from (the registry config, its docker config): no pod
    /// may mount them.
    pub credential_files: Vec<PathBuf>,
}

/// What the registry config says about one registry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostConfig {
    /// Registries (`host[:port]`) asked first, in order, for this registry's images.
    pub mirrors: Vec<String>,
    /// Pulled from over plain HTTP too (as `--insecure-registry`).
    pub insecure: bool,
    /// CA certificates trusted for this registry only.
    pub ca_files: Vec<PathBuf>,
    pub credentials: Option<Credentials>,
}

/// The registry config file (TOML), as README documents it.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct ConfigFile {
    /// A docker config (`~/.docker/config.json`, as `docker login` writes it).
    docker_config: Option<PathBuf>,
    #[serde(default)]
    registry: BTreeMap<String, HostFile>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct HostFile {
    #[serde(default)]
    mirrors: Vec<String>,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    ca: Vec<PathBuf>,
    username: Option<String>,
    password: Option<String>,
}

/// The largest registry config or docker config file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Whether `host` reads as a registry as image names write it (`host`, `host:port`): no
/// scheme, no path, no spaces.
fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
}

fn read_bounded_file(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!("larger than {MAX_CONFIG_BYTES} bytes"));
    }
    Ok(bytes)
}

/// Which registries a node pulls images from when no peer has them (`--registry-pulls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RegistryPulls {
    /// Any registry (as a kubelet does).
    #[default]
    All,
    /// Only registries on loopback addresses and those named with `--insecure-registry`: a
    /// node that must not reach out (an air-gapped site, the test suite).
    Local,
    /// None: images come from `shoal image import` and from peers.
    None,
}

impl Registries {
    /// Reads the registry config file at `path` into `self` (README's "Registries" section):
    /// an error names the file and the entry.
    pub fn load_config(&mut self, path: &Path) -> Result<(), RegistryError> {
        let err = |message: String| RegistryError::Config {
            path: path.to_owned(),
            message,
        };
        let text = String::from_utf8(read_bounded_file(path).map_err(&err)?)
            .map_err(|_| err("not UTF-8".into()))?;
        let file: ConfigFile = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
        for (host, entry) in file.registry {
            if !valid_host(&host) {
                return Err(err(format!(
                    "registry {host:?}: a registry is named as images name it (host or host:port)"
                )));
            }
            if let Some(bad) = entry.mirrors.iter().find(|m| !valid_host(m)) {
                return Err(err(format!(
                    "registry {host:?}: mirror {bad:?} is not a host or host:port"
                )));
            }
            let credentials = match (entry.username, entry.password) {
                (Some(username), Some(password)) => Some(Credentials { username, password }),
                (None, None) => None,
                _ => {
                    return Err(err(format!(
                        "registry {host:?}: username and password go together"
                    )));
                }
            };
            self.hosts.insert(
                host,
                HostConfig {
                    mirrors: entry.mirrors,
                    insecure: entry.insecure,
                    ca_files: entry.ca,
                    credentials,
                },
            );
        }
        self.credential_files.push(path.to_owned());
        if let Some(docker) = file.docker_config {
            self.credential_files.push(docker.clone());
            let bytes = read_bounded_file(&docker)
                .map_err(|e| err(format!("docker-config {}: {e}", docker.display())))?;
            self.docker_config = auth::parse_docker_config(&bytes, auth::ConfigFormat::Json)
                .map_err(|e| err(format!("docker-config {}: {e}", docker.display())))?;
        }
        Ok(())
    }

    /// The credentials to try for `image` when pulled from `host` (the registry itself or one
    /// of its mirrors), best first: the pod's pull secrets, then the registry config's entry
    /// for `host`, then the node's docker config. Empty: pull anonymously.
    fn credentials_for(
        &self,
        image: &Reference,
        host: &str,
        secrets: &[auth::Entry],
    ) -> Vec<Credentials> {
        let at_host = Reference {
            domain: host.to_owned(),
            ..image.clone()
        };
        // A mirror is matched by its own name; Docker Hub's API host by Hub's keys.
        let named = if host == image.api_host() {
            image
        } else {
            &at_host
        };
        let mut found: Vec<Credentials> = Vec::new();
        let config = self
            .hosts
            .get(&named.domain)
            .and_then(|h| h.credentials.as_ref());
        for c in auth::lookup(secrets, named)
            .into_iter()
            .chain(config)
            .chain(auth::lookup(&self.docker_config, named))
        {
            if !found.contains(c) {
                found.push(c.clone());
            }
        }
        found
    }

    /// Whether this node pulls from the registry at `host` ([`RegistryPulls`]).
    pub fn pulls_from(&self, host: &str) -> bool {
        match self.pulls {
            RegistryPulls::All => true,
            RegistryPulls::Local => self.plain_http(host),
            RegistryPulls::None => false,
        }
    }

    /// The TLS client: the system's roots, [`Registries::ca_files`] and `extra` (a registry's
    /// own), ring, HTTP/1.1.
    fn tls(&self, extra: &[PathBuf]) -> Result<tokio_rustls::TlsConnector, RegistryError> {
        let mut roots = rustls::RootCertStore::empty();
        let system = SYSTEM_ROOTS
            .iter()
            .find(|p| std::path::Path::new(p).exists());
        let files = system
            .map(PathBuf::from)
            .into_iter()
            .chain(self.ca_files.clone())
            .chain(extra.iter().cloned());
        for (i, path) in files.enumerate() {
            let ca = |message: String| RegistryError::Ca {
                path: path.clone(),
                message,
            };
            let pem = std::fs::read(&path).map_err(|e| ca(e.to_string()))?;
            let mut added = 0;
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| ca(e.to_string()))?;
                // The system bundle may hold certificates rustls cannot use: skipped there,
                // refused in a file given for a registry.
                match roots.add(cert) {
                    Ok(()) => added += 1,
                    Err(e) if i > 0 || system.is_none() => return Err(ca(e.to_string())),
                    Err(_) => {}
                }
            }
            if added == 0 && (i > 0 || system.is_none()) {
                return Err(ca("no certificate in it".into()));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| RegistryError::Ca {
                path: PathBuf::new(),
                message: e.to_string(),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
    }

    /// Whether this node may fetch from `host` over plain HTTP.
    fn plain_http(&self, host: &str) -> bool {
        let name = match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        name == "localhost"
            || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
            || self.insecure.iter().any(|h| h == host || h == name)
            || [host, name]
                .iter()
                .any(|h| self.hosts.get(*h).is_some_and(|c| c.insecure))
    }
}

/// An `http(s)://host[:port]/path` URL, split.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Url {
    https: bool,
    host: String,
    port: u16,
    path: String,
}

impl Url {
    fn parse(text: &str) -> Result<Self, RegistryError> {
        let err = |message: &str| RegistryError::Http {
            url: text.to_owned(),
            message: message.to_owned(),
        };
        let (https, rest) = match text.split_once("://") {
            Some(("http", rest)) => (false, rest),
            Some(("https", rest)) => (true, rest),
            _ => return Err(err("not an http or https URL")),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let default_port = if https { 443 } else { 80 };
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => {
                (host, port.parse().map_err(|_| err("bad port"))?)
            }
            _ => (authority, default_port),
        };
        if host.is_empty() || authority.contains('@') {
            return Err(err("bad host"));
        }
        Ok(Url {
            https,
            host: host.to_owned(),
            port,
            path: path.to_owned(),
        })
    }

    fn authority(&self) -> String {
        if self.port == if self.https { 443 } else { 80 } {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    fn text(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority(), self.path)
    }
}

/// What a request asks beside its URL.
#[derive(Debug, Clone, Copy, Default)]
struct Ask<'a> {
    accept: Option<&'a str>,
    /// A HEAD, not a GET.
    head: bool,
    /// The body from this offset on (`Range: bytes=N-`).
    from: Option<u64>,
}

/// Sends a GET (a HEAD with `head`) on an open connection.
async fn send<T>(
    io: T,
    url: &Url,
    ask: Ask<'_>,
    authorization: Option<&str>,
) -> Result<hyper::Response<hyper::body::Incoming>, RegistryError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let http = |message: String| RegistryError::Http {
        url: url.text(),
        message,
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| http(e.to_string()))?;
    tokio::spawn(conn);
    let mut request = hyper::Request::builder()
        .method(if ask.head {
            hyper::Method::HEAD
        } else {
            hyper::Method::GET
        })
        .uri(&url.path)
        .header(hyper::header::HOST, url.authority())
        .header(hyper::header::USER_AGENT, "shoal");
    if let Some(accept) = ask.accept {
        request = request.header(hyper::header::ACCEPT, accept);
    }
    if let Some(from) = ask.from {
        request = request.header(hyper::header::RANGE, format!("bytes={from}-"));
    }
    if let Some(authorization) = authorization {
        request = request.header(hyper::header::AUTHORIZATION, authorization);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(e.to_string()))?;
    tokio::time::timeout(IDLE, sender.send_request(request))
        .await
        .map_err(|_| http(format!("no response in {IDLE:?}")))?
        .map_err(|e| http(e.to_string()))
}

/// Opens a connection to `url` (TLS for https) and sends a GET (HEAD with `head`).
async fn open(
    url: &Url,
    accept: Ask<'_>,
    authorization: Option<&str>,
    registries: &Registries,
    tls: &tokio_rustls::TlsConnector,
) -> Result<hyper::Response<hyper::body::Incoming>, RegistryError> {
    let text = url.text();
    if !url.https && !registries.plain_http(&url.authority()) {
        return Err(RegistryError::PlainHttp {
            host: url.authority(),
        });
    }
    let http = |message: String| RegistryError::Http {
        url: text.clone(),
        message,
    };
    let host = url.host.trim_start_matches('[').trim_end_matches(']');
    let stream = tokio::time::timeout(IDLE, tokio::net::TcpStream::connect((host, url.port)))
        .await
        .map_err(|_| http(format!("no connection in {IDLE:?}")))?
        .map_err(|e| http(format!("connect: {e}")))?;
    if !url.https {
        return send(stream, url, accept, authorization).await;
    }
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| http(format!("server name: {e}")))?;
    let stream = match tokio::time::timeout(IDLE, tls.connect(name, stream)).await {
        Err(_) => return Err(http(format!("no TLS handshake in {IDLE:?}"))),
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            let message = e.to_string();
            // A certificate the roots do not vouch for is an error; a server that does not
            // speak TLS at all may be a plain-HTTP registry.
            return Err(
                match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                    Some(
                        rustls::Error::InvalidCertificate(_)
                        | rustls::Error::NoCertificatesPresented
                        | rustls::Error::AlertReceived(_),
                    ) => RegistryError::Tls { url: text, message },
                    _ => RegistryError::NotTls { url: text, message },
                },
            );
        }
    };
    send(stream, url, accept, authorization).await
}

/// One pull's conversation with a registry: its TLS client, the credentials a challenge is
/// answered with, and the authorization the last challenge led to.
struct Session<'a> {
    registries: &'a Registries,
    tls: tokio_rustls::TlsConnector,
    credentials: Option<&'a Credentials>,
    /// The authority that asked, and the `Authorization` value it is sent.
    authorization: Option<(String, String)>,
    /// Counts blob bytes as they arrive (peers waiting for this node's fetch read it).
    progress: Option<&'a AtomicU64>,
    /// An image pull's progress, blob by blob.
    layers: Option<&'a Progress>,
}

/// The most bytes of a token server's answer read.
const MAX_TOKEN_RESPONSE: usize = 64 << 10;

impl Session<'_> {
    fn who(&self) -> String {
        match self.credentials {
            Some(c) => format!("as {:?}", c.username),
            None => "anonymously".into(),
        }
    }

    /// The `Authorization` that answers the challenge `header` of `url`.
    async fn answer(&self, url: &str, header: &str) -> Result<String, RegistryError> {
        let refused = |detail: String| RegistryError::Unauthorized {
            url: url.to_owned(),
            who: self.who(),
            detail,
        };
        match auth::parse_challenge(header) {
            None => Err(refused(format!(
                "the registry asks for authentication this node does not speak ({header})"
            ))),
            Some(Challenge::Basic) => self.credentials.map(Credentials::basic).ok_or_else(|| {
                refused(
                    "the registry asks for a user name and password (give them with an \
                     imagePullSecret or the node's --registry-config)"
                        .into(),
                )
            }),
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let token_url = Url::parse(&auth::token_url(
                    &realm,
                    service.as_deref(),
                    scope.as_deref(),
                ))?;
                let basic = self.credentials.map(Credentials::basic);
                let response = open(
                    &token_url,
                    Ask::default(),
                    basic.as_deref(),
                    self.registries,
                    &self.tls,
                )
                .await?;
                let status = response.status();
                let body = read_bounded(&token_url.text(), response, MAX_TOKEN_RESPONSE).await?;
                if !status.is_success() {
                    return Err(refused(format!(
                        "the token server {realm} answered {status}: {}",
                        snippet(&body)
                    )));
                }
                auth::token_from(&body)
                    .map(|token| format!("Bearer {token}"))
                    .ok_or_else(|| refused(format!("the token server {realm} sent no token")))
            }
        }
    }
}

/// The start of a body, as text for an error message.
fn snippet(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(300)])
        .trim()
        .to_owned()
}

/// A GET that follows redirects and answers one authentication challenge; returns the final
/// URL and the response.
async fn get(
    url: &str,
    accept: Ask<'_>,
    session: &mut Session<'_>,
) -> Result<(String, hyper::Response<hyper::body::Incoming>), RegistryError> {
    let mut url = Url::parse(url)?;
    let mut redirects = 0;
    let mut challenged = false;
    loop {
        let text = url.text();
        // The authorization goes only to the host that asked for it.
        let authorization = session
            .authorization
            .as_ref()
            .filter(|(authority, _)| *authority == url.authority())
            .map(|(_, value)| value.clone());
        let response = open(
            &url,
            accept,
            authorization.as_deref(),
            session.registries,
            &session.tls,
        )
        .await?;
        if response.status().is_redirection() {
            redirects += 1;
            if redirects > MAX_REDIRECTS {
                return Err(RegistryError::Http {
                    url: text,
                    message: format!("more than {MAX_REDIRECTS} redirects"),
                });
            }
            let location = response
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| RegistryError::Http {
                    url: text.clone(),
                    message: "a redirect without a Location".into(),
                })?;
            url = if location.starts_with('/') {
                Url {
                    path: location.to_owned(),
                    ..url
                }
            } else {
                Url::parse(location)?
            };
            continue;
        }
        if response.status() == hyper::StatusCode::UNAUTHORIZED {
            let challenge: String = response
                .headers()
                .get(hyper::header::WWW_AUTHENTICATE)
                .and_then(|c| c.to_str().ok())
                .unwrap_or("")
                .chars()
                .take(512)
                .collect();
            if !challenged && !challenge.is_empty() {
                challenged = true;
                let value = session.answer(&text, &challenge).await?;
                session.authorization = Some((url.authority(), value));
                continue;
            }
            let body = read_bounded(&text, response, 512).await.unwrap_or_default();
            return Err(RegistryError::Unauthorized {
                url: text,
                who: session.who(),
                detail: format!("{} {challenge}", snippet(&body)).trim().to_owned(),
            });
        }
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let body = read_bounded(&text, response, 512).await.unwrap_or_default();
            return Err(RegistryError::Status {
                url: text,
                status,
                body: snippet(&body),
            });
        }
        return Ok((text, response));
    }
}

/// The next frame of a body, waiting at most [`IDLE`].
async fn next_frame(
    url: &str,
    body: &mut hyper::body::Incoming,
) -> Result<Option<hyper::body::Frame<Bytes>>, RegistryError> {
    let http = |message: String| RegistryError::Http {
        url: url.to_owned(),
        message,
    };
    match tokio::time::timeout(IDLE, body.frame()).await {
        Err(_) => Err(http(format!("no data in {IDLE:?}"))),
        Ok(None) => Ok(None),
        Ok(Some(frame)) => frame.map(Some).map_err(|e| http(e.to_string())),
    }
}

fn too_slow(url: &str) -> RegistryError {
    RegistryError::Http {
        url: url.to_owned(),
        message: format!("the body comes slower than {} KiB/s", MIN_RATE >> 10),
    }
}

/// The body, at most `limit` bytes (an error past that).
async fn read_bounded(
    url: &str,
    response: hyper::Response<hyper::body::Incoming>,
    limit: usize,
) -> Result<Vec<u8>, RegistryError> {
    let mut body = response.into_body();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + body_deadline(limit as u64);
    while let Some(frame) = next_frame(url, &mut body).await? {
        if tokio::time::Instant::now() > deadline {
            return Err(too_slow(url));
        }
        if let Some(data) = frame.data_ref() {
            if out.len() + data.len() > limit {
                return Err(RegistryError::TooLarge {
                    url: url.to_owned(),
                    limit: limit as u64,
                });
            }
            out.extend_from_slice(data);
        }
    }
    Ok(out)
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// A manifest or index, its bytes verified against `expected` when the reference is a digest.
async fn manifest(
    base: &str,
    reference: &str,
    expected: Option<&str>,
    session: &mut Session<'_>,
) -> Result<(String, Vec<u8>, serde_json::Value), RegistryError> {
    let url = format!("{base}/manifests/{reference}");
    let ask = Ask {
        accept: Some(ACCEPT),
        ..Ask::default()
    };
    let (url, response) = get(&url, ask, session).await?;
    let bytes = read_bounded(&url, response, MAX_MANIFEST_BYTES).await?;
    let digest = sha256(&bytes);
    if let Some(expected) = expected
        && digest != expected
    {
        return Err(RegistryError::Digest {
            url,
            got: digest,
            expected: expected.to_owned(),
        });
    }
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::Manifest {
            url: url.clone(),
            reason: e.to_string(),
        })?;
    Ok((digest, bytes, value))
}

/// The digest and size of `reference`'s manifest, from a HEAD; `None` when the registry does
/// not say (no `Docker-Content-Digest`: the caller reads the manifest itself).
async fn resolve(
    base: &str,
    reference: &str,
    session: &mut Session<'_>,
) -> Result<Option<(String, u64)>, RegistryError> {
    let url = format!("{base}/manifests/{reference}");
    let ask = Ask {
        accept: Some(ACCEPT),
        head: true,
        ..Ask::default()
    };
    let (_, response) = get(&url, ask, session).await?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let digest =
        header("docker-content-digest").filter(|d| super::reference::parse_digest(d).is_ok());
    let size = header("content-length")
        .and_then(|l| l.parse::<u64>().ok())
        .filter(|s| *s <= MAX_MANIFEST_BYTES as u64);
    Ok(digest.zip(size))
}

/// The manifest `digest` (`size` bytes): through `peers` (its owner fetches it from the
/// registry once for the cluster), else from the registry; with the bytes peers moved.
async fn manifest_by_digest(
    base: &str,
    (digest, size): (&str, u64),
    peers: Option<&dyn BlobSource>,
    store: &ImageStore,
    session: &mut Session<'_>,
) -> Result<((String, Vec<u8>, serde_json::Value), u64), RegistryError> {
    if let Some(peers) = peers
        && size > 0
        && size <= MAX_MANIFEST_BYTES as u64
        && let Some(moved) = peers.fetch(digest, size, true, None).await
        && let Ok(bytes) = store.blob_bytes(digest, MAX_MANIFEST_BYTES as u64)
        && let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes)
    {
        return Ok(((digest.to_owned(), bytes, value), moved.from_peers));
    }
    Ok((manifest(base, digest, Some(digest), session).await?, 0))
}

/// Whether a manifest body is an index (OCI) or a manifest list (Docker).
fn is_index(value: &serde_json::Value) -> bool {
    value["manifests"].is_array()
        || matches!(
            value["mediaType"].as_str(),
            Some(
                "application/vnd.oci.image.index.v1+json"
                    | "application/vnd.docker.distribution.manifest.list.v2+json"
            )
        )
}

/// The digest of the index entry for linux on `arch` (and `variant`, when both name one).
fn platform_entry(index: &ImageIndex, arch: &str, variant: Option<&str>) -> Result<String, String> {
    let fits = |m: &&oci_spec::image::Descriptor| {
        m.platform().as_ref().is_some_and(|p| {
            p.os().to_string() == "linux"
                && p.architecture().to_string() == arch
                && match (variant, p.variant().as_deref()) {
                    (Some(want), Some(has)) => want == has,
                    _ => true,
                }
        })
    };
    match index.manifests().iter().find(fits) {
        Some(m) => Ok(m.digest().to_string()),
        None => Err(index
            .manifests()
            .iter()
            .filter_map(|m| {
                let p = m.platform().as_ref()?;
                Some(match p.variant() {
                    Some(v) => format!("{}/{}/{v}", p.os(), p.architecture()),
                    None => format!("{}/{}", p.os(), p.architecture()),
                })
            })
            .collect::<Vec<_>>()
            .join(", ")),
    }
}

/// Times one blob download resumes after its connection broke (each time after progress).
const MAX_RESUMES: usize = 3;

/// Streams a body into `file`, hashing it and counting `received`, refusing more than `size`
/// bytes in all and a pace under [`MIN_RATE`].
async fn stream_body(
    (url, digest): (&str, &str),
    response: hyper::Response<hyper::body::Incoming>,
    size: u64,
    (file, hash, received): (&mut tempfile::NamedTempFile, &mut sha2::Sha256, &mut u64),
    session: &Session<'_>,
) -> Result<(), RegistryError> {
    let mut body = response.into_body();
    let deadline = tokio::time::Instant::now() + body_deadline(size - *received);
    while let Some(frame) = next_frame(url, &mut body).await? {
        if tokio::time::Instant::now() > deadline {
            return Err(too_slow(url));
        }
        if let Some(data) = frame.data_ref() {
            *received += data.len() as u64;
            if *received > size {
                return Err(RegistryError::TooLarge {
                    url: url.to_owned(),
                    limit: size,
                });
            }
            hash.update(data);
            file.write_all(data)?;
            if let Some(progress) = session.progress {
                progress.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            if let Some(layers) = session.layers {
                layers.set(digest, *received);
            }
        }
    }
    Ok(())
}

/// Blob downloads one node runs at once, over every pull (the kubelet's serialized pulls are
/// coarser: one image at a time); the others wait their turn.
pub const MAX_DOWNLOADS: usize = 4;
static DOWNLOADS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_DOWNLOADS);

/// Streams a blob into the store, hashing as it comes, refusing more bytes than `size` and a
/// digest other than `digest`; nothing enters the store unverified.
async fn blob(
    store: &ImageStore,
    base: &str,
    digest: &str,
    size: u64,
    session: &mut Session<'_>,
) -> Result<u64, RegistryError> {
    let _turn = DOWNLOADS
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let mut file = store.incoming_blob()?;
    let mut hash = sha2::Sha256::new();
    let mut received = 0u64;
    let mut resumed = 0;
    let url = loop {
        let ask = Ask {
            from: (received > 0).then_some(received),
            ..Ask::default()
        };
        let (url, response) = get(&format!("{base}/blobs/{digest}"), ask, session).await?;
        if received > 0 && response.status() != hyper::StatusCode::PARTIAL_CONTENT {
            // The server sends the whole blob again: start over.
            file = store.incoming_blob()?;
            hash = sha2::Sha256::new();
            received = 0;
        }
        let before = received;
        let streamed = stream_body(
            (&url, digest),
            response,
            size,
            (&mut file, &mut hash, &mut received),
            session,
        )
        .await;
        match streamed {
            Ok(()) => break url,
            // A connection lost midway, after progress: the rest, from where it broke.
            Err(error @ RegistryError::Http { .. })
                if received > before && resumed < MAX_RESUMES =>
            {
                resumed += 1;
                tracing::info!(%url, received, %error, "blob download interrupted; resuming");
            }
            Err(error) => return Err(error),
        }
    };
    if received != size {
        return Err(RegistryError::Size {
            url,
            size: received,
            expected: size,
        });
    }
    let got = format!("sha256:{}", hex::encode(hash.finalize()));
    if got != digest {
        return Err(RegistryError::Digest {
            url,
            got,
            expected: digest.to_owned(),
        });
    }
    let (store, digest) = (store.clone(), digest.to_owned());
    tokio::task::spawn_blocking(move || store.commit_blob(&digest, file))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok(received)
}

/// What a pull from a registry did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The digest of the manifest run (this platform's, when the tag named an index).
    pub digest: String,
    /// Bytes received from the registry (manifests and the blobs the store lacked).
    pub bytes: u64,
    /// Bytes of blobs brought by [`BlobSource`] (the cluster's peers) instead.
    pub from_peers: u64,
    /// The registry (or mirror) it came from.
    pub host: String,
    /// Whether credentials were needed and given: such an image is not shared with peers.
    pub authenticated: bool,
}

/// Where a pull gets a blob before asking the registry for it: the cluster (one node fetches
/// each blob from the registry, the others copy it from there).
pub trait BlobSource: Send + Sync {
    /// Brings blob `digest` (`size` bytes) into the store, verified; the bytes it moved, or
    /// `None` when the pull should fetch it from the registry itself.
    /// With `manifest`, the blob is a manifest or index (fetched from `/manifests/<digest>`).
    /// The bytes in so far are reported into `progress` as they come.
    fn fetch<'a>(
        &'a self,
        digest: &'a str,
        size: u64,
        manifest: bool,
        progress: Option<&'a Progress>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Moved>> + Send + 'a>>;
}

/// The bytes a [`BlobSource`] moved for one blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// By this node, from the registry (it owns the blob).
    pub from_registry: u64,
    /// From a peer that fetched it.
    pub from_peers: u64,
}

/// What is asked of a registry.
enum Op<'a> {
    /// An image: its manifest (through an index), missing blobs (from `peers` first), tagged.
    Image {
        store: &'a ImageStore,
        peers: Option<&'a dyn BlobSource>,
        progress: Option<&'a Progress>,
    },
    /// One blob (a manifest with `manifest`) into the store, for a peer waiting on this
    /// node, counted in `progress`.
    Blob {
        store: &'a ImageStore,
        digest: &'a str,
        size: u64,
        manifest: bool,
        progress: Option<&'a AtomicU64>,
    },
}

/// Pulls `image` from its registry (its mirrors first) into `store` and tags it. Blobs the
/// store has are not fetched again; `peers`, if given, are asked for each missing blob before
/// the registry. `secrets`: the pod's `imagePullSecrets` entries.
pub async fn pull(
    store: &ImageStore,
    image: &str,
    registries: &Registries,
    secrets: &[auth::Entry],
    peers: Option<&dyn BlobSource>,
) -> Result<Pulled, RegistryError> {
    pull_tracked(store, image, registries, secrets, peers, None).await
}

/// [`pull`], reporting each blob's bytes into `progress` as they come (`shoal image pull`
/// draws it; the kubelet's `Pulling` event reports it).
pub async fn pull_tracked(
    store: &ImageStore,
    image: &str,
    registries: &Registries,
    secrets: &[auth::Entry],
    peers: Option<&dyn BlobSource>,
    progress: Option<&Progress>,
) -> Result<Pulled, RegistryError> {
    let reference = Reference::parse(image)?;
    let op = Op::Image {
        store,
        peers,
        progress,
    };
    across_hosts(&op, &reference, registries, secrets).await
}

/// Fetches blob `digest` of `image` from its registry (its mirrors first) into `store`,
/// counting the bytes into `progress` as they arrive; the bytes received.
pub async fn fetch_blob(
    store: &ImageStore,
    image: &str,
    (digest, size, manifest): (&str, u64, bool),
    registries: &Registries,
    secrets: &[auth::Entry],
    progress: Option<&AtomicU64>,
) -> Result<u64, RegistryError> {
    let reference = Reference::parse(image)?;
    super::reference::parse_digest(digest)?;
    let limit = store.layer_limits().max_image_bytes;
    if size > limit {
        return Err(RegistryError::TooLarge {
            url: format!("{}/{}@{digest}", reference.domain, reference.path),
            limit,
        });
    }
    let op = Op::Blob {
        store,
        digest,
        size,
        manifest,
        progress,
    };
    Ok(across_hosts(&op, &reference, registries, secrets)
        .await?
        .bytes)
}

/// Runs `op` against each mirror of the image's registry in turn, then the registry itself.
async fn across_hosts(
    op: &Op<'_>,
    reference: &Reference,
    registries: &Registries,
    secrets: &[auth::Entry],
) -> Result<Pulled, RegistryError> {
    let mirrors = registries
        .hosts
        .get(&reference.domain)
        .map(|h| h.mirrors.clone())
        .unwrap_or_default();
    for mirror in &mirrors {
        match at_host(op, reference, mirror, registries, secrets).await {
            Ok(pulled) => return Ok(pulled),
            Err(error) => {
                tracing::warn!(image = %reference, %mirror, %error, "mirror failed; trying the next");
            }
        }
    }
    at_host(op, reference, reference.api_host(), registries, secrets).await
}

/// Runs `op` against `host` (the registry or a mirror): with each matching credential in turn
/// while the registry refuses them, anonymously when none matches; HTTPS, then plain HTTP
/// where allowed.
async fn at_host(
    op: &Op<'_>,
    reference: &Reference,
    host: &str,
    registries: &Registries,
    secrets: &[auth::Entry],
) -> Result<Pulled, RegistryError> {
    let own_ca = registries
        .hosts
        .get(host)
        .or_else(|| {
            (host == reference.api_host())
                .then(|| registries.hosts.get(&reference.domain))
                .flatten()
        })
        .map(|h| h.ca_files.as_slice())
        .unwrap_or_default();
    let tls = registries.tls(own_ca)?;
    let candidates = registries.credentials_for(reference, host, secrets);
    let tries: Vec<Option<&Credentials>> = if candidates.is_empty() {
        vec![None]
    } else {
        candidates.iter().map(Some).collect()
    };
    let mut result = None;
    for credentials in tries {
        let mut session = Session {
            registries,
            tls: tls.clone(),
            credentials,
            authorization: None,
            progress: match op {
                Op::Blob { progress, .. } => *progress,
                Op::Image { .. } => None,
            },
            layers: match op {
                Op::Image { progress, .. } => *progress,
                Op::Blob { .. } => None,
            },
        };
        let attempt = match once(op, "https", host, reference, &mut session).await {
            Err(RegistryError::NotTls { .. }) if registries.plain_http(host) => {
                once(op, "http", host, reference, &mut session).await
            }
            other => other,
        };
        let done = !matches!(attempt, Err(RegistryError::Unauthorized { .. }));
        result = Some(attempt.map(|(digest, bytes, from_peers)| Pulled {
            digest,
            bytes,
            from_peers,
            host: host.to_owned(),
            authenticated: credentials.is_some() && session.authorization.is_some(),
        }));
        if done {
            break;
        }
    }
    result.expect("at least one attempt")
}

/// One attempt of `op` over `scheme`: the digest, bytes from the registry, bytes from peers.
async fn once(
    op: &Op<'_>,
    scheme: &str,
    host: &str,
    reference: &Reference,
    session: &mut Session<'_>,
) -> Result<(String, u64, u64), RegistryError> {
    match op {
        Op::Image { store, peers, .. } => {
            pull_over(scheme, host, reference, store, *peers, session).await
        }
        Op::Blob {
            store,
            digest,
            size,
            manifest: false,
            ..
        } => {
            let base = format!("{scheme}://{host}/v2/{}", reference.path);
            let bytes = blob(store, &base, digest, *size, session).await?;
            Ok(((*digest).to_owned(), bytes, 0))
        }
        Op::Blob {
            store,
            digest,
            manifest: true,
            ..
        } => {
            let base = format!("{scheme}://{host}/v2/{}", reference.path);
            let (_, bytes, _) = manifest(&base, digest, Some(digest), session).await?;
            let mut file = store.incoming_blob()?;
            file.write_all(&bytes)?;
            let (store, digest) = ((*store).clone(), (*digest).to_owned());
            let received = bytes.len() as u64;
            tokio::task::spawn_blocking(move || store.commit_blob(&digest, file))
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))??;
            Ok((String::new(), received, 0))
        }
    }
}

async fn pull_over(
    scheme: &str,
    host: &str,
    reference: &Reference,
    store: &ImageStore,
    peers: Option<&dyn BlobSource>,
    session: &mut Session<'_>,
) -> Result<(String, u64, u64), RegistryError> {
    let base = format!("{scheme}://{host}/v2/{}", reference.path);
    let mut from_peers = 0;
    // With peers, the tag is resolved with a HEAD (which also proves this pod's access, and
    // which Docker Hub does not count against its pull limit) and the manifest read by digest
    // through the cluster, so the registry serves each manifest once.
    let resolved = match peers {
        Some(_) => resolve(&base, reference.tag_or_digest(), session).await?,
        None => None,
    };
    let (mut digest, mut bytes, mut value) = match resolved {
        Some((digest, size)) => {
            if let Some(expected) = &reference.digest
                && *expected != digest
            {
                return Err(RegistryError::Digest {
                    url: format!("{base}/manifests/{expected}"),
                    got: digest,
                    expected: expected.clone(),
                });
            }
            let (found, peer_bytes) =
                manifest_by_digest(&base, (&digest, size), peers, store, session).await?;
            from_peers += peer_bytes;
            found
        }
        None => {
            manifest(
                &base,
                reference.tag_or_digest(),
                reference.digest.as_deref(),
                session,
            )
            .await?
        }
    };
    let mut received = if from_peers > 0 {
        0
    } else {
        bytes.len() as u64
    };
    // An index (nested at most twice): the entry for this node's platform.
    for _ in 0..3 {
        if !is_index(&value) {
            break;
        }
        let index: ImageIndex =
            serde_json::from_value(value).map_err(|e| RegistryError::Manifest {
                url: format!("{base}/manifests/{digest}"),
                reason: e.to_string(),
            })?;
        let arch = super::go_arch();
        let entry = platform_entry(&index, arch, arm_variant()).map_err(|available| {
            RegistryError::Platform {
                image: reference.to_string(),
                arch: arch.to_owned(),
                available,
            }
        })?;
        super::reference::parse_digest(&entry)?;
        let size = index
            .manifests()
            .iter()
            .find(|m| m.digest().to_string() == entry)
            .map_or(0, |m| m.size());
        let peer_bytes;
        ((digest, bytes, value), peer_bytes) =
            manifest_by_digest(&base, (&entry, size), peers, store, session).await?;
        from_peers += peer_bytes;
        if peer_bytes == 0 {
            received += bytes.len() as u64;
        }
    }
    let manifest: ImageManifest =
        serde_json::from_value(value).map_err(|e| RegistryError::Manifest {
            url: format!("{base}/manifests/{digest}"),
            reason: e.to_string(),
        })?;
    check_bounds(&manifest, store.layer_limits().max_image_bytes).map_err(|reason| {
        RegistryError::Manifest {
            url: format!("{base}/manifests/{digest}"),
            reason,
        }
    })?;
    if let Some(layers) = session.layers {
        layers.plan(
            std::iter::once(manifest.config())
                .chain(manifest.layers())
                .map(|d| {
                    let digest = d.digest().to_string();
                    let present = store.has_blob(&digest);
                    (digest, d.size(), present)
                }),
        );
    }
    for (i, descriptor) in std::iter::once(manifest.config())
        .chain(manifest.layers())
        .enumerate()
    {
        let blob_digest = descriptor.digest().to_string();
        if !store.has_blob(&blob_digest) {
            let size = descriptor.size();
            let moved = match peers {
                Some(peers) => peers.fetch(&blob_digest, size, false, session.layers).await,
                None => None,
            };
            match moved {
                Some(moved) => {
                    received += moved.from_registry;
                    from_peers += moved.from_peers;
                }
                None => received += blob(store, &base, &blob_digest, size, session).await?,
            }
            if let Some(layers) = session.layers {
                layers.done(&blob_digest);
            }
        }
        // The config first: an image for another platform is refused before its layers move.
        if i == 0 {
            store.check_platform(&reference.to_string(), &blob_digest)?;
        }
    }
    // The manifest last, verified like a blob, then tagged (which checks every blob is there);
    // an image the registry gave only for credentials is private before it is tagged (peers
    // never see it in this node's gossip).
    let mut file = store.incoming_blob()?;
    file.write_all(&bytes)?;
    let private = session.credentials.is_some() && session.authorization.is_some();
    let (store, name, manifest_digest) = (store.clone(), reference.to_string(), digest.clone());
    tokio::task::spawn_blocking(move || -> Result<(), ImageError> {
        store.commit_blob(&manifest_digest, file)?;
        if private {
            store.mark_private(&manifest_digest)?;
        }
        store.tag(&name, &manifest_digest)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok((digest, received, from_peers))
}

/// What a manifest may ask this node to download, checked before anything is: at most
/// [`super::layer::MAX_LAYERS`] layers, a config of at most [`MAX_MANIFEST_BYTES`], layers
/// that together stay under the image limit (`max_image_bytes`; compressed layers are no
/// larger than what they unpack to), and sha256 digests only.
fn check_bounds(manifest: &ImageManifest, max_image_bytes: u64) -> Result<(), String> {
    if manifest.layers().len() > super::layer::MAX_LAYERS {
        return Err(format!(
            "{} layers (at most {})",
            manifest.layers().len(),
            super::layer::MAX_LAYERS
        ));
    }
    if manifest.config().size() > MAX_MANIFEST_BYTES as u64 {
        return Err(format!(
            "a config of {} bytes (at most {MAX_MANIFEST_BYTES})",
            manifest.config().size()
        ));
    }
    let total = manifest
        .layers()
        .iter()
        .fold(0u64, |sum, l| sum.saturating_add(l.size()));
    if total > max_image_bytes {
        return Err(format!(
            "layers of {total} bytes (the image limit is {max_image_bytes})"
        ));
    }
    for d in std::iter::once(manifest.config()).chain(manifest.layers()) {
        super::reference::parse_digest(d.digest().as_ref()).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The ARM variant this node runs (`v7`, `v8`), as image indexes name it; none elsewhere.
fn arm_variant() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "aarch64" => Some("v8"),
        "arm" => Some("v7"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_is_bounded_before_anything_is_downloaded() {
        let layer = |size: u64, digest: &str| {
            serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                               "size": size, "digest": digest})
        };
        let good = format!("sha256:{}", "a".repeat(64));
        let manifest = |config_size: u64, layers: Vec<serde_json::Value>| -> ImageManifest {
            serde_json::from_value(serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "size": config_size, "digest": good},
                "layers": layers}))
            .unwrap()
        };
        assert!(check_bounds(&manifest(100, vec![layer(10, &good)]), 1000).is_ok());
        let cases = [
            (manifest(100, vec![layer(1, &good); 128]), "128 layers"),
            (manifest(5 << 20, vec![]), "a config of"),
            (
                manifest(100, vec![layer(600, &good), layer(600, &good)]),
                "1200 bytes",
            ),
            (
                manifest(100, vec![layer(u64::MAX, &good), layer(1, &good)]),
                "bytes (the image limit",
            ),
            (
                manifest(100, vec![layer(1, &format!("sha512:{}", "a".repeat(128)))]),
                "not a sha256 digest",
            ),
        ];
        for (m, want) in cases {
            let err = check_bounds(&m, 1000).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn registry_pulls_all_local_or_none() {
        let with = |pulls| Registries {
            pulls,
            insecure: vec!["reg.lan:5000".into()],
            ..Default::default()
        };
        let hosts = ["registry-1.docker.io", "127.0.0.1:5000", "reg.lan:5000"];
        let allowed = |pulls| hosts.map(|h| with(pulls).pulls_from(h));
        assert_eq!(allowed(RegistryPulls::All), [true, true, true]);
        assert_eq!(allowed(RegistryPulls::Local), [false, true, true]);
        assert_eq!(allowed(RegistryPulls::None), [false, false, false]);
    }

    #[test]
    fn plain_http_only_for_loopback_and_listed_registries() {
        let r = Registries {
            insecure: vec!["reg.lan:5000".into(), "mirror.lan".into()],
            ..Default::default()
        };
        for host in [
            "127.0.0.1:5000",
            "localhost:5000",
            "[::1]:5000",
            "127.1.2.3",
            "reg.lan:5000",
            "mirror.lan:8080",
        ] {
            assert!(r.plain_http(host), "{host}");
        }
        for host in [
            "registry-1.docker.io",
            "reg.lan:5001",
            "10.0.0.1:5000",
            "ghcr.io",
        ] {
            assert!(!r.plain_http(host), "{host}");
        }
    }

    #[test]
    fn plain_http_is_refused_for_a_registry_not_named_insecure() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let r = Registries::default();
        let mut session = Session {
            registries: &r,
            tls: r.tls(&[]).unwrap(),
            credentials: None,
            authorization: None,
            progress: None,
            layers: None,
        };
        // Refused before anything is sent (nothing listens there).
        let err = rt
            .block_on(get(
                "http://reg.example:5000/v2/",
                Ask::default(),
                &mut session,
            ))
            .unwrap_err();
        assert!(
            matches!(&err, RegistryError::PlainHttp { host } if host == "reg.example:5000"),
            "{err}"
        );
        // A CA file that is not one names itself.
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("ca.pem");
        std::fs::write(&bad, "not a certificate").unwrap();
        let err = Registries {
            ca_files: vec![bad.clone()],
            ..Default::default()
        }
        .tls(&[])
        .err()
        .unwrap();
        assert!(
            matches!(&err, RegistryError::Ca { path, .. } if *path == bad),
            "{err}"
        );
    }

    /// A blob whose connection breaks midway is resumed with a Range request from where it
    /// broke, and verified whole; a server that ignores the Range is read again from the start.
    #[tokio::test]
    async fn a_broken_blob_download_resumes_where_it_broke() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let digest = sha256(&content);
        for honour_range in [true, false] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let body = content.clone();
            let ranges = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let seen = ranges.clone();
            tokio::spawn(async move {
                for n in 0.. {
                    let (mut conn, _) = listener.accept().await.unwrap();
                    let mut request = vec![0u8; 4096];
                    let len = conn.read(&mut request).await.unwrap();
                    let request = String::from_utf8_lossy(&request[..len]).to_lowercase();
                    let from = request
                        .lines()
                        .find_map(|l| l.strip_prefix("range: bytes="))
                        .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok());
                    seen.lock().unwrap().push(from);
                    match (n, from) {
                        // The first answer breaks after half the body.
                        (0, _) => {
                            let head = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            );
                            conn.write_all(head.as_bytes()).await.unwrap();
                            conn.write_all(&body[..body.len() / 2]).await.unwrap();
                        }
                        (_, Some(from)) if honour_range => {
                            let rest = &body[from..];
                            let head = format!(
                                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {from}-{}/{}\r\n\r\n",
                                rest.len(),
                                body.len() - 1,
                                body.len()
                            );
                            conn.write_all(head.as_bytes()).await.unwrap();
                            conn.write_all(rest).await.unwrap();
                        }
                        _ => {
                            let head = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            );
                            conn.write_all(head.as_bytes()).await.unwrap();
                            conn.write_all(&body).await.unwrap();
                        }
                    }
                }
            });
            let dir = tempfile::tempdir().unwrap();
            let store = ImageStore::open(dir.path()).unwrap();
            let registries = Registries::default();
            let layers = Progress::default();
            let size = content.len() as u64;
            layers.plan([
                ("sha256:config".into(), 10, true),
                (digest.clone(), size, false),
            ]);
            let mut session = Session {
                registries: &registries,
                tls: registries.tls(&[]).unwrap(),
                credentials: None,
                authorization: None,
                progress: None,
                layers: Some(&layers),
            };
            let base = format!("http://{addr}/v2/a");
            let got = blob(&store, &base, &digest, size, &mut session)
                .await
                .unwrap();
            assert_eq!(got, size);
            // The progress counted every byte, once (the resumed part from where it broke).
            assert_eq!(layers.snapshot()[1].received, size);
            assert!(store.has_blob(&digest));
            assert_eq!(
                ranges.lock().unwrap().as_slice(),
                [None, Some(content.len() / 2)]
            );
        }
    }

    /// A registry that sends a byte every 10 s (never idle for 30 s) is cut off once the body
    /// is slower than [`MIN_RATE`] on average (paused time: the drip takes no real time).
    #[tokio::test(start_paused = true)]
    async fn a_registry_that_drips_is_cut_off() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (client, mut server) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let mut request = [0u8; 4096];
            let _ = server.read(&mut request).await;
            let head = b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n";
            let _ = server.write_all(head).await;
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                if server.write_all(b"x").await.is_err() {
                    break;
                }
            }
        });
        let url = Url::parse("http://127.0.0.1:5000/v2/a/blobs/b").unwrap();
        let started = tokio::time::Instant::now();
        let response = send(client, &url, Ask::default(), None).await.unwrap();
        let err = read_bounded(&url.text(), response, 1 << 20)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("slower than 16 KiB/s"), "{err}");
        let waited = started.elapsed();
        assert!(waited >= body_deadline(1 << 20) && waited < body_deadline(1 << 20) + IDLE);
    }

    #[test]
    fn the_registry_config_file_is_read_and_its_mistakes_named() {
        let dir = tempfile::tempdir().unwrap();
        let docker = dir.path().join("config.json");
        std::fs::write(
            &docker,
            r#"{"auths": {"https://index.docker.io/v1/": {"auth": "aHViOnNlY3JldA=="}}}"#,
        )
        .unwrap();
        let path = dir.path().join("registries.toml");
        std::fs::write(
            &path,
            format!(
                r#"docker-config = "{}"
                [registry."docker.io"]
                mirrors = ["mirror.lan:5000"]
                [registry."mirror.lan:5000"]
                insecure = true
                username = "m"
                password = "p"
                [registry."reg.lan"]
                ca = ["/etc/shoal/reg-ca.pem"]
                "#,
                docker.display()
            ),
        )
        .unwrap();
        let mut r = Registries::default();
        r.load_config(&path).unwrap();
        assert_eq!(r.hosts["docker.io"].mirrors, ["mirror.lan:5000"]);
        assert!(r.plain_http("mirror.lan:5000") && !r.plain_http("reg.lan"));
        assert_eq!(
            r.hosts["reg.lan"].ca_files,
            [PathBuf::from("/etc/shoal/reg-ca.pem")]
        );
        // Credentials: the pod's secrets first, then the config's entry, then docker config.
        let nginx = Reference::parse("nginx").unwrap();
        let secret = auth::Entry {
            key: "docker.io".into(),
            credentials: Credentials {
                username: "pod".into(),
                password: "x".into(),
            },
        };
        let users = |host: &str, secrets: &[auth::Entry]| -> Vec<String> {
            r.credentials_for(&nginx, host, secrets)
                .into_iter()
                .map(|c| c.username)
                .collect()
        };
        assert_eq!(
            users("registry-1.docker.io", std::slice::from_ref(&secret)),
            ["pod", "hub"]
        );
        assert_eq!(users("registry-1.docker.io", &[]), ["hub"]);
        assert_eq!(users("mirror.lan:5000", &[secret]), ["m"]);
        for (text, says) in [
            (
                "[registry.\"https://reg\"]",
                "a registry is named as images name it",
            ),
            ("[registry.r]\nmirrors = [\"a/b\"]", "mirror \"a/b\""),
            (
                "[registry.r]\nusername = \"u\"",
                "username and password go together",
            ),
            ("[registry.r]\nsurprise = 1", "unknown field"),
            (
                "docker-config = \"/nonexistent\"",
                "docker-config /nonexistent",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = Registries::default()
                .load_config(&path)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(says) && err.contains("registries.toml"),
                "{err}"
            );
        }
    }

    #[test]
    fn urls_split() {
        assert_eq!(
            Url::parse("http://127.0.0.1:5000/v2/x/blobs/sha256:ab?x=1").unwrap(),
            Url {
                https: false,
                host: "127.0.0.1".into(),
                port: 5000,
                path: "/v2/x/blobs/sha256:ab?x=1".into()
            }
        );
        assert_eq!(Url::parse("http://reg").unwrap().text(), "http://reg/");
        let cdn = Url::parse("https://cdn.example/blob?sig=1").unwrap();
        assert!(cdn.https && cdn.port == 443 && cdn.text() == "https://cdn.example/blob?sig=1");
        for bad in ["ftp://x/", "http://", "http://u@h/", "http://h:99999/"] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_index_entry_of_this_platform_is_chosen_or_the_error_lists_what_there_is() {
        let index: ImageIndex = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "manifests": [
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
                 "digest": format!("sha256:{}", "1".repeat(64)),
                 "platform": {"os": "linux", "architecture": "arm", "variant": "v6"}},
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
                 "digest": format!("sha256:{}", "2".repeat(64)),
                 "platform": {"os": "linux", "architecture": "arm", "variant": "v7"}},
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
                 "digest": format!("sha256:{}", "3".repeat(64)),
                 "platform": {"os": "linux", "architecture": "amd64"}},
                {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 1,
                 "digest": format!("sha256:{}", "4".repeat(64)),
                 "platform": {"os": "windows", "architecture": "arm64"}}
            ]
        }))
        .unwrap();
        let digit = |d: String| d.chars().last().unwrap();
        assert_eq!(platform_entry(&index, "amd64", None).map(digit), Ok('3'));
        assert_eq!(
            platform_entry(&index, "arm", Some("v7")).map(digit),
            Ok('2')
        );
        assert_eq!(
            platform_entry(&index, "arm64", Some("v8")),
            Err("linux/arm/v6, linux/arm/v7, linux/amd64, windows/arm64".to_owned())
        );
    }
}

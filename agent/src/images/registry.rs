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
//! Not built yet, and refused with an error saying so: the bearer-token and basic
//! authentication challenges.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use oci_spec::image::{ImageIndex, ImageManifest};
use rustls::pki_types::pem::PemObject as _;
use sha2::Digest as _;
use std::io::Write as _;

use super::reference::{Reference, ReferenceError};
use super::{ImageError, ImageStore};

/// The largest manifest or index accepted (distribution's own limit is 4 MiB).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 5;
/// The longest wait for a connection, a response or the next bytes of a body.
pub const IDLE: Duration = Duration::from_secs(30);
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
    #[error(
        "{url}: the registry asks for credentials ({challenge}); authenticated pulls are not built yet"
    )]
    Unauthorized { url: String, challenge: String },
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
    /// Whether this node pulls from the registry at `host` ([`RegistryPulls`]).
    pub fn pulls_from(&self, host: &str) -> bool {
        match self.pulls {
            RegistryPulls::All => true,
            RegistryPulls::Local => self.plain_http(host),
            RegistryPulls::None => false,
        }
    }

    /// The TLS client: the system's roots and [`Registries::ca_files`], ring, HTTP/1.1.
    fn tls(&self) -> Result<tokio_rustls::TlsConnector, RegistryError> {
        let mut roots = rustls::RootCertStore::empty();
        let system = SYSTEM_ROOTS
            .iter()
            .find(|p| std::path::Path::new(p).exists());
        let files = system
            .map(PathBuf::from)
            .into_iter()
            .chain(self.ca_files.clone());
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

/// Sends a GET on an open connection.
async fn send<T>(
    io: T,
    url: &Url,
    accept: Option<&str>,
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
        .method(hyper::Method::GET)
        .uri(&url.path)
        .header(hyper::header::HOST, url.authority())
        .header(hyper::header::USER_AGENT, "shoal");
    if let Some(accept) = accept {
        request = request.header(hyper::header::ACCEPT, accept);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(e.to_string()))?;
    tokio::time::timeout(IDLE, sender.send_request(request))
        .await
        .map_err(|_| http(format!("no response in {IDLE:?}")))?
        .map_err(|e| http(e.to_string()))
}

/// Opens a connection to `url` (TLS for https) and sends a GET.
async fn open(
    url: &Url,
    accept: Option<&str>,
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
        return send(stream, url, accept).await;
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
    send(stream, url, accept).await
}

/// A GET that follows redirects; returns the final URL and the response.
async fn get(
    url: &str,
    accept: Option<&str>,
    registries: &Registries,
    tls: &tokio_rustls::TlsConnector,
) -> Result<(String, hyper::Response<hyper::body::Incoming>), RegistryError> {
    let mut url = Url::parse(url)?;
    for _ in 0..=MAX_REDIRECTS {
        let text = url.text();
        let response = open(&url, accept, registries, tls).await?;
        if response.status().is_redirection() {
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
            let challenge = response
                .headers()
                .get(hyper::header::WWW_AUTHENTICATE)
                .and_then(|c| c.to_str().ok())
                .unwrap_or("no WWW-Authenticate header")
                .chars()
                .take(200)
                .collect();
            return Err(RegistryError::Unauthorized {
                url: text,
                challenge,
            });
        }
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let body = read_bounded(&text, response, 512).await.unwrap_or_default();
            return Err(RegistryError::Status {
                url: text,
                status,
                body: String::from_utf8_lossy(&body).trim().to_owned(),
            });
        }
        return Ok((text, response));
    }
    Err(RegistryError::Http {
        url: url.text(),
        message: format!("more than {MAX_REDIRECTS} redirects"),
    })
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

/// The body, at most `limit` bytes (an error past that).
async fn read_bounded(
    url: &str,
    response: hyper::Response<hyper::body::Incoming>,
    limit: usize,
) -> Result<Vec<u8>, RegistryError> {
    let mut body = response.into_body();
    let mut out = Vec::new();
    while let Some(frame) = next_frame(url, &mut body).await? {
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
    (registries, tls): (&Registries, &tokio_rustls::TlsConnector),
) -> Result<(String, Vec<u8>, serde_json::Value), RegistryError> {
    let url = format!("{base}/manifests/{reference}");
    let (url, response) = get(&url, Some(ACCEPT), registries, tls).await?;
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

/// Streams a blob into the store, hashing as it comes, refusing more bytes than `size` and a
/// digest other than `digest`; nothing enters the store unverified.
async fn blob(
    store: &ImageStore,
    base: &str,
    digest: &str,
    size: u64,
    (registries, tls): (&Registries, &tokio_rustls::TlsConnector),
) -> Result<u64, RegistryError> {
    let (url, response) = get(&format!("{base}/blobs/{digest}"), None, registries, tls).await?;
    let mut file = store.incoming_blob()?;
    let mut hash = sha2::Sha256::new();
    let mut received = 0u64;
    let mut body = response.into_body();
    while let Some(frame) = next_frame(&url, &mut body).await? {
        if let Some(data) = frame.data_ref() {
            received += data.len() as u64;
            if received > size {
                return Err(RegistryError::TooLarge { url, limit: size });
            }
            hash.update(data);
            file.write_all(data)?;
        }
    }
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

/// Pulls `image` from its registry into `store` and tags it; returns the manifest's digest and
/// the bytes received. Blobs the store has are not fetched again.
pub async fn pull(
    store: &ImageStore,
    image: &str,
    registries: &Registries,
) -> Result<(String, u64), RegistryError> {
    let reference = Reference::parse(image)?;
    let tls = registries.tls()?;
    let host = reference.api_host();
    match pull_over("https", &reference, store, (registries, &tls)).await {
        Err(RegistryError::NotTls { .. }) if registries.plain_http(host) => {
            pull_over("http", &reference, store, (registries, &tls)).await
        }
        result => result,
    }
}

async fn pull_over(
    scheme: &str,
    reference: &Reference,
    store: &ImageStore,
    via: (&Registries, &tokio_rustls::TlsConnector),
) -> Result<(String, u64), RegistryError> {
    let base = format!("{scheme}://{}/v2/{}", reference.api_host(), reference.path);
    let (mut digest, mut bytes, mut value) = manifest(
        &base,
        reference.tag_or_digest(),
        reference.digest.as_deref(),
        via,
    )
    .await?;
    let mut received = bytes.len() as u64;
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
        (digest, bytes, value) = manifest(&base, &entry, Some(&entry), via).await?;
        received += bytes.len() as u64;
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
    for descriptor in std::iter::once(manifest.config()).chain(manifest.layers()) {
        let blob_digest = descriptor.digest().to_string();
        if store.has_blob(&blob_digest) {
            continue;
        }
        received += blob(store, &base, &blob_digest, descriptor.size(), via).await?;
    }
    // The manifest last, verified like a blob, then tagged (which checks every blob is there).
    let mut file = store.incoming_blob()?;
    file.write_all(&bytes)?;
    let (store, name, manifest_digest) = (store.clone(), reference.to_string(), digest.clone());
    tokio::task::spawn_blocking(move || -> Result<(), ImageError> {
        store.commit_blob(&manifest_digest, file)?;
        store.tag(&name, &manifest_digest)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok((digest, received))
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
        let tls = r.tls().unwrap();
        // Refused before anything is sent (nothing listens there).
        let err = rt
            .block_on(get("http://reg.example:5000/v2/", None, &r, &tls))
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
        .tls()
        .err()
        .unwrap();
        assert!(
            matches!(&err, RegistryError::Ca { path, .. } if *path == bad),
            "{err}"
        );
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

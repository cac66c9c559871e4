//! A real registry (Debian's `docker-registry`) and a token server for it, for the image
//! tests.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use base64::Engine as _;

/// The token server's `service` and `issuer`, as the registry's config names them.
const SERVICE: &str = "shoal-test-registry";
const ISSUER: &str = "shoal-test-tokens";

/// A real registry (Debian's `docker-registry`) on a loopback port, its storage in a temp
/// directory; killed on drop.
pub struct Registry {
    child: std::process::Child,
    pub dir: tempfile::TempDir,
    /// `127.0.0.1:<port>`.
    pub addr: String,
}

impl Registry {
    pub fn start() -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), None, "")
    }

    /// A registry that admits only bearer tokens from `tokens` (distribution's token auth, as
    /// Docker Hub and most private registries run it).
    pub fn start_with_tokens(tokens: &TokenServer) -> Self {
        let auth = format!(
            "auth:\n  token:\n    realm: http://{}/token\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
            tokens.addr,
            tokens.cert.display()
        );
        Self::start_in(tempfile::tempdir().unwrap(), None, &auth)
    }

    /// A registry serving HTTPS with a certificate for `localhost` and 127.0.0.1 from a CA of
    /// its own; returns it and the CA's PEM file.
    pub fn start_tls() -> (Self, PathBuf) {
        Self::start_tls_with(false)
    }

    /// An HTTPS registry (as [`Registry::start_tls`]) that asks for a user name and password
    /// (`USER`, `PASSWORD`: distribution's htpasswd auth, a `Basic` challenge).
    pub fn start_tls_with_basic_auth() -> (Self, PathBuf) {
        Self::start_tls_with(true)
    }

    fn start_tls_with(basic_auth: bool) -> (Self, PathBuf) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let tls = (
            write("cert.pem", cert.pem()),
            write("key.pem", key.serialize_pem()),
        );
        let ca = write("ca.pem", ca.pem());
        let mut auth = String::new();
        if basic_auth {
            // A bcrypt hash, as `htpasswd -B` writes it (glibc's crypt through Python).
            let out = std::process::Command::new("python3")
                .args([
                    "-W",
                    "ignore",
                    "-c",
                    "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))",
                    PASSWORD,
                ])
                .output()
                .unwrap();
            let hash = String::from_utf8(out.stdout).unwrap();
            assert!(hash.starts_with("$2"), "bcrypt: {hash}");
            let file = write("htpasswd", format!("{USER}:{}\n", hash.trim()));
            auth = format!(
                "auth:\n  htpasswd:\n    realm: shoal-test\n    path: {}\n",
                file.display()
            );
        }
        (Self::start_in(dir, Some(tls), &auth), ca)
    }

    /// Starts the registry with its config and storage in `dir` (HTTPS with `tls`'s
    /// certificate and key files; `extra`: more of its YAML config).
    fn start_in(dir: tempfile::TempDir, tls: Option<(PathBuf, PathBuf)>, extra: &str) -> Self {
        // A free port: bound, then released for the registry.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n{extra}http:\n  addr: {addr}\n{}",
                dir.path().join("data").display(),
                tls.map(|(cert, key)| format!(
                    "  tls:\n    certificate: {}\n    key: {}\n",
                    cert.display(),
                    key.display()
                ))
                .unwrap_or_default()
            ),
        )
        .unwrap();
        // Its log (the access log among it) goes to a file: tests count requests from it.
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = std::process::Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry (apt-get install docker-registry; .ci/run does)");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(std::time::Instant::now() < deadline, "registry not up");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Registry { child, dir, addr }
    }

    /// How many times each blob of repository `name` was served (`GET …/blobs/<digest>`
    /// answered 200), from the registry's access log.
    pub fn blob_downloads(&self, name: &str) -> std::collections::BTreeMap<String, usize> {
        self.served("GET", &format!("/v2/{name}/blobs/"))
    }

    /// How many `method` requests for each path under `prefix` were answered 200, by the
    /// rest of the path, from the registry's access log.
    pub fn served(&self, method: &str, prefix: &str) -> std::collections::BTreeMap<String, usize> {
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap();
        let prefix = format!("\"{method} {prefix}");
        let mut counts = std::collections::BTreeMap::new();
        for line in log.lines() {
            let Some(rest) = line.split_once(&prefix).map(|(_, r)| r) else {
                continue;
            };
            let path = rest.split_whitespace().next().unwrap_or_default();
            let status = rest
                .split('"')
                .nth(1)
                .and_then(|s| s.split_whitespace().next());
            if status == Some("200") {
                *counts.entry(path.to_owned()).or_default() += 1;
            }
        }
        counts
    }

    /// Pushes an OCI archive with skopeo as `name`.
    pub fn push(&self, archive: &std::path::Path, name: &str) {
        self.push_as(archive, name, None);
    }

    /// Pushes an OCI layout (every platform of its index) as `name`.
    pub fn push_layout(&self, layout: &std::path::Path, name: &str) {
        self.copy(format!("oci:{}", layout.display()), name, &["--all"]);
    }

    /// Pushes an image no node has (see [`unique_image`]) as `name`.
    pub fn push_unique(&self, base: &std::path::Path, name: &str) {
        let layout = unique_image(base, 64);
        self.copy(format!("oci:{}", layout.path().display()), name, &[]);
    }

    /// Pushes an image no node has whose own layer holds `bytes` random bytes; returns that
    /// layer's digest as the registry serves it (skopeo compresses an uncompressed layer on
    /// its way: the manifest's, read with `skopeo inspect`, which counts as a manifest GET).
    pub fn push_unique_sized(&self, base: &std::path::Path, name: &str, bytes: usize) -> String {
        let layout = unique_image(base, bytes);
        self.copy(format!("oci:{}", layout.path().display()), name, &[]);
        let out = std::process::Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false"])
            .arg(format!("docker://{}/{name}", self.addr))
            .output()
            .expect("skopeo");
        let manifest: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        manifest["layers"]
            .as_array()
            .and_then(|l| l.last())
            .and_then(|l| l["digest"].as_str())
            .unwrap()
            .to_owned()
    }

    /// Pushes with credentials `user:password`.
    pub fn push_as(&self, archive: &std::path::Path, name: &str, creds: Option<&str>) {
        let creds = creds.map(|c| format!("--dest-creds={c}"));
        let extra: Vec<&str> = creds.iter().map(String::as_str).collect();
        self.copy(format!("oci-archive:{}", archive.display()), name, &extra);
    }

    /// `skopeo copy` of `source` to `name` in this registry (the archives name themselves
    /// shoal.local/…; the destination is what counts).
    fn copy(&self, source: String, name: &str, extra: &[&str]) {
        let out = std::process::Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .args(extra)
            .arg(source)
            .arg(format!("docker://{}/{name}", self.addr))
            .output()
            .expect("skopeo (apt-get install skopeo; .ci/run does)");
        assert!(
            out.status.success(),
            "skopeo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A token server speaking distribution's token protocol, as Docker Hub's `auth.docker.io`
/// does: `GET /token?service=…&scope=repository:NAME:ACTIONS` with Basic credentials
/// `USER:PASSWORD` is answered with a JWT (ES256, its certificate in the `x5c` header, which
/// the registry checks against `cert`) granting what the scopes ask; anything else with a 401.
pub struct TokenServer {
    pub addr: String,
    /// The signing certificate (PEM): the registry's `rootcertbundle`.
    pub cert: PathBuf,
    /// Tokens issued so far.
    pub issued: Arc<AtomicUsize>,
    /// Requests refused so far.
    pub refused: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

pub const USER: &str = "puller";
pub const PASSWORD: &str = "s3cret";

impl TokenServer {
    pub fn start() -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cert_path = dir.path().join("token-ca.pem");
        std::fs::write(&cert_path, cert.pem()).unwrap();
        let rng = ring::rand::SystemRandom::new();
        let signer = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &key.serialize_der(),
            &rng,
        )
        .unwrap();
        let x5c = base64::engine::general_purpose::STANDARD.encode(cert.der());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (issued, refused, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (i, r, s) = (issued.clone(), refused.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let _ = serve(stream, &signer, &rng, &x5c, &i, &r);
            }
        });
        TokenServer {
            addr,
            cert: cert_path,
            issued,
            refused,
            stop,
            _dir: dir,
        }
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(&self.addr);
    }
}

/// Answers one request.
fn serve(
    stream: std::net::TcpStream,
    signer: &ring::signature::EcdsaKeyPair,
    rng: &ring::rand::SystemRandom,
    x5c: &str,
    issued: &AtomicUsize,
    refused: &AtomicUsize,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut authorization = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("authorization")
        {
            authorization = value.trim().to_owned();
        }
    }
    let target = request_line.split_whitespace().nth(1).unwrap_or_default();
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    let mut out = stream;
    if authorization != expected {
        refused.fetch_add(1, Ordering::SeqCst);
        let body = r#"{"details":"incorrect username or password"}"#;
        return write!(
            out,
            "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
    let access: Vec<serde_json::Value> = form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "scope")
        .filter_map(|(_, scope)| {
            let mut parts = scope.splitn(3, ':');
            let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
            Some(serde_json::json!({"type": kind, "name": name,
                                    "actions": actions.split(',').collect::<Vec<_>>()}))
        })
        .collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [x5c]});
    let claims = serde_json::json!({
        "iss": ISSUER, "sub": USER, "aud": SERVICE, "exp": now + 300, "nbf": now - 10,
        "iat": now, "jti": format!("{now}-{}", issued.load(Ordering::SeqCst)), "access": access,
    });
    let signing_input = format!(
        "{}.{}",
        b64.encode(header.to_string()),
        b64.encode(claims.to_string())
    );
    let signature = signer.sign(rng, signing_input.as_bytes()).unwrap();
    let token = format!("{signing_input}.{}", b64.encode(signature.as_ref()));
    issued.fetch_add(1, Ordering::SeqCst);
    let body = serde_json::json!({"token": token, "expires_in": 300}).to_string();
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// An OCI archive unpacked into a directory, to build test images from: its blobs, read and
/// written by digest, and its image (the first of its index).
struct Layout {
    dir: tempfile::TempDir,
}

impl Layout {
    fn unpack(base: &std::path::Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        tar::Archive::new(std::fs::File::open(base).unwrap())
            .unpack(dir.path())
            .unwrap();
        Layout { dir }
    }

    fn blob(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir.path().join("blobs/sha256").join(hex)
    }

    /// Stores `bytes` as a blob; its digest and size.
    fn put(&self, bytes: &[u8]) -> (String, u64) {
        use sha2::Digest as _;
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)));
        std::fs::write(self.blob(&digest), bytes).unwrap();
        (digest, bytes.len() as u64)
    }

    fn read(&self, digest: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.blob(digest)).unwrap()).unwrap()
    }

    /// The layout's index, and the manifest and config of its (first) image.
    fn image(&self) -> (serde_json::Value, serde_json::Value, serde_json::Value) {
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.dir.path().join("index.json")).unwrap())
                .unwrap();
        let manifest = self.read(index["manifests"][0]["digest"].as_str().unwrap());
        let config = self.read(manifest["config"]["digest"].as_str().unwrap());
        (index, manifest, config)
    }

    fn write_index(self, index: &serde_json::Value) -> tempfile::TempDir {
        std::fs::write(
            self.dir.path().join("index.json"),
            serde_json::to_vec(index).unwrap(),
        )
        .unwrap();
        self.dir
    }
}

/// An OCI layout (a directory) holding the image of the OCI archive `base` plus one more layer
/// with a file of `bytes` random bytes: an image whose config and top layer no node has.
pub fn unique_image(base: &std::path::Path, bytes: usize) -> tempfile::TempDir {
    let layout = Layout::unpack(base);
    let (mut index, mut manifest, mut config) = layout.image();
    // The layer: one file of random bytes, an uncompressed tar (its digest is its diff id).
    let mut random = vec![0u8; bytes];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random).unwrap();
    let mut layer = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(random.len() as u64);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_cksum();
    layer
        .append_data(&mut header, "unique", &random[..])
        .unwrap();
    let (layer_digest, layer_size) = layout.put(&layer.into_inner().unwrap());
    config["rootfs"]["diff_ids"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!(layer_digest));
    manifest["layers"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
        "mediaType": "application/vnd.oci.image.layer.v1.tar",
        "digest": layer_digest, "size": layer_size}));
    let (config_digest, config_size) = layout.put(&serde_json::to_vec(&config).unwrap());
    manifest["config"]["digest"] = serde_json::json!(config_digest);
    manifest["config"]["size"] = serde_json::json!(config_size);
    let (manifest_digest, manifest_size) = layout.put(&serde_json::to_vec(&manifest).unwrap());
    index["manifests"][0]["digest"] = serde_json::json!(manifest_digest);
    index["manifests"][0]["size"] = serde_json::json!(manifest_size);
    layout.write_index(&index)
}

/// An OCI layout whose index lists the image of the OCI archive `base` once per platform of
/// `arches` (linux; the same layers, a config naming each architecture): a multi-arch image
/// as `docker buildx` pushes one. Returns the layout and each platform's manifest digest.
pub fn multi_arch_image(
    base: &std::path::Path,
    arches: &[&str],
) -> (tempfile::TempDir, Vec<(String, String)>) {
    let layout = Layout::unpack(base);
    let (_, manifest, config) = layout.image();
    let mut entries = Vec::new();
    let mut digests = Vec::new();
    for arch in arches {
        let mut config = config.clone();
        config["architecture"] = serde_json::json!(arch);
        let (config_digest, config_size) = layout.put(&serde_json::to_vec(&config).unwrap());
        let mut manifest = manifest.clone();
        manifest["config"]["digest"] = serde_json::json!(config_digest);
        manifest["config"]["size"] = serde_json::json!(config_size);
        let (digest, size) = layout.put(&serde_json::to_vec(&manifest).unwrap());
        entries.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest, "size": size,
            "platform": {"os": "linux", "architecture": arch}}));
        digests.push((arch.to_string(), digest));
    }
    let inner = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries});
    let (inner_digest, inner_size) = layout.put(&serde_json::to_vec(&inner).unwrap());
    // The layout's own index points at the multi-arch index (as `skopeo copy --all` reads it).
    let top = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json",
                       "digest": inner_digest, "size": inner_size}]});
    (layout.write_index(&top), digests)
}

/// A TCP proxy on loopback to `upstream` that passes what the upstream sends at about
/// 1 MiB/s (64 KiB every 60 ms): a slow registry, for pulls that must still be running when
/// a test acts. Its threads end with their connections.
pub struct SlowProxy {
    pub addr: String,
}

impl SlowProxy {
    pub fn start(upstream: &str) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let upstream = upstream.to_owned();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                let (mut c_read, mut s_write) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_read, &mut s_write);
                    let _ = s_write.shutdown(std::net::Shutdown::Write);
                });
                let (mut s_read, mut c_write) = (server, client);
                std::thread::spawn(move || {
                    use std::io::{Read as _, Write as _};
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        match s_read.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if c_write.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                                std::thread::sleep(std::time::Duration::from_millis(60));
                            }
                        }
                    }
                    let _ = c_write.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        SlowProxy { addr }
    }
}

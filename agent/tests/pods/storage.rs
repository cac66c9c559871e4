//! Issue #39's storage on real agents with real kubectl: the built-in StorageClass, a
//! StatefulSet's claims provisioned as directories on the node its pod won, data that outlives
//! the pod (the pod comes back on the volume's node), retained claims, and a deleted claim's
//! volume reclaimed; a pod whose claim does not exist says so in PodScheduled.

use serde_json::Value;
use shoal_chaos::testkit::wait_until;

use super::{LIMIT, json_of, lab, pod_json, wait_pod};

const DB: &str = r#"apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 2
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: shoal.local/busybox:1
        command: [sh, -c, 'echo started $(hostname) >> /data/log; trap "exit 0" TERM; while :; do sleep 1; done']
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 16Mi}}
"#;

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_sets_claims_are_provisioned_on_its_pods_nodes_and_keep_their_data() {
    let mut api = lab().await;
    // The cluster's default class, made at its start.
    let mut classes = String::new();
    wait_until("the built-in StorageClass", LIMIT, || {
        classes = api.kubectl(0, &["get", "storageclass"]).1;
        let ok = classes.contains("local-path (default)")
            && classes.contains("shoal.io/local-path")
            && classes.contains("WaitForFirstConsumer");
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {classes}"));

    // A pod whose claim does not exist: unschedulable, saying why.
    let orphan = api.manifest(
        "orphan.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: orphan}\nspec:\n  containers: [{name: c, image: shoal.local/busybox:1, command: [sleep, '60'], volumeMounts: [{name: v, mountPath: /v}]}]\n  volumes: [{name: v, persistentVolumeClaim: {claimName: nope}}]\n",
    );
    api.ok(0, &["apply", "-f", &orphan]);
    wait_pod(&api, 1, "orphan", "the missing claim named", |p| {
        p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "PodScheduled"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("persistentvolumeclaim \"nope\" not found"))
            })
    })
    .await;
    api.ok(0, &["delete", "pod", "orphan", "--wait=false"]);

    // A claim larger than any node's volume capacity: its pod stays unschedulable, saying so,
    // and no node provisions it.
    let huge = api.manifest(
        "huge.yaml",
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: huge}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Pi}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: huge}\nspec:\n  containers: [{name: c, image: shoal.local/busybox:1, command: [sleep, '60'], volumeMounts: [{name: v, mountPath: /v}]}]\n  volumes: [{name: v, persistentVolumeClaim: {claimName: huge}}]\n",
    );
    api.ok(0, &["apply", "-f", &huge]);
    wait_pod(&api, 2, "huge", "the lack of volume capacity named", |p| {
        p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "PodScheduled"
                    && c["message"].as_str().is_some_and(|m| {
                        m.contains(
                        "3 node(s) did not have enough free storage (the pod's claims ask for 1Pi)",
                    )
                    })
            })
    })
    .await;
    let claim = json_of(&api, 1, &["get", "pvc", "huge", "-o", "json"]);
    assert_eq!(claim["status"]["phase"], "Pending", "{claim}");
    api.ok(0, &["delete", "-f", &huge, "--wait=false"]);
    // A claim no pod names says it waits for one.
    let lonely = api.manifest(
        "lonely.yaml",
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: lonely}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Mi}}}\n",
    );
    api.ok(0, &["apply", "-f", &lonely]);
    let mut described = String::new();
    wait_until("the claim's WaitForFirstConsumer event", LIMIT, || {
        described = api.kubectl(2, &["describe", "pvc", "lonely"]).1;
        let ok = described.contains("WaitForFirstConsumer")
            && described.contains("waiting for first consumer to be created before binding");
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {described}"));
    api.ok(0, &["delete", "-f", &lonely]);

    let file = api.manifest("db.yaml", DB);
    api.ok(0, &["apply", "-f", &file]);
    api.ok(1, &["rollout", "status", "statefulset/db", "--timeout=90s"]);
    let claims = items(&json_of(&api, 2, &["get", "pvc", "-o", "json"]));
    let mut names: Vec<&str> = claims
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["data-db-0", "data-db-1"]);
    for c in &claims {
        assert_eq!(c["status"]["phase"], "Bound", "{c}");
        assert_eq!(c["spec"]["storageClassName"], "local-path", "{c}");
        assert_eq!(c["status"]["capacity"]["storage"], "16Mi", "{c}");
    }
    let table = api.ok(0, &["get", "pv"]);
    assert!(
        table.contains("default/data-db-0") && table.contains("Bound"),
        "{table}"
    );
    // Each volume is a directory on the node its pod runs on, pinned there.
    let node_of = |pod: &str| {
        json_of(&api, 0, &["get", "pod", pod, "-o", "json"])["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let volume_of = |claim: &str| {
        json_of(&api, 0, &["get", "pvc", claim, "-o", "json"])["spec"]["volumeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let agent_of = |node: &str| api.agents.iter().position(|a| a.name() == node).unwrap();
    let node0 = node_of("db-0");
    let volume0 = volume_of("data-db-0");
    let dir0 = shoal_agent::paths::volumes(api.agents[agent_of(&node0)].data_dir()).join(&volume0);
    let log = std::fs::read_to_string(dir0.join("log")).unwrap_or_default();
    assert_eq!(log, "started db-0\n", "{}", dir0.display());
    let pv = json_of(&api, 0, &["get", "pv", &volume0, "-o", "json"]);
    assert_eq!(
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
            [0],
        node0.as_str(),
        "{pv}"
    );

    // The pod goes; its replacement comes back on the volume's node and finds the data.
    api.ok(0, &["delete", "pod", "db-0", "--wait=true"]);
    let mut seen = String::new();
    wait_until("db-0 back with its data", LIMIT, || {
        let (_, out, _) = api.kubectl(1, &["exec", "db-0", "--", "cat", "/data/log"]);
        seen = out.clone();
        async move { out == "started db-0\nstarted db-0\n" }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {seen:?}"));
    assert_eq!(node_of("db-0"), node0);

    // Scaled down: the claim stays (Retain, the default), bound.
    api.ok(0, &["scale", "statefulset/db", "--replicas=1"]);
    wait_until("db-1 gone", LIMIT, || {
        let gone = json_of(&api, 0, &["get", "pod", "db-1", "-o", "json"]).is_null();
        async move { gone }
    })
    .await
    .unwrap();
    let claim1 = json_of(&api, 0, &["get", "pvc", "data-db-1", "-o", "json"]);
    assert_eq!(claim1["status"]["phase"], "Bound", "{claim1}");
    // Its claim deleted, the volume (reclaimPolicy Delete) goes, and its directory.
    let volume1 = volume_of("data-db-1");
    let node1 = json_of(&api, 0, &["get", "pv", &volume1, "-o", "json"])["spec"]["nodeAffinity"]
        ["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let dir1 = shoal_agent::paths::volumes(api.agents[agent_of(&node1)].data_dir()).join(&volume1);
    assert!(dir1.is_dir());
    api.ok(0, &["delete", "pvc", "data-db-1"]);
    wait_until("the released volume reclaimed", LIMIT, || {
        let gone =
            json_of(&api, 0, &["get", "pv", &volume1, "-o", "json"]).is_null() && !dir1.exists();
        async move { gone }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", api.ok(0, &["get", "pv"])));

    // db-0's node stopped for good, its agent killed and its containers removed
    // (`shoal reset`), then started again: db-0 comes back there and finds its data.
    let a0 = api.agents.iter().position(|a| a.name() == node0).unwrap();
    let other = (a0 + 1) % api.agents.len();
    api.agents[a0].kill().unwrap();
    api.agents[a0].reset_node().unwrap();
    api.agents[a0].restart().await.unwrap();
    let mut seen = String::new();
    wait_until("db-0 started again with its data", 2 * LIMIT, || {
        let (_, out, _) = api.kubectl(other, &["exec", "db-0", "--", "cat", "/data/log"]);
        seen = out.clone();
        async move { out.matches("started db-0").count() == 3 }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {seen:?}"));

    // Its claim deleted while db-0 runs: the pvc-protection finalizer holds it (Terminating),
    // and its volume; once the StatefulSet and its pod are gone, both go.
    api.ok(other, &["delete", "pvc", "data-db-0", "--wait=false"]);
    let (_, out, err) = api.kubectl(other, &["get", "pvc", "data-db-0", "-o", "json"]);
    let claim0: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out} {err}"));
    assert_eq!(
        claim0["metadata"]["finalizers"],
        serde_json::json!(["kubernetes.io/pvc-protection"]),
        "{claim0}"
    );
    assert!(
        claim0["metadata"]["deletionTimestamp"].is_string(),
        "{claim0}"
    );
    let table = api.ok(other, &["get", "pvc", "data-db-0"]);
    assert!(table.contains("Terminating"), "{table}");
    let pv0 = json_of(&api, other, &["get", "pv", &volume0, "-o", "json"]);
    assert_eq!(
        pv0["metadata"]["finalizers"],
        serde_json::json!(["kubernetes.io/pv-protection"]),
        "{pv0}"
    );
    let (_, out, _) = api.kubectl(other, &["exec", "db-0", "--", "cat", "/data/log"]);
    assert_eq!(
        out.matches("started db-0").count(),
        3,
        "db-0 runs on: {out:?}"
    );
    api.ok(other, &["delete", "statefulset", "db"]);
    wait_until("the claim and its volume gone with db-0", LIMIT, || {
        let gone = json_of(&api, other, &["get", "pvc", "data-db-0", "-o", "json"]).is_null()
            && json_of(&api, other, &["get", "pv", &volume0, "-o", "json"]).is_null()
            && !dir0.exists();
        async move { gone }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", api.ok(other, &["get", "pvc,pv"])));
}

const META: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: greet}
data: {greeting: hello}
---
apiVersion: v1
kind: Pod
metadata:
  name: meta
  labels: {app: meta, tier: one}
  annotations: {note: first}
spec:
  nodeName: NODE
  initContainers:
  - name: side
    image: shoal.local/busybox:1
    restartPolicy: Always
    command: [sh, -c, 'trap "exit 0" TERM; while :; do sleep 1; done']
  containers:
  - name: app
    image: shoal.local/busybox:1
    command: [sh, -c, 'cat /meta/name; sleep 2; exit 1']
    resources: {limits: {memory: 64Mi}}
    volumeMounts:
    - {name: meta, mountPath: /meta}
    - {name: info, mountPath: /info}
  volumes:
  - name: meta
    projected:
      sources:
      - downwardAPI:
          items:
          - {path: labels, fieldRef: {fieldPath: metadata.labels}}
          - {path: name, fieldRef: {fieldPath: metadata.name}}
          - {path: mem, resourceFieldRef: {containerName: app, resource: limits.memory, divisor: 1Mi}}
      - configMap: {name: greet, items: [{key: greeting, path: cfg/greeting}]}
  - name: info
    downwardAPI:
      items: [{path: annotations, fieldRef: {fieldPath: metadata.annotations}}]
"#;

/// Issue #39: a projected volume (downward API and a ConfigMap) and a downwardAPI volume hold
/// the pod's fields, and follow a label and an annotation changed on the running pod; a native
/// sidecar keeps running while the main container crashes and restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downward_api_volumes_follow_the_pod_and_a_sidecar_outlives_app_restarts() {
    let api = lab().await;
    let node = api.agents[1].name().to_owned();
    let file = api.manifest("meta.yaml", &META.replace("NODE", &node));
    api.ok(0, &["apply", "-f", &file]);
    let pod = wait_pod(&api, 0, "meta", "the app started", |p| {
        super::container_status(p, "app")["restartCount"]
            .as_u64()
            .is_some_and(|n| n >= 1)
    })
    .await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    let volumes = api.agents[1]
        .data_dir()
        .join("pods")
        .join(&uid)
        .join("volumes");
    let read = |rel: &str| std::fs::read_to_string(volumes.join(rel)).unwrap_or_default();
    assert_eq!(read("meta/labels"), "app=\"meta\"\ntier=\"one\"");
    assert_eq!(read("meta/name"), "meta");
    assert_eq!(read("meta/mem"), "64");
    assert_eq!(read("meta/cfg/greeting"), "hello");
    // kubectl apply's own annotation is there too, as on Kubernetes.
    let has_line = |text: &str, line: &str| text.lines().any(|l| l == line);
    assert!(
        has_line(&read("info/annotations"), "note=\"first\""),
        "{}",
        read("info/annotations")
    );
    // The container reads them (its log: the name it read; the attempt that runs now may
    // not have printed yet, so waited for).
    let mut logs = String::new();
    wait_until("the app's log", LIMIT, || {
        logs = api.kubectl(0, &["logs", "meta", "-c", "app"]).1;
        let ok = logs.contains("meta");
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {logs:?}"));

    // Changed on the running pod: the files follow (no restart needed).
    api.ok(0, &["label", "pod", "meta", "tier=two", "--overwrite"]);
    api.ok(
        0,
        &["annotate", "pod", "meta", "note=second", "--overwrite"],
    );
    let mut seen = (String::new(), String::new());
    wait_until("the files to follow the pod", LIMIT, || {
        seen = (read("meta/labels"), read("info/annotations"));
        let ok = seen.0 == "app=\"meta\"\ntier=\"two\"" && has_line(&seen.1, "note=\"second\"");
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {seen:?}"));

    // The app keeps crashing and restarting; the sidecar runs on, never restarted.
    let pod = wait_pod(&api, 0, "meta", "the app restarted twice", |p| {
        super::container_status(p, "app")["restartCount"]
            .as_u64()
            .is_some_and(|n| n >= 2)
    })
    .await;
    let side = super::container_status(&pod, "side");
    assert_eq!(side["restartCount"], 0, "{side}");
    assert!(side["state"]["running"].is_object(), "{side}");
    assert_eq!(
        pod["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Initialized")
            .unwrap()["status"],
        "True"
    );
    api.ok(0, &["delete", "pod", "meta", "--grace-period=1"]);

    // README's stateful example, as README runs it (same cluster).
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/stateful.yaml");
    api.ok(1, &["apply", "-f", example]);
    api.ok(1, &["rollout", "status", "sts/store", "--timeout=90s"]);
    api.ok(1, &["delete", "pod", "store-0"]);
    let mut starts = String::new();
    wait_until("store-0 back with both starts", LIMIT, || {
        starts = api
            .kubectl(2, &["exec", "store-0", "--", "cat", "/data/starts"])
            .1;
        let ok = starts.lines().count() == 2;
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {starts:?}"));
    let claims = api.ok(0, &["get", "pvc"]);
    assert!(
        claims.contains("data-store-0") && claims.contains("Bound"),
        "{claims}"
    );
    api.ok(0, &["delete", "-f", example]);
}

const FILLERS: &str = r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: small}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: fill-dir}
spec:
  nodeName: NODE
  containers:
  - name: c
    image: shoal.local/busybox:1
    command: [sh, -c, 'dd if=/dev/zero of=/scratch/f bs=1024 count=3072; sleep 3600']
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes: [{name: scratch, emptyDir: {sizeLimit: 1Mi}}]
---
apiVersion: v1
kind: Pod
metadata: {name: fill-claim}
spec:
  nodeName: NODE
  containers:
  - name: c
    image: shoal.local/busybox:1
    command: [sh, -c, 'dd if=/dev/zero of=/data/f bs=1024 count=3072; sleep 3600']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: small}}]
---
apiVersion: v1
kind: Pod
metadata: {name: in-memory}
spec:
  nodeName: NODE
  containers:
  - name: c
    image: shoal.local/busybox:1
    command: [sh, -c, 'grep " /cache " /proc/mounts; dd if=/dev/zero of=/cache/f bs=1024 count=2048 2>/dev/null || echo FULL; sleep 3600']
    volumeMounts: [{name: cache, mountPath: /cache}]
  volumes: [{name: cache, emptyDir: {medium: Memory, sizeLimit: 1Mi}}]
"#;

/// Issue #39: limits on what volumes hold, with no quota in this kernel. A disk emptyDir past
/// its `sizeLimit` and a claim's volume past its capacity get their pods evicted (Failed,
/// reason Evicted, the kubelet's message and event), the claim's usage is on `/metrics` under
/// the kubelet's names, and a `Memory` emptyDir is a tmpfs of its size that the kernel fills
/// up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_past_their_limits_evict_their_pods_and_memory_volumes_are_tmpfs() {
    let api = lab().await;
    let node = api.agents[1].name().to_owned();
    let file = api.manifest("fillers.yaml", &FILLERS.replace("NODE", &node));
    api.ok(0, &["apply", "-f", &file]);
    let evicted =
        |p: &Value| p["status"]["phase"] == "Failed" && p["status"]["reason"] == "Evicted";
    let pod = wait_pod(&api, 0, "fill-dir", "evicted for its emptyDir", evicted).await;
    assert_eq!(
        pod["status"]["message"], "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\".",
        "{pod}"
    );
    let pod = wait_pod(&api, 2, "fill-claim", "evicted for its claim", evicted).await;
    let message = pod["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Usage of PersistentVolumeClaim \"small\" (volume \"data\") exceeds its capacity \"1Mi\""),
        "{message}"
    );
    let metrics = api.ok(1, &["get", "--raw", "/metrics"]);
    assert!(
        metrics.contains(
            "kubelet_volume_stats_capacity_bytes{namespace=\"default\",persistentvolumeclaim=\"small\"} 1048576"
        ) && metrics.contains(
            "kubelet_volume_stats_used_bytes{namespace=\"default\",persistentvolumeclaim=\"small\"}"
        ),
        "{metrics}"
    );
    // The claim may grow (its class allows expansion): its volume follows; never shrink.
    api.ok(
        0,
        &[
            "patch",
            "pvc",
            "small",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"8Mi"}}}}"#,
        ],
    );
    let mut claim = Value::Null;
    wait_until("the claim's volume grown", LIMIT, || {
        claim = json_of(&api, 2, &["get", "pvc", "small", "-o", "json"]);
        let ok = claim["status"]["capacity"]["storage"] == "8Mi";
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {claim}"));
    let (ok, _, err) = api.kubectl(
        0,
        &[
            "patch",
            "pvc",
            "small",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"4Mi"}}}}"#,
        ],
    );
    assert!(
        !ok && err.contains("field can not be less than previous value"),
        "{err}"
    );
    let events = api.ok(0, &["get", "events", "--field-selector", "reason=Evicted"]);
    assert!(
        events.contains("pod/fill-dir") && events.contains("pod/fill-claim"),
        "{events}"
    );
    // The memory-backed one: a tmpfs of 1Mi, full after 1Mi; nothing to evict.
    let mut logs = String::new();
    wait_until("the in-memory pod's log", LIMIT, || {
        logs = api.kubectl(0, &["logs", "in-memory"]).1;
        let ok = logs.contains("FULL");
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {logs:?}"));
    assert!(
        logs.contains("tmpfs /cache tmpfs") && logs.contains("size=1024k"),
        "{logs}"
    );
    let pod = pod_json(&api, 0, "in-memory");
    assert_eq!(pod["status"]["phase"], "Running", "{pod}");

    // A ReadWriteOncePod claim is one pod's: a second pod naming it waits until the first is
    // gone.
    let solo = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: shoal.local/busybox:1, command: [sleep, '3600'], volumeMounts: [{{name: v, mountPath: /v}}]}}]\n  volumes: [{{name: v, persistentVolumeClaim: {{claimName: solo}}}}]\n"
        )
    };
    let first = api.manifest(
        "solo-a.yaml",
        &format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: solo}}\nspec: {{accessModes: [ReadWriteOncePod], resources: {{requests: {{storage: 1Mi}}}}}}\n---\n{}",
            solo("solo-a")
        ),
    );
    api.ok(0, &["apply", "-f", &first]);
    wait_pod(&api, 0, "solo-a", "the claim's first pod running", |p| {
        p["status"]["phase"] == "Running"
    })
    .await;
    let second = api.manifest("solo-b.yaml", &solo("solo-b"));
    api.ok(0, &["apply", "-f", &second]);
    wait_pod(&api, 1, "solo-b", "the second pod refused the claim", |p| {
        p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["type"] == "PodScheduled"
                    && c["message"].as_str().is_some_and(|m| {
                        m.contains("node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode")
                    })
            })
    })
    .await;
    api.ok(0, &["delete", "pod", "solo-a", "--wait=true"]);
    wait_pod(
        &api,
        2,
        "solo-b",
        "the second pod running once the first is gone",
        |p| p["status"]["phase"] == "Running",
    )
    .await;
    api.ok(
        0,
        &[
            "delete",
            "-f",
            &second,
            "-f",
            &first,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ],
    );
    // A generic ephemeral volume: a claim made for the pod from its template, provisioned
    // where the pod runs, gone with the pod.
    let eph = api.manifest(
        "eph.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: eph}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{name: c, image: shoal.local/busybox:1, command: [sh, -c, 'echo kept > /scratch/f; sleep 3600'], volumeMounts: [{name: scratch, mountPath: /scratch}]}]\n  volumes:\n  - name: scratch\n    ephemeral:\n      volumeClaimTemplate:\n        metadata: {labels: {kind: scratch}}\n        spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 2Mi}}}\n",
    );
    api.ok(0, &["apply", "-f", &eph]);
    wait_pod(
        &api,
        1,
        "eph",
        "the pod with an ephemeral volume running",
        |p| p["status"]["phase"] == "Running",
    )
    .await;
    let claim = json_of(&api, 2, &["get", "pvc", "eph-scratch", "-o", "json"]);
    assert_eq!(claim["status"]["phase"], "Bound", "{claim}");
    assert_eq!(claim["metadata"]["labels"]["kind"], "scratch", "{claim}");
    assert_eq!(
        claim["metadata"]["ownerReferences"][0]["kind"], "Pod",
        "{claim}"
    );
    let volume = claim["spec"]["volumeName"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    api.ok(0, &["delete", "pod", "eph", "--wait=true"]);
    wait_until(
        "the ephemeral claim and its volume gone with the pod",
        LIMIT,
        || {
            let gone = json_of(&api, 0, &["get", "pvc", "eph-scratch", "-o", "json"]).is_null()
                && json_of(&api, 0, &["get", "pv", &volume, "-o", "json"]).is_null();
            async move { gone }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", api.ok(0, &["get", "pvc,pv"])));
    api.ok(0, &["delete", "-f", &file, "--wait=true", "--timeout=60s"]);
    // The tmpfs went with its pod.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let data_dir = api.agents[1].data_dir().display().to_string();
    assert!(
        !mounts
            .lines()
            .any(|l| l.contains(&data_dir) && l.contains("tmpfs")),
        "{mounts}"
    );
}

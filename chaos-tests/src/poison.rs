//! The poison scenario's hostile objects (issue #35): what once took a node, or every node, down,
//! and what fuzzing and reading the code suggest might. Each goes through a node's Kubernetes
//! API as `kubectl apply` would send it, and is expected to get a clear refusal (a 4xx naming
//! the field) or, when only the node can tell (a value from a ConfigMap), a condition on its
//! pods naming the cause — never to stop an agent or disturb the other workloads, which the
//! run's other checkers watch meanwhile.

use serde::Serialize;
use serde_json::{Value, json};

/// The label of the hostile objects' pods (checker 3 counts only the workload's own).
pub const POISON_APP: &str = "chaos-poison";

/// What a hostile object must get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// A 2xx: the set's own ConfigMap, which its DaemonSet reads.
    Accepted,
    /// A 4xx whose message contains `names` (the field, or the cause).
    Refused { names: &'static str },
    /// Accepted; each of its pods waits with `reason`, and a message containing `names`.
    PodsWait {
        reason: &'static str,
        names: &'static str,
    },
}

/// One hostile request.
#[derive(Debug, Clone)]
pub struct Hostile {
    pub name: String,
    pub path: String,
    pub body: Vec<u8>,
    pub expect: Expect,
    /// For [`Expect::PodsWait`]: the label selector of its pods.
    pub pods: Option<String>,
}

fn post(name: String, path: &str, object: &Value, expect: Expect) -> Hostile {
    Hostile {
        name,
        path: path.to_owned(),
        body: serde_json::to_vec(object).expect("json"),
        expect,
        pods: None,
    }
}

const PODS: &str = "/api/v1/namespaces/default/pods";
const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
const JOBS: &str = "/apis/batch/v1/namespaces/default/jobs";
const CRONJOBS: &str = "/apis/batch/v1/namespaces/default/cronjobs";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const DAEMONSETS: &str = "/apis/apps/v1/namespaces/default/daemonsets";

fn pod_template(env: Value) -> Value {
    json!({"metadata": {"labels": {"app": POISON_APP}},
           "spec": {"containers": [{"name": "c", "image": "shoal.local/busybox:1",
                                    "command": ["sleep", "3600"], "env": env}]}})
}

/// Bytes of the ConfigMap value a node expands twice: under the API's bound of one expanded
/// value (it cannot see it), over it at the node (2 × 100 KiB > 128 KiB).
const ENV_VALUE_BYTES: usize = 100 * 1024;

/// The hostile set, named with `tag` (one set per poison fault) so that its accepted objects
/// do not collide with an earlier set's. Its first request is the ConfigMap its DaemonSet
/// reads.
pub fn hostile_set(tag: &str) -> Vec<Hostile> {
    let job = |name: &str, counts: Value| {
        let mut spec = json!({"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "shoal.local/busybox:1"}]}}});
        for (k, v) in counts.as_object().expect("object") {
            spec[k] = v.clone();
        }
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec})
    };
    let refused = |names| Expect::Refused { names };
    let n = |what: &str| format!("chaos-poison-{what}-{tag}");
    let thousand = |var: &str| format!("$({var})").repeat(1000);
    let nested = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{}"}},"data":{}{}}}"#,
        n("nested"),
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let env_map = n("env");
    vec![
        post(
            env_map.clone(),
            CONFIGMAPS,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": env_map},
                    "data": {"A": "x".repeat(ENV_VALUE_BYTES)}}),
            Expect::Accepted,
        ),
        post(
            n("parallelism"),
            JOBS,
            &job(&n("parallelism"), json!({"parallelism": 1u64 << 40})),
            refused("spec.parallelism"),
        ),
        post(
            n("completions"),
            JOBS,
            &job(
                &n("completions"),
                json!({"completionMode": "Indexed", "completions": 1u64 << 62,
                       "parallelism": 1}),
            ),
            refused("spec.completions"),
        ),
        post(
            n("replicas"),
            DEPLOYMENTS,
            &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": n("replicas")},
                    "spec": {"replicas": 1u64 << 31,
                             "selector": {"matchLabels": {"app": POISON_APP}},
                             "template": pod_template(json!([]))}}),
            refused("spec.replicas"),
        ),
        post(
            n("expansion"),
            PODS,
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n("expansion"),
                        "labels": {"app": POISON_APP}},
                    "spec": {"containers": [{"name": "c", "image": "shoal.local/busybox:1",
                        "env": [{"name": "A", "value": "x".repeat(1024)},
                                {"name": "B", "value": thousand("A")},
                                {"name": "C", "value": thousand("B")}]}]}}),
            refused("spec.containers[0].env[1].value"),
        ),
        post(
            n("duplicate"),
            PODS,
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n("duplicate"),
                        "labels": {"app": POISON_APP}},
                    "spec": {"initContainers": [{"name": "c", "image": "shoal.local/busybox:1"}],
                             "containers": [{"name": "c", "image": "shoal.local/busybox:1"}]}}),
            refused("spec.containers[0].name"),
        ),
        post(
            n("large"),
            CONFIGMAPS,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n("large")},
                    "data": {"big": "x".repeat(3 << 20)}}),
            refused("at most"),
        ),
        post(
            n("object"),
            CONFIGMAPS,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n("object")},
                    "data": {"big": "x".repeat(2 << 20)}}),
            refused("bytes"),
        ),
        Hostile {
            name: n("nested"),
            path: CONFIGMAPS.to_owned(),
            body: nested.into_bytes(),
            expect: refused("not valid JSON"),
            pods: None,
        },
        post(
            n("traversal"),
            CONFIGMAPS,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "../../etc/shoal"}}),
            refused("metadata.name"),
        ),
        post(
            n("label"),
            CONFIGMAPS,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n("label"),
                        "labels": {"a": "x".repeat(64)}}}),
            refused("metadata.labels"),
        ),
        post(
            n("schedule"),
            CRONJOBS,
            &json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": n("schedule")},
                    "spec": {"schedule": "* * * * * * * * *",
                             "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
                                 "containers": [{"name": "c", "image": "shoal.local/busybox:1"}]}}}}}}),
            refused("spec.schedule"),
        ),
        Hostile {
            pods: Some(format!("app={POISON_APP},set={tag}")),
            ..post(
                n("daemon"),
                DAEMONSETS,
                &json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": n("daemon")},
                        "spec": {"selector": {"matchLabels": {"app": POISON_APP, "set": tag}},
                                 "template": {"metadata": {"labels": {"app": POISON_APP, "set": tag}},
                                     "spec": {"containers": [{"name": "c", "image": "shoal.local/busybox:1",
                                         "command": ["sleep", "3600"],
                                         "env": [{"name": "A", "valueFrom": {"configMapKeyRef":
                                                     {"name": env_map, "key": "A"}}},
                                                 {"name": "B", "value": "$(A)$(A)"}]}]}}}}),
                Expect::PodsWait {
                    reason: "CreateContainerConfigError",
                    names: "variable B",
                },
            )
        },
    ]
}

/// What a hostile request got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub name: String,
    pub node: usize,
    pub expect: Expect,
    /// The API's answer: status and message (0 and the error for no answer).
    pub status: u16,
    pub message: String,
    /// For [`Expect::PodsWait`]: each pod's node, waiting reason and message, as last seen.
    pub pods: Vec<(String, String, String)>,
}

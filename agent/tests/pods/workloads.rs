//! Workload controllers on real agents with real kubectl (issue #10): a Deployment's pods
//! run, `kubectl rollout status` returns, `kubectl set image` rolls with maxUnavailable 0
//! without the ready count dropping below replicas, `rollout undo` returns to the old
//! template, scaling, a deleted pod's replacement, quarantine by label, and deletion.

use std::time::Duration;

use serde_json::Value;
use shoal_chaos::testkit::wait_until;

use super::{LIMIT, json_of, lab, lab_with};

const WEB: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 3
      containers:
      - name: web
        image: shoal.local/httpd:1
        command: [httpd, -f, -p, "8080", -h, /]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
"#;

/// The Deployment's pods that are not being deleted (a controller's delete is graceful: the
/// pod shows Terminating until its node stopped it).
fn web_pods(api: &crate::api::ApiLab, agent: usize) -> Vec<Value> {
    all_web_pods(api, agent)
        .into_iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

fn all_web_pods(api: &crate::api::ApiLab, agent: usize) -> Vec<Value> {
    json_of(api, agent, &["get", "pods", "-l", "app=web", "-o", "json"])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The agent that owns `deployment/web` (the live node with the highest rendezvous hash of
/// its uid).
async fn owner_of_web(api: &crate::api::ApiLab) -> usize {
    let uid = json_of(api, 0, &["get", "deployment", "web", "-o", "json"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ids = Vec::new();
    for agent in &api.agents {
        let id = agent.client().self_info().await.unwrap().node_id;
        ids.push(u64::from_str_radix(&id, 16).unwrap());
    }
    let owner_id = shoal_core::placement::auction::auctioneer(&uid, ids.iter().copied()).unwrap();
    ids.iter().position(|id| *id == owner_id).unwrap()
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_runs_rolls_scales_and_heals_through_kubectl() {
    let api = lab().await;
    let file = api.manifest("web.yaml", WEB);
    api.ok(0, &["apply", "-f", &file]);
    let (ok, out, err) = api.kubectl(1, &["rollout", "status", "deployment/web", "--timeout=90s"]);
    assert!(
        ok,
        "rollout status: {out}{err}\npods: {:#}",
        Value::Array(
            web_pods(&api, 0)
                .iter()
                .map(|p| p["status"].clone())
                .collect()
        )
    );
    let pods = web_pods(&api, 2);
    assert_eq!(pods.len(), 3, "{pods:?}");
    assert!(pods.iter().all(ready));
    let first_rs = json_of(&api, 0, &["get", "rs", "-l", "app=web", "-o", "json"]);
    assert_eq!(first_rs["items"].as_array().map(Vec::len), Some(1));
    let rs = &first_rs["items"][0];
    assert_eq!(rs["metadata"]["ownerReferences"][0]["kind"], "Deployment");
    assert_eq!(
        rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "1"
    );

    // A new image, with maxUnavailable 0: sample the ready count all along the rollout, as
    // the Deployment's owner sees the pods (what it decides with; another agent's view of pod
    // statuses lags a gossip round behind the store's deletions).
    let owner = owner_of_web(&api).await;
    api.ok(
        0,
        &[
            "set",
            "image",
            "deployment/web",
            "web=shoal.local/busybox:1",
        ],
    );
    let mut lowest = usize::MAX;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let pods = web_pods(&api, owner);
        let ready_now = pods.iter().filter(|p| ready(p)).count();
        lowest = lowest.min(ready_now);
        let d = json_of(&api, 1, &["get", "deployment", "web", "-o", "json"]);
        let updated = d["status"]["updatedReplicas"].as_u64();
        let total = d["status"]["replicas"].as_u64();
        let available = d["status"]["availableReplicas"].as_u64();
        if updated == Some(3) && total == Some(3) && available == Some(3) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rollout did not finish: {}",
            d["status"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        lowest >= 3,
        "ready pods dropped to {lowest} during the rollout"
    );
    api.ok(2, &["rollout", "status", "deployment/web", "--timeout=60s"]);
    let images: Vec<String> = web_pods(&api, 0)
        .iter()
        .map(|p| {
            p["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(images, vec!["shoal.local/busybox:1"; 3]);
    let history = api.ok(0, &["rollout", "history", "deployment/web"]);
    assert!(history.contains('1') && history.contains('2'), "{history}");
    // The controllers said what they did, as Kubernetes' do: describe shows the Deployment's
    // scaling of its ReplicaSets, and the ReplicaSets' pod creations are Events of theirs.
    wait_until("the controllers' events", LIMIT, || {
        let describe = api.kubectl(2, &["describe", "deployment", "web"]).1;
        let rs_events = api
            .kubectl(
                1,
                &[
                    "get",
                    "events",
                    "--field-selector",
                    "involvedObject.kind=ReplicaSet,reason=SuccessfulCreate",
                ],
            )
            .1;
        let ok = describe.contains("ScalingReplicaSet")
            && describe.contains("Scaled up replica set web-")
            && describe.contains("Scaled down replica set web-")
            && rs_events.contains("Created pod: web-");
        async move { ok }
    })
    .await
    .unwrap();

    // Back to the first template.
    api.ok(1, &["rollout", "undo", "deployment/web"]);
    wait_until("the undo rolled back", LIMIT, || {
        let pods = web_pods(&api, 0);
        let ok = pods.len() == 3
            && pods.iter().all(ready)
            && pods
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "shoal.local/httpd:1");
        async move { ok }
    })
    .await
    .unwrap();

    // Paused, a Deployment takes a new template without rolling it out: over a window of
    // several controller passes, every pod keeps the old image and no second ReplicaSet gets
    // a replica. Resumed, it rolls.
    api.ok(2, &["rollout", "pause", "deployment/web"]);
    api.ok(
        0,
        &[
            "set",
            "image",
            "deployment/web",
            "web=shoal.local/busybox:1",
        ],
    );
    let window = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < window {
        let pods = web_pods(&api, 1);
        assert!(
            pods.iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "shoal.local/httpd:1"),
            "a paused Deployment rolled: {pods:?}"
        );
        let sets = json_of(&api, 0, &["get", "rs", "-l", "app=web", "-o", "json"]);
        let scaled = sets["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|rs| rs["spec"]["replicas"].as_u64() > Some(0))
            .count();
        assert_eq!(scaled, 1, "a paused Deployment scaled a new ReplicaSet");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let d = json_of(&api, 1, &["get", "deployment", "web", "-o", "json"]);
    let progressing = d["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Progressing")
        .cloned()
        .unwrap_or_default();
    assert_eq!(progressing["reason"], "DeploymentPaused", "{d}");
    api.ok(0, &["rollout", "resume", "deployment/web"]);
    api.ok(1, &["rollout", "status", "deployment/web", "--timeout=90s"]);
    wait_until("the resumed rollout", LIMIT, || {
        let pods = all_web_pods(&api, 0);
        let ok = pods.len() == 3
            && pods
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "shoal.local/busybox:1");
        async move { ok }
    })
    .await
    .unwrap();
    // `rollout restart` stamps the template (kubectl.kubernetes.io/restartedAt): every pod is
    // replaced by one of the stamped template.
    let before: Vec<String> = all_web_pods(&api, 0)
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    api.ok(2, &["rollout", "restart", "deployment/web"]);
    api.ok(0, &["rollout", "status", "deployment/web", "--timeout=90s"]);
    wait_until("every pod restarted", LIMIT, || {
        let pods = all_web_pods(&api, 1);
        let ok = pods.len() == 3
            && pods.iter().all(|p| {
                !before.iter().any(|b| p["metadata"]["name"] == b.as_str())
                    && p["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"].is_string()
            });
        async move { ok }
    })
    .await
    .unwrap();

    // Scale down, then a deleted pod is replaced, then a quarantined pod is replaced and kept.
    // The ReplicaSet's delete is graceful, as Kubernetes': the surplus pod is Terminating
    // (deletionTimestamp, its grace) while its node stops it (httpd ignores SIGTERM as PID 1,
    // so that takes the whole 3 s), then it is gone.
    api.ok(0, &["scale", "deployment/web", "--replicas=2"]);
    let mut terminating = None;
    wait_until(
        "scaled to 2, the surplus pod gone after terminating",
        LIMIT,
        || {
            let all = all_web_pods(&api, 2);
            if let Some(p) = all
                .iter()
                .find(|p| !p["metadata"]["deletionTimestamp"].is_null())
            {
                terminating = Some(p["metadata"].clone());
            }
            let ok = all.len() == 2 && terminating.is_some();
            async move { ok }
        },
    )
    .await
    .unwrap();
    let terminating = terminating.unwrap();
    assert_eq!(
        terminating["deletionGracePeriodSeconds"], 3,
        "{terminating}"
    );
    let victim = web_pods(&api, 0)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    api.ok(1, &["delete", "pod", &victim, "--grace-period=1"]);
    wait_until("a replacement", LIMIT, || {
        let pods = web_pods(&api, 0);
        let ok = pods.len() == 2
            && pods.iter().all(ready)
            && pods
                .iter()
                .all(|p| p["metadata"]["name"] != victim.as_str());
        async move { ok }
    })
    .await
    .unwrap();
    let quarantined = web_pods(&api, 0)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    api.ok(
        2,
        &["label", "pod", &quarantined, "app=debug", "--overwrite"],
    );
    wait_until("the quarantined pod replaced and kept", LIMIT, || {
        let serving = web_pods(&api, 0);
        let kept = json_of(&api, 0, &["get", "pod", &quarantined, "-o", "json"]);
        let ok = serving.len() == 2
            && kept["metadata"]["ownerReferences"]
                .as_array()
                .is_none_or(|r| r.is_empty());
        async move { ok }
    })
    .await
    .unwrap();

    // Deleting the Deployment takes its ReplicaSets and pods with it (not the quarantined one).
    api.ok(0, &["delete", "deployment", "web"]);
    wait_until("ReplicaSets and pods gone", LIMIT, || {
        let rs = json_of(&api, 1, &["get", "rs", "-o", "json"]);
        let ok = rs["items"].as_array().is_some_and(Vec::is_empty) && web_pods(&api, 1).is_empty();
        async move { ok }
    })
    .await
    .unwrap();
    api.ok(0, &["delete", "pod", &quarantined, "--grace-period=1"]);
}

/// The owner of a Deployment (the live node with the highest rendezvous hash of its uid) is
/// killed with -9 in the middle of a rollout: another agent becomes its owner and finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_agent_finishes_a_rollout_whose_owner_was_killed() {
    let mut api = lab().await;
    let file = api.manifest("web.yaml", WEB);
    api.ok(0, &["apply", "-f", &file]);
    api.ok(1, &["rollout", "status", "deployment/web", "--timeout=90s"]);
    let owner = owner_of_web(&api).await;
    let survivor = (owner + 1) % 3;
    api.ok(
        survivor,
        &[
            "set",
            "image",
            "deployment/web",
            "web=shoal.local/busybox:1",
        ],
    );
    api.agents[owner].kill().unwrap();
    let (ok, out, err) = api.kubectl(
        survivor,
        &["rollout", "status", "deployment/web", "--timeout=120s"],
    );
    assert!(
        ok,
        "rollout status after the owner's death: {out}{err}\npods: {:#}",
        Value::Array(
            web_pods(&api, survivor)
                .iter()
                .map(|p| serde_json::json!([
                    p["metadata"]["name"],
                    p["spec"]["nodeName"],
                    p["status"]["phase"]
                ]))
                .collect()
        )
    );
    let pods = web_pods(&api, survivor);
    assert_eq!(pods.len(), 3, "{pods:?}");
    assert!(pods.iter().all(ready));
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "shoal.local/busybox:1")
    );
}

const JOBS: &str = r#"apiVersion: batch/v1
kind: Job
metadata: {name: count}
spec:
  completions: 3
  parallelism: 2
  completionMode: Indexed
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: c, image: shoal.local/busybox:1, command: [sh, -c, "echo index=$JOB_COMPLETION_INDEX"]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: doomed}
spec:
  backoffLimit: 1
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: c, image: shoal.local/busybox:1, command: [sh, -c, "echo failing; exit 1"]}
"#;

fn job_pods(api: &crate::api::ApiLab, job: &str) -> Vec<Value> {
    json_of(
        api,
        0,
        &[
            "get",
            "pods",
            "-l",
            &format!("job-name={job}"),
            "-o",
            "json",
        ],
    )["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Jobs through kubectl: an Indexed Job of 3 completions, 2 at a time, completes with exactly 3
/// pods (`kubectl wait --for=condition=complete`, `kubectl logs job/NAME`), a failing one fails
/// after backoffLimit + 1 pods, and deleting a Job removes its pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_complete_and_fail_through_kubectl() {
    let api = lab().await;
    let file = api.manifest("jobs.yaml", JOBS);
    api.ok(0, &["apply", "-f", &file]);
    let (ok, out, err) = api.kubectl(
        1,
        &[
            "wait",
            "--for=condition=complete",
            "job/count",
            "--timeout=90s",
        ],
    );
    assert!(
        ok,
        "wait complete: {out}{err}\njob: {:#}\npods: {:#}",
        json_of(&api, 0, &["get", "job", "count", "-o", "json"])["status"],
        Value::Array(job_pods(&api, "count"))
    );
    let job = json_of(&api, 2, &["get", "job", "count", "-o", "json"]);
    assert_eq!(job["status"]["succeeded"], 3, "{:#}", job["status"]);
    assert_eq!(job["status"]["completedIndexes"], "0-2");
    assert_eq!(job["status"]["active"], 0);
    let pods = job_pods(&api, "count");
    assert_eq!(pods.len(), 3, "exactly one pod per index");
    let mut indexes: Vec<String> = pods
        .iter()
        .map(|p| {
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
                .as_str()
                .unwrap_or("?")
                .to_owned()
        })
        .collect();
    indexes.sort();
    assert_eq!(indexes, ["0", "1", "2"]);
    let logs = api.ok(0, &["logs", "job/count"]);
    assert!(logs.contains("index="), "{logs}");
    let table = api.ok(1, &["get", "jobs"]);
    assert!(table.contains("3/3"), "{table}");

    let (ok, out, err) = api.kubectl(
        0,
        &[
            "wait",
            "--for=condition=failed",
            "job/doomed",
            "--timeout=90s",
        ],
    );
    assert!(
        ok,
        "wait failed: {out}{err}\njob: {:#}",
        json_of(&api, 0, &["get", "job", "doomed", "-o", "json"])["status"]
    );
    let job = json_of(&api, 1, &["get", "job", "doomed", "-o", "json"]);
    assert_eq!(job["status"]["failed"], 2, "{:#}", job["status"]);
    assert_eq!(
        job["status"]["conditions"][1]["reason"],
        "BackoffLimitExceeded"
    );
    assert_eq!(
        job_pods(&api, "doomed").len(),
        2,
        "backoffLimit 1: two tries"
    );

    api.ok(2, &["delete", "job", "count"]);
    wait_until("count's pods deleted", LIMIT, || async {
        job_pods(&api, "count").is_empty()
    })
    .await
    .unwrap();
}

const BATCH: &str = r#"apiVersion: batch/v1
kind: Job
metadata: {name: batch}
spec:
  completions: 10
  parallelism: 3
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: c, image: shoal.local/busybox:1, command: [sh, -c, "sleep 2; echo done"]}
"#;

/// A Job of 10 completions, 3 at a time, completes exactly 10 although a node running one of
/// its pods is killed with -9 (its pods are auctioned again; the ledger counts each once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_completes_exactly_once_per_completion_when_a_node_dies() {
    let mut api = crate::api::ApiLab::start_with(3, |_| {
        vec![
            "--restart-backoff".into(),
            "1s".into(),
            "--eviction-delay".into(),
            "1s".into(),
        ]
    })
    .await;
    for agent in 0..3 {
        super::import_image(
            &api,
            agent,
            &crate::runtime::test_images().join("busybox-1.oci.tar"),
            None,
        );
    }
    let file = api.manifest("batch.yaml", BATCH);
    api.ok(0, &["apply", "-f", &file]);
    // A node other than n0 (the API used from here on) running one of the pods.
    let mut victim = None;
    wait_until("a pod of the job running on n1 or n2", LIMIT, || {
        victim = job_pods(&api, "batch").iter().find_map(|p| {
            let node = p["spec"]["nodeName"].as_str()?;
            (p["status"]["phase"] == "Running" && node != "n0")
                .then(|| node.trim_start_matches('n').parse::<usize>().ok())
                .flatten()
        });
        let found = victim.is_some();
        async move { found }
    })
    .await
    .unwrap();
    let victim = victim.unwrap();
    api.agents[victim].kill().unwrap();
    let (ok, out, err) = api.kubectl(
        0,
        &[
            "wait",
            "--for=condition=complete",
            "job/batch",
            "--timeout=150s",
        ],
    );
    let job = json_of(&api, 0, &["get", "job", "batch", "-o", "json"]);
    assert!(ok, "wait complete: {out}{err}\nstatus: {:#}", job["status"]);
    assert_eq!(job["status"]["succeeded"], 10, "{:#}", job["status"]);
    let recorded = job["metadata"]["annotations"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, v)| {
            k.starts_with("batch.shoal.io/done-") && v.as_str().unwrap().contains("Succeeded")
        })
        .count();
    assert_eq!(recorded, 10, "one ledger entry per completion");
}

const CRON: &str = r#"apiVersion: batch/v1
kind: CronJob
metadata: {name: tick}
spec:
  schedule: "* * * * *"
  successfulJobsHistoryLimit: 2
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
          - {name: c, image: shoal.local/busybox:1, command: [sh, -c, "echo tick"]}
"#;

/// A CronJob every minute (real kubectl, real containers): at the next minute exactly one Job
/// is created for it and completes, its status shows the schedule and success times, and a
/// schedule that does not parse is refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_job_runs_one_job_per_scheduled_time() {
    let api = lab().await;
    let bad = api.manifest("bad.yaml", &CRON.replace("* * * * *", "61 * * * *"));
    let (ok, _, err) = api.kubectl(0, &["apply", "-f", &bad]);
    assert!(!ok && err.contains("spec.schedule"), "{err}");
    let file = api.manifest("cron.yaml", CRON);
    api.ok(0, &["apply", "-f", &file]);
    let table = api.ok(1, &["get", "cronjobs"]);
    assert!(
        table.contains("* * * * *") && table.contains("SCHEDULE"),
        "{table}"
    );

    let mut cron = Value::Null;
    let succeeded = wait_until(
        "a Job of the CronJob to succeed",
        Duration::from_secs(120),
        || {
            cron = json_of(&api, 2, &["get", "cronjob", "tick", "-o", "json"]);
            let done = cron["status"]["lastSuccessfulTime"].is_string();
            async move { done }
        },
    )
    .await;
    let jobs = json_of(&api, 0, &["get", "jobs", "-o", "json"])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        succeeded.is_ok(),
        "cronjob status: {:#}\njobs: {:#}",
        cron["status"],
        Value::Array(jobs.clone())
    );
    let last = cron["status"]["lastScheduleTime"]
        .as_str()
        .unwrap()
        .to_owned();
    let for_last: Vec<&Value> = jobs
        .iter()
        .filter(|j| {
            j["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
                == last.as_str()
        })
        .collect();
    assert_eq!(for_last.len(), 1, "one Job per scheduled time: {jobs:#?}");
    let name = for_last[0]["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("tick-"), "{name}");
    assert_eq!(
        for_last[0]["metadata"]["ownerReferences"][0]["kind"],
        "CronJob"
    );
    // The last scheduled Job may be a newer one than the success seen above (a minute turned
    // meanwhile): its pod's log is there once it completes.
    api.ok(
        1,
        &[
            "wait",
            "--for=condition=complete",
            &format!("job/{name}"),
            "--timeout=90s",
        ],
    );
    let logs = api.ok(1, &["logs", &format!("job/{name}")]);
    assert!(logs.contains("tick"), "{logs}");
}

/// The every-day node operations: label, taint, cordon, drain and uncordon, each through a
/// different agent; they are desired state (NodeSettings), so every agent's scheduler and API
/// see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_labelled_tainted_cordoned_and_drained_with_kubectl() {
    let api = lab().await;
    let on = |agent: usize, node: &str| -> Vec<String> {
        web_pods(&api, agent)
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node)
            .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    // A label placed through agent 0 steers a pod scheduled through agent 2.
    api.ok(0, &["label", "node", "n2", "disk=ssd"]);
    assert_eq!(
        api.ok(1, &["get", "nodes", "-l", "disk=ssd", "-o", "name"]),
        "node/n2\n"
    );
    let pinned = api.manifest(
        "pinned.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: pinned}\nspec:\n  nodeSelector: {disk: ssd}\n  containers: [{name: c, image: shoal.local/busybox:1, command: [sleep, '1000']}]\n",
    );
    api.ok(2, &["apply", "-f", &pinned]);
    wait_until("pinned bound to n2", LIMIT, || {
        let node =
            json_of(&api, 1, &["get", "pod", "pinned", "-o", "json"])["spec"]["nodeName"].clone();
        async move { node == "n2" }
    })
    .await
    .unwrap();
    // A taint through agent 1 keeps new pods off n0 unless they tolerate it.
    api.ok(1, &["taint", "nodes", "n0", "dedicated=db:NoSchedule"]);
    let describe = api.ok(2, &["describe", "node", "n0"]);
    assert!(describe.contains("dedicated=db:NoSchedule"), "{describe}");
    let (ok, _, err) = api.kubectl(
        0,
        &[
            "label",
            "node",
            "n0",
            "kubernetes.io/hostname=elsewhere",
            "--overwrite",
        ],
    );
    assert!(
        !ok && err.contains("the agent sets this label from its host"),
        "{err}"
    );

    let file = api.manifest("web.yaml", WEB);
    api.ok(0, &["apply", "-f", &file]);
    api.ok(1, &["rollout", "status", "deployment/web", "--timeout=90s"]);
    assert!(on(0, "n0").is_empty(), "n0 is tainted: {:?}", on(0, "n0"));
    let before_on_n1 = on(0, "n1");
    // Cordon and drain n1 through agent 2: its web pods are evicted and replaced elsewhere.
    let out = api.ok(
        2,
        &[
            "drain",
            "n1",
            "--ignore-daemonsets",
            "--timeout=60s",
            "--grace-period=1",
        ],
    );
    assert!(out.contains("drained"), "{out}");
    assert!(
        api.ok(0, &["get", "node", "n1"])
            .contains("Ready,SchedulingDisabled"),
        "a drained node is cordoned"
    );
    api.ok(1, &["rollout", "status", "deployment/web", "--timeout=90s"]);
    wait_until("web's pods off n1, three ready elsewhere", LIMIT, || {
        let pods = web_pods(&api, 1);
        let ok = pods.len() == 3
            && pods.iter().all(ready)
            && pods.iter().all(|p| p["spec"]["nodeName"] == "n2");
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: before {before_on_n1:?}, now {:?}", web_pods(&api, 1)));
    // Nothing is scheduled onto the cordoned node; uncordoned, it takes pods again.
    api.ok(0, &["scale", "deployment", "web", "--replicas=4"]);
    api.ok(1, &["rollout", "status", "deployment/web", "--timeout=90s"]);
    assert!(on(2, "n1").is_empty(), "{:?}", on(2, "n1"));
    api.ok(1, &["uncordon", "n1"]);
    assert!(
        !api.ok(2, &["get", "node", "n1"])
            .contains("SchedulingDisabled")
    );
    api.ok(0, &["taint", "nodes", "n0", "dedicated=db:NoSchedule-"]);
    api.ok(0, &["delete", "deployment", "web"]);
    api.ok(0, &["delete", "pod", "pinned", "--wait=false"]);
}

/// Pods that burn CPU (up to their 200m limit, 4× their 50m request) until the Unix time
/// `UNTIL`, then idle: the same deadline for the pods the autoscaler adds.
const BURNER: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: burn}
spec:
  replicas: 1
  selector: {matchLabels: {app: burn}}
  template:
    metadata: {labels: {app: burn}}
    spec:
      containers:
      - name: burn
        image: shoal.local/busybox:1
        command: [sh, -c, 'while [ "$(date +%s)" -lt "$UNTIL" ]; do :; done; exec sleep 3600']
        env: [{name: UNTIL, value: "@UNTIL@"}]
        resources: {requests: {cpu: 50m}, limits: {cpu: 200m}}
"#;

fn replicas_of(api: &crate::api::ApiLab, agent: usize, deployment: &str) -> Option<i64> {
    json_of(api, agent, &["get", "deployment", deployment, "-o", "json"])["spec"]["replicas"]
        .as_i64()
}

/// `kubectl autoscale` of a CPU-burning Deployment: the HPA (owned by one agent, synced from
/// the usage every node samples) scales it up to maxReplicas while it burns and, once the
/// load stops and the (patched, 5 s) scale-down window has passed, back to minReplicas;
/// `kubectl get hpa` shows current/target utilisation, and the rescales are Events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autoscaler_scales_a_cpu_burning_deployment_up_and_back_down() {
    let api = lab_with(&["--hpa-sync-period", "2s"]).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let until = now + 45;
    let file = api.manifest("burn.yaml", &BURNER.replace("@UNTIL@", &until.to_string()));
    api.ok(0, &["apply", "-f", &file]);
    // Refused naming the field, as the apiserver does.
    let bad = api.manifest(
        "bad-hpa.yaml",
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: bad}\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: burn}\n  minReplicas: 4\n  maxReplicas: 2\n",
    );
    let (ok, _, err) = api.kubectl(0, &["apply", "-f", &bad]);
    assert!(!ok && err.contains("spec.minReplicas"), "{err}");
    api.ok(
        1,
        &[
            "autoscale",
            "deployment",
            "burn",
            "--cpu=50%",
            "--min=1",
            "--max=3",
        ],
    );
    let hpa = json_of(&api, 2, &["get", "hpa", "burn", "-o", "json"]);
    assert_eq!(hpa["apiVersion"], "autoscaling/v2", "{hpa:#}");
    assert_eq!(
        hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        50
    );

    let scaled_up = wait_until(
        "the autoscaler to reach 3 replicas",
        Duration::from_secs(40),
        || {
            let replicas = replicas_of(&api, 2, "burn");
            async move { replicas == Some(3) }
        },
    )
    .await;
    let hpa = json_of(&api, 0, &["get", "hpa", "burn", "-o", "json"]);
    assert!(scaled_up.is_ok(), "hpa: {:#}", hpa["status"]);
    let utilization =
        hpa["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"].as_u64();
    assert!(utilization.is_some_and(|u| u > 50), "{:#}", hpa["status"]);
    let table = api.ok(1, &["get", "hpa", "burn"]);
    eprintln!("{table}");
    assert!(
        table.contains("cpu: ") && table.contains("%/50%") && table.contains("Deployment/burn"),
        "{table}"
    );
    // Scaling down waits 5 minutes by default: this one waits 5 s.
    api.ok(
        2,
        &[
            "patch",
            "hpa",
            "burn",
            "--type=merge",
            "-p",
            r#"{"spec":{"behavior":{"scaleDown":{"stabilizationWindowSeconds":5}}}}"#,
        ],
    );
    let stored = json_of(&api, 0, &["get", "hpa", "burn", "-o", "json"]);
    assert_eq!(
        stored["spec"]["behavior"]["scaleDown"]["policies"][0]["type"], "Percent",
        "behavior defaulted: {:#}",
        stored["spec"]
    );
    // Up to 3 replicas while the pods burn: never more than maxReplicas.
    let mut most = 0;
    let scaled_down = wait_until(
        "the autoscaler to return to 1 replica once the load stopped",
        Duration::from_secs(90),
        || {
            let replicas = replicas_of(&api, 1, "burn").unwrap_or(0);
            most = most.max(replicas);
            async move { replicas == 1 }
        },
    )
    .await;
    let hpa = json_of(&api, 0, &["get", "hpa", "burn", "-o", "json"]);
    assert!(scaled_down.is_ok(), "hpa: {:#}", hpa["status"]);
    assert!(most <= 3, "scaled beyond maxReplicas: {most}");
    let ended = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(ended >= until, "scaled down while the pods still burned");
    assert_eq!(hpa["status"]["desiredReplicas"], 1, "{:#}", hpa["status"]);
    let events = api.ok(
        2,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.kind=HorizontalPodAutoscaler,reason=SuccessfulRescale",
        ],
    );
    eprintln!("{events}");
    let described = api.ok(1, &["describe", "hpa", "burn"]);
    assert!(
        described.contains("ScalingActive")
            && described.contains("ValidMetricFound")
            && described.contains("SuccessfulRescale"),
        "{described}"
    );
    assert!(
        events.contains(
            "New size: 3; reason: cpu resource utilization (percentage of request) above target"
        ) && events.contains("New size: 1; reason: All metrics below target"),
        "{events}"
    );
}

/// Deleting a pod is graceful, as in Kubernetes: the pod stays, shown being deleted with its
/// grace period, while its node stops it (its shell traps TERM and takes a while to leave);
/// its ReplicaSet does not count it and starts a replacement meanwhile; then the node deletes
/// it. `--grace-period=0 --force` removes a pod at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pod_is_graceful_and_its_replica_set_replaces_it_meanwhile() {
    let api = lab().await;
    let file = api.manifest(
        "term.yaml",
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: term}
spec:
  replicas: 1
  selector: {matchLabels: {app: term}}
  template:
    metadata: {labels: {app: term}}
    spec:
      terminationGracePeriodSeconds: 20
      containers:
      - name: c
        image: shoal.local/busybox:1
        command: [sh, -c, 'trap "sleep 4; exit 0" TERM; while :; do sleep 1; done']
"#,
    );
    api.ok(0, &["apply", "-f", &file]);
    let pods = |agent: usize| {
        json_of(
            &api,
            agent,
            &["get", "pods", "-l", "app=term", "-o", "json"],
        )["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    wait_until("term's pod to run", LIMIT, || {
        let p = pods(0);
        let ok = p.len() == 1 && p[0]["status"]["phase"] == "Running";
        async move { ok }
    })
    .await
    .unwrap();
    let first = pods(0)[0]["metadata"]["name"].as_str().unwrap().to_owned();
    api.ok(1, &["delete", "pod", &first, "--wait=false"]);
    let (_, out, err) = api.kubectl(2, &["get", "pod", &first, "-o", "json"]);
    let terminating: Value = serde_json::from_str(&out).unwrap_or_else(|_| {
        let logs: Vec<String> = api
            .agents
            .iter()
            .flat_map(|a| {
                a.log()
                    .lines()
                    .filter(|l| l.contains("deleted") || l.contains("term-"))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        panic!("{err}\n{}", logs.join("\n"))
    });
    assert!(
        terminating["metadata"]["deletionTimestamp"].is_string(),
        "{:#}",
        terminating["metadata"]
    );
    assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 20);
    // The replacement starts while the first one is still terminating.
    let mut both = false;
    wait_until("a replacement beside the terminating pod", LIMIT, || {
        let p = pods(0);
        both |= p.len() == 2
            && p.iter().any(|p| {
                p["metadata"]["name"] == first.as_str()
                    && p["metadata"]["deletionTimestamp"].is_string()
            })
            && p.iter()
                .any(|p| p["metadata"]["deletionTimestamp"].is_null());
        let ok = both;
        async move { ok }
    })
    .await
    .unwrap();
    api.ok(
        0,
        &[
            "wait",
            "--for=delete",
            &format!("pod/{first}"),
            "--timeout=60s",
        ],
    );
    let replacement = pods(1)
        .iter()
        .find(|p| p["metadata"]["deletionTimestamp"].is_null())
        .and_then(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .unwrap();
    api.ok(
        2,
        &["delete", "pod", &replacement, "--grace-period=0", "--force"],
    );
    let (ok, _, err) = api.kubectl(2, &["get", "pod", &replacement]);
    assert!(
        !ok && err.contains("NotFound"),
        "force-deleted at once: {err}"
    );
    api.ok(0, &["delete", "deployment", "term"]);
}

/// A Job whose pod exits 42, with a podFailurePolicy that fails the Job on 42: it fails on the
/// first pod (reason `PodFailurePolicy`), where its backoffLimit of 6 would otherwise retry for
/// minutes; a policy the apiserver would refuse is refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_failure_policy_fails_a_job_on_its_first_matching_exit_code() {
    let api = lab().await;
    let job = |restart: &str| {
        format!(
            r#"apiVersion: batch/v1
kind: Job
metadata: {{name: fatal}}
spec:
  backoffLimit: 6
  podFailurePolicy:
    rules:
    - {{action: FailJob, onExitCodes: {{containerName: c, operator: In, values: [42]}}}}
    - {{action: Ignore, onExitCodes: {{operator: In, values: [7]}}}}
  template:
    spec:
      restartPolicy: {restart}
      containers:
      - {{name: c, image: shoal.local/busybox:1, command: [sh, -c, "exit 42"]}}
"#
        )
    };
    let (ok, _, err) = api.kubectl(
        0,
        &["apply", "-f", &api.manifest("bad.yaml", &job("OnFailure"))],
    );
    assert!(
        !ok && err.contains("spec.template.spec.restartPolicy"),
        "{err}"
    );
    api.ok(
        1,
        &["apply", "-f", &api.manifest("fatal.yaml", &job("Never"))],
    );
    let (ok, out, err) = api.kubectl(
        2,
        &[
            "wait",
            "--for=condition=failed",
            "job/fatal",
            "--timeout=60s",
        ],
    );
    assert!(ok, "{out}{err}");
    let j = json_of(&api, 0, &["get", "job", "fatal", "-o", "json"]);
    let failed = j["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Failed")
        .cloned()
        .unwrap();
    assert_eq!(failed["reason"], "PodFailurePolicy", "{failed:#}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("failed with exit code 42 matching FailJob rule at index 0"),
        "{failed:#}"
    );
    assert_eq!(j["status"]["failed"], 1);
    assert_eq!(
        job_pods(&api, "fatal").len(),
        1,
        "no retry after a FailJob rule"
    );
}

/// `kubectl set image` on a DaemonSet rolls it node by node (RollingUpdate, maxUnavailable 1):
/// sampled all along, never more than one of its three nodes is without an available pod;
/// `kubectl rollout status` returns once every node runs the new template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_set_rolls_to_a_new_template_one_node_at_a_time() {
    let api = lab().await;
    let file = api.manifest(
        "ds.yaml",
        r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers:
      - name: c
        image: shoal.local/busybox:1
        command: [sh, -c, 'trap "exit 0" TERM; while :; do sleep 1; done']
        # Each replacement stays unready for 2 s, long enough to be seen (the check below
        # needs to see some).
        readinessProbe:
          exec: {command: ["true"]}
          initialDelaySeconds: 2
          periodSeconds: 1
"#,
    );
    api.ok(0, &["apply", "-f", &file]);
    api.ok(
        1,
        &["rollout", "status", "daemonset/agent", "--timeout=90s"],
    );
    let pods = |agent: usize| {
        json_of(
            &api,
            agent,
            &["get", "pods", "-l", "app=agent", "-o", "json"],
        )["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(pods(0).len(), 3);
    api.ok(
        2,
        &["set", "image", "daemonset/agent", "c=shoal.local/httpd:1"],
    );
    let available = |p: &Value| ready(p) && p["metadata"]["deletionTimestamp"].is_null();
    // Each node's pod as its own agent sees it (its delete and its pod's status are local
    // there), timed: three calls one after another are no snapshot, so what is checked is
    // that no two nodes were certainly without an available pod at one moment
    // (`both_unavailable`).
    let mut seen: Vec<Seen> = Vec::new();
    let observe = |seen: &mut Vec<Seen>| {
        for i in 0..api.agents.len() {
            let start = std::time::Instant::now();
            let here = pods(i)
                .iter()
                .any(|p| p["spec"]["nodeName"] == api.agents[i].name() && available(p));
            seen.push(Seen {
                node: i,
                start,
                end: std::time::Instant::now(),
                available: here,
            });
        }
    };
    let rolled = wait_until(
        "the DaemonSet to run the new image everywhere",
        LIMIT,
        || {
            let now = pods(0);
            observe(&mut seen);
            let done = now.len() == 3
                && now.iter().all(|p| {
                    available(p) && p["spec"]["containers"][0]["image"] == "shoal.local/httpd:1"
                });
            async move { done }
        },
    )
    .await;
    let ds = json_of(&api, 0, &["get", "daemonset", "agent", "-o", "json"]);
    assert!(
        rolled.is_ok(),
        "status: {:#}\npods: {:#?}",
        ds["status"],
        pods(0)
    );
    let unavailable = seen.iter().filter(|s| !s.available).count();
    assert!(unavailable > 0, "no replacement was ever observed");
    assert_eq!(
        both_unavailable(&seen),
        None,
        "two nodes were without an available pod at once (maxUnavailable 1)"
    );
    assert_eq!(
        ds["status"]["updatedNumberScheduled"], 3,
        "{:#}",
        ds["status"]
    );
    api.ok(
        1,
        &["rollout", "status", "daemonset/agent", "--timeout=30s"],
    );
    // Its template history (ControllerRevisions): two revisions, and undo brings the first
    // template back (issue #39).
    let mut history = String::new();
    wait_until("the DaemonSet's two revisions", LIMIT, || {
        history = api.kubectl(0, &["rollout", "history", "daemonset/agent"]).1;
        let ok = history.lines().any(|l| l.trim_start().starts_with('2'));
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {history}"));
    api.ok(0, &["rollout", "undo", "daemonset/agent"]);
    let undone = wait_until("the first template back everywhere", LIMIT, || {
        let now = pods(0);
        let done = now.len() == 3
            && now.iter().all(|p| {
                available(p) && p["spec"]["containers"][0]["image"] == "shoal.local/busybox:1"
            });
        async move { done }
    })
    .await;
    assert!(undone.is_ok(), "{:#?}", pods(0));
}

/// Whether one node had an available pod, as a call that ran from `start` to `end` saw it.
struct Seen {
    node: usize,
    start: std::time::Instant,
    end: std::time::Instant,
    available: bool,
}

/// Two nodes certainly without an available pod at the same moment. A node's stretch of
/// unavailability (consecutive unavailable observations) surely covers the span from the end
/// of its first call to the start of its last; two such spans of different nodes overlapping
/// prove it. (Sound, not complete: a stretch seen once proves nothing.)
fn both_unavailable(seen: &[Seen]) -> Option<(usize, usize)> {
    let mut spans: Vec<(usize, std::time::Instant, std::time::Instant)> = Vec::new();
    let nodes: std::collections::BTreeSet<usize> = seen.iter().map(|s| s.node).collect();
    for node in nodes {
        let mut mine: Vec<&Seen> = seen.iter().filter(|s| s.node == node).collect();
        mine.sort_by_key(|s| s.start);
        for stretch in mine.split(|s| s.available) {
            if let (Some(first), Some(last)) = (stretch.first(), stretch.last())
                && first.end <= last.start
            {
                spans.push((node, first.end, last.start));
            }
        }
    }
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                return Some((a.0.min(b.0), a.0.max(b.0)));
            }
        }
    }
    None
}

/// The checker fails on overlapping stretches and only on them.
#[test]
fn both_unavailable_needs_overlapping_certain_stretches() {
    let t0 = std::time::Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let seen = |node, from: u64, available| Seen {
        node,
        start: at(from),
        end: at(from + 100),
        available,
    };
    // Node 0 out from 0 to 400 ms, node 1 from 500 ms: one at a time.
    let one_at_a_time = [
        seen(0, 0, false),
        seen(0, 300, false),
        seen(0, 600, true),
        seen(1, 500, false),
        seen(1, 800, false),
        seen(1, 1100, true),
    ];
    assert_eq!(both_unavailable(&one_at_a_time), None);
    // Sequential calls that only look like two at once: node 1 seen out once, between.
    let artefact = [seen(0, 0, false), seen(1, 100, false), seen(0, 200, true)];
    assert_eq!(both_unavailable(&artefact), None);
    // Both out across 100..300 ms.
    let violation = [
        seen(0, 0, false),
        seen(1, 50, false),
        seen(0, 300, false),
        seen(1, 350, false),
    ];
    assert_eq!(both_unavailable(&violation), Some((0, 1)));
}

/// The nodes of the `node-agent` DaemonSet's ready pods, as agent 0 sees them, sorted.
fn ready_daemon_nodes(api: &crate::api::ApiLab) -> Vec<String> {
    let mut nodes: Vec<String> = json_of(
        api,
        0,
        &["get", "pods", "-l", "app=node-agent", "-o", "json"],
    )["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| ready(p))
        .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
        .collect();
    nodes.sort();
    nodes
}

/// Waits until agent 0 sees the `node-agent` pods ready on exactly `want` (it learns other
/// agents' pod statuses by gossip, a moment after they know them).
async fn wait_daemon_nodes(api: &crate::api::ApiLab, want: &[&str]) {
    let reached = wait_until("the DaemonSet's pods ready on the nodes", LIMIT, || {
        let nodes = ready_daemon_nodes(api);
        async move { nodes == want }
    })
    .await;
    assert!(
        reached.is_ok(),
        "{:?}, not {want:?}",
        ready_daemon_nodes(api)
    );
}

const FOLLOWERS: &str = r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: node-agent}
spec:
  selector: {matchLabels: {app: node-agent}}
  template:
    metadata: {labels: {app: node-agent}}
    spec:
      containers:
      - name: c
        image: shoal.local/busybox:1
        command: [sh, -c, 'trap "exit 0" TERM; while :; do sleep 1; done']
---
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: frontend
  labels: {app: guestbook, tier: frontend}
spec:
  replicas: 3
  selector:
    matchLabels: {tier: frontend}
  template:
    metadata:
      labels: {tier: frontend}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: php-redis
        image: shoal.local/httpd:1
        command: [httpd, -f, -p, "8080", -h, /]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
"#;

/// A DaemonSet follows nodes joining and leaving, and a standalone ReplicaSet (the
/// `frontend` of Kubernetes' ReplicaSet page) keeps its count through it (real agents, real
/// containers, real kubectl): a third node joins and gets the DaemonSet's pod; killed -9 and
/// forgotten by the membership (`dead-node-grace-period`, 3 s here; Kubernetes: the Node
/// deleted), its DaemonSet pod is deleted, the DaemonSet wants two pods again and its rollout
/// status returns, and the ReplicaSet — scaled to 5 onto the new node while the others were
/// cordoned — has exactly 5 ready pods again, none on the node that left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_set_follows_nodes_joining_and_leaving_and_a_replica_set_keeps_its_count() {
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("agent.toml");
    std::fs::write(&config, "[gossip]\ndead-node-grace-period = \"3s\"\n").unwrap();
    let flags = |_: usize| -> Vec<String> {
        [
            "--restart-backoff",
            "1s",
            "--eviction-delay",
            "1s",
            "--config",
            config.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    };
    let mut api = crate::api::ApiLab::start_with(2, flags).await;
    let images = ["busybox-1.oci.tar", "httpd-1.oci.tar"];
    let import_all = |api: &crate::api::ApiLab, agent: usize| {
        for image in images {
            super::import_image(api, agent, &crate::runtime::test_images().join(image), None);
        }
    };
    for agent in 0..2 {
        import_all(&api, agent);
    }
    let file = api.manifest("followers.yaml", FOLLOWERS);
    api.ok(0, &["apply", "-f", &file]);
    api.ok(
        1,
        &["rollout", "status", "daemonset/node-agent", "--timeout=90s"],
    );
    wait_daemon_nodes(&api, &["n0", "n1"]).await;
    let frontend_ready = |api: &crate::api::ApiLab| -> Vec<Value> {
        json_of(
            api,
            0,
            &["get", "pods", "-l", "tier=frontend", "-o", "json"],
        )["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    api.ok(
        0,
        &[
            "wait",
            "--for=jsonpath={.status.readyReplicas}=3",
            "replicaset/frontend",
            "--timeout=90s",
        ],
    );

    // A node joins: the DaemonSet runs there too.
    let seed = api.agents[0].gossip_addr();
    let spec = flags(2).into_iter().fold(
        api.lab
            .spec("n2")
            .join(seed)
            .arg("--api")
            .arg("127.0.0.1:0"),
        |s, a| s.arg(a),
    );
    api.agents.push(
        shoal_chaos::testkit::AgentProcess::start(spec)
            .await
            .unwrap(),
    );
    import_all(&api, 2);
    wait_daemon_nodes(&api, &["n0", "n1", "n2"]).await;
    let three = wait_until("agent 1 wanting three DaemonSet pods", LIMIT, || {
        let ds = json_of(&api, 1, &["get", "daemonset", "node-agent", "-o", "json"]);
        async move { ds["status"]["desiredNumberScheduled"] == 3 }
    })
    .await;
    assert!(
        three.is_ok(),
        "{:#}",
        json_of(&api, 1, &["get", "daemonset", "node-agent", "-o", "json"])["status"]
    );
    api.ok(
        1,
        &["rollout", "status", "daemonset/node-agent", "--timeout=60s"],
    );
    // The ReplicaSet grows onto the new node: with n0 and n1 cordoned, two more replicas can
    // only go to n2 (the DaemonSet's pods stay: they tolerate the cordon).
    api.ok(0, &["cordon", "n0", "n1"]);
    api.ok(0, &["scale", "replicaset", "frontend", "--replicas=5"]);
    let on = |pods: &[Value], node: &str| {
        pods.iter()
            .filter(|p| ready(p) && p["spec"]["nodeName"] == node)
            .count()
    };
    wait_until("two frontend replicas ready on n2", LIMIT, || {
        let pods = frontend_ready(&api);
        let done = on(&pods, "n2") == 2 && pods.len() == 5;
        async move { done }
    })
    .await
    .unwrap();
    api.ok(0, &["uncordon", "n0", "n1"]);

    // It leaves (killed, then forgotten): its DaemonSet pod goes, the ReplicaSet's two pods
    // there are replaced on the others.
    api.agents[2].kill().unwrap();
    let gone = wait_until(
        "the DaemonSet's pod of the node that left deleted",
        LIMIT,
        || {
            let pods = json_of(
                &api,
                0,
                &["get", "pods", "-l", "app=node-agent", "-o", "json"],
            );
            let on_n2 = pods["items"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["spec"]["nodeName"] == "n2");
            async move { !on_n2 }
        },
    )
    .await;
    let nodes = api.ok(0, &["get", "nodes"]);
    assert!(
        gone.is_ok(),
        "nodes:\n{nodes}\npods: {:?}",
        ready_daemon_nodes(&api)
    );
    // Each agent forgets n2 on its own clock: the one that deleted the pod may be ahead.
    let forgotten = wait_until("n2 gone from the Node list", LIMIT, || {
        let nodes = api.ok(0, &["get", "nodes", "-o", "name"]);
        async move { !nodes.contains("node/n2") }
    })
    .await;
    assert!(forgotten.is_ok(), "{}", api.ok(0, &["get", "nodes"]));
    api.ok(
        1,
        &["rollout", "status", "daemonset/node-agent", "--timeout=30s"],
    );
    let ds = json_of(&api, 1, &["get", "daemonset", "node-agent", "-o", "json"]);
    assert_eq!(
        ds["status"]["desiredNumberScheduled"], 2,
        "{:#}",
        ds["status"]
    );
    assert_eq!(ds["status"]["numberMisscheduled"], 0, "{:#}", ds["status"]);
    wait_daemon_nodes(&api, &["n0", "n1"]).await;
    let settled = wait_until(
        "exactly 5 ready frontend pods, none on the node that left",
        LIMIT,
        || {
            let pods = frontend_ready(&api);
            let done = pods.len() == 5
                && pods
                    .iter()
                    .all(|p| ready(p) && p["spec"]["nodeName"] != "n2");
            async move { done }
        },
    )
    .await;
    let rs = json_of(&api, 0, &["get", "replicaset", "frontend", "-o", "json"]);
    assert!(
        settled.is_ok(),
        "rs status: {:#}\npods: {:#?}",
        rs["status"],
        frontend_ready(&api)
            .iter()
            .map(|p| (
                p["metadata"]["name"].clone(),
                p["spec"]["nodeName"].clone(),
                ready(p)
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(rs["status"]["readyReplicas"], 5, "{:#}", rs["status"]);
}

//! Pods running in real containers on real agents, driven and read with kubectl: init
//! containers, two containers sharing localhost, environment and downward API, logs (also
//! followed, also from another agent), restarts with back-off, OOM kills, probes, graceful
//! stop, and an agent killed with -9 re-adopting its containers. Needs root, runc and
//! busybox-static (CI installs them).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use shoal_chaos::testkit::{ThreadStop, thread_named, wait_until};

use crate::api::ApiLab;

mod exec;
mod hardening;
mod storage;
mod workloads;

const LIMIT: Duration = Duration::from_secs(60);

/// A 3-agent cluster with the test images on every node and a 1 s restart back-off.
async fn lab() -> ApiLab {
    lab_with(&[]).await
}

/// [`lab`], every agent started with the extra flags `extra` too.
async fn lab_with(extra: &[&str]) -> ApiLab {
    let api = ApiLab::start_with(3, |_| {
        let mut flags = vec!["--restart-backoff".to_owned(), "1s".to_owned()];
        flags.extend(extra.iter().map(|f| (*f).to_owned()));
        flags
    })
    .await;
    for agent in 0..api.agents.len() {
        for image in ["busybox-1.oci.tar", "httpd-1.oci.tar"] {
            import_image(
                &api,
                agent,
                &crate::runtime::test_images().join(image),
                None,
            );
        }
    }
    api
}

/// `shoal image import` of `archive` on agent `agent`'s node (tagged `tag` if given).
fn import_image(api: &ApiLab, agent: usize, archive: &std::path::Path, tag: Option<&str>) {
    let mut command = Command::new(crate::shoal_binary());
    command.args(["image", "import", "--data-dir"]);
    command.arg(api.agents[agent].data_dir()).arg(archive);
    if let Some(tag) = tag {
        command.args(["--tag", tag]);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `kubectl args` prints as JSON on agent `agent` (null when kubectl fails: the object
/// is not there).
fn json_of(api: &ApiLab, agent: usize, args: &[&str]) -> Value {
    let (ok, out, _) = api.kubectl(agent, args);
    if !ok {
        return Value::Null;
    }
    serde_json::from_str(&out).unwrap_or(Value::Null)
}

fn pod_json(api: &ApiLab, agent: usize, name: &str) -> Value {
    let (ok, out, _) = api.kubectl(agent, &["get", "pod", name, "-o", "json"]);
    if !ok {
        return Value::Null;
    }
    serde_json::from_str(&out).unwrap_or(Value::Null)
}

async fn wait_pod(
    api: &ApiLab,
    agent: usize,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    let result = wait_until(what, LIMIT, || {
        last = pod_json(api, agent, name);
        let ok = check(&last);
        async move { ok }
    })
    .await;
    if let Err(e) = result {
        panic!(
            "{e}: pod {name} is {}",
            serde_json::to_string_pretty(&last["status"]).unwrap()
        );
    }
    last
}

fn container_status<'a>(pod: &'a Value, name: &str) -> &'a Value {
    ["containerStatuses", "initContainerStatuses"]
        .iter()
        .flat_map(|f| pod["status"][f].as_array().into_iter().flatten())
        .find(|c| c["name"] == name)
        .unwrap_or(&Value::Null)
}

/// Pod directories left on an agent's node.
fn sandboxes(api: &ApiLab, agent: usize) -> usize {
    std::fs::read_dir(api.agents[agent].data_dir().join("pods"))
        .map(|d| d.count())
        .unwrap_or(0)
}

const DEMO: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: demo
  labels: {app: demo}
spec:
  nodeSelector: {kubernetes.io/hostname: n1}
  initContainers:
  - name: first
    image: shoal.local/busybox:1
    command: [sh, -c, "echo one > /work/order"]
    volumeMounts: [{name: work, mountPath: /work}]
  - name: second
    image: shoal.local/busybox:1
    command: [sh, -c, "echo two >> /work/order; echo second done > /dev/termination-log"]
    volumeMounts: [{name: work, mountPath: /work}]
  containers:
  - name: web
    image: shoal.local/httpd:1
    readinessProbe:
      httpGet: {port: 8080, path: /index.html}
      periodSeconds: 1
  - name: client
    image: shoal.local/busybox:1
    command: [sh, -c]
    args:
    - |
      echo "order: $(cat /work/order | tr '\n' ' ')"
      echo "env: POD=$POD NS=$NS NODE=$NODE MEM=$MEM GREETING=$GREETING"
      until wget -q -O - http://127.0.0.1:8080/index.html; do sleep 0.2; done
      i=0; while true; do i=$((i+1)); echo "tick $i"; sleep 0.3; done
    env:
    - name: POD
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - {name: GREETING, value: "hello $(POD)"}
    - name: NS
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    - name: NODE
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    - name: MEM
      valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}
    resources: {limits: {memory: 64Mi, cpu: 500m}}
    volumeMounts: [{name: work, mountPath: /work}]
  volumes:
  - {name: work, emptyDir: {}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_reports_ready_and_serves_logs_from_any_agent() {
    let api = lab().await;
    let file = api.manifest("demo.yaml", DEMO);
    api.ok(0, &["apply", "-f", &file]);
    // kubectl wait watches the pod until its node reports it Ready (through another agent).
    api.ok(
        2,
        &["wait", "--for=condition=Ready", "pod/demo", "--timeout=60s"],
    );
    // Agent 0 learns the status by gossip, a moment later than agent 2 may have.
    let pod = wait_pod(&api, 0, "demo", "agent 0 sees demo Running", |p| {
        p["status"]["phase"] == "Running"
    })
    .await;
    assert_eq!(pod["spec"]["nodeName"], "n1");
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["status"]["qosClass"], "Burstable");
    assert_eq!(
        container_status(&pod, "second")["state"]["terminated"]["reason"],
        "Completed"
    );
    // What it wrote to its termination message file.
    assert_eq!(
        container_status(&pod, "second")["state"]["terminated"]["message"],
        "second done\n"
    );
    assert!(container_status(&pod, "web")["state"]["running"]["startedAt"].is_string());
    assert_eq!(container_status(&pod, "client")["restartCount"], 0);
    // Field selectors as kubectl describe node and drain use them (the phase is observed state).
    let names = |agent: usize, selector: &str| {
        api.ok(
            agent,
            &[
                "get",
                "pods",
                "-A",
                "--field-selector",
                selector,
                "-o",
                "name",
            ],
        )
    };
    assert_eq!(names(0, "spec.nodeName=n1"), "pod/demo\n");
    assert_eq!(names(1, "spec.nodeName=n2"), "");
    assert_eq!(
        names(
            2,
            "spec.nodeName=n1,status.phase!=Succeeded,status.phase!=Failed"
        ),
        "pod/demo\n"
    );
    assert_eq!(names(0, "status.phase=Pending"), "");
    let (ok, _, err) = api.kubectl(0, &["get", "pods", "--field-selector", "spec.image=x"]);
    assert!(
        !ok && err.contains("field label not supported: spec.image"),
        "{err}"
    );

    // Events: the auctioneer's Scheduled (on whichever node auctioned) and n1's kubelet's,
    // gathered over QUIC by the agent asked; kubectl describe and kubectl events show them.
    let reasons = || async {
        let (_, out, _) = api.kubectl(
            2,
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=demo",
                "-o",
                "json",
            ],
        );
        serde_json::from_str::<Value>(&out).unwrap_or(Value::Null)["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                format!(
                    "{} {}",
                    e["reason"].as_str().unwrap_or(""),
                    e["message"].as_str().unwrap_or("")
                )
            })
            .collect::<Vec<String>>()
    };
    wait_until("demo's events", LIMIT, || async {
        let r = reasons().await;
        r.iter()
            .any(|e| e == "Scheduled Successfully assigned default/demo to n1")
            && r.iter().any(|e| e == "Started Started container web")
            && r.iter().any(|e| e.starts_with("Pulled Container image"))
            && r.iter().any(|e| e == "Created Created container: first")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", api.ok(2, &["get", "events", "-o", "wide"])));
    let describe = api.ok(0, &["describe", "pod", "demo"]);
    assert!(
        describe.contains("Successfully assigned default/demo to n1"),
        "{describe}"
    );
    assert!(describe.contains("Started container client"), "{describe}");
    let events = api.ok(1, &["events", "--for", "pod/demo"]);
    assert!(events.contains("Created container: web"), "{events}");
    let table = api.ok(1, &["get", "events"]);
    assert!(
        table.contains("pod/demo") && table.contains("Scheduled"),
        "{table}"
    );
    let node = api.ok(2, &["describe", "node", "n1"]);
    assert!(node.contains("Starting kubelet."), "{node}");
    assert!(
        node.contains("Non-terminated Pods:          (1 in total)"),
        "describe node lists the pods bound to it (a spec.nodeName field selector): {node}"
    );

    // Logs read through agent 0 come from n1 over QUIC.
    let logs = wait_until("client logs", LIMIT, || async {
        api.kubectl(0, &["logs", "demo", "-c", "client"])
            .1
            .contains("tick 2")
    })
    .await;
    assert!(logs.is_ok());
    let text = api.ok(0, &["logs", "demo", "-c", "client"]);
    assert!(text.contains("order: one two "), "{text}");
    assert!(
        text.contains("env: POD=demo NS=default NODE=n1 MEM=64 GREETING=hello demo"),
        "{text}"
    );
    assert!(
        text.contains("hello from shoal"),
        "the client reached the web container on localhost: {text}"
    );
    let tail = api.ok(
        2,
        &["logs", "demo", "-c", "client", "--tail=1", "--timestamps"],
    );
    assert_eq!(tail.lines().count(), 1, "{tail}");
    assert!(tail.starts_with("20") && tail.contains(" tick "), "{tail}");
    let (ok, _, err) = api.kubectl(0, &["logs", "demo", "-c", "nosuch"]);
    assert!(
        !ok && err.contains("container nosuch is not valid for pod demo"),
        "{err}"
    );

    // Follow streams new lines as the container writes them.
    let mut follow = Command::new(crate::api::which("kubectl"))
        .arg("--kubeconfig")
        .arg(&api.kubeconfigs[0])
        .args(["logs", "-f", "demo", "-c", "client", "--tail=1"])
        .env("HOME", api.home.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let reader = BufReader::new(follow.stdout.take().unwrap());
    let lines: Vec<String> =
        tokio::task::spawn_blocking(move || reader.lines().take(4).map(|l| l.unwrap()).collect())
            .await
            .unwrap();
    let _ = follow.kill();
    let _ = follow.wait();
    let ticks: Vec<u32> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
        .collect();
    assert_eq!(ticks.len(), 4, "{lines:?}");
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "{ticks:?}");

    // Usage: `kubectl top` through metrics.k8s.io (sampled on n1, read through agent 2), and
    // n1's Prometheus metrics.
    wait_until("kubectl top pod", LIMIT, || async {
        let (ok, out, _) = api.kubectl(2, &["top", "pod", "demo", "--containers"]);
        ok && out.contains("client") && out.contains("web")
    })
    .await
    .unwrap();
    let nodes = api.ok(0, &["top", "node"]);
    assert!(
        ["n0", "n1", "n2"].iter().all(|n| nodes.contains(n)),
        "{nodes}"
    );
    let metrics = api.ok(1, &["get", "--raw", "/metrics"]);
    assert!(
        metrics.contains("container_memory_working_set_bytes{namespace=\"default\",pod=\"demo\",container=\"web\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("shoal_members{state=\"alive\"} 3"),
        "{metrics}"
    );

    // Deleting the pod stops its containers and removes everything of it from n1.
    api.ok(1, &["delete", "pod", "demo", "--wait=false"]);
    wait_until("demo's sandbox removed from n1", LIMIT, || async {
        sandboxes(&api, 1) == 0
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_back_off_oom_kills_and_probe_failures_are_reported() {
    let api = lab().await;
    let file = api.manifest(
        "crashy.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: crashy}
spec:
  containers:
  - {name: c, image: shoal.local/busybox:1, command: [sh, -c, "echo crashing; exit 3"], terminationMessagePolicy: FallbackToLogsOnError}
---
apiVersion: v1
kind: Pod
metadata: {name: hog}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: shoal.local/busybox:1
    command: [sh, -c, "x=xxxxxxxxxxxxxxxx; while true; do x=$x$x; done"]
    resources: {limits: {memory: 16Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: sick}
spec:
  containers:
  - name: c
    image: shoal.local/busybox:1
    command: [sh, -c, "touch /tmp/alive; sleep 2; rm /tmp/alive; sleep 1000"]
    livenessProbe:
      exec: {command: [test, -f, /tmp/alive]}
      periodSeconds: 1
      failureThreshold: 2
---
apiVersion: v1
kind: Pod
metadata: {name: done}
spec:
  restartPolicy: OnFailure
  containers:
  - {name: c, image: shoal.local/busybox:1, command: [sh, -c, "echo finished"]}
---
apiVersion: v1
kind: Pod
metadata: {name: noimage}
spec:
  containers:
  - {name: c, image: example.org/absent:1}
"#,
    );
    api.ok(0, &["apply", "-f", &file]);
    let pod = wait_pod(&api, 1, "crashy", "crashy restarted twice", |p| {
        container_status(p, "c")["restartCount"].as_u64() >= Some(2)
    })
    .await;
    let c = container_status(&pod, "c");
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 3, "{c}");
    assert_eq!(c["lastState"]["terminated"]["reason"], "Error", "{c}");
    // FallbackToLogsOnError: no message written, a failure: the log's end stands in.
    assert_eq!(c["lastState"]["terminated"]["message"], "crashing", "{c}");
    wait_pod(&api, 1, "crashy", "crashy in CrashLoopBackOff", |p| {
        container_status(p, "c")["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    })
    .await;
    let previous = api.ok(2, &["logs", "crashy", "--previous"]);
    assert_eq!(previous, "crashing\n");

    let pod = wait_pod(&api, 2, "hog", "hog OOM-killed", |p| {
        p["status"]["phase"] == "Failed"
    })
    .await;
    let c = container_status(&pod, "c");
    assert_eq!(c["state"]["terminated"]["reason"], "OOMKilled", "{c}");
    assert_eq!(c["state"]["terminated"]["exitCode"], 137, "{c}");

    let pod = wait_pod(
        &api,
        0,
        "sick",
        "sick restarted by its liveness probe",
        |p| container_status(p, "c")["restartCount"].as_u64() >= Some(1),
    )
    .await;
    let c = container_status(&pod, "c");
    assert_eq!(
        c["lastState"]["terminated"]["message"], "Liveness probe failed",
        "{c}"
    );
    // What the kubelet decided, as Events: the probe's failures, the kill, the crash loop.
    let sick = api.ok(1, &["events", "--for", "pod/sick"]);
    assert!(sick.contains("Liveness probe failed"), "{sick}");
    assert!(
        sick.contains("Container c failed liveness probe, will be restarted"),
        "{sick}"
    );
    let crashy = api.ok(2, &["describe", "pod", "crashy"]);
    assert!(
        crashy.contains("Back-off restarting failed container c in pod crashy_default"),
        "{crashy}"
    );
    // Each start of the crashing container is one Event whose count grows, as Kubernetes
    // aggregates them (read through an agent that does not run it, and in events.k8s.io/v1 as
    // a series).
    let started = api.ok(
        0,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=crashy,reason=Started",
            "-o",
            "json",
        ],
    );
    let started: serde_json::Value = serde_json::from_str(&started).unwrap();
    let items = started["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1, "one aggregated Started event: {started}");
    let e = &items[0];
    assert!(
        e["count"].as_u64() >= Some(2),
        "started at least twice: {e}"
    );
    assert!(
        e["lastTimestamp"].as_str() >= e["firstTimestamp"].as_str(),
        "{e}"
    );
    let series = api.ok(1, &["get", "events.v1.events.k8s.io", "-o", "json"]);
    let series: serde_json::Value = serde_json::from_str(&series).unwrap();
    let started: Vec<&serde_json::Value> = series["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["regarding"]["name"] == "crashy" && e["reason"] == "Started")
        .collect();
    assert!(
        started.len() == 1 && started[0]["series"]["count"].as_u64() >= Some(2),
        "{started:?}"
    );

    let pod = wait_pod(&api, 0, "done", "done succeeded", |p| {
        p["status"]["phase"] == "Succeeded"
    })
    .await;
    assert_eq!(container_status(&pod, "c")["restartCount"], 0);

    let pod = wait_pod(
        &api,
        0,
        "noimage",
        "noimage reports the missing image",
        |p| container_status(p, "c")["state"]["waiting"]["reason"] == "ErrImageNeverPull",
    )
    .await;
    let message = container_status(&pod, "c")["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(message.contains("example.org/absent:1"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_toggles_ready_and_stop_honours_the_grace_period() {
    let api = lab().await;
    let file = api.manifest(
        "toggle.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: toggle}
spec:
  nodeSelector: {kubernetes.io/hostname: n2}
  terminationGracePeriodSeconds: 3
  containers:
  - name: c
    image: shoal.local/busybox:1
    command: [sh, -c]
    args:
    - |
      trap '' TERM
      mkdir -p /www && httpd -p 8080 -h /www
      touch /www/ready; sleep 8; rm /www/ready
      while true; do sleep 1; done
    readinessProbe:
      httpGet: {port: 8080, path: /ready}
      periodSeconds: 1
      failureThreshold: 1
    lifecycle:
      postStart:
        exec: {command: [sh, -c, "echo started > /work/post-start"]}
      preStop:
        httpGet: {port: 9090, path: /drain}
    volumeMounts: [{name: work, mountPath: /work}]
  - name: recorder
    image: shoal.local/busybox:1
    command: [sh, -c, "trap '' TERM; nc -l -p 9090 > /work/pre-stop; sleep 1000"]
    volumeMounts: [{name: work, mountPath: /work}]
  volumes:
  - {name: work, emptyDir: {}}
"#,
    );
    api.ok(0, &["apply", "-f", &file]);
    api.ok(
        1,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/toggle",
            "--timeout=60s",
        ],
    );
    // Readiness failing (the container removes /www/ready after 8 s) makes the pod unready
    // without restarting it.
    api.ok(
        0,
        &[
            "wait",
            "--for=condition=Ready=false",
            "pod/toggle",
            "--timeout=60s",
        ],
    );
    let pod = pod_json(&api, 0, "toggle");
    assert_eq!(container_status(&pod, "c")["restartCount"], 0);
    assert_eq!(pod["status"]["phase"], "Running");
    // Its postStart hook ran (before it could be Ready).
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    let work = api.agents[2]
        .data_dir()
        .join("pods")
        .join(&uid)
        .join("volumes/work");
    assert_eq!(
        std::fs::read_to_string(work.join("post-start")).unwrap_or_default(),
        "started\n"
    );

    // Deleting it runs the preStop hook first (an HTTP GET the other container records in
    // the pod's emptyDir, visible on n2 until the sandbox goes); the container ignores
    // SIGTERM, so it is killed only once the 3 s grace period is over.
    let marker = work.join("pre-stop");
    let deleted = Instant::now();
    api.ok(0, &["delete", "pod", "toggle", "--wait=false"]);
    wait_until("the preStop hook ran", LIMIT, || async {
        std::fs::read_to_string(&marker).is_ok_and(|t| t.starts_with("GET /drain HTTP/1.1"))
    })
    .await
    .unwrap();
    wait_until("toggle removed from n2", LIMIT, || async {
        sandboxes(&api, 2) == 0
    })
    .await
    .unwrap();
    assert!(
        deleted.elapsed() >= Duration::from_secs(3),
        "killed before its grace period: {:?}",
        deleted.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_with_sigkill_readopts_its_containers_and_nothing_leaks() {
    let mut api = lab().await;
    let file = api.manifest(
        "steady.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: steady}
spec:
  nodeSelector: {kubernetes.io/hostname: n1}
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: shoal.local/busybox:1, command: [sh, -c, "while true; do echo alive; sleep 0.5; done"]}
"#,
    );
    api.ok(0, &["apply", "-f", &file]);
    api.ok(
        0,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/steady",
            "--timeout=60s",
        ],
    );
    let before = pod_json(&api, 0, "steady");
    let uid = before["metadata"]["uid"].as_str().unwrap().to_owned();
    let id = container_status(&before, "c")["containerID"].clone();

    api.agents[1].kill().unwrap();
    api.agents[1].restart().await.unwrap();
    // The restarted agent finds its container running and carries on with it.
    let after = wait_pod(
        &api,
        2,
        "steady",
        "steady reported by the restarted agent",
        |p| {
            p["status"]["conditions"][1]["status"] == "True"
                && container_status(p, "c")["containerID"] == id
        },
    )
    .await;
    let c = container_status(&after, "c");
    assert_eq!(c["restartCount"], 0, "{c}");
    assert_eq!(
        c["state"]["running"]["startedAt"],
        container_status(&before, "c")["state"]["running"]["startedAt"]
    );
    // It keeps writing its log through the same shim.
    let lines = |api: &ApiLab| {
        api.kubectl(0, &["logs", "steady"])
            .1
            .matches("alive")
            .count()
    };
    let seen = lines(&api);
    wait_until("the adopted container keeps logging", LIMIT, || async {
        lines(&api) >= seen + 3
    })
    .await
    .unwrap();

    // Deleted through the control API (`shoal delete`), gracefully as through kubectl: marked,
    // stopped by n1 within its grace period, then deleted.
    let out = Command::new(crate::shoal_binary())
        .args(["delete", "pod", "steady", "--data-dir"])
        .arg(api.agents[0].data_dir())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("terminating") && said.contains("within 1 s"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until("steady removed from n1", LIMIT, || async {
        sandboxes(&api, 1) == 0
    })
    .await
    .unwrap();
    // Leak check: no mount, network namespace, cgroup, runc container or process of the pod.
    let data_dir = api.agents[1].data_dir().to_string_lossy().into_owned();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&data_dir), "mounts left: {mounts}");
    let netns: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(&uid))
        .collect();
    assert!(netns.is_empty(), "network namespaces left: {netns:?}");
    for hierarchy in ["memory", "pids", "cpu", "unified"] {
        let left = Command::new("find")
            .arg(format!("/sys/fs/cgroup/{hierarchy}/shoal"))
            .args(["-name", &format!("pod{uid}")])
            .output()
            .unwrap();
        let left = String::from_utf8_lossy(&left.stdout);
        assert!(left.trim().is_empty(), "cgroups left: {left}");
    }
    let runc = Command::new("runc")
        .arg("--root")
        .arg(api.agents[1].data_dir().join("runc"))
        .args(["list", "-q"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&runc.stdout).trim().is_empty());
    wait_until("the pod's shim exits", LIMIT, || async {
        !Command::new("pgrep")
            .args(["-f", &format!("shim .*--id {uid}")])
            .status()
            .unwrap()
            .success()
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_image_pulls_it_from_a_peer() {
    let mut api = ApiLab::start_with(3, |_| vec!["--restart-backoff".into(), "1s".into()]).await;
    // Only n0 holds the image.
    import_image(
        &api,
        0,
        &crate::runtime::test_images().join("httpd-1.oci.tar"),
        None,
    );
    let file = api.manifest(
        "pulled.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: pulled}
spec:
  nodeSelector: {kubernetes.io/hostname: n2}
  containers:
  - {name: web, image: shoal.local/httpd:1}
"#,
    );
    api.ok(1, &["apply", "-f", &file]);
    api.ok(
        1,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/pulled",
            "--timeout=60s",
        ],
    );
    let listed = Command::new(crate::shoal_binary())
        .args(["image", "ls", "-o", "json", "--data-dir"])
        .arg(api.agents[2].data_dir())
        .output()
        .unwrap();
    let images: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let digest = |images: &Value| {
        images
            .as_array()
            .and_then(|a| a.iter().find(|i| i["reference"] == "shoal.local/httpd:1"))
            .map(|i| i["digest"].clone())
    };
    let pulled = digest(&images).expect("n2 holds the image after the pull");
    let original = Command::new(crate::shoal_binary())
        .args(["image", "ls", "-o", "json", "--data-dir"])
        .arg(api.agents[0].data_dir())
        .output()
        .unwrap();
    assert_eq!(
        Some(pulled),
        digest(&serde_json::from_slice(&original.stdout).unwrap())
    );

    // An image no node has: ErrImageNeverPull, naming it.
    let file = api.manifest(
        "nowhere.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: nowhere}\nspec:\n  containers: [{name: c, image: shoal.local/none:1}]\n",
    );
    api.ok(0, &["apply", "-f", &file]);
    let pod = wait_pod(
        &api,
        0,
        "nowhere",
        "nowhere reports ErrImageNeverPull",
        |p| container_status(p, "c")["state"]["waiting"]["reason"] == "ErrImageNeverPull",
    )
    .await;
    let message = container_status(&pod, "c")["state"]["waiting"]["message"].to_string();
    assert!(message.contains("shoal.local/none:1"), "{message}");

    // An image in a registry (a real one on loopback, pushed with skopeo) that no node has:
    // the node pulls it from there and runs it (issue #38).
    let registry = crate::runtime::Registry::start();
    registry.push(
        &crate::runtime::test_images().join("busybox-1.oci.tar"),
        "team/busybox:1",
    );
    let image = format!("{}/team/busybox:1", registry.addr);
    let file = api.manifest(
        "registry.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: from-registry}}\nspec:\n  nodeSelector: {{kubernetes.io/hostname: n1}}\n  containers: [{{name: c, image: '{}/team/busybox:1', command: [sleep, '3600']}}]\n",
            registry.addr
        ),
    );
    api.ok(0, &["apply", "-f", &file]);
    api.ok(
        0,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/from-registry",
            "--timeout=60s",
        ],
    );
    // n1's events reach agent 0's listing when it next asks n1: waited for.
    let mut events = String::new();
    wait_until("the Pulled event", LIMIT, || {
        events = api.ok(0, &["events", "--for", "pod/from-registry"]);
        let ok = events.contains("Successfully pulled image") && events.contains("Image size:");
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {events}"));

    // imagePullPolicy with the registry gone: Always asks the registry at every start (and
    // fails, shown as ErrImagePull, then ImagePullBackOff), IfNotPresent runs what n1 has.
    drop(registry);
    let policy = |name: &str, policy: &str| {
        api.manifest(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeSelector: {{kubernetes.io/hostname: n1}}\n  containers: [{{name: c, image: '{image}', imagePullPolicy: {policy}, command: [sleep, '3600']}}]\n",
            ),
        )
    };
    api.ok(0, &["apply", "-f", &policy("always", "Always")]);
    api.ok(
        0,
        &["apply", "-f", &policy("if-not-present", "IfNotPresent")],
    );
    let always = wait_pod(&api, 0, "always", "Always backs off pulling", |p| {
        container_status(p, "c")["state"]["waiting"]["reason"] == "ImagePullBackOff"
    })
    .await;
    let message = container_status(&always, "c")["state"]["waiting"]["message"].to_string();
    assert!(
        message.contains("Back-off pulling image") && message.contains("connect"),
        "{message}"
    );
    wait_until("the pull's events", LIMIT, || {
        events = api.ok(0, &["events", "--for", "pod/always"]);
        let ok = events.contains("Failed to pull image")
            && events.contains("ErrImagePull")
            && events.contains("BackOff");
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {events}"));
    api.ok(
        0,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/if-not-present",
            "--timeout=60s",
        ],
    );

    // A private registry (token auth): refused anonymously, pulled with an imagePullSecret
    // made by kubectl as users make it; the image pulled with credentials is not shared.
    use crate::runtime::registry::{PASSWORD, USER};
    let tokens = crate::runtime::TokenServer::start();
    let private = crate::runtime::Registry::start_with_tokens(&tokens);
    private.push_as(
        &crate::runtime::test_images().join("busybox-1.oci.tar"),
        "team/secret:1",
        Some(&format!("{USER}:{PASSWORD}")),
    );
    api.ok(
        0,
        &[
            "create",
            "secret",
            "docker-registry",
            "regcred",
            &format!("--docker-server={}", private.addr),
            &format!("--docker-username={USER}"),
            &format!("--docker-password={PASSWORD}"),
        ],
    );
    let pod = |name: &str, secrets: &str| {
        api.manifest(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeSelector: {{kubernetes.io/hostname: n1}}\n  imagePullSecrets: [{secrets}]\n  containers: [{{name: c, image: '{}/team/secret:1', command: [sleep, '3600']}}]\n",
                private.addr
            ),
        )
    };
    api.ok(0, &["apply", "-f", &pod("no-secret", "")]);
    let denied = wait_pod(&api, 0, "no-secret", "refused without a secret", |p| {
        matches!(
            container_status(p, "c")["state"]["waiting"]["reason"].as_str(),
            Some("ErrImagePull" | "ImagePullBackOff")
        )
    })
    .await;
    let message = container_status(&denied, "c")["state"]["waiting"]["message"].to_string();
    assert!(message.contains("unauthorized (anonymously)"), "{message}");
    api.ok(0, &["apply", "-f", &pod("with-secret", "{name: regcred}")]);
    api.ok(
        0,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/with-secret",
            "--timeout=60s",
        ],
    );
    let listed = Command::new(crate::shoal_binary())
        .args(["image", "ls", "-o", "json", "--data-dir"])
        .arg(api.agents[1].data_dir())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("team/secret:1"));
    assert!(tokens.issued.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    // The ServiceAccount's imagePullSecrets go into the pods created as it, a controller's too.
    api.ok(
        0,
        &[
            "patch",
            "serviceaccount",
            "default",
            "-p",
            r#"{"imagePullSecrets": [{"name": "regcred"}]}"#,
        ],
    );
    api.ok(
        0,
        &[
            "create",
            "deployment",
            "via-account",
            &format!("--image={}/team/secret:1", private.addr),
            "--",
            "sleep",
            "3600",
        ],
    );
    api.ok(
        0,
        &[
            "rollout",
            "status",
            "deployment/via-account",
            "--timeout=90s",
        ],
    );
    let secrets = api.ok(
        0,
        &[
            "get",
            "pods",
            "-l",
            "app=via-account",
            "-o",
            "jsonpath={.items[*].spec.imagePullSecrets[*].name}",
        ],
    );
    assert_eq!(secrets.trim(), "regcred");

    // The registry once per cluster: one pod per node of an image none has, applied together.
    // Each blob is downloaded from the registry once (by its owner); the others copy it.
    let shared = crate::runtime::Registry::start();
    shared.push_unique(
        &crate::runtime::test_images().join("busybox-1.oci.tar"),
        "team/shared:1",
    );
    let pods: Vec<String> = (0..3)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: shared-{i}}}\nspec:\n  nodeSelector: {{kubernetes.io/hostname: n{i}}}\n  containers: [{{name: c, image: '{}/team/shared:1', command: [sleep, '3600']}}]\n",
                shared.addr
            )
        })
        .collect();
    let file = api.manifest("shared.yaml", &pods.join("---\n"));
    api.ok(0, &["apply", "-f", &file]);
    for i in 0..3 {
        wait_pod(&api, 0, &format!("shared-{i}"), "shared pods run", |p| {
            p["status"]["phase"] == "Running"
        })
        .await;
    }
    let downloads = shared.blob_downloads("team/shared");
    // The new config and top layer (the busybox layer below is on every node already).
    assert!(downloads.len() >= 2, "config and layer: {downloads:?}");
    assert!(
        downloads.values().all(|n| *n == 1),
        "each blob once for the cluster: {downloads:?}"
    );
    // The tag is resolved with a HEAD by each node (its own pull secret's proof), and its
    // manifest read by digest, once.
    let heads = shared.served("HEAD", "/v2/team/shared/manifests/");
    let gets = shared.served("GET", "/v2/team/shared/manifests/");
    assert_eq!(heads.get("1"), Some(&3), "{heads:?}");
    assert!(
        gets.len() == 1
            && gets
                .iter()
                .all(|(m, n)| m.starts_with("sha256:") && *n == 1),
        "the manifest once, by digest: {gets:?}"
    );

    // The owner of a blob killed while it fetches it (a slow registry: ~1 MiB/s through a
    // proxy, an 8 MiB layer): the nodes waiting for it fetch the blob themselves and run.
    let slow = crate::runtime::Registry::start();
    let layer = slow.push_unique_sized(
        &crate::runtime::test_images().join("busybox-1.oci.tar"),
        "team/slow:1",
        8 << 20,
    );
    let proxy = crate::runtime::registry::SlowProxy::start(&slow.addr);
    let ids: Vec<String> = (0..3)
        .map(|i| {
            api.ok(
                0,
                &[
                    "get",
                    "node",
                    &format!("n{i}"),
                    "-o",
                    r"jsonpath={.metadata.annotations.shoal\.io/node-id}",
                ],
            )
            .trim()
            .to_owned()
        })
        .collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let owner_id = shoal_agent::kubelet::image_puller::blob_owner(&refs, &layer).unwrap();
    let owner = ids.iter().position(|id| id == owner_id).unwrap();
    let others: Vec<usize> = (0..3).filter(|i| *i != owner).collect();
    let pods: Vec<String> = others
        .iter()
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: slow-{i}}}\nspec:\n  nodeSelector: {{kubernetes.io/hostname: n{i}}}\n  containers: [{{name: c, image: '{}/team/slow:1', command: [sleep, '3600']}}]\n",
                proxy.addr
            )
        })
        .collect();
    let file = api.manifest("slow.yaml", &pods.join("---\n"));
    let reader = others[0];
    api.ok(reader, &["apply", "-f", &file]);
    let applied = std::time::Instant::now();
    // Meanwhile the pod's `Pulling` event is revised with how far its pull has come.
    let mut events = String::new();
    wait_until(
        "a Pulling event with progress",
        Duration::from_secs(5),
        || {
            events = api.ok(reader, &["events", "--for", &format!("pod/slow-{reader}")]);
            let ok = events.contains("Pulling image") && events.contains("layers complete");
            async move { ok }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {events}"));
    // Mid-fetch: the owner needs ~8 s for the layer.
    tokio::time::sleep(Duration::from_secs(2).saturating_sub(applied.elapsed())).await;
    api.agents[owner].kill().unwrap();
    for i in &others {
        wait_pod(
            &api,
            reader,
            &format!("slow-{i}"),
            "slow pods run without the owner",
            |p| p["status"]["phase"] == "Running",
        )
        .await;
    }
    // The owner's download never finished: the others took it over (the first of them to
    // fetch it from the registry, its peer copying from it: once, still).
    let owner_store = shoal_agent::images::ImageStore::open(shoal_agent::paths::images(
        api.agents[owner].data_dir(),
    ))
    .unwrap();
    assert!(
        !owner_store.has_blob(&layer),
        "the owner finished before it was killed"
    );
    let fetched = slow.blob_downloads("team/slow");
    assert!(fetched.get(&layer).is_some_and(|n| *n >= 1), "{fetched:?}");
}

/// Issue #38: image garbage collection. An agent told to keep its image filesystem under
/// 1 % (so every run must free all it can): when a pod's sandbox goes, the images no container
/// uses are removed — including one sharing its base layer with an image in use — and the
/// image a running pod uses stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_images_are_collected_and_an_image_in_use_is_kept() {
    let api = ApiLab::start_with(1, |_| {
        [
            "--image-gc-high-threshold",
            "1",
            "--image-gc-low-threshold",
            "0",
            "--image-minimum-gc-age",
            "0s",
        ]
        .map(String::from)
        .to_vec()
    })
    .await;
    for archive in ["busybox-1.oci.tar", "httpd-1.oci.tar"] {
        import_image(&api, 0, &crate::runtime::test_images().join(archive), None);
    }
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: c, image: shoal.local/busybox:1, command: [sleep, '3600']}}]\n"
        )
    };
    for name in ["keeper", "brief"] {
        let file = api.manifest(&format!("{name}.yaml"), &pod(name));
        api.ok(0, &["apply", "-f", &file]);
        wait_pod(&api, 0, name, "running", |p| {
            p["status"]["phase"] == "Running"
        })
        .await;
    }
    let images = || {
        let out = Command::new(crate::shoal_binary())
            .args(["image", "ls", "-o", "json", "--data-dir"])
            .arg(api.agents[0].data_dir())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(images().contains("shoal.local/httpd:1"));
    // The Node lists them (from its gossip, published within a second of a change).
    let mut listed = String::new();
    wait_until("the Node lists its images", LIMIT, || {
        listed = api.ok(
            0,
            &[
                "get",
                "node",
                "n0",
                "-o",
                "jsonpath={.status.images[*].names}",
            ],
        );
        let ok = listed.contains("shoal.local/busybox:1")
            && listed.contains("shoal.local/busybox@sha256:");
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {listed}"));
    api.ok(0, &["delete", "pod", "brief", "--grace-period=0"]);
    wait_until("httpd collected", LIMIT, || {
        let gone = !images().contains("shoal.local/httpd:1");
        async move { gone }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", images()));
    assert!(images().contains("shoal.local/busybox:1"), "{}", images());
    // The pod that uses it still runs.
    let keeper = pod_json(&api, 0, "keeper");
    assert_eq!(keeper["status"]["phase"], "Running");
}

/// Issue #14, live overcommit: a pod bound straight to a node that lacks the room (here by
/// `spec.nodeName`, as two auctions with different views or a partition's merged bindings can
/// do) is refused by the node with the kubelet's reason, never started, and handed back to the
/// auction, which finds no node with room and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_pods_beyond_its_allocatable_and_they_are_auctioned_again() {
    let api = ApiLab::start_with(1, |_| Vec::new()).await;
    import_image(
        &api,
        0,
        &crate::runtime::test_images().join("busybox-1.oci.tar"),
        None,
    );
    // The node has as many CPUs as this machine: the first pod takes three quarters of them.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let pod = |name: &str, millis: u64| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: n0\n  containers:\n  - name: c\n    image: shoal.local/busybox:1\n    command: [sleep, \"3600\"]\n    resources: {{requests: {{cpu: {millis}m}}}}\n"
        )
    };
    let big = api.manifest("big.yaml", &pod("big", cpus * 750));
    api.ok(0, &["apply", "-f", &big]);
    wait_pod(&api, 0, "big", "big running", |p| {
        p["status"]["phase"] == "Running"
    })
    .await;
    let late = api.manifest("late.yaml", &pod("late", cpus * 500));
    api.ok(0, &["apply", "-f", &late]);
    let refused = wait_pod(
        &api,
        0,
        "late",
        "late auctioned again and unschedulable",
        |p| {
            p["spec"]["nodeName"].is_null()
                && p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c["type"] == "PodScheduled"
                            && c["status"] == "False"
                            && c["message"]
                                .as_str()
                                .is_some_and(|m| m.contains("Insufficient cpu"))
                    })
        },
    )
    .await;
    assert!(
        refused["metadata"]["annotations"]["shoal.io/binding-epoch"]
            .as_str()
            .and_then(|e| e.parse::<u64>().ok())
            .is_some_and(|e| e >= 1),
        "the binding's epoch was raised: {refused}"
    );
    let log = api.agents[0].log();
    assert!(
        log.lines()
            .any(|l| l.contains("pod refused at admission") && l.contains("OutOfcpu")),
        "{log}"
    );
    // Evidence that it never ran: its node made a sandbox (the pod's directory, made before any
    // container starts) for one pod only.
    assert_eq!(sandboxes(&api, 0), 1);
    assert_eq!(pod_json(&api, 0, "big")["status"]["phase"], "Running");
}

/// Issue #35, item 12: a fenced pod's containers live while the kubelet that could stop them
/// makes progress, not merely while the agent does. With the kubelet's thread stopped (and the
/// rest of the agent running: gossip, scheduling, the API), the fence lease is no longer
/// renewed and the pod's shim kills its container; resumed, the kubelet restarts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_kubelet_stops_renewing_the_fence_and_its_fenced_pod_dies() {
    let api = ApiLab::start_with(1, |_| {
        ["--fence-timeout", "1s", "--restart-backoff", "1s"]
            .map(str::to_owned)
            .to_vec()
    })
    .await;
    import_image(&api, 0, &crate::runtime::busybox_archive(), None);
    let file = api.manifest(
        "fenced.yaml",
        r#"apiVersion: v1
kind: Pod
metadata:
  name: fenced
  annotations: {shoal.io/partition-policy: fenced}
spec:
  containers:
  - {name: c, image: shoal.local/busybox:1, command: [sh, -c, "trap '' TERM; while true; do sleep 0.2; done"]}
"#,
    );
    api.ok(0, &["apply", "-f", &file]);
    api.ok(
        0,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/fenced",
            "--timeout=60s",
        ],
    );
    let uid = pod_json(&api, 0, "fenced")["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let bundle = api.agents[0]
        .data_dir()
        .join("pods")
        .join(&uid)
        .join("containers/c.0");
    let exit = bundle.join("exit.json");
    // Renewed by a running kubelet, the container outlives several fence timeouts.
    let lease = api.agents[0]
        .data_dir()
        .join("pods")
        .join(&uid)
        .join("fence.lease");
    let first = std::fs::read_to_string(&lease).unwrap();
    wait_until("the kubelet renews the fence lease", LIMIT, || {
        let now = std::fs::read_to_string(&lease).unwrap_or_default();
        let changed = now != first;
        async move { changed }
    })
    .await
    .unwrap();
    assert!(!exit.exists(), "the container ended while the kubelet ran");

    let pid = api.agents[0].pid().unwrap();
    let tid = thread_named(pid, "kubelet").expect("the agent has a kubelet thread");
    let stop = ThreadStop::new(tid).unwrap();
    wait_until("the shim kills the fenced container", LIMIT, || {
        let killed = std::fs::read_to_string(&exit)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|e| e["fence_lapsed"] == true);
        async move { killed }
    })
    .await
    .unwrap();
    // The rest of the agent ran all along: it answers.
    api.ok(0, &["get", "nodes"]);
    drop(stop);
    // Resumed, the kubelet sees the container gone and starts it again.
    wait_pod(&api, 0, "fenced", "the fenced pod restarted", |p| {
        container_status(p, "c")["restartCount"].as_u64() >= Some(1)
            && p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
    .await;
    api.ok(
        0,
        &["delete", "pod", "fenced", "--grace-period=0", "--force"],
    );
}

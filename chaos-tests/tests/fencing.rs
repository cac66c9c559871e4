//! Partition policies on a real 3|2 partition, with the pods running in real containers:
//! `available` pods are replaced on both sides after the eviction delay; a `fenced` pod is
//! replaced only on the majority side, only after the longer fenced delay, and only once the
//! minority node has stopped its container (never two at once); the minority never replaces it.
//! After the heal, each pod runs on exactly one node.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shoal_chaos::lab::NetLab;
use shoal_chaos::testkit::{AgentProcess, state_of, wait_for_identical_digests, wait_until};
use shoal_gossip::MemberState;

const LIMIT: Duration = Duration::from_secs(60);

fn pod(name: &str, node: &str, fenced: bool) -> Value {
    let policy = if fenced { "fenced" } else { "available" };
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "annotations": {"shoal.io/partition-policy": policy}},
           // Fenced pods get a long grace period the fence must not wait for; the duplicates
           // of available pods are stopped with a short one after the heal.
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": if fenced { 30 } else { 1 }, "containers": [{
               "name": "c", "image": "shoal.local/busybox:1",
               // PID 1 ignores SIGTERM: only a kill stops it (the fence must not wait 30 s).
               "command": ["sh", "-c", "while true; do sleep 0.2; done"]}]}})
}

/// Whether `agent`'s node has a running container of pod `uid`.
fn runs(agent: &AgentProcess, uid: &str) -> bool {
    std::fs::read_dir(agent.data_dir().join("pods").join(uid).join("containers"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .any(|c| c.path().join("started.json").exists() && !c.path().join("exit.json").exists())
}

async fn phase(agent: &AgentProcess, name: &str) -> String {
    agent
        .object("pods", "default", name)
        .await
        .ok()
        .flatten()
        .and_then(|p| p["status"]["phase"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

async fn node_of(agent: &AgentProcess, name: &str) -> String {
    agent
        .object("pods", "default", name)
        .await
        .ok()
        .flatten()
        .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_pods_move_only_on_the_majority_side_and_only_later() {
    let mut lab = NetLab::new(5).expect("creating the netns lab (needs root and iproute2)");
    let (_root, agents) = shoal_chaos::start_cluster(
        &lab,
        5,
        &[
            "--eviction-delay",
            "1s",
            "--fence-timeout",
            "1s",
            "--anti-entropy-interval",
            "200ms",
            "--restart-backoff",
            "1s",
        ],
    )
    .await
    .unwrap();
    for agent in &agents {
        shoal_chaos::import_busybox(agent).unwrap();
    }
    for (name, node, fenced) in [
        ("avail-n4", "n4", false),
        ("fenced-n4", "n4", true),
        ("avail-n0", "n0", false),
        ("fenced-n0", "n0", true),
    ] {
        assert_eq!(
            agents[0].apply(&pod(name, node, fenced)).await.unwrap().0,
            201
        );
    }
    for a in &agents {
        wait_until("the pods everywhere", LIMIT, || async {
            node_of(a, "fenced-n0").await == "n0" && node_of(a, "fenced-n4").await == "n4"
        })
        .await
        .unwrap();
    }
    for name in ["avail-n4", "fenced-n4", "avail-n0", "fenced-n0"] {
        wait_until("the pods Running", LIMIT, || async {
            phase(&agents[0], name).await == "Running"
        })
        .await
        .unwrap();
    }
    let uid = |name: &'static str| {
        let a = &agents[0];
        async move {
            a.object("pods", "default", name).await.unwrap().unwrap()["metadata"]["uid"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let fenced_n4 = uid("fenced-n4").await;
    let avail_n4 = uid("avail-n4").await;
    assert!(runs(&agents[4], &fenced_n4) && runs(&agents[4], &avail_n4));

    lab.partition(&[&[0, 1, 2], &[3, 4]]).unwrap();
    let (major, minor) = (&agents[1], &agents[3]);
    wait_until("the majority to see n4 dead", LIMIT, || async {
        state_of(major, "n4").await.map(|s| s.0) == Some(MemberState::Dead)
    })
    .await
    .unwrap();
    let dead_seen = Instant::now();
    wait_until(
        "the available pod to move on the majority side",
        LIMIT,
        || async {
            let n = node_of(major, "avail-n4").await;
            !n.is_empty() && n != "n4"
        },
    )
    .await
    .unwrap();
    assert_eq!(
        node_of(major, "fenced-n4").await,
        "n4",
        "the fenced pod waits longer than the available one"
    );
    // Never two at once: from here until the majority runs its replacement, watch that the
    // minority's container is gone first.
    let mut stopped_on_n4: Option<Instant> = None;
    let mut replaced: Option<Instant> = None;
    let deadline = Instant::now() + LIMIT;
    while replaced.is_none() && Instant::now() < deadline {
        if stopped_on_n4.is_none() && !runs(&agents[4], &fenced_n4) {
            stopped_on_n4 = Some(Instant::now());
        }
        let n = node_of(major, "fenced-n4").await;
        if !n.is_empty() && n != "n4" {
            let i: usize = n[1..].parse().unwrap();
            if runs(&agents[i], &fenced_n4) {
                assert!(
                    stopped_on_n4.is_some() && !runs(&agents[4], &fenced_n4),
                    "the fenced pod runs on {n} while n4 still runs it"
                );
                replaced = Some(Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        replaced.is_some(),
        "the fenced pod was not replaced on the majority side"
    );
    // The available pod keeps running on the minority (its policy allows the duplicate).
    assert!(
        runs(&agents[4], &avail_n4),
        "the minority keeps its available pod"
    );
    // Fenced delay: detection bound (200 ms x 8 x 2) + fence timeout (1 s) + 1 s = 5.2 s.
    assert!(
        dead_seen.elapsed() >= Duration::from_secs(4),
        "fenced pod moved after only {:?}",
        dead_seen.elapsed()
    );

    // The minority replaces the available pod it lost, never the fenced one.
    wait_until("the minority to see n0 dead", LIMIT, || async {
        state_of(minor, "n0").await.map(|s| s.0) == Some(MemberState::Dead)
    })
    .await
    .unwrap();
    wait_until(
        "the available pod to move on the minority side",
        LIMIT,
        || async {
            let n = node_of(minor, "avail-n0").await;
            !n.is_empty() && n != "n0"
        },
    )
    .await
    .unwrap();
    // Watched, not looked at once: for longer than the majority's fenced delay (5.2 s) after
    // the minority's auction has acted, every observation shows the fenced pod still bound to
    // n0 (a replacement that came and went would be caught too).
    let watch_until = Instant::now() + Duration::from_secs(7);
    let mut observations = 0;
    while Instant::now() < watch_until {
        assert_eq!(
            node_of(minor, "fenced-n0").await,
            "n0",
            "a side without a majority never replaces a fenced pod (observation {observations})"
        );
        observations += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    lab.heal().unwrap();
    wait_for_identical_digests(&agents.iter().collect::<Vec<_>>(), LIMIT)
        .await
        .unwrap();
    for name in ["avail-n4", "fenced-n4", "avail-n0", "fenced-n0"] {
        let node = node_of(&agents[0], name).await;
        for a in &agents[1..] {
            assert_eq!(
                node_of(a, name).await,
                node,
                "one binding for {name} everywhere"
            );
        }
        // The duplicates are gone: the pod's container runs on its bound node only.
        let uid = uid(name).await;
        // (The binding may still move if a loaded node is briefly suspected: one instance, on
        // whatever node the pod is bound to now.)
        wait_until("one running instance", LIMIT, || async {
            let bound = node_of(&agents[0], name).await;
            let running: Vec<&str> = agents
                .iter()
                .filter(|a| runs(a, &uid))
                .map(|a| a.name())
                .collect();
            running == [bound.as_str()]
        })
        .await
        .unwrap_or_else(|e| {
            let running: Vec<&str> = agents
                .iter()
                .filter(|a| runs(a, &uid))
                .map(|a| a.name())
                .collect();
            let states: Vec<String> = agents
                .iter()
                .map(|a| {
                    let dir = a.data_dir().join("pods").join(&uid).join("containers");
                    let attempts: Vec<String> = std::fs::read_dir(&dir)
                        .into_iter()
                        .flatten()
                        .filter_map(Result::ok)
                        .map(|c| {
                            let p = c.path();
                            format!(
                                "{}:{}:{}",
                                c.file_name().to_string_lossy(),
                                p.join("started.json").exists(),
                                std::fs::read_to_string(p.join("exit.json")).unwrap_or_default()
                            )
                        })
                        .collect();
                    format!("{} {attempts:?}", a.name())
                })
                .collect();
            panic!(
                "{name} bound to {node} after the heal, running on {running:?}: {e}\n{}",
                states.join("\n")
            )
        });
    }
}

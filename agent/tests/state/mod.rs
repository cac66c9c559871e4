//! Replicated desired state across real agents: writes reach everyone, acknowledged writes
//! survive the writer's death, restarted agents catch up, concurrent writes converge.

use std::time::Duration;

use serde_json::{Value, json};
use shoal_chaos::testkit::{AgentProcess, alive_count, wait_until};

use crate::Lab;

const CONVERGE: Duration = Duration::from_secs(30);

fn config_map(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": data})
}

async fn converged_cluster(lab: &Lab, n: usize, extra: &[&str]) -> Vec<AgentProcess> {
    let seed = AgentProcess::start(extra.iter().fold(lab.spec("n0"), |s, a| s.arg(*a)))
        .await
        .unwrap();
    let mut agents = vec![seed];
    for i in 1..n {
        let spec = extra.iter().fold(
            lab.spec(&format!("n{i}")).join(agents[0].gossip_addr()),
            |s, a| s.arg(*a),
        );
        agents.push(AgentProcess::start(spec).await.unwrap());
    }
    for agent in &agents {
        wait_until("all alive", CONVERGE, || async {
            alive_count(agent).await == n
        })
        .await
        .unwrap();
    }
    agents
}

async fn wait_for_object(agent: &AgentProcess, name: &str) -> Value {
    let deadline = std::time::Instant::now() + CONVERGE;
    loop {
        if let Ok(Some(object)) = agent.object("configmaps", "default", name).await {
            return object;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never got {name}; log:\n{}",
            agent.name(),
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_equal_digests(agents: &[&AgentProcess]) {
    shoal_chaos::testkit::wait_for_identical_digests(agents, CONVERGE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_written_at_one_agent_reaches_all_five() {
    let lab = Lab::new();
    let agents = converged_cluster(&lab, 5, &[]).await;
    let (status, stored) = agents[0]
        .apply(&config_map("greeting", json!({"hello": "world"})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{stored}");
    let uid = stored["metadata"]["uid"].clone();
    for agent in &agents {
        let object = wait_for_object(agent, "greeting").await;
        assert_eq!(object["data"]["hello"], "world");
        assert_eq!(
            object["metadata"]["uid"], uid,
            "one object, one uid everywhere"
        );
    }
    wait_for_equal_digests(&agents.iter().collect::<Vec<_>>()).await;

    // Update through another agent, delete through a third.
    let (status, _) = agents[1]
        .apply(&config_map("greeting", json!({"hello": "shoal"})))
        .await
        .unwrap();
    assert_eq!(status, 200);
    for agent in &agents {
        wait_until("the update everywhere", CONVERGE, || async {
            agent
                .object("cm", "default", "greeting")
                .await
                .ok()
                .flatten()
                .is_some_and(|o| o["data"]["hello"] == "shoal")
        })
        .await
        .unwrap();
    }
    let (status, _) = agents[2]
        .call(
            hyper::Method::DELETE,
            "/v1/objects/configmaps/greeting?namespace=default",
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    for agent in &agents {
        wait_until("the delete everywhere", CONVERGE, || async {
            agent
                .object("cm", "default", "greeting")
                .await
                .is_ok_and(|o| o.is_none())
        })
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_write_survives_the_death_of_the_writer() {
    let lab = Lab::new();
    let mut agents = converged_cluster(&lab, 5, &[]).await;
    for i in 0..20 {
        let (status, body) = agents[0]
            .apply(&config_map(&format!("cm-{i}"), json!({"i": i.to_string()})))
            .await
            .unwrap();
        assert_eq!(status, 201, "{body}");
    }
    // The writer dies right after its last acknowledgement.
    agents[0].kill().unwrap();
    let survivors: Vec<&AgentProcess> = agents[1..].iter().collect();
    for agent in &survivors {
        for i in 0..20 {
            wait_for_object(agent, &format!("cm-{i}")).await;
        }
    }
    wait_for_equal_digests(&survivors).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_keeps_its_state_and_catches_up() {
    let lab = Lab::new();
    let mut agents = converged_cluster(&lab, 3, &["--anti-entropy-interval", "200ms"]).await;
    agents[0]
        .apply(&config_map("before", json!({})))
        .await
        .unwrap();
    wait_for_object(&agents[2], "before").await;
    agents[2].terminate().unwrap();
    for i in 0..30 {
        // A create whose home is the stopped node waits, as a client retries, until the
        // others see it gone and the next live node takes its place.
        let cm = config_map(&format!("while-down-{i}"), json!({}));
        let (status, body) = loop {
            let (status, body) = agents[0].apply(&cm).await.unwrap();
            if status != 503 || body["reason"] != "HomeUnavailable" {
                break (status, body);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(status, 201, "{body}");
    }
    agents[2].restart().await.unwrap();
    assert!(
        agents[2]
            .object("cm", "default", "before")
            .await
            .unwrap()
            .is_some(),
        "state persisted on disk"
    );
    for i in 0..30 {
        wait_for_object(&agents[2], &format!("while-down-{i}")).await;
    }
    wait_for_equal_digests(&agents.iter().collect::<Vec<_>>()).await;
}

/// Patches of different fields, sent at once through two agents, both survive whatever order
/// they reach each agent in. (A PUT of a whole object read earlier would instead overwrite every
/// field it carries, as in Kubernetes; truly concurrent whole-object writes are exercised by the
/// netns partition test in chaos-tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_of_different_fields_both_survive() {
    let api = crate::api::ApiLab::start(3).await;
    let file = api.manifest(
        "shared.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: shared}\ndata: {a: \"0\", b: \"0\"}\n",
    );
    api.ok(0, &["apply", "-f", &file]);
    for i in 0..3 {
        wait_until("the object everywhere", CONVERGE, || async {
            api.agents[i]
                .object("cm", "default", "shared")
                .await
                .ok()
                .flatten()
                .is_some()
        })
        .await
        .unwrap();
    }
    let (left, right) = std::thread::scope(|s| {
        let l = s.spawn(|| {
            api.kubectl(
                0,
                &[
                    "patch",
                    "cm",
                    "shared",
                    "--type",
                    "merge",
                    "-p",
                    r#"{"data":{"a":"left"}}"#,
                ],
            )
        });
        let r = s.spawn(|| {
            api.kubectl(
                1,
                &[
                    "patch",
                    "cm",
                    "shared",
                    "--type",
                    "merge",
                    "-p",
                    r#"{"data":{"b":"right"}}"#,
                ],
            )
        });
        (l.join().unwrap(), r.join().unwrap())
    });
    assert!(left.0 && right.0, "{left:?} {right:?}");
    let agents: Vec<&AgentProcess> = api.agents.iter().collect();
    wait_for_equal_digests(&agents).await;
    for agent in &agents {
        let o = agent
            .object("cm", "default", "shared")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (o["data"]["a"].as_str(), o["data"]["b"].as_str()),
            (Some("left"), Some("right")),
            "{o}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_its_quorum_is_refused_but_kept() {
    let lab = Lab::new();
    let agents = converged_cluster(&lab, 2, &[]).await;
    let doomed = config_map("doomed", json!({}));
    assert_eq!(agents[0].apply(&doomed).await.unwrap().0, 201);
    // Created before the freeze: a create is decided by its key's home node, which may be the
    // one about to freeze (`HomeUnavailable`); an update of it is written where it is taken.
    let lonely = config_map("lonely", json!({}));
    assert_eq!(agents[0].apply(&lonely).await.unwrap().0, 201);
    wait_for_object(&agents[1], "doomed").await;
    wait_for_object(&agents[1], "lonely").await;
    // The peer freezes: it still looks alive for a moment, but cannot acknowledge.
    agents[1].pause().unwrap();
    let lonely = config_map("lonely", json!({"k": "frozen"}));
    let first = agents[0].apply(&lonely).await.unwrap();
    // A client retrying the same write: the writer's copy already holds it, but one copy is
    // not the quorum, so the retry is refused too (it used to answer 200 at once).
    let retry = agents[0].apply(&lonely).await.unwrap();
    // Likewise a retried delete: "not found" would tell the client the delete is done.
    let delete = || {
        agents[0].call(
            hyper::Method::DELETE,
            "/v1/objects/configmaps/doomed?namespace=default",
            None,
        )
    };
    let deleted = delete().await.unwrap();
    let deleted_again = delete().await.unwrap();
    agents[1].resume().unwrap();
    // The first write (the peer still looks alive) waits for it and is kept; by the later ones
    // the peer may be seen dead, and they are refused without writing: never acknowledged.
    assert_eq!(first.0, 503, "{}", first.1);
    assert_eq!(first.1["reason"], "NotDurable", "{}", first.1);
    for (status, body) in [&retry, &deleted, &deleted_again] {
        assert_eq!(*status, 503, "{body}");
        assert!(
            body["reason"] == "NotDurable" || body["reason"] == "Unavailable",
            "{body}"
        );
    }
    // Not lost: the writer has it and replicates it once the peer is back; the retry is then
    // acknowledged (the peer holds it), and the retried delete too (404 if the first delete
    // was kept, then replicated).
    wait_for_object(&agents[1], "lonely").await;
    wait_until("n1 alive again", CONVERGE, || async {
        alive_count(&agents[0]).await == 2
    })
    .await
    .unwrap();
    let (status, body) = agents[0].apply(&lonely).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = delete().await.unwrap();
    assert!(status == 200 || status == 404, "{body}");
    assert_eq!(
        agents[1]
            .object("configmaps", "default", "doomed")
            .await
            .unwrap(),
        None
    );
}

/// A node whose peers are all dead does not acknowledge writes on its own copy: "acknowledged"
/// means durable on the write quorum (2), whatever the node believes of its peers. Seeing too
/// few peers to try, it writes nothing (kept alone, a create would start an incarnation that
/// could replace the one the others keep writing); the quorum is remembered across restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_node_does_not_acknowledge_alone() {
    let lab = Lab::new();
    let mut agents = converged_cluster(&lab, 2, &[]).await;
    wait_until("the cluster size recorded", CONVERGE, || async {
        agents[0].store_info().await.unwrap().write_quorum == 2
    })
    .await
    .unwrap();
    agents[1].kill().unwrap();
    wait_until("n1 seen dead", CONVERGE, || async {
        matches!(
            shoal_chaos::testkit::state_of(&agents[0], "n1").await,
            Some((shoal_gossip::MemberState::Dead, _))
        )
    })
    .await
    .unwrap();
    let alone = config_map("alone", json!({"k": "v"}));
    let (status, body) = agents[0].apply(&alone).await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["reason"], "Unavailable", "{body}");
    assert_eq!(
        agents[0]
            .object("configmaps", "default", "alone")
            .await
            .unwrap(),
        None,
        "nothing was written"
    );
    agents[0].kill().unwrap();
    agents[0].restart().await.unwrap();
    assert_eq!(agents[0].store_info().await.unwrap().write_quorum, 2);
    let (status, body) = agents[0].apply(&alone).await.unwrap();
    assert_eq!(status, 503, "{body}");
    // With the peer back, the same write is acknowledged and on both.
    agents[1].restart().await.unwrap();
    wait_until("n1 alive again", CONVERGE, || async {
        alive_count(&agents[0]).await == 2
    })
    .await
    .unwrap();
    let (status, body) = agents[0].apply(&alone).await.unwrap();
    assert_eq!(status, 201, "{body}");
    wait_for_object(&agents[1], "alone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_objects_get_clear_errors() {
    let lab = Lab::new();
    let agents = converged_cluster(&lab, 1, &[]).await;
    let a = &agents[0];
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "not valid JSON"),
        (
            br#"{"apiVersion":"v1","kind":"Pod"}"#.to_vec(),
            422,
            "metadata.name: Required value",
        ),
        (
            br#"{"apiVersion":"v1","kind":"Widget","metadata":{"name":"w"}}"#.to_vec(),
            422,
            "Widget",
        ),
        (
            br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"UPPER"}}"#.to_vec(),
            422,
            "metadata.name",
        ),
        (
            br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"a":"b c"}}}"#
                .to_vec(),
            422,
            "metadata.labels.a",
        ),
        (
            serde_json::to_vec(&config_map("big", json!({"k": "x".repeat(2 << 20)}))).unwrap(),
            413,
            "limit",
        ),
        // A scheduling field the auction could not read is refused, not left Pending.
        (
            br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"}],"topologySpreadConstraints":[{"maxSkew":1,"topologyKey":"zone","whenUnsatisfiable":"ScheduleAnyway","minDomains":2}]}}"#
                .to_vec(),
            422,
            "spec.topologySpreadConstraints[0].minDomains: Invalid value: 2: can only use minDomains if whenUnsatisfiable=DoNotSchedule, not ScheduleAnyway",
        ),
    ];
    for (body, status, text) in cases {
        let (got, answer) = a
            .call(hyper::Method::PUT, "/v1/objects", Some(body))
            .await
            .unwrap();
        assert_eq!(got, status, "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(text),
            "{answer}"
        );
    }
    let (got, answer) = a
        .call(
            hyper::Method::POST,
            "/v1/objects",
            Some(serde_json::to_vec(&config_map("x", json!({}))).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(got, 201, "{answer}");
    let (got, answer) = a
        .call(
            hyper::Method::POST,
            "/v1/objects",
            Some(serde_json::to_vec(&config_map("x", json!({}))).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(
        (got, answer["reason"].as_str()),
        (409, Some("AlreadyExists"))
    );
    // A valid object is stored with the apiserver's defaults, as the Kubernetes API would
    // store it: a Deployment written here and scaled through kubectl keeps its template (the
    // chaos profile's disk-full run caught a rollout started by the first scale).
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "web:1"}]}}}});
    let (got, answer) = a.apply(&deployment).await.unwrap();
    assert_eq!(got, 201, "{answer}");
    let stored = &answer["spec"];
    assert_eq!(stored["replicas"], 1, "{answer}");
    assert_eq!(stored["strategy"]["type"], "RollingUpdate", "{answer}");
    let container = &stored["template"]["spec"]["containers"][0];
    assert_eq!(container["imagePullPolicy"], "IfNotPresent", "{answer}");
    assert_eq!(
        container["terminationMessagePath"], "/dev/termination-log",
        "{answer}"
    );
    assert_eq!(
        stored["template"]["spec"]["restartPolicy"], "Always",
        "{answer}"
    );
    let (got, _) = a
        .call(hyper::Method::GET, "/v1/objects/widgets", None)
        .await
        .unwrap();
    assert_eq!(got, 404);
}

/// Issue #35, item 7, on real agents: an object deleted while a node was away does not come
/// back with that node once the tombstone is forgotten, also when the only node it meets on its
/// return joined after the collection (it learned the collection horizon with the state, and
/// makes the returning node resync). Before, the new node merged the stale object and spread it
/// to everyone. The horizon is the shortest allowed (60 s), collected every 6 s
/// (anti-entropy every 100 ms): the test waits about a minute and a half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_object_does_not_come_back_with_a_node_away_past_the_horizon() {
    let lab = Lab::new();
    let config = lab.path().join("horizon.toml");
    std::fs::write(&config, "[state]\ntombstone-horizon = \"60s\"\n").unwrap();
    let config = config.to_string_lossy().into_owned();
    let extra = ["--anti-entropy-interval", "100ms", "--config", &config];
    let mut agents = converged_cluster(&lab, 3, &extra).await;
    assert_eq!(
        agents[0]
            .apply(&config_map("doomed", json!({})))
            .await
            .unwrap()
            .0,
        201
    );
    wait_for_object(&agents[2], "doomed").await;
    // n2 leaves holding the object.
    let n2_addr = agents[2].gossip_addr();
    agents[2].kill().unwrap();
    let delete = || {
        agents[0].call(
            hyper::Method::DELETE,
            "/v1/objects/configmaps/doomed?namespace=default",
            None,
        )
    };
    let (status, body) = loop {
        // Its home may be the node just killed: retried until another takes its place.
        let (status, body) = delete().await.unwrap();
        if status != 503 {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status, 200, "{body}");
    // The survivors forget the tombstone past the horizon.
    for agent in &agents[..2] {
        wait_until(
            "the tombstone forgotten",
            Duration::from_secs(150),
            || async {
                agent
                    .log()
                    .contains("forgot tombstones older than the horizon")
            },
        )
        .await
        .unwrap();
    }
    // n3 joins after the collection: it never saw the object nor its tombstone.
    let n3 = AgentProcess::start(
        extra
            .iter()
            .fold(lab.spec("n3").join(agents[0].gossip_addr()), |s, a| {
                s.arg(*a)
            }),
    )
    .await
    .unwrap();
    let after = config_map("after", json!({}));
    let (status, body) = loop {
        let (status, body) = agents[0].apply(&after).await.unwrap();
        if status != 503 {
            break (status, body);
        }
        // n3, just joined, may be the key's home before its first sync: peers refuse its
        // writes until it has one (a client retries; the retry finds the object written).
        eprintln!("creating `after`: 503 {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(status == 201 || status == 200, "{status} {body}");
    wait_for_object(&n3, "after").await;
    wait_for_equal_digests(&[&agents[0], &agents[1], &n3]).await;
    // n0 and n1 go: n2 comes back to n3 alone, with the object n3 never heard of.
    agents[0].kill().unwrap();
    agents[1].kill().unwrap();
    drop(agents.remove(2));
    let n2 = AgentProcess::start(extra.iter().fold(
        lab.spec("n2").bind(n2_addr).join(n3.gossip_addr()),
        |s, a| s.arg(*a),
    ))
    .await
    .unwrap();
    // n2 catches up with n3 (it gets what was written while it was away)...
    wait_for_object(&n2, "after").await;
    wait_for_equal_digests(&[&n2, &n3]).await;
    // ... and the deleted object is on neither: n3 did not take it from n2, and n2 dropped it.
    for agent in [&n2, &n3] {
        assert_eq!(
            agent
                .object("configmaps", "default", "doomed")
                .await
                .unwrap(),
            None,
            "{} holds the deleted object again; log:\n{}",
            agent.name(),
            agent.log()
        );
    }
}

//! A 3|2 partition of five agents: both sides keep accepting writes; after the heal every agent
//! holds identical desired state, with the documented merge semantics.

use std::time::Duration;

use serde_json::{Value, json};
use shoal_chaos::lab::NetLab;
use shoal_chaos::testkit::{
    AgentProcess, alive_count, state_of, wait_for_identical_digests, wait_until,
};
use shoal_gossip::MemberState;

const LIMIT: Duration = Duration::from_secs(60);

fn config_map(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": data})
}

async fn has(agent: &AgentProcess, name: &str) -> Option<Value> {
    agent
        .object("configmaps", "default", name)
        .await
        .ok()
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_sides_both_write_and_converge_after_heal() {
    let mut lab = NetLab::new(5).expect("creating the netns lab (needs root and iproute2)");
    let (_root, agents) =
        shoal_chaos::start_cluster(&lab, 5, &["--anti-entropy-interval", "200ms"])
            .await
            .unwrap();
    agents[0]
        .apply(&config_map("shared", json!({"a": "0", "b": "0"})))
        .await
        .unwrap();
    agents[0]
        .apply(&config_map("doomed", json!({"v": "0"})))
        .await
        .unwrap();
    for a in &agents {
        wait_until("the objects everywhere", LIMIT, || async {
            has(a, "shared").await.is_some() && has(a, "doomed").await.is_some()
        })
        .await
        .unwrap();
    }

    lab.partition(&[&[0, 1, 2], &[3, 4]]).unwrap();
    for (side, others) in [
        (&[0usize, 1, 2][..], &["n3", "n4"][..]),
        (&[3, 4][..], &["n0", "n1", "n2"][..]),
    ] {
        for i in side {
            for other in others {
                let agent = &agents[*i];
                wait_until("the other side seen dead", LIMIT, || async {
                    state_of(agent, other).await.map(|s| s.0) == Some(MemberState::Dead)
                })
                .await
                .unwrap();
            }
        }
    }
    // Both sides write: different fields of one object, new objects, and a delete on one side
    // concurrent with an update on the other.
    let mut shared_a = has(&agents[1], "shared").await.unwrap();
    shared_a["data"]["a"] = json!("side-a");
    let mut shared_b = has(&agents[4], "shared").await.unwrap();
    shared_b["data"]["b"] = json!("side-b");
    for o in [&mut shared_a, &mut shared_b] {
        o["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
    }
    assert_eq!(agents[1].apply(&shared_a).await.unwrap().0, 200);
    assert_eq!(agents[4].apply(&shared_b).await.unwrap().0, 200);
    for i in 0..5 {
        assert_eq!(
            agents[0]
                .apply(&config_map(&format!("a-{i}"), json!({})))
                .await
                .unwrap()
                .0,
            201
        );
        assert_eq!(
            agents[3]
                .apply(&config_map(&format!("b-{i}"), json!({})))
                .await
                .unwrap()
                .0,
            201
        );
    }
    // The partition is real: nothing crosses it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in [3, 4] {
        assert!(
            has(&agents[i], "a-0").await.is_none(),
            "side B must not see side A's writes yet"
        );
    }
    for i in [0, 1, 2] {
        assert!(
            has(&agents[i], "b-0").await.is_none(),
            "side A must not see side B's writes yet"
        );
    }
    let (status, _) = agents[2]
        .call(
            hyper::Method::DELETE,
            "/v1/objects/configmaps/doomed?namespace=default",
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        agents[3]
            .apply(&config_map("doomed", json!({"v": "updated"})))
            .await
            .unwrap()
            .0,
        200
    );

    lab.heal().unwrap();
    wait_for_identical_digests(&agents.iter().collect::<Vec<_>>(), LIMIT)
        .await
        .unwrap();
    for a in &agents {
        let shared = has(a, "shared").await.unwrap();
        assert_eq!(
            (shared["data"]["a"].as_str(), shared["data"]["b"].as_str()),
            (Some("side-a"), Some("side-b")),
            "{}",
            a.name()
        );
        for i in 0..5 {
            assert!(
                has(a, &format!("a-{i}")).await.is_some()
                    && has(a, &format!("b-{i}")).await.is_some()
            );
        }
        assert!(
            has(a, "doomed").await.is_none(),
            "delete wins over a concurrent update of the same incarnation"
        );
    }
    for a in &agents {
        wait_until("5 alive again", LIMIT, || async {
            alive_count(a).await == 5
        })
        .await
        .unwrap();
    }
}

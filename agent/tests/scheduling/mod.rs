//! Scheduling by auction on real agents: label-based claims, reasoned refusals, and pods of a
//! killed node auctioned again after the eviction delay. Read through the API with kubectl.

use std::time::{Duration, Instant};

use shoal_chaos::testkit::{state_of, wait_until};
use shoal_gossip::MemberState;

use crate::api::ApiLab;

const LIMIT: Duration = Duration::from_secs(30);
/// The waits after a node joins: the join, its first gossip and the re-auction of the pods it
/// unblocks, on a CI machine running other clusters at once (30 s once proved short there).
const JOIN_LIMIT: Duration = Duration::from_secs(60);

fn node_of(api: &ApiLab, agent: usize, pod: &str) -> String {
    let (_, out, _) = api.kubectl(
        agent,
        &["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"],
    );
    out
}

/// Fails the test if two of `domains` (the nodes or zones of admitted replicas) are equal.
fn assert_apart<T: Ord + std::fmt::Debug>(domains: &[T], what: &str, seen: &str) {
    let distinct: std::collections::BTreeSet<&T> = domains.iter().collect();
    assert_eq!(
        domains.len(),
        distinct.len(),
        "two replicas admitted in one {what}: {seen}"
    );
}

/// The zone of node `n` in the test of the pods that fit nowhere.
/// The newest lines of agent `i`'s log, newest first (what a failure shows).
fn newest_log(api: &ApiLab, i: usize) -> String {
    let log = api.agents[i].log();
    let tail: Vec<&str> = log.lines().rev().take(80).collect();
    let own = api.kubectl(i, &["get", "pods", "-o", "json"]).1;
    format!(
        "--- n{i}'s log, newest first ---\n{}\n--- n{i}'s pods ---\n{own}",
        tail.join("\n")
    )
}

fn zone_of(node: &str) -> &'static str {
    match node {
        "n2" => "b",
        "n3" => "c",
        _ => "a",
    }
}

fn pods(n: usize, prefix: &str, selector: &str, cpu: &str) -> String {
    (0..n)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {prefix}-{i}}}\nspec:\n  nodeSelector: {{{selector}}}\n  containers: [{{name: c, image: busybox, resources: {{requests: {{cpu: \"{cpu}\"}}}}}}]\n---\n"
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_land_only_on_nodes_whose_labels_match() {
    // n0, n1 in zone a; n2 in zone b.
    let api = ApiLab::start_with(3, |i| {
        vec![
            "--labels".into(),
            format!("zone={}", if i == 2 { "b" } else { "a" }),
        ]
    })
    .await;
    let manifest = pods(6, "in-a", "zone: a", "100m") + &pods(3, "in-b", "zone: b", "100m");
    let file = api.manifest("pods.yaml", &manifest);
    api.ok(0, &["apply", "-f", &file]);
    for (prefix, n, allowed) in [("in-a", 6, &["n0", "n1"][..]), ("in-b", 3, &["n2"][..])] {
        for i in 0..n {
            let pod = format!("{prefix}-{i}");
            wait_until(&format!("{pod} to be bound"), LIMIT, || async {
                !node_of(&api, 1, &pod).is_empty()
            })
            .await
            .unwrap();
            let node = node_of(&api, 2, &pod);
            assert!(allowed.contains(&node.as_str()), "{pod} landed on {node}");
        }
    }
    let out = api.ok(1, &["get", "pods", "-o", "wide"]);
    assert!(out.contains("in-b-0") && out.contains("n2"), "{out}");
    let scheduled = api.ok(
        0,
        &[
            "get",
            "pod",
            "in-a-0",
            "-o",
            "jsonpath={.status.conditions[0].status}",
        ],
    );
    assert_eq!(scheduled, "True");
}

/// The pods labelled `app=<app>` as agent `agent` lists them: the listing, the nodes of those a
/// node admitted (its worker reports their container statuses), and how many wait because no
/// node of the cluster matched their anti-affinity.
fn replicas(api: &ApiLab, agent: usize, app: &str) -> (String, Vec<String>, usize) {
    let unmatched = format!(
        "0/{n} nodes are available: {n} node(s) didn't match pod anti-affinity rules.",
        n = api.agents.len()
    );
    let listing = api.ok(
        agent,
        &[
            "get",
            "pods",
            "-l",
            &format!("app={app}"),
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName}|{.status.containerStatuses[0].name}|{.status.conditions[0].message}{\"\\n\"}{end}",
        ],
    );
    let lines: Vec<Vec<&str>> = listing
        .lines()
        .map(|l| l.splitn(3, '|').collect())
        .collect();
    let admitted = lines
        .iter()
        .filter(|l| l.len() == 3 && !l[0].is_empty() && !l[1].is_empty())
        .map(|l| l[0].to_owned())
        .collect();
    let pending = lines
        .iter()
        .filter(|l| l.len() == 3 && l[0].is_empty() && l[2] == unmatched)
        .count();
    (listing, admitted, pending)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_fits_nowhere_says_why() {
    // n0, n1 in zone a; n2 in zone b (for the zone anti-affinity below); n3, in zone c, joins
    // later.
    let mut api = ApiLab::start_with(3, |i| {
        vec![
            "--labels".into(),
            format!(
                "topology.kubernetes.io/zone={}",
                if i == 2 { "b" } else { "a" }
            ),
        ]
    })
    .await;
    let file = api.manifest("big.yaml", &pods(1, "too-big", "", "5000"));
    api.ok(0, &["apply", "-f", &file]);
    let mut message = String::new();
    wait_until("the unschedulable condition", LIMIT, || {
        let out = api.ok(
            1,
            &[
                "get",
                "pod",
                "too-big-0",
                "-o",
                "jsonpath={.status.conditions[0].message}",
            ],
        );
        message = out.clone();
        // Under load a node may be suspect for a moment and counted as such: the verdict is
        // renewed, so wait for the settled one.
        async move { out == "0/3 nodes are available: 3 Insufficient cpu." }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: last message {message:?}"));
    // Another agent learns the verdict by gossip: wait for it there too.
    let mut reason = String::new();
    wait_until("the verdict at another agent", LIMIT, || {
        reason = api.ok(
            2,
            &[
                "get",
                "pod",
                "too-big-0",
                "-o",
                "jsonpath={.status.conditions[0].reason}",
            ],
        );
        let ok = reason == "Unschedulable";
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: last reason {reason:?}"));
    assert!(node_of(&api, 0, "too-big-0").is_empty());

    // Issue #37: four replicas that must not share a node, on three nodes, auctioned at once by
    // several auctioneers: three run on three nodes, the fourth stays Pending and says why, as
    // on Kubernetes. Two concurrent auctions may bind two replicas to one node for a moment;
    // that node's admission runs only one of them and hands the other back (DESIGN.md §6), so
    // what must hold at every look is that no two replicas are admitted on one node (a pod the
    // node admitted has the container statuses its worker reports; no image is imported here,
    // so they wait in ErrImageNeverPull, which is enough to place them).
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: apart}\nspec:\n  replicas: 4\n  selector: {matchLabels: {app: apart}}\n  template:\n    metadata: {labels: {app: apart}}\n    spec:\n      affinity:\n        podAntiAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n          - topologyKey: kubernetes.io/hostname\n            labelSelector: {matchLabels: {app: apart}}\n      containers: [{name: c, image: busybox}]\n";
    let file = api.manifest("apart.yaml", deployment);
    api.ok(0, &["apply", "-f", &file]);
    let mut seen = String::new();
    wait_until(
        "three replicas on three nodes and one pending",
        LIMIT,
        || {
            let (listing, admitted, pending) = replicas(&api, 1, "apart");
            seen = listing;
            assert_apart(&admitted, "node", &seen);
            let ok = seen.lines().count() == 4 && admitted.len() == 3 && pending == 1;
            async move { ok }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {seen}"));

    // Issue #37: replicas that must not share a *zone*, which no node can check alone: their
    // auctions go through one auctioneer (the constraint's), so two of them never land in zone
    // a on n0 and n1 at once; one runs in each zone, two stay Pending and say why.
    let zoned = deployment
        .replace("name: apart", "name: zoned")
        .replace("app: apart", "app: zoned")
        .replace("kubernetes.io/hostname", "topology.kubernetes.io/zone");
    let file = api.manifest("zoned.yaml", &zoned);
    api.ok(0, &["apply", "-f", &file]);
    wait_until("one zoned replica per zone and two pending", LIMIT, || {
        let (listing, admitted, pending) = replicas(&api, 2, "zoned");
        seen = listing;
        let zones: Vec<&str> = admitted.iter().map(|n| zone_of(n)).collect();
        assert_apart(&zones, "zone", &seen);
        let ok = seen.lines().count() == 4 && zones.len() == 2 && pending == 2;
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {seen}"));

    // A fourth node joins, in a new zone c. As upstream moves unschedulable pods back to its
    // queue when a node is added, the waiting replicas are auctioned again: the fourth `apart`
    // replica runs on n3, a third `zoned` replica runs in zone c, the last one still waits
    // (now "0/4 nodes"). The same checks hold at every look.
    api.add_agent(vec![
        "--labels".into(),
        "topology.kubernetes.io/zone=c".into(),
    ])
    .await;
    wait_until(
        "the fourth apart replica on the new node",
        JOIN_LIMIT,
        || {
            let (listing, admitted, pending) = replicas(&api, 3, "apart");
            seen = listing;
            assert_apart(&admitted, "node", &seen);
            let ok = admitted.len() == 4 && pending == 0;
            async move { ok }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {seen}\n{}", newest_log(&api, 3)));
    wait_until("a zoned replica in the new zone", JOIN_LIMIT, || {
        let (listing, admitted, pending) = replicas(&api, 0, "zoned");
        seen = listing;
        let zones: Vec<&str> = admitted.iter().map(|n| zone_of(n)).collect();
        assert_apart(&zones, "zone", &seen);
        let ok = zones.len() == 3 && pending == 1;
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {seen}\n{}", newest_log(&api, 3)));

    // Zone spread with maxSkew 1 over the three zones, scaled from 0 to 12 at once: its pods
    // are auctioned one at a time by the constraint's auctioneer, so no zone ever holds more
    // than its 4 (checked at every look) and all 12 end 4/4/4, although zone a has two nodes.
    let spread = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: spread}\nspec:\n  replicas: 0\n  selector: {matchLabels: {app: spread}}\n  template:\n    metadata: {labels: {app: spread}}\n    spec:\n      topologySpreadConstraints:\n      - maxSkew: 1\n        topologyKey: topology.kubernetes.io/zone\n        whenUnsatisfiable: DoNotSchedule\n        labelSelector: {matchLabels: {app: spread}}\n      containers: [{name: c, image: busybox}]\n";
    let file = api.manifest("spread.yaml", spread);
    api.ok(1, &["apply", "-f", &file]);
    api.ok(2, &["scale", "deployment", "spread", "--replicas=12"]);
    wait_until("12 spread replicas, 4 per zone", LIMIT, || {
        let (listing, admitted, _) = replicas(&api, 1, "spread");
        seen = listing;
        let mut per_zone = std::collections::BTreeMap::from([("a", 0), ("b", 0), ("c", 0)]);
        for node in &admitted {
            *per_zone.get_mut(zone_of(node)).unwrap() += 1;
        }
        assert!(
            per_zone.values().all(|n| *n <= 4),
            "more than 4 spread replicas in a zone: {per_zone:?}\n{seen}"
        );
        let ok = per_zone.values().all(|n| *n == 4);
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {seen}"));

    // A term's namespaceSelector: a pod in another namespace that must not share a node with
    // the replicas of `default` (selected by the label every namespace carries) finds no node;
    // counting only its own namespace, it would run anywhere.
    api.ok(0, &["create", "namespace", "other"]);
    let outsider = "apiVersion: v1\nkind: Pod\nmetadata: {name: outsider, namespace: other}\nspec:\n  affinity:\n    podAntiAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n      - topologyKey: kubernetes.io/hostname\n        labelSelector: {matchLabels: {app: apart}}\n        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: default}}\n  containers: [{name: c, image: busybox}]\n";
    let file = api.manifest("outsider.yaml", outsider);
    api.ok(0, &["apply", "-f", &file]);
    wait_until("the outsider pending for anti-affinity", LIMIT, || {
        seen = api.ok(
            2,
            &[
                "get",
                "pod",
                "outsider",
                "-n",
                "other",
                "-o",
                "jsonpath={.spec.nodeName}|{.status.conditions[0].message}",
            ],
        );
        let ok =
            seen == "|0/4 nodes are available: 4 node(s) didn't match pod anti-affinity rules.";
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {seen}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_a_killed_node_are_auctioned_again_after_the_eviction_delay() {
    let eviction = Duration::from_secs(1);
    let mut api = ApiLab::start_with(3, |_| vec!["--eviction-delay".into(), "1s".into()]).await;
    let file = api.manifest("pods.yaml", &pods(6, "p", "", "100m"));
    api.ok(0, &["apply", "-f", &file]);
    for i in 0..6 {
        let pod = format!("p-{i}");
        wait_until("all bound", LIMIT, || async {
            !node_of(&api, 0, &pod).is_empty()
        })
        .await
        .unwrap();
    }
    // Kill the node with the most pods (not the one we ask).
    let placements: Vec<String> = (0..6)
        .map(|i| node_of(&api, 0, &format!("p-{i}")))
        .collect();
    let victim = ["n1", "n2"]
        .into_iter()
        .max_by_key(|n| placements.iter().filter(|p| p == n).count())
        .unwrap();
    let moved: Vec<String> = (0..6)
        .map(|i| format!("p-{i}"))
        .filter(|p| node_of(&api, 0, p) == victim)
        .collect();
    let victim_index: usize = victim[1..].parse().unwrap();
    api.agents[victim_index].kill().unwrap();
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim_index).collect();
    for i in &survivors {
        let agent = &api.agents[*i];
        wait_until("the victim seen dead", LIMIT, || async {
            state_of(agent, victim).await.map(|s| s.0) == Some(MemberState::Dead)
        })
        .await
        .unwrap();
    }
    let dead_at = Instant::now();
    for pod in &moved {
        wait_until(&format!("{pod} to move"), LIMIT, || async {
            let node = node_of(&api, survivors[0], pod);
            !node.is_empty() && node != victim
        })
        .await
        .unwrap();
    }
    let took = dead_at.elapsed();
    assert!(
        took <= eviction + Duration::from_secs(2),
        "re-auctioned {took:?} after the node was seen dead"
    );
    let epoch = api.ok(
        survivors[1],
        &[
            "get",
            "pod",
            &moved[0],
            "-o",
            "jsonpath={.metadata.annotations.shoal\\.io/binding-epoch}",
        ],
    );
    assert_eq!(epoch, "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tainted_nodes_take_only_pods_that_tolerate_them() {
    let api = ApiLab::start_with(2, |i| {
        if i == 0 {
            vec!["--taints".into(), "dedicated=db:NoSchedule".into()]
        } else {
            Vec::new()
        }
    })
    .await;
    let plain = pods(4, "plain", "", "100m");
    let tolerant = "apiVersion: v1\nkind: Pod\nmetadata: {name: tolerant}\nspec:\n  nodeSelector: {kubernetes.io/hostname: n0}\n  tolerations: [{key: dedicated, operator: Equal, value: db, effect: NoSchedule}]\n  containers: [{name: c, image: busybox}]\n---\n";
    let stuck = "apiVersion: v1\nkind: Pod\nmetadata: {name: stuck}\nspec:\n  nodeSelector: {kubernetes.io/hostname: n0}\n  containers: [{name: c, image: busybox}]\n";
    let file = api.manifest("taints.yaml", &format!("{plain}{tolerant}{stuck}"));
    api.ok(1, &["apply", "-f", &file]);
    for i in 0..4 {
        let pod = format!("plain-{i}");
        wait_until("bound", LIMIT, || async {
            !node_of(&api, 0, &pod).is_empty()
        })
        .await
        .unwrap();
        assert_eq!(
            node_of(&api, 0, &pod),
            "n1",
            "{pod} avoids the tainted node"
        );
    }
    wait_until("the tolerant pod bound", LIMIT, || async {
        node_of(&api, 1, "tolerant") == "n0"
    })
    .await
    .unwrap();
    wait_until("the stuck pod's reasons", LIMIT, || async {
        api.ok(0, &["get", "pod", "stuck", "-o", "jsonpath={.status.conditions[0].message}"])
            == "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: db}."
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", api.ok(0, &["get", "pod", "stuck", "-o", "jsonpath={.status.conditions[0].message}"])));
    let taints = api.ok(
        1,
        &["get", "node", "n0", "-o", "jsonpath={.spec.taints[0].key}"],
    );
    assert_eq!(taints, "dedicated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonset_pods_are_claimed_by_each_matching_node() {
    let api = ApiLab::start_with(3, |i| {
        vec![
            "--labels".into(),
            format!("zone={}", if i == 2 { "b" } else { "a" }),
        ]
    })
    .await;
    let ds = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent}\nspec:\n  selector: {matchLabels: {app: agent}}\n  template:\n    metadata: {labels: {app: agent}}\n    spec:\n      nodeSelector: {zone: a}\n      containers: [{name: c, image: busybox}]\n";
    let file = api.manifest("ds.yaml", ds);
    api.ok(2, &["apply", "-f", &file]);
    for node in ["n0", "n1"] {
        let pod = format!("agent-{node}");
        wait_until(&format!("{pod} claimed"), LIMIT, || async {
            node_of(&api, 2, &pod) == node
        })
        .await
        .unwrap();
    }
    // No pod for the node that does not match, and no auction moved anything: watched over
    // more than one resync of n2's claims (every observation, not one look after a sleep).
    let watch_until = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < watch_until {
        let (ok, _, _) = api.kubectl(0, &["get", "pod", "agent-n2"]);
        assert!(!ok, "n2 (zone b) must not claim a pod");
        for node in ["n0", "n1"] {
            assert_eq!(
                node_of(&api, 2, &format!("agent-{node}")),
                node,
                "no auction moves a DaemonSet pod"
            );
        }
    }
    let owners = api.ok(
        1,
        &[
            "get",
            "pod",
            "agent-n0",
            "-o",
            "jsonpath={.metadata.ownerReferences[0].kind}",
        ],
    );
    assert_eq!(owners, "DaemonSet");
    // Its status, observed: two nodes fit (zone a), both have their pod.
    assert_eq!(
        api.ok(
            0,
            &[
                "get",
                "ds",
                "agent",
                "-o",
                "jsonpath={.status.desiredNumberScheduled}/{.status.currentNumberScheduled}/{.status.numberMisscheduled}",
            ],
        ),
        "2/2/0"
    );
    // Deleting the DaemonSet deletes its pods (owner references).
    api.ok(0, &["delete", "daemonset", "agent"]);
    wait_until("the DaemonSet's pods gone", LIMIT, || async {
        let out = api.ok(1, &["get", "pods", "-o", "name"]);
        !out.contains("agent-n0") && !out.contains("agent-n1")
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_pod_preempts_a_lower_priority_one() {
    let api = ApiLab::start_with(3, |_| Vec::new()).await;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Each pod asks for 60% of a node: one per node.
    let cpu = format!("{}m", cores * 600);
    let manifest = |name: &str, priority: i64| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  priority: {priority}\n  containers: [{{name: c, image: busybox, resources: {{requests: {{cpu: \"{cpu}\"}}}}}}]\n---\n"
        )
    };
    // The low pods one at a time, each seen bound by every agent before the next: concurrent
    // auctions can still place two on one node (live bids carry no admission check yet —
    // issue #14's live overcommit), and this test is about preemption. Every agent must also
    // see every low pod bound before the urgent one comes: a bidder that has not yet seen a
    // binding to itself would offer that room.
    for i in 0..3 {
        let name = format!("low-{i}");
        api.ok(
            0,
            &[
                "apply",
                "-f",
                &api.manifest(&format!("{name}.yaml"), &manifest(&name, 0)),
            ],
        );
        for agent in 0..3 {
            wait_until("the low pod bound", LIMIT, || async {
                !node_of(&api, agent, &name).is_empty()
            })
            .await
            .unwrap();
        }
    }
    let nodes: std::collections::BTreeSet<String> = (0..3)
        .map(|i| node_of(&api, 0, &format!("low-{i}")))
        .collect();
    assert_eq!(nodes.len(), 3, "one low pod per node: {nodes:?}");
    api.ok(
        0,
        &[
            "apply",
            "-f",
            &api.manifest("urgent.yaml", &manifest("urgent", 1000)),
        ],
    );
    wait_until("the urgent pod bound", LIMIT, || async {
        !node_of(&api, 2, "urgent").is_empty()
    })
    .await
    .unwrap();
    // Exactly one low pod made room (agent 0 learns of it by replication), and it waits for a
    // node now, saying why.
    let unbound = || {
        (0..3)
            .map(|i| format!("low-{i}"))
            .filter(|p| node_of(&api, 0, p).is_empty())
            .collect::<Vec<String>>()
    };
    wait_until("one victim", LIMIT, || {
        let n = unbound().len();
        async move { n == 1 }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", unbound()));
    let victims = unbound();
    let victim = &victims[0];
    wait_until("the victim's unschedulable condition", LIMIT, || async {
        api.kubectl(
            1,
            &[
                "get",
                "pod",
                victim,
                "-o",
                "jsonpath={.status.conditions[0].message}",
            ],
        )
        .1
        .starts_with("0/3 nodes are available")
    })
    .await
    .unwrap();
}

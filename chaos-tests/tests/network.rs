//! One IP per pod, for real, in the netns lab: three agents in three host namespaces, each
//! leasing a block of the cluster CIDR, bridging its pods and routing to the others' blocks.
//! A pod on n0 fetches pages from pods on n0, n1 and n2 by IP (busybox nc: static busybox's
//! wget segfaults in a container without NSS modules, even for an IP), sees its own IP
//! through the downward API and /etc/hosts; pods' IPs lie in their node's block; deleting a pod
//! removes its veth; stopping the agents (`--cleanup`) leaves no bridge, veth or route behind.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use shoal_agent::testkit::{AgentProcess, wait_until};
use shoal_chaos::lab::NetLab;

const LIMIT: Duration = Duration::from_secs(60);

fn server(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [{
               "name": "web", "image": "shoal.local/busybox:1",
               "command": ["sh", "-c", format!("mkdir -p /w && echo hello from {name} > /w/index.html && exec httpd -f -p 8080 -h /w")]}]}})
}

async fn pod(agent: &AgentProcess, name: &str) -> Value {
    agent
        .object("pods", "default", name)
        .await
        .ok()
        .flatten()
        .unwrap_or(Value::Null)
}

/// `ip -n <ns> <args>`'s output (inspection only; the agents use netlink).
fn ip_in(ns: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(["-n", ns])
        .args(args)
        .output()
        .expect("ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn log_of(agent: &AgentProcess, uid: &str, container: &str) -> String {
    std::fs::read_to_string(
        agent
            .data_dir()
            .join("pods")
            .join(uid)
            .join("logs")
            .join(container)
            .join("0.log"),
    )
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_pods_on_other_nodes_by_ip_and_nothing_is_left() {
    let lab = NetLab::new(3).expect("creating the netns lab (needs root and iproute2)");
    let (_root, mut agents) = shoal_chaos::start_cluster(
        &lab,
        3,
        &[
            "--pod-network",
            "bridge",
            "--anti-entropy-interval",
            "200ms",
            "--cleanup",
        ],
    )
    .await
    .unwrap();
    for agent in &agents {
        shoal_chaos::import_busybox(agent).unwrap();
    }
    // Every node holds a block, and no two the same one.
    let mut ids = BTreeMap::new();
    for (i, agent) in agents.iter().enumerate() {
        ids.insert(agent.client().self_info().await.unwrap().node_id, i);
    }
    let read_blocks = || async {
        let (_, list) = agents[0]
            .call(hyper::Method::GET, "/v1/objects/podcidrblocks", None)
            .await
            .unwrap();
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| {
                let node = *ids.get(o["spec"]["nodeID"].as_str()?)?;
                Some((node, o["spec"]["cidr"].as_str()?.parse().ok()?))
            })
            .collect::<BTreeMap<usize, ipnet::Ipv4Net>>()
    };
    wait_until("a block leased by each node", LIMIT, || async {
        read_blocks().await.len() == 3
    })
    .await
    .unwrap();
    let blocks = read_blocks().await;
    let distinct: BTreeSet<_> = blocks.values().collect();
    assert_eq!(distinct.len(), 3, "{blocks:?}");

    for i in 0..3 {
        let (code, body) = agents[0]
            .apply(&server(&format!("srv-{i}"), &format!("n{i}")))
            .await
            .unwrap();
        assert_eq!(code, 201, "{body}");
    }
    let mut ips = BTreeMap::new();
    for i in 0..3 {
        let name = format!("srv-{i}");
        wait_until("the server running with an IP", LIMIT, || async {
            let p = pod(&agents[0], &name).await;
            p["status"]["phase"] == "Running" && p["status"]["podIP"].is_string()
        })
        .await
        .unwrap();
        let p = pod(&agents[0], &name).await;
        let ip: std::net::Ipv4Addr = p["status"]["podIP"].as_str().unwrap().parse().unwrap();
        assert!(
            blocks[&i].contains(&ip),
            "{ip} outside n{i}'s {}",
            blocks[&i]
        );
        assert_eq!(p["status"]["podIPs"], json!([{"ip": ip.to_string()}]));
        ips.insert(i, ip);
    }

    let targets: Vec<String> = ips.values().map(|ip| ip.to_string()).collect();
    let script = format!(
        "echo POD_IP=$POD_IP; cat /etc/hosts; for ip in {}; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 $ip 8080 | grep hello || echo FAILED $ip; done",
        targets.join(" ")
    );
    let client = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client", "namespace": "default"},
        "spec": {"nodeName": "n0", "restartPolicy": "Never", "containers": [{
            "name": "c", "image": "shoal.local/busybox:1",
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "command": ["sh", "-c", script]}]}});
    assert_eq!(agents[0].apply(&client).await.unwrap().0, 201);
    wait_until("the client done", LIMIT, || async {
        pod(&agents[0], "client").await["status"]["phase"] == "Succeeded"
    })
    .await
    .unwrap();
    let client = pod(&agents[0], "client").await;
    let uid = client["metadata"]["uid"].as_str().unwrap();
    let client_ip = client["status"]["podIP"].as_str().unwrap();
    let log = log_of(&agents[0], uid, "c");
    for i in 0..3 {
        assert!(log.contains(&format!("hello from srv-{i}")), "{log}");
    }
    assert!(!log.contains("FAILED"), "{log}");
    assert!(log.contains(&format!("POD_IP={client_ip}")), "{log}");
    assert!(log.contains(&format!("{client_ip}\tclient")), "{log}");

    // Deleting a pod removes its veth from its node.
    let srv1 = pod(&agents[0], "srv-1").await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let veths = |host: usize| {
        ip_in(&lab.host(host), &["-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap().to_owned())
            .filter(|n| n.starts_with("sv"))
            .count()
    };
    assert_eq!(veths(1), 1);
    let (code, _) = agents[0]
        .call(
            hyper::Method::DELETE,
            "/v1/objects/pods/srv-1?namespace=default",
            None,
        )
        .await
        .unwrap();
    assert_eq!(code, 200);
    wait_until("srv-1's sandbox gone", LIMIT, || async {
        !agents[1].data_dir().join("pods").join(&srv1).exists()
    })
    .await
    .unwrap();
    assert_eq!(veths(1), 0, "{}", ip_in(&lab.host(1), &["link", "show"]));

    // Routes: each node routes the two other blocks via their nodes.
    let routes = ip_in(&lab.host(0), &["route", "show", "proto", "83"]);
    for i in [1, 2] {
        assert!(
            routes.contains(&format!("{} via {}", blocks[&i], lab.address(i))),
            "{routes}"
        );
    }

    // Stopping with --cleanup removes the pods, the bridge, the veths and the routes.
    for agent in &mut agents {
        let status = agent.terminate().unwrap();
        assert!(status.success(), "{status}: {}", agent.log());
    }
    for (i, agent) in agents.iter().enumerate() {
        let links = ip_in(&lab.host(i), &["-o", "link", "show"]);
        assert!(
            !links.contains("shoal") && veths(i) == 0,
            "n{i} left links: {links}\n{}",
            agent.log()
        );
        let routes = ip_in(&lab.host(i), &["route", "show", "proto", "83"]);
        assert!(routes.trim().is_empty(), "n{i} left routes: {routes}");
    }
}

//! One IP per pod and service discovery, for real, in the netns lab: three agents in three host
//! namespaces, each leasing a block of the cluster CIDR, bridging its pods, routing to the
//! others' blocks, serving DNS on its bridge and load-balancing ClusterIPs with nftables.
//! A pod on n0 fetches pages from pods on n0, n1 and n2 by IP, resolves `web` (a ClusterIP
//! Service) and `web-headless` through its node's DNS and fetches through the ClusterIP (busybox
//! nslookup and nc: static busybox's wget segfaults in a container without NSS modules, even
//! for an IP), sees its own IP through the downward API and /etc/hosts. kubectl (inside n0's
//! namespace) shows the Endpoints and EndpointSlices; deleting a pod removes it from them and
//! from every node's DNS answers, and removes its veth; stopping the agents (`--cleanup`)
//! leaves no bridge, veth, route or nftables table behind.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use shoal_agent::testkit::{AgentProcess, wait_until};
use shoal_chaos::lab::NetLab;

const LIMIT: Duration = Duration::from_secs(60);

fn server(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [{
               "name": "web", "image": "shoal.local/busybox:1",
               "ports": [{"name": "http", "containerPort": 8080}],
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

/// `ip netns exec <ns> <program> <args>`: stdout, or the failure.
fn exec_in(ns: &str, program: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The addresses busybox nslookup printed for the name (after the server's own lines).
fn resolved(output: &str) -> BTreeSet<String> {
    output
        .split("Name:")
        .skip(1)
        .flat_map(|answer| {
            answer
                .lines()
                .filter_map(|l| l.trim().strip_prefix("Address:"))
                .map(|a| a.trim().split(' ').next().unwrap_or("").to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
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
            "--api",
            "0.0.0.0:6443",
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

    for service in [
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
               "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-headless", "namespace": "default"},
               "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 8080}]}}),
    ] {
        assert_eq!(agents[1].apply(&service).await.unwrap().0, 201);
    }
    let cluster_ip = || async {
        agents[0]
            .object("services", "default", "web")
            .await
            .ok()
            .flatten()
            .and_then(|s| s["spec"]["clusterIP"].as_str().map(str::to_owned))
    };
    wait_until("a ClusterIP for web", LIMIT, || async {
        cluster_ip().await.is_some()
    })
    .await
    .unwrap();
    let cluster_ip = cluster_ip().await.unwrap();
    assert!(cluster_ip.starts_with("10.96."), "{cluster_ip}");
    let all_ips: BTreeSet<String> = ips.values().map(|ip| ip.to_string()).collect();
    // Every node's DNS server (on its bridge, reached from n0 through the pod routes) answers.
    for i in 0..3 {
        let server = blocks[&i].hosts().next().unwrap().to_string();
        wait_until("DNS answers on every node", LIMIT, || async {
            let svc = exec_in(
                &lab.host(0),
                "busybox",
                &["nslookup", "web.default.svc.cluster.local", &server],
            );
            let headless = exec_in(
                &lab.host(0),
                "busybox",
                &[
                    "nslookup",
                    "web-headless.default.svc.cluster.local",
                    &server,
                ],
            );
            svc.is_ok_and(|o| resolved(&o) == BTreeSet::from([cluster_ip.clone()]))
                && headless.is_ok_and(|o| resolved(&o) == all_ips)
        })
        .await
        .unwrap();
    }
    let missing = exec_in(
        &lab.host(0),
        "busybox",
        &[
            "nslookup",
            "nope.default.svc.cluster.local",
            &blocks[&0].hosts().next().unwrap().to_string(),
        ],
    );
    assert!(
        missing.as_ref().is_err_and(|e| e.contains("NXDOMAIN")),
        "{missing:?}"
    );

    // kubectl, inside n0's namespace, sees the derived Endpoints and EndpointSlices.
    let kubeconfig = _root.path().join("n0.kubeconfig");
    let out = std::process::Command::new(shoal_chaos::shoal_binary().unwrap())
        .args(["kubeconfig", "--data-dir"])
        .arg(agents[0].data_dir())
        .output()
        .unwrap();
    std::fs::write(&kubeconfig, &out.stdout).unwrap();
    let kubectl = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", kubeconfig.to_str().unwrap(), "--cache-dir"];
        let cache = _root.path().join("kube-cache");
        all.push(cache.to_str().unwrap());
        all.extend_from_slice(args);
        let all: Vec<String> = all.iter().map(|s| s.to_string()).collect();
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        exec_in(&lab.host(0), "kubectl", &refs)
    };
    let endpoint_ips = |json: &str| -> BTreeSet<String> {
        let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
        v["subsets"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["addresses"].as_array().cloned().unwrap_or_default())
            .filter_map(|a| a["ip"].as_str().map(str::to_owned))
            .collect()
    };
    let ep = kubectl(&["get", "endpoints", "web", "-o", "json"]).unwrap();
    assert_eq!(endpoint_ips(&ep), all_ips, "{ep}");
    assert!(
        ep.contains("\"port\": 8080"),
        "the named port resolved: {ep}"
    );
    let slices = kubectl(&[
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=web",
        "-o",
        "json",
    ])
    .unwrap();
    let slices: Value = serde_json::from_str(&slices).unwrap();
    assert_eq!(
        slices["items"][0]["endpoints"].as_array().map(Vec::len),
        Some(3),
        "{slices}"
    );

    let targets: Vec<String> = ips.values().map(|ip| ip.to_string()).collect();
    let script = format!(
        "echo POD_IP=$POD_IP; cat /etc/hosts; cat /etc/resolv.conf; \
         for ip in {}; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 $ip 8080 | grep hello || echo FAILED $ip; done; \
         nslookup web.default.svc.cluster.local; \
         for i in 1 2 3 4 5 6 7 8 9 10 11 12; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {cluster_ip} 80 | grep hello || echo FAILED cluster IP; done",
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
    eprintln!("client log:\n{log}");
    for i in 0..3 {
        assert!(log.contains(&format!("hello from srv-{i}")), "{log}");
    }
    assert!(!log.contains("FAILED"), "{log}");
    assert!(log.contains(&format!("POD_IP={client_ip}")), "{log}");
    assert!(log.contains(&format!("{client_ip}\tclient")), "{log}");
    assert!(
        log.contains(&format!(
            "nameserver {}",
            blocks[&0].hosts().next().unwrap()
        )) && log.contains("search default.svc.cluster.local svc.cluster.local cluster.local")
            && log.contains("options ndots:5"),
        "{log}"
    );
    assert!(
        log.contains(&format!("Address: {cluster_ip}")),
        "the pod resolves the Service: {log}"
    );
    // Twelve connections through the ClusterIP, spread over the three pods behind it.
    let via_cluster_ip: BTreeSet<&str> = log
        .lines()
        .skip_while(|l| !l.contains("Address: 10.96."))
        .filter_map(|l| l.split("hello from ").nth(1))
        .collect();
    assert!(
        via_cluster_ip.len() >= 2,
        "balanced over several pods: {log}"
    );

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
    // It leaves the Endpoints and every node's DNS answers.
    let left: BTreeSet<String> = [&ips[&0], &ips[&2]]
        .iter()
        .map(|ip| ip.to_string())
        .collect();
    wait_until("srv-1 gone from the Endpoints", LIMIT, || async {
        kubectl(&["get", "endpoints", "web", "-o", "json"])
            .is_ok_and(|ep| endpoint_ips(&ep) == left)
    })
    .await
    .unwrap();
    for i in [0, 2] {
        let server = blocks[&i].hosts().next().unwrap().to_string();
        wait_until("srv-1 gone from DNS", LIMIT, || async {
            exec_in(
                &lab.host(0),
                "busybox",
                &[
                    "nslookup",
                    "web-headless.default.svc.cluster.local",
                    &server,
                ],
            )
            .is_ok_and(|o| resolved(&o) == left)
        })
        .await
        .unwrap();
    }

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
        let tables = exec_in(&lab.host(i), "nft", &["list", "tables"]).unwrap();
        assert!(!tables.contains("shoal"), "n{i} left nftables: {tables}");
    }
}

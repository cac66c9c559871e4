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
use shoal_chaos::lab::NetLab;
use shoal_chaos::testkit::{AgentProcess, wait_until};

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

/// Runs `f` on a thread inside the network namespace at `path` (what it opens stays there).
fn in_netns<T: Send + 'static>(path: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = path.to_owned();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// A UDP socket on `port` inside `pod`'s network namespace (`/run/netns/shoal-<scope>-<uid>`),
/// waiting at most 200 ms per datagram.
fn udp_server_in(pod: &Value, port: u16) -> std::net::UdpSocket {
    let uid = pod["metadata"]["uid"].as_str().expect("a pod with a uid");
    let netns = std::fs::read_dir("/run/netns")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(&format!("-{uid}")))
        })
        .unwrap_or_else(|| panic!("no network namespace for pod {uid}"));
    in_netns(netns.to_str().unwrap(), move || {
        let s = std::net::UdpSocket::bind(("0.0.0.0", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        s
    })
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

/// kubectl inside a lab host's namespace, against agent `agent`'s API (kubeconfig and
/// discovery cache under `dir`).
struct NsKubectl {
    ns: String,
    /// `--kubeconfig … --cache-dir …`.
    base: Vec<String>,
}

impl NsKubectl {
    fn new(lab: &NetLab, host: usize, agent: &AgentProcess, dir: &std::path::Path) -> Self {
        let kubeconfig = dir.join(format!("{}.kubeconfig", agent.name()));
        let out = std::process::Command::new(shoal_chaos::shoal_binary().unwrap())
            .args(["kubeconfig", "--data-dir"])
            .arg(agent.data_dir())
            .output()
            .unwrap();
        std::fs::write(&kubeconfig, &out.stdout).unwrap();
        let cache = dir.join("kube-cache");
        let base = [
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec();
        Self {
            ns: lab.host(host),
            base,
        }
    }

    /// kubectl's stdout, or the failure.
    fn run(&self, args: &[&str]) -> Result<String, String> {
        let mut all: Vec<&str> = self.base.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        exec_in(&self.ns, "kubectl", &all)
    }

    /// kubectl started in the background, its stdout to `out`.
    fn spawn(&self, args: &[&str], out: std::fs::File) -> std::process::Child {
        std::process::Command::new("ip")
            .args(["netns", "exec", &self.ns, "kubectl"])
            .args(&self.base)
            .args(args)
            .stdout(out)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }
}

/// Three agents in a 3-host netns lab with the bridge pod network, `--cleanup`, and `extra`
/// flags, busybox imported on each.
async fn service_lab(extra: &[&str]) -> (NetLab, tempfile::TempDir, Vec<AgentProcess>) {
    let lab = NetLab::new(3).expect("creating the netns lab (needs root and iproute2)");
    let mut flags = vec![
        "--pod-network",
        "bridge",
        "--anti-entropy-interval",
        "200ms",
        "--cleanup",
    ];
    flags.extend_from_slice(extra);
    let (root, agents) = shoal_chaos::start_cluster(&lab, 3, &flags).await.unwrap();
    for agent in &agents {
        shoal_chaos::import_busybox(agent).unwrap();
    }
    (lab, root, agents)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_pods_on_other_nodes_by_ip_and_nothing_is_left() {
    let (lab, _root, mut agents) = service_lab(&[
        "--api",
        "0.0.0.0:6443",
        // For the hostNetwork client.
        "--allow-privileged",
    ])
    .await;
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
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-sticky", "namespace": "default"},
               "spec": {"sessionAffinity": "ClientIP", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "client-self", "namespace": "default"},
               "spec": {"selector": {"app": "client"}, "ports": [{"port": 8081}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-np", "namespace": "default"},
               "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}),
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

    // NodePort: a node port on every node's address leads to the pods, from outside the pod
    // network (n0's host namespace to n1's and n2's addresses).
    let node_port = || async {
        agents[0]
            .object("services", "default", "web-np")
            .await
            .ok()
            .flatten()
            .and_then(|s| s["spec"]["ports"][0]["nodePort"].as_u64())
    };
    wait_until("a node port for web-np", LIMIT, || async {
        node_port().await.is_some()
    })
    .await
    .unwrap();
    let node_port = node_port().await.unwrap();
    assert!((30000..=32767).contains(&node_port), "{node_port}");
    for i in [1, 2] {
        let target = lab.address(i).to_string();
        // Eight connections in a row all answered: the ones sent on to pods of other nodes too.
        wait_until("the node port answers", LIMIT, || async {
            (0..8).all(|_| {
                exec_in(
                    &lab.host(0),
                    "sh",
                    &["-c", &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 5 {target} {node_port}")],
                )
                .is_ok_and(|o| o.contains("hello from srv-"))
            })
        })
        .await
        .unwrap();
    }

    // A failing readiness probe takes a pod out of every node's answers (it keeps running).
    let flaky = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "flaky", "namespace": "default", "labels": {"app": "flaky"}},
        "spec": {"nodeName": "n2", "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": "shoal.local/busybox:1",
            "command": ["sh", "-c", "touch /tmp/ready; sleep 10; rm /tmp/ready; exec sleep 3600"],
            "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1, "failureThreshold": 1}}]}});
    assert_eq!(agents[2].apply(&flaky).await.unwrap().0, 201);
    let flaky_svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "flaky", "namespace": "default"},
        "spec": {"clusterIP": "None", "selector": {"app": "flaky"}, "ports": [{"port": 80}]}});
    assert_eq!(agents[2].apply(&flaky_svc).await.unwrap().0, 201);
    let flaky_answers = |server: String| {
        let host = lab.host(0);
        async move {
            exec_in(
                &host,
                "busybox",
                &["nslookup", "flaky.default.svc.cluster.local", &server],
            )
            .map(|o| resolved(&o))
            .unwrap_or_default()
        }
    };
    let servers: Vec<String> = (0..3)
        .map(|i| blocks[&i].hosts().next().unwrap().to_string())
        .collect();
    wait_until("the ready pod in every node's answer", LIMIT, || async {
        let ip = pod(&agents[0], "flaky").await["status"]["podIP"]
            .as_str()
            .map(str::to_owned);
        let mut all = true;
        for server in &servers {
            all &= ip.is_some()
                && flaky_answers(server.clone()).await == BTreeSet::from([ip.clone().unwrap()]);
        }
        all
    })
    .await
    .unwrap();
    wait_until(
        "the unready pod out of every node's answer",
        LIMIT,
        || async {
            let mut all = true;
            for server in &servers {
                all &= flaky_answers(server.clone()).await.is_empty();
            }
            all
        },
    )
    .await
    .unwrap();
    assert_eq!(pod(&agents[0], "flaky").await["status"]["phase"], "Running");

    // kubectl, inside n0's namespace, sees the derived Endpoints and EndpointSlices.
    let ns_kubectl = NsKubectl::new(&lab, 0, &agents[0], _root.path());
    let kubectl = |args: &[&str]| ns_kubectl.run(args);
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
         for i in 1 2 3 4 5 6 7 8 9 10 11 12; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {cluster_ip} 80 | grep hello || echo FAILED cluster IP; done; \
         sticky=$(nslookup web-sticky.default.svc.cluster.local | awk '/^Address: /{{print $2}}' | tail -n 1); \
         for i in 1 2 3 4 5 6; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 $sticky 80 | grep hello | sed 's/^/STICKY /'; done; \
         self=$(nslookup client-self.default.svc.cluster.local | awk '/^Address: /{{print $2}}' | tail -n 1); \
         for i in $(seq 1 40); do out=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 $self 8081 | grep hello) && break; sleep 0.5; done; echo \"SELF $out\"",
        targets.join(" ")
    );
    let client = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client", "namespace": "default", "labels": {"app": "client"}},
        "spec": {"nodeName": "n0", "restartPolicy": "Never", "containers": [{
            "name": "own-web", "image": "shoal.local/busybox:1",
            "command": ["sh", "-c", "mkdir -p /c && echo hello from client > /c/index.html && exec httpd -f -p 8081 -h /c"]}, {
            "name": "c", "image": "shoal.local/busybox:1",
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "command": ["sh", "-c", script]}]}});
    assert_eq!(agents[0].apply(&client).await.unwrap().0, 201);
    wait_until("the client done", LIMIT, || async {
        // Its other container serves on: done when this one has exited 0.
        pod(&agents[0], "client").await["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["name"] == "c" && c["state"]["terminated"]["exitCode"] == 0)
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
    let sticky: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("STICKY hello from ").nth(1))
        .collect();
    let sticky_pods: BTreeSet<&str> = sticky.iter().copied().collect();
    assert!(
        sticky.len() == 6 && sticky_pods.len() == 1,
        "sessionAffinity ClientIP keeps one pod: {log}"
    );
    assert!(
        log.contains("SELF hello from client"),
        "a pod reaches itself through its own Service (hairpin): {log}"
    );

    // A pod in the node's network namespace asking for the cluster's DNS
    // (ClusterFirstWithHostNet) gets the node's own server, on its bridge's gateway; under
    // ClusterFirst it would get the node's resolv.conf, as with the kubelet.
    let host_client = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "host-client", "namespace": "default"},
        "spec": {"nodeName": "n1", "restartPolicy": "Never", "hostNetwork": true,
                 "dnsPolicy": "ClusterFirstWithHostNet", "containers": [{
            "name": "c", "image": "shoal.local/busybox:1",
            "command": ["sh", "-c", "cat /etc/resolv.conf; nslookup web.default.svc.cluster.local"]}]}});
    assert_eq!(agents[0].apply(&host_client).await.unwrap().0, 201);
    let done = wait_until("the hostNetwork client done", LIMIT, || async {
        pod(&agents[0], "host-client").await["status"]["containerStatuses"][0]["state"]
            ["terminated"]
            .is_object()
    })
    .await;
    if let Err(e) = done {
        panic!("{e}: {}", pod(&agents[0], "host-client").await);
    }
    let host_uid = pod(&agents[0], "host-client").await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let host_log = log_of(&agents[1], &host_uid, "c");
    assert!(
        host_log.contains(&format!(
            "nameserver {}",
            blocks[&1].hosts().next().unwrap()
        )) && host_log.contains("options ndots:5")
            && host_log.contains(&format!("Address: {cluster_ip}")),
        "a hostNetwork pod resolves the Service through its node's DNS: {host_log}"
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
            "/v1/objects/pods/srv-1?namespace=default&gracePeriodSeconds=0",
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

    // hostPort (issue #37): a pod's port on its node's address, as CNI's portmap serves it,
    // reached from n0's host namespace; a second pod asking for the same port on that node
    // finds no node and says why, as kube-scheduler's NodePorts filter does; a hostIP that is
    // the node's address is served too, and one that is 127.0.0.1 to the node itself.
    let host_port_pod = |name: &str, node: &str, host_ip: Option<String>| {
        let mut port = json!({"name": "http", "containerPort": 8080, "hostPort": 8090});
        let mut udp =
            json!({"name": "echo", "containerPort": 9000, "hostPort": 9000, "protocol": "UDP"});
        if let Some(ip) = host_ip {
            port["hostIP"] = json!(ip);
            udp["hostIP"] = json!(ip);
        }
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default"},
               "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                        "terminationGracePeriodSeconds": 1, "containers": [{
                   "name": "web", "image": "shoal.local/busybox:1", "ports": [port, udp],
                   "command": ["sh", "-c", format!("mkdir -p /w && echo hello from {name} > /w/index.html && exec httpd -f -p 8080 -h /w")]}]}})
    };
    for (name, node, host_ip) in [
        ("hp-1", "n1", None),
        ("hp-3", "n2", Some(lab.address(2).to_string())),
        // On the node's loopback only: no clash with hp-3's address.
        ("hp-4", "n2", Some("127.0.0.1".to_owned())),
    ] {
        let (code, body) = agents[0]
            .apply(&host_port_pod(name, node, host_ip))
            .await
            .unwrap();
        assert_eq!(code, 201, "{body}");
    }
    for (name, from, target) in [
        ("hp-1", 0, lab.address(1).to_string()),
        ("hp-3", 0, lab.address(2).to_string()),
        ("hp-4", 2, "127.0.0.1".to_owned()),
    ] {
        wait_until("the host port answers", LIMIT, || async {
            exec_in(
                &lab.host(from),
                "sh",
                &[
                    "-c",
                    &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 5 {target} 8090"),
                ],
            )
            .is_ok_and(|o| o.contains(&format!("hello from {name}")))
        })
        .await
        .unwrap();
    }
    let (code, body) = agents[0]
        .apply(&host_port_pod("hp-2", "n1", None))
        .await
        .unwrap();
    assert_eq!(code, 201, "{body}");
    let mut last = String::new();
    wait_until("the second pod pending for its host port", LIMIT, || {
        last = kubectl(&[
            "get",
            "pod",
            "hp-2",
            "-o",
            "jsonpath={.spec.nodeName}|{.status.conditions[0].message}",
        ])
        .unwrap_or_else(|e| e);
        let ok = last
            == "|0/3 nodes are available: 1 node(s) didn't have free ports for the requested pod ports, 2 node(s) didn't match Pod's node affinity/selector.";
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {last}"));

    // UDP through the host port (busybox has no UDP server: the test listens on port 9000
    // inside the pod's network namespace). A client on n0 that keeps sending from one source
    // port reaches hp-1; once hp-1 is deleted, hp-2 takes the port on n1 and the same client
    // reaches it, because n1's agent forgets the client's flow when its rules change — the
    // flow to hp-1, then the one the node answered itself while no pod held the port. Without
    // that, conntrack kept the flow where it first led for as long as the client kept sending
    // (hp-2 gets another address: addresses are not reused at once).
    let client = in_netns(&format!("/run/netns/{}", lab.host(0)), || {
        std::net::UdpSocket::bind(("0.0.0.0", 0)).unwrap()
    });
    let to_n1 = (lab.address(1), 9000);
    let heard = |server: &std::net::UdpSocket| {
        let _ = client.send_to(b"ping", to_n1);
        let mut buf = [0u8; 8];
        server.recv(&mut buf).is_ok_and(|n| &buf[..n] == b"ping")
    };
    let hp_1 = pod(&agents[0], "hp-1").await;
    let on_1 = udp_server_in(&hp_1, 9000);
    wait_until("hp-1 hears the client over UDP", LIMIT, || {
        let ok = heard(&on_1);
        async move { ok }
    })
    .await
    .unwrap();
    kubectl(&["delete", "pod", "hp-1", "--wait=false"]).unwrap();
    wait_until("hp-2 running on n1", LIMIT, || {
        // The client keeps sending meanwhile.
        let _ = client.send_to(b"ping", to_n1);
        async {
            let p = pod(&agents[0], "hp-2").await;
            p["status"]["phase"] == "Running" && p["status"]["podIP"].is_string()
        }
    })
    .await
    .unwrap();
    let hp_2 = pod(&agents[0], "hp-2").await;
    assert_ne!(
        hp_2["status"]["podIP"], hp_1["status"]["podIP"],
        "the check needs hp-2 at another address"
    );
    let on_2 = udp_server_in(&hp_2, 9000);
    wait_until("hp-2 hears the same client", LIMIT, || {
        let ok = heard(&on_2);
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agents[1].log()));
    // (They stay: stopping with --cleanup below removes them with the rest.)

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

/// The Kubernetes tutorial's path, with kubectl inside n0's namespace: `kubectl create
/// deployment` and `kubectl expose`, then a pod on n1 resolves the Service by its short name
/// (`web`, through the search path its resolv.conf gets) and fetches pages through the
/// ClusterIP with `kubectl exec`. Scaling the Deployment to 4 and then to 1 changes, on every
/// node, the headless Service's DNS answer and the DNAT rules of the nftables table; kubectl
/// watches on the Endpoints and the EndpointSlices see each change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exposed_deployment_is_found_by_its_short_name_and_scaling_reaches_every_node() {
    let (lab, root, mut agents) = service_lab(&["--api", "0.0.0.0:6443"]).await;
    let ns_kubectl = NsKubectl::new(&lab, 0, &agents[0], root.path());
    let kubectl = |args: &[&str]| ns_kubectl.run(args);
    let ok = |args: &[&str]| kubectl(args).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));

    ok(&[
        "create",
        "deployment",
        "web",
        "--image=shoal.local/busybox:1",
        "--replicas=2",
        "--port=8080",
        "--",
        "sh",
        "-c",
        "mkdir -p /w && echo hello from $(hostname) > /w/index.html && exec httpd -f -p 8080 -h /w",
    ]);
    ok(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
    ]);
    ok(&[
        "expose",
        "deployment",
        "web",
        "--name=web-headless",
        "--cluster-ip=None",
        "--port=8080",
    ]);
    if let Err(e) = kubectl(&["rollout", "status", "deployment/web", "--timeout=120s"]) {
        panic!(
            "rollout status: {e}\npods: {:?}\n{}",
            kubectl(&["get", "pods", "-o", "wide"]),
            agents
                .iter()
                .map(|a| format!("--- {} ---\n{}", a.name(), a.log()))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let svc: Value = serde_json::from_str(&ok(&["get", "svc", "web", "-o", "json"])).unwrap();
    let cluster_ip = svc["spec"]["clusterIP"].as_str().unwrap().to_owned();
    assert!(cluster_ip.starts_with("10.96."), "{svc}");
    assert_eq!(svc["spec"]["selector"], json!({"app": "web"}), "{svc}");

    // Watches on the Endpoints and the EndpointSlices, from now on (kubectl's own output).
    let watch = |args: &[&str], file: &str| {
        ns_kubectl.spawn(args, std::fs::File::create(root.path().join(file)).unwrap())
    };
    struct Killed(Vec<std::process::Child>);
    impl Drop for Killed {
        fn drop(&mut self) {
            for child in &mut self.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let mut watches = Killed(vec![
        watch(
            &[
                "get",
                "endpoints",
                "web",
                "--watch",
                "-o",
                "jsonpath={.subsets[*].addresses[*].ip}{\"\\n\"}",
            ],
            "endpoints.watch",
        ),
        watch(
            &[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web",
                "--watch",
                "-o",
                // Ready endpoints only: the terminating ones stay listed (ready false) while
                // their pods stop, as in Kubernetes.
                "jsonpath={.endpoints[?(@.conditions.ready==true)].addresses[0]}{\"\\n\"}",
            ],
            "slices.watch",
        ),
    ]);

    // Each node's DNS (on its bridge) and nftables table follow the scaling.
    let servers: Vec<String> = (0..3)
        .map(|i| {
            let node = &agents[i];
            // The agent's bridge (`shoal…`) carries its DNS server.
            ip_in(&lab.host(i), &["-4", "-o", "addr", "show"])
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| f.len() > 3 && f[1].starts_with("shoal"))
                .and_then(|f| f[3].split('/').next().map(str::to_owned))
                .unwrap_or_else(|| panic!("no bridge address on {}", node.name()))
        })
        .collect();
    let ready_ips = || -> BTreeSet<String> {
        let pods: Value = serde_json::from_str(
            &kubectl(&["get", "pods", "-l", "app=web", "-o", "json"]).unwrap_or_default(),
        )
        .unwrap_or(Value::Null);
        pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_owned))
            .collect()
    };
    let node_views = || -> Vec<(BTreeSet<String>, BTreeSet<String>)> {
        servers
            .iter()
            .enumerate()
            .map(|(i, server)| {
                let dns = exec_in(
                    &lab.host(0),
                    "busybox",
                    &["nslookup", "web-headless.default.svc.cluster.local", server],
                )
                .map(|o| resolved(&o))
                .unwrap_or_default();
                let rules = exec_in(&lab.host(i), "nft", &["list", "ruleset"]).unwrap_or_default();
                let dnat: BTreeSet<String> = rules
                    .split("dnat to ")
                    .skip(1)
                    .filter_map(dnat_ip)
                    .collect();
                (dns, dnat)
            })
            .collect()
    };
    let every_node_serves = |want: &BTreeSet<String>| {
        node_views()
            .iter()
            .all(|(dns, dnat)| dns == want && dnat == want)
    };
    // Every node serves the two pods before the client tries them.
    let two = wait_until("every node serving the two pods", LIMIT, || {
        let want = ready_ips();
        let done = want.len() == 2 && every_node_serves(&want);
        async move { done }
    })
    .await;
    assert!(two.is_ok(), "each node's (DNS, DNAT): {:?}", node_views());

    // A client on n1 finds `web` by its short name and reaches the pods through it.
    let client = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "client", "namespace": "default"},
        "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": "shoal.local/busybox:1",
            "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}]}});
    assert_eq!(agents[0].apply(&client).await.unwrap().0, 201);
    ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=60s",
    ]);
    let fetch = "addr=$(nslookup web | awk '/^Address: /{print $2}' | tail -n 1); echo RESOLVED $addr; \
                 for i in 1 2 3 4 5 6 7 8; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 $addr 80 | grep hello || echo FAILED; done";
    let log = ok(&["exec", "client", "--", "sh", "-c", fetch]);
    assert!(
        log.contains(&format!("RESOLVED {cluster_ip}")),
        "the short name resolves to the ClusterIP: {log}"
    );
    assert!(!log.contains("FAILED"), "{log}");
    let answered: BTreeSet<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("hello from "))
        .collect();
    assert!(
        !answered.is_empty() && answered.iter().all(|h| h.starts_with("web-")),
        "{log}"
    );

    let mut sizes = Vec::new();
    for replicas in [4, 1] {
        ok(&[
            "scale",
            "deployment",
            "web",
            &format!("--replicas={replicas}"),
        ]);
        let mut want = BTreeSet::new();
        let reached = wait_until(
            "every node's DNS and nftables follow the scale",
            LIMIT,
            || {
                want = ready_ips();
                let done = want.len() == replicas && every_node_serves(&want);
                async move { done }
            },
        )
        .await;
        assert!(
            reached.is_ok(),
            "{replicas} replicas: ready {want:?}; each node's (DNS, DNAT): {:?}; servers {servers:?}; n0's DNS says: {:?}",
            node_views(),
            exec_in(
                &lab.host(0),
                "busybox",
                &[
                    "nslookup",
                    "web-headless.default.svc.cluster.local",
                    &servers[0]
                ],
            )
        );
        sizes.push(want);
    }
    // Both watches saw 2, then 4, then 1 addresses, in that order.
    std::thread::sleep(Duration::from_secs(1));
    for child in &mut watches.0 {
        let _ = child.kill();
        let _ = child.wait();
    }
    for file in ["endpoints.watch", "slices.watch"] {
        let text = std::fs::read_to_string(root.path().join(file)).unwrap();
        let counts: Vec<usize> = text.lines().map(|l| l.split_whitespace().count()).collect();
        let mut expected = [2usize, 4, 1].into_iter().peekable();
        for n in &counts {
            if expected.peek() == Some(n) {
                expected.next();
            }
        }
        assert!(
            expected.peek().is_none(),
            "{file} saw {counts:?}, not 2 then 4 then 1:\n{text}"
        );
        let last: BTreeSet<String> = text
            .lines()
            .last()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        assert_eq!(last, sizes[1], "{file}'s last event is the current set");
    }

    // A node stopping with --cleanup releases its block: the others no longer hold its lease.
    let n2_id = agents[2].client().self_info().await.unwrap().node_id;
    async fn holders(agent: &AgentProcess) -> Vec<String> {
        let (_, list) = agent
            .call(hyper::Method::GET, "/v1/objects/podcidrblocks", None)
            .await
            .unwrap();
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["spec"]["nodeID"].as_str().map(str::to_owned))
            .collect::<Vec<String>>()
    }
    assert!(holders(&agents[0]).await.contains(&n2_id));
    let status = agents[2].terminate().unwrap();
    assert!(status.success(), "{status}: {}", agents[2].log());
    // The release is acknowledged by a quorum that need not include n0: n0 may learn it a
    // moment later.
    let released = wait_until("n2's lease gone on n0", LIMIT, || async {
        let leases = holders(&agents[0]).await;
        !leases.contains(&n2_id) && leases.len() == 2
    })
    .await;
    assert!(
        released.is_ok(),
        "n2 ({n2_id}) left a lease: {:?}",
        holders(&agents[0]).await
    );
    for agent in &mut agents[..2] {
        let status = agent.terminate().unwrap();
        assert!(status.success(), "{status}: {}", agent.log());
    }
}

/// The IP of a DNAT rule to port 8080, from the text after `dnat to `.
fn dnat_ip(target: &str) -> Option<String> {
    let target = target.split_whitespace().next()?;
    target.strip_suffix(":8080").map(str::to_owned)
}

async fn pod_ip(agent: &AgentProcess, name: &str) -> Option<String> {
    pod(agent, name).await["status"]["podIP"]
        .as_str()
        .map(str::to_owned)
}

/// The pod CIDR blocks `agent`'s store says each node id holds.
async fn leases_at(agent: &AgentProcess) -> BTreeMap<String, Vec<ipnet::Ipv4Net>> {
    let (_, list) = agent
        .call(hyper::Method::GET, "/v1/objects/podcidrblocks", None)
        .await
        .unwrap();
    let mut by_node: BTreeMap<String, Vec<ipnet::Ipv4Net>> = BTreeMap::new();
    // Only winning leases: the first claim of each block.
    let mut first: BTreeMap<String, (String, String)> = BTreeMap::new();
    for o in list["items"].as_array().into_iter().flatten() {
        if let (Some(id), Some(cidr), Some(t)) = (
            o["spec"]["nodeID"].as_str(),
            o["spec"]["cidr"].as_str(),
            o["metadata"]["creationTimestamp"].as_str(),
        ) {
            let entry = first
                .entry(cidr.to_owned())
                .or_insert((t.to_owned(), id.to_owned()));
            if (t, id) < (entry.0.as_str(), entry.1.as_str()) {
                *entry = (t.to_owned(), id.to_owned());
            }
        }
    }
    for o in list["items"].as_array().into_iter().flatten() {
        if first
            .get(o["spec"]["cidr"].as_str().unwrap_or_default())
            .map(|w| w.1.as_str())
            != o["spec"]["nodeID"].as_str()
        {
            continue;
        }
        if let (Some(id), Some(cidr)) = (o["spec"]["nodeID"].as_str(), o["spec"]["cidr"].as_str()) {
            by_node
                .entry(id.to_owned())
                .or_default()
                .push(cidr.parse().unwrap());
        }
    }
    by_node
}

fn busybox_pod(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [{
               "name": "c", "image": "shoal.local/busybox:1",
               "command": ["sh", "-c", "while true; do sleep 0.2; done"]}]}})
}

/// Two nodes joining on the two sides of a partition lease the same block (the only free one)
/// and number a pod each from it: the same IP twice while apart. After the heal (a block freed
/// meanwhile by a node leaving with `--cleanup`), the CRDT keeps one lease, the other node
/// leases the freed block and renumbers its pod: every lease and every pod IP is unique again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_leased_on_both_sides_of_a_partition_are_made_unique_after_the_heal() {
    use shoal_chaos::testkit::{AgentSpec, wait_for_identical_digests};
    let mut lab = NetLab::new(5).expect("creating the netns lab (needs root and iproute2)");
    // Four blocks: three nodes leave exactly one free.
    let flags = [
        "--pod-network",
        "bridge",
        "--cluster-cidr",
        "10.88.0.0/22",
        "--node-cidr-size",
        "24",
        "--anti-entropy-interval",
        "200ms",
        "--restart-backoff",
        "1s",
        "--cleanup",
    ];
    let (root, mut agents) = shoal_chaos::start_cluster(&lab, 3, &flags).await.unwrap();
    // Every node knows all three leases before the cut (each side must see the one free block;
    // a node that joined a moment ago may not have pulled its peers' leases yet).
    wait_until("three leases on every node", LIMIT, || async {
        for agent in &agents {
            if leases_at(agent).await.len() != 3 {
                return false;
            }
        }
        true
    })
    .await
    .unwrap();
    lab.partition(&[&[0, 1, 3], &[2, 4]]).unwrap();
    wait_until("the sides apart", LIMIT, || async {
        shoal_chaos::testkit::state_of(&agents[0], "n2")
            .await
            .map(|s| s.0)
            == Some(shoal_gossip::MemberState::Dead)
            && shoal_chaos::testkit::state_of(&agents[2], "n0")
                .await
                .map(|s| s.0)
                == Some(shoal_gossip::MemberState::Dead)
    })
    .await
    .unwrap();
    // A node joins each side.
    let binary = shoal_chaos::shoal_binary().unwrap();
    for (host, seed) in [(3, 0), (4, 2)] {
        let mut spec = AgentSpec::new(
            &binary,
            root.path(),
            &format!("n{host}"),
            &root.path().join("secret"),
        )
        .bind(std::net::SocketAddr::new(lab.address(host), 7600))
        .netns(&lab.host(host))
        .join(std::net::SocketAddr::new(lab.address(seed), 7600));
        for f in flags {
            spec = spec.arg(f);
        }
        agents.push(AgentProcess::start(spec).await.unwrap());
    }
    let id = |a: &AgentProcess| {
        let a = a.client().clone();
        async move { a.self_info().await.unwrap().node_id }
    };
    let (id3, id4) = (id(&agents[3]).await, id(&agents[4]).await);
    // Each newcomer may first claim a block its store had not heard of yet (and lose it to the
    // older lease); both end on the only free block.
    let waited = wait_until("both newcomers on the free block", LIMIT, || async {
        let (l3, l4) = (leases_at(&agents[3]).await, leases_at(&agents[4]).await);
        l3.get(&id3).is_some_and(|b| b.len() == 1) && l3.get(&id3) == l4.get(&id4)
    })
    .await;
    if let Err(e) = waited {
        panic!(
            "{e}: n3 sees {:?}, n4 sees {:?}\nn3's log:\n{}\nn4's log:\n{}",
            leases_at(&agents[3]).await,
            leases_at(&agents[4]).await,
            agents[3].log(),
            agents[4].log()
        );
    }
    for (i, node) in [(3, "n3"), (4, "n4")] {
        shoal_chaos::import_busybox(&agents[i]).unwrap();
        let name = format!("p{i}");
        assert_eq!(
            agents[i].apply(&busybox_pod(&name, node)).await.unwrap().0,
            201
        );
    }
    wait_until("both pods with an IP", LIMIT, || async {
        pod_ip(&agents[3], "p3").await.is_some() && pod_ip(&agents[4], "p4").await.is_some()
    })
    .await
    .unwrap();
    assert_eq!(
        pod_ip(&agents[3], "p3").await,
        pod_ip(&agents[4], "p4").await,
        "one IP twice while partitioned"
    );

    // n1 leaves (its block is released), then the sides meet again.
    let status = agents[1].terminate().unwrap();
    assert!(status.success());
    lab.heal().unwrap();
    let live = [0usize, 2, 3, 4];
    let live_agents: Vec<&AgentProcess> = live.iter().map(|i| &agents[*i]).collect();
    wait_for_identical_digests(&live_agents, LIMIT)
        .await
        .unwrap();
    let node_ids: Vec<String> = {
        let mut ids = Vec::new();
        for i in live {
            ids.push(id(&agents[i]).await);
        }
        ids
    };
    wait_until(
        "unique leases and pod IPs",
        Duration::from_secs(90),
        || async {
            let leases = leases_at(&agents[0]).await;
            let held: Vec<&ipnet::Ipv4Net> = node_ids
                .iter()
                .filter_map(|id| leases.get(id).map(|b| &b[0]))
                .collect();
            let distinct: BTreeSet<_> = held.iter().collect();
            let (a, b) = (
                pod_ip(&agents[3], "p3").await,
                pod_ip(&agents[4], "p4").await,
            );
            let ip_in_own_block = |ip: &Option<String>, id: &str| {
                ip.as_ref()
                    .and_then(|ip| ip.parse::<std::net::Ipv4Addr>().ok())
                    .is_some_and(|ip| {
                        leases
                            .get(id)
                            .is_some_and(|b| b.len() == 1 && b[0].contains(&ip))
                    })
            };
            held.len() == 4
                && distinct.len() == 4
                && a.is_some()
                && a != b
                && ip_in_own_block(&a, &id3)
                && ip_in_own_block(&b, &id4)
        },
    )
    .await
    .unwrap();
    let renumbered = ["n3", "n4"].iter().any(|n| {
        agents[if *n == "n3" { 3 } else { 4 }]
            .log()
            .contains("renumbering the pod")
    });
    assert!(renumbered, "the loser renumbered its pod");
    for i in live {
        let _ = agents[i].terminate();
    }
}

const STATEFUL_SET: &str = r#"apiVersion: v1
kind: Service
metadata: {name: nginx, labels: {app: nginx}}
spec:
  clusterIP: None
  selector: {app: nginx}
  ports: [{port: 8080, name: web}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: nginx
  replicas: 3
  selector: {matchLabels: {app: nginx}}
  template:
    metadata: {labels: {app: nginx}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: shoal.local/busybox:1
        command: [sh, -c, 'mkdir -p /w && echo hello from $(hostname) > /w/index.html && exec httpd -f -p 8080 -h /w']
        ports: [{containerPort: 8080, name: web}]
        # Ready 2 s after it starts: long enough that a pod made before its predecessor was
        # ready shows in their times (OrderedReady is checked below).
        readinessProbe: {tcpSocket: {port: 8080}, initialDelaySeconds: 2, periodSeconds: 1}
"#;

/// Issue #39: a StatefulSet through kubectl in the netns lab. Its pods are made one at a time
/// in ordinal order (each only once the one before is Ready), are named `web-0..2` with their
/// own hostnames, and each is found by `web-k.nginx.default.svc.cluster.local` on every node's
/// DNS; `kubectl exec` reaches them by name. A new image rolls from the highest ordinal down;
/// `rollout history` lists the two revisions and `rollout undo` brings the first template back;
/// scaling down removes the highest ordinals first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateful_set_keeps_its_pods_names_order_and_dns_names() {
    let (lab, root, mut agents) = service_lab(&["--api", "0.0.0.0:6443"]).await;
    let ns_kubectl = NsKubectl::new(&lab, 0, &agents[0], root.path());
    let kubectl = |args: &[&str]| ns_kubectl.run(args);
    let ok = |args: &[&str]| kubectl(args).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));
    let file = root.path().join("web.yaml");
    std::fs::write(&file, STATEFUL_SET).unwrap();
    ok(&["apply", "-f", file.to_str().unwrap()]);
    if let Err(e) = kubectl(&["rollout", "status", "statefulset/web", "--timeout=120s"]) {
        panic!(
            "rollout status: {e}\npods: {:?}",
            kubectl(&["get", "pods", "-o", "wide"])
        );
    }
    let pods = || -> Vec<Value> {
        let list: Value = serde_json::from_str(
            &kubectl(&["get", "pods", "-l", "app=nginx", "-o", "json"]).unwrap_or_default(),
        )
        .unwrap_or(Value::Null);
        list["items"].as_array().cloned().unwrap_or_default()
    };
    let by_name = |name: &str| pods().into_iter().find(|p| p["metadata"]["name"] == name);
    let now = pods();
    let mut names: Vec<&str> = now
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["web-0", "web-1", "web-2"]);
    // OrderedReady: web-k+1 was made no earlier than web-k turned Ready (times to the second;
    // with a 2 s readiness delay, pods made together would be seconds apart the other way).
    let time = |v: &Value| humantime::parse_rfc3339(v.as_str().unwrap_or_default()).unwrap();
    for k in 0..2 {
        let this = by_name(&format!("web-{k}")).unwrap();
        let next = by_name(&format!("web-{}", k + 1)).unwrap();
        let ready_at = this["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .map(|c| time(&c["lastTransitionTime"]))
            .unwrap();
        let made = time(&next["metadata"]["creationTimestamp"]);
        assert!(
            made >= ready_at,
            "web-{} made at {made:?}, before web-{k} was ready at {ready_at:?}",
            k + 1
        );
        assert_eq!(
            this["metadata"]["annotations"]["shoal.io/partition-policy"], "fenced",
            "{this}"
        );
    }
    let sts: Value = serde_json::from_str(&ok(&["get", "sts", "web", "-o", "json"])).unwrap();
    assert_eq!(sts["status"]["readyReplicas"], 3, "{sts}");
    assert_eq!(
        sts["status"]["currentRevision"], sts["status"]["updateRevision"],
        "{sts}"
    );
    assert_eq!(ok(&["exec", "web-1", "--", "hostname"]).trim(), "web-1");

    // Each pod's own name on every node's DNS.
    let servers: Vec<String> = (0..3)
        .map(|i| {
            ip_in(&lab.host(i), &["-4", "-o", "addr", "show"])
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| f.len() > 3 && f[1].starts_with("shoal"))
                .and_then(|f| f[3].split('/').next().map(str::to_owned))
                .unwrap_or_else(|| panic!("no bridge address on n{i}"))
        })
        .collect();
    for k in 0..3 {
        let name = format!("web-{k}");
        let ip = by_name(&name).unwrap()["status"]["podIP"]
            .as_str()
            .unwrap()
            .to_owned();
        let fqdn = format!("{name}.nginx.default.svc.cluster.local");
        let mut answers = Vec::new();
        let found = wait_until("each node's DNS to know the pod's name", LIMIT, || {
            answers = servers
                .iter()
                .map(|server| {
                    exec_in(&lab.host(0), "busybox", &["nslookup", &fqdn, server])
                        .map(|o| resolved(&o))
                        .unwrap_or_default()
                })
                .collect();
            let done = answers.iter().all(|a| *a == BTreeSet::from([ip.clone()]));
            async move { done }
        })
        .await;
        assert!(found.is_ok(), "{fqdn} (pod IP {ip}): {answers:?}");
    }

    // A new template (an environment variable: the lab has only busybox): the pods are
    // replaced from web-2 down; two revisions; undo goes back.
    let has_version = |p: &Value| {
        p["spec"]["containers"][0]["env"]
            .as_array()
            .is_some_and(|env| env.iter().any(|e| e["name"] == "VERSION"))
    };
    let replaced_order = || -> Vec<String> {
        // The order the pods came back with the new template (their creation times).
        let mut made: Vec<(std::time::SystemTime, String)> = pods()
            .iter()
            .filter(|p| has_version(p))
            .map(|p| {
                (
                    time(&p["metadata"]["creationTimestamp"]),
                    p["metadata"]["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        made.sort();
        made.into_iter().map(|(_, n)| n).collect()
    };
    ok(&["set", "env", "statefulset/web", "VERSION=2"]);
    if let Err(e) = kubectl(&["rollout", "status", "statefulset/web", "--timeout=120s"]) {
        panic!(
            "rollout status: {e}\npods: {:?}",
            kubectl(&["get", "pods", "-o", "wide"])
        );
    }
    assert_eq!(replaced_order(), ["web-2", "web-1", "web-0"]);
    let history = ok(&["rollout", "history", "statefulset/web"]);
    let revisions: Vec<&str> = history
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(revisions, ["1", "2"], "{history}");
    ok(&["rollout", "undo", "statefulset/web"]);
    let back = wait_until("the first template back on every pod", LIMIT, || {
        let now = pods();
        let done = now.len() == 3
            && now
                .iter()
                .all(|p| !has_version(p) && p["metadata"]["deletionTimestamp"].is_null());
        async move { done }
    })
    .await;
    assert!(
        back.is_ok(),
        "{:?}",
        kubectl(&["get", "pods", "-o", "wide"])
    );
    let history = ok(&["rollout", "history", "statefulset/web"]);
    assert!(
        history.lines().any(|l| l.trim_start().starts_with('3')),
        "the first template is revision 3 now: {history}"
    );

    // Scaling down: the highest ordinal goes first, and web-1 only after web-2 is gone.
    ok(&["scale", "statefulset/web", "--replicas=1"]);
    let mut seen = Vec::new();
    let scaled = wait_until("one pod left", LIMIT, || {
        let names: BTreeSet<String> = pods()
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        seen.push(names.clone());
        let done = names == BTreeSet::from(["web-0".to_owned()]);
        async move { done }
    })
    .await;
    assert!(scaled.is_ok(), "{seen:?}");
    assert!(
        seen.iter()
            .all(|names| !names.contains("web-2") || names.contains("web-1")),
        "web-1 went before web-2: {seen:?}"
    );
    for agent in &mut agents {
        let _ = agent.terminate();
    }
}

/// What each in-cluster client pod runs: the official Python client's in-cluster
/// configuration (the mounted token and CA, `KUBERNETES_SERVICE_HOST`), a list its Role
/// allows and a create it does not.
const IN_CLUSTER: &str = r#"
import os
from kubernetes import client, config
print("HOST", os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
config.load_incluster_config()
v1 = client.CoreV1Api()
pods = v1.list_namespaced_pod("default")
print("LISTED", len(pods.items))
try:
    v1.create_namespaced_secret("default", client.V1Secret(metadata=client.V1ObjectMeta(name="stolen")))
    print("CREATED")
except client.ApiException as e:
    print("REFUSED", e.status)
"#;

/// Issue #40: software in the cluster uses the API as on Kubernetes. A pod on each node runs
/// the official Python client with `load_incluster_config()`: it reaches the API through the
/// `kubernetes` Service (its ClusterIP load-balanced to the agents' API servers), verifies the
/// serving certificate with the projected `ca.crt`, authenticates with its ServiceAccount's
/// projected token, may list pods (its Role) and may not create a Secret (403).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_every_node_use_the_api_with_their_service_account() {
    let images = shoal_chaos::test_images().unwrap();
    let archive = images.join("python-kube-1.oci.tar");
    let built = std::process::Command::new("bash")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/images/build.sh"))
        .arg(&images)
        .env("PYTHON_KUBE", "1")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        built.success() && archive.exists(),
        "building the python-kube image"
    );
    let (lab, root, agents) = service_lab(&["--api", "0.0.0.0:6443"]).await;
    for agent in &agents {
        shoal_chaos::import_image(agent, &archive).unwrap();
    }
    let ns_kubectl = NsKubectl::new(&lab, 0, &agents[0], root.path());
    let kubectl = |args: &[&str]| ns_kubectl.run(args);
    let mut manifest = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "lister", "namespace": "default"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "pod-lister", "namespace": "default"},
               "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "lister-lists", "namespace": "default"},
               "subjects": [{"kind": "ServiceAccount", "name": "lister", "namespace": "default"}],
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-lister"}}),
    ];
    for agent in &agents {
        manifest.push(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("client-{}", agent.name()), "namespace": "default"},
            "spec": {"nodeName": agent.name(), "serviceAccountName": "lister", "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "shoal.local/python-kube:1",
                    "command": ["python3", "-c", IN_CLUSTER]}]}}));
    }
    let file = root.path().join("in-cluster.json");
    // (A JSON stream: kubectl validates a `v1 List` against OpenAPI v2, which is not served.)
    let stream: Vec<String> = manifest.iter().map(Value::to_string).collect();
    std::fs::write(&file, stream.join("\n")).unwrap();
    kubectl(&["apply", "-f", file.to_str().unwrap()]).unwrap();
    let svc = kubectl(&[
        "get",
        "svc",
        "kubernetes",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
    .unwrap();
    assert_eq!(svc.trim(), "10.96.0.1");
    for agent in &agents {
        let name = format!("client-{}", agent.name());
        let done = wait_until(
            &format!("{name} ends"),
            Duration::from_secs(120),
            || async {
                let phase = pod(&agents[0], &name).await["status"]["phase"].clone();
                phase == "Succeeded" || phase == "Failed"
            },
        )
        .await;
        let logs = kubectl(&["logs", &name]).unwrap_or_else(|e| e);
        let status = pod(&agents[0], &name).await["status"].clone();
        assert!(done.is_ok(), "{name}: {status}\n{logs}");
        assert!(
            logs.contains("HOST 10.96.0.1 443")
                && logs.contains("LISTED")
                && logs.contains("REFUSED 403"),
            "{name}: {status}\n{logs}"
        );
        assert_eq!(status["phase"], "Succeeded", "{name}: {logs}");
    }
    // The Endpoints of `kubernetes` are the agents' API servers.
    let endpoints = kubectl(&["get", "endpoints", "kubernetes", "-o", "json"]).unwrap();
    let endpoints: Value = serde_json::from_str(&endpoints).unwrap();
    let addresses = endpoints["subsets"][0]["addresses"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(addresses, 3, "{endpoints}");
    assert_eq!(
        endpoints["subsets"][0]["ports"][0]["port"], 6443,
        "{endpoints}"
    );
}

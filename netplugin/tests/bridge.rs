//! The bridge network for real, as root: a "node" namespace this test creates holds the bridge;
//! two pod namespaces get veths and addresses and talk TCP to each other through it; teardown
//! and cleanup leave no link behind. Every namespace is removed at the end, also on failure.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;

use shoal_net::linux::{BridgeNetwork, Route};
use shoal_net::{PodNetworkPlugin, PodRef, netns};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Removes the namespaces on drop.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = netns::delete(name);
        }
    }
}

/// Runs `f` on a thread inside namespace `path`.
fn inside<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(path).unwrap();
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

fn links(path: &Path) -> Vec<String> {
    // /sys/class/net shows the namespace sysfs was mounted in, not the thread's: ask iproute2.
    inside(path, || {
        let out = std::process::Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap().to_owned())
            .collect()
    })
}

#[test]
fn pods_on_one_bridge_reach_each_other_and_nothing_is_left() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let tag = format!("snt{}", std::process::id() % 100_000);
    let names = Namespaces(vec![
        format!("{tag}-node"),
        format!("{tag}-a"),
        format!("{tag}-b"),
    ]);
    let node = netns::create(&names.0[0]).unwrap();
    let pod_a = PodRef {
        uid: "pod-a".into(),
        netns: netns::create(&names.0[1]).unwrap(),
    };
    let pod_b = PodRef {
        uid: "pod-b".into(),
        netns: netns::create(&names.0[2]).unwrap(),
    };
    let net = BridgeNetwork::new(&tag, None);
    let block = "10.250.1.0/24".parse().unwrap();
    let (a, b) = inside(&node, || {
        assert!(
            net.set_block(block, &[("old".into(), "10.250.9.9".parse().unwrap())])
                .unwrap()
                == vec!["old".to_owned()],
            "a record outside the block is returned for renumbering"
        );
        let a = net.setup(&pod_a).unwrap().unwrap();
        let b = net.setup(&pod_b).unwrap().unwrap();
        assert_eq!(net.setup(&pod_a).unwrap().unwrap().ip, a.ip, "idempotent");
        (a, b)
    });
    assert_eq!(a.gateway, "10.250.1.1".parse::<Ipv4Addr>().unwrap());
    assert_ne!(a.ip, b.ip);
    assert!(links(&pod_a.netns).contains(&"eth0".to_owned()));

    // TCP from pod b to pod a through the bridge.
    let listener = inside(&pod_a.netns, || TcpListener::bind((a.ip, 8080)).unwrap());
    let server = std::thread::spawn(move || {
        let (mut conn, peer) = listener.accept().unwrap();
        conn.write_all(b"hello from a").unwrap();
        peer
    });
    let reply = inside(&pod_b.netns, || {
        let mut conn = TcpStream::connect_timeout(
            &SocketAddr::from((a.ip, 8080)),
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        let mut reply = String::new();
        conn.read_to_string(&mut reply).unwrap();
        reply
    });
    assert_eq!(reply, "hello from a");
    assert_eq!(server.join().unwrap().ip(), std::net::IpAddr::V4(b.ip));

    // Routes: only Shoal's, exactly as asked.
    inside(&node, || {
        let via: Ipv4Addr = "10.250.1.77".parse().unwrap();
        net.sync_routes(&[Route {
            block: "10.250.2.0/24".parse().unwrap(),
            via,
        }])
        .unwrap();
        let show = |_: ()| {
            String::from_utf8(
                std::process::Command::new("ip")
                    .args(["route", "show", "proto", "83"])
                    .output()
                    .unwrap()
                    .stdout,
            )
            .unwrap()
        };
        assert!(
            show(()).contains("10.250.2.0/24 via 10.250.1.77"),
            "{}",
            show(())
        );
        net.sync_routes(&[]).unwrap();
        assert_eq!(show(()).trim(), "");
    });

    // The service ruleset loads for real (nft -f) and replaces itself atomically.
    inside(&node, || {
        use shoal_net::nft;
        let ports = vec![
            nft::ServicePort {
                cluster_ip: "10.96.0.20".parse().unwrap(),
                port: 80,
                protocol: "tcp".into(),
                endpoints: vec![(a.ip, 8080), (b.ip, 8080)],
                node_port: Some(30080),
                affinity_seconds: Some(60),
            },
            nft::ServicePort {
                cluster_ip: "10.96.0.21".parse().unwrap(),
                port: 53,
                protocol: "udp".into(),
                endpoints: vec![],
                node_port: None,
                affinity_seconds: None,
            },
        ];
        let table = nft::table_name(&tag);
        let cluster = "10.250.0.0/16".parse().unwrap();
        // A host port of pod a, on every address and on one.
        let host_ports = [
            nft::HostPortRule {
                host_ip: None,
                port: 8080,
                protocol: "tcp".into(),
                pod_ip: a.ip,
                container_port: 80,
            },
            nft::HostPortRule {
                host_ip: Some("192.0.2.10".parse().unwrap()),
                port: 5353,
                protocol: "udp".into(),
                pod_ip: a.ip,
                container_port: 53,
            },
        ];
        let rebuild = |ports: &[nft::ServicePort]| {
            nft::apply(&nft::ruleset(
                &table,
                cluster,
                ports,
                &host_ports,
                &nft::loaded(&table),
            ))
            .unwrap()
        };
        rebuild(&ports);
        rebuild(&ports);
        // A client pinned by ClientIP affinity (here added as the kernel's `update` would)
        // while a rebuild is being made, after the table was read, keeps its endpoint with the
        // time it had left through that rebuild, which drops the other endpoint and its set.
        // (Copying the pinned clients into a new table, as before, lost this one.)
        let client = "10.250.9.9";
        let set_a = nft::affinity_set(&ports[0], (a.ip, 8080), 60);
        let set_b = nft::affinity_set(&ports[0], (b.ip, 8080), 60);
        let run = |script: &str| {
            let out = std::process::Command::new("nft")
                .args(script.split(' '))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let read = nft::loaded(&table);
        run(&format!(
            "add element ip {table} {set_b} {{ {client} timeout 60s expires 50s }}"
        ));
        let mut fewer = ports.clone();
        fewer[0].endpoints.retain(|(ip, _)| *ip == b.ip);
        nft::apply(&nft::ruleset(&table, cluster, &fewer, &[], &read)).unwrap();
        let listed = nft::loaded(&table);
        assert!(
            listed.sets.contains(&set_b) && !listed.sets.contains(&set_a),
            "{listed:?}"
        );
        let elements = String::from_utf8(
            std::process::Command::new("nft")
                .args(["-j", "list", "set", "ip", &table, &set_b])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let doc: serde_json::Value = serde_json::from_str(&elements).unwrap();
        let elem = &doc["nftables"][1]["set"]["elem"][0]["elem"];
        assert!(
            elem["val"] == client && elem["expires"].as_u64().is_some_and(|s| s <= 50 && s > 40),
            "{elements}"
        );
        assert!(
            !listed.chains.contains("svc_0_ep_1"),
            "the dropped endpoint's chain goes: {listed:?}"
        );
        let rules = nft::ruleset(&table, cluster, &ports, &host_ports, &nft::loaded(&table));
        nft::apply(&rules).unwrap();
        let listed = String::from_utf8(
            std::process::Command::new("nft")
                .args(["list", "table", "ip", &table])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert!(listed.contains("dnat to 10.250.1."), "{listed}");
        assert!(
            listed.contains(&format!("dnat to {}:80", a.ip))
                && listed.contains(&format!("dnat to {}:53", a.ip)),
            "host ports: {listed}"
        );
        nft::delete_table(&table).unwrap();
        nft::delete_table(&table).unwrap();
    });

    // A UDP host port moved from pod a to pod b: a client that keeps sending from one port
    // reaches b once the stale flow is forgotten (before that, conntrack keeps it on a).
    inside(&node, || {
        use shoal_net::{conntrack, nft};
        let table = nft::table_name(&format!("{tag}u"));
        let cluster = "10.250.0.0/16".parse().unwrap();
        let rule = |pod_ip| nft::HostPortRule {
            host_ip: None,
            port: 5454,
            protocol: "udp".into(),
            pod_ip,
            container_port: 5454,
        };
        let load = |rules: &[nft::HostPortRule]| {
            nft::apply(&nft::ruleset(
                &table,
                cluster,
                &[],
                rules,
                &nft::loaded(&table),
            ))
            .unwrap()
        };
        let server = |netns: &Path, ip: Ipv4Addr| {
            inside(netns, || {
                let s = std::net::UdpSocket::bind((ip, 5454)).unwrap();
                s.set_read_timeout(Some(std::time::Duration::from_millis(500)))
                    .unwrap();
                s
            })
        };
        let (on_a, on_b) = (server(&pod_a.netns, a.ip), server(&pod_b.netns, b.ip));
        let heard = |s: &std::net::UdpSocket| {
            let mut buf = [0u8; 16];
            s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
        };
        let client = std::net::UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        let send = |m: &[u8]| client.send_to(m, (a.gateway, 5454)).unwrap();
        // Sent while no pod holds the port: the node answers itself, and that untranslated
        // flow would keep the client from the mapping made next.
        load(&[]);
        send(b"0");
        load(&[rule(a.ip)]);
        send(b"0");
        assert_eq!(
            heard(&on_a),
            None,
            "the flow made before the mapping bypasses it"
        );
        let new = conntrack::stale((&[], &[]), (&[], &[rule(a.ip)]));
        assert_eq!(conntrack::delete(&new).unwrap(), 1);
        send(b"1");
        assert_eq!(heard(&on_a).as_deref(), Some(&b"1"[..]));
        load(&[rule(b.ip)]);
        send(b"2");
        assert_eq!(
            heard(&on_a).as_deref(),
            Some(&b"2"[..]),
            "the flow made before the change still leads to a"
        );
        let stale = conntrack::stale((&[], &[rule(a.ip)]), (&[], &[rule(b.ip)]));
        assert_eq!(conntrack::delete(&stale).unwrap(), 1);
        send(b"3");
        assert_eq!(heard(&on_b).as_deref(), Some(&b"3"[..]));
        assert_eq!(heard(&on_a), None);
        assert_eq!(
            conntrack::delete(&stale).unwrap(),
            0,
            "nothing else matched"
        );
        nft::delete_table(&table).unwrap();
    });

    // A host port on 127.0.0.1 serves the node's own clients (route_localnet on the bridge),
    // and a pod cannot use route_localnet to reach the node's loopback services: pod b, routed
    // to send to 127.0.0.1 through the bridge, is dropped by the guard — and gets through
    // once the guard is flushed, which shows the check can fail.
    let on_a = inside(&pod_a.netns, || TcpListener::bind((a.ip, 8081)).unwrap());
    let served = std::thread::spawn(move || {
        let (mut conn, _) = on_a.accept().unwrap();
        conn.write_all(b"hello over loopback").unwrap();
    });
    let table = shoal_net::nft::table_name(&format!("{tag}l"));
    let node_local = inside(&node, || {
        use shoal_net::nft;
        let rule = nft::HostPortRule {
            host_ip: Some(Ipv4Addr::LOCALHOST),
            port: 18081,
            protocol: "tcp".into(),
            pod_ip: a.ip,
            container_port: 8081,
        };
        let rules = nft::ruleset(
            &table,
            "10.250.0.0/16".parse().unwrap(),
            &[],
            std::slice::from_ref(&rule),
            &nft::loaded(&table),
        );
        nft::apply(&rules).unwrap();
        shoal_net::linux::set_route_localnet(net.bridge_name(), nft::route_localnet(&[rule]))
            .unwrap();
        let mut conn = TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, 18081)),
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        let mut reply = String::new();
        conn.read_to_string(&mut reply).unwrap();
        assert_eq!(reply, "hello over loopback");
        // A service of the node's, on loopback only.
        let s = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 18082)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_millis(500)))
            .unwrap();
        s
    });
    served.join().unwrap();
    let ip_b = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(["-n", &names.0[2]])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for local in ["127.0.0.0/8", "127.0.0.1"] {
        ip_b(&[
            "route", "del", "local", local, "dev", "lo", "table", "local",
        ]);
    }
    ip_b(&[
        "route",
        "add",
        "127.0.0.1/32",
        "via",
        &b.gateway.to_string(),
        "dev",
        "eth0",
    ]);
    let reach = || {
        inside(&pod_b.netns, || {
            std::fs::write("/proc/sys/net/ipv4/conf/eth0/route_localnet", "1").unwrap();
            let s = std::net::UdpSocket::bind((b.ip, 0)).unwrap();
            s.send_to(b"knock", (Ipv4Addr::LOCALHOST, 18082)).unwrap();
        });
        let mut buf = [0u8; 8];
        node_local.recv(&mut buf).is_ok()
    };
    assert!(!reach(), "a pod reached the node's loopback service");
    inside(&node, || {
        let out = std::process::Command::new("nft")
            .args(["flush", "chain", "ip", &table, "localnet_guard"])
            .output()
            .unwrap();
        assert!(out.status.success());
    });
    assert!(
        reach(),
        "without the guard the pod gets through (the check above can fail)"
    );
    drop(node_local);
    inside(&node, || {
        shoal_net::linux::set_route_localnet(net.bridge_name(), false).unwrap();
        shoal_net::nft::delete_table(&table).unwrap();
    });

    let host_a = net.host_veth("pod-a");
    assert!(links(&node).contains(&host_a));
    inside(&node, || {
        net.teardown(&pod_a).unwrap();
        net.teardown(&pod_a).unwrap();
    });
    assert!(!links(&node).contains(&host_a));
    inside(&node, || {
        net.cleanup(Some("10.250.0.0/16".parse().unwrap())).unwrap()
    });
    let left = links(&node);
    assert!(
        !left.iter().any(|l| l == net.bridge_name()),
        "bridge removed: {left:?}"
    );
}

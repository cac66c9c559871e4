use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chitchat::transport::Transport;
use chitchat::{ChitchatMessage, Serializable};
use shoal_gossip::{
    Capacity, ChannelTransport, ClusterIdentity, ClusterSecret, Member, MemberState, Membership,
    MembershipConfig, NodeAddresses, NodeMeta, PeerEndpoint, PeerEndpointConfig, QuicTransport,
};

/// Builds the transports of one test network.
#[async_trait]
trait TestNet: Send + Sync {
    /// A transport for node `i` and the address it must be opened on.
    async fn node(&self, i: usize) -> (Arc<dyn Transport>, SocketAddr);
}

struct QuicNet {
    identity: ClusterIdentity,
    /// The endpoints handed out, by node index.
    endpoints: std::sync::Mutex<std::collections::HashMap<usize, PeerEndpoint>>,
}

impl QuicNet {
    fn new(secret_byte: u8) -> Self {
        Self {
            identity: ClusterIdentity::derive(&ClusterSecret::from_bytes([secret_byte; 32]))
                .unwrap(),
            endpoints: Default::default(),
        }
    }

    fn endpoint(&self, i: usize) -> PeerEndpoint {
        self.endpoints.lock().unwrap()[&i].clone()
    }
}

#[async_trait]
impl TestNet for QuicNet {
    async fn node(&self, i: usize) -> (Arc<dyn Transport>, SocketAddr) {
        let cert = self
            .identity
            .issue_node_certificate(&format!("node{i}"), &[])
            .unwrap();
        let endpoint = PeerEndpoint::bind(
            &self.identity,
            &cert,
            PeerEndpointConfig::new("127.0.0.1:0".parse().unwrap()),
        )
        .unwrap();
        let addr = endpoint.local_addr();
        self.endpoints.lock().unwrap().insert(i, endpoint.clone());
        let transport = QuicTransport::new(
            endpoint,
            &format!("id{i}"),
            1,
            std::time::Duration::from_secs(600),
        );
        (Arc::new(transport), addr)
    }
}

struct ChannelNet {
    transport: ChannelTransport,
}

#[async_trait]
impl TestNet for ChannelNet {
    async fn node(&self, i: usize) -> (Arc<dyn Transport>, SocketAddr) {
        let addr: SocketAddr = ([127, 0, 0, 1], 20_000 + i as u16).into();
        (Arc::new(self.transport.clone()), addr)
    }
}

fn syn() -> ChitchatMessage {
    // A BadCluster message is the simplest message to build with the public API.
    ChitchatMessage::BadCluster
}

async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn message_round_trip(net: &dyn TestNet) {
    let (ta, a) = net.node(1).await;
    let (tb, b) = net.node(2).await;
    let mut sa = ta.open(a).await.unwrap();
    let mut sb = tb.open(b).await.unwrap();
    sa.send(b, syn()).await.unwrap();
    let (from, msg) = tokio::time::timeout(Duration::from_secs(5), sb.recv())
        .await
        .expect("message delivered")
        .unwrap();
    assert_eq!(from, a);
    assert_eq!(msg.serialize_to_vec(), syn().serialize_to_vec());
    // And the reply path, which reuses the connection.
    sb.send(a, syn()).await.unwrap();
    let (from, _) = tokio::time::timeout(Duration::from_secs(5), sa.recv())
        .await
        .expect("reply delivered")
        .unwrap();
    assert_eq!(from, b);
}

async fn cannot_open_twice(net: &dyn TestNet) {
    let (t, a) = net.node(3).await;
    let _socket = t.open(a).await.unwrap();
    assert!(t.open(a).await.is_err());
}

async fn sending_to_nobody_is_ok_and_quick(net: &dyn TestNet) {
    let (t, a) = net.node(4).await;
    let mut socket = t.open(a).await.unwrap();
    let nobody: SocketAddr = "127.0.0.1:9".parse().unwrap();
    tokio::time::timeout(Duration::from_millis(100), socket.send(nobody, syn()))
        .await
        .expect("send does not block")
        .unwrap();
}

fn meta(name: &str, addr: SocketAddr) -> NodeMeta {
    NodeMeta {
        name: name.into(),
        labels: [("test".to_string(), "yes".to_string())].into(),
        addresses: NodeAddresses {
            gossip: addr,
            api: None,
        },
        capacity: Capacity {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            pods: 10,
            volume_bytes: None,
        },
        agent_version: "test".into(),
        info: None,
        taints: Vec::new(),
    }
}

async fn start_member(
    net: &dyn TestNet,
    i: usize,
    seeds: &[SocketAddr],
) -> (Membership, SocketAddr) {
    let (t, addr) = net.node(10 + i).await;
    let mut config = MembershipConfig::new(format!("id{i}"), 1, "suite", addr);
    config.gossip_interval = Duration::from_millis(50);
    config.seeds = seeds.iter().map(|s| s.to_string()).collect();
    let membership = Membership::start(config, &meta(&format!("n{i}"), addr), t.as_ref())
        .await
        .unwrap();
    (membership, addr)
}

fn count(members: &[Member], state: MemberState) -> usize {
    members.iter().filter(|m| m.state == state).count()
}

async fn cluster_converges_and_detects_failure(net: &dyn TestNet) {
    let (seed, seed_addr) = start_member(net, 0, &[]).await;
    let mut nodes = vec![seed];
    for i in 1..4 {
        nodes.push(start_member(net, i, &[seed_addr]).await.0);
    }
    for node in &nodes {
        wait_until(
            "4 alive members with metadata",
            Duration::from_secs(10),
            || async {
                let members = node.members().await;
                count(&members, MemberState::Alive) == 4 && members.iter().all(|m| m.meta.is_some())
            },
        )
        .await;
    }
    let names: Vec<String> = nodes[0]
        .members()
        .await
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    assert_eq!(names, ["n0", "n1", "n2", "n3"]);

    // The values' version stands still while nobody publishes, and moves when a peer does
    // (readers polling the values skip the rounds in between).
    let quiet = nodes[0].values_version().await;
    assert_eq!(quiet.len(), 4, "{quiet:?}");
    // Rounds went by, and not a pause: every node's heartbeat, as node 0 sees it, advanced by
    // three or more.
    let before = nodes[0].heartbeats().await;
    wait_until(
        "three gossip rounds of every node seen",
        Duration::from_secs(10),
        || async {
            let now = nodes[0].heartbeats().await;
            now.len() == before.len()
                && now
                    .iter()
                    .zip(&before)
                    .all(|((id, hb), (was_id, was))| id == was_id && *hb >= was + 3)
        },
    )
    .await;
    assert_eq!(nodes[0].values_version().await, quiet);
    nodes[2].set_dynamic("pod.x", Some("1".into())).await;
    wait_until(
        "the published value seen",
        Duration::from_secs(10),
        || async {
            nodes[0]
                .dynamic_values("pod.")
                .await
                .iter()
                .any(|(id, key, value)| id == "id2" && key == "pod.x" && value == "1")
        },
    )
    .await;
    assert_ne!(nodes[0].values_version().await, quiet);

    let gone = nodes.pop().unwrap();
    gone.shutdown().await;
    for node in &nodes {
        wait_until(
            "the stopped node seen dead",
            Duration::from_secs(10),
            || async {
                let members = node.members().await;
                members
                    .iter()
                    .any(|m| m.node_id == "id3" && m.state == MemberState::Dead)
            },
        )
        .await;
        let version = node.values_version().await;
        assert!(version.iter().all(|(id, _, _)| id != "id3"), "{version:?}");
    }
    for node in nodes {
        node.shutdown().await;
    }
}

async fn run_suite(net: &dyn TestNet) {
    message_round_trip(net).await;
    cannot_open_twice(net).await;
    sending_to_nobody_is_ok_and_quick(net).await;
    cluster_converges_and_detects_failure(net).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_over_quic() {
    run_suite(&QuicNet::new(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_over_channels() {
    run_suite(&ChannelNet {
        transport: ChannelTransport::with_mtu(65_507),
    })
    .await;
}

/// A node whose certificate comes from another secret is refused at the TLS handshake: it never
/// appears in the cluster, and learns nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_secret_stays_outside() {
    let cluster = QuicNet::new(7);
    let (seed, seed_addr) = start_member(&cluster, 0, &[]).await;
    let (other, _) = start_member(&cluster, 1, &[seed_addr]).await;
    let stranger_net = QuicNet::new(8);
    let (stranger, _) = start_member(&stranger_net, 2, &[seed_addr]).await;

    wait_until(
        "the two members see each other",
        Duration::from_secs(10),
        || async {
            count(&seed.members().await, MemberState::Alive) == 2
                && count(&other.members().await, MemberState::Alive) == 2
        },
    )
    .await;
    // Evidence that the stranger tried, not a pause: the seed refused its handshake again and
    // again (it gossips every 50 ms).
    let seed_endpoint = cluster.endpoint(10);
    wait_until(
        "the seed to refuse the stranger 5 times",
        Duration::from_secs(10),
        || async { seed_endpoint.refused_handshakes() >= 5 },
    )
    .await;
    for node in [&seed, &other] {
        assert!(node.members().await.iter().all(|m| m.node_id != "id2"));
    }
    let seen_by_stranger = stranger.members().await;
    assert_eq!(seen_by_stranger.len(), 1, "{seen_by_stranger:?}");
    assert!(seen_by_stranger[0].is_self);
    for node in [seed, other, stranger] {
        node.shutdown().await;
    }
}

//! The Kubernetes API of a one-node agent, in-process, for the targets whose code is private
//! to `shoal-agent` (admission, patches, selectors): requests go straight to
//! [`shoal_agent::api::router`], no socket, no TLS.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};
use shoal_state::{Store, StoreConfig};

use super::{ADMITTED_KINDS, collection, kind_info};

/// A request answered by the router: its status and body.
pub(super) type Answer = (u16, Vec<u8>);

type Call =
    Box<dyn Fn(hyper::Request<Full<Bytes>>) -> Pin<Box<dyn Future<Output = Answer>>> + Send + Sync>;

/// How long one API request may take before the harness calls it hung.
const REQUEST_PATIENCE: Duration = Duration::from_secs(10);

/// The Kubernetes API of a one-node agent with no runtime: [`shoal_agent::api::router`] over a
/// store in a temporary directory, with a membership of one (gossip on an in-memory transport)
/// and the scheduling and node services not started. Requests go straight to the router.
pub(super) struct Api {
    runtime: tokio::runtime::Runtime,
    call: Call,
    token: String,
    /// Names `patches`' stored target: bumped when a target could not be deleted, so the next
    /// one never meets it.
    target_generation: u64,
    _dir: tempfile::TempDir,
}

/// The process's one [`Api`], started on first use.
pub(super) fn api() -> MutexGuard<'static, Api> {
    static API: OnceLock<Mutex<Api>> = OnceLock::new();
    API.get_or_init(|| Mutex::new(Api::start().expect("the in-process API starts")))
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl Api {
    fn start() -> anyhow::Result<Self> {
        // Multi-threaded: replication commits in `block_in_place`.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let dir = tempfile::tempdir()?;
        let (call, token) = runtime.block_on(Self::router(dir.path()))?;
        let api = Self {
            runtime,
            call,
            token,
            target_generation: 0,
            _dir: dir,
        };
        api.seed();
        Ok(api)
    }

    async fn router(dir: &Path) -> anyhow::Result<(Call, String)> {
        use shoal_gossip::{
            Capacity, ChannelTransport, ClusterIdentity, ClusterSecret, Membership,
            MembershipConfig, NodeAddresses, NodeMeta, PeerEndpoint, PeerEndpointConfig,
        };
        let (node_id, numeric_id) = ("00000000000000f1", 0xf1);
        let identity = ClusterIdentity::derive(&ClusterSecret::from_bytes([35; 32]))?;
        let certificate = identity.issue_node_certificate(node_id, &[])?;
        let bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let endpoint = PeerEndpoint::bind(&identity, &certificate, PeerEndpointConfig::new(bind))?;
        let addr = endpoint.local_addr();
        let meta = NodeMeta {
            name: "fuzz-node".into(),
            labels: Default::default(),
            addresses: NodeAddresses {
                gossip: addr,
                api: None,
            },
            capacity: Capacity {
                cpu_millis: 4_000,
                memory_bytes: 8 << 30,
                pods: 110,
                volume_bytes: None,
            },
            agent_version: shoal_agent::AGENT_VERSION.into(),
            info: None,
            taints: Vec::new(),
        };
        let config = MembershipConfig::new(node_id, 1, identity.cluster_id(), addr);
        let membership =
            Arc::new(Membership::start(config, &meta, &ChannelTransport::with_mtu(65_507)).await?);
        let store = Store::open(StoreConfig::new(dir.join("state.redb"), numeric_id))?;
        let replication = shoal_agent::replication::Replication::new(
            store,
            endpoint.clone(),
            membership.clone(),
            shoal_agent::replication::ReplicationConfig {
                write_quorum: 1,
                expected_members: 1,
                ..Default::default()
            },
        );
        let events = Arc::new(shoal_agent::observed::events::Recorder::new(
            "fuzz-node",
            Duration::from_secs(3600),
            shoal_agent::observed::events::MAX_PER_NAMESPACE,
        ));
        let pod_statuses = Arc::new(shoal_agent::observed::pod_status::PodStatusCache::default());
        let scheduling = shoal_agent::scheduling::Scheduling::new(
            numeric_id,
            replication.clone(),
            membership.clone(),
            endpoint.clone(),
            Default::default(),
            events.clone(),
            pod_statuses.clone(),
        );
        let logs = shoal_agent::kubelet::node_service::NodeService::new(
            None,
            None,
            membership.clone(),
            endpoint,
            "fuzz-node".into(),
            events,
        );
        let token = identity.api_token().to_owned();
        let router = shoal_agent::api::router(shoal_agent::api::ApiState {
            replication,
            membership,
            scheduling,
            pod_statuses,
            logs,
            token: token.as_str().into(),
            tokens: Arc::new(shoal_agent::tokens::Tokens::new(
                shoal_agent::tokens::Signer::load_or_create(
                    dir,
                    shoal_agent::tokens::issuer_url("cluster.local"),
                )?,
            )),
            authz: Default::default(),
            audit: None,
            server_address: "127.0.0.1:6443".into(),
            service_cidr: "10.96.0.0/16".parse()?,
        });
        Ok((
            caller(hyper_util::service::TowerToHyperService::new(router)),
            token,
        ))
    }

    /// Objects for selectors to match and patches to change.
    fn seed(&self) {
        let pod = |name: &str, app: &str| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "labels": {"app": app, "tier": "front"}},
                   "spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80}]}]}})
        };
        for object in [
            pod("seed-a", "web"),
            pod("seed-b", "db"),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                   "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                   "data": {"k": "v"}}),
        ] {
            let info = kind_info(object["kind"].as_str().expect("a kind"));
            let body = serde_json::to_vec(&object).expect("a JSON value serializes");
            let (status, answer) =
                self.request("POST", &collection(info), "application/json", &body);
            assert_eq!(
                status,
                201,
                "seeding the API: {}",
                String::from_utf8_lossy(&answer)
            );
        }
    }

    pub(super) fn request(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Answer {
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "fuzz")
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", content_type)
            .body(Full::new(Bytes::copy_from_slice(body)))
            .expect("a well-formed request");
        let answer = (self.call)(request);
        self.runtime.block_on(async {
            tokio::time::timeout(REQUEST_PATIENCE, answer)
                .await
                .unwrap_or_else(|_| panic!("{method} {path} hung for {REQUEST_PATIENCE:?}"))
        })
    }

    /// Creates `target` (as the kind it names among [`ADMITTED_KINDS`], else a ConfigMap, with
    /// no finalizers) under this harness's name; its URL if the API took it.
    pub(super) fn store_patch_target(&mut self, mut target: Value) -> Option<String> {
        let kind = target["kind"]
            .as_str()
            .and_then(|k| ADMITTED_KINDS.iter().find(|a| **a == k))
            .copied()
            .unwrap_or("ConfigMap");
        let info = kind_info(kind);
        let name = format!("fuzz-target-{}", self.target_generation);
        target["apiVersion"] = json!(info.api_version());
        target["kind"] = json!(info.kind);
        if !target["metadata"].is_object() {
            target["metadata"] = json!({});
        }
        let meta = target["metadata"].as_object_mut().expect("an object");
        for field in [
            "finalizers",
            "deletionTimestamp",
            "namespace",
            "generateName",
        ] {
            meta.remove(field);
        }
        meta.insert("name".into(), json!(name));
        let body = serde_json::to_vec(&target).expect("a JSON value serializes");
        let (status, _) = self.request("POST", &collection(info), "application/json", &body);
        (status == 201).then(|| format!("{}/{name}", collection(info)))
    }

    pub(super) fn delete_patch_target(&mut self, path: &str) {
        let url = format!("{path}?gracePeriodSeconds=0");
        self.request("DELETE", &url, "application/json", b"");
        if self.request("GET", path, "application/json", b"").0 != 404 {
            self.target_generation += 1;
        }
    }
}

/// `service` (the router, as hyper sees it) as a [`Call`].
fn caller<S, B>(service: S) -> Call
where
    S: hyper::service::Service<hyper::Request<Full<Bytes>>, Response = hyper::Response<B>>
        + Send
        + Sync
        + 'static,
    S::Future: 'static,
    S::Error: std::fmt::Debug,
    B: hyper::body::Body + 'static,
    B::Error: std::fmt::Debug,
{
    Box::new(move |request| {
        let answer = service.call(request);
        Box::pin(async move {
            let response = answer.await.expect("the router answers every request");
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().to_vec())
                .unwrap_or_default();
            (status, body)
        })
    })
}

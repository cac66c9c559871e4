//! `shoal-net`: pod networking (DESIGN.md §9) — one IP per pod.
//!
//! Place in the data path: manifest → model → store → controllers → placement → kubelet →
//! runtime → **network**: the runtime asks it for a pod's interface and address when it makes
//! the sandbox; Services' endpoints, DNS and nftables follow the store.
//!
//! - [`lease`]: which per-node block of the cluster CIDR a node holds, decided from the leases in
//!   desired state (pure; the agent stores the leases).
//! - [`ipam`]: pod addresses within the node's block (pure; rebuilt from the pods' own network
//!   records on restart, so the two can never disagree).
//! - [`netns`]: named network namespaces (`/run/netns/<name>`), made with `unshare` and a bind
//!   mount, as iproute2 does, without running it.
//! - [`linux`]: the node's bridge, a veth pair per pod and the routes to other nodes' blocks,
//!   through netlink (`rtnetlink`).
//! - [`dns`]: the node's DNS server for its pods and their resolv.conf.
//! - [`nft`]: the nftables ruleset that load-balances ClusterIPs (their allocation is the object
//!   model's, `shoal_model::service_ip`) and serves host ports.
//! - [`conntrack`]: forgets the UDP flows whose NAT target the rules no longer lead to
//!   (ctnetlink).
//!
//! The runtime calls a [`PodNetworkPlugin`]; everything host-specific sits behind it.

pub mod conntrack;
pub mod dns;
pub mod ipam;
pub mod lease;
pub mod linux;
pub mod netns;
pub mod nft;

use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Defaults of the flags that shape the pod network.
pub const DEFAULT_CLUSTER_CIDR: &str = "10.88.0.0/16";
pub const DEFAULT_NODE_CIDR_SIZE: u8 = 24;

/// The network a pod was given: recorded with its sandbox, reported as `status.podIP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodNetwork {
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Ipv4Addr,
    pub mtu: u32,
}

/// The pod the runtime asks about: its uid (already checked to be a plain identifier) and the
/// path of its network namespace.
#[derive(Debug, Clone)]
pub struct PodRef {
    pub uid: String,
    pub netns: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("this node holds no pod CIDR yet (waiting for its lease in desired state)")]
    NoBlock,
    #[error(transparent)]
    Ipam(#[from] ipam::IpamError),
    #[error("netlink: {op}: {message}")]
    Netlink { op: String, message: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What the container runtime needs from a pod network.
pub trait PodNetworkPlugin: Send + Sync + std::fmt::Debug {
    /// Gives the pod (whose network namespace exists) its interface and address. Idempotent
    /// for a pod that already has one: returns the same network.
    fn setup(&self, pod: &PodRef) -> Result<Option<PodNetwork>, NetError>;
    /// Releases the pod's address and removes its interface. Idempotent.
    fn teardown(&self, pod: &PodRef) -> Result<(), NetError>;
    /// Whether a pod given `network` earlier may keep it (false once this node holds another
    /// block: the pod must be renumbered). True while that is not known.
    fn is_current(&self, _network: &PodNetwork) -> bool {
        true
    }
    /// Where this node's cluster DNS listens (its bridge's gateway), for pods that share the
    /// node's network namespace and ask for it (`dnsPolicy: ClusterFirstWithHostNet`). None
    /// while the node holds no block, or without a pod network.
    fn node_dns(&self) -> Option<std::net::Ipv4Addr> {
        None
    }
}

/// Loopback only: the pod's namespace keeps just `lo` (`--pod-network none`).
#[derive(Debug, Default)]
pub struct LoopbackOnly;

impl PodNetworkPlugin for LoopbackOnly {
    fn setup(&self, _pod: &PodRef) -> Result<Option<PodNetwork>, NetError> {
        Ok(None)
    }

    fn teardown(&self, _pod: &PodRef) -> Result<(), NetError> {
        Ok(())
    }
}

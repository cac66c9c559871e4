//! Typed node metadata over chitchat's string key-values.
//!
//! chitchat stores `String → String` per node. Nothing outside this crate sees those strings:
//! each piece of metadata has a [`Key<T>`] that knows its name and its codec (JSON), and
//! [`NodeMeta`] is read and written only through them.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::net::SocketAddr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A typed chitchat key.
pub struct Key<T> {
    name: &'static str,
    _value: PhantomData<fn() -> T>,
}

impl<T> Clone for Key<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Key<T> {}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("gossip key {key} is missing")]
    Missing { key: &'static str },
    #[error("gossip key {key} holds an invalid value: {reason}")]
    Invalid { key: &'static str, reason: String },
}

impl<T: Serialize + DeserializeOwned> Key<T> {
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            _value: PhantomData,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn encode(&self, value: &T) -> String {
        serde_json::to_string(value).expect("metadata types serialize to JSON infallibly")
    }

    pub fn decode(&self, raw: &str) -> Result<T, MetaError> {
        serde_json::from_str(raw).map_err(|err| MetaError::Invalid {
            key: self.name,
            reason: err.to_string(),
        })
    }

    /// Reads and decodes this key through `lookup` (e.g. a chitchat `NodeState::get`).
    pub fn read<'a>(&self, lookup: impl Fn(&str) -> Option<&'a str>) -> Result<T, MetaError> {
        let raw = lookup(self.name).ok_or(MetaError::Missing { key: self.name })?;
        self.decode(raw)
    }
}

/// The keys every Shoal node publishes about itself.
pub mod keys {
    use std::collections::BTreeMap;

    use super::{Capacity, Key, NodeAddresses, NodeInfo, NodeTaint};

    pub const NAME: Key<String> = Key::new("node.name");
    pub const LABELS: Key<BTreeMap<String, String>> = Key::new("node.labels");
    pub const ADDRESSES: Key<NodeAddresses> = Key::new("node.addresses");
    pub const CAPACITY: Key<Capacity> = Key::new("node.capacity");
    pub const AGENT_VERSION: Key<String> = Key::new("node.agent-version");
    pub const INFO: Key<NodeInfo> = Key::new("node.info");
    pub const TAINTS: Key<Vec<NodeTaint>> = Key::new("node.taints");
    /// Pods this node, as their auctioneer, found no node for: pod uid → reason.
    pub const UNSCHEDULABLE: Key<BTreeMap<String, String>> = Key::new("sched.unschedulable");
    /// Images this node holds: normalised reference → manifest digest (peers pull from it).
    pub const IMAGES: Key<BTreeMap<String, String>> = Key::new("node.images");
    /// Hex root digest of the node's desired-state store (anti-entropy trigger).
    pub const STORE_DIGEST: Key<String> = Key::new("store.digest");
}

/// Where a node can be reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddresses {
    /// The node's QUIC endpoint (gossip and all node-to-node traffic).
    pub gossip: SocketAddr,
    /// The node's API server, when it serves one on the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<SocketAddr>,
}

/// What a node offers to pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pods: u32,
    /// What the node's volume provisioner may give out in all (`shoal.io/local-path` claims);
    /// none from a node that does not say (it is then not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_bytes: Option<u64>,
}

/// A node taint, as in a Node's `spec.taints` (`effect` is NoSchedule, PreferNoSchedule or
/// NoExecute).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTaint {
    pub key: String,
    #[serde(default)]
    pub value: String,
    pub effect: String,
}

/// Facts about the node's host, shown in the API's Node `status.nodeInfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub kernel_version: String,
    pub os_image: String,
    pub machine_id: String,
    pub boot_id: String,
    /// When the agent started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// The container runtime that runs this node's pods (`runc://1.1.5`), empty if none.
    #[serde(default)]
    pub container_runtime: String,
}

/// Everything a node says about itself in gossip.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMeta {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub addresses: NodeAddresses,
    pub capacity: Capacity,
    pub agent_version: String,
    /// Host facts; optional so that agents that do not publish them still decode.
    #[serde(default)]
    pub info: Option<NodeInfo>,
    #[serde(default)]
    pub taints: Vec<NodeTaint>,
}

impl NodeMeta {
    /// The chitchat key-values that publish this metadata.
    pub fn key_values(&self) -> Vec<(String, String)> {
        vec![
            (keys::NAME.name().into(), keys::NAME.encode(&self.name)),
            (
                keys::LABELS.name().into(),
                keys::LABELS.encode(&self.labels),
            ),
            (
                keys::ADDRESSES.name().into(),
                keys::ADDRESSES.encode(&self.addresses),
            ),
            (
                keys::CAPACITY.name().into(),
                keys::CAPACITY.encode(&self.capacity),
            ),
            (
                keys::AGENT_VERSION.name().into(),
                keys::AGENT_VERSION.encode(&self.agent_version),
            ),
        ]
        .into_iter()
        .chain(
            self.info
                .as_ref()
                .map(|info| (keys::INFO.name().into(), keys::INFO.encode(info))),
        )
        .chain([(
            keys::TAINTS.name().into(),
            keys::TAINTS.encode(&self.taints),
        )])
        .collect()
    }

    /// Decodes the metadata a peer published; the error names the offending key.
    pub fn read<'a>(lookup: impl Fn(&str) -> Option<&'a str>) -> Result<Self, MetaError> {
        Ok(Self {
            name: keys::NAME.read(&lookup)?,
            labels: keys::LABELS.read(&lookup)?,
            addresses: keys::ADDRESSES.read(&lookup)?,
            capacity: keys::CAPACITY.read(&lookup)?,
            agent_version: keys::AGENT_VERSION.read(&lookup)?,
            info: keys::INFO.read(&lookup).ok(),
            taints: keys::TAINTS.read(&lookup).unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn sample() -> NodeMeta {
        NodeMeta {
            name: "n1".into(),
            labels: BTreeMap::from([("zone".into(), "a".into())]),
            addresses: NodeAddresses {
                gossip: "127.0.0.1:7000".parse().unwrap(),
                api: None,
            },
            capacity: Capacity {
                cpu_millis: 2000,
                memory_bytes: 1 << 30,
                pods: 110,
                volume_bytes: None,
            },
            agent_version: "0.1.0".into(),
            info: Some(NodeInfo {
                kernel_version: "6.1".into(),
                ..NodeInfo::default()
            }),
            taints: vec![NodeTaint {
                key: "dedicated".into(),
                value: "db".into(),
                effect: "NoSchedule".into(),
            }],
        }
    }

    #[test]
    fn round_trips_through_key_values() {
        let meta = sample();
        let kv: HashMap<String, String> = meta.key_values().into_iter().collect();
        let back = NodeMeta::read(|k| kv.get(k).map(String::as_str)).unwrap();
        assert_eq!(back, meta);
    }

    #[test]
    fn errors_name_the_key() {
        let mut kv: HashMap<String, String> = sample().key_values().into_iter().collect();
        kv.insert("node.capacity".into(), "{\"cpu_millis\":\"lots\"}".into());
        let err = NodeMeta::read(|k| kv.get(k).map(String::as_str)).unwrap_err();
        assert!(
            matches!(
                err,
                MetaError::Invalid {
                    key: "node.capacity",
                    ..
                }
            ),
            "{err}"
        );
        kv.remove("node.labels");
        let err = NodeMeta::read(|k| kv.get(k).map(String::as_str)).unwrap_err();
        assert_eq!(err, MetaError::Missing { key: "node.labels" });
    }
}

//! The kinds of object the store accepts and how they are keyed.

use serde::{Deserialize, Serialize};

/// What the API knows about one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindInfo {
    /// API group; "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// Lower-case plural used in URLs.
    pub plural: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
}

impl KindInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// A kind's description, usable in `const` tables.
pub const fn kind(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
) -> KindInfo {
    KindInfo {
        group,
        version,
        kind,
        plural,
        namespaced,
        short_names,
    }
}

/// Every kind of desired state Shoal stores (Nodes and Events are observed, not stored).
pub const KINDS: &[KindInfo] = &[
    kind("", "v1", "Namespace", "namespaces", false, &["ns"]),
    kind("", "v1", "Pod", "pods", true, &["po"]),
    kind("", "v1", "Service", "services", true, &["svc"]),
    kind("", "v1", "ConfigMap", "configmaps", true, &["cm"]),
    kind("", "v1", "Secret", "secrets", true, &[]),
    kind("", "v1", "ServiceAccount", "serviceaccounts", true, &["sa"]),
    // Storage (issue #39): claims, the volumes that satisfy them, and how volumes are made.
    kind(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        true,
        &["pvc"],
    ),
    kind(
        "",
        "v1",
        "PersistentVolume",
        "persistentvolumes",
        false,
        &["pv"],
    ),
    kind(
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        false,
        &["sc"],
    ),
    // Who may do what (issue #40): RBAC as upstream's.
    kind(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        true,
        &[],
    ),
    kind(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        false,
        &[],
    ),
    kind(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        true,
        &[],
    ),
    kind(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
        &[],
    ),
    // Leases as client-go's leader election takes them (optimistic concurrency on update).
    kind("coordination.k8s.io", "v1", "Lease", "leases", true, &[]),
    kind("apps", "v1", "Deployment", "deployments", true, &["deploy"]),
    kind("apps", "v1", "ReplicaSet", "replicasets", true, &["rs"]),
    kind("apps", "v1", "DaemonSet", "daemonsets", true, &["ds"]),
    kind("apps", "v1", "StatefulSet", "statefulsets", true, &["sts"]),
    // The StatefulSets' template history (`kubectl rollout history|undo`).
    kind(
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        true,
        &[],
    ),
    kind("batch", "v1", "Job", "jobs", true, &[]),
    kind("batch", "v1", "CronJob", "cronjobs", true, &["cj"]),
    kind(
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        true,
        &["hpa"],
    ),
    // What users changed on a Node through the API: labels, annotations, taints, cordon
    // (one object per node name; the agent's `node_settings` module).
    kind(
        "node.shoal.io",
        "v1",
        "NodeSettings",
        "nodesettings",
        false,
        &[],
    ),
    // Which node holds which block of the cluster CIDR (one object per block; shoal-net's
    // `lease` module).
    kind(
        "network.shoal.io",
        "v1",
        "PodCIDRBlock",
        "podcidrblocks",
        false,
        &["pcb"],
    ),
];

/// Looks a kind up by `apiVersion` and `kind`.
pub fn lookup(api_version: &str, kind: &str) -> Option<&'static KindInfo> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.kind == kind)
}

/// Looks a kind up by a name a user types: kind, plural or short name, any case.
pub fn lookup_by_name(name: &str) -> Option<&'static KindInfo> {
    let name = name.to_ascii_lowercase();
    KINDS.iter().find(|k| {
        k.kind.eq_ignore_ascii_case(&name)
            || k.plural == name
            || k.short_names.contains(&name.as_str())
    })
}

/// Identity of a stored object: (group, kind, namespace, name). Cluster-scoped kinds have an
/// empty namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(info: &KindInfo, namespace: &str, name: &str) -> Self {
        Self {
            group: info.group.to_owned(),
            kind: info.kind.to_owned(),
            namespace: if info.namespaced {
                namespace.to_owned()
            } else {
                String::new()
            },
            name: name.to_owned(),
        }
    }

    /// The kind's description, if the kind is known.
    pub fn info(&self) -> Option<&'static KindInfo> {
        KINDS
            .iter()
            .find(|k| k.group == self.group && k.kind == self.kind)
    }

    /// Byte encoding used as the storage key; ordered by group, kind, namespace, name.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            self.group.len() + self.kind.len() + self.namespace.len() + self.name.len() + 3,
        );
        for (i, part) in [&self.group, &self.kind, &self.namespace, &self.name]
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                out.push(0);
            }
            out.extend_from_slice(part.as_bytes());
        }
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let mut parts = bytes.split(|b| *b == 0);
        let mut next = || String::from_utf8(parts.next()?.to_vec()).ok();
        let key = Self {
            group: next()?,
            kind: next()?,
            namespace: next()?,
            name: next()?,
        };
        parts.next().is_none().then_some(key)
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        };
        if self.namespace.is_empty() {
            write!(f, "{kind}/{}", self.name)
        } else {
            write!(f, "{kind} {}/{}", self.namespace, self.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        assert_eq!(
            lookup("apps/v1", "Deployment").unwrap().plural,
            "deployments"
        );
        assert_eq!(lookup("v1", "Pod").unwrap().group, "");
        assert!(lookup("v2", "Pod").is_none());
        assert_eq!(lookup_by_name("deploy").unwrap().kind, "Deployment");
        assert_eq!(lookup_by_name("Pods").unwrap().kind, "Pod");
        assert!(lookup_by_name("widgets").is_none());
    }

    #[test]
    fn key_bytes_round_trip_and_cluster_scope_drops_namespace() {
        let pod = ObjectKey::new(lookup("v1", "Pod").unwrap(), "default", "web-1");
        assert_eq!(ObjectKey::from_bytes(&pod.to_bytes()), Some(pod.clone()));
        let ns = ObjectKey::new(lookup("v1", "Namespace").unwrap(), "ignored", "prod");
        assert_eq!(ns.namespace, "");
        assert_eq!(ObjectKey::from_bytes(b"a\0b"), None);
    }
}

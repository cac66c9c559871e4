//! The API's resource registry and URL grammar (`/api/v1/namespaces/{ns}/pods/{name}/log`, …).

use shoal_state::kind::{self, KINDS, KindInfo};

/// Where a resource's objects come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The replicated desired-state store.
    Stored(&'static KindInfo),
    /// Membership (one Node per member).
    Nodes,
    /// Events: each node's own (scheduler, kubelet, node lifecycle, clients' creates),
    /// gathered from every live node when read (`crate::observed::events`).
    Events,
    /// Endpoints, derived from Services and the pods observed ready.
    Endpoints,
    /// discovery.k8s.io EndpointSlices, derived the same way.
    EndpointSlices,
    /// metrics.k8s.io PodMetrics: usage sampled by the nodes running the pods.
    PodMetrics,
    /// metrics.k8s.io NodeMetrics: each node's usage.
    NodeMetrics,
}

/// A subresource: its name, the (group, version, kind) it answers with, and its verbs.
pub type Subresource = (
    &'static str,
    (&'static str, &'static str, &'static str),
    &'static [&'static str],
);

/// One resource type as the API serves it: a kind (group, version, plural, scope, short
/// names) and where its objects come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiResource {
    pub info: &'static KindInfo,
    pub source: Source,
}

impl std::ops::Deref for ApiResource {
    type Target = KindInfo;

    fn deref(&self) -> &KindInfo {
        self.info
    }
}

const READ_VERBS: &[&str] = &["get", "list", "watch"];
const EVENT_VERBS: &[&str] = &["create", "get", "list", "watch"];
/// Nodes are observed; their labels, annotations, taints and cordon are edited (NodeSettings).
const NODE_VERBS: &[&str] = &["get", "list", "patch", "update", "watch"];
const WRITE_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// Namespaces are deleted one by one (as in Kubernetes, which has no deletecollection for them).
const NAMESPACE_VERBS: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// Kinds the API serves from observation rather than from the store.
const NODE: KindInfo = kind::kind("", "v1", "Node", "nodes", false, &["no"]);
const EVENT: KindInfo = kind::kind("", "v1", "Event", "events", true, &["ev"]);
const EVENTS_V1: KindInfo = kind::kind("events.k8s.io", "v1", "Event", "events", true, &[]);
const ENDPOINTS: KindInfo = kind::kind("", "v1", "Endpoints", "endpoints", true, &["ep"]);
const ENDPOINT_SLICES: KindInfo = kind::kind(
    "discovery.k8s.io",
    "v1",
    "EndpointSlice",
    "endpointslices",
    true,
    &[],
);
const POD_METRICS: KindInfo =
    kind::kind("metrics.k8s.io", "v1beta1", "PodMetrics", "pods", true, &[]);
const NODE_METRICS: KindInfo = kind::kind(
    "metrics.k8s.io",
    "v1beta1",
    "NodeMetrics",
    "nodes",
    false,
    &[],
);

impl ApiResource {
    pub fn singular(&self) -> String {
        self.kind.to_ascii_lowercase()
    }

    pub fn verbs(&self) -> &'static [&'static str] {
        match self.source {
            Source::Stored(_) if self.kind == "Namespace" => NAMESPACE_VERBS,
            Source::Stored(_) => WRITE_VERBS,
            Source::Events => EVENT_VERBS,
            Source::Nodes => NODE_VERBS,
            Source::PodMetrics | Source::NodeMetrics => &["get", "list"],
            _ => READ_VERBS,
        }
    }

    /// kubectl's `get all` shows these.
    pub fn categories(&self) -> &'static [&'static str] {
        match self.kind {
            "Pod" | "Service" | "Deployment" | "ReplicaSet" | "DaemonSet" | "StatefulSet"
            | "Job" | "CronJob" => &["all"],
            _ => &[],
        }
    }

    /// Subresources: (name, response kind as (group, version, kind), verbs).
    pub fn subresources(&self) -> Vec<Subresource> {
        // Status is observed by the agents: readable, not writable (so not advertised as such).
        let status = (
            "status",
            (self.group, self.version, self.kind),
            &["get"][..],
        );
        match self.kind {
            "Pod" => vec![
                status,
                ("log", ("", "v1", "Pod"), &["get"][..]),
                ("exec", ("", "v1", "PodExecOptions"), &["create", "get"][..]),
                (
                    "attach",
                    ("", "v1", "PodAttachOptions"),
                    &["create", "get"][..],
                ),
                (
                    "portforward",
                    ("", "v1", "PodPortForwardOptions"),
                    &["create", "get"][..],
                ),
                ("eviction", ("policy", "v1", "Eviction"), &["create"][..]),
            ],
            "Deployment" | "ReplicaSet" | "StatefulSet" => vec![
                status,
                (
                    "scale",
                    ("autoscaling", "v1", "Scale"),
                    &["get", "patch", "update"][..],
                ),
            ],
            "ServiceAccount" => vec![(
                "token",
                ("authentication.k8s.io", "v1", "TokenRequest"),
                &["create"][..],
            )],
            "DaemonSet"
            | "Job"
            | "CronJob"
            | "Service"
            | "HorizontalPodAutoscaler"
            | "PersistentVolumeClaim"
            | "PersistentVolume" => {
                vec![status]
            }
            _ => vec![],
        }
    }

    pub fn kind_info(&self) -> Option<&'static KindInfo> {
        match self.source {
            Source::Stored(info) => Some(info),
            _ => None,
        }
    }
}

/// Every resource the API serves.
pub fn all() -> Vec<ApiResource> {
    KINDS
        .iter()
        .map(|info| ApiResource {
            info,
            source: Source::Stored(info),
        })
        .chain([
            ApiResource {
                info: &NODE,
                source: Source::Nodes,
            },
            ApiResource {
                info: &EVENT,
                source: Source::Events,
            },
            ApiResource {
                info: &EVENTS_V1,
                source: Source::Events,
            },
            ApiResource {
                info: &POD_METRICS,
                source: Source::PodMetrics,
            },
            ApiResource {
                info: &NODE_METRICS,
                source: Source::NodeMetrics,
            },
            ApiResource {
                info: &ENDPOINTS,
                source: Source::Endpoints,
            },
            ApiResource {
                info: &ENDPOINT_SLICES,
                source: Source::EndpointSlices,
            },
        ])
        .collect()
}

/// The group versions served, core ("") first.
pub fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut gvs: Vec<(&str, &str)> = Vec::new();
    for r in all() {
        if !gvs.contains(&(r.group, r.version)) {
            gvs.push((r.group, r.version));
        }
    }
    gvs.sort_by_key(|(g, _)| (!g.is_empty(), *g));
    gvs
}

pub fn find(group: &str, version: &str, plural: &str) -> Option<ApiResource> {
    all()
        .into_iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// A parsed API path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiPath {
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/api/v1`, `/apis/{group}/{version}`
    ResourceList { group: String, version: String },
    /// `.../{plural}` or `.../namespaces/{ns}/{plural}`
    Collection {
        resource: ApiResource,
        namespace: Option<String>,
    },
    /// `.../{plural}/{name}[/{subresource}]`
    Object {
        resource: ApiResource,
        namespace: Option<String>,
        name: String,
        subresource: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    /// No such route.
    NotFound(String),
    /// A known group/version without that resource.
    NoResource {
        group_version: String,
        plural: String,
    },
}

/// Parses the path of an API request.
pub fn parse(path: &str) -> Result<ApiPath, PathError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let not_found = || PathError::NotFound(path.to_owned());
    let (group, version, rest): (&str, &str, &[&str]) = match segments.as_slice() {
        ["api"] => return Ok(ApiPath::CoreVersions),
        ["apis"] => return Ok(ApiPath::Groups),
        ["api", version, rest @ ..] => ("", version, rest),
        ["apis", group, version, rest @ ..] => (group, version, rest),
        _ => return Err(not_found()),
    };
    if !group_versions().contains(&(group, version)) {
        return Err(not_found());
    }
    let lookup = |plural: &str| {
        find(group, version, plural).ok_or_else(|| PathError::NoResource {
            group_version: if group.is_empty() {
                version.to_owned()
            } else {
                format!("{group}/{version}")
            },
            plural: plural.to_owned(),
        })
    };
    let object = |resource: ApiResource, namespace: Option<&str>, name: &str, sub: Option<&str>| {
        ApiPath::Object {
            resource,
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
            subresource: sub.map(str::to_owned),
        }
    };
    Ok(match rest {
        [] => ApiPath::ResourceList {
            group: group.to_owned(),
            version: version.to_owned(),
        },
        // `namespaces/{ns}/{plural}...`, except a namespace's own subresources.
        ["namespaces", ns, plural, tail @ ..]
            if !tail.is_empty() || !matches!(*plural, "status" | "finalize") =>
        {
            let resource = lookup(plural)?;
            if !resource.namespaced {
                return Err(not_found());
            }
            match tail {
                [] => ApiPath::Collection {
                    resource,
                    namespace: Some((*ns).to_owned()),
                },
                [name] => object(resource, Some(ns), name, None),
                [name, sub] => object(resource, Some(ns), name, Some(sub)),
                _ => return Err(not_found()),
            }
        }
        [plural] => ApiPath::Collection {
            resource: lookup(plural)?,
            namespace: None,
        },
        [plural, name] => {
            let resource = lookup(plural)?;
            if resource.namespaced {
                return Err(not_found());
            }
            object(resource, None, name, None)
        }
        [plural, name, sub] => {
            let resource = lookup(plural)?;
            if resource.namespaced {
                return Err(not_found());
            }
            object(resource, None, name, Some(sub))
        }
        _ => return Err(not_found()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plural(p: &ApiPath) -> &str {
        match p {
            ApiPath::Collection { resource, .. } | ApiPath::Object { resource, .. } => {
                resource.plural
            }
            _ => "",
        }
    }

    #[test]
    fn parses_the_kubernetes_url_grammar() {
        assert_eq!(parse("/api").unwrap(), ApiPath::CoreVersions);
        assert_eq!(parse("/apis").unwrap(), ApiPath::Groups);
        assert!(matches!(
            parse("/apis/apps/v1").unwrap(),
            ApiPath::ResourceList { .. }
        ));
        let p = parse("/api/v1/namespaces/default/pods").unwrap();
        assert!(matches!(&p, ApiPath::Collection { namespace: Some(ns), .. } if ns == "default"));
        assert_eq!(plural(&p), "pods");
        let p = parse("/api/v1/pods").unwrap();
        assert!(matches!(
            &p,
            ApiPath::Collection {
                namespace: None,
                ..
            }
        ));
        let p = parse("/api/v1/namespaces/default").unwrap();
        assert!(matches!(&p, ApiPath::Object { name, namespace: None, .. } if name == "default"));
        assert_eq!(plural(&p), "namespaces");
        let p = parse("/api/v1/namespaces/prod/pods/web/log").unwrap();
        assert!(
            matches!(&p, ApiPath::Object { subresource: Some(s), name, .. } if s == "log" && name == "web")
        );
        let p = parse("/apis/apps/v1/namespaces/default/deployments/web/scale").unwrap();
        assert_eq!(plural(&p), "deployments");
        assert!(matches!(
            parse("/api/v1/nodes/n1").unwrap(),
            ApiPath::Object { .. }
        ));
        assert!(matches!(
            parse("/api/v1/widgets"),
            Err(PathError::NoResource { .. })
        ));
        assert!(matches!(
            parse("/apis/nope/v1/things"),
            Err(PathError::NotFound(_))
        ));
        assert!(
            matches!(parse("/api/v1/pods/x"), Err(PathError::NotFound(_))),
            "namespaced object needs a namespace"
        );
    }
}

//! What scheduling decisions are made of: resources, nodes with labels and taints, and the
//! scheduling-relevant part of a pod spec (parsed from the pod object).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::quantity;

/// Requested or allocatable resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub pods: u64,
}

impl Resources {
    pub fn new(cpu_millis: u64, memory_bytes: u64, pods: u64) -> Self {
        Self {
            cpu_millis,
            memory_bytes,
            pods,
        }
    }

    pub fn plus(self, o: Self) -> Self {
        // Saturating: a pod spec's quantities are input, and a sum of them must never wrap
        // (or panic under the scheduler's lock).
        Self::new(
            self.cpu_millis.saturating_add(o.cpu_millis),
            self.memory_bytes.saturating_add(o.memory_bytes),
            self.pods.saturating_add(o.pods),
        )
    }

    pub fn minus(self, o: Self) -> Self {
        Self::new(
            self.cpu_millis.saturating_sub(o.cpu_millis),
            self.memory_bytes.saturating_sub(o.memory_bytes),
            self.pods.saturating_sub(o.pods),
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: TaintEffect,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toleration {
    pub key: Option<String>,
    /// `Exists` when true, else `Equal`.
    pub exists: bool,
    pub value: String,
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    pub fn tolerates(&self, t: &Taint) -> bool {
        self.effect.is_none_or(|e| e == t.effect)
            && match &self.key {
                None => self.exists,
                Some(k) => *k == t.key && (self.exists || self.value == t.value),
            }
    }
}

/// A node as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub id: u64,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub allocatable: Resources,
    /// What the node's volume provisioner may give out in all (none: not counted).
    pub volume_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

/// A label requirement (node affinity `matchExpressions`, label selectors).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    pub key: String,
    pub op: Operator,
    pub values: Vec<String>,
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.key);
        let num = |s: &str| s.parse::<i64>().ok();
        match self.op {
            Operator::In => v.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => v.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => v.is_some(),
            Operator::DoesNotExist => v.is_none(),
            Operator::Gt => {
                matches!((v.and_then(|v| num(v)), self.values.first().and_then(|x| num(x))), (Some(a), Some(b)) if a > b)
            }
            Operator::Lt => {
                matches!((v.and_then(|v| num(v)), self.values.first().and_then(|x| num(x))), (Some(a), Some(b)) if a < b)
            }
        }
    }
}

/// All requirements must hold (a node selector term, or a label selector).
pub type Term = Vec<Requirement>;

pub fn term_matches(term: &Term, labels: &BTreeMap<String, String>) -> bool {
    term.iter().all(|r| r.matches(labels))
}

/// A JSON map of strings (labels, annotations, `nodeSelector`) as a map; entries whose value
/// is not a string are left out.
pub fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

/// Whether the label selector `selector` (a `LabelSelector` object; absent or empty selects
/// everything) selects an object labelled `labels`. A malformed selector selects nothing.
pub fn selector_matches(selector: &Value, labels: &Value) -> bool {
    label_selector(selector).is_ok_and(|term| term_matches(&term, &string_map(labels)))
}

/// A pod affinity term: pods matching `selector`, in the namespaces `namespaces` names, in
/// the same `topology_key` domain (required anti-affinity: none may be there; required
/// affinity: one must; preferred: a score).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AntiAffinity {
    pub topology_key: String,
    pub selector: Term,
    /// Whose pods the term counts (the pod's own namespace when neither field is given).
    #[serde(default)]
    pub namespaces: Namespaces,
}

/// The namespaces a pod affinity term counts pods of, as upstream reads `namespaces` and
/// `namespaceSelector`: their union; the pod's own namespace when neither is given; every
/// namespace for `namespaceSelector: {}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespaces {
    /// `namespaces`, sorted and without repeats.
    pub names: Vec<String>,
    /// `namespaceSelector`, if given (an empty term selects every namespace).
    pub selector: Option<Term>,
}

impl Namespaces {
    /// Whether the pods of namespace `ns` (whose labels are `ns_labels`, if known) count for
    /// a term of a pod in namespace `own`. A selector with requirements matches a namespace
    /// only by its known labels.
    pub fn covers(
        &self,
        own: &str,
        ns: &str,
        ns_labels: Option<&BTreeMap<String, String>>,
    ) -> bool {
        if self.names.is_empty() && self.selector.is_none() {
            return ns == own;
        }
        self.names.iter().any(|n| n == ns)
            || match &self.selector {
                None => false,
                Some(term) if term.is_empty() => true,
                Some(term) => ns_labels.is_some_and(|labels| term_matches(term, labels)),
            }
    }
}

/// A Namespace object's labels as `namespaceSelector`s see them: its own, and
/// `kubernetes.io/metadata.name: <name>`, which upstream gives every namespace.
pub fn namespace_labels(namespace: &Value) -> BTreeMap<String, String> {
    let mut labels = string_map(&namespace["metadata"]["labels"]);
    if let Some(name) = namespace["metadata"]["name"].as_str() {
        labels.insert("kubernetes.io/metadata.name".to_owned(), name.to_owned());
    }
    labels
}

/// A pod affinity term's `namespaces` and `namespaceSelector`.
fn namespaces_of(term: &Value) -> Result<Namespaces, RequestError> {
    let mut names: Vec<String> = term["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    let selector = match &term["namespaceSelector"] {
        Value::Null => None,
        v => Some(parse_term(v)?),
    };
    Ok(Namespaces { names, selector })
}

/// A topology spread constraint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spread {
    pub topology_key: String,
    pub max_skew: u64,
    /// `DoNotSchedule` when true, `ScheduleAnyway` when false.
    pub hard: bool,
    pub selector: Term,
    /// `minDomains`: with fewer eligible domains than this, the global minimum is 0.
    #[serde(default)]
    pub min_domains: Option<u64>,
    /// `nodeAffinityPolicy: Honor` (upstream's default): only the nodes the pod's nodeSelector
    /// and required node affinity admit make the domains it spreads over; `Ignore`: every node.
    #[serde(default = "honor")]
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor`: nodes with a taint the pod does not tolerate are left out of
    /// the domains; `Ignore` (upstream's default): they count.
    #[serde(default)]
    pub honor_node_taints: bool,
}

/// A port of the node a pod's container asks for (`ports[].hostPort`), as the scheduler and
/// the kubelet key it: (hostIP, protocol, port), an empty or `0.0.0.0` hostIP meaning every
/// address of the node (`ip: None`), an empty protocol `TCP`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostPort {
    pub ip: Option<std::net::IpAddr>,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    pub port: u16,
}

impl HostPort {
    /// Upstream's `HostPortInfo.CheckConflict`: the same protocol and port, and the same
    /// address or either one every address (`0.0.0.0`; `::` is an address like any other).
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip.is_none() || other.ip.is_none() || self.ip == other.ip)
    }
}

/// Whether two pods' host ports could not both be served by one node.
pub fn host_ports_conflict(a: &[HostPort], b: &[HostPort]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.conflicts(y)))
}

/// The host ports of a pod spec: its containers' and its sidecars' (init containers with
/// `restartPolicy: Always`, which run beside them), as upstream's `GetHostPorts`. A hostIP
/// that is not an address is an error naming the field (the API refuses it first).
fn host_ports(spec: &Value) -> Result<Vec<HostPort>, RequestError> {
    let mut out: Vec<HostPort> = port_mappings(spec)?.into_iter().map(|(h, _)| h).collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// Each host port of a pod spec ([`host_ports`]' reading) with the container port it leads
/// to, in the spec's order: what the node's port mapping serves.
pub fn port_mappings(spec: &Value) -> Result<Vec<(HostPort, u16)>, RequestError> {
    let mut out = Vec::new();
    let sidecars = spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| c["restartPolicy"] == "Always")
        .map(|(i, c)| ("initContainers", i, c));
    let containers = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| ("containers", i, c));
    for (field, i, c) in containers.chain(sidecars) {
        for (j, p) in c["ports"].as_array().into_iter().flatten().enumerate() {
            let Some(port) = p["hostPort"]
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
            else {
                continue;
            };
            let ip = match p["hostIP"].as_str().unwrap_or_default() {
                "" | "0.0.0.0" => None,
                text => Some(text.parse().map_err(|_| RequestError::At {
                    field: format!("spec.{field}[{i}].ports[{j}].hostIP"),
                    source: Box::new(RequestError::Address(text.to_owned())),
                })?),
            };
            let container_port = p["containerPort"]
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .unwrap_or(port);
            out.push((
                HostPort {
                    ip,
                    protocol: p["protocol"].as_str().unwrap_or("TCP").to_owned(),
                    port,
                },
                container_port,
            ));
        }
    }
    Ok(out)
}

fn honor() -> bool {
    true
}

/// The scheduling-relevant part of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRequest {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub requests: Resources,
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity: any term may match (empty: no requirement).
    pub required_terms: Vec<Term>,
    pub preferred_terms: Vec<(i64, Term)>,
    pub tolerations: Vec<Toleration>,
    pub priority: i32,
    pub anti_affinity: Vec<AntiAffinity>,
    /// Required pod affinity: some pod matching `selector` in the same `topology_key` domain.
    #[serde(default)]
    pub affinity: Vec<AntiAffinity>,
    pub spread: Vec<Spread>,
    /// Preferred pod affinity (positive weight) and anti-affinity (negative weight).
    #[serde(default)]
    pub preferred_pod_terms: Vec<(i64, AntiAffinity)>,
    /// `spec.nodeName`: bound directly, no auction.
    pub node_name: Option<String>,
    /// The node ports its containers ask for (`hostPort`): exclusive on a node.
    #[serde(default)]
    pub host_ports: Vec<HostPort>,
    /// What its PersistentVolumeClaims allow ([`crate::storage::placement`]; the scheduler
    /// fills it in from the store: a pod spec alone cannot say it).
    #[serde(default)]
    pub volumes: crate::storage::Placement,
}

/// Why a pod's scheduling fields or a label selector cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Quantity(#[from] quantity::QuantityError),
    #[error("unsupported operator {0:?}")]
    Operator(String),
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// The error of one field of the pod.
    #[error("{field}: {source}")]
    At {
        field: String,
        source: Box<RequestError>,
    },
}

/// A Kubernetes label selector (`matchLabels`, `matchExpressions`) as a [`Term`].
pub fn label_selector(v: &Value) -> Result<Term, RequestError> {
    parse_term(v)
}

fn parse_term(v: &Value) -> Result<Term, RequestError> {
    let mut reqs = Vec::new();
    for (k, val) in v["matchLabels"].as_object().into_iter().flatten() {
        reqs.push(Requirement {
            key: k.clone(),
            op: Operator::In,
            values: vec![val.as_str().unwrap_or_default().to_owned()],
        });
    }
    for e in v["matchExpressions"].as_array().into_iter().flatten() {
        let op = match e["operator"].as_str().unwrap_or("") {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            other => return Err(RequestError::Operator(other.to_owned())),
        };
        reqs.push(Requirement {
            key: e["key"].as_str().unwrap_or_default().to_owned(),
            op,
            values: e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect(),
        });
    }
    Ok(reqs)
}

/// A pod affinity term's selector as upstream reads it: its `labelSelector`, and for each key
/// of `matchLabelKeys` (`mismatchLabelKeys`) that the pod itself carries, that key `In`
/// (`NotIn`) the pod's own value — so `matchLabelKeys: [pod-template-hash]` counts only the
/// pods of the same revision. Keys the pod does not carry are ignored, as upstream.
fn affinity_selector(
    term: &Value,
    own_labels: &BTreeMap<String, String>,
) -> Result<Term, RequestError> {
    let selector = parse_term(&term["labelSelector"])?;
    let selector = with_label_keys(selector, &term["matchLabelKeys"], Operator::In, own_labels);
    Ok(with_label_keys(
        selector,
        &term["mismatchLabelKeys"],
        Operator::NotIn,
        own_labels,
    ))
}

/// `selector` and, for each key in `keys` that `own_labels` has, `key op (own value)`.
fn with_label_keys(
    mut selector: Term,
    keys: &Value,
    op: Operator,
    own_labels: &BTreeMap<String, String>,
) -> Term {
    for key in keys
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if let Some(value) = own_labels.get(key) {
            selector.push(Requirement {
                key: key.to_owned(),
                op,
                values: vec![value.clone()],
            });
        }
    }
    selector
}

fn parse_effect(s: &str) -> Option<TaintEffect> {
    match s {
        "NoSchedule" => Some(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Some(TaintEffect::PreferNoSchedule),
        "NoExecute" => Some(TaintEffect::NoExecute),
        _ => None,
    }
}

impl PodRequest {
    /// Reads a Pod object. Requests are summed over containers (init containers: the max, as
    /// Kubernetes does); a pod always counts as one against `pods`.
    pub fn from_pod(pod: &Value) -> Result<Self, RequestError> {
        let spec = &pod["spec"];
        let mut requests = Resources::new(0, 0, 1);
        // As Kubernetes defaults them: a resource with a limit and no request requests its
        // limit (the kubelet sizes the container's cgroup from the same value).
        let container_requests = |c: &Value| -> Result<(u64, u64), RequestError> {
            let resources = &c["resources"];
            let amount = |name: &str| {
                let requested = &resources["requests"][name];
                if requested.is_null() {
                    &resources["limits"][name]
                } else {
                    requested
                }
            };
            let cpu = amount("cpu")
                .as_str()
                .map(quantity::cpu_millis)
                .transpose()?
                .unwrap_or(0);
            let mem = amount("memory")
                .as_str()
                .map(quantity::bytes)
                .transpose()?
                .unwrap_or(0);
            Ok((cpu, mem))
        };
        for c in spec["containers"].as_array().into_iter().flatten() {
            let (cpu, mem) = container_requests(c)?;
            requests.cpu_millis = requests.cpu_millis.saturating_add(cpu);
            requests.memory_bytes = requests.memory_bytes.saturating_add(mem);
        }
        for c in spec["initContainers"].as_array().into_iter().flatten() {
            let (cpu, mem) = container_requests(c)?;
            requests.cpu_millis = requests.cpu_millis.max(cpu);
            requests.memory_bytes = requests.memory_bytes.max(mem);
        }
        let affinity = &spec["affinity"];
        let node_affinity = &affinity["nodeAffinity"];
        let required_terms =
            node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                .as_array()
                .into_iter()
                .flatten()
                .map(parse_term)
                .collect::<Result<_, _>>()?;
        let preferred_terms = node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                Ok((
                    // Kubernetes allows 1..=100; clamped so sums of weights cannot overflow.
                    p["weight"].as_i64().unwrap_or(1).clamp(1, 100),
                    parse_term(&p["preference"])?,
                ))
            })
            .collect::<Result<_, RequestError>>()?;
        let own_labels = string_map(&pod["metadata"]["labels"]);
        let pod_terms = |field: &str| -> Result<Vec<AntiAffinity>, RequestError> {
            affinity[field]["requiredDuringSchedulingIgnoredDuringExecution"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    Ok(AntiAffinity {
                        topology_key: t["topologyKey"]
                            .as_str()
                            .unwrap_or("kubernetes.io/hostname")
                            .to_owned(),
                        selector: affinity_selector(t, &own_labels)?,
                        namespaces: namespaces_of(t)?,
                    })
                })
                .collect()
        };
        let anti_affinity = pod_terms("podAntiAffinity")?;
        let pod_affinity = pod_terms("podAffinity")?;
        let mut preferred_pod_terms = Vec::new();
        for (field, sign) in [("podAffinity", 1), ("podAntiAffinity", -1)] {
            for (i, t) in affinity[field]["preferredDuringSchedulingIgnoredDuringExecution"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let weight = t["weight"].as_i64().unwrap_or(1).clamp(1, 100);
                let term = &t["podAffinityTerm"];
                let at = |e: RequestError| RequestError::At {
                    field: format!(
                        "spec.affinity.{field}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
                    ),
                    source: Box::new(e),
                };
                let selector = affinity_selector(term, &own_labels).map_err(at)?;
                let namespaces = namespaces_of(term).map_err(at)?;
                preferred_pod_terms.push((
                    sign * weight,
                    AntiAffinity {
                        topology_key: term["topologyKey"]
                            .as_str()
                            .unwrap_or("kubernetes.io/hostname")
                            .to_owned(),
                        selector,
                        namespaces,
                    },
                ));
            }
        }
        let spread = spec["topologySpreadConstraints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                Ok(Spread {
                    topology_key: t["topologyKey"]
                        .as_str()
                        .unwrap_or("kubernetes.io/hostname")
                        .to_owned(),
                    max_skew: t["maxSkew"].as_u64().unwrap_or(1).max(1),
                    hard: t["whenUnsatisfiable"].as_str() != Some("ScheduleAnyway"),
                    selector: with_label_keys(
                        parse_term(&t["labelSelector"])?,
                        &t["matchLabelKeys"],
                        Operator::In,
                        &own_labels,
                    ),
                    min_domains: t["minDomains"].as_u64().filter(|m| *m > 0),
                    honor_node_affinity: t["nodeAffinityPolicy"].as_str() != Some("Ignore"),
                    honor_node_taints: t["nodeTaintsPolicy"].as_str() == Some("Honor"),
                })
            })
            .collect::<Result<_, RequestError>>()?;
        let tolerations = spec["tolerations"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| Toleration {
                key: t["key"]
                    .as_str()
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned),
                exists: t["operator"].as_str() == Some("Exists"),
                value: t["value"].as_str().unwrap_or_default().to_owned(),
                effect: t["effect"].as_str().and_then(parse_effect),
            })
            .collect();
        Ok(Self {
            uid: pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            namespace: pod["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned(),
            name: pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            labels: string_map(&pod["metadata"]["labels"]),
            requests,
            node_selector: string_map(&spec["nodeSelector"]),
            required_terms,
            preferred_terms,
            tolerations,
            priority: spec["priority"].as_i64().unwrap_or(0) as i32,
            anti_affinity,
            affinity: pod_affinity,
            spread,
            preferred_pod_terms,
            node_name: spec["nodeName"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(str::to_owned),
            host_ports: host_ports(spec)?,
            volumes: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// `matchLabelKeys` narrows a term to the pods that share the incoming pod's values (one
    /// revision of a Deployment), `mismatchLabelKeys` to those that do not; keys the pod does
    /// not carry are ignored, as upstream.
    #[test]
    fn host_ports_are_read_as_upstream_keys_them() {
        let pod = json!({"spec": {
            "initContainers": [
                {"name": "init", "ports": [{"containerPort": 1, "hostPort": 1}]},
                {"name": "side", "restartPolicy": "Always", "ports": [{"containerPort": 2, "hostPort": 2, "protocol": "UDP"}]}],
            "containers": [{"name": "c", "ports": [
                {"containerPort": 80},
                {"containerPort": 80, "hostPort": 8080},
                {"containerPort": 80, "hostPort": 8080, "hostIP": "0.0.0.0"},
                {"containerPort": 443, "hostPort": 8443, "hostIP": "10.1.2.3"}]}]}});
        let got = PodRequest::from_pod(&pod).unwrap().host_ports;
        let port = |ip: Option<&str>, protocol: &str, port| HostPort {
            ip: ip.map(|i| i.parse().unwrap()),
            protocol: protocol.into(),
            port,
        };
        assert_eq!(
            got,
            [
                port(None, "TCP", 8080),
                port(None, "UDP", 2),
                port(Some("10.1.2.3"), "TCP", 8443)
            ]
        );
        let bad = json!({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80, "hostIP": "nope"}]}]}});
        assert_eq!(
            PodRequest::from_pod(&bad).unwrap_err().to_string(),
            "spec.containers[0].ports[0].hostIP: \"nope\" is not an IP address"
        );
        let v4 = port(Some("10.0.0.1"), "TCP", 80);
        assert!(v4.conflicts(&port(None, "TCP", 80)));
        assert!(!v4.conflicts(&port(Some("10.0.0.2"), "TCP", 80)));
        assert!(!v4.conflicts(&port(Some("10.0.0.1"), "UDP", 80)));
        assert!(
            !v4.conflicts(&port(Some("::"), "TCP", 80)),
            ":: is no wildcard upstream"
        );
    }

    #[test]
    fn match_and_mismatch_label_keys_merge_the_pod_s_own_values() {
        let pod = PodRequest::from_pod(&json!({
            "metadata": {"name": "web-1", "uid": "u1", "namespace": "default",
                         "labels": {"app": "web", "pod-template-hash": "v2", "tenant": "a"}},
            "spec": {"containers": [], "affinity": {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "web"}},
                    "matchLabelKeys": ["pod-template-hash", "absent"]}]},
                "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 10, "podAffinityTerm": {
                        "topologyKey": "zone",
                        "labelSelector": {"matchLabels": {"app": "web"}},
                        "mismatchLabelKeys": ["tenant"]}}]}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                    "labelSelector": {"matchLabels": {"app": "web"}},
                    "matchLabelKeys": ["pod-template-hash"]}]}
        }))
        .unwrap();
        let anti = &pod.anti_affinity[0].selector;
        assert!(term_matches(
            anti,
            &labels(&[("app", "web"), ("pod-template-hash", "v2")])
        ));
        assert!(
            !term_matches(
                anti,
                &labels(&[("app", "web"), ("pod-template-hash", "v1")])
            ),
            "the old revision's pods do not repel the new one's"
        );
        assert_eq!(anti.len(), 2, "the absent key adds nothing: {anti:?}");
        let preferred = &pod.preferred_pod_terms[0].1.selector;
        assert!(term_matches(
            preferred,
            &labels(&[("app", "web"), ("tenant", "b")])
        ));
        assert!(!term_matches(
            preferred,
            &labels(&[("app", "web"), ("tenant", "a")])
        ));
        let spread = &pod.spread[0].selector;
        assert!(!term_matches(
            spread,
            &labels(&[("app", "web"), ("pod-template-hash", "v1")])
        ));
        assert!(term_matches(
            spread,
            &labels(&[("app", "web"), ("pod-template-hash", "v2")])
        ));
    }
}

//! Whether a node can take a pod (a node decides this for itself), and how much it wants it.
//!
//! Decline reasons use kube-scheduler's wording, so the summary a user sees in `PodScheduled`
//! reads like Kubernetes': `0/5 nodes are available: 3 Insufficient memory, 2 node(s) didn't
//! match Pod's node affinity/selector.`

use std::collections::BTreeMap;

use super::cluster::ClusterView;
use shoal_model::placement::{NodeView, PodRequest, Resources, TaintEffect, term_matches};

/// Why a node declines a pod.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Decline {
    NodeAffinity,
    Taint {
        key: String,
        value: String,
    },
    InsufficientCpu,
    InsufficientMemory,
    TooManyPods,
    AntiAffinity,
    Affinity,
    Spread,
    HostPorts,
    /// Its claim's volume is pinned to another node.
    VolumeNodeAffinity,
    /// Its claims let it run nowhere yet (kube-scheduler's words for why).
    Volume(String),
    /// Its unbound claims ask for more volume bytes than the node can still provision.
    InsufficientStorage(u64),
}

impl std::fmt::Display for Decline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Decline::NodeAffinity => {
                f.write_str("node(s) didn't match Pod's node affinity/selector")
            }
            Decline::Taint { key, value } => {
                write!(f, "node(s) had untolerated taint {{{key}: {value}}}")
            }
            Decline::InsufficientCpu => f.write_str("Insufficient cpu"),
            Decline::InsufficientMemory => f.write_str("Insufficient memory"),
            Decline::TooManyPods => f.write_str("Too many pods"),
            Decline::AntiAffinity => f.write_str("node(s) didn't match pod anti-affinity rules"),
            Decline::Affinity => f.write_str("node(s) didn't match pod affinity rules"),
            Decline::Spread => f.write_str("node(s) didn't match pod topology spread constraints"),
            Decline::HostPorts => {
                f.write_str("node(s) didn't have free ports for the requested pod ports")
            }
            Decline::VolumeNodeAffinity => f.write_str("node(s) had volume node affinity conflict"),
            Decline::Volume(reason) => f.write_str(reason),
            Decline::InsufficientStorage(asked) => write!(
                f,
                "node(s) did not have enough free storage (the pod's claims ask for {})",
                shoal_model::quantity::format_bytes(*asked)
            ),
        }
    }
}

/// kube-scheduler's summary of why no node took a pod.
pub fn summarize(nodes: usize, declines: &[Decline]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for d in declines {
        *counts.entry(d.to_string()).or_default() += 1;
    }
    let reasons: Vec<String> = counts
        .into_iter()
        .map(|(r, n)| format!("{n} {r}"))
        .collect();
    if reasons.is_empty() {
        format!("0/{nodes} nodes are available.")
    } else {
        format!("0/{nodes} nodes are available: {}.", reasons.join(", "))
    }
}

/// The node-local checks. `used` is what the node has allocated plus its tentative reservations.
pub fn check(
    pod: &PodRequest,
    node: &NodeView,
    used: Resources,
    cluster: &ClusterView,
) -> Result<(), Decline> {
    if let Some(reason) = &pod.volumes.blocked {
        return Err(Decline::Volume(reason.clone()));
    }
    if pod.volumes.node.as_ref().is_some_and(|n| *n != node.name) {
        return Err(Decline::VolumeNodeAffinity);
    }
    let asked = pod.volumes.provision_bytes;
    if asked > 0
        && cluster
            .volume_free(node.id)
            .is_some_and(|free| asked > free)
    {
        return Err(Decline::InsufficientStorage(asked));
    }
    if !admits_by_affinity(pod, node) {
        return Err(Decline::NodeAffinity);
    }
    if let Some(t) = untolerated(pod, node) {
        return Err(Decline::Taint {
            key: t.key.clone(),
            value: t.value.clone(),
        });
    }
    let after = used.plus(pod.requests);
    if after.cpu_millis > node.allocatable.cpu_millis && pod.requests.cpu_millis > 0 {
        return Err(Decline::InsufficientCpu);
    }
    if after.memory_bytes > node.allocatable.memory_bytes && pod.requests.memory_bytes > 0 {
        return Err(Decline::InsufficientMemory);
    }
    if after.pods > node.allocatable.pods {
        return Err(Decline::TooManyPods);
    }
    if cluster.host_ports_taken(node.id, pod) {
        return Err(Decline::HostPorts);
    }
    topology(pod, node, cluster)
}

/// Whether `pod` has a hard constraint whose domain is wider than one node: required pod
/// affinity or anti-affinity over a topology key other than the hostname, or a
/// `DoNotSchedule` spread (over any key: its skew compares every domain). No node can check
/// such a constraint alone; the auction serializes the pods that have one (their auctioneer
/// is chosen by the constraint, [`super::auction::auction_key`]).
pub fn has_wide_constraint(pod: &PodRequest) -> bool {
    pod.anti_affinity
        .iter()
        .chain(&pod.affinity)
        .any(|t| t.topology_key != HOSTNAME)
        || pod.spread.iter().any(|s| s.hard)
}

/// The hard topology checks of [`check`] alone — required pod anti-affinity (both ways),
/// required pod affinity, `DoNotSchedule` spread — against `cluster` as it is: what an
/// auctioneer checks again against its own view before it binds a pod with a wide constraint.
pub fn topology(pod: &PodRequest, node: &NodeView, cluster: &ClusterView) -> Result<(), Decline> {
    for anti in &pod.anti_affinity {
        if let Some(domain) = node.labels.get(&anti.topology_key)
            && cluster.matching_term_in_domain(anti, domain, &pod.namespace) > 0
        {
            return Err(Decline::AntiAffinity);
        }
    }
    // Upstream's symmetry: a pod already in one of the node's domains whose required
    // anti-affinity matches this pod keeps it out too.
    if cluster.repelled(node, pod) {
        return Err(Decline::AntiAffinity);
    }
    for term in &pod.affinity {
        let here = node.labels.get(&term.topology_key).map_or(0, |d| {
            cluster.matching_term_in_domain(term, d, &pod.namespace)
        });
        // As in Kubernetes: the first pod of a group that matches its own selector may go
        // anywhere, or it could never be placed.
        let first_of_its_kind = shoal_model::placement::term_matches(&term.selector, &pod.labels)
            && !cluster.any_matching_term(term, &pod.namespace);
        if here == 0 && !first_of_its_kind {
            return Err(Decline::Affinity);
        }
    }
    for spread in pod.spread.iter().filter(|s| s.hard) {
        let Some(domain) = node.labels.get(&spread.topology_key) else {
            return Err(Decline::Spread);
        };
        let here = cluster.matching_in_domain(
            &spread.topology_key,
            domain,
            &pod.namespace,
            &spread.selector,
        );
        let min = match eligible_domains(pod, spread, cluster) {
            None if below_min_domains(spread, cluster.domain_count(&spread.topology_key)) => 0,
            None => cluster.min_in_domains(&spread.topology_key, &pod.namespace, &spread.selector),
            Some(eligible) if below_min_domains(spread, eligible.len()) => 0,
            Some(eligible) => eligible
                .iter()
                .map(|d| {
                    cluster.matching_in_domain(
                        &spread.topology_key,
                        d,
                        &pod.namespace,
                        &spread.selector,
                    )
                })
                .min()
                .unwrap_or(0),
        };
        if here.saturating_add(1) > min.saturating_add(spread.max_skew) {
            return Err(Decline::Spread);
        }
    }
    Ok(())
}

/// Whether `node`'s labels and taints admit `pod` (nodeSelector, required node affinity,
/// taints): what no placement elsewhere can change.
pub fn admits(pod: &PodRequest, node: &NodeView) -> bool {
    admits_by_affinity(pod, node) && untolerated(pod, node).is_none()
}

/// Whether `node` passes `pod`'s nodeSelector and required node affinity.
fn admits_by_affinity(pod: &PodRequest, node: &NodeView) -> bool {
    pod.node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
        && (pod.required_terms.is_empty()
            || pod
                .required_terms
                .iter()
                .any(|t| term_matches(t, &node.labels)))
}

/// A taint of `node` that keeps `pod` off (`NoSchedule`, `NoExecute`), if any.
fn untolerated<'a>(
    pod: &PodRequest,
    node: &'a NodeView,
) -> Option<&'a shoal_model::placement::Taint> {
    node.taints.iter().find(|t| {
        t.effect != TaintEffect::PreferNoSchedule
            && !pod.tolerations.iter().any(|tol| tol.tolerates(t))
    })
}

/// The domains a spread constraint spreads `pod` over, as upstream's `nodeAffinityPolicy`
/// and `nodeTaintsPolicy` choose them: those of the nodes the pod's node affinity admits
/// (`Honor`, the default) and, with taints honoured, whose taints it tolerates. `None` when
/// every node counts (no node is left out): the counted fast path.
fn eligible_domains(
    pod: &PodRequest,
    spread: &shoal_model::placement::Spread,
    cluster: &ClusterView,
) -> Option<std::collections::BTreeSet<String>> {
    let by_affinity = spread.honor_node_affinity
        && (!pod.node_selector.is_empty() || !pod.required_terms.is_empty());
    let by_taints = spread.honor_node_taints;
    if !by_affinity && !by_taints {
        return None;
    }
    let eligible = cluster
        .nodes()
        .filter(|n| !by_affinity || admits_by_affinity(pod, n))
        .filter(|n| !by_taints || untolerated(pod, n).is_none())
        .filter_map(|n| n.labels.get(&spread.topology_key).cloned())
        .collect();
    Some(eligible)
}

/// Upstream's `minDomains`: with fewer eligible domains than it asks, the global minimum is 0.
fn below_min_domains(spread: &shoal_model::placement::Spread, domains: usize) -> bool {
    spread.min_domains.is_some_and(|m| (domains as u64) < m)
}

/// What `placed` (pods an auctioneer's batch already gave to nodes, which no bidder's view
/// holds yet) changes for `pod` on `node`: a host port one of them holds there, a required
/// anti-affinity, either way, between it and one of them in a shared domain, or a
/// `DoNotSchedule` spread the node would break once they count. The bidder checked everything else ([`check`]); the auctioneer calls this before it
/// gives the pod a node, so one batch never breaks a hard constraint the bidders would have
/// held.
pub fn batch_conflict(
    pod: &PodRequest,
    node: &NodeView,
    placed: &[(&NodeView, &PodRequest)],
    cluster: &ClusterView,
) -> Option<Decline> {
    let same_domain = |other: &NodeView, key: &str| {
        node.labels
            .get(key)
            .is_some_and(|d| other.labels.get(key) == Some(d))
    };
    // Whether `by`'s anti-affinity term counts `other` (its namespace and labels).
    let counts = |by: &PodRequest, t: &shoal_model::placement::AntiAffinity, other: &PodRequest| {
        t.namespaces.covers(
            &by.namespace,
            &other.namespace,
            cluster.namespace_labels(&other.namespace),
        ) && term_matches(&t.selector, &other.labels)
    };
    // Volume room: what this batch gave the node to provision counts against it.
    let asked = pod.volumes.provision_bytes;
    if asked > 0
        && let Some(free) = cluster.volume_free(node.id)
    {
        let given: u64 = placed
            .iter()
            .filter(|(n, other)| n.id == node.id && other.uid != pod.uid)
            .fold(0, |sum, (_, other)| {
                sum.saturating_add(other.volumes.provision_bytes)
            });
        if asked.saturating_add(given) > free {
            return Some(Decline::InsufficientStorage(asked));
        }
    }
    for (other_node, other) in placed {
        if other.uid == pod.uid {
            continue;
        }
        if other_node.id == node.id
            && shoal_model::placement::host_ports_conflict(&pod.host_ports, &other.host_ports)
        {
            return Some(Decline::HostPorts);
        }
        let repels = pod
            .anti_affinity
            .iter()
            .any(|t| same_domain(other_node, &t.topology_key) && counts(pod, t, other))
            || other
                .anti_affinity
                .iter()
                .any(|t| same_domain(other_node, &t.topology_key) && counts(other, t, pod));
        if repels {
            return Some(Decline::AntiAffinity);
        }
    }
    // Required affinity: a batch pod the term counts, elsewhere, where the view has none in
    // this node's domain, means the pod goes with it or not here (the first of a self-affine
    // group may go anywhere, [`topology`]; the second must follow it, also within one batch).
    for term in &pod.affinity {
        let domain = node.labels.get(&term.topology_key);
        let in_view = domain.map_or(0, |d| {
            cluster.matching_term_in_domain(term, d, &pod.namespace)
        });
        let mut counted = placed
            .iter()
            .filter(|(_, other)| other.uid != pod.uid && counts(pod, term, other))
            .peekable();
        if in_view == 0
            && counted.peek().is_some()
            && !counted.any(|(other_node, _)| same_domain(other_node, &term.topology_key))
        {
            return Some(Decline::Affinity);
        }
    }
    for spread in pod.spread.iter().filter(|s| s.hard) {
        let matching: Vec<&String> = placed
            .iter()
            .filter(|(_, q)| {
                q.namespace == pod.namespace && term_matches(&spread.selector, &q.labels)
            })
            .filter_map(|(n, _)| n.labels.get(&spread.topology_key))
            .collect();
        if matching.is_empty() {
            continue;
        }
        let Some(domain) = node.labels.get(&spread.topology_key) else {
            return Some(Decline::Spread);
        };
        let count = |d: &String| {
            cluster.matching_in_domain(&spread.topology_key, d, &pod.namespace, &spread.selector)
                + matching.iter().filter(|m| **m == d).count() as u64
        };
        let domains: Vec<String> = match eligible_domains(pod, spread, cluster) {
            Some(eligible) => eligible.into_iter().collect(),
            None => cluster.domains_of(&spread.topology_key),
        };
        let min = if below_min_domains(spread, domains.len()) {
            0
        } else {
            domains.iter().map(count).min().unwrap_or(0)
        };
        if count(domain).saturating_add(1) > min.saturating_add(spread.max_skew) {
            return Some(Decline::Spread);
        }
    }
    None
}

/// The topology key whose domains are single nodes.
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// The node's own check when a pod bound to it arrives (the kubelet's admission, and the
/// simulator's): the pod already here that `pod`'s required anti-affinity on [`HOSTNAME`]
/// counts (its namespaces and selector), or whose own such term counts `pod` (upstream's
/// symmetry). `namespace_labels` gives a namespace's labels for `namespaceSelector`s. Two
/// auctions bind without seeing each other; the node sees both.
pub fn hostname_conflict<'a>(
    pod: &PodRequest,
    here: impl IntoIterator<Item = &'a PodRequest>,
    namespace_labels: &dyn Fn(&str) -> Option<BTreeMap<String, String>>,
) -> Option<&'a PodRequest> {
    let repels = |by: &PodRequest,
                  terms: &mut dyn Iterator<Item = &shoal_model::placement::AntiAffinity>,
                  other: &PodRequest| {
        for t in terms {
            // A namespace's labels are looked up only for a selector that reads them.
            let labels = match &t.namespaces.selector {
                Some(selector) if !selector.is_empty() => namespace_labels(&other.namespace),
                _ => None,
            };
            if term_matches(&t.selector, &other.labels)
                && t.namespaces
                    .covers(&by.namespace, &other.namespace, labels.as_ref())
            {
                return true;
            }
        }
        false
    };
    let on_hostname = |t: &&shoal_model::placement::AntiAffinity| t.topology_key == HOSTNAME;
    // The pod's own terms, picked once for every pod here.
    let mine: Vec<&shoal_model::placement::AntiAffinity> =
        pod.anti_affinity.iter().filter(on_hostname).collect();
    here.into_iter().find(|other| {
        other.uid != pod.uid
            && (repels(pod, &mut mine.iter().copied(), other)
                || repels(
                    other,
                    &mut other.anti_affinity.iter().filter(on_hostname),
                    pod,
                ))
    })
}

/// The node's other own check ([`hostname_conflict`]'s companion): the pod already here that
/// holds a host port `pod` asks for (upstream's kubelet admission `NodePorts`, which refuses
/// any pod, however it was bound).
pub fn host_port_conflict<'a>(
    pod: &PodRequest,
    here: impl IntoIterator<Item = &'a PodRequest>,
) -> Option<&'a PodRequest> {
    if pod.host_ports.is_empty() {
        return None;
    }
    here.into_iter().find(|other| {
        other.uid != pod.uid
            && shoal_model::placement::host_ports_conflict(&pod.host_ports, &other.host_ports)
    })
}

/// Weights of the score components (each component is 0..=100).
pub const WEIGHT_LEAST_ALLOCATED: i64 = 4;
pub const WEIGHT_BALANCED: i64 = 2;
pub const WEIGHT_PREFERRED_AFFINITY: i64 = 2;
pub const WEIGHT_SPREAD: i64 = 2;
pub const PENALTY_PREFER_NO_SCHEDULE: i64 = 100;

/// How much a node wants a pod:
/// `4·least_allocated + 2·balanced + 2·(preferred_affinity + preferred_pod_affinity) +
/// 2·spread − 100·[PreferNoSchedule]`, where least_allocated is the mean free fraction of cpu
/// and memory after placing the pod, balanced is 1 − |cpu fraction − memory fraction|,
/// preferred_affinity the matched share of preferred node-affinity weights (0..=100),
/// preferred_pod_affinity the signed share of preferred pod affinity (+) and anti-affinity (−)
/// weights whose pods are in the node's domain (−100..=100), and spread favours domains with
/// fewer pods of the same constraint.
pub fn score(pod: &PodRequest, node: &NodeView, used: Resources, cluster: &ClusterView) -> i64 {
    let after = used.plus(pod.requests);
    let frac = |u: u64, cap: u64| {
        if cap == 0 {
            1.0
        } else {
            (u as f64 / cap as f64).min(1.0)
        }
    };
    let cpu = frac(after.cpu_millis, node.allocatable.cpu_millis);
    let mem = frac(after.memory_bytes, node.allocatable.memory_bytes);
    let least = ((2.0 - cpu - mem) / 2.0 * 100.0) as i64;
    let balanced = ((1.0 - (cpu - mem).abs()) * 100.0) as i64;
    let total_weight: i64 = pod.preferred_terms.iter().map(|(w, _)| *w).sum();
    let preferred = if total_weight == 0 {
        0
    } else {
        pod.preferred_terms
            .iter()
            .filter(|(_, t)| term_matches(t, &node.labels))
            .map(|(w, _)| *w)
            .sum::<i64>()
            * 100
            / total_weight
    };
    let spread = pod
        .spread
        .iter()
        .map(|s| {
            let here = node.labels.get(&s.topology_key).map_or(0, |d| {
                cluster.matching_in_domain(&s.topology_key, d, &pod.namespace, &s.selector)
            });
            100 / (1 + here as i64)
        })
        .sum::<i64>()
        / pod.spread.len().max(1) as i64;
    // Preferred pod (anti-)affinity: the weights of the terms with a matching pod in this
    // node's domain, over all weights, in [-100, 100].
    let pod_weights: i64 = pod.preferred_pod_terms.iter().map(|(w, _)| w.abs()).sum();
    let pod_preferred = if pod_weights == 0 {
        0
    } else {
        pod.preferred_pod_terms
            .iter()
            .filter(|(_, t)| {
                node.labels
                    .get(&t.topology_key)
                    .is_some_and(|d| cluster.matching_term_in_domain(t, d, &pod.namespace) > 0)
            })
            .map(|(w, _)| *w)
            .sum::<i64>()
            * 100
            / pod_weights
    };
    let penalty = if node.taints.iter().any(|t| {
        t.effect == TaintEffect::PreferNoSchedule
            && !pod.tolerations.iter().any(|tol| tol.tolerates(t))
    }) {
        PENALTY_PREFER_NO_SCHEDULE
    } else {
        0
    };
    WEIGHT_LEAST_ALLOCATED * least
        + WEIGHT_BALANCED * balanced
        + WEIGHT_PREFERRED_AFFINITY * (preferred + pod_preferred)
        + WEIGHT_SPREAD * spread
        - penalty
}

/// The deterministic tie-break between equal scores: a hash of (pod uid, node id). Also the
/// rendezvous hash of auctioneers and bidder samples, so it must mix well: FNV-1a alone left
/// the node id's bytes (hashed last) so weakly mixed that every auction sampled nearly the same
/// nodes; murmur3's finalizer fixes that.
pub fn tie_break(pod_uid: &str, node: u64) -> u64 {
    tie_break_hashed(key_hash(pod_uid), node)
}

/// The part of [`tie_break`] that depends on the key alone (FNV-1a of its bytes): computed
/// once, it makes hashing one key against many nodes cost O(key + nodes), not O(key × nodes)
/// (a wide constraint's auction key is ~90 bytes, against every live node).
pub fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// [`tie_break`] of a key whose [`key_hash`] is `h`: mixes in the node (fmix64).
pub fn tie_break_hashed(h: u64, node: u64) -> u64 {
    let mut h = h ^ node.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use shoal_model::placement::{Taint, TaintEffect};

    fn node(id: u64, labels: &[(&str, &str)], cpu: u64, mem_gib: u64) -> NodeView {
        let mut l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        l.insert("kubernetes.io/hostname".into(), format!("n{id}"));
        NodeView {
            id,
            name: format!("n{id}"),
            labels: l,
            taints: vec![],
            allocatable: Resources::new(cpu, mem_gib << 30, 110),
            volume_bytes: None,
        }
    }

    /// A pod whose unbound claims the taker provisions needs that much volume room on the
    /// node: its capacity minus its volumes (from the store) minus the claims of pods placed
    /// there not bound yet, and minus what the same batch gave it. A node that does not say
    /// its capacity is not counted.
    #[test]
    fn volume_capacity_counts_given_volumes_coming_claims_and_the_batch() {
        let mut cluster = ClusterView::default();
        for id in 1..=3 {
            let mut n = node(id, &[], 4000, 8);
            n.volume_bytes = (id != 3).then_some(10 << 30);
            cluster.add_node(n);
        }
        cluster.set_volumes_given([("n1".to_owned(), 6u64 << 30)].into());
        let claiming = |uid: &str, gib: u64| {
            let mut p = pod(json!({"containers": []}));
            p.uid = uid.into();
            p.volumes.provision_bytes = gib << 30;
            p
        };
        let at = |p: &PodRequest, id: u64, c: &ClusterView| {
            check(p, c.node(id).unwrap(), Resources::default(), c)
        };
        let five = claiming("five", 5);
        assert_eq!(
            at(&five, 1, &cluster),
            Err(Decline::InsufficientStorage(5 << 30))
        );
        assert_eq!(at(&five, 2, &cluster), Ok(()));
        assert_eq!(
            at(&claiming("big", 1 << 20), 3, &cluster),
            Ok(()),
            "not counted"
        );
        assert_eq!(cluster.volume_free(1), Some(4 << 30));
        assert_eq!(cluster.volume_free(3), None);
        // A pod placed on n2 whose claim is not bound yet takes its room there.
        cluster.place(2, &claiming("placed", 6));
        assert_eq!(
            at(&five, 2, &cluster),
            Err(Decline::InsufficientStorage(5 << 30))
        );
        cluster.unplace(2, &claiming("placed", 6));
        assert_eq!(at(&five, 2, &cluster), Ok(()));
        // Within one batch: n2 fits one five, not two.
        let other = claiming("other", 5);
        let n2 = cluster.node(2).unwrap().clone();
        assert_eq!(batch_conflict(&five, &n2, &[(&n2, &other)], &cluster), None);
        let third = claiming("third", 1);
        assert_eq!(
            batch_conflict(&five, &n2, &[(&n2, &other), (&n2, &third)], &cluster),
            Some(Decline::InsufficientStorage(5 << 30))
        );
        assert_eq!(
            summarize(3, &[Decline::InsufficientStorage(5 << 30)]),
            "0/3 nodes are available: 1 node(s) did not have enough free storage (the pod's claims ask for 5Gi)."
        );
    }

    fn pod(spec: serde_json::Value) -> PodRequest {
        PodRequest::from_pod(&json!({"metadata": {"name": "p", "uid": "u1", "namespace": "default", "labels": {"app": "web"}}, "spec": spec})).unwrap()
    }

    /// Upstream's symmetry: a placed pod's required anti-affinity keeps matching pods out of
    /// its domain although they carry no terms themselves; other namespaces and other domains
    /// are not concerned, and the term leaves with its pod.
    #[test]
    fn a_placed_pod_s_anti_affinity_repels_matching_newcomers() {
        let mut cluster = ClusterView::default();
        for (id, zone) in [(1, "a"), (2, "a"), (3, "b")] {
            cluster.add_node(node(id, &[("topology.kubernetes.io/zone", zone)], 4000, 8));
        }
        let db = PodRequest::from_pod(&json!({"metadata": {"name": "db", "uid": "db", "namespace": "default", "labels": {"app": "db"}},
            "spec": {"containers": [], "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "cache"}}}]}}}}))
        .unwrap();
        cluster.place(1, &db);
        let cache = |namespace: &str| {
            PodRequest::from_pod(&json!({"metadata": {"name": "c", "uid": "c", "namespace": namespace, "labels": {"app": "cache"}},
                "spec": {"containers": []}}))
            .unwrap()
        };
        let at = |pod: &PodRequest, id: u64, cluster: &ClusterView| {
            check(
                pod,
                cluster.node(id).unwrap(),
                Resources::default(),
                cluster,
            )
        };
        assert_eq!(
            at(&cache("default"), 2, &cluster),
            Err(Decline::AntiAffinity)
        );
        assert_eq!(at(&cache("default"), 3, &cluster), Ok(()));
        assert_eq!(at(&cache("other"), 2, &cluster), Ok(()));
        cluster.unplace(1, &db);
        assert_eq!(at(&cache("default"), 2, &cluster), Ok(()));
    }

    /// The view finds placed terms through an index on the labels their `In` requirements
    /// accept (other terms are checked against every pod): every shape of selector still
    /// repels exactly the pods it matches, and stops when its pod leaves.
    #[test]
    fn placed_terms_of_every_selector_shape_repel_exactly_their_matches() {
        let selectors = [
            json!({"matchLabels": {"app": "cache"}}),
            json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "cache"]}]}),
            json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}, {"key": "app", "operator": "In", "values": ["cache"]}]}),
            json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db", "web"]}]}),
            json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
            json!({}),
        ];
        let newcomer = |labels: serde_json::Value| {
            PodRequest::from_pod(&json!({"metadata": {"name": "n", "uid": "n", "namespace": "default", "labels": labels},
                "spec": {"containers": []}}))
            .unwrap()
        };
        let pods = [
            json!({"app": "cache"}),
            json!({"app": "web"}),
            json!({"app": "cache", "tier": "x"}),
            json!({"tier": "x"}),
            json!({}),
        ];
        for (i, selector) in selectors.iter().enumerate() {
            let mut cluster = ClusterView::default();
            cluster.add_node(node(1, &[], 4000, 8));
            let holder = PodRequest::from_pod(&json!({"metadata": {"name": "h", "uid": "h", "namespace": "default", "labels": {"app": "db"}},
                "spec": {"containers": [], "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOSTNAME, "labelSelector": selector}]}}}}))
            .unwrap();
            cluster.place(1, &holder);
            let term = &holder.anti_affinity[0].selector;
            for labels in &pods {
                let pod = newcomer(labels.clone());
                let node = cluster.node(1).unwrap();
                assert_eq!(
                    cluster.repelled(node, &pod),
                    term_matches(term, &pod.labels),
                    "selector {i} {selector}, pod labels {labels}"
                );
            }
            cluster.unplace(1, &holder);
            for labels in &pods {
                assert!(!cluster.repelled(cluster.node(1).unwrap(), &newcomer(labels.clone())));
            }
        }
    }

    /// A rolling update of replicas that must not share a node, on a cluster with no node
    /// left free: with `matchLabelKeys: [pod-template-hash]` (upstream's answer) the new
    /// revision's pods are repelled only by their own revision, so each can start beside an old
    /// one; without it no node is left. Both directions of the symmetric check agree.
    #[test]
    fn match_label_keys_let_a_new_revision_start_beside_the_old_one() {
        let mut cluster = ClusterView::default();
        cluster.add_node(node(1, &[], 4000, 8));
        let replica = |uid: &str, hash: &str, keys: serde_json::Value| {
            PodRequest::from_pod(&json!({"metadata": {"name": uid, "uid": uid, "namespace": "default",
                    "labels": {"app": "web", "pod-template-hash": hash}},
                "spec": {"containers": [], "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}},
                     "matchLabelKeys": keys}]}}}}))
            .unwrap()
        };
        let n1 = cluster.node(1).unwrap().clone();
        let keys = json!(["pod-template-hash"]);
        cluster.place(1, &replica("old", "v1", keys.clone()));
        assert_eq!(
            check(
                &replica("new", "v2", keys.clone()),
                &n1,
                Resources::default(),
                &cluster
            ),
            Ok(())
        );
        assert_eq!(
            check(
                &replica("twin", "v1", keys),
                &n1,
                Resources::default(),
                &cluster
            ),
            Err(Decline::AntiAffinity),
            "the same revision still may not share the node"
        );
        let mut plain = ClusterView::default();
        plain.add_node(node(1, &[], 4000, 8));
        plain.place(1, &replica("old", "v1", json!([])));
        assert_eq!(
            check(
                &replica("new", "v2", json!([])),
                &n1,
                Resources::default(),
                &plain
            ),
            Err(Decline::AntiAffinity)
        );
    }

    /// A term's `namespaces` and `namespaceSelector` say whose pods it counts, as upstream:
    /// the pod's own namespace by default, the listed ones, every namespace for `{}`, the
    /// namespaces whose labels a selector matches — in the bidder's check, in the symmetric
    /// check of a placed pod's term, and in the node's own admission check.
    #[test]
    fn pod_affinity_terms_count_the_namespaces_they_name() {
        let mut cluster = ClusterView::default();
        cluster.add_node(node(1, &[], 4000, 8));
        let n1 = cluster.node(1).unwrap().clone();
        let labelled = |env: &str| {
            BTreeMap::from([
                ("env".to_owned(), env.to_owned()),
                (
                    "kubernetes.io/metadata.name".to_owned(),
                    "team-a".to_owned(),
                ),
            ])
        };
        cluster.set_namespace_labels("team-a", labelled("prod"));
        let db = PodRequest::from_pod(&json!({"metadata": {"name": "db", "uid": "db", "namespace": "team-a", "labels": {"app": "db"}},
            "spec": {"containers": []}}))
        .unwrap();
        cluster.place(1, &db);
        let web = |scope: serde_json::Value| {
            let mut term =
                json!({"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": "db"}}});
            for (k, v) in scope.as_object().unwrap() {
                term[k] = v.clone();
            }
            PodRequest::from_pod(&json!({"metadata": {"name": "web", "uid": "web", "namespace": "team-b", "labels": {"app": "web"}},
                "spec": {"containers": [], "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}}))
            .unwrap()
        };
        let at = |pod: &PodRequest, cluster: &ClusterView| {
            check(pod, &n1, Resources::default(), cluster)
        };
        let declined = Err(Decline::AntiAffinity);
        assert_eq!(at(&web(json!({})), &cluster), Ok(()), "own namespace only");
        assert_eq!(
            at(&web(json!({"namespaces": ["team-a"]})), &cluster),
            declined
        );
        assert_eq!(
            at(&web(json!({"namespaces": ["team-c"]})), &cluster),
            Ok(())
        );
        assert_eq!(
            at(&web(json!({"namespaceSelector": {}})), &cluster),
            declined
        );
        let prod = json!({"namespaceSelector": {"matchLabels": {"env": "prod"}}});
        assert_eq!(at(&web(prod.clone()), &cluster), declined);
        cluster.set_namespace_labels("team-a", labelled("dev"));
        assert_eq!(at(&web(prod.clone()), &cluster), Ok(()));
        // Symmetry: the placed pod's term, with its own scope, repels the newcomer.
        let mut cluster = ClusterView::default();
        cluster.add_node(node(1, &[], 4000, 8));
        let guard = PodRequest::from_pod(&json!({"metadata": {"name": "g", "uid": "g", "namespace": "team-a", "labels": {"app": "guard"}},
            "spec": {"containers": [], "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": "web"}}, "namespaceSelector": {}}]}}}}))
        .unwrap();
        cluster.place(1, &guard);
        assert_eq!(at(&web(json!({})), &cluster), declined);
        // The node's admission: the same scopes, labels from the store.
        let none = |_: &str| None;
        let prod_labels = |ns: &str| (ns == "team-a").then(|| labelled("prod"));
        assert!(hostname_conflict(&web(json!({})), [&db], &none).is_none());
        assert!(hostname_conflict(&web(json!({"namespaces": ["team-a"]})), [&db], &none).is_some());
        assert!(hostname_conflict(&web(prod.clone()), [&db], &none).is_none());
        assert!(hostname_conflict(&web(prod), [&db], &prod_labels).is_some());
        assert!(hostname_conflict(&web(json!({})), [&guard], &none).is_some());
    }

    /// Which domains a spread constraint spreads over, as upstream: with `nodeAffinityPolicy:
    /// Honor` (the default) only zones the pod's node affinity admits — an empty zone it may
    /// not use does not hold the global minimum at 0 —, with `nodeTaintsPolicy: Honor` not the
    /// zones of nodes whose taints it does not tolerate, and with fewer eligible domains than
    /// `minDomains` the minimum is 0. The auctioneer's batch check reads them the same way.
    #[test]
    fn spread_counts_the_domains_its_policies_and_min_domains_say() {
        let mut cluster = ClusterView::default();
        for (id, zone) in [(1, "a"), (2, "b"), (3, "c")] {
            let mut n = node(id, &[("zone", zone)], 4000, 8);
            if zone == "c" {
                n.taints = vec![Taint {
                    key: "maintenance".into(),
                    value: "yes".into(),
                    effect: TaintEffect::NoSchedule,
                }];
            }
            cluster.add_node(n);
        }
        let web = |uid: &str| {
            PodRequest::from_pod(&json!({"metadata": {"name": uid, "uid": uid, "namespace": "default", "labels": {"app": "web"}},
                "spec": {"containers": []}}))
            .unwrap()
        };
        cluster.place(1, &web("w1"));
        cluster.place(2, &web("w2"));
        let spread = |extra: serde_json::Value, affinity: bool| {
            let mut constraint = json!({"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}}});
            for (k, v) in extra.as_object().unwrap() {
                constraint[k] = v.clone();
            }
            let mut spec = json!({"containers": [], "topologySpreadConstraints": [constraint]});
            if affinity {
                spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}});
            }
            PodRequest::from_pod(&json!({"metadata": {"name": "w3", "uid": "w3", "namespace": "default", "labels": {"app": "web"}},
                "spec": spec}))
            .unwrap()
        };
        let n1 = cluster.node(1).unwrap().clone();
        let at = |pod: &PodRequest, cluster: &ClusterView| {
            check(pod, &n1, Resources::default(), cluster)
        };
        // Zone c (empty, tainted) holds the minimum at 0 unless a policy leaves it out.
        assert_eq!(
            at(&spread(json!({}), false), &cluster),
            Err(Decline::Spread)
        );
        assert_eq!(
            at(&spread(json!({}), true), &cluster),
            Ok(()),
            "affinity honoured by default"
        );
        assert_eq!(
            at(
                &spread(json!({"nodeAffinityPolicy": "Ignore"}), true),
                &cluster
            ),
            Err(Decline::Spread)
        );
        assert_eq!(
            at(
                &spread(json!({"nodeTaintsPolicy": "Honor"}), false),
                &cluster
            ),
            Ok(())
        );
        // minDomains above the eligible domains: the minimum is 0 again.
        assert_eq!(
            at(
                &spread(json!({"nodeTaintsPolicy": "Honor", "minDomains": 3}), false),
                &cluster
            ),
            Err(Decline::Spread)
        );
        assert_eq!(
            at(
                &spread(json!({"nodeTaintsPolicy": "Honor", "minDomains": 2}), false),
                &cluster
            ),
            Ok(())
        );
        // The batch check: a batch placement in zone b leaves a the smaller, with c left out.
        let n2 = cluster.node(2).unwrap().clone();
        let w4 = web("w4");
        assert_eq!(
            batch_conflict(&spread(json!({}), true), &n2, &[(&n2, &w4)], &cluster),
            Some(Decline::Spread)
        );
        assert_eq!(
            batch_conflict(&spread(json!({}), true), &n1, &[(&n2, &w4)], &cluster),
            None
        );
    }

    /// What one auctioneer's batch already placed counts for the next pod of the batch: the
    /// bidders could not see it.
    #[test]
    fn a_batch_s_own_placements_count_for_hard_constraints() {
        let mut cluster = ClusterView::default();
        for (id, zone) in [(1, "a"), (2, "a"), (3, "b")] {
            cluster.add_node(node(id, &[("topology.kubernetes.io/zone", zone)], 4000, 8));
        }
        let replica = |uid: &str| {
            PodRequest::from_pod(&json!({"metadata": {"name": uid, "uid": uid, "namespace": "default", "labels": {"app": "web"}},
                "spec": {"containers": [], "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}}}}))
            .unwrap()
        };
        let (a, b) = (replica("a"), replica("b"));
        let n1 = cluster.node(1).unwrap().clone();
        let n2 = cluster.node(2).unwrap().clone();
        assert_eq!(batch_conflict(&b, &n1, &[], &cluster), None);
        assert_eq!(
            batch_conflict(&b, &n1, &[(&n1, &a)], &cluster),
            Some(Decline::AntiAffinity)
        );
        assert_eq!(batch_conflict(&b, &n2, &[(&n1, &a)], &cluster), None);
        // Spread: one web pod of the batch in zone a; another there would skew 2 over b.
        let spread = pod(json!({"containers": [], "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]}));
        let n3 = cluster.node(3).unwrap().clone();
        let web = pod(json!({"containers": []}));
        assert_eq!(
            batch_conflict(&spread, &n2, &[(&n1, &web)], &cluster),
            Some(Decline::Spread)
        );
        assert_eq!(batch_conflict(&spread, &n3, &[(&n1, &web)], &cluster), None);
        // Required affinity to its own group, none placed yet: the first of the batch went to
        // zone a, so the second may go to a (n2) and not to b (n3).
        let together = |uid: &str| {
            PodRequest::from_pod(&json!({"metadata": {"name": uid, "uid": uid, "namespace": "default", "labels": {"app": "db"}},
                "spec": {"containers": [], "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "db"}}}]}}}}))
            .unwrap()
        };
        let (first, second) = (together("db-0"), together("db-1"));
        assert_eq!(batch_conflict(&second, &n3, &[], &cluster), None);
        assert_eq!(
            batch_conflict(&second, &n2, &[(&n1, &first)], &cluster),
            None
        );
        assert_eq!(
            batch_conflict(&second, &n3, &[(&n1, &first)], &cluster),
            Some(Decline::Affinity)
        );
    }

    /// Host ports as upstream's `NodePorts`: (hostIP, protocol, port) exclusive on a node,
    /// `0.0.0.0` (or no hostIP) against every address; checked by the bidder against what is
    /// placed, by the auctioneer against its batch, and by the node against what it admitted.
    #[test]
    fn host_ports_are_exclusive_per_node() {
        let mut cluster = ClusterView::default();
        for id in [1, 2] {
            cluster.add_node(node(id, &[], 4000, 8));
        }
        let with_port = |uid: &str, port: serde_json::Value| {
            PodRequest::from_pod(
                &json!({"metadata": {"name": uid, "uid": uid, "namespace": "default"},
                "spec": {"containers": [{"name": "c", "ports": [port]}]}}),
            )
            .unwrap()
        };
        let any = with_port("any", json!({"containerPort": 80, "hostPort": 8080}));
        cluster.place(1, &any);
        let n1 = cluster.node(1).unwrap().clone();
        let n2 = cluster.node(2).unwrap().clone();
        let check_on =
            |pod: &PodRequest, n: &NodeView| check(pod, n, Resources::default(), &cluster);
        // (the pod asking, on n1 where `any` holds 0.0.0.0:8080/TCP, on n2)
        let rows = [
            (
                json!({"containerPort": 80, "hostPort": 8080}),
                Err(Decline::HostPorts),
            ),
            (
                json!({"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"}),
                Err(Decline::HostPorts),
            ),
            (
                json!({"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}),
                Ok(()),
            ),
            (json!({"containerPort": 80, "hostPort": 8081}), Ok(())),
            (json!({"containerPort": 8080}), Ok(())),
        ];
        for (i, (port, on_n1)) in rows.into_iter().enumerate() {
            let pod = with_port(&format!("p{i}"), port);
            assert_eq!(check_on(&pod, &n1), on_n1, "row {i}");
            assert_eq!(check_on(&pod, &n2), Ok(()), "row {i}");
        }
        // Two specific addresses do not conflict; either with 0.0.0.0 does.
        let a = with_port(
            "a",
            json!({"containerPort": 1, "hostPort": 53, "hostIP": "10.0.0.1", "protocol": "UDP"}),
        );
        let b = with_port(
            "b",
            json!({"containerPort": 1, "hostPort": 53, "hostIP": "10.0.0.2", "protocol": "UDP"}),
        );
        let c = with_port(
            "c",
            json!({"containerPort": 1, "hostPort": 53, "hostIP": "0.0.0.0", "protocol": "UDP"}),
        );
        assert_eq!(batch_conflict(&b, &n2, &[(&n2, &a)], &cluster), None);
        assert_eq!(
            batch_conflict(&c, &n2, &[(&n2, &a)], &cluster),
            Some(Decline::HostPorts)
        );
        assert_eq!(batch_conflict(&c, &n1, &[(&n2, &a)], &cluster), None);
        assert_eq!(host_port_conflict(&b, [&a]), None);
        assert_eq!(
            host_port_conflict(&c, [&a, &b]).map(|p| p.uid.as_str()),
            Some("a")
        );
        assert_eq!(
            host_port_conflict(&a, [&a]),
            None,
            "a pod does not conflict with itself"
        );
        assert_eq!(
            summarize(2, &[Decline::HostPorts, Decline::NodeAffinity]),
            "0/2 nodes are available: 1 node(s) didn't have free ports for the requested pod ports, 1 node(s) didn't match Pod's node affinity/selector."
        );
    }

    #[test]
    fn predicates_table() {
        let cluster = ClusterView::default();
        let small = json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]});
        let cases: Vec<(serde_json::Value, NodeView, Resources, Result<(), Decline>)> = vec![
            (
                small.clone(),
                node(1, &[], 1000, 4),
                Resources::default(),
                Ok(()),
            ),
            (
                small.clone(),
                node(1, &[], 1000, 4),
                Resources::new(600, 0, 1),
                Err(Decline::InsufficientCpu),
            ),
            (
                small.clone(),
                node(1, &[], 1000, 4),
                Resources::new(0, 3 << 30 | 1, 1),
                Err(Decline::InsufficientMemory),
            ),
            (
                small.clone(),
                node(1, &[], 1000, 4),
                Resources::new(0, 0, 110),
                Err(Decline::TooManyPods),
            ),
            (
                json!({"nodeSelector": {"disk": "ssd"}, "containers": []}),
                node(1, &[("disk", "hdd")], 1000, 4),
                Resources::default(),
                Err(Decline::NodeAffinity),
            ),
            (
                json!({"nodeSelector": {"disk": "ssd"}, "containers": []}),
                node(1, &[("disk", "ssd")], 1000, 4),
                Resources::default(),
                Ok(()),
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}]}]}}}, "containers": []}),
                node(1, &[("gen", "2")], 1000, 4),
                Resources::default(),
                Err(Decline::NodeAffinity),
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}, {"key": "gpu", "operator": "DoesNotExist"}]},
                {"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["3"]}]}]}}}, "containers": []}),
                node(1, &[("zone", "a"), ("gen", "2")], 1000, 4),
                Resources::default(),
                Ok(()),
            ),
        ];
        for (i, (spec, n, used, want)) in cases.into_iter().enumerate() {
            assert_eq!(check(&pod(spec), &n, used, &cluster), want, "case {i}");
        }
    }

    #[test]
    fn taints_and_tolerations() {
        let cluster = ClusterView::default();
        let mut n = node(1, &[], 1000, 4);
        n.taints.push(Taint {
            key: "dedicated".into(),
            value: "db".into(),
            effect: TaintEffect::NoSchedule,
        });
        let plain = pod(json!({"containers": []}));
        assert_eq!(
            check(&plain, &n, Resources::default(), &cluster),
            Err(Decline::Taint {
                key: "dedicated".into(),
                value: "db".into()
            })
        );
        let tolerant = pod(
            json!({"containers": [], "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]}),
        );
        assert_eq!(check(&tolerant, &n, Resources::default(), &cluster), Ok(()));
        let exists_all = pod(json!({"containers": [], "tolerations": [{"operator": "Exists"}]}));
        assert_eq!(
            check(&exists_all, &n, Resources::default(), &cluster),
            Ok(())
        );
        n.taints[0].effect = TaintEffect::PreferNoSchedule;
        assert_eq!(check(&plain, &n, Resources::default(), &cluster), Ok(()));
        assert!(
            score(&plain, &n, Resources::default(), &cluster)
                < score(
                    &plain,
                    &node(2, &[], 1000, 4),
                    Resources::default(),
                    &cluster
                )
        );
    }

    #[test]
    fn anti_affinity_and_spread() {
        let mut cluster = ClusterView::default();
        for (id, zone) in [(1, "a"), (2, "a"), (3, "b")] {
            cluster.add_node(node(id, &[("topology.kubernetes.io/zone", zone)], 4000, 8));
        }
        let anti = pod(
            json!({"containers": [], "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}}}),
        );
        assert_eq!(
            check(
                &anti,
                cluster.node(1).unwrap(),
                Resources::default(),
                &cluster
            ),
            Ok(())
        );
        cluster.place(
            1,
            &PodRequest {
                uid: "other".into(),
                ..anti.clone()
            },
        );
        assert_eq!(
            check(
                &anti,
                cluster.node(1).unwrap(),
                Resources::default(),
                &cluster
            ),
            Err(Decline::AntiAffinity)
        );
        assert_eq!(
            check(
                &anti,
                cluster.node(2).unwrap(),
                Resources::default(),
                &cluster
            ),
            Ok(())
        );

        let spread = pod(json!({"containers": [], "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]}));
        // Zone a has 1 web pod, zone b none: a second one in zone a would make the skew 2.
        assert_eq!(
            check(
                &spread,
                cluster.node(2).unwrap(),
                Resources::default(),
                &cluster
            ),
            Err(Decline::Spread)
        );
        assert_eq!(
            check(
                &spread,
                cluster.node(3).unwrap(),
                Resources::default(),
                &cluster
            ),
            Ok(())
        );
        assert!(
            score(
                &spread,
                cluster.node(3).unwrap(),
                Resources::default(),
                &cluster
            ) > score(
                &spread,
                cluster.node(2).unwrap(),
                Resources::default(),
                &cluster
            )
        );
    }

    #[test]
    fn preferred_pod_affinity_and_anti_affinity_move_the_score() {
        let mut cluster = ClusterView::default();
        let (a, b) = (node(1, &[], 4000, 8), node(2, &[], 4000, 8));
        cluster.add_node(a.clone());
        cluster.add_node(b.clone());
        let db = PodRequest::from_pod(&json!({"metadata": {"name": "db", "uid": "db", "namespace": "default", "labels": {"app": "db"}}, "spec": {"containers": [{"name": "c"}]}})).unwrap();
        cluster.place(1, &db);
        let term = |field: &str| {
            json!({"affinity": {field: {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50,
                "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}}]}},
                "containers": [{"name": "c"}]})
        };
        let near = pod(term("podAffinity"));
        let used = |id| cluster.allocated(id);
        assert!(score(&near, &a, used(1), &cluster) > score(&near, &b, used(2), &cluster));
        let away = pod(term("podAntiAffinity"));
        assert!(score(&away, &a, used(1), &cluster) < score(&away, &b, used(2), &cluster));
        let plain = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(
            score(&plain, &a, used(1), &cluster),
            score(&plain, &b, used(2), &cluster)
        );
    }

    #[test]
    fn scores_prefer_emptier_and_preferred_nodes_and_summaries_read_like_kubernetes() {
        let cluster = ClusterView::default();
        let p = pod(
            json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": {"matchLabels": {"disk": "ssd"}}}]}}}),
        );
        let empty = node(1, &[], 4000, 8);
        let busy = Resources::new(2000, 4 << 30, 5);
        assert!(
            score(&p, &empty, Resources::default(), &cluster) > score(&p, &empty, busy, &cluster)
        );
        let ssd = node(2, &[("disk", "ssd")], 4000, 8);
        assert!(
            score(&p, &ssd, Resources::default(), &cluster)
                > score(&p, &empty, Resources::default(), &cluster)
        );
        assert_ne!(tie_break("u1", 1), tie_break("u1", 2));
        // The split form is the same function (stable across versions: auctioneers and
        // samples must not move on an upgrade).
        assert_eq!(tie_break("u1", 7), tie_break_hashed(key_hash("u1"), 7));
        assert_eq!(tie_break("u1", 7), 12_879_606_113_062_056_137);
        assert_eq!(
            summarize(
                5,
                &[
                    Decline::InsufficientMemory,
                    Decline::NodeAffinity,
                    Decline::InsufficientMemory,
                    Decline::InsufficientMemory,
                    Decline::NodeAffinity
                ]
            ),
            "0/5 nodes are available: 3 Insufficient memory, 2 node(s) didn't match Pod's node affinity/selector."
        );
    }

    #[test]
    fn pod_affinity_needs_a_matching_pod_in_the_domain_unless_first_of_its_kind() {
        let mut cluster = ClusterView::default();
        for (id, zone) in [(1, "a"), (2, "a"), (3, "b")] {
            cluster.add_node(node(id, &[("topology.kubernetes.io/zone", zone)], 4000, 8));
        }
        let web = pod(json!({"containers": []}));
        cluster.place(1, &web);
        let near = pod(
            json!({"containers": [], "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "web"}}}]}}}),
        );
        let near = PodRequest {
            uid: "u2".into(),
            labels: [("app".to_owned(), "api".to_owned())].into(),
            ..near
        };
        assert_eq!(
            check(
                &near,
                cluster.node(2).unwrap(),
                Resources::default(),
                &cluster
            ),
            Ok(())
        );
        assert_eq!(
            check(
                &near,
                cluster.node(3).unwrap(),
                Resources::default(),
                &cluster
            ),
            Err(Decline::Affinity)
        );
        let first = pod(
            json!({"containers": [], "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "db"}}}]}}}),
        );
        let first = PodRequest {
            uid: "u3".into(),
            labels: [("app".to_owned(), "db".to_owned())].into(),
            ..first
        };
        assert_eq!(
            check(
                &first,
                cluster.node(3).unwrap(),
                Resources::default(),
                &cluster
            ),
            Ok(())
        );
    }
}

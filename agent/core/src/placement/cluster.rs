//! The cluster as scheduling sees it: live nodes, what is placed where, and per-topology-domain
//! counts of pod labels, kept incrementally so that affinity and spread checks stay O(1) for the
//! common `matchLabels` selectors.

use std::collections::{BTreeMap, HashMap};

use shoal_model::placement::{
    AntiAffinity, HostPort, Namespaces, NodeView, Operator, PodRequest, Resources, Term,
    term_matches,
};

/// What the view keeps of a placed pod.
#[derive(Debug, Clone)]
struct PlacedPod {
    uid: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    priority: i32,
    requests: Resources,
    /// Its `hostPort`s (empty for nearly every pod: no allocation).
    host_ports: Vec<HostPort>,
}

/// A placed pod's required anti-affinity term, kept under the domain it holds.
#[derive(Debug, Clone)]
struct Repel {
    uid: String,
    namespace: String,
    selector: Term,
    namespaces: Namespaces,
}

/// The required anti-affinity terms placed in one domain, indexed by a label a pod must carry
/// to match them: a term with an `In` requirement is kept under each (key, value) that
/// requirement accepts, so a pod is checked only against the terms its own labels can
/// satisfy (a node holding the terms of 15 replica groups checks one, not 15, per bid);
/// other terms are checked against every pod.
#[derive(Debug, Default, Clone)]
struct Repels {
    by_label: HashMap<String, HashMap<String, Vec<Repel>>>,
    other: Vec<Repel>,
}

impl Repels {
    fn insert(&mut self, repel: Repel, tally: &mut RepelTally) {
        match repel.selector.iter().find(|r| r.op == Operator::In) {
            Some(r) => {
                let by_value = self.by_label.entry(r.key.clone()).or_default();
                for value in &r.values {
                    by_value
                        .entry(value.clone())
                        .or_default()
                        .push(repel.clone());
                    *slot(&mut tally.keys, &r.key) += 1;
                }
            }
            None => {
                self.other.push(repel);
                tally.other += 1;
            }
        }
    }

    fn remove(&mut self, uid: &str, tally: &mut RepelTally) {
        let before = self.other.len();
        self.other.retain(|r| r.uid != uid);
        tally.other -= before - self.other.len();
        self.by_label.retain(|key, by_value| {
            let mut removed = 0;
            by_value.retain(|_, list| {
                let before = list.len();
                list.retain(|r| r.uid != uid);
                removed += before - list.len();
                !list.is_empty()
            });
            if removed > 0
                && let Some(n) = tally.keys.get_mut(key.as_str())
            {
                *n -= removed;
                if *n == 0 {
                    tally.keys.remove(key.as_str());
                }
            }
            !by_value.is_empty()
        });
    }

    fn is_empty(&self) -> bool {
        self.by_label.is_empty() && self.other.is_empty()
    }

    /// The terms a pod with `labels` may match (a superset of those it matches).
    fn candidates<'a>(
        &'a self,
        labels: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a Repel> {
        labels
            .iter()
            .filter_map(|(k, v)| self.by_label.get(k.as_str())?.get(v.as_str()))
            .flatten()
            .chain(&self.other)
    }
}

/// How many entries of every [`Repels`] are indexed under each label key, and how many are
/// not indexed: a pod with none of those keys matches none of the indexed terms.
#[derive(Debug, Default, Clone)]
struct RepelTally {
    keys: HashMap<String, usize>,
    other: usize,
}

/// Placed pods and live nodes.
#[derive(Debug, Default, Clone)]
pub struct ClusterView {
    nodes: BTreeMap<u64, NodeView>,
    allocated: HashMap<u64, Resources>,
    pods_on: HashMap<u64, Vec<PlacedPod>>,
    /// "namespace/label=value" → topology key → domain value → matching pods. Nested, so a
    /// lookup borrows its keys (the checks of every bid read these).
    counts: HashMap<String, HashMap<String, HashMap<String, u64>>>,
    /// "namespace/label=value" → topology key → domains with at least one matching pod.
    nonzero: HashMap<String, HashMap<String, u64>>,
    /// topology key → domain value → nodes in it.
    domains: HashMap<String, HashMap<String, u64>>,
    /// topology key → domain value → the required anti-affinity terms of the pods placed in
    /// that domain: they repel matching pods from the whole domain (upstream's symmetry).
    repels: HashMap<String, HashMap<String, Repels>>,
    repel_tally: RepelTally,
    /// Each namespace's labels (`namespaceSelector` of pod affinity terms reads them).
    namespace_labels: HashMap<String, BTreeMap<String, String>>,
    /// The wrapping sum of every node's [`node_digest`]: see [`ClusterView::shape`].
    shape: u64,
    /// Per node: the volume bytes its placed pods' unbound claims will take
    /// (`Placement::provision_bytes`).
    provisioning: HashMap<u64, u64>,
    /// Per node name: the volume bytes its provisioner gave out already (its volumes'
    /// capacities, from the store: [`ClusterView::set_volumes_given`]).
    volumes_given: HashMap<String, u64>,
}

/// A digest of what about a node can make an unschedulable pod fit: its identity, labels,
/// taints and allocatable resources.
fn node_digest(node: &NodeView) -> u64 {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same node gives the same digest in every view of a process.
    let mut h = std::hash::DefaultHasher::new();
    (
        node.id,
        &node.labels,
        &node.taints,
        node.allocatable,
        node.volume_bytes,
    )
        .hash(&mut h);
    h.finish()
}

fn label_key(namespace: &str, k: &str, v: &str) -> String {
    format!("{namespace}/{k}={v}")
}

/// `map[key]`, made empty first if missing: the key is copied only then (every placement
/// updates a dozen of these, nearly always present).
fn slot<'a, V: Default>(map: &'a mut HashMap<String, V>, key: &str) -> &'a mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

/// Counts a pod with `labels` in `namespace` in (`add`) or out of every domain of a node with
/// `node_labels`: [`ClusterView`]'s `counts` and `nonzero`.
fn count(
    counts: &mut HashMap<String, HashMap<String, HashMap<String, u64>>>,
    nonzero: &mut HashMap<String, HashMap<String, u64>>,
    node_labels: &BTreeMap<String, String>,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    add: bool,
) {
    for (lk, lv) in labels {
        let kv = label_key(namespace, lk, lv);
        let by_key = slot(counts, &kv);
        for (tk, domain) in node_labels {
            let n = slot(slot(by_key, tk), domain);
            let became = if add {
                *n += 1;
                *n == 1
            } else {
                let was = *n;
                *n = n.saturating_sub(1);
                was == 1
            };
            if became {
                let nz = slot(slot(nonzero, &kv), tk);
                *nz = if add {
                    nz.saturating_add(1)
                } else {
                    nz.saturating_sub(1)
                };
            }
        }
    }
}

impl ClusterView {
    pub fn add_node(&mut self, node: NodeView) {
        if let Some(old) = self.nodes.get(&node.id) {
            self.shape = self.shape.wrapping_sub(node_digest(old));
        }
        self.shape = self.shape.wrapping_add(node_digest(&node));
        for (k, v) in &node.labels {
            *self
                .domains
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default() += 1;
        }
        self.nodes.insert(node.id, node);
    }

    pub fn remove_node(&mut self, id: u64) {
        if let Some(node) = self.nodes.remove(&id) {
            self.shape = self.shape.wrapping_sub(node_digest(&node));
            for (k, v) in &node.labels {
                if let Some(values) = self.domains.get_mut(k)
                    && let Some(n) = values.get_mut(v)
                {
                    *n -= 1;
                    if *n == 0 {
                        values.remove(v);
                    }
                }
            }
            for placed in self.pods_on.remove(&id).unwrap_or_default() {
                self.count(&node, &placed.namespace, &placed.labels, false);
                self.forget_repels(&node, &placed.uid);
            }
            self.allocated.remove(&id);
            self.provisioning.remove(&id);
        }
    }

    /// Changes when a node joins or leaves, or a node's labels, taints or allocatable
    /// resources change; two views with the same nodes have the same shape however they were
    /// built. The auction requeues its unschedulable pods when it changes, as upstream's
    /// scheduler does on a node's addition or update.
    pub fn shape(&self) -> u64 {
        self.shape
    }

    pub fn nodes(&self) -> impl Iterator<Item = &NodeView> {
        self.nodes.values()
    }

    pub fn node(&self, id: u64) -> Option<&NodeView> {
        self.nodes.get(&id)
    }

    /// The uids of the pods placed on node `id`.
    pub fn pods_on(&self, id: u64) -> impl Iterator<Item = &str> {
        self.pods_on
            .get(&id)
            .into_iter()
            .flatten()
            .map(|p| p.uid.as_str())
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn node_ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    pub fn allocated(&self, id: u64) -> Resources {
        self.allocated.get(&id).copied().unwrap_or_default()
    }

    /// Sets the volume bytes each node's provisioner gave out (node name → bytes).
    pub fn set_volumes_given(&mut self, given: HashMap<String, u64>) {
        self.volumes_given = given;
    }

    /// The volume bytes node `id` can still provision: its volume capacity minus what it gave
    /// out and what the unbound claims of its pods will take. `None`: not counted (a node that
    /// does not say its capacity).
    pub fn volume_free(&self, id: u64) -> Option<u64> {
        let node = self.nodes.get(&id)?;
        let given = self.volumes_given.get(&node.name).copied().unwrap_or(0);
        let coming = self.provisioning.get(&id).copied().unwrap_or(0);
        Some(
            node.volume_bytes?
                .saturating_sub(given)
                .saturating_sub(coming),
        )
    }

    fn count(
        &mut self,
        node: &NodeView,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        add: bool,
    ) {
        count(
            &mut self.counts,
            &mut self.nonzero,
            &node.labels,
            namespace,
            labels,
            add,
        );
    }

    /// Records `pod` as running on node `id`.
    pub fn place(&mut self, id: u64, pod: &PodRequest) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        *self.allocated.entry(id).or_default() = self.allocated(id).plus(pod.requests);
        if pod.volumes.provision_bytes > 0 {
            let coming = self.provisioning.entry(id).or_default();
            *coming = coming.saturating_add(pod.volumes.provision_bytes);
        }
        self.pods_on.entry(id).or_default().push(PlacedPod {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            labels: pod.labels.clone(),
            priority: pod.priority,
            requests: pod.requests,
            host_ports: pod.host_ports.clone(),
        });
        count(
            &mut self.counts,
            &mut self.nonzero,
            &node.labels,
            &pod.namespace,
            &pod.labels,
            true,
        );
        for term in &pod.anti_affinity {
            if let Some(domain) = node.labels.get(&term.topology_key) {
                self.repels
                    .entry(term.topology_key.clone())
                    .or_default()
                    .entry(domain.clone())
                    .or_default()
                    .insert(
                        Repel {
                            uid: pod.uid.clone(),
                            namespace: pod.namespace.clone(),
                            selector: term.selector.clone(),
                            namespaces: term.namespaces.clone(),
                        },
                        &mut self.repel_tally,
                    );
            }
        }
    }

    fn forget_repels(&mut self, node: &NodeView, uid: &str) {
        for (tk, domain) in &node.labels {
            if let Some(by_domain) = self.repels.get_mut(tk.as_str()) {
                if let Some(list) = by_domain.get_mut(domain.as_str()) {
                    list.remove(uid, &mut self.repel_tally);
                    if list.is_empty() {
                        by_domain.remove(domain.as_str());
                    }
                }
                if by_domain.is_empty() {
                    self.repels.remove(tk.as_str());
                }
            }
        }
    }

    /// Whether a pod placed in one of `node`'s domains has a required anti-affinity term
    /// that `pod` matches (in its namespace): then `pod` may not go there either.
    pub fn repelled(&self, node: &NodeView, pod: &PodRequest) -> bool {
        if self.repels.is_empty() {
            return false;
        }
        // Most pods carry none of the labels the placed terms select on: one lookup per
        // label of the pod says so.
        if self.repel_tally.other == 0
            && !pod
                .labels
                .keys()
                .any(|k| self.repel_tally.keys.contains_key(k.as_str()))
        {
            return false;
        }
        // The topology keys with placed terms are few (usually the hostname alone): look
        // each up in the node's labels rather than every label of the node among them.
        self.repels.iter().any(|(tk, by_domain)| {
            node.labels
                .get(tk)
                .and_then(|domain| by_domain.get(domain.as_str()))
                .is_some_and(|list| {
                    list.candidates(&pod.labels).any(|r| {
                        r.uid != pod.uid
                            && term_matches(&r.selector, &pod.labels)
                            && r.namespaces.covers(
                                &r.namespace,
                                &pod.namespace,
                                self.namespace_labels(&pod.namespace),
                            )
                    })
                })
        })
    }

    /// Whether a pod placed on node `id` holds a host port `pod` asks for (upstream's
    /// `NodePorts` filter).
    pub fn host_ports_taken(&self, id: u64, pod: &PodRequest) -> bool {
        !pod.host_ports.is_empty()
            && self.pods_on.get(&id).is_some_and(|placed| {
                placed.iter().any(|p| {
                    p.uid != pod.uid
                        && shoal_model::placement::host_ports_conflict(
                            &p.host_ports,
                            &pod.host_ports,
                        )
                })
            })
    }

    /// Records namespace `name`'s labels (upstream gives every namespace
    /// `kubernetes.io/metadata.name: <name>`; callers add it).
    pub fn set_namespace_labels(&mut self, name: &str, labels: BTreeMap<String, String>) {
        self.namespace_labels.insert(name.to_owned(), labels);
    }

    /// Namespace `name`'s labels, if known.
    pub fn namespace_labels(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.namespace_labels.get(name)
    }

    /// Pods counted by pod affinity term `term` of a pod in namespace `own`, in the domain
    /// `domain` of the term's topology key: by the counts for the namespaces it names, or by a
    /// scan of the domain's pods when a namespace selector decides.
    pub fn matching_term_in_domain(&self, term: &AntiAffinity, domain: &str, own: &str) -> u64 {
        let count =
            |ns: &str| self.matching_in_domain(&term.topology_key, domain, ns, &term.selector);
        match &term.namespaces {
            Namespaces {
                names,
                selector: None,
            } if names.is_empty() => count(own),
            Namespaces {
                names,
                selector: None,
            } => names.iter().map(|ns| count(ns)).sum(),
            scope => self
                .nodes
                .values()
                .filter(|n| {
                    n.labels
                        .get(&term.topology_key)
                        .is_some_and(|d| d == domain)
                })
                .flat_map(|n| self.pods_on.get(&n.id).into_iter().flatten())
                .filter(|p| {
                    scope.covers(own, &p.namespace, self.namespace_labels(&p.namespace))
                        && term_matches(&term.selector, &p.labels)
                })
                .count() as u64,
        }
    }

    /// Whether any pod counted by `term` (of a pod in namespace `own`) runs on a node with the
    /// term's topology key.
    pub fn any_matching_term(&self, term: &AntiAffinity, own: &str) -> bool {
        self.domains.get(&term.topology_key).is_some_and(|domains| {
            domains
                .keys()
                .any(|d| self.matching_term_in_domain(term, d, own) > 0)
        })
    }

    /// How many domains `topology_key` has.
    pub fn domain_count(&self, topology_key: &str) -> usize {
        self.domains.get(topology_key).map_or(0, HashMap::len)
    }

    /// Every domain of `topology_key`.
    pub fn domains_of(&self, topology_key: &str) -> Vec<String> {
        self.domains
            .get(topology_key)
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets `pod` on node `id`.
    pub fn unplace(&mut self, id: u64, pod: &PodRequest) {
        let Some(node) = self.nodes.get(&id).cloned() else {
            return;
        };
        let Some(list) = self.pods_on.get_mut(&id) else {
            return;
        };
        let Some(pos) = list.iter().position(|p| p.uid == pod.uid) else {
            return;
        };
        list.remove(pos);
        *self.allocated.entry(id).or_default() = self.allocated(id).minus(pod.requests);
        if let Some(coming) = self.provisioning.get_mut(&id) {
            *coming = coming.saturating_sub(pod.volumes.provision_bytes);
        }
        self.count(&node, &pod.namespace, &pod.labels, false);
        self.forget_repels(&node, &pod.uid);
    }

    /// Preemption: the fewest, lowest-priority pods of node `id` whose removal lets `pod` fit,
    /// all of lower priority than `pod` (Kubernetes' rule); `None` if no such set exists.
    /// Victims go lowest priority first (the biggest first among equals); then each is spared
    /// again, highest priority first, if the pod still fits without removing it.
    pub fn victims_for(&self, id: u64, pod: &PodRequest) -> Option<Vec<String>> {
        let node = self.nodes.get(&id)?;
        let fits = |used: Resources| {
            let after = used.plus(pod.requests);
            after.cpu_millis <= node.allocatable.cpu_millis
                && after.memory_bytes <= node.allocatable.memory_bytes
                && after.pods <= node.allocatable.pods
        };
        let mut candidates: Vec<&PlacedPod> = self
            .pods_on
            .get(&id)
            .into_iter()
            .flatten()
            .filter(|p| p.priority < pod.priority)
            .collect();
        candidates.sort_by_key(|p| {
            (
                p.priority,
                std::cmp::Reverse(p.requests.cpu_millis),
                std::cmp::Reverse(p.requests.memory_bytes),
                p.uid.clone(),
            )
        });
        let mut used = self.allocated(id);
        let mut victims: Vec<&PlacedPod> = Vec::new();
        for candidate in candidates {
            if fits(used) {
                break;
            }
            used = used.minus(candidate.requests);
            victims.push(candidate);
        }
        if victims.is_empty() || !fits(used) {
            return None;
        }
        // Reprieve: give back what is not needed, most important first.
        let mut spared = Vec::new();
        for (i, victim) in victims.iter().enumerate().rev() {
            if fits(used.plus(victim.requests)) {
                used = used.plus(victim.requests);
                spared.push(i);
            }
        }
        Some(
            victims
                .iter()
                .enumerate()
                .filter(|(i, _)| !spared.contains(i))
                .map(|(_, v)| v.uid.clone())
                .collect(),
        )
    }

    /// The requests of a placed pod.
    pub fn requests_of(&self, id: u64, uid: &str) -> Option<Resources> {
        self.pods_on
            .get(&id)?
            .iter()
            .find(|p| p.uid == uid)
            .map(|p| p.requests)
    }

    /// The priority of a placed pod.
    pub fn priority_of(&self, id: u64, uid: &str) -> Option<i32> {
        self.pods_on
            .get(&id)?
            .iter()
            .find(|p| p.uid == uid)
            .map(|p| p.priority)
    }

    /// Pods in `namespace` matching `selector` in the domain `domain` of `topology_key`.
    pub fn matching_in_domain(
        &self,
        topology_key: &str,
        domain: &str,
        namespace: &str,
        selector: &Term,
    ) -> u64 {
        if let [req] = selector.as_slice()
            && req.op == Operator::In
            && req.values.len() == 1
        {
            let kv = label_key(namespace, &req.key, &req.values[0]);
            return self
                .counts
                .get(&kv)
                .and_then(|by_key| by_key.get(topology_key))
                .and_then(|by_domain| by_domain.get(domain))
                .copied()
                .unwrap_or(0);
        }
        self.nodes
            .values()
            .filter(|n| n.labels.get(topology_key).is_some_and(|d| d == domain))
            .flat_map(|n| self.pods_on.get(&n.id).into_iter().flatten())
            .filter(|p| {
                p.namespace == namespace
                    && shoal_model::placement::term_matches(selector, &p.labels)
            })
            .count() as u64
    }

    /// Whether any pod in `namespace` matching `selector` runs on a node with `topology_key`.
    pub fn any_matching(&self, topology_key: &str, namespace: &str, selector: &Term) -> bool {
        self.domains.get(topology_key).is_some_and(|domains| {
            domains
                .keys()
                .any(|d| self.matching_in_domain(topology_key, d, namespace, selector) > 0)
        })
    }

    /// The smallest count over all domains of `topology_key` (0 when a domain has none).
    pub fn min_in_domains(&self, topology_key: &str, namespace: &str, selector: &Term) -> u64 {
        let Some(domains) = self.domains.get(topology_key) else {
            return 0;
        };
        if let [req] = selector.as_slice()
            && req.op == Operator::In
            && req.values.len() == 1
        {
            let kv = label_key(namespace, &req.key, &req.values[0]);
            let nonzero = self
                .nonzero
                .get(&kv)
                .and_then(|by_key| by_key.get(topology_key))
                .copied()
                .unwrap_or(0);
            if (nonzero as usize) < domains.len() {
                return 0;
            }
        }
        if let [req] = selector.as_slice()
            && req.op == Operator::In
            && req.values.len() == 1
        {
            // Every domain holds one: their counts, under one key.
            let by_domain = self
                .counts
                .get(&label_key(namespace, &req.key, &req.values[0]))
                .and_then(|by_key| by_key.get(topology_key));
            return domains
                .keys()
                .map(|d| by_domain.and_then(|c| c.get(d)).copied().unwrap_or(0))
                .min()
                .unwrap_or(0);
        }
        domains
            .keys()
            .map(|d| self.matching_in_domain(topology_key, d, namespace, selector))
            .min()
            .unwrap_or(0)
    }
}

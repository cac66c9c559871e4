//! Admission of bound pods at the node, as the kubelet does it: the auction decides where a pod
//! should go from each bidder's view, but two auctions run by different nodes (or bindings
//! merged after a partition) can still send a node more than it holds. The node is the last to
//! decide: pods it already runs keep their place; a new one is admitted only if its requests fit
//! in what the admitted pods leave of the node's allocatable, else it is refused with the
//! kubelet's reasons (`OutOfcpu`, `OutOfmemory`, `OutOfpods`) and auctioned again. Pods that
//! still run here without being bound here (deleted, or bound elsewhere while the agent was
//! down) hold the requests recorded in their sandbox until they are gone.
//!
//! The node is also the one place that sees every pod bound to it, whichever auction bound it:
//! two auctioneers placing two replicas of one Deployment at once each checked the node's
//! pods as their bidder saw them, without the other's. So the constraints whose domain is
//! this node alone — required pod anti-affinity on `kubernetes.io/hostname`, the incoming
//! pod's terms and (as upstream) the terms of the pods already here — are checked again at
//! admission, and a pod that breaks one is handed back with reason `PodAntiAffinity`; so are
//! host ports (`hostPort`, exclusive per node as upstream's `NodePorts`), for every pod
//! however it was bound, with reason `NodePorts`.
//! Pure: the kubelet's sync loop hands [`Admission::decide`] what it observed and acts on the
//! verdicts.

use std::collections::BTreeMap;

use shoal_core::placement::predicates::{HOSTNAME, host_port_conflict, hostname_conflict};
use shoal_model::placement::{PodRequest, Resources};

/// Why a pod was refused, in the kubelet's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `OutOfcpu`, `OutOfmemory`, `OutOfpods`, or `NodeUnschedulable` (a cordoned node
    /// refuses what an auction bound to it before the cordon reached the auctioneer).
    pub reason: &'static str,
    pub message: String,
}

/// What the node knows of one pod: bound here, running here, or both.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub uid: &'a str,
    /// Bound to this node.
    pub bound: Option<BoundHere<'a>>,
    /// A sandbox of it was found here, with the requests recorded in it.
    pub sandbox: Option<Resources>,
    /// A pod worker runs it here.
    pub worker: bool,
    /// Owned by a DaemonSet: it belongs to this node and is never handed back.
    pub daemon: bool,
    /// Bound here by the auction (binding epoch ≥ 1), not by a user's `spec.nodeName`.
    pub auctioned: bool,
    /// Its scheduling fields (labels, anti-affinity), when its object is known here.
    pub placement: Option<&'a PodRequest>,
}

#[derive(Debug, Clone, Copy)]
pub struct BoundHere<'a> {
    /// `metadata.creationTimestamp`: new pods are admitted oldest first.
    pub created: &'a str,
    /// Its requests; `None` when its spec cannot run here at all (reported as
    /// `InvalidPodSpec` elsewhere, never weighed against what is free).
    pub requests: Option<Resources>,
}

/// A refused pod, and what the kubelet must do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub refusal: Refusal,
    /// The refusal is new: log it (once, not on every sync).
    pub report: bool,
    /// Hand it back to the auction (clear its binding, epoch + 1), until that was written.
    pub hand_back: bool,
}

/// The pods this node has admitted and their requests.
#[derive(Debug, Default)]
pub struct Admission {
    admitted: BTreeMap<String, Resources>,
    /// The admitted pods whose objects are known here (for anti-affinity).
    placed: BTreeMap<String, PodRequest>,
    /// Pods refused since they were bound here (each is reported once).
    refused: std::collections::BTreeSet<String>,
    /// Refused pods whose binding was cleared (handed back to the auction).
    handed_back: std::collections::BTreeSet<String>,
}

impl Admission {
    /// Whether `uid`'s refusal is new (to report and act on once, not on every sync).
    pub fn first_refusal(&mut self, uid: &str) -> bool {
        self.refused.insert(uid.to_owned())
    }

    pub fn is_handed_back(&self, uid: &str) -> bool {
        self.handed_back.contains(uid)
    }

    pub fn handed_back(&mut self, uid: &str) {
        self.handed_back.insert(uid.to_owned());
    }

    pub fn is_admitted(&self, uid: &str) -> bool {
        self.admitted.contains_key(uid)
    }

    /// Records a pod that runs here already (found running, or admitted by an earlier run of
    /// this agent): it is never refused after the fact.
    pub fn keep(&mut self, uid: &str, requests: Resources) {
        self.admitted.insert(uid.to_owned(), requests);
    }

    /// Forgets pods no longer bound here or running.
    pub fn retain(&mut self, mut bound_or_running: impl FnMut(&str) -> bool) {
        self.admitted.retain(|uid, _| bound_or_running(uid));
        let admitted = &self.admitted;
        self.placed.retain(|uid, _| admitted.contains_key(uid));
        self.refused.retain(|uid| bound_or_running(uid));
        self.handed_back.retain(|uid| bound_or_running(uid));
    }

    /// One admission pass over every pod bound or running here: forgets pods gone, keeps what
    /// runs here (bound or not), then admits the bound pods new here oldest first while they
    /// fit. On a `cordoned` node a new pod the auction bound here is refused instead (the
    /// cordon is replicated like any write, and an auctioneer may bind before its copy
    /// arrives); DaemonSet pods and pods a user placed with `spec.nodeName` are admitted, as
    /// Kubernetes runs them on cordoned nodes. Returns the refused ones.
    pub fn decide(
        &mut self,
        allocatable: Resources,
        cordoned: bool,
        pods: &[Candidate<'_>],
        namespace_labels: &dyn Fn(&str) -> Option<BTreeMap<String, String>>,
    ) -> BTreeMap<String, Verdict> {
        let present: std::collections::BTreeSet<&str> = pods
            .iter()
            .filter(|p| p.bound.is_some() || p.sandbox.is_some())
            .map(|p| p.uid)
            .collect();
        self.retain(|uid| present.contains(uid));
        for pod in pods {
            if let (None, Some(recorded)) = (pod.bound, pod.sandbox)
                && !self.is_admitted(pod.uid)
            {
                self.keep(pod.uid, recorded);
            }
        }
        let mut new: Vec<(&Candidate<'_>, BoundHere<'_>)> = pods
            .iter()
            .filter(|p| !self.is_admitted(p.uid))
            .filter_map(|p| p.bound.map(|b| (p, b)))
            .collect();
        new.sort_by(|(a, ab), (b, bb)| (ab.created, a.uid).cmp(&(bb.created, b.uid)));
        let mut verdicts = BTreeMap::new();
        // Admitted pods known before this pass (kept ones included) are checked against.
        for pod in pods {
            if let Some(placement) = pod.placement
                && self.is_admitted(pod.uid)
                && !self.placed.contains_key(pod.uid)
            {
                self.placed.insert(pod.uid.to_owned(), placement.clone());
            }
        }
        for (pod, bound) in new {
            let Some(requests) = bound.requests else {
                continue;
            };
            if pod.sandbox.is_some() || pod.worker {
                self.keep(pod.uid, requests);
                if let Some(placement) = pod.placement {
                    self.placed.insert(pod.uid.to_owned(), placement.clone());
                }
                continue;
            }
            let conflict = pod
                .placement
                .filter(|_| pod.auctioned && !pod.daemon)
                .and_then(|p| self.anti_affinity_conflict(p, namespace_labels));
            // Host ports are exclusive however the pod was bound (upstream's kubelet refuses a
            // DaemonSet's or a `spec.nodeName` pod too): two pods cannot both be served.
            let ports_taken = pod
                .placement
                .is_some_and(|p| host_port_conflict(p, self.placed.values()).is_some());
            let admitted = if cordoned && pod.auctioned && !pod.daemon {
                Err(Refusal {
                    reason: "NodeUnschedulable",
                    message: "Pod was rejected: the node is cordoned (spec.unschedulable)".into(),
                })
            } else if ports_taken {
                Err(Refusal {
                    reason: "NodePorts",
                    message: "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports".into(),
                })
            } else if let Some(message) = conflict {
                Err(Refusal {
                    reason: "PodAntiAffinity",
                    message,
                })
            } else {
                self.admit(allocatable, pod.uid, requests)
            };
            let Err(refusal) = admitted else {
                if let Some(placement) = pod.placement {
                    self.placed.insert(pod.uid.to_owned(), placement.clone());
                }
                continue;
            };
            let verdict = Verdict {
                refusal,
                report: self.first_refusal(pod.uid),
                hand_back: !pod.daemon && !self.is_handed_back(pod.uid),
            };
            verdicts.insert(pod.uid.to_owned(), verdict);
        }
        verdicts
    }

    /// Why `pod` may not run beside the pods admitted here
    /// ([`hostname_conflict`], the simulator's check too).
    fn anti_affinity_conflict(
        &self,
        pod: &PodRequest,
        namespace_labels: &dyn Fn(&str) -> Option<BTreeMap<String, String>>,
    ) -> Option<String> {
        let other = hostname_conflict(pod, self.placed.values(), namespace_labels)?;
        Some(format!(
            "Pod was rejected: pod {} runs on this node and a required anti-affinity between them (topologyKey {HOSTNAME}) forbids it",
            other.name
        ))
    }

    /// Admits `uid` if `requests` fit in `allocatable` beside the admitted pods.
    pub fn admit(
        &mut self,
        allocatable: Resources,
        uid: &str,
        requests: Resources,
    ) -> Result<(), Refusal> {
        if self.admitted.contains_key(uid) {
            return Ok(());
        }
        let used = self
            .admitted
            .values()
            .fold(Resources::new(0, 0, 0), |sum, r| Resources {
                cpu_millis: sum.cpu_millis.saturating_add(r.cpu_millis),
                memory_bytes: sum.memory_bytes.saturating_add(r.memory_bytes),
                pods: sum.pods.saturating_add(r.pods.max(1)),
            });
        let checks = [
            ("OutOfpods", "pods", 1, used.pods, allocatable.pods),
            (
                "OutOfcpu",
                "cpu",
                requests.cpu_millis,
                used.cpu_millis,
                allocatable.cpu_millis,
            ),
            (
                "OutOfmemory",
                "memory",
                requests.memory_bytes,
                used.memory_bytes,
                allocatable.memory_bytes,
            ),
        ];
        for (reason, resource, requested, used, capacity) in checks {
            if requested > 0 && used.saturating_add(requested) > capacity {
                return Err(Refusal {
                    reason,
                    message: format!(
                        "Pod was rejected: Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
                    ),
                });
            }
        }
        self.admitted.insert(uid.to_owned(), requests);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No namespace's labels are known.
    fn no_labels(_: &str) -> Option<BTreeMap<String, String>> {
        None
    }

    const NODE: Resources = Resources {
        cpu_millis: 2_000,
        memory_bytes: 1 << 30,
        pods: 3,
    };

    fn pod(cpu_millis: u64, memory_bytes: u64) -> Resources {
        Resources::new(cpu_millis, memory_bytes, 1)
    }

    #[test]
    fn pods_are_admitted_while_they_fit_and_refused_with_the_kubelets_reason() {
        let mut a = Admission::default();
        assert_eq!(a.admit(NODE, "a", pod(1_500, 0)), Ok(()));
        let refused = a.admit(NODE, "b", pod(1_000, 0)).unwrap_err();
        assert_eq!(refused.reason, "OutOfcpu");
        assert_eq!(
            refused.message,
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000, used: 1500, capacity: 2000"
        );
        assert!(!a.is_admitted("b"));
        assert_eq!(a.admit(NODE, "c", pod(500, 512 << 20)), Ok(()));
        assert_eq!(
            a.admit(NODE, "d", pod(0, 768 << 20)).unwrap_err().reason,
            "OutOfmemory"
        );
        assert_eq!(a.admit(NODE, "e", pod(0, 0)), Ok(()), "best-effort fits");
        assert_eq!(
            a.admit(NODE, "f", pod(0, 0)).unwrap_err().reason,
            "OutOfpods"
        );
        // Admitting again is idempotent; a pod gone frees its room.
        assert_eq!(a.admit(NODE, "a", pod(1_500, 0)), Ok(()));
        a.retain(|uid| uid != "a");
        assert_eq!(a.admit(NODE, "b", pod(1_000, 0)), Ok(()));
    }

    #[test]
    fn pods_found_running_are_kept_even_beyond_the_node() {
        let mut a = Admission::default();
        a.keep("x", pod(1_800, 0));
        a.keep("y", pod(1_800, 0));
        assert!(a.is_admitted("y"));
        assert_eq!(
            a.admit(NODE, "z", pod(100, 0)).unwrap_err().reason,
            "OutOfcpu"
        );
    }

    fn bound<'a>(uid: &'a str, created: &'a str, cpu: Option<u64>) -> Candidate<'a> {
        Candidate {
            uid,
            bound: Some(BoundHere {
                created,
                requests: cpu.map(|c| pod(c, 0)),
            }),
            sandbox: None,
            worker: false,
            daemon: false,
            auctioned: true,
            placement: None,
        }
    }

    fn refused(verdicts: &BTreeMap<String, Verdict>) -> Vec<(&str, &str, bool, bool)> {
        verdicts
            .iter()
            .map(|(uid, v)| (uid.as_str(), v.refusal.reason, v.report, v.hand_back))
            .collect()
    }

    /// One pass at a time, as the sync loop calls it: each row is (what the node sees, the
    /// refusals expected: uid, reason, reported, handed back).
    #[test]
    fn decide_table() {
        let orphan = |uid, cpu| Candidate {
            uid,
            bound: None,
            sandbox: Some(pod(cpu, 0)),
            worker: false,
            daemon: false,
            auctioned: false,
            placement: None,
        };
        let mut a = Admission::default();
        // Oldest first: `old` (created first, listed last) takes the room `new` wanted.
        let pass = [
            bound("new", "2026-12-02T10:00:01Z", Some(1_500)),
            bound("old", "2026-12-02T10:00:00Z", Some(1_500)),
        ];
        assert_eq!(
            refused(&a.decide(NODE, false, &pass, &no_labels)),
            [("new", "OutOfcpu", true, true)]
        );
        // The next pass: still refused, not reported again; the kubelet wrote the hand-back.
        a.handed_back("new");
        assert_eq!(
            refused(&a.decide(NODE, false, &pass, &no_labels)),
            [("new", "OutOfcpu", false, false)]
        );

        // A restarted agent finds `old` still running although it is no longer bound here: it
        // holds its recorded requests, so a new pod that would fit an empty node is refused.
        let mut a = Admission::default();
        let pass = [
            orphan("old", 1_500),
            bound("next", "2026-12-02T10:00:02Z", Some(1_000)),
        ];
        assert_eq!(
            refused(&a.decide(NODE, false, &pass, &no_labels)),
            [("next", "OutOfcpu", true, true)]
        );
        // Once it is gone, its room is free.
        let pass = [bound("next", "2026-12-02T10:00:02Z", Some(1_000))];
        assert_eq!(refused(&a.decide(NODE, false, &pass, &no_labels)), []);
        assert!(a.is_admitted("next") && !a.is_admitted("old"));

        // Found running (a sandbox or a worker): kept, even beyond the node; a spec that cannot
        // run is not weighed; a DaemonSet's pod is refused but never handed back.
        let mut a = Admission::default();
        let mut running = bound("running", "2026-12-02T10:00:00Z", Some(1_800));
        running.worker = true;
        let mut also = bound("also", "2026-12-02T10:00:01Z", Some(1_800));
        also.sandbox = Some(pod(1_800, 0));
        let invalid = bound("invalid", "2026-12-02T10:00:02Z", None);
        let mut daemon = bound("daemon", "2026-12-02T10:00:03Z", Some(100));
        daemon.daemon = true;
        let verdicts = a.decide(NODE, false, &[running, also, invalid, daemon], &no_labels);
        assert_eq!(refused(&verdicts), [("daemon", "OutOfcpu", true, false)]);
        assert!(a.is_admitted("running") && a.is_admitted("also") && !a.is_admitted("invalid"));
    }

    #[test]
    fn a_cordoned_node_hands_back_what_the_auction_bound_but_keeps_the_rest() {
        let mut a = Admission::default();
        let mut running = bound("running", "2026-12-02T10:00:00Z", Some(100));
        running.worker = true;
        let auctioned = bound("auctioned", "2026-12-02T10:00:01Z", Some(100));
        let mut placed = bound("placed", "2026-12-02T10:00:02Z", Some(100));
        placed.auctioned = false;
        let mut daemon = bound("daemon", "2026-12-02T10:00:03Z", Some(100));
        daemon.daemon = true;
        let pass = [running, auctioned, placed, daemon];
        let node = Resources { pods: 10, ..NODE };
        assert_eq!(
            refused(&a.decide(node, true, &pass, &no_labels)),
            [("auctioned", "NodeUnschedulable", true, true)]
        );
        assert!(a.is_admitted("running") && a.is_admitted("placed") && a.is_admitted("daemon"));
        // Uncordoned, the same pod is admitted.
        assert_eq!(refused(&a.decide(node, false, &pass, &no_labels)), []);
        assert!(a.is_admitted("auctioned"));
        // Once admitted, a later cordon does not evict it (a drain does).
        assert_eq!(refused(&a.decide(node, true, &pass, &no_labels)), []);
    }

    /// Two replicas that must not share a node, bound here by two auctions at once: the
    /// older is admitted, the other handed back naming it; the check also holds the other way
    /// round (a pod here whose anti-affinity repels the newcomer), and only for pods of the
    /// same namespace, auctioned, and not DaemonSet pods.
    #[test]
    fn hostname_anti_affinity_is_checked_again_at_the_node() {
        let request = |uid: &str, app: &str, repels: Option<&str>| {
            let anti = repels.map_or(serde_json::json!({}), |other| {
                serde_json::json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOSTNAME, "labelSelector": {"matchLabels": {"app": other}}}]}})
            });
            PodRequest::from_pod(&serde_json::json!({
                "metadata": {"uid": uid, "name": uid, "namespace": "default", "labels": {"app": app}},
                "spec": {"affinity": anti, "containers": [{"name": "c", "image": "i"}]}
            }))
            .unwrap()
        };
        let web_a = request("web-a", "web", Some("web"));
        let web_b = request("web-b", "web", Some("web"));
        let node = Resources { pods: 10, ..NODE };
        let with = |c: Candidate<'static>, p: &'static PodRequest| Candidate {
            placement: Some(p),
            ..c
        };
        let web_a: &'static PodRequest = Box::leak(Box::new(web_a));
        let web_b: &'static PodRequest = Box::leak(Box::new(web_b));
        let mut a = Admission::default();
        let pass = [
            with(bound("web-b", "2026-12-02T10:00:01Z", Some(100)), web_b),
            with(bound("web-a", "2026-12-02T10:00:00Z", Some(100)), web_a),
        ];
        let verdicts = a.decide(node, false, &pass, &no_labels);
        assert_eq!(
            refused(&verdicts),
            [("web-b", "PodAntiAffinity", true, true)]
        );
        assert!(
            verdicts["web-b"]
                .refusal
                .message
                .contains("pod web-a runs on this node"),
            "{:?}",
            verdicts["web-b"]
        );
        // Symmetric: a cache pod without terms is repelled by a db pod's terms.
        let db: &'static PodRequest = Box::leak(Box::new(request("db", "db", Some("cache"))));
        let cache: &'static PodRequest = Box::leak(Box::new(request("cache", "cache", None)));
        let mut a = Admission::default();
        let pass = [
            with(bound("db", "2026-12-02T10:00:00Z", Some(100)), db),
            with(bound("cache", "2026-12-02T10:00:01Z", Some(100)), cache),
        ];
        assert_eq!(
            refused(&a.decide(node, false, &pass, &no_labels)),
            [("cache", "PodAntiAffinity", true, true)]
        );
        // A pod a user placed (spec.nodeName) or a DaemonSet's is not refused for it, as the
        // kubelet never checks inter-pod affinity; a pod running here already is kept.
        let mut a = Admission::default();
        let mut placed = with(bound("cache", "2026-12-02T10:00:01Z", Some(100)), cache);
        placed.auctioned = false;
        let pass = [
            with(bound("db", "2026-12-02T10:00:00Z", Some(100)), db),
            placed,
        ];
        assert_eq!(refused(&a.decide(node, false, &pass, &no_labels)), []);
        // Gone, its terms repel nothing: the replica handed back before fits now.
        let mut a = Admission::default();
        let first = [with(
            bound("web-a", "2026-12-02T10:00:00Z", Some(100)),
            web_a,
        )];
        assert_eq!(refused(&a.decide(node, false, &first, &no_labels)), []);
        let second = [with(
            bound("web-b", "2026-12-02T10:00:01Z", Some(100)),
            web_b,
        )];
        assert_eq!(refused(&a.decide(node, false, &second, &no_labels)), []);
    }

    /// Host ports at the node: the older pod keeps the port, a newcomer asking for it is
    /// refused with upstream's `NodePorts` however it was bound (a user's `spec.nodeName` and a
    /// DaemonSet's pod too, which are not handed back); another protocol or address fits.
    #[test]
    fn host_ports_are_checked_again_at_the_node_for_every_pod() {
        let request = |uid: &str, port: serde_json::Value| -> &'static PodRequest {
            Box::leak(Box::new(
                PodRequest::from_pod(&serde_json::json!({
                    "metadata": {"uid": uid, "name": uid, "namespace": "default"},
                    "spec": {"containers": [{"name": "c", "image": "i", "ports": [port]}]}
                }))
                .unwrap(),
            ))
        };
        let with = |c: Candidate<'static>, p: &'static PodRequest| Candidate {
            placement: Some(p),
            ..c
        };
        let node = Resources { pods: 10, ..NODE };
        let web = request(
            "web",
            serde_json::json!({"containerPort": 80, "hostPort": 8080}),
        );
        let twin = request(
            "twin",
            serde_json::json!({"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"}),
        );
        let udp = request(
            "udp",
            serde_json::json!({"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}),
        );
        let mut a = Admission::default();
        let mut placed = with(bound("twin", "2026-12-02T10:00:01Z", Some(100)), twin);
        placed.auctioned = false;
        let mut daemon = with(bound("daemon", "2026-12-02T10:00:02Z", Some(100)), twin);
        daemon.uid = "daemon";
        daemon.daemon = true;
        let pass = [
            placed,
            daemon,
            with(bound("web", "2026-12-02T10:00:00Z", Some(100)), web),
            with(bound("udp", "2026-12-02T10:00:03Z", Some(100)), udp),
        ];
        let verdicts = a.decide(node, false, &pass, &no_labels);
        assert_eq!(
            refused(&verdicts),
            [
                ("daemon", "NodePorts", true, false),
                ("twin", "NodePorts", true, true)
            ]
        );
        assert_eq!(
            verdicts["twin"].refusal.message,
            "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
        );
        assert!(a.is_admitted("web") && a.is_admitted("udp"));
    }

    #[test]
    fn huge_requests_do_not_overflow() {
        let mut a = Admission::default();
        a.keep("x", pod(u64::MAX, u64::MAX));
        assert!(a.admit(NODE, "y", pod(u64::MAX, 0)).is_err());
    }
}

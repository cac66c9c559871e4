//! Admission of bound pods at the node, as the kubelet does it: the auction decides where a pod
//! should go from each bidder's view, but two auctions run by different nodes (or bindings
//! merged after a partition) can still send a node more than it holds. The node is the last to
//! decide: pods it already runs keep their place; a new one is admitted only if its requests fit
//! in what the admitted pods leave of the node's allocatable, else it is refused with the
//! kubelet's reasons (`OutOfcpu`, `OutOfmemory`, `OutOfpods`) and auctioned again. Pods that
//! still run here without being bound here (deleted, or bound elsewhere while the agent was
//! down) hold the requests recorded in their sandbox until they are gone. Pure: the kubelet's
//! sync loop hands [`Admission::decide`] what it observed and acts on the verdicts.

use std::collections::BTreeMap;

use shoal_model::placement::Resources;

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
        for (pod, bound) in new {
            let Some(requests) = bound.requests else {
                continue;
            };
            if pod.sandbox.is_some() || pod.worker {
                self.keep(pod.uid, requests);
                continue;
            }
            let admitted = if cordoned && pod.auctioned && !pod.daemon {
                Err(Refusal {
                    reason: "NodeUnschedulable",
                    message: "Pod was rejected: the node is cordoned (spec.unschedulable)".into(),
                })
            } else {
                self.admit(allocatable, pod.uid, requests)
            };
            let Err(refusal) = admitted else {
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
        };
        let mut a = Admission::default();
        // Oldest first: `old` (created first, listed last) takes the room `new` wanted.
        let pass = [
            bound("new", "2026-12-02T10:00:01Z", Some(1_500)),
            bound("old", "2026-12-02T10:00:00Z", Some(1_500)),
        ];
        assert_eq!(
            refused(&a.decide(NODE, false, &pass)),
            [("new", "OutOfcpu", true, true)]
        );
        // The next pass: still refused, not reported again; the kubelet wrote the hand-back.
        a.handed_back("new");
        assert_eq!(
            refused(&a.decide(NODE, false, &pass)),
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
            refused(&a.decide(NODE, false, &pass)),
            [("next", "OutOfcpu", true, true)]
        );
        // Once it is gone, its room is free.
        let pass = [bound("next", "2026-12-02T10:00:02Z", Some(1_000))];
        assert_eq!(refused(&a.decide(NODE, false, &pass)), []);
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
        let verdicts = a.decide(NODE, false, &[running, also, invalid, daemon]);
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
            refused(&a.decide(node, true, &pass)),
            [("auctioned", "NodeUnschedulable", true, true)]
        );
        assert!(a.is_admitted("running") && a.is_admitted("placed") && a.is_admitted("daemon"));
        // Uncordoned, the same pod is admitted.
        assert_eq!(refused(&a.decide(node, false, &pass)), []);
        assert!(a.is_admitted("auctioned"));
        // Once admitted, a later cordon does not evict it (a drain does).
        assert_eq!(refused(&a.decide(node, true, &pass)), []);
    }

    #[test]
    fn huge_requests_do_not_overflow() {
        let mut a = Admission::default();
        a.keep("x", pod(u64::MAX, u64::MAX));
        assert!(a.admit(NODE, "y", pod(u64::MAX, 0)).is_err());
    }
}

//! Admission of bound pods at the node, as the kubelet does it: the auction decides where a pod
//! should go from each bidder's view, but two auctions run by different nodes (or bindings
//! merged after a partition) can still send a node more than it holds. The node is the last to
//! decide: pods it already runs keep their place; a new one is admitted only if its requests fit
//! in what the admitted pods leave of the node's allocatable, else it is refused with the
//! kubelet's reasons (`OutOfcpu`, `OutOfmemory`, `OutOfpods`) and auctioned again. Pure.

use std::collections::BTreeMap;

use crate::scheduler::model::Resources;

/// Why a pod was refused, in the kubelet's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `OutOfcpu`, `OutOfmemory` or `OutOfpods`.
    pub reason: &'static str,
    pub message: String,
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

    #[test]
    fn huge_requests_do_not_overflow() {
        let mut a = Admission::default();
        a.keep("x", pod(u64::MAX, u64::MAX));
        assert!(a.admit(NODE, "y", pod(u64::MAX, 0)).is_err());
    }
}

//! Which pods go up for auction, and when a dead node's pods may move: one decision, driven by
//! the live scheduler (the agent's `scheduling.rs`, fed with membership views) and by the simulator
//! (`chaos-tests/src/sim/scheduler.rs`, fed with simulated deaths). Pure: time is an input (any monotonic clock's
//! `Duration` since a fixed start, the same on every call).
//!
//! A pod bound to a live node stays (it counts against the node). A node that is suspect or
//! joining keeps its pods, as does a DaemonSet pod (its node claims it, nobody else may). A
//! node gone from a view that has not settled (a restarted agent still learning the
//! membership) is not judged, nor timed, yet. A dead node's pods move once their policy
//! allows ([`super::partition::may_replace`]: `available` after the eviction delay, `fenced`
//! only where a majority is visible and after the fenced delay), at the next binding epoch, so
//! the old binding cannot win a merge. An unbound pod is auctioned — a fenced one only where a
//! majority is visible — unless it is a preemption's victim whose preemptor is not bound yet.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use super::partition::{self, FenceConfig, Policy};

/// What this node's view says of the node a pod is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Alive.
    Live,
    /// Suspect or joining: it keeps its pods.
    Undecided,
    /// Dead or gone from the view, for this long (`None`: not timed, as an unsettled view
    /// starts no clock; see [`DeadTimers::gone_for`]).
    Gone(Option<Duration>),
}

/// A pod, as the decision needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pod {
    /// Whether it is bound (its node is then described by a [`Seen`]).
    pub bound: bool,
    pub epoch: u64,
    pub policy: Policy,
    /// A DaemonSet's pod: claimed by its node, never auctioned elsewhere.
    pub daemon: bool,
    /// Unbound as a preemption's victim whose preemptor is not bound yet: it waits, or it
    /// would take back the room it was evicted to make.
    pub awaits_preemptor: bool,
}

/// The rules in force at this moment.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// This node sees a majority of the membership baseline.
    pub majority: bool,
    pub eviction_delay: Duration,
    pub fence: &'a FenceConfig,
}

/// What to do with a pod now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Bound to a live node: it stays and counts against that node.
    Placed,
    /// Nothing now.
    Wait,
    /// Put up for auction at this binding epoch.
    Auction(u64),
}

/// The decision for one pod; `node` is what the view says of its node (ignored when unbound).
pub fn decide(rules: &Rules, pod: &Pod, node: Seen) -> Verdict {
    if !pod.bound {
        if pod.awaits_preemptor || (pod.policy == Policy::Fenced && !rules.majority) {
            return Verdict::Wait;
        }
        return Verdict::Auction(pod.epoch.max(1));
    }
    match node {
        Seen::Live => Verdict::Placed,
        Seen::Undecided => Verdict::Wait,
        _ if pod.daemon => Verdict::Wait,
        Seen::Gone(None) => Verdict::Wait,
        Seen::Gone(Some(dead_for)) => {
            if partition::may_replace(
                pod.policy,
                dead_for,
                rules.majority,
                rules.eviction_delay,
                rules.fence,
            ) {
                Verdict::Auction(pod.epoch.saturating_add(1))
            } else {
                Verdict::Wait
            }
        }
    }
}

/// When each node was first seen dead or gone: the clock of [`Seen::Gone`].
#[derive(Debug, Clone)]
pub struct DeadTimers<K> {
    since: HashMap<K, Duration>,
}

impl<K> Default for DeadTimers<K> {
    fn default() -> Self {
        Self {
            since: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> DeadTimers<K> {
    /// Membership says `node` is dead (its clock starts, if it is not running) or not (it
    /// stops: a node that comes back and dies again is timed from its new death).
    pub fn observe(&mut self, node: &K, dead: bool, now: Duration) {
        if dead {
            self.since.entry(node.clone()).or_insert(now);
        } else {
            self.since.remove(node);
        }
    }

    /// How long `node`, absent from the live view, has been gone at `now`. A node the view
    /// does not list at all (it vanished) starts its clock now if the view has `settled`; an
    /// unsettled view starts none (`None`).
    pub fn gone_for(&mut self, node: &K, now: Duration, settled: bool) -> Option<Duration> {
        let since = match self.since.get(node) {
            Some(since) => *since,
            None if settled => *self.since.entry(node.clone()).or_insert(now),
            None => return None,
        };
        Some(now.saturating_sub(since))
    }

    /// Whether `node`'s clock runs.
    pub fn contains(&self, node: &K) -> bool {
        self.since.contains_key(node)
    }

    pub fn clear(&mut self) {
        self.since.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence() -> FenceConfig {
        FenceConfig::new(Duration::from_secs(3), Duration::from_secs(2))
    }

    fn pod(bound: bool, policy: Policy) -> Pod {
        Pod {
            bound,
            epoch: 3,
            policy,
            daemon: false,
            awaits_preemptor: false,
        }
    }

    #[test]
    fn a_live_or_undecided_node_keeps_its_pods() {
        let fence = fence();
        let rules = Rules {
            majority: true,
            eviction_delay: Duration::from_secs(10),
            fence: &fence,
        };
        let p = pod(true, Policy::Available);
        assert_eq!(decide(&rules, &p, Seen::Live), Verdict::Placed);
        assert_eq!(decide(&rules, &p, Seen::Undecided), Verdict::Wait);
        assert_eq!(decide(&rules, &p, Seen::Gone(None)), Verdict::Wait);
        let daemon = Pod { daemon: true, ..p };
        assert_eq!(
            decide(&rules, &daemon, Seen::Gone(Some(Duration::from_secs(3600)))),
            Verdict::Wait
        );
    }

    #[test]
    fn a_dead_node_s_pods_move_when_their_policy_allows_at_the_next_epoch() {
        let fence = fence();
        let rules = Rules {
            majority: true,
            eviction_delay: Duration::from_secs(10),
            fence: &fence,
        };
        let available = pod(true, Policy::Available);
        let gone = |s| Seen::Gone(Some(Duration::from_secs(s)));
        assert_eq!(decide(&rules, &available, gone(9)), Verdict::Wait);
        assert_eq!(decide(&rules, &available, gone(10)), Verdict::Auction(4));
        // Fenced: after detection + fence timeout + 1 s, only with a majority.
        let fenced = pod(true, Policy::Fenced);
        assert_eq!(decide(&rules, &fenced, gone(5)), Verdict::Wait);
        assert_eq!(decide(&rules, &fenced, gone(7)), Verdict::Auction(4));
        let minority = Rules {
            majority: false,
            ..rules
        };
        assert_eq!(decide(&minority, &fenced, gone(3600)), Verdict::Wait);
    }

    #[test]
    fn unbound_pods_are_auctioned_unless_fenced_without_a_majority_or_waiting_for_a_preemptor() {
        let fence = fence();
        let rules = Rules {
            majority: false,
            eviction_delay: Duration::from_secs(10),
            fence: &fence,
        };
        let fresh = Pod {
            epoch: 0,
            ..pod(false, Policy::Available)
        };
        assert_eq!(decide(&rules, &fresh, Seen::Live), Verdict::Auction(1));
        assert_eq!(
            decide(&rules, &pod(false, Policy::Fenced), Seen::Live),
            Verdict::Wait
        );
        let victim = Pod {
            awaits_preemptor: true,
            ..pod(false, Policy::Available)
        };
        assert_eq!(decide(&rules, &victim, Seen::Live), Verdict::Wait);
    }

    #[test]
    fn a_dead_node_is_timed_from_its_death_and_a_vanished_one_once_the_view_settles() {
        let mut timers = DeadTimers::<&str>::default();
        let s = Duration::from_secs;
        timers.observe(&"a", true, s(10));
        timers.observe(&"a", true, s(12));
        assert_eq!(timers.gone_for(&"a", s(15), false), Some(s(5)));
        // Back, then dead again: timed from the new death.
        timers.observe(&"a", false, s(16));
        timers.observe(&"a", true, s(20));
        assert_eq!(timers.gone_for(&"a", s(21), true), Some(s(1)));
        // Vanished from the view: no clock until the view has settled.
        assert_eq!(timers.gone_for(&"b", s(30), false), None);
        assert!(!timers.contains(&"b"));
        assert_eq!(timers.gone_for(&"b", s(31), true), Some(s(0)));
        assert_eq!(timers.gone_for(&"b", s(40), false), Some(s(9)));
    }
}

//! Partition policies (`shoal.io/partition-policy` annotation on a pod or its template).
//!
//! - `available` (default): both sides of a partition keep their pods and replace the ones they
//!   lost after the eviction delay. On heal the pod's single `spec.nodeName` register merges to
//!   one node everywhere; the other instance is stopped by its node.
//! - `fenced`: a pod never runs on two nodes at once.
//!
//! ## The timing argument for `fenced`
//!
//! Let `D` bound how long the failure detector takes to declare a silent node dead on any node
//! (measured ≤ 2.1 s at 30 nodes, see BENCHMARKS.md; configure with margin), `F` the fence
//! timeout and `R` the replacement delay.
//! 1. A node that stops seeing a majority of its membership baseline stops its fenced pods
//!    once it has been in that state for `F` ([`must_stop`]). It stops seeing the majority at
//!    most `D` after the partition starts, so its instances are gone by `t0 + D + F`.
//! 2. A node replaces a fenced pod only while it sees a majority, and only after the pod's node
//!    has been *dead* to it for `R` ([`may_replace`]); it cannot see that node dead before `t0`,
//!    so a replacement starts at `t0 + R` at the earliest.
//! 3. With `R > D + F` (checked by [`FenceConfig::validate`]), the old instance is stopped
//!    before the new one can start. A majority is unique, so at most one side ever replaces.
//! 4. A node that cannot act on 1. — its agent killed, frozen or hung — stops renewing the
//!    fence lease when it goes silent, and the fenced containers' shims kill them `F` (plus a
//!    100 ms poll) later (`runtime::lease`): the same bound as 1., without the agent.
//! 5. Majorities are of the baseline ([`Fence`]), which never shrinks: two sides cannot both
//!    hold one, however long the partition lasts.
//! 6. Points 1–5 are about a pod bound to one node that moves. Two auctioneers whose views
//!    differ for a moment can also bind one pod to two nodes at once, each binding acknowledged
//!    by a quorum, before the merge picks one: a fenced pod therefore also runs only while its
//!    node holds a run lease on it from a majority of the baseline ([`super::lease`]), which
//!    at most one node can hold at a time, whatever the stores say meanwhile.

use std::time::Duration;

/// The annotation naming a pod's policy.
pub const ANNOTATION: &str = "shoal.io/partition-policy";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Available,
    Fenced,
}

impl Policy {
    /// Reads the annotation value; anything but `fenced` is `available`.
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("fenced") => Policy::Fenced,
            _ => Policy::Available,
        }
    }
}

/// Timing of the fenced policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceConfig {
    /// `D`: the failure detector's worst-case time to declare a silent node dead.
    pub detection_bound: Duration,
    /// `F`: how long a node without a majority keeps its fenced pods.
    pub fence_timeout: Duration,
    /// `R`: how long a fenced pod's node must be dead before a replacement.
    pub replace_after: Duration,
    /// How long a grantor honours a run lease it gave ([`super::lease::Grantor`]).
    pub lease_term: Duration,
    /// How long a holder counts a grant, from when it asked (less than `lease_term`: the
    /// margin covers stopping the container and clock-rate drift). It is `F`: a node cut off
    /// from the majority keeps its fenced pods as long as the fence timeout lets it.
    pub lease_hold: Duration,
}

impl FenceConfig {
    /// A configuration whose replacement delay respects the timing argument.
    pub fn new(detection_bound: Duration, fence_timeout: Duration) -> Self {
        Self {
            detection_bound,
            fence_timeout,
            replace_after: detection_bound + fence_timeout + Duration::from_secs(1),
            lease_term: fence_timeout + Duration::from_secs(1),
            lease_hold: fence_timeout,
        }
    }

    pub fn validate(&self) -> Result<(), FenceConfigError> {
        if self.replace_after <= self.detection_bound + self.fence_timeout {
            return Err(FenceConfigError::ReplaceTooSoon {
                replace_after: self.replace_after,
                detection_bound: self.detection_bound,
                fence_timeout: self.fence_timeout,
            });
        }
        if self.lease_hold >= self.lease_term {
            return Err(FenceConfigError::HoldNotShorter {
                hold: self.lease_hold,
                term: self.lease_term,
            });
        }
        Ok(())
    }
}

/// A fencing configuration the timing argument does not hold for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceConfigError {
    #[error(
        "fenced replacement delay {replace_after:?} must exceed detection bound {detection_bound:?} + fence timeout {fence_timeout:?}"
    )]
    ReplaceTooSoon {
        replace_after: Duration,
        detection_bound: Duration,
        fence_timeout: Duration,
    },
    #[error("run lease hold {hold:?} must be shorter than the lease term {term:?}")]
    HoldNotShorter { hold: Duration, term: Duration },
}

/// Whether `alive` nodes (this one included) are a strict majority of the `known` membership.
pub fn has_majority(alive: usize, known: usize) -> bool {
    alive * 2 > known
}

/// Whether a node that has lacked a majority for `without_majority_for` must stop its fenced
/// pods.
pub fn must_stop(without_majority_for: Option<Duration>, config: &FenceConfig) -> bool {
    without_majority_for.is_some_and(|d| d >= config.fence_timeout)
}

/// Whether a pod whose node has been dead for `dead_for` may be replaced by a node that sees
/// `majority`.
pub fn may_replace(
    policy: Policy,
    dead_for: Duration,
    majority: bool,
    eviction_delay: Duration,
    config: &FenceConfig,
) -> bool {
    match policy {
        Policy::Available => dead_for >= eviction_delay,
        Policy::Fenced => majority && dead_for >= config.replace_after,
    }
}

/// Whether this node's view of the membership is settled enough to judge the nodes it does not
/// see: it has run for at least the detection bound (every node alive when it started has had
/// time to be heard from, or to be declared dead), and every member it knows of has sent its
/// metadata (a member without it cannot be matched to the pods bound to it by name). Until then
/// a node named by a binding but absent from the view is not taken for dead: a freshly
/// restarted agent would otherwise re-auction the pods of every node it had not heard from yet.
pub fn membership_settled(
    running_for: Duration,
    members_without_meta: usize,
    config: &FenceConfig,
) -> bool {
    running_for >= config.detection_bound && members_without_meta == 0
}

/// What one node's view of the cluster says about its `fenced` pods: the pure state machine the
/// live shell (`scheduling.rs`) and the simulator both drive, with their own clocks and views.
///
/// - A node counts majorities against its **baseline**, the most nodes it has known at once
///   (persisted by the store), never against the members alive or remembered now: membership
///   forgets a dead node after the grace period, and a two-node side of a long partition must
///   not come to believe it is a majority of two.
/// - It lacks a majority from the first view that shows one missing; once that has lasted the
///   fence timeout its fenced pods stop ([`must_stop`]).
/// - A stopped node keeps them stopped until it sees a majority again *and* has caught up with
///   a majority's desired state: enough peers that, with itself, they are a majority of the
///   baseline have, since the majority became visible ([`Fence::catch_up_since`]), either shown
///   a store digest equal to its own or served it a complete anti-entropy session. Until then
///   it cannot know whether the majority bound them elsewhere meanwhile. (Equal digests alone
///   would do, but under a steady stream of writes two busy stores are rarely equal at the
///   instant both digests are read, and the pods would stay down for as long as the writes go
///   on.)
/// - A node **starts stopped**: an agent that restarted (after a crash, a kill or a long
///   freeze, or with its data dir wiped) knows nothing of what the majority decided while it
///   was away, so it runs no fenced pod before its view has settled ([`membership_settled`])
///   and it has caught up as above.
#[derive(Debug, Clone)]
pub struct Fence {
    without_majority_since: Option<Duration>,
    /// When the majority became visible (this time), if it is.
    majority_since: Option<Duration>,
    stopped: bool,
    majority: bool,
}

/// One observation fed to [`Fence::observe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceView {
    /// Nodes this one sees alive, itself included.
    pub alive: usize,
    /// The membership majorities are counted against (see [`Fence`]).
    pub baseline: usize,
    /// Peers this node has caught up with since [`Fence::catch_up_since`] (equal digests, or a
    /// complete anti-entropy session from them); 0 while that is `None`.
    pub agreeing: usize,
    /// Whether the membership view has settled ([`membership_settled`]).
    pub settled: bool,
}

/// What an observation changed, for the shell to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceChange {
    LostMajority,
    RegainedMajority,
    /// The fence timeout passed without a majority: fenced pods stop.
    Stopped,
    /// Caught up with the majority: fenced pods may run here again.
    Released,
}

impl Default for Fence {
    fn default() -> Self {
        Self::new()
    }
}

impl Fence {
    /// A node that has just started: stopped, and without a majority until it sees one.
    pub fn new() -> Self {
        Self {
            without_majority_since: None,
            majority_since: None,
            stopped: true,
            majority: false,
        }
    }

    /// Takes in the node's view at `now` (any monotonic clock, the same on every call).
    pub fn observe(
        &mut self,
        now: Duration,
        view: FenceView,
        config: &FenceConfig,
    ) -> Vec<FenceChange> {
        let mut changes = Vec::new();
        let baseline = view.baseline.max(view.alive);
        let majority = has_majority(view.alive, baseline);
        match (majority, self.without_majority_since) {
            (true, Some(_)) => {
                self.without_majority_since = None;
                changes.push(FenceChange::RegainedMajority);
            }
            (false, None) => {
                self.without_majority_since = Some(now);
                changes.push(FenceChange::LostMajority);
            }
            _ => {}
        }
        self.majority = majority;
        match (majority, self.majority_since) {
            (true, None) => self.majority_since = Some(now),
            (false, Some(_)) => self.majority_since = None,
            _ => {}
        }
        if !self.stopped
            && must_stop(
                self.without_majority_since
                    .map(|since| now.saturating_sub(since)),
                config,
            )
        {
            self.stopped = true;
            changes.push(FenceChange::Stopped);
        }
        if self.stopped
            && majority
            && view.settled
            && has_majority(view.agreeing.saturating_add(1), baseline)
        {
            self.stopped = false;
            changes.push(FenceChange::Released);
        }
        changes
    }

    /// Whether the last view showed a majority of the baseline (a fenced pod is bound or
    /// replaced only then).
    pub fn has_majority(&self) -> bool {
        self.majority
    }

    /// Whether this node's fenced pods must not run.
    pub fn must_stop(&self) -> bool {
        self.stopped
    }

    /// Since when catching up with a peer counts toward releasing this node's fenced pods: the
    /// moment the majority became visible (`None` without one). What a peer held before that
    /// may predate the majority's decisions made while this node was away.
    pub fn catch_up_since(&self) -> Option<Duration> {
        self.majority_since
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn view(alive: usize, baseline: usize, agreeing: usize) -> FenceView {
        FenceView {
            alive,
            baseline,
            agreeing,
            settled: true,
        }
    }

    #[test]
    fn a_node_starts_fenced_and_runs_fenced_pods_once_caught_up_with_a_majority() {
        let config = FenceConfig::new(Duration::from_secs(3), Duration::from_secs(2));
        let mut fence = Fence::new();
        assert!(fence.must_stop());
        let s = Duration::from_secs;
        // A restarted node of a five-node cluster that sees only itself yet.
        fence.observe(s(0), view(1, 5, 0), &config);
        assert!(fence.must_stop() && !fence.has_majority());
        // A majority alive, but its store does not agree with theirs yet.
        fence.observe(s(1), view(3, 5, 0), &config);
        assert!(fence.must_stop() && fence.has_majority());
        assert_eq!(fence.catch_up_since(), Some(s(1)));
        // Not settled: still stopped even when the digests agree.
        let unsettled = FenceView {
            settled: false,
            ..view(5, 5, 4)
        };
        fence.observe(s(2), unsettled, &config);
        assert!(fence.must_stop());
        assert_eq!(
            fence.observe(s(3), view(5, 5, 2), &config),
            vec![FenceChange::Released]
        );
        assert!(!fence.must_stop());
    }

    #[test]
    fn the_baseline_not_the_remembered_membership_decides_a_majority() {
        let config = FenceConfig::new(Duration::from_secs(3), Duration::from_secs(2));
        let s = Duration::from_secs;
        let mut fence = Fence::new();
        fence.observe(s(0), view(5, 5, 4), &config);
        assert!(!fence.must_stop());
        // Two of five on this side: the three others are forgotten by membership after the
        // grace period, but the baseline still holds five.
        assert_eq!(
            fence.observe(s(10), view(2, 5, 1), &config),
            vec![FenceChange::LostMajority]
        );
        assert!(!fence.must_stop(), "the fence timeout has not passed");
        assert_eq!(
            fence.observe(s(12), view(2, 5, 1), &config),
            vec![FenceChange::Stopped]
        );
        fence.observe(s(700), view(2, 5, 1), &config);
        assert!(fence.must_stop() && !fence.has_majority());
        assert_eq!(fence.catch_up_since(), None);
        // A baseline below the live count is raised to it.
        let mut fresh = Fence::new();
        fresh.observe(s(0), view(3, 1, 2), &config);
        assert!(fresh.has_majority() && !fresh.must_stop());
        // Back with the majority, caught up: released.
        assert_eq!(
            fence.observe(s(800), view(5, 5, 4), &config),
            vec![FenceChange::RegainedMajority, FenceChange::Released]
        );
    }

    #[test]
    fn a_fresh_or_incomplete_view_judges_no_absent_node() {
        let config = FenceConfig::new(Duration::from_secs(4), Duration::from_secs(5));
        let cases = [
            (Duration::from_millis(100), 0, false),
            (Duration::from_secs(3), 0, false),
            (Duration::from_secs(4), 2, false),
            (Duration::from_secs(4), 0, true),
            (Duration::from_secs(600), 1, false),
        ];
        for (running_for, without_meta, settled) in cases {
            assert_eq!(
                membership_settled(running_for, without_meta, &config),
                settled,
                "{running_for:?}, {without_meta} without metadata"
            );
        }
    }

    #[test]
    fn majorities() {
        assert!(has_majority(3, 5));
        assert!(!has_majority(2, 5));
        assert!(!has_majority(2, 4));
        assert!(has_majority(1, 1));
        assert!(
            FenceConfig::new(Duration::from_secs(3), Duration::from_secs(2))
                .validate()
                .is_ok()
        );
        let bad = FenceConfig {
            replace_after: Duration::from_secs(5),
            ..FenceConfig::new(Duration::from_secs(3), Duration::from_secs(2))
        };
        assert!(bad.validate().is_err());
    }

    proptest! {
        /// For any detection delays within the bound on either side, the minority's instance is
        /// stopped before the majority can start a replacement.
        #[test]
        fn a_fenced_pod_never_runs_twice(
            minority_detects_ms in 0u64..=3000,
            majority_detects_ms in 0u64..=3000,
            fence_ms in 500u64..5000,
        ) {
            let config = FenceConfig::new(Duration::from_millis(3000), Duration::from_millis(fence_ms));
            // The minority node notices it lacks a majority after its detection delay; it stops
            // the pod as soon as must_stop holds.
            let stop_at = (minority_detects_ms..).find(|t| must_stop(Some(Duration::from_millis(t - minority_detects_ms)), &config)).unwrap();
            // The majority sees the minority node dead after its detection delay, and replaces
            // as soon as may_replace holds.
            let start_at = (majority_detects_ms..).find(|t| may_replace(Policy::Fenced, Duration::from_millis(t - majority_detects_ms), true, Duration::ZERO, &config)).unwrap();
            prop_assert!(stop_at < start_at, "stopped at {stop_at} ms, replaced at {start_at} ms");
            // And a side without a majority never replaces.
            prop_assert!(!may_replace(Policy::Fenced, Duration::from_secs(3600), false, Duration::ZERO, &config));
        }
    }
}

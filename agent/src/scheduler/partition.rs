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
//! 1. A node that stops seeing a majority of the last known membership stops its fenced pods
//!    once it has been in that state for `F` ([`must_stop`]). It stops seeing the majority at
//!    most `D` after the partition starts, so its instances are gone by `t0 + D + F`.
//! 2. A node replaces a fenced pod only while it sees a majority, and only after the pod's node
//!    has been *dead* to it for `R` ([`may_replace`]); it cannot see that node dead before `t0`,
//!    so a replacement starts at `t0 + R` at the earliest.
//! 3. With `R > D + F` (checked by [`FenceConfig::validate`]), the old instance is stopped
//!    before the new one can start. A majority is unique, so at most one side ever replaces.

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
}

impl FenceConfig {
    /// A configuration whose replacement delay respects the timing argument.
    pub fn new(detection_bound: Duration, fence_timeout: Duration) -> Self {
        Self {
            detection_bound,
            fence_timeout,
            replace_after: detection_bound + fence_timeout + Duration::from_secs(1),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.replace_after <= self.detection_bound + self.fence_timeout {
            return Err(format!(
                "fenced replacement delay {:?} must exceed detection bound {:?} + fence timeout {:?}",
                self.replace_after, self.detection_bound, self.fence_timeout
            ));
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

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

//! Member states as users see them: chitchat's phi-accrual verdict (live or dead), refined with
//! a "suspect" state for a live node whose heartbeat has stopped advancing for a while.
//!
//! Pure: fed with observations and the current time, so tests replay any timeline.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How a node looks from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Known through gossip, but no advance of its heartbeat seen yet (a node that just joined,
    /// or one a peer lists that this node never heard alive).
    Joining,
    /// Heartbeats arrive on time.
    Alive,
    /// The failure detector still says live, but no new heartbeat for `suspect_after`.
    Suspect,
    /// The failure detector declared the node dead.
    Dead,
}

impl std::fmt::Display for MemberState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemberState::Joining => "joining",
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Dead => "dead",
        })
    }
}

/// The failure detector's judgement of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Live,
    Dead,
}

/// Remembers, per node, when it was first heard of and when its heartbeat last advanced, and
/// turns that and the failure detector's verdict into the state users see.
///
/// The rule, for a node heard of at `first_seen` whose heartbeat last advanced at `advanced`:
/// - heard of, never advanced since: `Joining` (no evidence either way), until the failure
///   detector's verdict is dead and `dead_after` has passed since `first_seen` — then `Dead`;
/// - advanced within `suspect_after`: `Alive`, whatever the detector says yet (its window needs
///   a second sample and it judges only once per gossip round; a heartbeat is signed by the node
///   through the authenticated transport, so an advance is not a rumour);
/// - advanced longer ago: `Suspect` while the detector says live, `Dead` once it says dead or
///   the silence reaches `dead_after` — the detector's own bound at a steady heartbeat, applied
///   here because the detector judges only at the end of each of its gossip rounds while this
///   is sampled several times a round (it would otherwise add up to a round to every
///   detection).
///
/// A live verdict without an advance seen here (both samples arrived between two
/// observations) stays `Joining` for `suspect_after`, then `Suspect`: never `Alive` without
/// evidence.
#[derive(Debug)]
pub struct LivenessTracker<K> {
    suspect_after: Duration,
    dead_after: Duration,
    nodes: HashMap<K, Track>,
}

#[derive(Debug, Clone, Copy)]
struct Track {
    first_seen: Instant,
    heartbeat: u64,
    advanced: Option<Instant>,
}

impl<K: std::hash::Hash + Eq + Clone> LivenessTracker<K> {
    /// `suspect_after`: silence after which a live node is shown suspect; `dead_after`: the
    /// failure detector's delay at a steady heartbeat — silence after which a node heard alive
    /// is dead, and how long a node never heard alive stays `Joining` before a dead verdict is
    /// believed.
    pub fn new(suspect_after: Duration, dead_after: Duration) -> Self {
        Self {
            suspect_after,
            dead_after,
            nodes: HashMap::new(),
        }
    }

    /// Records `heartbeat` for `node` at `now` and classifies it. `verdict` is the failure
    /// detector's (`None` before it has judged the node).
    pub fn observe(
        &mut self,
        now: Instant,
        node: &K,
        heartbeat: u64,
        verdict: Option<Verdict>,
    ) -> MemberState {
        let track = self.nodes.entry(node.clone()).or_insert(Track {
            first_seen: now,
            heartbeat,
            advanced: None,
        });
        if heartbeat > track.heartbeat {
            track.heartbeat = heartbeat;
            track.advanced = Some(now);
        }
        let heard_alive = track.advanced.is_some();
        let silent_for = now.saturating_duration_since(track.advanced.unwrap_or(track.first_seen));
        if heard_alive && silent_for <= self.suspect_after {
            return MemberState::Alive;
        }
        if heard_alive && silent_for >= self.dead_after {
            return MemberState::Dead;
        }
        match verdict {
            Some(Verdict::Live) if silent_for <= self.suspect_after => MemberState::Joining,
            Some(Verdict::Live) => MemberState::Suspect,
            Some(Verdict::Dead) if !heard_alive && silent_for < self.dead_after => {
                MemberState::Joining
            }
            Some(Verdict::Dead) => MemberState::Dead,
            None if heard_alive => MemberState::Suspect,
            None => MemberState::Joining,
        }
    }

    /// Drops the history of nodes no longer known.
    pub fn retain(&mut self, mut known: impl FnMut(&K) -> bool) {
        self.nodes.retain(|k, _| known(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUSPECT: Duration = Duration::from_millis(500);
    const DEAD: Duration = Duration::from_millis(1200);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const LIVE: Option<Verdict> = Some(Verdict::Live);
    const DEAD_VERDICT: Option<Verdict> = Some(Verdict::Dead);

    #[test]
    fn a_node_never_heard_from_is_never_alive() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(SUSPECT, DEAD);
        // Listed by a peer's digest, its heartbeat never moves: joining, whatever the detector
        // says, then dead once the detector's delay has passed.
        for (at, verdict) in [
            (0, None),
            (100, DEAD_VERDICT),
            (300, None),
            (1100, DEAD_VERDICT),
        ] {
            assert_eq!(
                tracker.observe(t0 + ms(at), &"a", 7, verdict),
                MemberState::Joining,
                "at {at} ms"
            );
        }
        assert_eq!(
            tracker.observe(t0 + ms(1300), &"a", 7, DEAD_VERDICT),
            MemberState::Dead
        );
        // A detector that calls it live without an advance seen here: never alive from that.
        let mut tracker = LivenessTracker::new(SUSPECT, DEAD);
        assert_eq!(tracker.observe(t0, &"b", 3, LIVE), MemberState::Joining);
        assert_eq!(
            tracker.observe(t0 + ms(2000), &"b", 3, LIVE),
            MemberState::Suspect
        );
    }

    #[test]
    fn one_heartbeat_advance_makes_a_joining_node_alive_at_once() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(SUSPECT, DEAD);
        assert_eq!(tracker.observe(t0, &"a", 1, None), MemberState::Joining);
        // The detector has no second sample yet (or even called it dead for lack of one).
        assert_eq!(
            tracker.observe(t0 + ms(50), &"a", 2, DEAD_VERDICT),
            MemberState::Alive
        );
        assert_eq!(
            tracker.observe(t0 + ms(100), &"a", 2, None),
            MemberState::Alive
        );
    }

    #[test]
    fn silence_makes_a_node_suspect_then_dead() {
        let t0 = Instant::now();
        let mut tracker = LivenessTracker::new(SUSPECT, DEAD);
        tracker.observe(t0, &"a", 1, None);
        assert_eq!(
            tracker.observe(t0 + ms(100), &"a", 2, LIVE),
            MemberState::Alive
        );
        assert_eq!(
            tracker.observe(t0 + ms(600), &"a", 2, LIVE),
            MemberState::Alive
        );
        assert_eq!(
            tracker.observe(t0 + ms(601), &"a", 2, LIVE),
            MemberState::Suspect
        );
        assert_eq!(
            tracker.observe(t0 + ms(700), &"a", 3, LIVE),
            MemberState::Alive
        );
        assert_eq!(
            tracker.observe(t0 + ms(1300), &"a", 3, DEAD_VERDICT),
            MemberState::Dead
        );
        // Dead at `dead_after` of silence even before the detector's end-of-round verdict.
        tracker.observe(t0 + ms(2000), &"a", 4, LIVE);
        assert_eq!(
            tracker.observe(t0 + ms(3199), &"a", 4, LIVE),
            MemberState::Suspect
        );
        assert_eq!(
            tracker.observe(t0 + ms(3200), &"a", 4, LIVE),
            MemberState::Dead
        );
        // Back (e.g. SIGCONT): alive as soon as its heartbeat moves, before the detector agrees.
        assert_eq!(
            tracker.observe(t0 + ms(5000), &"a", 9, DEAD_VERDICT),
            MemberState::Alive
        );
        // A heartbeat never goes back within a generation; a lower one is no advance.
        assert_eq!(
            tracker.observe(t0 + ms(5600), &"a", 4, LIVE),
            MemberState::Suspect
        );
        tracker.retain(|k| *k != "a");
        assert!(tracker.nodes.is_empty());
    }
}

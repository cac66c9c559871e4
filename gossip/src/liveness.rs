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
    /// Known through gossip, but the failure detector has not yet seen enough heartbeats to
    /// judge it (a node that just joined).
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

/// Remembers when each node's heartbeat last advanced.
#[derive(Debug)]
pub struct LivenessTracker<K> {
    suspect_after: Duration,
    last_advance: HashMap<K, (u64, Instant)>,
}

impl<K: std::hash::Hash + Eq + Clone> LivenessTracker<K> {
    pub fn new(suspect_after: Duration) -> Self {
        Self {
            suspect_after,
            last_advance: HashMap::new(),
        }
    }

    /// Records `heartbeat` for `node` at `now` and classifies it. `verdict` is the failure
    /// detector's (`None` before it has judged the node), which always wins for dead nodes.
    pub fn observe(
        &mut self,
        now: Instant,
        node: &K,
        heartbeat: u64,
        verdict: Option<Verdict>,
    ) -> MemberState {
        let entry = self
            .last_advance
            .entry(node.clone())
            .or_insert((heartbeat, now));
        if heartbeat != entry.0 {
            *entry = (heartbeat, now);
        }
        match verdict {
            None => return MemberState::Joining,
            Some(Verdict::Dead) => return MemberState::Dead,
            Some(Verdict::Live) => {}
        }
        if now.saturating_duration_since(entry.1) > self.suspect_after {
            MemberState::Suspect
        } else {
            MemberState::Alive
        }
    }

    /// Drops the history of nodes no longer known.
    pub fn retain(&mut self, mut known: impl FnMut(&K) -> bool) {
        self.last_advance.retain(|k, _| known(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut tracker = LivenessTracker::new(ms(500));
        let (live, dead) = (Some(Verdict::Live), Some(Verdict::Dead));
        assert_eq!(tracker.observe(t0, &"a", 0, None), MemberState::Joining);
        assert_eq!(tracker.observe(t0, &"a", 1, live), MemberState::Alive);
        assert_eq!(
            tracker.observe(t0 + ms(400), &"a", 1, live),
            MemberState::Alive
        );
        assert_eq!(
            tracker.observe(t0 + ms(600), &"a", 1, live),
            MemberState::Suspect
        );
        assert_eq!(
            tracker.observe(t0 + ms(700), &"a", 2, live),
            MemberState::Alive
        );
        assert_eq!(
            tracker.observe(t0 + ms(900), &"a", 2, dead),
            MemberState::Dead
        );
        assert_eq!(
            tracker.observe(t0 + ms(5000), &"a", 9, live),
            MemberState::Alive
        );
        tracker.retain(|k| *k != "a");
        assert!(tracker.last_advance.is_empty());
    }
}

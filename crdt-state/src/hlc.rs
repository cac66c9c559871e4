//! Hybrid logical clock: wall-clock milliseconds in the high 48 bits, a logical counter in the low
//! 16. Timestamps from one clock strictly increase; observing a peer's timestamp moves the clock
//! past it, so a write made after seeing another is ordered after it. Pure: wall time is an input.

use serde::{Deserialize, Serialize};

const LOGICAL_BITS: u32 = 16;
const LOGICAL_MASK: u64 = (1 << LOGICAL_BITS) - 1;

/// A point in hybrid logical time.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn new(wall_ms: u64, logical: u16) -> Self {
        Self((wall_ms << LOGICAL_BITS) | u64::from(logical))
    }

    /// Milliseconds since the Unix epoch.
    pub fn wall_ms(self) -> u64 {
        self.0 >> LOGICAL_BITS
    }

    pub fn logical(self) -> u16 {
        (self.0 & LOGICAL_MASK) as u16
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.wall_ms(), self.logical())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    #[error(
        "timestamp {remote} is {ahead_ms} ms ahead of this node's clock (limit {max_drift_ms} ms): \
         check NTP on the sending node"
    )]
    TooFarAhead {
        remote: Timestamp,
        ahead_ms: u64,
        max_drift_ms: u64,
    },
}

/// The clock of one node.
#[derive(Debug, Clone)]
pub struct Hlc {
    last: Timestamp,
    max_drift_ms: u64,
}

impl Hlc {
    /// `last` is the highest timestamp issued or observed before (persisted across restarts).
    pub fn new(last: Timestamp, max_drift_ms: u64) -> Self {
        Self { last, max_drift_ms }
    }

    pub fn last(&self) -> Timestamp {
        self.last
    }

    /// A fresh timestamp, greater than every one issued or observed so far.
    pub fn now(&mut self, wall_ms: u64) -> Timestamp {
        let last_ms = self.last.wall_ms();
        self.last = if wall_ms > last_ms {
            Timestamp::new(wall_ms, 0)
        } else if self.last.logical() < u16::MAX {
            Timestamp(self.last.0 + 1)
        } else {
            // Logical counter exhausted within one millisecond: borrow the next millisecond.
            Timestamp::new(last_ms + 1, 0)
        };
        self.last
    }

    /// Checks a peer's timestamp against our wall clock without moving the clock.
    pub fn check(&self, remote: Timestamp, wall_ms: u64) -> Result<(), ClockError> {
        let ahead_ms = remote.wall_ms().saturating_sub(wall_ms);
        if ahead_ms > self.max_drift_ms {
            return Err(ClockError::TooFarAhead {
                remote,
                ahead_ms,
                max_drift_ms: self.max_drift_ms,
            });
        }
        Ok(())
    }

    /// Moves the clock past a peer's timestamp (after [`Hlc::check`]).
    pub fn observe(&mut self, remote: Timestamp) {
        self.last = self.last.max(remote);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn monotonic_when_the_wall_clock_stalls_or_goes_back() {
        let mut clock = Hlc::new(Timestamp::default(), 1000);
        let a = clock.now(100);
        let b = clock.now(100);
        let c = clock.now(50);
        let d = clock.now(101);
        assert!(a < b && b < c && c < d);
        assert_eq!((a.wall_ms(), a.logical()), (100, 0));
        assert_eq!((c.wall_ms(), c.logical()), (100, 2));
        assert_eq!((d.wall_ms(), d.logical()), (101, 0));
    }

    #[test]
    fn logical_overflow_borrows_a_millisecond() {
        let mut clock = Hlc::new(Timestamp::new(7, u16::MAX), 1000);
        let t = clock.now(7);
        assert_eq!((t.wall_ms(), t.logical()), (8, 0));
    }

    #[test]
    fn observing_orders_later_writes_after_seen_ones() {
        let mut a = Hlc::new(Timestamp::default(), 1000);
        let mut b = Hlc::new(Timestamp::default(), 1000);
        let from_a = a.now(500);
        b.check(from_a, 200).unwrap();
        b.observe(from_a);
        assert!(
            b.now(200) > from_a,
            "b's clock lags, but its next write follows what it saw"
        );
    }

    #[test]
    fn rejects_timestamps_beyond_the_drift_bound() {
        let clock = Hlc::new(Timestamp::default(), 1000);
        assert!(clock.check(Timestamp::new(2000, 0), 1000).is_ok());
        let err = clock.check(Timestamp::new(2001, 0), 1000).unwrap_err();
        assert!(err.to_string().contains("1001 ms ahead"), "{err}");
    }

    proptest! {
        #[test]
        fn strictly_increasing_under_any_wall_clock(walls in proptest::collection::vec(0u64..1_000_000, 1..200)) {
            let mut clock = Hlc::new(Timestamp::default(), u64::MAX);
            let mut prev = Timestamp::default();
            for w in walls {
                let t = clock.now(w);
                prop_assert!(t > prev);
                prop_assert!(t.wall_ms() >= w.min(prev.wall_ms()));
                prev = t;
            }
        }
    }
}

//! The fence lease: how a `fenced` container stops when its agent cannot say it may run.
//!
//! Containers outlive their agent (each is supervised by its own `shoal shim`), so an agent that
//! is killed, frozen (SIGSTOP) or hung would leave its fenced containers running while the
//! majority, which sees the node dead, starts their replacements. The kubelet therefore renews
//! a lease file per fenced pod (`<data dir>/pods/<uid>/fence.lease`) on every pass of its own
//! loop in which that pod may run — the node holds the pod's run lease and is not fenced off
//! ([`renew`]) — so a stuck kubelet, which could not stop the pod when told to, stops renewing
//! too; the shim of a fenced container watches its pod's lease ([`LeaseWatch`]) and kills the
//! container once the lease has not changed for the fence timeout `F`.
//!
//! The shim times the lease on its own monotonic clock from the last *change* it saw, never
//! from a time written in the file: an agent whose clock is off (or faked) cannot stretch it.
//! The timing argument of `scheduler::partition` then holds for a silent agent too: it stops
//! renewing when it goes silent at `t0`, its fenced containers are killed by `t0 + F + POLL`,
//! and the majority replaces them no earlier than `t0 + R`, with `R > D + F + 1 s`.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// The lease file's name in a fenced pod's directory.
pub const FILE: &str = "fence.lease";

/// How often a shim looks at the lease.
pub const POLL: Duration = Duration::from_millis(100);

/// Renews the lease: writes a new content (the agent's pid and a counter that only grows), by a
/// rename so a reader sees the old content or the new one.
pub fn renew(path: &Path, counter: u64) -> io::Result<()> {
    let tmp = path.with_extension("lease.tmp");
    std::fs::write(&tmp, format!("{} {counter}\n", std::process::id()))?;
    std::fs::rename(&tmp, path)
}

/// A shim's view of the lease: pure (the caller reads the file and the clock).
#[derive(Debug, Clone)]
pub struct LeaseWatch {
    timeout: Duration,
    last: Option<String>,
    changed_at: Instant,
}

impl LeaseWatch {
    /// Starts watching at `now`: the container just started, so its agent held the lease then.
    pub fn new(timeout: Duration, now: Instant) -> Self {
        Self {
            timeout,
            last: None,
            changed_at: now,
        }
    }

    /// Takes in the lease's content at `now` (`None`: the file is missing or unreadable, e.g.
    /// the data dir was wiped); returns whether the lease has lapsed.
    pub fn observe(&mut self, content: Option<String>, now: Instant) -> bool {
        if content.is_some() && content != self.last {
            self.last = content;
            self.changed_at = now;
        }
        now.saturating_duration_since(self.changed_at) >= self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_lapses_only_after_the_timeout_without_a_change() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut watch = LeaseWatch::new(Duration::from_secs(1), t0);
        // A missing file right after the start is not a lapse yet.
        assert!(!watch.observe(None, ms(100)));
        assert!(!watch.observe(Some("1 1".into()), ms(500)));
        // Unchanged: the clock runs from the last change (500 ms), not the first look.
        assert!(!watch.observe(Some("1 1".into()), ms(1400)));
        assert!(watch.observe(Some("1 1".into()), ms(1500)));
        // Renewed: valid again.
        assert!(!watch.observe(Some("1 2".into()), ms(1600)));
        // The file vanishes (the data dir wiped): the lease lapses a timeout after the last
        // renewal.
        assert!(!watch.observe(None, ms(2500)));
        assert!(watch.observe(None, ms(2600)));
    }

    #[test]
    fn renewals_change_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let t0 = Instant::now();
        let mut watch = LeaseWatch::new(Duration::from_millis(50), t0);
        renew(&path, 1).unwrap();
        let first = std::fs::read_to_string(&path).ok();
        assert!(!watch.observe(first.clone(), t0 + Duration::from_millis(40)));
        renew(&path, 2).unwrap();
        let second = std::fs::read_to_string(&path).ok();
        assert_ne!(first, second);
        assert!(!watch.observe(second, t0 + Duration::from_millis(80)));
        assert!(!path.with_extension("lease.tmp").exists());
    }
}

//! The fence lease: how a `fenced` container stops when its agent cannot say it may run.
//!
//! Containers outlive their agent (each is supervised by its own `shoal shim`), so an agent that
//! is killed, frozen (SIGSTOP) or hung would leave its fenced containers running while the
//! majority, which sees the node dead, starts their replacements. The kubelet therefore renews
//! a lease file per fenced pod (`<data dir>/pods/<uid>/fence.lease`) on every pass of its own
//! loop in which that pod may run — the node holds the pod's run lease and is not fenced off
//! ([`renew`]) — so a stuck kubelet, which could not stop the pod when told to, stops renewing
//! too. The shim of a fenced container watches its pod's lease ([`LeaseWatch`]) and kills the
//! container at whichever comes first:
//!
//! - **the deadline** written in the file: when the node's run lease on the pod lapses
//!   (`shoal_core::placement::lease::Holder::held_until`), on the host's `CLOCK_MONOTONIC`, which every
//!   process of the host shares and which neither the wall clock nor libfaketime (as the chaos
//!   tool runs it) moves. This is what makes the stop punctual: the timing argument of
//!   `shoal_core::placement::lease` needs the holder to stop its pod within the margin `term - hold`
//!   (1 s) after its lease lapses, and a kubelet pass slowed by a loaded host, or two passes
//!   (a SIGTERM the pod ignores, then the SIGKILL), can take longer than that; the shim polls
//!   every [`POLL`], whatever the kubelet does. (Found by the chaos tool: a fenced pod ran on
//!   two nodes for 270 ms under CI's load.)
//! - **the start's deadline**: when the run lease the kubelet held as it decided the start
//!   ends (`--fence-deadline-ms`). A start comes a little after its decision (sandbox, volumes,
//!   runc — longer on a loaded host); a shim does not start the container at or after this
//!   deadline, and kills it then unless a renewal written after the start moves it. Without
//!   it a container started late ran until the kubelet's next pass or the silence timeout
//!   (found by the chaos tool: a fenced pod ran on two nodes for 930 ms under CI's load).
//! - **silence**: the content has not changed for the fence timeout `F`, timed on the shim's
//!   own clock from the last change it saw (the backstop for a lease file without a deadline).
//!
//! A deadline only ever shortens the run: an agent can at worst kill its own containers early.
//! The timing argument of `shoal_core::placement::partition` holds for a silent agent too: it stops
//! renewing when it goes silent at `t0`, its fenced containers are killed by the deadline it
//! last wrote (at most `t0 + F`) plus `POLL`, and the majority replaces them no earlier than
//! `t0 + R`, with `R > D + F + 1 s`.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

/// The lease file's name in a fenced pod's directory.
pub const FILE: &str = "fence.lease";

/// How often a shim looks at the lease.
pub const POLL: Duration = Duration::from_millis(100);

/// The host's `CLOCK_MONOTONIC` in milliseconds: the clock of a lease's deadline, shared by
/// the agent that writes it and the shim that enforces it.
pub fn monotonic_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| Duration::from(t).as_millis() as u64)
        .unwrap_or(0)
}

/// Renews the lease: writes a new content (the agent's pid, a counter that only grows, and the
/// deadline in [`monotonic_ms`] after which the container must not run), by a rename so a
/// reader sees the old content or the new one.
pub fn renew(path: &Path, counter: u64, deadline_ms: u64) -> io::Result<()> {
    let tmp = path.with_extension("lease.tmp");
    std::fs::write(
        &tmp,
        format!("{} {counter} {deadline_ms}\n", std::process::id()),
    )?;
    std::fs::rename(&tmp, path)
}

/// The deadline a lease's content carries, if any (the third field).
fn deadline(content: &str) -> Option<u64> {
    content.split_whitespace().nth(2)?.parse().ok()
}

/// A shim's view of the lease: pure (the caller reads the file and the clocks).
#[derive(Debug, Clone)]
pub struct LeaseWatch {
    timeout: Duration,
    last: Option<String>,
    changed_at: Instant,
    /// The deadline of the last content seen ([`monotonic_ms`]).
    deadline_ms: Option<u64>,
    /// When the watch began ([`monotonic_ms`]): a deadline before it was written for an
    /// earlier container of the pod, before this one was started.
    started_ms: u64,
}

impl LeaseWatch {
    /// Starts watching at `now` (`monotonic_ms`, read at the same moment): the container just
    /// started. `start_deadline` is when the run lease its agent held when it decided the
    /// start ends: enforced until a renewal written after the start moves it (a start may come
    /// after it: a slow pass on a loaded host). A deadline in the file already past at the
    /// start is the pod's earlier run's (its lease lapsed and was held again; the kubelet
    /// writes the new deadline after the start, in the same pass): it is not enforced, the
    /// start's deadline and the silence timeout are.
    pub fn new(
        timeout: Duration,
        now: Instant,
        monotonic_ms: u64,
        start_deadline: Option<u64>,
    ) -> Self {
        Self {
            timeout,
            last: None,
            changed_at: now,
            deadline_ms: start_deadline,
            started_ms: monotonic_ms,
        }
    }

    /// Takes in the lease's content at `now` and `monotonic_ms` ([`monotonic_ms`], read at the
    /// same moment; `None` content: the file is missing or unreadable, e.g. the data dir was
    /// wiped, and the last deadline seen still stands); returns whether the lease has lapsed.
    pub fn observe(&mut self, content: Option<String>, now: Instant, monotonic_ms: u64) -> bool {
        if let Some(content) = content
            && self.last.as_ref() != Some(&content)
        {
            if let Some(renewed) = deadline(&content).filter(|d| *d > self.started_ms) {
                self.deadline_ms = Some(renewed);
            }
            self.last = Some(content);
            self.changed_at = now;
        }
        self.deadline_ms.is_some_and(|d| monotonic_ms >= d)
            || now.saturating_duration_since(self.changed_at) >= self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_without_a_deadline_lapses_only_after_the_timeout_without_a_change() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut watch = LeaseWatch::new(Duration::from_secs(1), t0, 0, None);
        // A missing file right after the start is not a lapse yet.
        assert!(!watch.observe(None, ms(100), 0));
        assert!(!watch.observe(Some("1 1".into()), ms(500), 0));
        // Unchanged: the clock runs from the last change (500 ms), not the first look.
        assert!(!watch.observe(Some("1 1".into()), ms(1400), 0));
        assert!(watch.observe(Some("1 1".into()), ms(1500), 0));
        // Renewed: valid again.
        assert!(!watch.observe(Some("1 2".into()), ms(1600), 0));
        // The file vanishes (the data dir wiped): the lease lapses a timeout after the last
        // renewal.
        assert!(!watch.observe(None, ms(2500), 0));
        assert!(watch.observe(None, ms(2600), 0));
    }

    #[test]
    fn a_lease_lapses_at_its_deadline_however_recently_it_was_renewed() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut watch = LeaseWatch::new(Duration::from_secs(5), t0, 10_000, None);
        // Renewed at monotonic 10,000 ms with a deadline 700 ms later.
        assert!(!watch.observe(Some("1 1 10700".into()), ms(0), 10_000));
        assert!(!watch.observe(Some("1 1 10700".into()), ms(699), 10_699));
        assert!(watch.observe(Some("1 1 10700".into()), ms(700), 10_700));
        // A renewal moves the deadline; a missing file keeps the last one.
        let mut watch = LeaseWatch::new(Duration::from_secs(5), t0, 10_000, None);
        assert!(!watch.observe(Some("1 1 10700".into()), ms(0), 10_000));
        assert!(!watch.observe(Some("1 2 11200".into()), ms(500), 10_500));
        assert!(!watch.observe(None, ms(1000), 11_000));
        assert!(watch.observe(None, ms(1200), 11_200));
        // A deadline that passes after the container started lapses at once when seen.
        let mut watch = LeaseWatch::new(Duration::from_secs(5), t0, 10_000, None);
        assert!(watch.observe(Some("1 1 10100".into()), ms(200), 10_200));
        // One already past when the container started is its pod's earlier run's (the lease
        // was lost, then held again, and the kubelet writes the new deadline after the start):
        // not enforced; the next renewal's is, and the silence timeout stays.
        let mut watch = LeaseWatch::new(Duration::from_secs(5), t0, 10_000, None);
        assert!(!watch.observe(Some("1 7 9000".into()), ms(0), 10_000));
        assert!(!watch.observe(Some("1 7 9000".into()), ms(100), 10_100));
        assert!(!watch.observe(Some("1 8 10900".into()), ms(200), 10_200));
        assert!(watch.observe(Some("1 8 10900".into()), ms(900), 10_900));
        let mut watch = LeaseWatch::new(Duration::from_secs(5), t0, 10_000, None);
        assert!(!watch.observe(Some("1 7 9000".into()), ms(0), 10_000));
        assert!(!watch.observe(Some("1 7 9000".into()), ms(4_999), 14_999));
        assert!(watch.observe(Some("1 7 9000".into()), ms(5_000), 15_000));
    }

    /// The run lease a start was decided under ends at the start's deadline: a container that
    /// starts after it (a slow pass under load) dies at the first look, whatever stale deadline
    /// the file holds; one that starts before it dies then unless a renewal moves it. (Found
    /// by the chaos tool: a fenced pod started 1 s after its node's run lease ended ran on two
    /// nodes at once for 930 ms under CI's load.)
    #[test]
    fn a_start_is_held_to_the_deadline_of_the_run_lease_it_was_decided_under() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // Started at 10,000 under a lease that ended at 9,500; the file still holds an earlier
        // run's deadline (9,000), which is not enforced, and the start's is.
        let mut watch = LeaseWatch::new(Duration::from_secs(5), t0, 10_000, Some(9_500));
        assert!(watch.observe(Some("1 7 9000".into()), ms(0), 10_000));
        // Started before its deadline: it runs until then.
        let mut watch = LeaseWatch::new(Duration::from_secs(5), t0, 10_000, Some(10_500));
        assert!(!watch.observe(Some("1 7 9000".into()), ms(0), 10_000));
        assert!(!watch.observe(None, ms(400), 10_400));
        assert!(watch.observe(Some("1 7 9000".into()), ms(500), 10_500));
        // A renewal written after the start moves the deadline, later or earlier.
        let mut watch = LeaseWatch::new(Duration::from_secs(5), t0, 10_000, Some(10_500));
        assert!(!watch.observe(Some("1 8 11000".into()), ms(100), 10_100));
        assert!(!watch.observe(Some("1 8 11000".into()), ms(600), 10_600));
        assert!(watch.observe(Some("1 8 11000".into()), ms(1_000), 11_000));
        let mut watch = LeaseWatch::new(Duration::from_secs(5), t0, 10_000, Some(10_500));
        assert!(!watch.observe(Some("1 9 10200".into()), ms(100), 10_100));
        assert!(watch.observe(Some("1 9 10200".into()), ms(200), 10_200));
    }

    #[test]
    fn renewals_change_the_content_and_carry_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let t0 = Instant::now();
        let now = monotonic_ms();
        assert!(now > 0);
        let mut watch = LeaseWatch::new(Duration::from_millis(50), t0, now - 10, None);
        renew(&path, 1, now + 60_000).unwrap();
        let first = std::fs::read_to_string(&path).ok();
        assert!(!watch.observe(first.clone(), t0 + Duration::from_millis(40), now));
        renew(&path, 2, now + 60_000).unwrap();
        let second = std::fs::read_to_string(&path).ok();
        assert_ne!(first, second);
        assert!(!watch.observe(second, t0 + Duration::from_millis(80), now));
        assert!(!path.with_extension("lease.tmp").exists());
        renew(&path, 3, now).unwrap();
        let third = std::fs::read_to_string(&path).ok();
        assert!(watch.observe(third, t0 + Duration::from_millis(90), now));
    }
}

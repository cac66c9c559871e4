//! The memory budget for what peers send a node: bytes of peer frames the endpoint holds — being
//! read off a stream, queued for a local subscriber, or with a local handler until it answers.
//!
//! Each peer (by the node id its certificate names, whatever connection it came on) may hold at
//! most `per_peer_bytes`, and all peers together at most `total_bytes`. A frame is charged its
//! whole announced length before any of its payload is buffered; a frame that does not fit is
//! refused, never waited for, so a peer that floods only loses its own frames.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::sync::{Arc, Mutex};

/// Bytes of peer frames held, per peer and in total, against their limits.
#[derive(Debug)]
pub(crate) struct ReadBudget {
    per_peer_bytes: usize,
    total_bytes: usize,
    state: Mutex<Usage>,
}

#[derive(Debug, Default)]
struct Usage {
    /// Only peers holding bytes have an entry, so the map is bounded by the frames held.
    by_peer: HashMap<Arc<str>, usize>,
    total: usize,
}

/// Why a frame did not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OverBudget {
    #[error(
        "peer {peer} already holds {held} bytes of frames here; {asked} more exceed its {max}-byte budget"
    )]
    Peer {
        peer: Arc<str>,
        held: usize,
        asked: usize,
        max: usize,
    },
    #[error(
        "peers already hold {held} bytes of frames here; {asked} more from {peer} exceed the endpoint's {max}-byte budget"
    )]
    Total {
        peer: Arc<str>,
        held: usize,
        asked: usize,
        max: usize,
    },
}

/// Bytes charged to one peer; dropping it gives them back.
#[derive(Debug)]
pub(crate) struct Held {
    budget: Arc<ReadBudget>,
    peer: Arc<str>,
    bytes: usize,
}

impl ReadBudget {
    pub(crate) fn new(per_peer_bytes: usize, total_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            per_peer_bytes,
            total_bytes,
            state: Mutex::new(Usage::default()),
        })
    }

    /// Charges `bytes` to `peer`, or says which limit they would pass.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        peer: &Arc<str>,
        bytes: usize,
    ) -> Result<Held, OverBudget> {
        let mut usage = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let held = usage.by_peer.get(peer).copied().unwrap_or(0);
        if held.saturating_add(bytes) > self.per_peer_bytes {
            return Err(OverBudget::Peer {
                peer: peer.clone(),
                held,
                asked: bytes,
                max: self.per_peer_bytes,
            });
        }
        if usage.total.saturating_add(bytes) > self.total_bytes {
            return Err(OverBudget::Total {
                peer: peer.clone(),
                held: usage.total,
                asked: bytes,
                max: self.total_bytes,
            });
        }
        *usage.by_peer.entry(peer.clone()).or_default() += bytes;
        usage.total += bytes;
        Ok(Held {
            budget: self.clone(),
            peer: peer.clone(),
            bytes,
        })
    }

    /// Bytes `peer` holds now.
    #[cfg(test)]
    pub(crate) fn held_by(&self, peer: &str) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_peer
            .get(peer)
            .copied()
            .unwrap_or(0)
    }

    /// Bytes all peers hold now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut usage = self
            .budget
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        usage.total -= self.bytes;
        if let Some(held) = usage.by_peer.get_mut(&self.peer) {
            *held -= self.bytes;
            if *held == 0 {
                usage.by_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_holds_at_most_its_share_and_all_peers_at_most_the_total() {
        let budget = ReadBudget::new(100, 150);
        let (a, b): (Arc<str>, Arc<str>) = ("alpha".into(), "beta".into());
        let first = budget.reserve(&a, 60).unwrap();
        let second = budget.reserve(&a, 40).unwrap();
        assert_eq!(
            budget.reserve(&a, 1).unwrap_err(),
            OverBudget::Peer {
                peer: a.clone(),
                held: 100,
                asked: 1,
                max: 100
            }
        );
        let third = budget.reserve(&b, 50).unwrap();
        let err = budget.reserve(&b, 1).unwrap_err();
        assert!(
            matches!(
                err,
                OverBudget::Total {
                    held: 150,
                    max: 150,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("beta"), "names the peer: {err}");
        drop(first);
        assert_eq!((budget.held_by("alpha"), budget.held()), (40, 90));
        let fourth = budget.reserve(&b, 50).unwrap();
        drop((second, third, fourth));
        assert_eq!((budget.held_by("alpha"), budget.held_by("beta")), (0, 0));
        assert_eq!(budget.held(), 0);
        assert!(
            budget
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .by_peer
                .is_empty()
        );
    }

    /// A panic while the budget's lock is held (a bug elsewhere) must not stop every later
    /// frame of every peer: the lock is recovered, not unwrapped.
    #[test]
    fn a_panic_while_the_lock_is_held_does_not_stop_later_reservations() {
        let budget = ReadBudget::new(100, 150);
        let peer: Arc<str> = "alpha".into();
        let held = budget.reserve(&peer, 10).unwrap();
        let poisoner = budget.clone();
        let panicked = std::thread::spawn(move || {
            let _usage = poisoner
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            panic!("a bug while the budget is held");
        })
        .join();
        assert!(panicked.is_err());
        assert!(budget.state.is_poisoned());
        let more = budget.reserve(&peer, 20).expect("reserves after the panic");
        drop((held, more));
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn an_empty_frame_always_fits_and_a_huge_one_never_overflows() {
        let budget = ReadBudget::new(10, 10);
        let peer: Arc<str> = "alpha".into();
        let _full = budget.reserve(&peer, 10).unwrap();
        assert!(budget.reserve(&peer, 0).is_ok());
        assert!(budget.reserve(&peer, usize::MAX).is_err());
    }
}

//! The tombstone horizon between replicas: who may merge from whom, so that nothing deleted comes
//! back (DESIGN.md §5, §11 invariant 10). Pure: time is an input; [`crate::Store`] keeps and
//! persists a [`Currency`], and [`crate::sync`] applies the [`Plan`].
//!
//! A store forgets a tombstone once it is older than the horizon
//! ([`crate::Store::collect_tombstones`]). A replica that still holds the deleted object live
//! (it was away when the delete happened) must then never be merged from as it is: the object
//! would come back, and spread. So every replica tells each peer its [`Currency`] (every `Buckets`
//! answer carries it, every push its last sync): when it last synced and was last current, how far
//! deletes have been forgotten (by it, or by a replica whose state it took), and since when it
//! has been current.
//!
//! **The model** (what a horizon assumes; README: "a delete must reach every node within the
//! horizon"): a replica that runs keeps syncing with the others that run, so a delete reaches
//! every running replica well within the horizon; a replica that stops, or is cut off, for longer
//! than the horizon may have missed deletes that are forgotten since.
//!
//! **The rules**, each a line of [`Currency::plan`] or [`Currency::after_sync`]:
//! - *Lapsed*: a replica away for longer than the horizon — it neither synced nor ran
//!   ([`Currency::lapsed`]; one running alone stays current: under the model no other replica
//!   runs to delete anything meanwhile) — may hold objects deleted and forgotten anywhere, even by
//!   replicas it never heard of (a node that joined after the collection knows no horizon
//!   either). A replica that is not lapsed never merges from a lapsed one, by session or push:
//!   the lapsed one resyncs first.
//! - *Vouching*: a lapsed replica resyncs from a peer that vouches for its state
//!   ([`Currency::vouches`]): one that is not lapsed and has been current for a whole horizon (so
//!   it saw every delete not yet forgotten), or holds a forgotten horizon (it collected, or took
//!   the state of one that vouched). The resync pulls the peer's whole state, merges it, and drops
//!   what the peer lacks and could have forgotten: an incarnation created before the peer's
//!   horizon and held here since before this replica's last sync (a delete wins over updates, so
//!   one updated since goes too; so does one that reached it from another replica since, as a push
//!   to it while lapsed: it was not current to see that incarnation's delete). It keeps what it
//!   created itself since, and what the peer never had (an
//!   incarnation created after everything the peer forgot cannot be one of its forgotten
//!   deletes), which the peer then pulls. Only such a resync makes a lapsed replica current
//!   again. Syncing with a peer that cannot vouch (an empty new node, another
//!   lapsed one) merges as usual but refreshes nothing: a node back from an absence and a new one
//!   cannot vouch for each other, whatever they exchange. (Before, any completed session counted:
//!   a returning node and a node that joined after a collection made each other current and the
//!   deleted object came back through them.)
//! - *Learned horizon*: after a session in which a replica compared every bucket with a peer and
//!   pulled what differed, or after it resynced from the peer, it adopts `collected_through =
//!   max(own, peer's)` — in the same commit as the last entries merged. Sound because the session
//!   is only a merge if the replica is not [`Currency::behind`] the peer's horizon: it synced after
//!   the peer's latest forgotten delete, so (model) it saw that delete and holds the tombstone or
//!   never held the object; a resync dropped what the peer lacked. Either way it holds nothing the
//!   peer forgot, so it may judge others by the peer's horizon: from then on it refuses, as the
//!   peer does, a replica that has not synced since, and is itself behind a peer that learned a
//!   later one. (A replica behind the peer, or that the peer finds behind, adopts nothing: it
//!   resyncs, or is refused.)
//! - *Whole-cluster outage* longer than the horizon: every replica comes back lapsed and none
//!   vouches. They merge as usual (nothing was forgotten while none ran), and one back for a whole
//!   horizon without meeting a replica that vouches counts as current again
//!   ([`Currency::observe`]; model: no current replica was running meanwhile).
//!
//! **Not refused outright**: an entry older than the horizon that this replica does not hold. It
//! may be an object deleted and forgotten here, but as well one a new replica has not pulled yet,
//! or one a returning replica created while away, before a delete forgotten since: refusing it
//! would lose it, or keep two replicas different forever. The rules judge the peer before anything
//! of it is merged instead. Only where a peer's currency is unknown (an entry sent outside a push
//! or a session) is such an entry refused ([`crate::Store::merge_unvouched_at`]); anti-entropy
//! brings it if it is legitimate.
//!
//! **Limits** (outside the model): a partition longer than the horizon in which both sides keep
//! running, or a whole-cluster outage after which the replicas that saw a delete come back last
//! (after others ran a whole horizon without them), can bring that delete back.

use serde::{Deserialize, Serialize};

/// How current a replica is, as it tells its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Currency {
    /// When the replica last synced in a way that counts (wall ms; 0: never): what it held then
    /// had reached its peers, and it had seen their deletes.
    pub last_sync_ms: u64,
    /// The latest deletion time (wall ms) among the tombstones forgotten by this replica or by a
    /// replica whose state it took (0: none).
    pub collected_through_ms: u64,
    /// Since when the replica has been current without a break, or, while lapsed, since when it
    /// is back (wall ms; 0: unknown).
    pub current_since_ms: u64,
    /// The last time the replica was current: it synced, or it has run without a break since
    /// (wall ms; 0: never synced). A replica running alone stays current: the others are away.
    pub current_ms: u64,
}

/// The settings a replica judges currencies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizon {
    /// How long tombstones are kept.
    pub tombstone_ms: u64,
    /// The clock-drift bound, a margin on deletion times.
    pub drift_ms: u64,
}

/// What a replica does with a peer whose [`Currency`] it has just learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Pull the entries that differ and merge them.
    Merge,
    /// Pull the peer's whole state and adopt it ([`crate::Store::resync`]).
    Resync,
    /// Merge nothing of the peer: it must resync first.
    PeerResyncs,
}

impl Currency {
    /// When the replica was last current (a peer of an older version sends only its last sync).
    fn last_current_ms(&self) -> u64 {
        self.current_ms.max(self.last_sync_ms)
    }

    /// Has been away (stopped, or not current) for longer than the horizon. A replica that
    /// never synced is not lapsed: it holds nothing it could have missed a delete of, but what
    /// it wrote itself.
    pub fn lapsed(&self, now_ms: u64, horizon: Horizon) -> bool {
        let current = self.last_current_ms();
        current != 0 && current.saturating_add(horizon.tombstone_ms) < now_ms
    }

    /// Has not synced since a delete that a replica which forgot deletes through
    /// `collected_through_ms` may have forgotten (the drift bound as a margin).
    pub fn behind(&self, collected_through_ms: u64, horizon: Horizon) -> bool {
        collected_through_ms > 0
            && self.last_sync_ms < collected_through_ms.saturating_add(horizon.drift_ms)
    }

    /// A lapsed replica may take this replica's state as the cluster's: it is not lapsed, and
    /// has been current for a whole horizon or holds a forgotten horizon.
    pub fn vouches(&self, now_ms: u64, horizon: Horizon) -> bool {
        !self.lapsed(now_ms, horizon)
            && (self.collected_through_ms > 0
                || (self.current_since_ms != 0
                    && self.current_since_ms.saturating_add(horizon.tombstone_ms) <= now_ms))
    }

    /// A peer's forgotten horizon as this replica believes it: a delete is forgotten once older
    /// than the horizon, so one said to be forgotten later than that (give or take the drift) is
    /// bounded there — a peer's bad clock or a bad value must not spread as a horizon that puts
    /// every replica behind.
    pub(crate) fn believed(&self, now_ms: u64, horizon: Horizon) -> Currency {
        let latest = now_ms
            .saturating_add(horizon.drift_ms)
            .saturating_sub(horizon.tombstone_ms);
        Currency {
            collected_through_ms: self.collected_through_ms.min(latest),
            ..*self
        }
    }

    /// What this replica does with `peer`'s state (see the module doc).
    pub fn plan(&self, peer: &Currency, now_ms: u64, horizon: Horizon) -> Plan {
        let peer = &peer.believed(now_ms, horizon);
        let lapsed = self.lapsed(now_ms, horizon);
        if peer.lapsed(now_ms, horizon) && !lapsed {
            Plan::PeerResyncs
        } else if lapsed && peer.vouches(now_ms, horizon)
            || self.behind(peer.collected_through_ms, horizon)
        {
            Plan::Resync
        } else if peer.behind(self.collected_through_ms, horizon) {
            Plan::PeerResyncs
        } else {
            Plan::Merge
        }
    }

    /// Whether a push from a replica that last synced at `pusher_last_sync_ms` may be merged
    /// (a push carries only that: a pusher that ran alone since looks lapsed until it syncs).
    pub fn accepts_push(&self, pusher_last_sync_ms: u64, now_ms: u64, horizon: Horizon) -> bool {
        let pusher = Currency {
            last_sync_ms: pusher_last_sync_ms,
            ..Currency::default()
        };
        let away = pusher.lapsed(now_ms, horizon) && !self.lapsed(now_ms, horizon);
        !away && !pusher.behind(self.collected_through_ms, horizon)
    }

    /// This replica's currency after a completed [`Plan::Merge`] or [`Plan::Resync`] with `peer`.
    pub fn after_sync(&self, peer: &Currency, now_ms: u64, horizon: Horizon) -> Currency {
        let peer = &peer.believed(now_ms, horizon);
        let mut next = *self;
        next.collected_through_ms = self.collected_through_ms.max(peer.collected_through_ms);
        let vouched = peer.vouches(now_ms, horizon);
        if !self.lapsed(now_ms, horizon) || vouched {
            // In contact with the cluster (a lapsed replica only through a resync from a peer
            // that vouches: the plan made it one).
            next.last_sync_ms = self.last_sync_ms.max(now_ms);
            next.current_ms = self.current_ms.max(now_ms);
            if next.current_since_ms == 0 {
                next.current_since_ms = now_ms;
            }
        } else if peer.lapsed(now_ms, horizon) {
            // Two lapsed replicas: what was merged is no more current than the peer was.
            next.last_sync_ms = self.last_sync_ms.max(peer.last_sync_ms);
            next.current_ms = self.current_ms.max(peer.last_current_ms());
        }
        if vouched && peer.current_since_ms != 0 {
            next.current_since_ms = match next.current_since_ms {
                0 => peer.current_since_ms,
                mine => mine.min(peer.current_since_ms),
            };
        }
        next
    }

    /// After seeing its digest equal to every live peer's: a replica that is not lapsed is in
    /// contact; a lapsed one is not made current by it (its peers may be as lapsed as it is).
    pub fn after_equal_digests(&self, now_ms: u64, horizon: Horizon) -> Currency {
        if self.lapsed(now_ms, horizon) {
            return self.observe(now_ms, horizon);
        }
        let mut next = *self;
        next.last_sync_ms = self.last_sync_ms.max(now_ms);
        next.current_ms = self.current_ms.max(now_ms);
        if next.current_since_ms == 0 {
            next.current_since_ms = now_ms;
        }
        next
    }

    /// Notes that the replica runs at `now_ms`. One that is current stays so (running alone, it
    /// sees every delete: no other replica runs). One that is lapsed records since when it is
    /// back, and once back for a whole horizon without meeting a peer that vouches counts as
    /// current again (no replica that stayed current was running: the whole cluster was away).
    pub fn observe(&self, now_ms: u64, horizon: Horizon) -> Currency {
        let mut next = *self;
        let current = self.last_current_ms();
        if !self.lapsed(now_ms, horizon) {
            if current != 0 {
                next.current_ms = self.current_ms.max(now_ms);
            }
        } else if self.current_since_ms <= current {
            next.current_since_ms = now_ms;
        } else if self.current_since_ms.saturating_add(horizon.tombstone_ms) <= now_ms {
            next.current_ms = now_ms;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Horizon = Horizon {
        tombstone_ms: 1_000,
        drift_ms: 10,
    };
    const NOW: u64 = 100_000;

    fn currency(last_sync_ms: u64, collected_through_ms: u64, current_since_ms: u64) -> Currency {
        Currency {
            last_sync_ms,
            collected_through_ms,
            current_since_ms,
            current_ms: last_sync_ms,
        }
    }

    /// A replica current for long, one current for a moment, one back from an absence, an
    /// empty new one, and one that forgot a delete.
    fn cases() -> [(&'static str, Currency); 5] {
        [
            ("current", currency(NOW - 5, 0, NOW - 5_000)),
            ("recent", currency(NOW - 5, 0, NOW - 50)),
            ("lapsed", currency(NOW - 2_000, 0, NOW - 9_000)),
            ("new", currency(0, 0, 0)),
            ("collector", currency(NOW - 5, NOW - 1_500, NOW - 50)),
        ]
    }

    #[test]
    fn lapsed_vouches_and_behind() {
        let verdicts: Vec<(&str, bool, bool)> = cases()
            .iter()
            .map(|(name, c)| (*name, c.lapsed(NOW, H), c.vouches(NOW, H)))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("current", false, true),
                ("recent", false, false),
                ("lapsed", true, false),
                ("new", false, false),
                ("collector", false, true),
            ]
        );
        let collector = cases()[4].1;
        assert!(cases()[2].1.behind(collector.collected_through_ms, H));
        assert!(cases()[3].1.behind(collector.collected_through_ms, H));
        assert!(!cases()[0].1.behind(collector.collected_through_ms, H));
    }

    /// Who does what with whom: rows are the replica, columns the peer.
    #[test]
    fn plans() {
        use Plan::{Merge as M, PeerResyncs as P, Resync as R};
        let expected = [
            // current, recent, lapsed, new, collector
            [M, M, P, M, M], // current
            [M, M, P, M, M], // recent
            [R, M, M, M, R], // lapsed (resyncs from those that vouch)
            [M, M, P, M, R], // new (behind the collector's horizon)
            [M, M, P, P, M], // collector (the new one has not synced since its horizon)
        ];
        for (row, (name, mine)) in cases().iter().enumerate() {
            for (column, (peer_name, peer)) in cases().iter().enumerate() {
                assert_eq!(
                    mine.plan(peer, NOW, H),
                    expected[row][column],
                    "{name} with {peer_name}"
                );
            }
        }
    }

    #[test]
    fn only_a_peer_that_vouches_makes_a_lapsed_replica_current() {
        let [current, recent, lapsed, new, collector] = cases().map(|(_, c)| c);
        for peer in [recent, new] {
            let after = lapsed.after_sync(&peer, NOW, H);
            assert_eq!(after.last_sync_ms, lapsed.last_sync_ms, "{peer:?}");
            assert!(after.lapsed(NOW, H));
        }
        // Two lapsed replicas: the later of their last syncs, still lapsed.
        let other = currency(NOW - 1_500, 0, NOW - 9_000);
        assert_eq!(lapsed.after_sync(&other, NOW, H).last_sync_ms, NOW - 1_500);
        for peer in [current, collector] {
            let after = lapsed.after_sync(&peer, NOW, H);
            assert_eq!(after.last_sync_ms, NOW);
            assert!(after.vouches(NOW, H), "{peer:?}");
            assert_eq!(
                after.collected_through_ms, peer.collected_through_ms,
                "the horizon is learned with the state"
            );
        }
        // A replica that is not lapsed is in contact with any peer it may merge from, and
        // vouches once the peer does.
        let after = new.after_sync(&recent, NOW, H);
        assert_eq!((after.last_sync_ms, after.current_since_ms), (NOW, NOW));
        assert!(!after.vouches(NOW, H));
        assert!(new.after_sync(&current, NOW, H).vouches(NOW, H));
    }

    #[test]
    fn pushes_from_lapsed_or_behind_replicas_are_refused() {
        let [current, _, lapsed, new, collector] = cases().map(|(_, c)| c);
        assert!(!current.accepts_push(lapsed.last_sync_ms, NOW, H));
        assert!(!new.accepts_push(lapsed.last_sync_ms, NOW, H));
        assert!(lapsed.accepts_push(lapsed.last_sync_ms, NOW, H));
        assert!(current.accepts_push(0, NOW, H), "a new replica's writes");
        assert!(!collector.accepts_push(0, NOW, H), "behind its horizon");
        assert!(collector.accepts_push(current.last_sync_ms, NOW, H));
    }

    #[test]
    fn a_lapsed_replica_seeing_equal_digests_stays_lapsed_until_back_for_a_horizon() {
        let [_, recent, lapsed, new, _] = cases().map(|(_, c)| c);
        assert_eq!(recent.after_equal_digests(NOW, H).last_sync_ms, NOW);
        assert_eq!(new.after_equal_digests(NOW, H).current_since_ms, NOW);
        let back = lapsed.after_equal_digests(NOW, H);
        assert!(back.lapsed(NOW, H));
        assert_eq!(back.current_since_ms, NOW, "back since now");
        let still = back.observe(NOW + H.tombstone_ms - 1, H);
        assert_eq!(still, back);
        let current = still.observe(NOW + H.tombstone_ms, H);
        assert!(!current.lapsed(NOW + H.tombstone_ms, H));
        assert!(current.vouches(NOW + H.tombstone_ms, H));
    }

    #[test]
    fn a_horizon_later_than_possible_is_not_believed() {
        let [current, ..] = cases().map(|(_, c)| c);
        let liar = currency(NOW - 5, u64::MAX, NOW - 5_000);
        assert_eq!(current.plan(&liar, NOW, H), Plan::Merge);
        let after = current.after_sync(&liar, NOW, H);
        assert_eq!(
            after.collected_through_ms,
            NOW + H.drift_ms - H.tombstone_ms
        );
        assert!(!after.behind(after.collected_through_ms, H));
    }

    /// A replica that keeps running while its peers are away stays current (and vouches for
    /// them when they come back); one that stopped does not become current by starting again.
    #[test]
    fn running_alone_keeps_a_replica_current_stopping_does_not() {
        let [current, ..] = cases().map(|(_, c)| c);
        let mut alone = current;
        for minute in 1..=100 {
            alone = alone.observe(NOW + minute * 60, H);
        }
        let later = NOW + 6_000;
        assert!(!alone.lapsed(later, H) && alone.vouches(later, H));
        assert_eq!(
            alone.last_sync_ms, current.last_sync_ms,
            "no sync for all that"
        );
        let back = current.observe(later, H);
        assert!(back.lapsed(later, H));
        assert_eq!(back.current_since_ms, later);
    }
}

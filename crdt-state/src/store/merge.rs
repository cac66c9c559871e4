//! How a store takes its peers' state: merges of pushed or pulled entries, the end of an
//! anti-entropy session (which records the sync and learns the peer's horizon in the same commit
//! as the last entries merged), resyncs, and tombstone collection. Who may merge from whom across
//! the tombstone horizon is decided in [`crate::horizon`]; this file carries it out.

use std::collections::BTreeSet;

use crate::crdt::ObjectState;
use crate::digest::bucket_of;
use crate::horizon::Currency;
use crate::kind::ObjectKey;
use crate::sync::WireEntry;

use super::{
    Change, EventType, META_COLLECTED_THROUGH_MS, META_CURRENT_MS, META_CURRENT_SINCE_MS,
    META_LAST_SYNC_MS, MergeOutcome, Store, StoreError, StoredEntry, now_ms, validate_remote,
};

/// What [`Store::prepare_merge`] refuses beyond invalid entries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Vetting {
    /// The peer's currency was checked (a push, a session): every valid entry merges.
    Vouched,
    /// The peer's currency is unknown: an incarnation this store does not hold, created at or
    /// before its horizon, may be an object deleted and forgotten here, and is refused.
    Unvouched,
}

impl Store {
    /// Merges entries received from a peer; persists those that change anything in one
    /// transaction. Entries that fail validation are refused one by one (named in the result),
    /// the others still merge. The caller has checked the peer ([`Store::peer_must_resync`]).
    pub fn merge_remote(&mut self, entries: Vec<WireEntry>) -> Result<MergeOutcome, StoreError> {
        self.merge_remote_at(entries, now_ms())
    }

    pub fn merge_remote_at(
        &mut self,
        entries: Vec<WireEntry>,
        now_ms: u64,
    ) -> Result<MergeOutcome, StoreError> {
        let (updates, rejected) = self.prepare_merge(entries, now_ms, Vetting::Vouched);
        let changes = self.commit_merge(&[], updates, None)?;
        Ok(MergeOutcome { changes, rejected })
    }

    /// Merges entries from a peer whose currency is unknown (sent outside a push or a session,
    /// e.g. a home node's state of a key with its refusal): as [`Store::merge_remote_at`], but an
    /// incarnation this store does not hold, created at or before the horizon it knows, is
    /// refused — it may be an object deleted here and forgotten. If it is not, anti-entropy
    /// brings it (see [`crate::horizon`]).
    pub fn merge_unvouched_at(
        &mut self,
        entries: Vec<WireEntry>,
        now_ms: u64,
    ) -> Result<MergeOutcome, StoreError> {
        let (updates, rejected) = self.prepare_merge(entries, now_ms, Vetting::Unvouched);
        let changes = self.commit_merge(&[], updates, None)?;
        Ok(MergeOutcome { changes, rejected })
    }

    /// Ends an anti-entropy session that merged from `peer` ([`crate::horizon::Plan::Merge`]):
    /// merges the last `entries` pulled, records the sync and adopts the peer's horizon, in one
    /// commit.
    pub(crate) fn merge_synced(
        &mut self,
        entries: Vec<WireEntry>,
        peer: &Currency,
        now_ms: u64,
    ) -> Result<MergeOutcome, StoreError> {
        let (updates, rejected) = self.prepare_merge(entries, now_ms, Vetting::Vouched);
        let next = self.currency.after_sync(peer, now_ms, self.horizon());
        let changes = self.commit_merge(&[], updates, Some(next))?;
        Ok(MergeOutcome { changes, rejected })
    }

    /// Resyncs from `entries`, the whole state of a peer of currency `peer`
    /// ([`crate::horizon::Plan::Resync`]): drops what the peer lacks and could have forgotten —
    /// an incarnation created no later than the peer's horizon, held here since before this
    /// store's last sync (a tombstone: deleted before it) — reporting live ones DELETED to
    /// watchers; merges the rest (the peer's entries, what was written here since, what the peer
    /// never had); records the sync and adopts the peer's horizon. One commit.
    pub fn resync(
        &mut self,
        entries: Vec<WireEntry>,
        peer: &Currency,
        now_ms: u64,
    ) -> Result<MergeOutcome, StoreError> {
        let next = self.currency.after_sync(peer, now_ms, self.horizon());
        let forgotten = peer.believed(now_ms, self.horizon()).collected_through_ms;
        self.resync_to(entries, forgotten, true, next, now_ms)
    }

    /// Resyncs from a peer's full state, its currency unknown: drops every entry the peer lacks
    /// that nothing touched here since this store's last sync (an incarnation created before it,
    /// a tombstone deleted before it), merges the rest, and counts as a sync. Prefer
    /// [`Store::resync`], which drops only what the peer could have forgotten.
    pub fn adopt(
        &mut self,
        entries: Vec<WireEntry>,
        now_ms: u64,
    ) -> Result<MergeOutcome, StoreError> {
        let mut next = self.currency;
        next.last_sync_ms = next.last_sync_ms.max(now_ms);
        next.current_ms = next.current_ms.max(now_ms);
        if next.current_since_ms == 0 {
            next.current_since_ms = now_ms;
        }
        self.resync_to(entries, u64::MAX, false, next, now_ms)
    }

    /// `only_own_since`: of what the peer lacks and could have forgotten (created before
    /// `forgotten_through_ms`), keep only the incarnations this store created itself since its
    /// last sync — not ones that reached it from others since (a push to a replica away longer
    /// than the horizon: it never became current, so it may not have seen their delete; found by
    /// `tests/horizon.rs`, 2026-12-06).
    fn resync_to(
        &mut self,
        entries: Vec<WireEntry>,
        forgotten_through_ms: u64,
        only_own_since: bool,
        next: Currency,
        now_ms: u64,
    ) -> Result<MergeOutcome, StoreError> {
        let theirs: BTreeSet<&ObjectKey> = entries.iter().map(|e| &e.key).collect();
        let since = self.resync_since();
        let me = self.config.node;
        let gone: Vec<ObjectKey> = self
            .entries
            .iter()
            .filter(|(k, e)| {
                !theirs.contains(k)
                    && if e.state.is_deleted() {
                        e.state.max_stamp().time.wall_ms() <= since
                    } else {
                        let created = e.state.created;
                        let at = created.time.wall_ms();
                        at <= forgotten_through_ms
                            && (at <= since || (only_own_since && created.node != me))
                    }
            })
            .map(|(k, _)| k.clone())
            .collect();
        drop(theirs);
        let (updates, rejected) = self.prepare_merge(entries, now_ms, Vetting::Vouched);
        let changes = self.commit_merge(&gone, updates, Some(next))?;
        Ok(MergeOutcome { changes, rejected })
    }

    /// What this store held at its last sync had reached its peers. The time as read from disk
    /// may lag the last sync by up to the persist interval: what came within it counts as held
    /// then too.
    fn resync_since(&self) -> u64 {
        let last = self.currency.last_sync_ms;
        if last != 0 && last == self.last_sync_at_open {
            last.saturating_add(self.sync_persist_interval_ms())
        } else {
            last
        }
    }

    /// Records that this store's digest equals every live peer's: a sync, unless this store is
    /// away longer than the horizon (then its peers may be as stale as it is: see
    /// [`crate::horizon`]). The time is persisted at most once a minute.
    pub fn mark_synced(&mut self, now_ms: u64) -> Result<(), StoreError> {
        let next = self.currency.after_equal_digests(now_ms, self.horizon());
        self.set_currency(next)
    }

    /// Notes that this store runs at `now_ms` (see [`Currency::observe`]).
    pub(crate) fn observe(&mut self, now_ms: u64) -> Result<(), StoreError> {
        let next = self.currency.observe(now_ms, self.horizon());
        self.set_currency(next)
    }

    /// The last sync and current times are persisted at most this often (a minute, or a quarter
    /// of a short horizon, so that a store that runs never looks away longer than the horizon).
    pub(crate) fn sync_persist_interval_ms(&self) -> u64 {
        (self.horizon().tombstone_ms / 4).clamp(1, 60_000)
    }

    /// The meta entries that persist `next`, if anything of it must be persisted now (the last
    /// sync and current times only once per persist interval).
    fn currency_meta(&self, next: Currency) -> Vec<(&'static str, u64)> {
        let on_disk = self.persisted;
        let interval = self.sync_persist_interval_ms();
        let due = |on_disk: u64, next: u64| {
            next != on_disk
                && (on_disk == 0 || next < on_disk || next >= on_disk.saturating_add(interval))
        };
        if due(on_disk.last_sync_ms, next.last_sync_ms)
            || due(on_disk.current_ms, next.current_ms)
            || next.collected_through_ms != on_disk.collected_through_ms
            || next.current_since_ms != on_disk.current_since_ms
        {
            vec![
                (META_LAST_SYNC_MS, next.last_sync_ms),
                (META_COLLECTED_THROUGH_MS, next.collected_through_ms),
                (META_CURRENT_SINCE_MS, next.current_since_ms),
                (META_CURRENT_MS, next.current_ms),
            ]
        } else {
            Vec::new()
        }
    }

    fn set_currency(&mut self, next: Currency) -> Result<(), StoreError> {
        let meta = self.currency_meta(next);
        if !meta.is_empty() {
            self.commit(&[], &meta)?;
            self.persisted = next;
        }
        self.currency = next;
        Ok(())
    }

    fn is_past_horizon(&self, state: &ObjectState, now_ms: u64) -> bool {
        state
            .deleted
            .is_some_and(|d| now_ms.saturating_sub(d.time.wall_ms()) > self.horizon().tombstone_ms)
    }

    /// The new states `entries` give this store (validated; several entries of one key joined),
    /// and the entries refused.
    fn prepare_merge(
        &self,
        entries: Vec<WireEntry>,
        now_ms: u64,
        vetting: Vetting,
    ) -> (Vec<(ObjectKey, ObjectState)>, Vec<StoreError>) {
        let mut rejected = Vec::new();
        let mut updates: Vec<(ObjectKey, ObjectState)> = Vec::new();
        for WireEntry { key, state } in entries {
            let refuse = |reason: String| StoreError::Rejected {
                key: key.to_string(),
                reason,
            };
            if let Err(reason) = validate_remote(&key, &state) {
                rejected.push(refuse(reason));
                continue;
            }
            if let Err(e) = self.hlc.check(state.max_stamp().time, now_ms) {
                rejected.push(refuse(e.to_string()));
                continue;
            }
            let merged = match updates.iter_mut().find(|(k, _)| *k == key) {
                Some((_, pending)) => {
                    pending.merge(&state);
                    continue;
                }
                None => match self.entries.get(&key) {
                    Some(current) => {
                        let mut merged = current.state.clone();
                        merged.merge(&state);
                        if merged == current.state {
                            continue;
                        }
                        merged
                    }
                    None => {
                        if self.is_past_horizon(&state, now_ms) {
                            continue; // a tombstone we already forgot: keep it forgotten
                        }
                        let through = self.currency.collected_through_ms;
                        if vetting == Vetting::Unvouched
                            && !state.is_deleted()
                            && state.created.time.wall_ms() <= through
                        {
                            rejected.push(refuse(format!(
                                "an object created before deletes this node has forgotten (through {through} ms), from a peer not known to be current: it may be one of them"
                            )));
                            continue;
                        }
                        state
                    }
                },
            };
            updates.push((key, merged));
        }
        (updates, rejected)
    }

    /// Drops `removals`, installs `updates` and persists `currency` (if due) in one commit;
    /// returns the changes watchers see (live entries dropped are DELETED). A failed commit
    /// changes nothing in memory.
    fn commit_merge(
        &mut self,
        removals: &[ObjectKey],
        updates: Vec<(ObjectKey, ObjectState)>,
        currency: Option<Currency>,
    ) -> Result<Vec<Change>, StoreError> {
        let meta = currency.map_or_else(Vec::new, |next| self.currency_meta(next));
        if removals.is_empty() && updates.is_empty() && meta.is_empty() {
            if let Some(next) = currency {
                self.currency = next;
            }
            return Ok(Vec::new());
        }
        for (_, state) in &updates {
            self.hlc.observe(state.max_stamp().time);
        }
        let live_gone = removals
            .iter()
            .filter(|k| self.entries.get(*k).is_some_and(|e| !e.state.is_deleted()))
            .count() as u64;
        let first_rv = self.seq + 1;
        let stored: Vec<(ObjectKey, StoredEntry)> = updates
            .into_iter()
            .enumerate()
            .map(|(i, (key, state))| {
                let resource_version = first_rv + live_gone + i as u64;
                (
                    key,
                    StoredEntry {
                        state,
                        resource_version,
                    },
                )
            })
            .collect();
        let added = live_gone + stored.len() as u64;
        self.seq += added;
        let refs: Vec<(&ObjectKey, Option<&StoredEntry>)> = removals
            .iter()
            .map(|k| (k, None))
            .chain(stored.iter().map(|(k, e)| (k, Some(e))))
            .collect();
        if let Err(e) = self.commit(&refs, &meta) {
            self.seq -= added;
            return Err(e);
        }
        let mut changes = Vec::new();
        let mut rv = first_rv;
        for key in removals {
            if let Some(entry) = self.entries.remove(key) {
                self.digest.toggle(bucket_of(key), &entry.hash);
                if !entry.state.is_deleted() {
                    let change = Change {
                        resource_version: rv,
                        key: key.clone(),
                        event: EventType::Deleted,
                        object: Self::present(key, &entry),
                    };
                    rv += 1;
                    self.record_change(change.clone());
                    changes.push(change);
                }
            }
        }
        for (key, entry) in stored {
            if let Some(change) = self.install(&key, entry.state, entry.resource_version) {
                changes.push(change);
            }
        }
        if let Some(next) = currency {
            self.currency = next;
            if !meta.is_empty() {
                self.persisted = next;
            }
        }
        Ok(changes)
    }

    /// Forgets tombstones older than the horizon; returns how many. Peers that have not synced
    /// since the latest of these deletes are then [`Store::behind`] this store, and so are they
    /// behind every store that syncs with it afterwards (it learns the horizon).
    pub fn collect_tombstones(&mut self, now_ms: u64) -> Result<usize, StoreError> {
        self.observe(now_ms)?;
        let old: Vec<(ObjectKey, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| self.is_past_horizon(&e.state, now_ms))
            .map(|(k, e)| (k.clone(), e.state.deleted.map_or(0, |d| d.time.wall_ms())))
            .collect();
        if old.is_empty() {
            return Ok(0);
        }
        let mut next = self.currency;
        next.collected_through_ms = old
            .iter()
            .map(|(_, at)| *at)
            .max()
            .unwrap_or(0)
            .max(next.collected_through_ms);
        let refs: Vec<(&ObjectKey, Option<&StoredEntry>)> =
            old.iter().map(|(k, _)| (k, None)).collect();
        self.commit(&refs, &self.currency_meta(next))?;
        self.currency = next;
        self.persisted = next;
        for (key, _) in &old {
            if let Some(entry) = self.entries.remove(key) {
                self.digest.toggle(bucket_of(key), &entry.hash);
            }
        }
        Ok(old.len())
    }
}

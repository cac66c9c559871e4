//! How the store's commits reach the disk.
//!
//! Every change goes through [`Store::commit`]: its records (objects written or dropped, the
//! sequence, the clock and other meta) enter the journal, keyed, so a later commit of the same
//! key replaces an earlier one not yet written. Then:
//!
//! - **Immediate** (no [`StoreConfig::write_behind`]; tests, tools, simulators): the journal is
//!   written and fsync'd before the commit returns; a failed write changes nothing, in memory or
//!   on disk.
//! - **Write-behind** (the agent): the commit returns at once and rings the doorbell. A writer
//!   thread takes the journal as one [`Batch`] under the store's lock (a move, no I/O), writes
//!   and fsyncs it *without* the lock, and reports it done. Readers of the store (the API, the
//!   scheduler, anti-entropy's digests) never wait for the disk, and every commit made while
//!   one fsync runs shares the next one (group commit). Whoever acknowledges a commit to
//!   someone else (a client's write, a peer's push) first waits until [`Store::durable_commit`]
//!   covers it. A failed batch goes back into the journal (behind anything newer of the same
//!   keys) and is written again; its waiters hear of the failure at once.
//!
//! Write-behind shows a commit to this node's readers before it is on disk. A crash in that
//! window loses what no one acknowledged; the resourceVersions shown meanwhile are never reused:
//! at most [`SEQ_RESERVE`] of them may be past the disk's sequence (more are refused until the
//! disk catches up), and a store opens numbering past that reserve.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use redb::Database;

use super::{META, META_HLC, META_SEQ, OBJECTS, ObjectKey, Store, StoreConfig, StoreError};

/// ResourceVersions write-behind may number past the last one on disk: so also the most
/// commits (and changes held for watchers) memory may be ahead of a stalled disk, before writes
/// are refused.
pub const SEQ_RESERVE: u64 = 10_000;

/// A rung-or-not flag a writer thread sleeps on.
#[derive(Debug, Default)]
pub struct Doorbell {
    rung: Mutex<bool>,
    ringing: Condvar,
}

impl Doorbell {
    pub fn ring(&self) {
        *self.rung.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.ringing.notify_one();
    }

    /// Waits until the bell was rung (since the last wait) or `timeout` passed; unrings it.
    pub fn wait(&self, timeout: Duration) -> bool {
        let rung = self.rung.lock().unwrap_or_else(|p| p.into_inner());
        let (mut rung, _) = self
            .ringing
            .wait_timeout_while(rung, timeout, |rung| !*rung)
            .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *rung)
    }
}

/// The database file. Its own lock, never held with the store's by a writer thread.
pub(super) struct Disk {
    config: StoreConfig,
    /// `None` after a failed write: redb refuses every operation after an I/O error until the
    /// database is reopened, so the next write reopens it (recovering its last commit) first.
    db: Mutex<Option<Database>>,
}

impl Disk {
    pub(super) fn new(config: &StoreConfig, db: Database) -> Self {
        Self {
            config: config.clone(),
            db: Mutex::new(Some(db)),
        }
    }

    fn err(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Storage {
            path: self.config.path.clone(),
            message: e.to_string(),
        }
    }

    /// Writes `batch` in one fsync'd transaction.
    fn write(&self, batch: &Batch) -> Result<(), StoreError> {
        let mut db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        let open = match db.take() {
            Some(open) => open,
            None => Store::open_db(&self.config)
                .map_err(|e| self.err(format_args!("reopening after a failed write: {e}")))?,
        };
        self.write_to(&open, batch)?;
        *db = Some(open);
        Ok(())
    }

    fn write_to(&self, db: &Database, batch: &Batch) -> Result<(), StoreError> {
        let txn = db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut objects = txn.open_table(OBJECTS).map_err(|e| self.err(e))?;
            for (key, value) in &batch.objects {
                match value {
                    Some(bytes) => {
                        objects
                            .insert(key.as_slice(), bytes.as_slice())
                            .map_err(|e| self.err(e))?;
                    }
                    None => {
                        objects.remove(key.as_slice()).map_err(|e| self.err(e))?;
                    }
                }
            }
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            for (k, v) in &batch.meta {
                meta.insert(*k, *v).map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))
    }
}

/// Records committed in memory and not yet on disk, the latest per key.
#[derive(Default)]
pub(super) struct Journal {
    objects: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    meta: BTreeMap<&'static str, u64>,
    /// Commits journaled so far (this run).
    last: u64,
    /// The last commit, and the last sequence, known on disk.
    durable_commit: u64,
    durable_seq: u64,
}

impl Journal {
    pub(super) fn new(seq: u64) -> Self {
        Self {
            durable_seq: seq,
            ..Self::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.meta.is_empty()
    }
}

/// A journal taken for writing ([`Store::take_batch`]); give it back with [`Store::batch_done`].
pub struct Batch {
    disk: Arc<Disk>,
    objects: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    meta: BTreeMap<&'static str, u64>,
    last: u64,
    seq: u64,
}

impl Batch {
    /// Writes the batch (one transaction, one fsync). Needs no lock of the store.
    pub fn write(&self) -> Result<(), StoreError> {
        self.disk.write(self)
    }

    /// The last commit the batch holds.
    pub fn last_commit(&self) -> u64 {
        self.last
    }

    /// Objects written or dropped.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

impl Store {
    /// Records `updates` (and the sequence, the clock and `extra_meta`) as one commit. Immediate
    /// mode writes them (one fsync) before returning, and a failure changes nothing. Write-behind
    /// journals them and rings the writer; it refuses when the disk is [`SEQ_RESERVE`] commits
    /// behind. Callers change memory only after this returns `Ok`.
    pub(super) fn commit(
        &mut self,
        updates: &[(&ObjectKey, Option<&super::StoredEntry>)],
        extra_meta: &[(&'static str, u64)],
    ) -> Result<(), StoreError> {
        let behind = self.seq.saturating_sub(self.journal.durable_seq);
        let write_behind = self.config.write_behind.clone();
        if write_behind.is_some() && !self.journal.is_empty() && behind > SEQ_RESERVE {
            return Err(self.storage_err(format_args!(
                "the disk is {behind} commits behind memory; writes are refused until it catches up"
            )));
        }
        let undo = self.journal.is_empty();
        for (key, entry) in updates {
            let bytes = entry.map(|e| rmp_serde::to_vec(e).expect("entries serialize"));
            self.journal.objects.insert(key.to_bytes(), bytes);
        }
        self.journal.meta.insert(META_SEQ, self.seq);
        self.journal.meta.insert(META_HLC, self.hlc.last().0);
        for (k, v) in extra_meta {
            self.journal.meta.insert(*k, *v);
        }
        self.journal.last += 1;
        // Immediate mode; or more past the disk than the reserve in one commit (a resync of a
        // huge state), written here so that no resourceVersion shown is past the reserve. The
        // journal held nothing else (see above), so a failure drops exactly this commit.
        if write_behind.is_none() || behind > SEQ_RESERVE {
            let batch = self.take_batch().expect("just journaled");
            let written = batch.write();
            if written.is_ok() || !undo {
                self.batch_done(batch, written.is_ok());
            }
            written?;
        }
        if let Some(bell) = &self.config.write_behind {
            bell.ring();
        }
        Ok(())
    }

    /// Writes everything journaled now, under the caller's lock (immediate mode's commit; a
    /// write-behind store's rare synchronous write).
    pub fn flush(&mut self) -> Result<(), StoreError> {
        let Some(batch) = self.take_batch() else {
            return Ok(());
        };
        let written = batch.write();
        self.batch_done(batch, written.is_ok());
        written
    }

    /// Takes what is journaled, to write without the store's lock (`None`: nothing).
    pub fn take_batch(&mut self) -> Option<Batch> {
        if self.journal.is_empty() {
            return None;
        }
        Some(Batch {
            disk: self.disk.clone(),
            objects: std::mem::take(&mut self.journal.objects),
            meta: std::mem::take(&mut self.journal.meta),
            last: self.journal.last,
            seq: self.seq,
        })
    }

    /// Takes back a batch after [`Batch::write`]: written, its commits are durable; not
    /// written, its records return to the journal behind anything journaled since, to be
    /// written again.
    pub fn batch_done(&mut self, batch: Batch, written: bool) {
        if written {
            self.journal.durable_commit = self.journal.durable_commit.max(batch.last);
            self.journal.durable_seq = self.journal.durable_seq.max(batch.seq);
            return;
        }
        for (key, value) in batch.objects {
            self.journal.objects.entry(key).or_insert(value);
        }
        for (key, value) in batch.meta {
            self.journal.meta.entry(key).or_insert(value);
        }
    }

    /// The last commit made (compare with [`Store::durable_commit`]).
    pub fn last_commit(&self) -> u64 {
        self.journal.last
    }

    /// The last commit on disk: every commit up to it survives a crash.
    pub fn durable_commit(&self) -> u64 {
        self.journal.durable_commit
    }
}

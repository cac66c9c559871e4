//! The replication protocol between two stores, carried as request/response frames on the node
//! endpoint's sync channel. Pure types and codecs; the agent moves the bytes.
//!
//! - `Push`: a writer sends the full state of the objects it just wrote; the receiver merges,
//!   persists (fsync) and acknowledges — the write quorum counts these acknowledgements. A push
//!   any of whose entries the receiver refuses (clock too far ahead, unknown kind) is answered
//!   `Refused`, never `PushAck`: an acknowledgement means every pushed entry is durable there.
//! - `Buckets`, then `Compare`: anti-entropy, as a pull. A node whose gossiped root digest
//!   differs from a peer's asks for the peer's 256 bucket hashes; for the buckets that differ it
//!   sends its (key, entry hash) pairs, and the peer answers with its entries that differ or that
//!   the requester lacks. Bytes on the wire grow with the number of differing entries, not with
//!   the store. Sessions only pull: the peer sees the same digest difference and pulls in turn,
//!   which keeps a fresh node from being sent the whole state by every peer at once.
//! - Tombstones are forgotten after the horizon ([`Store::collect_tombstones`]). So that a node
//!   that was away cannot bring a forgotten object back, every `Buckets` answer carries the
//!   sender's [`Currency`] (its last sync, when it was last current and since when, and how far
//!   deletes have been forgotten, by it or by a peer whose state it took), and every push the
//!   sender's last sync. A node away longer than the horizon, or that has not synced since a peer's latest
//!   forgotten delete, resyncs (from a peer that vouches for its state, keeping what it wrote
//!   since), and until then no current peer merges from it or acknowledges its pushes; a session
//!   that merges, or a resync, teaches the node the peer's horizon. The rules and why they are
//!   sound: [`crate::horizon`].

use serde::{Deserialize, Serialize};

use crate::crdt::ObjectState;
use crate::digest::Hash16;
use crate::horizon::{Currency, Plan};
use crate::kind::ObjectKey;
use crate::store::{Change, MergeOutcome, Store, StoreError};

/// One object's replicated state, as sent between nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireEntry {
    pub key: ObjectKey,
    pub state: ObjectState,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SyncRequest {
    Push {
        entries: Vec<WireEntry>,
        /// The pusher's [`Store::last_sync_ms`].
        last_sync_ms: u64,
    },
    Buckets,
    /// The requester's (key, entry hash) pairs of `buckets`.
    Compare {
        buckets: Vec<u8>,
        hashes: Vec<(ObjectKey, Hash16)>,
    },
    /// A client's preconditioned write (or create), staged by the requester over `read`, for
    /// the key's home node to decide ([`crate::Store::check_serialized`]), commit, replicate
    /// and answer with [`SyncResponse::Serialized`] once the write quorum holds it.
    Serialize {
        read: Option<Box<WireEntry>>,
        write: Box<WireEntry>,
        create: bool,
        /// The requester's [`Store::last_sync_ms`].
        last_sync_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SyncResponse {
    /// Every pushed entry is merged and durable on the responder.
    PushAck,
    Buckets {
        hashes: Vec<Hash16>,
        /// The responder's [`Currency`].
        last_sync_ms: u64,
        collected_through_ms: u64,
        #[serde(default)]
        current_since_ms: u64,
        #[serde(default)]
        current_ms: u64,
    },
    /// The responder's entries that differ from or are missing at the requester.
    Compare { entries: Vec<WireEntry> },
    /// The request was refused; the message says why.
    Refused { reason: String },
    /// The answer to [`SyncRequest::Serialize`]: `refusal` is `None` when the write is
    /// committed and held by the write quorum, else says why not; a refused write comes with
    /// the home's `current` state of the key, which the requester merges, so the client's next
    /// read there sees what came first (as an etcd transaction that failed its compare).
    Serialized {
        refusal: Option<Refusal>,
        current: Option<Box<WireEntry>>,
    },
}

/// Why a home node did not acknowledge a serialized write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// Another write came first (or, for an update, the object is another incarnation now).
    Conflict(String),
    NotFound,
    AlreadyExists,
    /// The entries were refused (a bad key, a clock too far ahead, a requester that must resync).
    Rejected(String),
    /// Committed on the home, but fewer than `needed` nodes confirmed it.
    NotDurable {
        acked: usize,
        needed: usize,
        why: String,
    },
    /// Nothing was written: too few nodes are reachable from the home.
    Unavailable {
        reachable: usize,
        needed: usize,
    },
}

#[derive(Debug, thiserror::Error)]
#[error("malformed sync message: {0}")]
pub struct DecodeError(String);

fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    rmp_serde::to_vec(msg).expect("sync messages serialize")
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, DecodeError> {
    rmp_serde::from_slice(bytes).map_err(|e| DecodeError(e.to_string()))
}

impl SyncRequest {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        decode(bytes)
    }
}

impl SyncResponse {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        decode(bytes)
    }
}

/// Answers a peer's request against `store`. Returns the response and what the request changed
/// locally (for watchers and logs).
pub fn serve(store: &mut Store, request: SyncRequest, now_ms: u64) -> (SyncResponse, MergeOutcome) {
    match request {
        SyncRequest::Buckets => {
            let currency = store.currency();
            (
                SyncResponse::Buckets {
                    hashes: store.bucket_hashes(),
                    last_sync_ms: currency.last_sync_ms,
                    collected_through_ms: currency.collected_through_ms,
                    current_since_ms: currency.current_since_ms,
                    current_ms: currency.current_ms,
                },
                MergeOutcome::default(),
            )
        }
        SyncRequest::Push { last_sync_ms, .. } if store.peer_must_resync(last_sync_ms, now_ms) => (
            SyncResponse::Refused {
                reason: format!(
                    "the pusher last synced at {last_sync_ms} ms, longer than the tombstone horizon ago or before deletes this node has forgotten (through {} ms): it must resync first",
                    store.collected_through_ms()
                ),
            },
            MergeOutcome::default(),
        ),
        SyncRequest::Push { entries, .. } => match store.merge_remote_at(entries, now_ms) {
            // Acknowledged only once merged and committed (fsync'd), and only if nothing was
            // refused: the entries accepted stay merged (and published) either way.
            Ok(outcome) if outcome.rejected.is_empty() => (SyncResponse::PushAck, outcome),
            Ok(outcome) => {
                let reasons: Vec<String> = outcome.rejected.iter().map(|e| e.to_string()).collect();
                (
                    SyncResponse::Refused {
                        reason: format!(
                            "{} of the pushed entries refused: {}",
                            reasons.len(),
                            reasons.join("; ")
                        ),
                    },
                    outcome,
                )
            }
            Err(e) => (
                SyncResponse::Refused {
                    reason: e.to_string(),
                },
                MergeOutcome::default(),
            ),
        },
        SyncRequest::Serialize { .. } => (
            SyncResponse::Refused {
                reason: "a serialized write is decided by the agent's replication, not here".into(),
            },
            MergeOutcome::default(),
        ),
        SyncRequest::Compare { buckets, hashes } => {
            if buckets.len() > crate::digest::BUCKETS {
                return (
                    SyncResponse::Refused {
                        reason: format!("{} buckets requested; there are 256", buckets.len()),
                    },
                    MergeOutcome::default(),
                );
            }
            let theirs: std::collections::HashMap<&ObjectKey, &Hash16> =
                hashes.iter().map(|(k, h)| (k, h)).collect();
            let differing: Vec<ObjectKey> = store
                .entry_hashes_in_buckets(&buckets)
                .into_iter()
                .filter(|(key, hash)| theirs.get(key) != Some(&hash))
                .map(|(key, _)| key)
                .collect();
            // Answering teaches the responder nothing: it does not count as a sync here.
            let entries = store.entries_for(&differing);
            (SyncResponse::Compare { entries }, MergeOutcome::default())
        }
    }
}

/// One anti-entropy session with one peer, as a state machine: feed it each response, send what
/// it returns. What it does is planned from the peer's [`Currency`] ([`Store::plan_sync`]): a
/// store that must resync pulls everything and adopts the peer's state ([`Store::resync`]); a
/// peer that must resync is not merged from (it resyncs from us first); otherwise only what
/// differs is pulled, and the last entries are merged with the record of the sync.
#[derive(Debug)]
pub struct SyncSession {
    stale: bool,
    /// The peer was behind this store, or away longer than the horizon: nothing of it was
    /// merged.
    pub peer_behind: bool,
    /// The peer's currency, from its `Buckets` answer.
    peer: Currency,
    pending: Vec<u8>,
    collected: Vec<WireEntry>,
    changes: Vec<Change>,
    /// How many of `changes` [`SyncSession::fresh_changes`] handed out already.
    handed_out: usize,
    /// Entries of the peer this store refused (each names its key and why); the session goes on
    /// with the others. The caller logs and counts them: refused entries are pulled again by
    /// every session until their cause goes (a clock back in range, an upgraded node).
    pub rejected: Vec<StoreError>,
    /// Statistics for benchmarks and logs.
    pub entries_received: usize,
    pub buckets_differing: usize,
}

/// What to do after a response.
#[derive(Debug)]
pub enum Step {
    Send(SyncRequest),
    Done(Vec<Change>),
}

/// Buckets compared per `Compare` request, bounding message sizes.
pub const BUCKETS_PER_COMPARE: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("peer refused: {0}")]
    Refused(String),
    #[error("unexpected response {0}")]
    Unexpected(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SyncSession {
    /// Starts a session; send the returned request first.
    pub fn start() -> (Self, SyncRequest) {
        let session = Self {
            stale: false,
            peer_behind: false,
            peer: Currency::default(),
            pending: Vec::new(),
            collected: Vec::new(),
            changes: Vec::new(),
            handed_out: 0,
            rejected: Vec::new(),
            entries_received: 0,
            buckets_differing: 0,
        };
        (session, SyncRequest::Buckets)
    }

    /// The changes this session merged into the store since the last call: each round's as
    /// soon as it is merged, so the caller publishes them to watchers under the lock that
    /// committed them, in commit order. (Handing them out only with [`Step::Done`] would
    /// deliver a session's early rounds after the writes committed meanwhile: a watcher would
    /// see an older version of an object last.) `step` is the step just returned.
    pub fn fresh_changes(&mut self, step: &Step) -> Vec<Change> {
        let all = match step {
            Step::Done(all) => all.as_slice(),
            Step::Send(_) => self.changes.as_slice(),
        };
        let fresh = all.get(self.handed_out..).unwrap_or_default().to_vec();
        self.handed_out = all.len();
        fresh
    }

    fn next_compare(&mut self, store: &Store) -> SyncRequest {
        let take = self.pending.len().min(BUCKETS_PER_COMPARE);
        let buckets: Vec<u8> = self.pending.drain(..take).collect();
        let hashes = if self.stale {
            Vec::new()
        } else {
            store.entry_hashes_in_buckets(&buckets)
        };
        SyncRequest::Compare { buckets, hashes }
    }

    pub fn on_response(
        &mut self,
        store: &mut Store,
        response: SyncResponse,
        now_ms: u64,
    ) -> Result<Step, SessionError> {
        match response {
            SyncResponse::Refused { reason } => return Err(SessionError::Refused(reason)),
            SyncResponse::PushAck => return Err(SessionError::Unexpected("PushAck")),
            SyncResponse::Serialized { .. } => return Err(SessionError::Unexpected("Serialized")),
            SyncResponse::Buckets {
                hashes,
                last_sync_ms,
                collected_through_ms,
                current_since_ms,
                current_ms,
            } => {
                self.peer = Currency {
                    last_sync_ms,
                    collected_through_ms,
                    current_since_ms,
                    current_ms,
                };
                store.observe(now_ms)?;
                match store.plan_sync(&self.peer, now_ms) {
                    Plan::PeerResyncs => {
                        self.peer_behind = true;
                        return Ok(Step::Done(Vec::new()));
                    }
                    Plan::Resync => self.stale = true,
                    Plan::Merge => {}
                }
                // An all-zero bucket hash is an empty bucket (the XOR of nothing): the peer has
                // nothing there to give, so it is not compared.
                self.pending = if self.stale {
                    (0..=255).collect()
                } else {
                    store
                        .digest()
                        .differing(&hashes)
                        .into_iter()
                        .filter(|b| hashes.get(*b as usize).is_some_and(|h| *h != [0; 16]))
                        .collect()
                };
                self.buckets_differing = self.pending.len();
            }
            SyncResponse::Compare { entries } => {
                self.entries_received += entries.len();
                if self.stale {
                    self.collected.extend(entries);
                } else if self.pending.is_empty() {
                    // The last answer: merged with the record of the sync, in one commit.
                    let outcome = store.merge_synced(entries, &self.peer, now_ms)?;
                    self.changes.extend(outcome.changes);
                    self.rejected.extend(outcome.rejected);
                    return Ok(Step::Done(std::mem::take(&mut self.changes)));
                } else {
                    let outcome = store.merge_remote_at(entries, now_ms)?;
                    self.changes.extend(outcome.changes);
                    self.rejected.extend(outcome.rejected);
                }
            }
        }
        if !self.pending.is_empty() {
            return Ok(Step::Send(self.next_compare(store)));
        }
        let outcome = if self.stale {
            self.stale = false;
            let entries = std::mem::take(&mut self.collected);
            store.resync(entries, &self.peer, now_ms)?
        } else {
            // Nothing differed.
            store.merge_synced(Vec::new(), &self.peer, now_ms)?
        };
        self.changes.extend(outcome.changes);
        self.rejected.extend(outcome.rejected);
        Ok(Step::Done(std::mem::take(&mut self.changes)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn round_trip() {
        let req = SyncRequest::Compare {
            buckets: vec![1, 2],
            hashes: vec![],
        };
        assert_eq!(SyncRequest::decode(&req.encode()).unwrap(), req);
        let resp = SyncResponse::Buckets {
            hashes: vec![[7; 16]; 3],
            last_sync_ms: 1,
            collected_through_ms: 2,
            current_since_ms: 3,
            current_ms: 4,
        };
        assert_eq!(SyncResponse::decode(&resp.encode()).unwrap(), resp);
    }

    proptest! {
        #[test]
        fn random_and_truncated_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = SyncRequest::decode(&bytes);
            let _ = SyncResponse::decode(&bytes);
            let valid = SyncRequest::Push { entries: vec![], last_sync_ms: 0 }.encode();
            let cut = bytes.len() % valid.len();
            prop_assert!(SyncRequest::decode(&valid[..cut]).is_err());
        }
    }
}

//! The replication protocol between two stores, carried as request/response frames on the node
//! endpoint's sync channel. Pure types and codecs; the agent moves the bytes.
//!
//! - `Push`: a writer sends the full state of the objects it just wrote; the receiver merges,
//!   persists (fsync) and acknowledges — the write quorum counts these acknowledgements.
//! - `Buckets`, then `Compare`: anti-entropy, as a pull. A node whose gossiped root digest
//!   differs from a peer's asks for the peer's 256 bucket hashes; for the buckets that differ it
//!   sends its (key, entry hash) pairs, and the peer answers with its entries that differ or that
//!   the requester lacks. Bytes on the wire grow with the number of differing entries, not with
//!   the store. Sessions only pull: the peer sees the same digest difference and pulls in turn,
//!   which keeps a fresh node from being sent the whole state by every peer at once.

use serde::{Deserialize, Serialize};

use crate::crdt::ObjectState;
use crate::digest::Hash16;
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
    },
    Buckets,
    /// The requester's (key, entry hash) pairs of `buckets`.
    Compare {
        buckets: Vec<u8>,
        hashes: Vec<(ObjectKey, Hash16)>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SyncResponse {
    /// The pushed entries are merged and durable on the responder.
    PushAck,
    Buckets {
        hashes: Vec<Hash16>,
    },
    /// The responder's entries that differ from or are missing at the requester.
    Compare {
        entries: Vec<WireEntry>,
    },
    /// The request was refused; the message says why.
    Refused {
        reason: String,
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
        SyncRequest::Buckets => (
            SyncResponse::Buckets {
                hashes: store.bucket_hashes(),
            },
            MergeOutcome::default(),
        ),
        SyncRequest::Push { entries } => match store.merge_remote_at(entries, now_ms) {
            // Acknowledged only once merged and committed (fsync'd).
            Ok(outcome) => (SyncResponse::PushAck, outcome),
            Err(e) => (
                SyncResponse::Refused {
                    reason: e.to_string(),
                },
                MergeOutcome::default(),
            ),
        },
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
            if let Err(e) = store.mark_synced(now_ms) {
                return (
                    SyncResponse::Refused {
                        reason: e.to_string(),
                    },
                    MergeOutcome::default(),
                );
            }
            let entries = store.entries_for(&differing);
            (SyncResponse::Compare { entries }, MergeOutcome::default())
        }
    }
}

/// One anti-entropy session with one peer, as a state machine: feed it each response, send what
/// it returns. A stale store (see [`Store::is_stale`]) pulls everything and adopts the peer's
/// state instead of merging its own.
#[derive(Debug)]
pub struct SyncSession {
    stale: bool,
    pending: Vec<u8>,
    collected: Vec<WireEntry>,
    changes: Vec<Change>,
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
    pub fn start(store: &Store, now_ms: u64) -> (Self, SyncRequest) {
        let session = Self {
            stale: store.is_stale(now_ms),
            pending: Vec::new(),
            collected: Vec::new(),
            changes: Vec::new(),
            entries_received: 0,
            buckets_differing: 0,
        };
        (session, SyncRequest::Buckets)
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
            SyncResponse::Buckets { hashes } => {
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
                } else {
                    let changes = store.merge_remote_at(entries, now_ms)?.changes;
                    self.changes.extend(changes);
                }
            }
        }
        if !self.pending.is_empty() {
            return Ok(Step::Send(self.next_compare(store)));
        }
        if self.stale {
            let entries = std::mem::take(&mut self.collected);
            let changes = store.adopt(entries, now_ms)?.changes;
            self.changes.extend(changes);
            self.stale = false;
        } else {
            store.mark_synced(now_ms)?;
        }
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
        };
        assert_eq!(SyncResponse::decode(&resp.encode()).unwrap(), resp);
    }

    proptest! {
        #[test]
        fn random_and_truncated_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = SyncRequest::decode(&bytes);
            let _ = SyncResponse::decode(&bytes);
            let valid = SyncRequest::Push { entries: vec![] }.encode();
            let cut = bytes.len() % valid.len();
            prop_assert!(SyncRequest::decode(&valid[..cut]).is_err());
        }
    }
}

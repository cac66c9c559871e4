//! `shoal-state`: the cluster's replicated desired state (DESIGN.md §3, §5).
//!
//! Place in the data path: manifest → model → **store** → controllers → placement → kubelet →
//! runtime → network: every admitted object, binding and lease is written here, and every
//! later step reads it.
//!
//! Every user object lives here as a CRDT ([`crdt::ObjectState`]: field registers stamped with a
//! hybrid logical clock, [`hlc`]), persisted in an embedded transactional store (redb, fsync'd on
//! every commit, [`store`]) and exchanged between nodes with a small protocol ([`sync`]): pushes
//! of fresh writes, and anti-entropy over bucketed content digests ([`digest`]), judged across
//! the tombstone horizon so that nothing deleted comes back ([`horizon`]). Objects are validated
//! and normalised like the apiserver does ([`object`], [`kind`], [`labels`]).
//!
//! No sockets here: the agent carries [`sync`] messages over its QUIC endpoint.

pub mod crdt;
pub mod digest;
pub mod hlc;
pub mod horizon;
pub mod kind;
pub mod labels;
pub mod object;
pub mod store;
pub mod sync;

pub use crdt::{NodeId, ObjectState, Stamp};
pub use horizon::Currency;
pub use kind::{KINDS, KindInfo, ObjectKey};
pub use object::{ObjectError, ValidObject, validate};
pub use store::{
    Batch, Change, Doorbell, EventType, MergeOutcome, SEQ_RESERVE, Staged, Store, StoreConfig,
    StoreError, WriteMode, Written,
};
pub use sync::{Refusal, SyncRequest, SyncResponse, WireEntry};

//! `shoal-gossip`: who is in the cluster, and the one authenticated channel nodes talk over.
//!
//! Place in the data path: under every step of manifest → model → **store** → controllers →
//! placement → kubelet → runtime → network that crosses nodes: the store's replication, the
//! auction's messages, peers' logs, exec sessions and image blobs all ride this endpoint, and
//! membership decides who owns, bids and holds a majority.
//!
//! Every Shoal node owns a single UDP port. On it runs one QUIC endpoint ([`PeerEndpoint`]) whose
//! every connection is mutual TLS with certificates issued by a cluster CA that each node derives
//! deterministically from the cluster secret ([`ClusterSecret`], [`ClusterIdentity`]). A peer
//! without the secret is refused during the handshake, before any byte of state is read.
//!
//! Frames on that endpoint carry a [`Channel`] tag, so membership gossip, state sync and later
//! RPCs share the port. Membership and failure detection are chitchat's scuttlebutt and
//! phi-accrual detector, run over [`QuicTransport`] (or chitchat's in-memory `ChannelTransport`
//! for simulation). [`Membership`] turns chitchat's string key-values into typed [`NodeMeta`] and
//! a [`Member`] list with alive / suspect / dead states.

mod budget;
mod endpoint;
mod frame;
pub mod guard;
mod identity;
mod liveness;
mod membership;
mod node_meta;
mod secret;
mod transport;

pub use endpoint::{
    EndpointError, IncomingFrame, IncomingFrames, IncomingRequest, IncomingRequests,
    IncomingSession, IncomingSessions, PeerEndpoint, PeerEndpointConfig,
};
pub use frame::{Channel, FRAME_HEADER_BYTES, Frame, FrameError, PROTOCOL_VERSION};
pub use guard::{GossipGuard, Reject};
pub use identity::{ClusterIdentity, IdentityError, NodeCertificate, node_id_of};
pub use liveness::{LivenessTracker, MemberState, Verdict};
pub use membership::{Member, Membership, MembershipConfig, MembershipError, PeerValue};
pub use node_meta::{Capacity, Key, MetaError, NodeAddresses, NodeInfo, NodeMeta, NodeTaint, keys};
/// The two halves of a session's stream ([`PeerEndpoint::open_session`]).
pub use quinn::{RecvStream, SendStream};
pub use secret::{ClusterSecret, SecretError};
pub use transport::QuicTransport;

/// Re-exported so callers can build simulations on chitchat's in-memory transport without
/// depending on chitchat directly.
pub use chitchat::transport::{ChannelTransport, Transport};

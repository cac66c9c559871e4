//! Integration tests of the gossip crate: one shared suite run against the real QUIC transport
//! (loopback, mutual TLS) and chitchat's in-memory transport, plus authentication tests.

mod suite;

//! Framing of every message on the node-to-node QUIC endpoint.
//!
//! One frame per unidirectional stream: `[version u8][channel u8][payload length u32 BE][payload]`.
//! Decoding is a pure function that rejects unknown versions and channels, oversized and
//! truncated frames with an error, never a panic.

use bytes::Bytes;

/// Version of the node-to-node protocol spoken by this build.
pub const PROTOCOL_VERSION: u8 = 1;
/// Size of the fixed frame header.
pub const FRAME_HEADER_BYTES: usize = 6;

/// What a frame carries; each subsystem sharing the endpoint owns one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Channel {
    /// chitchat membership messages (Syn, SynAck, Ack, BadCluster).
    Gossip = 1,
    /// Desired-state replication: pushes of fresh writes and anti-entropy, as request/response.
    Sync = 2,
    /// Scheduling auctions: calls for bids and bids (one-way messages).
    Auction = 3,
    /// Requests to one node about what runs on it (container logs), as request/response.
    Node = 4,
    /// Long-lived sessions with one node (exec, port-forward): a bidirectional stream whose
    /// first frame says what the session is; after it the stream carries the session's bytes.
    Session = 5,
    /// Run leases of fenced pods: a holder's request and a grantor's answer, as
    /// request/response.
    Fence = 6,
}

impl Channel {
    pub const ALL: [Channel; 6] = [
        Channel::Gossip,
        Channel::Sync,
        Channel::Auction,
        Channel::Node,
        Channel::Session,
        Channel::Fence,
    ];

    fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|c| *c as u8 == code)
    }

    /// Largest payload accepted on this channel. chitchat keeps its messages under 65,507 bytes
    /// (its UDP MTU); anything larger on the gossip channel is hostile or broken.
    /// Streams are read with this bound, so a peer cannot make us buffer more.
    pub fn max_payload_bytes(self) -> usize {
        match self {
            Channel::Gossip => 65_507,
            // A batch of object states; objects are at most 1.5 MiB each.
            Channel::Sync => 64 << 20,
            Channel::Auction => 4 << 20,
            // A chunk of a container log (8 MiB) with its envelope.
            Channel::Node => 9 << 20,
            // Only the session's opening header is a frame.
            Channel::Session => 64 << 10,
            // Up to 10,000 pod uids with their epochs.
            Channel::Fence => 2 << 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame truncated: {needed} bytes needed, {got} received")]
    Truncated { needed: usize, got: usize },
    #[error("unsupported protocol version {got} (this node speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion { got: u8 },
    #[error("unknown channel {code}")]
    UnknownChannel { code: u8 },
    #[error("{channel:?} frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        channel: Channel,
        len: usize,
        max: usize,
    },
    #[error("{extra} unexpected bytes after the frame")]
    TrailingBytes { extra: usize },
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub channel: Channel,
    pub payload: Bytes,
}

impl Frame {
    /// Encodes `payload` for `channel`. Fails if the payload exceeds the channel's limit, so a
    /// sender learns of the problem instead of the receiver.
    pub fn encode(channel: Channel, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
        let max = channel.max_payload_bytes();
        if payload.len() > max {
            return Err(FrameError::TooLarge {
                channel,
                len: payload.len(),
                max,
            });
        }
        let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
        out.push(PROTOCOL_VERSION);
        out.push(channel as u8);
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        Ok(out)
    }

    /// The most bytes a well-formed frame on any channel can take (for bounded stream reads).
    pub fn max_encoded_bytes() -> usize {
        FRAME_HEADER_BYTES
            + Channel::ALL
                .iter()
                .map(|c| c.max_payload_bytes())
                .max()
                .unwrap_or(0)
    }

    /// The channel and payload length a frame's fixed header announces, checked against the
    /// channel's limit (so a reader knows how much to read, and never reads more).
    pub fn decode_header(
        header: &[u8; FRAME_HEADER_BYTES],
    ) -> Result<(Channel, usize), FrameError> {
        if header[0] != PROTOCOL_VERSION {
            return Err(FrameError::UnsupportedVersion { got: header[0] });
        }
        let channel =
            Channel::from_code(header[1]).ok_or(FrameError::UnknownChannel { code: header[1] })?;
        let len = u32::from_be_bytes([header[2], header[3], header[4], header[5]]) as usize;
        let max = channel.max_payload_bytes();
        if len > max {
            return Err(FrameError::TooLarge { channel, len, max });
        }
        Ok((channel, len))
    }

    /// Decodes exactly one frame occupying all of `bytes`.
    pub fn decode(bytes: Bytes) -> Result<Frame, FrameError> {
        let Some(header) = bytes
            .get(..FRAME_HEADER_BYTES)
            .and_then(|h| <&[u8; FRAME_HEADER_BYTES]>::try_from(h).ok())
        else {
            return Err(FrameError::Truncated {
                needed: FRAME_HEADER_BYTES,
                got: bytes.len(),
            });
        };
        let (channel, len) = Self::decode_header(header)?;
        let body = bytes.len() - FRAME_HEADER_BYTES;
        if body < len {
            return Err(FrameError::Truncated {
                needed: FRAME_HEADER_BYTES + len,
                got: bytes.len(),
            });
        }
        if body > len {
            return Err(FrameError::TrailingBytes { extra: body - len });
        }
        Ok(Frame {
            channel,
            payload: bytes.slice(FRAME_HEADER_BYTES..),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn round_trip() {
        let bytes = Frame::encode(Channel::Gossip, b"hello").unwrap();
        let frame = Frame::decode(Bytes::from(bytes)).unwrap();
        assert_eq!(frame.channel, Channel::Gossip);
        assert_eq!(&frame.payload[..], b"hello");
    }

    #[test]
    fn rejects_bad_headers_and_sizes() {
        let good = Frame::encode(Channel::Gossip, b"abc").unwrap();
        let mut bad_version = good.clone();
        bad_version[0] = 9;
        assert_eq!(
            Frame::decode(bad_version.into()),
            Err(FrameError::UnsupportedVersion { got: 9 })
        );
        let mut bad_channel = good.clone();
        bad_channel[1] = 200;
        assert_eq!(
            Frame::decode(bad_channel.into()),
            Err(FrameError::UnknownChannel { code: 200 })
        );
        let mut huge = good.clone();
        huge[2..6].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Frame::decode(huge.into()),
            Err(FrameError::TooLarge { .. })
        ));
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(
            Frame::decode(trailing.into()),
            Err(FrameError::TrailingBytes { extra: 1 })
        );
        assert!(Frame::encode(Channel::Gossip, &vec![0; 70_000]).is_err());
        assert!(Frame::encode(Channel::Sync, &vec![0; 70_000]).is_ok());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let good = Frame::encode(Channel::Gossip, b"some payload").unwrap();
        for cut in 0..good.len() {
            let err = Frame::decode(Bytes::copy_from_slice(&good[..cut])).unwrap_err();
            assert!(
                matches!(err, FrameError::Truncated { .. }),
                "cut {cut}: {err}"
            );
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Frame::decode(Bytes::from(bytes));
        }

        #[test]
        fn random_payload_round_trips(payload in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let encoded = Frame::encode(Channel::Gossip, &payload).unwrap();
            let frame = Frame::decode(Bytes::from(encoded)).unwrap();
            prop_assert_eq!(&frame.payload[..], &payload[..]);
        }
    }
}

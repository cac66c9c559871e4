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

    /// Largest payload accepted on this channel, from a peer and from a local sender alike: a
    /// sender's [`Frame::encode`] fails above it, and a reader refuses a frame whose header
    /// announces more before buffering any of its payload. Each bound is what the channel's
    /// legitimate senders can reach, with room for their envelope:
    ///
    /// - `Gossip`, 65,507 bytes: chitchat keeps every message under its UDP MTU of 65,507.
    /// - `Sync`, 64 MiB: the largest; an anti-entropy `Compare` answer carries every differing
    ///   entry of 16 of the 256 buckets (objects up to 1.5 MiB each), so a peer with a store of
    ///   about 1 GiB can still answer; pushes carry one object, serialized writes two.
    /// - `Auction`, 4 MiB: a call for bids carries a small batch (4 by default) of pods'
    ///   scheduling terms, and a bid a score or decline per pod of that batch.
    /// - `Node`, 9 MiB: an answer carries at most an 8 MiB chunk of a container log or of an
    ///   image blob, plus its envelope; the requests are a few hundred bytes.
    /// - `Session`, 64 KiB: only a session's opening header (what to exec or forward) is a frame.
    /// - `Fence`, 2 MiB: a lease request asks about at most 10,000 pods (uids of at most 128
    ///   bytes and an epoch each, about 1.4 MB); a reply lists the granted uids.
    pub fn max_payload_bytes(self) -> usize {
        match self {
            Channel::Gossip => 65_507,
            Channel::Sync => 64 << 20,
            Channel::Auction => 4 << 20,
            Channel::Node => 9 << 20,
            Channel::Session => 64 << 10,
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

    /// The most bytes a well-formed frame on any channel can take. Readers bound a stream by
    /// its own channel's [`Channel::max_payload_bytes`], never by this.
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

    /// Issue #35, item 9: each channel has its own bound, sized to its legitimate senders, and
    /// a header announcing one byte more is refused before any payload is read.
    #[test]
    fn each_channel_has_its_own_bound() {
        let table = [
            (Channel::Gossip, 65_507),
            (Channel::Sync, 64 << 20),
            (Channel::Auction, 4 << 20),
            (Channel::Node, 9 << 20),
            (Channel::Session, 64 << 10),
            (Channel::Fence, 2 << 20),
        ];
        assert_eq!(table.len(), Channel::ALL.len(), "every channel is listed");
        for (channel, max) in table {
            assert_eq!(channel.max_payload_bytes(), max, "{channel:?}");
            let header = |len: usize| {
                let mut h = [PROTOCOL_VERSION, channel as u8, 0, 0, 0, 0];
                h[2..].copy_from_slice(&u32::try_from(len).unwrap().to_be_bytes());
                h
            };
            assert_eq!(Frame::decode_header(&header(max)), Ok((channel, max)));
            assert_eq!(
                Frame::decode_header(&header(max + 1)),
                Err(FrameError::TooLarge {
                    channel,
                    len: max + 1,
                    max
                })
            );
        }
        // What the legitimate senders can reach fits: an 8 MiB log or blob chunk with its
        // envelope, 10,000 fenced pods with 128-byte uids, chitchat's MTU.
        assert!(Channel::Node.max_payload_bytes() >= (8 << 20) + 4096);
        assert!(Channel::Fence.max_payload_bytes() >= 10_000 * (128 + 2 + 9) + 16);
        assert!(Channel::Gossip.max_payload_bytes() >= 65_507);
        // The small channels are far below the largest, which bounds Frame::max_encoded_bytes.
        assert_eq!(
            Frame::max_encoded_bytes(),
            FRAME_HEADER_BYTES + Channel::Sync.max_payload_bytes()
        );
        for small in [Channel::Gossip, Channel::Session] {
            assert!(small.max_payload_bytes() <= Channel::Sync.max_payload_bytes() / 1000);
        }
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

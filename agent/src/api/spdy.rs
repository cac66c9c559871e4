//! SPDY/3.1 framing, as much of it as `kubectl port-forward` speaks (its streams tunnelled
//! in a WebSocket, `SPDY/3.1+portforward.k8s.io`): a pure, incremental reader of the client's
//! frames and a writer of the server's. Pure functions over bytes, tested with frames
//! captured from kubectl 1.37.
//!
//! Header blocks are zlib-compressed with one stream per direction for the whole connection,
//! primed with the SPDY/3 dictionary. Inbound blocks are inflated with `miniz_oxide` into a
//! 32 KiB window pre-filled with that dictionary (miniz accepts no preset dictionary itself,
//! so the zlib header is skipped by hand); outbound blocks are stored, not compressed, each
//! followed by an empty stored block (the sync flush Go's inflater needs to hand a block over).
//! spdystream does no flow control, so SETTINGS and WINDOW_UPDATE are read and ignored.

use miniz_oxide::inflate::TINFLStatus;
use miniz_oxide::inflate::core::{DecompressorOxide, decompress, inflate_flags};

/// The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00 §2.6.10.1).
pub const DICTIONARY: &[u8] = include_bytes!("spdy3-dictionary.bin");

/// The largest frame accepted (a data frame's chunk from kubectl is at most 32 KiB).
pub const MAX_FRAME: usize = 1 << 20;
/// The largest inflated header block accepted.
const MAX_HEADERS: usize = 64 << 10;
const WINDOW: usize = 32 << 10;

const FLAG_FIN: u8 = 0x01;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;

/// RST_STREAM status: the stream is refused (kubelet's answer to a bad stream).
pub const REFUSED_STREAM: u32 = 3;

/// A frame from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        id: u32,
        fin: bool,
        headers: Vec<(String, String)>,
    },
    RstStream {
        id: u32,
        status: u32,
    },
    Ping(u32),
    GoAway,
    Data {
        id: u32,
        fin: bool,
        data: Vec<u8>,
    },
    /// SETTINGS, WINDOW_UPDATE, HEADERS, SYN_REPLY and unknown control frames: nothing to do.
    Ignored,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpdyError {
    #[error("SPDY frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("SPDY version {0} is not 3")]
    Version(u16),
    #[error("SPDY {what} is truncated")]
    Truncated { what: &'static str },
    #[error("SPDY header block: {0}")]
    Headers(String),
}

/// Reads the client's frames from the bytes it sends, in whatever chunks they come.
pub struct Reader {
    buf: Vec<u8>,
    inflater: Inflater,
}

impl Default for Reader {
    fn default() -> Self {
        Self::new()
    }
}

impl Reader {
    pub fn new() -> Self {
        Self {
            buf: Vec::new(),
            inflater: Inflater::new(),
        }
    }

    /// Adds bytes received.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `None` until more bytes arrive. An error ends the connection
    /// (the header compression state cannot be resynchronised).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, SpdyError> {
        if self.buf.len() < 8 {
            return Ok(None);
        }
        let word = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        let flags = self.buf[4];
        let len = u32::from_be_bytes([0, self.buf[5], self.buf[6], self.buf[7]]) as usize;
        if len > MAX_FRAME {
            return Err(SpdyError::TooLarge(len));
        }
        if self.buf.len() < 8 + len {
            return Ok(None);
        }
        let body: Vec<u8> = self.buf[8..8 + len].to_vec();
        self.buf.drain(..8 + len);
        let fin = flags & FLAG_FIN != 0;
        if word & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                id: word,
                fin,
                data: body,
            }));
        }
        let version = ((word >> 16) & 0x7fff) as u16;
        if version != 3 {
            return Err(SpdyError::Version(version));
        }
        let u32_at = |at: usize, what: &'static str| {
            body.get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or(SpdyError::Truncated { what })
        };
        Ok(Some(match (word & 0xffff) as u16 {
            SYN_STREAM => {
                let id = u32_at(0, "SYN_STREAM")? & 0x7fff_ffff;
                let block = body
                    .get(10..)
                    .ok_or(SpdyError::Truncated { what: "SYN_STREAM" })?;
                let headers = parse_headers(&self.inflater.inflate(block)?)?;
                Frame::SynStream { id, fin, headers }
            }
            // Their header blocks still advance the compression state.
            SYN_REPLY | HEADERS => {
                let block = body
                    .get(4..)
                    .ok_or(SpdyError::Truncated { what: "HEADERS" })?;
                self.inflater.inflate(block)?;
                Frame::Ignored
            }
            RST_STREAM => Frame::RstStream {
                id: u32_at(0, "RST_STREAM")? & 0x7fff_ffff,
                status: u32_at(4, "RST_STREAM")?,
            },
            PING => Frame::Ping(u32_at(0, "PING")?),
            GOAWAY => Frame::GoAway,
            _ => Frame::Ignored,
        }))
    }
}

/// The inbound zlib stream (with the dictionary as its preset window).
struct Inflater {
    decompressor: Box<DecompressorOxide>,
    window: Vec<u8>,
    pos: usize,
    header_skipped: bool,
}

impl Inflater {
    fn new() -> Self {
        let mut window = vec![0u8; WINDOW];
        window[..DICTIONARY.len()].copy_from_slice(DICTIONARY);
        Self {
            decompressor: Box::default(),
            window,
            pos: DICTIONARY.len(),
            header_skipped: false,
        }
    }

    fn inflate(&mut self, mut input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        if !self.header_skipped {
            // CMF, FLG, and with FDICT the dictionary's Adler-32 (checked implicitly: a wrong
            // dictionary decodes to garbage, which the header parser refuses).
            let Some((&[cmf, flg], rest)) = input.split_first_chunk::<2>() else {
                return Err(SpdyError::Headers("no zlib header".into()));
            };
            if cmf & 0x0f != 8 || (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
                return Err(SpdyError::Headers("not a zlib stream".into()));
            }
            input = rest;
            if flg & 0x20 != 0 {
                input = input
                    .get(4..)
                    .ok_or_else(|| SpdyError::Headers("truncated zlib header".into()))?;
            }
            self.header_skipped = true;
        }
        let mut out = Vec::new();
        loop {
            let (status, consumed, written) = decompress(
                &mut self.decompressor,
                input,
                &mut self.window,
                self.pos,
                inflate_flags::TINFL_FLAG_HAS_MORE_INPUT,
            );
            out.extend_from_slice(&self.window[self.pos..self.pos + written]);
            if out.len() > MAX_HEADERS {
                return Err(SpdyError::Headers(format!(
                    "inflates beyond {MAX_HEADERS} bytes"
                )));
            }
            self.pos = (self.pos + written) & (WINDOW - 1);
            input = &input[consumed..];
            match status {
                TINFLStatus::HasMoreOutput => continue,
                TINFLStatus::NeedsMoreInput if input.is_empty() => return Ok(out),
                TINFLStatus::NeedsMoreInput => continue,
                TINFLStatus::Done => return Ok(out),
                other => return Err(SpdyError::Headers(format!("inflate: {other:?}"))),
            }
        }
    }
}

/// `[u32 count]([u32 len][name][u32 len][value])*`; names are lower case, values may hold
/// several NUL-separated values (the first is kept).
fn parse_headers(raw: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
    let mut at = 0;
    let mut take = |n: usize| -> Result<&[u8], SpdyError> {
        let slice = raw
            .get(at..at + n)
            .ok_or_else(|| SpdyError::Headers("truncated header block".into()))?;
        at += n;
        Ok(slice)
    };
    let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = word(take(4)?);
    if count > 1024 {
        return Err(SpdyError::Headers(format!("{count} headers")));
    }
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let n = word(take(4)?);
        let name = String::from_utf8_lossy(take(n)?).into_owned();
        let n = word(take(4)?);
        let value = String::from_utf8_lossy(take(n)?);
        let first = value.split('\0').next().unwrap_or_default().to_owned();
        headers.push((name, first));
    }
    Ok(headers)
}

/// Writes the server's frames.
#[derive(Default)]
pub struct Writer {
    started: bool,
}

fn control(kind: u16, flags: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&0x8003u16.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(body);
    out
}

impl Writer {
    /// SYN_REPLY with an empty header block.
    pub fn syn_reply(&mut self, id: u32) -> Vec<u8> {
        let mut body = id.to_be_bytes().to_vec();
        body.extend_from_slice(&self.header_block(&[]));
        control(SYN_REPLY, 0, &body)
    }

    /// The header block as the next piece of the outbound zlib stream: stored, then flushed.
    fn header_block(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut raw = (headers.len() as u32).to_be_bytes().to_vec();
        for (name, value) in headers {
            for part in [name.as_bytes(), value.as_bytes()] {
                raw.extend_from_slice(&(part.len() as u32).to_be_bytes());
                raw.extend_from_slice(part);
            }
        }
        let mut out = Vec::new();
        if !self.started {
            // Deflate, 32 KiB window, no preset dictionary, fastest (a multiple of 31).
            out.extend_from_slice(&[0x78, 0x01]);
            self.started = true;
        }
        for chunk in raw.chunks(u16::MAX as usize) {
            let len = chunk.len() as u16;
            out.push(0x00);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        out.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
        out
    }

    pub fn data(id: u32, fin: bool, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + data.len());
        out.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
        out.push(if fin { FLAG_FIN } else { 0 });
        out.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        out.extend_from_slice(data);
        out
    }

    pub fn ping(id: u32) -> Vec<u8> {
        control(PING, 0, &id.to_be_bytes())
    }

    pub fn rst_stream(id: u32, status: u32) -> Vec<u8> {
        let mut body = id.to_be_bytes().to_vec();
        body.extend_from_slice(&status.to_be_bytes());
        control(RST_STREAM, 0, &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The first two SYN_STREAMs kubectl 1.37.1 sent on a port-forward connection.
    const ERROR_STREAM: &str = "800300010000003d0000000100000000000078f9e3c6a7c202253a703a2b294a4dcc851625aca9a0808614cb45a024cc6461c0c0c0c0590489c44c50e2663400000000ffff";
    const DATA_STREAM: &str =
        "800300010000001a00000003000000000000826a25a406d56850299508000000ffff";

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap()
    }

    #[test]
    fn kubectls_frames_decode_in_any_chunking() {
        let bytes = [hex(ERROR_STREAM), hex(DATA_STREAM)].concat();
        for chunk in [1, 3, 7, bytes.len()] {
            let mut reader = Reader::new();
            let mut frames = Vec::new();
            for piece in bytes.chunks(chunk) {
                reader.push(piece);
                while let Some(frame) = reader.next_frame().unwrap() {
                    frames.push(frame);
                }
            }
            assert_eq!(frames.len(), 2, "chunk {chunk}");
            let Frame::SynStream { id, headers, .. } = &frames[0] else {
                panic!("{frames:?}")
            };
            assert_eq!(*id, 1);
            assert_eq!(header(headers, "streamtype"), "error");
            assert_eq!(header(headers, "port"), "80");
            assert_eq!(header(headers, "requestid"), "0");
            // The second block refers back into the first (one zlib stream per connection).
            let Frame::SynStream { id, headers, .. } = &frames[1] else {
                panic!("{frames:?}")
            };
            assert_eq!(*id, 3);
            assert_eq!(header(headers, "streamtype"), "data");
        }
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert!(DICTIONARY.starts_with(b"\x00\x00\x00\x07options\x00\x00\x00\x04head"));
        assert!(DICTIONARY.ends_with(b"charset=iso-8859-1,utf-,*,enq=0."));
    }

    /// What we write inflates with a real zlib inflater (flate2's, standing in for Go's),
    /// block by block, each complete when it is handed over.
    #[test]
    fn written_header_blocks_inflate_one_by_one() {
        let mut writer = Writer::default();
        let mut inflater = flate2::Decompress::new(true);
        for id in [2u32, 4, 6] {
            let frame = writer.syn_reply(id);
            assert_eq!(&frame[..4], &[0x80, 0x03, 0x00, 0x02]);
            let block = &frame[12..];
            let mut out = vec![0u8; 64];
            let before = inflater.total_out();
            inflater
                .decompress(block, &mut out, flate2::FlushDecompress::Sync)
                .unwrap();
            assert_eq!(inflater.total_out() - before, 4, "an empty header block");
            assert_eq!(&out[..4], &[0, 0, 0, 0]);
        }
        assert_eq!(
            Writer::data(3, true, b"hi"),
            [0, 0, 0, 3, 1, 0, 0, 2, b'h', b'i']
        );
        assert_eq!(Writer::ping(1), [0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]);
    }

    #[test]
    fn bad_frames_are_errors_never_panics() {
        let mut huge = Reader::new();
        huge.push(&[0, 0, 0, 1, 0, 0xff, 0xff, 0xff]);
        assert!(matches!(huge.next_frame(), Err(SpdyError::TooLarge(_))));
        let mut version = Reader::new();
        version.push(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1]);
        assert!(matches!(version.next_frame(), Err(SpdyError::Version(2))));
        let mut short = Reader::new();
        short.push(&[0x80, 3, 0, 3, 0, 0, 0, 2, 0, 1]);
        assert!(short.next_frame().is_err());
        let mut garbage = Reader::new();
        garbage.push(&[
            0x80, 3, 0, 1, 0, 0, 0, 14, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4,
        ]);
        assert!(garbage.next_frame().is_err());
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut reader = Reader::new();
            reader.push(&bytes);
            while let Ok(Some(_)) = reader.next_frame() {}
        }
    }
}

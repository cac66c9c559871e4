//! Reading container logs written by the shim in the CRI format
//! (`<RFC 3339 time> <stdout|stderr> <F|P> <text>`), for the pods/log API.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a client asked for (`kubectl logs` flags).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LogQuery {
    pub tail_lines: Option<usize>,
    pub timestamps: bool,
    pub limit_bytes: Option<usize>,
    /// Continue from this byte offset of the file (follow mode); `tail_lines` is ignored then.
    pub from_offset: Option<u64>,
}

/// A chunk of log text.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LogChunk {
    pub text: Vec<u8>,
    /// Where the next read continues.
    pub next_offset: u64,
}

/// Logs served at most per read (the rest comes with the next follow read).
const MAX_READ: u64 = 8 << 20;

/// Turns CRI lines into what the user printed (partial lines joined), with the time in front
/// when asked.
pub fn render(raw: &[u8], timestamps: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    for line in raw.split(|&b| b == b'\n') {
        if line.is_empty() {
            continue;
        }
        let mut fields = line.splitn(4, |&b| b == b' ');
        let (Some(time), Some(_stream), Some(tag), text) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let text = text.unwrap_or_default();
        if timestamps {
            out.extend_from_slice(time);
            out.push(b' ');
        }
        out.extend_from_slice(text);
        if tag != b"P" {
            out.push(b'\n');
        }
    }
    out
}

/// CRI lines as the streams the process wrote them to: (`true` for stderr, the bytes), with
/// partial lines left unterminated as they were written.
pub fn by_stream(raw: &[u8]) -> Vec<(bool, Vec<u8>)> {
    let mut out: Vec<(bool, Vec<u8>)> = Vec::new();
    for line in raw.split(|&b| b == b'\n') {
        let mut fields = line.splitn(4, |&b| b == b' ');
        let (Some(_time), Some(stream), Some(tag), text) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let stderr = stream == b"stderr";
        let mut bytes = text.unwrap_or_default().to_vec();
        if tag != b"P" {
            bytes.push(b'\n');
        }
        match out.last_mut() {
            Some((last, pending)) if *last == stderr => pending.extend_from_slice(&bytes),
            _ => out.push((stderr, bytes)),
        }
    }
    out
}

/// The complete lines of a log file from `offset` (from 0 if the file was rotated since),
/// at most [`MAX_READ`] bytes, and the offset after them.
pub fn read_raw(path: &Path, offset: u64) -> std::io::Result<(Vec<u8>, u64)> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(err) => return Err(err),
    };
    let len = file.metadata()?.len();
    let start = if offset <= len { offset } else { 0 };
    file.seek(SeekFrom::Start(start))?;
    let mut raw = Vec::new();
    file.take(MAX_READ).read_to_end(&mut raw)?;
    let complete = raw.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    raw.truncate(complete);
    Ok((raw, start + complete as u64))
}

/// Reads a log file by `query`. A missing file reads as empty.
pub fn read(path: &Path, query: &LogQuery) -> std::io::Result<LogChunk> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LogChunk::default());
        }
        Err(err) => return Err(err),
    };
    let len = file.metadata()?.len();
    let start = match query.from_offset {
        // A rotated file restarts at 0.
        Some(offset) if offset <= len => offset,
        Some(_) => 0,
        None => len.saturating_sub(MAX_READ),
    };
    file.seek(SeekFrom::Start(start))?;
    let mut raw = Vec::new();
    file.take(MAX_READ).read_to_end(&mut raw)?;
    // Only whole lines: an unfinished last line comes with the next read.
    let complete = raw.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    raw.truncate(complete);
    let next_offset = start + complete as u64;
    let mut lines: &[u8] = &raw;
    if query.from_offset.is_none() {
        if start > 0 {
            // Started mid-file: drop the first, partial line.
            let first = lines.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
            lines = &lines[first..];
        }
        if let Some(tail) = query.tail_lines {
            let mut seen = 0;
            let mut cut = 0;
            for (i, &b) in lines.iter().enumerate().rev() {
                if b == b'\n' && i + 1 < lines.len() {
                    seen += 1;
                    if seen == tail {
                        cut = i + 1;
                        break;
                    }
                }
            }
            if seen >= tail {
                lines = &lines[cut..];
            }
            if tail == 0 {
                lines = &[];
            }
        }
    }
    let mut text = render(lines, query.timestamps);
    if let Some(limit) = query.limit_bytes {
        text.truncate(limit);
    }
    Ok(LogChunk { text, next_offset })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-11-30T10:00:00.1Z stdout F one\n2026-11-30T10:00:00.2Z stderr F two\n2026-11-30T10:00:00.3Z stdout P thr\n2026-11-30T10:00:00.4Z stdout F ee\n2026-11-30T10:00:00.5Z stdout F unfinis";

    #[test]
    fn lines_are_split_by_the_stream_they_were_written_to() {
        let complete = &LOG[..LOG.rfind('\n').unwrap() + 1];
        let streams = by_stream(complete.as_bytes());
        assert_eq!(
            streams,
            [
                (false, b"one\n".to_vec()),
                (true, b"two\n".to_vec()),
                (false, b"three\n".to_vec())
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, LOG).unwrap();
        let (raw, next) = read_raw(&path, 0).unwrap();
        assert_eq!(raw, complete.as_bytes());
        assert_eq!(next, complete.len() as u64);
        // Rotated (shorter than the offset): from the start again.
        assert_eq!(read_raw(&path, 1 << 30).unwrap().1, next);
    }

    #[test]
    fn reads_tails_and_follows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, LOG).unwrap();
        let all = read(&path, &LogQuery::default()).unwrap();
        assert_eq!(String::from_utf8(all.text).unwrap(), "one\ntwo\nthree\n");
        let tail = read(
            &path,
            &LogQuery {
                tail_lines: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(String::from_utf8(tail.text).unwrap(), "three\n");
        let stamped = read(
            &path,
            &LogQuery {
                tail_lines: Some(1),
                timestamps: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(stamped.text).unwrap(),
            "2026-11-30T10:00:00.4Z ee\n"
        );
        // Follow: the unfinished line comes once it is finished.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut file, b"hed\n").unwrap();
        let more = read(
            &path,
            &LogQuery {
                from_offset: Some(all.next_offset),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(String::from_utf8(more.text).unwrap(), "unfinished\n");
        assert!(
            read(&dir.path().join("none.log"), &LogQuery::default())
                .unwrap()
                .text
                .is_empty()
        );
    }
}

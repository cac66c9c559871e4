//! How far a pull has come (issue #38): the blobs an image needs (its config, then its layers),
//! each one's size and the bytes in so far, whether they come from the registry, from the
//! peer that owns the blob, or while that owner is still fetching it. `shoal image pull` draws
//! it a line per layer; the kubelet revises its `Pulling` event with [`summary`].
//!
//! [`Progress`] is written by the pull as bytes arrive and read by whoever reports it; the
//! formatting ([`summary`], [`lines`]) is pure.

use std::sync::{Mutex, PoisonError};

/// One blob of an image being pulled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub digest: String,
    pub size: u64,
    pub received: u64,
    /// The image's config (not a layer).
    pub config: bool,
}

/// The blobs of one pull, as they come. Shared between the pull and its readers.
#[derive(Debug, Default)]
pub struct Progress {
    blobs: Mutex<Vec<Blob>>,
}

impl Progress {
    /// The blobs the image needs: `(digest, size, present)`, the config first; those the store
    /// has count as received.
    pub fn plan(&self, blobs: impl IntoIterator<Item = (String, u64, bool)>) {
        let planned = blobs
            .into_iter()
            .enumerate()
            .map(|(i, (digest, size, present))| Blob {
                digest,
                size,
                received: if present { size } else { 0 },
                config: i == 0,
            })
            .collect();
        *self.blobs.lock().unwrap_or_else(PoisonError::into_inner) = planned;
    }

    /// `received` bytes of blob `digest` are in (at most its size; a blob not planned, such as
    /// a manifest, is not counted).
    pub fn set(&self, digest: &str, received: u64) {
        let mut blobs = self.blobs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(blob) = blobs.iter_mut().find(|b| b.digest == digest) {
            blob.received = received.min(blob.size);
        }
    }

    /// Blob `digest` is complete.
    pub fn done(&self, digest: &str) {
        self.set(digest, u64::MAX);
    }

    /// The blobs as they stand (empty until the manifest is read).
    pub fn snapshot(&self) -> Vec<Blob> {
        self.blobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// One line for an event or a log: bytes in of the total, and layers complete.
pub fn summary(blobs: &[Blob]) -> String {
    if blobs.is_empty() {
        return "reading the manifest".into();
    }
    let total = blobs.iter().fold(0u64, |s, b| s.saturating_add(b.size));
    let received = blobs.iter().fold(0u64, |s, b| s.saturating_add(b.received));
    let layers: Vec<&Blob> = blobs.iter().filter(|b| !b.config).collect();
    let complete = layers.iter().filter(|b| b.received >= b.size).count();
    format!(
        "{} of {}, {complete} of {} layers complete",
        megabytes(received),
        megabytes(total),
        layers.len()
    )
}

/// A line per layer (`<short digest>: <bytes> of <size>` or `complete`), for a terminal.
pub fn lines(blobs: &[Blob]) -> Vec<String> {
    blobs
        .iter()
        .filter(|b| !b.config)
        .map(|b| {
            let short = b.digest.strip_prefix("sha256:").unwrap_or(&b.digest);
            let short = short.get(..12).unwrap_or(short);
            if b.received >= b.size {
                format!("{short}: complete ({})", megabytes(b.size))
            } else {
                let percent = b.received.saturating_mul(100) / b.size.max(1);
                format!(
                    "{short}: {} of {} ({percent}%)",
                    megabytes(b.received),
                    megabytes(b.size)
                )
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    #[test]
    fn a_pull_reports_bytes_of_the_total_and_layers_complete() {
        let progress = Progress::default();
        assert_eq!(summary(&progress.snapshot()), "reading the manifest");
        progress.plan([
            (digest(1), 1_000, false),
            (digest(2), 4_000_000, true),
            (digest(3), 6_000_000, false),
        ]);
        let blobs = progress.snapshot();
        assert_eq!(summary(&blobs), "4.0 MB of 10.0 MB, 1 of 2 layers complete");
        progress.done(&digest(1));
        progress.set(&digest(3), 1_500_000);
        // A manifest is not planned: not counted.
        progress.set(&digest(9), 7);
        let blobs = progress.snapshot();
        assert_eq!(summary(&blobs), "5.5 MB of 10.0 MB, 1 of 2 layers complete");
        assert_eq!(
            lines(&blobs),
            [
                "020202020202: complete (4.0 MB)",
                "030303030303: 1.5 MB of 6.0 MB (25%)"
            ]
        );
        // More than the size (a peer's claim, a resume): capped.
        progress.set(&digest(3), u64::MAX);
        assert_eq!(
            summary(&progress.snapshot()),
            "10.0 MB of 10.0 MB, 2 of 2 layers complete"
        );
    }

    #[test]
    fn an_empty_layer_is_complete_and_sizes_never_overflow() {
        let progress = Progress::default();
        progress.plan([
            (digest(1), 10, false),
            (digest(2), 0, false),
            (digest(3), u64::MAX, false),
            (digest(4), u64::MAX, false),
        ]);
        let blobs = progress.snapshot();
        assert!(summary(&blobs).ends_with("1 of 3 layers complete"));
        assert_eq!(lines(&blobs)[0], "020202020202: complete (0.0 MB)");
        assert!(lines(&blobs)[1].ends_with("(0%)"));
    }
}

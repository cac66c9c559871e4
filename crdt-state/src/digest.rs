//! Content digests for anti-entropy: 256 buckets (by the first byte of the key's SHA-256), each the
//! XOR of its entries' hashes, so a bucket's digest updates in O(1) per change and two replicas
//! find the buckets where they differ by comparing 256 small hashes.

use sha2::{Digest, Sha256};

use crate::crdt::ObjectState;
use crate::kind::ObjectKey;

pub const BUCKETS: usize = 256;
pub type Hash16 = [u8; 16];

/// Which bucket a key lives in.
pub fn bucket_of(key: &ObjectKey) -> u8 {
    Sha256::digest(key.to_bytes())[0]
}

/// Hash of one entry: its key and its whole replicated state (rmp-serde bytes, which are
/// deterministic: every map in the state is ordered).
pub fn entry_hash(key: &ObjectKey, state: &ObjectState) -> Hash16 {
    let mut hasher = Sha256::new();
    let key_bytes = key.to_bytes();
    hasher.update((key_bytes.len() as u32).to_be_bytes());
    hasher.update(&key_bytes);
    hasher.update(rmp_serde::to_vec(state).expect("object states serialize"));
    let full = hasher.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// The 256 bucket hashes of a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketDigest {
    buckets: Vec<Hash16>,
}

impl Default for BucketDigest {
    fn default() -> Self {
        Self {
            buckets: vec![[0; 16]; BUCKETS],
        }
    }
}

impl BucketDigest {
    /// Toggles `hash` in `bucket` (XOR: adding and removing are the same operation).
    pub fn toggle(&mut self, bucket: u8, hash: &Hash16) {
        for (b, h) in self.buckets[bucket as usize].iter_mut().zip(hash) {
            *b ^= h;
        }
    }

    pub fn buckets(&self) -> &[Hash16] {
        &self.buckets
    }

    /// One hash for the whole store, gossiped so peers notice divergence cheaply.
    pub fn root(&self) -> Hash16 {
        let mut hasher = Sha256::new();
        for b in &self.buckets {
            hasher.update(b);
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&hasher.finalize()[..16]);
        out
    }

    /// Buckets whose hashes differ from `theirs` (all of them if `theirs` is malformed).
    pub fn differing(&self, theirs: &[Hash16]) -> Vec<u8> {
        if theirs.len() != BUCKETS {
            return (0..=255).collect();
        }
        (0..BUCKETS)
            .filter(|i| self.buckets[*i] != theirs[*i])
            .map(|i| i as u8)
            .collect()
    }
}

//! The cluster secret: 32 random bytes from which every node derives the cluster's identity.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hkdf::Hkdf;
use sha2::Sha256;

const SECRET_BYTES: usize = 32;
const FILE_PREFIX: &str = "shoal-cluster-secret-v1:";

/// Errors reading or writing a secret file; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "secret file {path} already exists; refusing to overwrite it (a new secret is a new cluster)"
    )]
    AlreadyExists { path: PathBuf },
    #[error("cannot write secret file {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot read secret file {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("secret file {path} is malformed: {reason}")]
    Malformed { path: PathBuf, reason: String },
    #[error(
        "secret file {path} is readable by group or others (mode {mode:o}); run `chmod 600 {path}`"
    )]
    TooOpen { path: PathBuf, mode: u32 },
}

/// The shared secret that defines a cluster. Whoever holds it is a member; rotating it creates a
/// new cluster. It never leaves the node: peers prove they hold it by presenting a certificate
/// signed by the CA derived from it.
#[derive(Clone)]
pub struct ClusterSecret([u8; SECRET_BYTES]);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

impl ClusterSecret {
    /// A fresh secret from the operating system's CSPRNG (through rand's thread RNG).
    pub fn generate() -> Self {
        let mut bytes = [0u8; SECRET_BYTES];
        rand::fill(&mut bytes);
        Self(bytes)
    }

    /// Wraps known bytes (tests and simulations derive many clusters from fixed seeds).
    pub fn from_bytes(bytes: [u8; SECRET_BYTES]) -> Self {
        Self(bytes)
    }

    /// Creates `path` with a new secret, mode 0600. Refuses to overwrite an existing file.
    pub fn create_file(path: &Path) -> Result<Self, SecretError> {
        let secret = Self::generate();
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| match source.kind() {
                io::ErrorKind::AlreadyExists => SecretError::AlreadyExists {
                    path: path.to_owned(),
                },
                _ => SecretError::Write {
                    path: path.to_owned(),
                    source,
                },
            })?;
        let text = format!("{FILE_PREFIX}{}\n", hex::encode(secret.0));
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|source| SecretError::Write {
                path: path.to_owned(),
                source,
            })?;
        Ok(secret)
    }

    /// Reads a secret file written by [`ClusterSecret::create_file`]. A file readable by group or
    /// others is refused: the secret is the cluster's only credential.
    pub fn load_file(path: &Path) -> Result<Self, SecretError> {
        let read_err = |source| SecretError::Read {
            path: path.to_owned(),
            source,
        };
        let mode = std::fs::metadata(path)
            .map_err(read_err)?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::TooOpen {
                path: path.to_owned(),
                mode,
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        Self::parse(text.trim()).map_err(|reason| SecretError::Malformed {
            path: path.to_owned(),
            reason,
        })
    }

    fn parse(text: &str) -> Result<Self, String> {
        let hex_part = text
            .strip_prefix(FILE_PREFIX)
            .ok_or_else(|| format!("expected it to start with {FILE_PREFIX:?}"))?;
        let bytes = hex::decode(hex_part).map_err(|err| format!("bad hex: {err}"))?;
        let bytes: [u8; SECRET_BYTES] = bytes
            .try_into()
            .map_err(|b: Vec<u8>| format!("expected {SECRET_BYTES} bytes, found {}", b.len()))?;
        Ok(Self(bytes))
    }

    /// Derives `out.len()` bytes for one purpose (`label`) with HKDF-SHA256. Different labels give
    /// independent keys; the same label always gives the same bytes.
    pub(crate) fn derive(&self, label: &str, out: &mut [u8]) {
        Hkdf::<Sha256>::new(Some(b"shoal-cluster-v1"), &self.0)
            .expand(label.as_bytes(), out)
            .expect("HKDF-SHA256 output length is far below its 8160-byte limit");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_then_load_round_trips_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let created = ClusterSecret::create_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let loaded = ClusterSecret::load_file(&path).unwrap();
        assert_eq!(created.0, loaded.0);
    }

    #[test]
    fn create_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        ClusterSecret::create_file(&path).unwrap();
        let err = ClusterSecret::create_file(&path).unwrap_err();
        assert!(matches!(err, SecretError::AlreadyExists { .. }), "{err}");
    }

    #[test]
    fn malformed_and_open_files_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "shoal-cluster-secret-v1:abcd\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = ClusterSecret::load_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("expected 32 bytes") && err.contains("secret"),
            "{err}"
        );

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = ClusterSecret::load_file(&path).unwrap_err();
        assert!(
            matches!(err, SecretError::TooOpen { mode: 0o644, .. }),
            "{err}"
        );
    }

    #[test]
    fn derivation_is_deterministic_and_label_separated() {
        let secret = ClusterSecret::from_bytes([7; 32]);
        let (mut a, mut b, mut c) = ([0u8; 32], [0u8; 32], [0u8; 32]);
        secret.derive("ca", &mut a);
        secret.derive("ca", &mut b);
        secret.derive("token", &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}

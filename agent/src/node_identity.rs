//! The node's identity on disk: a stable random id, its name, and a generation counter bumped on
//! every start (chitchat tells a restarted node from a stale one by it).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::paths;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    pub node_id: String,
    pub name: String,
    pub generation: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeIdentityError {
    #[error("cannot read node identity {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error(
        "node identity {path} is corrupt ({reason}); move it away to start this node as a new member"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error("cannot write node identity {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

impl NodeIdentity {
    /// The node id as the 64-bit number the desired-state store stamps writes with.
    pub fn numeric_id(&self) -> u64 {
        u64::from_str_radix(&self.node_id, 16).expect("validated as 16 hex digits when loaded")
    }

    /// Loads the identity in `data_dir` (or creates one), bumps its generation and persists it
    /// durably before returning, so a crash right after never reuses a generation.
    pub fn load_and_bump(data_dir: &Path, name: &str) -> Result<Self, NodeIdentityError> {
        let path = paths::node_identity(data_dir);
        let mut identity = match std::fs::read(&path) {
            Ok(bytes) => {
                let identity: NodeIdentity =
                    serde_json::from_slice(&bytes).map_err(|e| NodeIdentityError::Corrupt {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                if identity.node_id.len() != 16 || hex::decode(&identity.node_id).is_err() {
                    return Err(NodeIdentityError::Corrupt {
                        path,
                        reason: format!("node_id {:?} is not 16 hex digits", identity.node_id),
                    });
                }
                identity
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => NodeIdentity {
                node_id: hex::encode(rand::random::<[u8; 8]>()),
                name: name.to_owned(),
                generation: 0,
            },
            Err(source) => return Err(NodeIdentityError::Read { path, source }),
        };
        if identity.name != name {
            tracing::info!(old = %identity.name, new = %name, "node renamed; keeping its id");
            identity.name = name.to_owned();
        }
        identity.generation += 1;
        write_atomically(
            &path,
            &serde_json::to_vec_pretty(&identity).expect("serializable"),
        )
        .map_err(|source| NodeIdentityError::Write { path, source })?;
        Ok(identity)
    }
}

/// Write to a temporary file, fsync, rename over `path`, fsync the directory.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_grows_and_id_is_stable() {
        let dir = tempfile::tempdir().unwrap();
        let a = NodeIdentity::load_and_bump(dir.path(), "n1").unwrap();
        let b = NodeIdentity::load_and_bump(dir.path(), "n1").unwrap();
        let c = NodeIdentity::load_and_bump(dir.path(), "renamed").unwrap();
        assert_eq!(a.generation, 1);
        assert_eq!(b.generation, 2);
        assert_eq!((c.generation, c.name.as_str()), (3, "renamed"));
        assert_eq!(a.node_id, c.node_id);
    }

    #[test]
    fn corrupt_file_is_an_error_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(paths::node_identity(dir.path()), b"{\"node_id\": 3").unwrap();
        let err = NodeIdentity::load_and_bump(dir.path(), "n1").unwrap_err();
        assert!(matches!(err, NodeIdentityError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("node.json"));
    }
}

//! The directories of the volumes the built-in provisioner makes (`shoal.io/local-path`,
//! issue #39): one per PersistentVolume, `<data-dir>/volumes/<name>`, the name checked before
//! it is joined to anything and every directory made and opened beneath the volumes directory
//! without following a symlink.

use std::path::Path;

use super::RuntimeError;
use crate::beneath::{Resolve, Root};

/// A volume's name as a single path component: a DNS-1123 label (`pvc-<uid>`).
fn check(name: &str) -> Result<(), RuntimeError> {
    shoal_state::labels::check_dns_label(name).map_err(|_| RuntimeError::InvalidId {
        what: "volume name",
        value: name.to_owned(),
    })
}

fn volumes_root(data_dir: &Path) -> Result<Root, RuntimeError> {
    let dir = crate::paths::volumes(data_dir);
    std::fs::create_dir_all(&dir).map_err(|source| RuntimeError::Io {
        path: dir.clone(),
        source,
    })?;
    Root::open(&dir).map_err(|source| RuntimeError::Io { path: dir, source })
}

/// Makes volume `name`'s directory (world-writable, as the provisioners of local volumes make
/// them: the pod's user writes there) and returns its path.
pub fn make(data_dir: &Path, name: &str) -> Result<std::path::PathBuf, RuntimeError> {
    open(data_dir, name)?;
    Ok(crate::paths::volumes(data_dir).join(name))
}

/// Opens volume `name`'s directory beneath the volumes directory (made if missing).
pub fn open(data_dir: &Path, name: &str) -> Result<Root, RuntimeError> {
    check(name)?;
    let root = volumes_root(data_dir)?;
    let dir = root
        .create_dir_all(Path::new(name), 0o777, Resolve::Beneath)
        .map_err(|source| RuntimeError::Io {
            path: crate::paths::volumes(data_dir).join(name),
            source,
        })?;
    nix::sys::stat::fchmod(dir.fd(), nix::sys::stat::Mode::from_bits_truncate(0o777)).map_err(
        |e| RuntimeError::Io {
            path: crate::paths::volumes(data_dir).join(name),
            source: e.into(),
        },
    )?;
    Ok(dir)
}

/// Removes volume `name`'s directory and all it holds (symlinks in it are removed, never
/// followed). Nothing to remove is no error.
pub fn remove(data_dir: &Path, name: &str) -> Result<(), RuntimeError> {
    check(name)?;
    let path = crate::paths::volumes(data_dir).join(name);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Ok(meta) if !meta.is_dir() => std::fs::remove_file(&path),
        _ => std::fs::remove_dir_all(&path),
    }
    .map_err(|source| RuntimeError::Io { path, source })
}

/// The bytes volume `name` holds now (what its claim's capacity is compared with): [`du`].
pub fn usage(data_dir: &Path, name: &str, limit: usize) -> Option<u64> {
    check(name).ok()?;
    du(&crate::paths::volumes(data_dir).join(name), limit)
}

/// The bytes of the regular files beneath directory `root` (their allocated blocks, as `du`
/// counts), walked without following symlinks and without recursion, at most `limit` entries
/// looked at (a measurement's work is bounded, whatever a pod wrote). A directory that cannot
/// be read (gone meanwhile, a path too deep) is skipped; `None` if `root` itself is not a
/// directory.
pub fn du(root: &Path, limit: usize) -> Option<u64> {
    if !std::fs::symlink_metadata(root).ok()?.is_dir() {
        return None;
    }
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > limit {
                return Some(total);
            }
            // `DirEntry::metadata` does not follow a symlink.
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total = total.saturating_add(
                    std::os::unix::fs::MetadataExt::blocks(&meta).saturating_mul(512),
                );
            }
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_are_made_beneath_their_directory_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = make(dir.path(), "pvc-1234").unwrap();
        assert!(path.is_dir());
        std::fs::write(path.join("data"), vec![1u8; 10_000]).unwrap();
        assert!(usage(dir.path(), "pvc-1234", 100).unwrap() >= 10_000);
        // A symlink inside is not followed; the entries looked at are bounded.
        let big = tempfile::tempdir().unwrap();
        std::fs::write(big.path().join("big"), vec![1u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink(big.path(), path.join("out")).unwrap();
        assert!(usage(dir.path(), "pvc-1234", 100).unwrap() < 1 << 20);
        for i in 0..10 {
            std::fs::write(path.join(format!("f{i}")), vec![1u8; 8192]).unwrap();
        }
        assert!(du(&path, 3).unwrap() < du(&path, 100).unwrap());
        std::fs::remove_file(path.join("out")).unwrap();
        for bad in ["..", "a/b", "", "/etc", "UPPER"] {
            assert!(make(dir.path(), bad).is_err(), "{bad:?}");
            assert!(remove(dir.path(), bad).is_err(), "{bad:?}");
        }
        // A symlink planted where a volume's directory goes is not followed.
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            outside.path(),
            crate::paths::volumes(dir.path()).join("pvc-link"),
        )
        .unwrap();
        assert!(open(dir.path(), "pvc-link").is_err());
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        remove(dir.path(), "pvc-link").unwrap();
        assert!(
            outside.path().join("keep").exists(),
            "the link's target was not touched"
        );
        remove(dir.path(), "pvc-1234").unwrap();
        assert!(!path.exists());
        remove(dir.path(), "pvc-1234").unwrap();
    }
}

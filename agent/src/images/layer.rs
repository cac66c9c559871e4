//! Unpacking one image layer (a tar stream, gzip-compressed or not) into a directory that
//! overlayfs can use as a lower layer: OCI whiteouts become overlay whiteouts.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest as _, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("layer {blob}: {source}")]
    Io { blob: PathBuf, source: io::Error },
    #[error("layer {blob}: entry {entry:?} escapes the layer root")]
    Escapes { blob: PathBuf, entry: PathBuf },
    #[error(
        "layer {blob}: uncompressed content hashes to sha256:{actual}, the image config says {expected}"
    )]
    DiffId {
        blob: PathBuf,
        expected: String,
        actual: String,
    },
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Opens a file (layer blob or archive), undoing gzip if its first bytes say so.
pub(super) fn open_decompressed(path: &Path) -> io::Result<Box<dyn Read>> {
    let mut file = io::BufReader::new(std::fs::File::open(path)?);
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic)?;
    let head = io::Cursor::new(magic[..n].to_vec()).chain(file);
    Ok(if magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(head))
    } else {
        Box::new(head)
    })
}

/// `path` as a relative path of normal components only (`./a/b` → `a/b`).
fn relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// An overlayfs whiteout: a 0/0 character device hides the lower file of that name.
fn whiteout(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path)?,
        Ok(_) => std::fs::remove_file(path)?,
        Err(_) => {}
    }
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path we own; mknod touches no memory of ours.
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, libc::makedev(0, 0)) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Marks a directory opaque: overlayfs shows none of the lower layers' entries in it.
fn opaque(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let c = c_path(dir)?;
    let (name, value) = (c"trusted.overlay.opaque", b"y");
    // SAFETY: NUL-terminated path and name, a 1-byte value; all outlive the call.
    let rc = unsafe { libc::setxattr(c.as_ptr(), name.as_ptr(), value.as_ptr().cast(), 1, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unpacks `blob` into `dest` (which must exist and be empty), checking the uncompressed
/// content against `diff_id` (`sha256:<hex>`) when given.
pub fn unpack(blob: &Path, dest: &Path, diff_id: Option<&str>) -> Result<(), LayerError> {
    let io_err = |source| LayerError::Io {
        blob: blob.to_owned(),
        source,
    };
    let reader = Hashing {
        inner: open_decompressed(blob).map_err(io_err)?,
        hash: Sha256::new(),
    };
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_overwrite(true);
    for entry in archive.entries().map_err(io_err)? {
        let mut entry = entry.map_err(io_err)?;
        let raw = entry.path().map_err(io_err)?.into_owned();
        let Some(path) = relative(&raw) else {
            return Err(LayerError::Escapes {
                blob: blob.to_owned(),
                entry: raw,
            });
        };
        let name = path.file_name().map(|n| n.as_bytes()).unwrap_or_default();
        let parent = path.parent().unwrap_or(Path::new(""));
        if name == b".wh..wh..opq" {
            opaque(&dest.join(parent)).map_err(io_err)?;
        } else if let Some(hidden) = name.strip_prefix(b".wh.") {
            let dir = dest.join(parent);
            std::fs::create_dir_all(&dir).map_err(io_err)?;
            whiteout(&dir.join(std::ffi::OsStr::from_bytes(hidden))).map_err(io_err)?;
        } else if !entry.unpack_in(dest).map_err(io_err)? {
            return Err(LayerError::Escapes {
                blob: blob.to_owned(),
                entry: raw,
            });
        }
    }
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(io_err)?;
    let actual = hex::encode(rest.hash.finalize());
    if let Some(expected) = diff_id
        && expected.strip_prefix("sha256:") != Some(actual.as_str())
    {
        return Err(LayerError::DiffId {
            blob: blob.to_owned(),
            expected: expected.to_owned(),
            actual,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_cksum();
            builder.append_data(&mut header, path, *data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn unpacks_files_and_checks_the_diff_id() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = layer(&[("etc/hostname", b"x\n"), ("./bin/tool", b"#!")]);
        let blob = dir.path().join("blob");
        std::fs::write(&blob, &bytes).unwrap();
        let good = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        let dest = dir.path().join("root");
        std::fs::create_dir(&dest).unwrap();
        unpack(&blob, &dest, Some(&good)).unwrap();
        assert_eq!(std::fs::read(dest.join("etc/hostname")).unwrap(), b"x\n");
        assert!(dest.join("bin/tool").exists());

        let bad = format!("sha256:{}", "0".repeat(64));
        let err = unpack(&blob, &dest, Some(&bad)).unwrap_err();
        assert!(err.to_string().contains("the image config says"), "{err}");
    }

    #[test]
    fn whiteouts_become_overlay_whiteouts() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        std::fs::write(&blob, layer(&[("etc/.wh.passwd", b"")])).unwrap();
        let dest = dir.path().join("root");
        std::fs::create_dir(&dest).unwrap();
        if let Err(err) = unpack(&blob, &dest, None) {
            // mknod of a device needs CAP_MKNOD (CI is root).
            assert!(err.to_string().contains("Operation not permitted"), "{err}");
            return;
        }
        let meta = std::fs::symlink_metadata(dest.join("etc/passwd")).unwrap();
        assert!(meta.file_type().is_char_device());
        assert_eq!(meta.rdev(), 0);
    }

    #[test]
    fn refuses_entries_outside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        // tar::Builder refuses `..` itself: write the name into the header by hand.
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..9].copy_from_slice(b"../escape");
        header.set_size(1);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend_from_slice(b"x");
        bytes.resize(bytes.len() + 511 + 1024, 0);
        let blob = dir.path().join("blob");
        std::fs::write(&blob, bytes).unwrap();
        let dest = dir.path().join("root");
        std::fs::create_dir(&dest).unwrap();
        let err = unpack(&blob, &dest, None).unwrap_err();
        assert!(err.to_string().contains("escapes the layer root"), "{err}");
        assert!(!dir.path().join("escape").exists());
    }
}

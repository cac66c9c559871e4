//! Reading image archives: OCI image layouts packed in a tar (`oci-archive`, what
//! `skopeo copy … oci-archive:` writes) and `docker save` archives. Every file goes into the
//! blob store under the sha256 of its bytes; an OCI blob whose bytes do not hash to its name is
//! refused.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::{ImageError, ImageStore};

/// Files read into memory (indexes and manifests) are small; anything bigger is refused.
pub(super) const MAX_METADATA_BYTES: u64 = 4 << 20;

/// What an archive held, once its blobs are in the store.
#[derive(Default)]
pub(super) struct Unpacked {
    /// OCI layout `index.json`.
    pub index: Option<Vec<u8>>,
    /// docker save `manifest.json`.
    pub docker_manifest: Option<Vec<u8>>,
    /// Archive path → hex digest of its content (docker's layer and config files).
    pub files: BTreeMap<String, String>,
    /// Archive path → path it links to (docker save links repeated layers).
    pub links: BTreeMap<String, String>,
}

impl Unpacked {
    /// The digest of the file at `path`, following links.
    pub fn digest_of(&self, path: &str) -> Option<&str> {
        let mut path = clean(path);
        for _ in 0..8 {
            if let Some(digest) = self.files.get(&path) {
                return Some(digest);
            }
            let target = self.links.get(&path)?;
            let base = Path::new(&path).parent().unwrap_or(Path::new(""));
            path = clean(&base.join(target).to_string_lossy());
        }
        None
    }
}

fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
}

/// Streams every file of `archive` into the store's blobs.
pub(super) fn read(store: &ImageStore, archive: &Path) -> Result<Unpacked, ImageError> {
    let io_err = |source| ImageError::Archive {
        archive: archive.to_owned(),
        source,
    };
    // `docker save | gzip` archives are read as they are.
    let mut tar = tar::Archive::new(super::layer::open_decompressed(archive).map_err(io_err)?);
    let mut out = Unpacked::default();
    for entry in tar.entries().map_err(io_err)? {
        let mut entry = entry.map_err(io_err)?;
        let path = clean(&entry.path().map_err(io_err)?.to_string_lossy());
        let kind = entry.header().entry_type();
        if kind.is_symlink() || kind.is_hard_link() {
            if let Some(target) = entry.link_name().map_err(io_err)? {
                let target = target.to_string_lossy().into_owned();
                // Hard-link names are relative to the archive root; symlinks to their dir.
                let target = if kind.is_hard_link() {
                    let depth = path.matches('/').count();
                    format!("{}{}", "../".repeat(depth), clean(&target))
                } else {
                    target
                };
                out.links.insert(path, target);
            }
            continue;
        }
        if !kind.is_file() {
            continue;
        }
        match path.as_str() {
            "index.json" | "manifest.json" | "oci-layout" | "repositories" => {
                let mut bytes = Vec::new();
                (&mut entry)
                    .take(MAX_METADATA_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(io_err)?;
                if bytes.len() as u64 > MAX_METADATA_BYTES {
                    return Err(ImageError::Invalid {
                        archive: archive.to_owned(),
                        reason: format!("{path} is larger than {MAX_METADATA_BYTES} bytes"),
                    });
                }
                match path.as_str() {
                    "index.json" => out.index = Some(bytes),
                    "manifest.json" => out.docker_manifest = Some(bytes),
                    _ => {}
                }
            }
            _ => {
                let named = path
                    .strip_prefix("blobs/sha256/")
                    .filter(|hex| !hex.contains('/'))
                    .map(str::to_owned);
                let digest = store.put_blob(&mut entry).map_err(io_err)?;
                if let Some(named) = named
                    && named != digest
                {
                    return Err(ImageError::Corrupt {
                        archive: archive.to_owned(),
                        blob: format!("sha256:{named}"),
                        actual: format!("sha256:{digest}"),
                    });
                }
                out.files.insert(path, digest);
            }
        }
    }
    Ok(out)
}

/// Writes `reader` into a temporary file under `tmp_dir` while hashing it; returns the file and
/// the hex digest.
pub(super) fn spool(tmp_dir: &Path, reader: &mut dyn Read) -> io::Result<(PathBuf, String)> {
    let mut file = tempfile::NamedTempFile::new_in(tmp_dir)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        file.write_all(&buf[..n])?;
    }
    file.as_file().sync_all()?;
    let (_, path) = file.keep().map_err(|e| e.error)?;
    Ok((path, hex::encode(hash.finalize())))
}

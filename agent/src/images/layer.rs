//! Unpacking one image layer (a tar stream, gzip- or zstd-compressed or not) into a directory that
//! overlayfs can use as a lower layer: OCI whiteouts become overlay whiteouts.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fchmod, futimens, mkdirat, mknodat};
use nix::unistd::{Gid, Uid, fchownat, linkat, symlinkat};
use sha2::{Digest as _, Sha256};

use crate::beneath::{Resolve, Root, is_single_component, normal_components};

#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("layer {blob}: {source}")]
    Io { blob: PathBuf, source: io::Error },
    #[error("layer {blob}: entry {entry:?}: {source}")]
    Entry {
        blob: PathBuf,
        entry: PathBuf,
        source: io::Error,
    },
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
    #[error(
        "layer {blob}: the blob's content hashes to sha256:{actual}, not to its name {expected}"
    )]
    Corrupt {
        blob: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("layer {blob}: more than {limit} bytes uncompressed (the node's --max-layer-bytes)")]
    TooLarge { blob: PathBuf, limit: u64 },
    #[error(
        "layer {blob}: its files hold more than the {limit} bytes its image has left (the node's --max-image-bytes)"
    )]
    OverImage { blob: PathBuf, limit: u64 },
    #[error("layer {blob}: more than {limit} entries (the node's --max-layer-entries)")]
    TooManyEntries { blob: PathBuf, limit: u64 },
    #[error(
        "layer {blob}: entry {entry:?} needs {needed} bytes and the node keeps {available} free for it (a {reserve}-byte reserve stays free)"
    )]
    NoSpace {
        blob: PathBuf,
        entry: PathBuf,
        needed: u64,
        available: u64,
        reserve: u64,
    },
}

/// Bounds on what one layer may unpack to (a compressed layer is a decompression bomb away
/// from filling the node's disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerLimits {
    /// Uncompressed bytes of the layer's tar stream, and bytes its files hold once written
    /// (their apparent sizes: a GNU sparse entry's holes count, as they are written out).
    pub max_bytes: u64,
    /// Entries (files, directories, links, whiteouts) in the layer.
    pub max_entries: u64,
    /// What all the layers of one image may unpack to together (their files' apparent sizes):
    /// an image of many layers, each under `max_bytes`, is still bounded. [`unpack`] takes it
    /// as what the image has left for this layer's files.
    pub max_image_bytes: u64,
}

/// Most layers one image may have (Docker's limit: overlayfs stacks each as a lower
/// directory, and the mount's options must fit a page).
pub const MAX_LAYERS: usize = 127;

impl Default for LayerLimits {
    fn default() -> Self {
        Self {
            max_bytes: 32 << 30,
            max_entries: 1_000_000,
            max_image_bytes: 64 << 30,
        }
    }
}

/// A reader that hashes what passes through it and refuses to pass more than `limit` bytes.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    total: u64,
    limit: u64,
}

/// The marker error of a stream over its limit.
#[derive(Debug)]
struct OverLimit;

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("layer over its size limit")
    }
}

impl std::error::Error for OverLimit {}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.total = self.total.saturating_add(n as u64);
        if self.total > self.limit {
            return Err(io::Error::other(OverLimit));
        }
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

fn is_over_limit(err: &io::Error) -> bool {
    err.get_ref().is_some_and(|e| e.is::<OverLimit>())
}

/// The first bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// The largest zstd window a layer may ask for (2^27 = 128 MiB, zstd's own default limit for
/// decompression): a frame declaring more is refused rather than allocated.
const ZSTD_WINDOW_LOG_MAX: u32 = 27;

/// Opens a file (layer blob or archive), undoing gzip or zstd if its first bytes say so.
pub(super) fn open_decompressed(path: &Path) -> io::Result<Box<dyn Read>> {
    let mut file = io::BufReader::new(std::fs::File::open(path)?);
    let mut magic = [0u8; 4];
    let mut n = 0;
    while n < magic.len() {
        match file.read(&mut magic[n..])? {
            0 => break,
            read => n += read,
        }
    }
    let head = io::Cursor::new(magic[..n].to_vec()).chain(file);
    Ok(if magic[..2] == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(head))
    } else if magic == ZSTD_MAGIC {
        let mut decoder = zstd::stream::read::Decoder::with_buffer(io::BufReader::new(head))?;
        decoder.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
        Box::new(decoder)
    } else {
        Box::new(head)
    })
}

/// The sha256 of a file's bytes, as hex.
fn file_sha256(path: &Path) -> io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hash.finalize()));
        }
        hash.update(&buf[..n]);
    }
}

/// An overlayfs whiteout: a 0/0 character device hides the lower file of that name.
fn whiteout(dir: &Root, name: &OsStr) -> io::Result<()> {
    dir.remove_all(name)?;
    mknodat(dir.fd(), name, SFlag::S_IFCHR, Mode::empty(), 0).map_err(errno)
}

/// Marks a directory opaque: overlayfs shows none of the lower layers' entries in it.
fn opaque(dir: &Root) -> io::Result<()> {
    rustix::fs::fsetxattr(
        dir.fd(),
        "trusted.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(io::Error::from)
}

fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn id(value: u64) -> io::Result<u32> {
    u32::try_from(value).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("owner id {value} is out of range"),
        )
    })
}

/// Sets owner and then mode (chown clears set-id bits) of what `fd` names.
fn own(fd: &OwnedFd, header: &tar::Header) -> io::Result<()> {
    let (uid, gid) = (id(header.uid()?)?, id(header.gid()?)?);
    nix::unistd::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(errno)?;
    fchmod(fd, Mode::from_bits_truncate(header.mode()? & 0o7777)).map_err(errno)
}

/// Applies one tar entry at `name` of directory `dir`; `root` is the layer's root (for hard
/// link sources). Nothing here follows a link out of `root`.
fn apply_entry<R: Read>(
    root: &Root,
    dir: &Root,
    name: &OsStr,
    entry: &mut tar::Entry<'_, R>,
) -> io::Result<()> {
    let header = entry.header().clone();
    let kind = header.entry_type();
    let existing = dir.kind_of(name)?;
    if kind.is_dir() {
        if existing.is_some_and(|k| k != SFlag::S_IFDIR) {
            dir.remove_all(name)?;
        }
        match mkdirat(dir.fd(), name, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(errno(e)),
        }
        let fd = openat(
            dir.fd(),
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        return own(&fd, &header);
    }
    if existing.is_some() {
        dir.remove_all(name)?;
    }
    let nofollow = AtFlags::AT_SYMLINK_NOFOLLOW;
    let (uid, gid) = (id(header.uid()?)?, id(header.gid()?)?);
    let owner = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    if kind.is_file() || kind == tar::EntryType::Continuous || kind.is_gnu_sparse() {
        let fd = openat(
            dir.fd(),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(errno)?;
        let mut file = std::fs::File::from(fd);
        io::copy(entry, &mut file)?;
        let fd = OwnedFd::from(file);
        own(&fd, &header)?;
        let mtime = i64::try_from(header.mtime()?).unwrap_or(i64::MAX);
        let time = nix::sys::time::TimeSpec::new(mtime, 0);
        futimens(&fd, &time, &time).map_err(errno)
    } else if kind.is_symlink() {
        let target = header.link_name()?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "symlink without a target")
        })?;
        symlinkat(target.as_ref(), dir.fd(), name).map_err(errno)?;
        fchownat(dir.fd(), name, owner.0, owner.1, nofollow).map_err(errno)
    } else if kind.is_hard_link() {
        let target = header.link_name()?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "hard link without a target")
        })?;
        let target = normal_components(&target)
            .filter(|t| t.file_name().is_some())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("hard link target {} leaves the layer", target.display()),
                )
            })?;
        let source_dir =
            root.open_dir(target.parent().unwrap_or(Path::new("")), Resolve::InRoot)?;
        let source = target.file_name().expect("checked above");
        // Without AT_SYMLINK_FOLLOW a link to a symlink links the symlink itself.
        linkat(source_dir.fd(), source, dir.fd(), name, AtFlags::empty()).map_err(errno)
    } else if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
        let sflag = if kind.is_character_special() {
            SFlag::S_IFCHR
        } else if kind.is_block_special() {
            SFlag::S_IFBLK
        } else {
            SFlag::S_IFIFO
        };
        let dev = nix::sys::stat::makedev(
            u64::from(header.device_major()?.unwrap_or(0)),
            u64::from(header.device_minor()?.unwrap_or(0)),
        );
        let mode = Mode::from_bits_truncate(header.mode()? & 0o777);
        mknodat(dir.fd(), name, sflag, mode, dev).map_err(errno)?;
        fchownat(dir.fd(), name, owner.0, owner.1, nofollow).map_err(errno)
    } else {
        // PAX and GNU long-name headers are consumed by the reader; anything else carries no
        // file.
        Ok(())
    }
}

/// Bytes an unpack leaves free on the node's disk, at most: a layer never fills it. On a small
/// filesystem the reserve is a twentieth of it instead ([`reserve_of`]).
pub const FREE_SPACE_RESERVE: u64 = 256 << 20;

/// The space an unpack leaves free on a filesystem of `total` bytes: 5 %, at most
/// [`FREE_SPACE_RESERVE`].
fn reserve_of(total: u64) -> u64 {
    (total / 20).min(FREE_SPACE_RESERVE)
}

/// The bytes an unprivileged writer can still use on the filesystem holding `dir`, and the
/// filesystem's size.
fn space_of(dir: &Path) -> io::Result<(u64, u64)> {
    let stat = nix::sys::statvfs::statvfs(dir).map_err(errno)?;
    let block = stat.fragment_size() as u64;
    Ok((
        (stat.blocks_available() as u64).saturating_mul(block),
        (stat.blocks() as u64).saturating_mul(block),
    ))
}

/// Unpacks `blob` into `dest` (which must exist and be empty): first checks that the blob's
/// bytes hash to its file name when `blob_hex` is given, then applies every entry beneath
/// `dest` (symlinks in the layer resolved with `dest` as `/`, OCI whiteouts turned into
/// overlay whiteouts), bounded by `limits`, and checks the uncompressed content against
/// `diff_id` (`sha256:<hex>`) when given. Returns the apparent bytes its files hold.
pub fn unpack(
    blob: &Path,
    dest: &Path,
    blob_hex: Option<&str>,
    diff_id: Option<&str>,
    limits: LayerLimits,
) -> Result<u64, LayerError> {
    let io_err = |source| LayerError::Io {
        blob: blob.to_owned(),
        source,
    };
    if let Some(expected) = blob_hex {
        let actual = file_sha256(blob).map_err(io_err)?;
        if actual != expected {
            return Err(LayerError::Corrupt {
                blob: blob.to_owned(),
                expected: format!("sha256:{expected}"),
                actual,
            });
        }
    }
    let root = Root::open(dest).map_err(io_err)?;
    let reader = Hashing {
        inner: open_decompressed(blob).map_err(io_err)?,
        hash: Sha256::new(),
        total: 0,
        limit: limits.max_bytes,
    };
    let too_large = || LayerError::TooLarge {
        blob: blob.to_owned(),
        limit: limits.max_bytes,
    };
    let stream_err = |source: io::Error| {
        if is_over_limit(&source) {
            too_large()
        } else {
            io_err(source)
        }
    };
    let mut archive = tar::Archive::new(reader);
    let mut count = 0u64;
    // The bytes the layer's files will hold: a ~2 KB stream can describe a 1 TiB sparse
    // file, whose holes the tar reader expands outside the stream's bound.
    let mut apparent = 0u64;
    for entry in archive.entries().map_err(stream_err)? {
        count += 1;
        if count > limits.max_entries {
            return Err(LayerError::TooManyEntries {
                blob: blob.to_owned(),
                limit: limits.max_entries,
            });
        }
        let mut entry = entry.map_err(stream_err)?;
        let raw = entry.path().map_err(io_err)?.into_owned();
        let escapes = || LayerError::Escapes {
            blob: blob.to_owned(),
            entry: raw.clone(),
        };
        let path = normal_components(&raw).ok_or_else(escapes)?;
        let Some(name) = path.file_name() else {
            // The layer root itself (`./`).
            continue;
        };
        let size = entry.size();
        apparent = apparent.saturating_add(size);
        if apparent > limits.max_bytes {
            return Err(too_large());
        }
        if apparent > limits.max_image_bytes {
            return Err(LayerError::OverImage {
                blob: blob.to_owned(),
                limit: limits.max_image_bytes,
            });
        }
        if size > 0 {
            let (available, total) = space_of(dest).map_err(io_err)?;
            let reserve = reserve_of(total);
            if size.saturating_add(reserve) > available {
                return Err(LayerError::NoSpace {
                    blob: blob.to_owned(),
                    entry: raw.clone(),
                    needed: size,
                    available: available.saturating_sub(reserve),
                    reserve,
                });
            }
        }
        let parent = path.parent().unwrap_or(Path::new(""));
        let result = root
            .create_dir_all(parent, 0o755, Resolve::InRoot)
            .and_then(|dir| {
                let bytes = name.as_bytes();
                if bytes == b".wh..wh..opq" {
                    opaque(&dir)
                } else if let Some(hidden) = bytes.strip_prefix(b".wh.") {
                    let hidden = OsStr::from_bytes(hidden);
                    if !is_single_component(hidden) {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "a whiteout must name one entry",
                        ));
                    }
                    whiteout(&dir, hidden)
                } else {
                    apply_entry(&root, &dir, name, &mut entry)
                }
            });
        result.map_err(|source| {
            if is_over_limit(&source) {
                too_large()
            } else {
                LayerError::Entry {
                    blob: blob.to_owned(),
                    entry: raw.clone(),
                    source,
                }
            }
        })?;
    }
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(stream_err)?;
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
    Ok(apparent)
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
            header.set_uid(me().0);
            header.set_gid(me().1);
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
        unpack(&blob, &dest, None, Some(&good), LayerLimits::default()).unwrap();
        assert_eq!(std::fs::read(dest.join("etc/hostname")).unwrap(), b"x\n");
        assert!(dest.join("bin/tool").exists());

        let bad = format!("sha256:{}", "0".repeat(64));
        let err = unpack(&blob, &dest, None, Some(&bad), LayerLimits::default()).unwrap_err();
        assert!(err.to_string().contains("the image config says"), "{err}");
    }

    #[test]
    fn zstd_and_gzip_layers_unpack_and_their_diff_id_is_the_tar_s() {
        let dir = tempfile::tempdir().unwrap();
        let tar = layer(&[("etc/hostname", b"z\n")]);
        let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &tar).unwrap();
        for (name, bytes) in [
            ("zstd", zstd::encode_all(&tar[..], 3).unwrap()),
            ("gzip", gz.finish().unwrap()),
        ] {
            let blob = dir.path().join(name);
            std::fs::write(&blob, &bytes).unwrap();
            let dest = dir.path().join(format!("{name}-root"));
            std::fs::create_dir(&dest).unwrap();
            unpack(&blob, &dest, None, Some(&diff_id), LayerLimits::default()).unwrap();
            assert_eq!(
                std::fs::read(dest.join("etc/hostname")).unwrap(),
                b"z\n",
                "{name}"
            );
        }
        // A zstd frame asking for a window past the limit is refused, not allocated.
        let mut big = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        big.window_log(ZSTD_WINDOW_LOG_MAX + 1).unwrap();
        big.long_distance_matching(true).unwrap();
        io::Write::write_all(&mut big, &[7u8; 4096]).unwrap();
        let blob = dir.path().join("wide");
        std::fs::write(&blob, big.finish().unwrap()).unwrap();
        let dest = dir.path().join("wide-root");
        std::fs::create_dir(&dest).unwrap();
        let err = unpack(&blob, &dest, None, None, LayerLimits::default()).unwrap_err();
        assert!(err.to_string().contains("too much memory"), "{err}");
    }

    #[test]
    fn whiteouts_become_overlay_whiteouts() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        std::fs::write(&blob, layer(&[("etc/.wh.passwd", b"")])).unwrap();
        let dest = dir.path().join("root");
        std::fs::create_dir(&dest).unwrap();
        if let Err(err) = unpack(&blob, &dest, None, None, LayerLimits::default()) {
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
        let err = unpack(&blob, &dest, None, None, LayerLimits::default()).unwrap_err();
        assert!(err.to_string().contains("escapes the layer root"), "{err}");
        assert!(!dir.path().join("escape").exists());
    }

    fn me() -> (u64, u64) {
        (
            u64::from(nix::unistd::geteuid().as_raw()),
            u64::from(nix::unistd::getegid().as_raw()),
        )
    }

    /// One generated tar entry.
    #[derive(Debug, Clone)]
    enum Item {
        File(String, Vec<u8>),
        Dir(String),
        Symlink(String, String),
        HardLink(String, String),
        Fifo(String),
    }

    fn header(kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o755);
        h.set_uid(me().0);
        h.set_gid(me().1);
        h.set_mtime(0);
        h
    }

    /// Writes a name into a header by hand (tar::Builder refuses some names attacks use).
    fn raw_name(h: &mut tar::Header, name: &str) {
        let field = &mut h.as_old_mut().name;
        field.fill(0);
        field[..name.len()].copy_from_slice(name.as_bytes());
    }

    fn raw_link(h: &mut tar::Header, target: &str) {
        let field = &mut h.as_old_mut().linkname;
        field.fill(0);
        field[..target.len()].copy_from_slice(target.as_bytes());
    }

    fn tar_of(items: &[Item]) -> Vec<u8> {
        let mut out = Vec::new();
        for item in items {
            let (mut h, data): (tar::Header, &[u8]) = match item {
                Item::File(_, data) => (header(tar::EntryType::Regular, data.len() as u64), data),
                Item::Dir(_) => (header(tar::EntryType::Directory, 0), b""),
                Item::Symlink(..) => (header(tar::EntryType::Symlink, 0), b""),
                Item::HardLink(..) => (header(tar::EntryType::Link, 0), b""),
                Item::Fifo(_) => (header(tar::EntryType::Fifo, 0), b""),
            };
            let (Item::File(name, _)
            | Item::Dir(name)
            | Item::Symlink(name, _)
            | Item::HardLink(name, _)
            | Item::Fifo(name)) = item;
            raw_name(&mut h, name);
            if let Item::Symlink(_, target) | Item::HardLink(_, target) = item {
                raw_link(&mut h, target);
            }
            h.set_cksum();
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(data);
            out.resize(out.len().next_multiple_of(512), 0);
        }
        out.resize(out.len() + 1024, 0);
        out
    }

    /// Every path below `dir` with its type and content (symlinks not followed).
    fn snapshot(dir: &Path) -> Vec<(PathBuf, String)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            let mut entries: Vec<_> = std::fs::read_dir(&d)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            entries.sort();
            for p in entries {
                let meta = std::fs::symlink_metadata(&p).unwrap();
                let what = if meta.is_dir() {
                    stack.push(p.clone());
                    "dir".to_owned()
                } else if meta.file_type().is_symlink() {
                    format!("link {}", std::fs::read_link(&p).unwrap().display())
                } else {
                    format!("file {:?}", std::fs::read(&p).unwrap_or_default())
                };
                out.push((p.strip_prefix(dir).unwrap().to_owned(), what));
            }
        }
        out.sort();
        out
    }

    /// A host tree beside the layer root, which no layer may touch.
    fn host_tree(base: &Path) -> PathBuf {
        let outside = base.join("outside");
        std::fs::create_dir_all(outside.join("etc/sub")).unwrap();
        std::fs::write(outside.join("etc/passwd"), b"root:x:0:0").unwrap();
        std::fs::write(outside.join("victim"), b"keep me").unwrap();
        std::fs::write(outside.join("etc/sub/deep"), b"deep").unwrap();
        outside
    }

    fn unpack_items(base: &Path, items: &[Item]) -> Result<(), LayerError> {
        let blob = base.join("blob");
        std::fs::write(&blob, tar_of(items)).unwrap();
        let dest = base.join("root");
        std::fs::create_dir_all(&dest).unwrap();
        unpack(&blob, &dest, None, None, LayerLimits::default()).map(|_| ())
    }

    /// Issue #13, hole 2: `evil -> /` then `evil/.wh.etc` removed the host's /etc. Here the
    /// symlinks point at a host tree beside the layer (absolute and relative), and nothing
    /// of it may change: whiteouts, files, directories, hard links all land inside the layer.
    #[test]
    fn whiteouts_and_entries_through_symlinks_stay_in_the_layer() {
        let dir = tempfile::tempdir().unwrap();
        let outside = host_tree(dir.path());
        let before = snapshot(dir.path());
        let abs = outside.display().to_string();
        let items = vec![
            Item::Symlink("evil".into(), abs.clone()),
            Item::Symlink("up".into(), "../outside".into()),
            Item::Symlink("etc".into(), format!("{abs}/etc")),
            Item::File("evil/.wh.victim".into(), vec![]),
            Item::File("up/.wh.etc".into(), vec![]),
            Item::File("evil/.wh..wh..opq".into(), vec![]),
            Item::File("evil/planted".into(), b"x".to_vec()),
            Item::Dir("up/newdir".into()),
            Item::HardLink("stolen".into(), "evil/victim".into()),
        ];
        let result = unpack_items(dir.path(), &items);
        let mut after = snapshot(dir.path());
        after.retain(|(p, _)| !p.starts_with("root") && !p.starts_with("blob"));
        let mut want = before.clone();
        want.retain(|(p, _)| !p.starts_with("root"));
        assert_eq!(after, want, "the host tree changed ({result:?})");
        // Inside the layer, the symlinks resolved with the layer root as `/`: the planted file
        // and the directory are where the container will see them.
        result.unwrap();
        let root = dir.path().join("root");
        let evil = root.join(outside.strip_prefix("/").unwrap());
        assert_eq!(std::fs::read(evil.join("planted")).unwrap(), b"x");
        assert!(root.join("outside/newdir").is_dir());
    }

    #[test]
    fn a_corrupt_blob_is_refused_before_anything_is_unpacked() {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        std::fs::write(&blob, layer(&[("planted", b"x")])).unwrap();
        let dest = dir.path().join("root");
        std::fs::create_dir(&dest).unwrap();
        let err = unpack(
            &blob,
            &dest,
            Some(&"0".repeat(64)),
            None,
            LayerLimits::default(),
        )
        .unwrap_err();
        assert!(matches!(err, LayerError::Corrupt { .. }), "{err}");
        assert!(!dest.join("planted").exists());
    }

    #[test]
    fn layers_are_bounded_in_size_and_entries() {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        let big = vec![7u8; 64 << 10];
        std::fs::write(&blob, layer(&[("a", &big), ("b", b"1"), ("c", b"2")])).unwrap();
        let dest = dir.path().join("root");
        std::fs::create_dir(&dest).unwrap();
        let small = LayerLimits {
            max_bytes: 16 << 10,
            max_entries: 100,
            ..LayerLimits::default()
        };
        let err = unpack(&blob, &dest, None, None, small).unwrap_err();
        assert!(matches!(err, LayerError::TooLarge { .. }), "{err}");
        let few = LayerLimits {
            max_bytes: 1 << 30,
            max_entries: 2,
            ..LayerLimits::default()
        };
        let err = unpack(&blob, &dest, None, None, few).unwrap_err();
        assert!(matches!(err, LayerError::TooManyEntries { .. }), "{err}");
    }

    /// A ~2.5 KB layer holding a GNU sparse entry of 1 PiB (one 512-byte block of data at
    /// its end, the rest a hole): its stream is tiny, its file is not. Refused by its apparent
    /// size before anything is written (issue #35, item 6: it once filled the disk, again on
    /// every retry).
    #[test]
    fn a_sparse_entry_counts_its_holes() {
        let dir = tempfile::tempdir().unwrap();
        let real_size: u64 = 1 << 50;
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::GNUSparse);
        header.set_path("hole").unwrap();
        header.set_mode(0o644);
        header.set_uid(me().0);
        header.set_gid(me().1);
        header.set_mtime(0);
        header.set_size(512);
        {
            let gnu = header.as_gnu_mut().unwrap();
            // GNU's base-256 form (numbers past the octal field's 8 GiB).
            let number = |field: &mut [u8], n: u64| {
                field.fill(0);
                field[0] = 0x80;
                let at = field.len() - 8;
                field[at..].copy_from_slice(&n.to_be_bytes());
            };
            number(&mut gnu.realsize, real_size);
            number(&mut gnu.sparse[0].offset, real_size - 512);
            number(&mut gnu.sparse[0].numbytes, 512);
        }
        header.set_cksum();
        let mut stream = header.as_bytes().to_vec();
        stream.extend_from_slice(&[b'x'; 512]);
        stream.extend_from_slice(&[0; 1024]);
        let blob = dir.path().join("blob");
        std::fs::write(&blob, &stream).unwrap();
        assert!(stream.len() < 4096);
        let dest = dir.path().join("root");
        std::fs::create_dir(&dest).unwrap();
        let err = unpack(&blob, &dest, None, None, LayerLimits::default()).unwrap_err();
        assert!(matches!(err, LayerError::TooLarge { .. }), "{err}");
        assert!(!dest.join("hole").exists());
        // Under a bound it would pass, the free space is what stops it.
        let roomy = LayerLimits {
            max_bytes: u64::MAX,
            max_entries: 10,
            max_image_bytes: u64::MAX,
        };
        let err = unpack(&blob, &dest, None, None, roomy).unwrap_err();
        assert!(matches!(err, LayerError::NoSpace { .. }), "{err}");
        assert!(!dest.join("hole").exists());
        // The reserve: 5 % of a small disk (the chaos lab's 256 MiB data dirs), 256 MiB of a
        // large one.
        assert_eq!(reserve_of(256 << 20), (256 << 20) / 20);
        assert_eq!(reserve_of(1 << 40), FREE_SPACE_RESERVE);
    }

    fn name_strategy() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let part = prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("evil".to_owned()),
            Just("up".to_owned()),
            Just("etc".to_owned()),
            Just(".wh.victim".to_owned()),
            Just(".wh.etc".to_owned()),
            Just(".wh.a".to_owned()),
            Just(".wh..wh..opq".to_owned()),
            Just(".".to_owned()),
        ];
        proptest::collection::vec(part, 1..4).prop_map(|parts| parts.join("/"))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Whatever a layer holds (symlinks to the host tree, relative escapes, hard links,
        /// whiteouts and opaque markers through them), nothing outside the layer root is
        /// created, changed or removed.
        #[test]
        fn no_layer_touches_anything_outside_its_root(
            items in proptest::collection::vec(
                (0u8..5, name_strategy(), 0usize..6),
                1..12,
            )
        ) {
            let dir = tempfile::tempdir().unwrap();
            let outside = host_tree(dir.path());
            let abs = outside.display().to_string();
            let targets = [
                abs.clone(),
                format!("{abs}/etc"),
                "../outside".to_owned(),
                "../../..".to_owned(),
                "a".to_owned(),
                "evil/victim".to_owned(),
            ];
            let items: Vec<Item> = items
                .into_iter()
                .map(|(kind, name, t)| match kind {
                    0 => Item::File(name, b"data".to_vec()),
                    1 => Item::Dir(name),
                    2 => Item::Symlink(name, targets[t].clone()),
                    3 => Item::HardLink(name, targets[t].clone()),
                    _ => Item::Fifo(name),
                })
                .collect();
            let mut want = snapshot(dir.path());
            want.retain(|(p, _)| !p.starts_with("root"));
            let result = unpack_items(dir.path(), &items);
            let mut after = snapshot(dir.path());
            after.retain(|(p, _)| !p.starts_with("root") && !p.starts_with("blob"));
            proptest::prop_assert_eq!(after, want, "{:?} -> {:?}", items, result);
        }
    }
}

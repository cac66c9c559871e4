//! File operations confined beneath a root directory (DESIGN.md §8, STYLE.md §11).
//!
//! Names from pod specs, entries of image layers and identifiers from peers are data, never
//! paths: every host-side file operation on them goes through a [`Root`], a directory
//! descriptor whose lookups the kernel confines with `openat2(2)`:
//! - [`Resolve::Beneath`] (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) for directories a pod can
//!   write (volumes, subPaths, projections): every component must be a real directory below
//!   the root, as the kubelet's `doSafeOpen` demands — a symlink planted by a container is
//!   refused, never followed;
//! - [`Resolve::InRoot`] (`RESOLVE_IN_ROOT`) for image layers, whose symlinks are resolved as
//!   the container will see them: as if the root were `/`, so `evil -> /` names the layer root.
//!
//! The final component of a create or remove is always handled with the `*at` call on its
//! parent's descriptor and `O_NOFOLLOW`/`AT_SYMLINK_NOFOLLOW`, so no step follows a link out.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// How the components of a path below a [`Root`] are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// Only real directories below the root; any symlink is an error (`ELOOP`).
    Beneath,
    /// Symlinks resolved with the root as `/` (never above it).
    InRoot,
}

impl Resolve {
    fn flags(self) -> ResolveFlag {
        match self {
            Resolve::Beneath => ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS,
            Resolve::InRoot => ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        }
    }
}

/// A directory that file operations cannot leave.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    /// Where it was opened (for messages and for callers that hand paths to other programs).
    path: PathBuf,
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// `rel` as normal components only (`./a//b` → `a/b`); `None` for absolute paths and `..`.
pub fn normal_components(rel: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in rel.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// `path` with `.` dropped and `..` applied lexically, never above the root (as
/// `RESOLVE_IN_ROOT` treats `..` at the root).
fn clamp_to_root(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Whether `name` is one path component (no `/`, not `.`/`..`, not empty, no NUL).
pub fn is_single_component(name: &OsStr) -> bool {
    let b = name.as_bytes();
    !b.is_empty() && b != b"." && b != b".." && !b.contains(&b'/') && !b.contains(&0)
}

fn one_component(name: &OsStr) -> io::Result<&OsStr> {
    if is_single_component(name) {
        Ok(name)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single path component"),
        ))
    }
}

fn dot_if_empty(rel: &Path) -> &Path {
    if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    }
}

impl Root {
    /// Opens the directory at `path` (an absolute host path the agent chose, never one from
    /// input) as a root.
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        Ok(Self {
            fd,
            path: path.to_owned(),
        })
    }

    /// A root from a directory descriptor already opened (`path` for messages).
    pub fn from_fd(fd: OwnedFd, path: PathBuf) -> Self {
        Self { fd, path }
    }

    /// The host path this root was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens `rel` below the root with `flags`, its components resolved as `resolve` says.
    pub fn open_at(&self, rel: &Path, flags: OFlag, resolve: Resolve) -> io::Result<OwnedFd> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(resolve.flags());
        openat2(self.fd.as_fd(), dot_if_empty(rel), how).map_err(errno)
    }

    /// Reads at most `max_bytes` of the regular file `rel` below the root. The open never
    /// blocks and touches no device: a FIFO or a device node where a file is expected (an
    /// image's `/etc/passwd`, a file a container wrote) is refused after `fstat`, unread.
    pub fn read_regular(
        &self,
        rel: &Path,
        max_bytes: u64,
        resolve: Resolve,
    ) -> io::Result<Vec<u8>> {
        let fd = self.open_at(
            rel,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
            resolve,
        )?;
        let stat = nix::sys::stat::fstat(&fd).map_err(errno)?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a regular file", self.path.join(rel).display()),
            ));
        }
        let mut bytes = Vec::new();
        io::Read::read_to_end(
            &mut io::Read::take(std::fs::File::from(fd), max_bytes),
            &mut bytes,
        )?;
        Ok(bytes)
    }

    /// The directory `rel` below the root, as a root of its own.
    pub fn open_dir(&self, rel: &Path, resolve: Resolve) -> io::Result<Root> {
        let fd = self.open_at(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, resolve)?;
        Ok(Root {
            fd,
            path: self.path.join(rel),
        })
    }

    /// The directory `rel` below the root, creating missing directories with `mode`. With
    /// [`Resolve::InRoot`], a dangling symlink on the way is followed as the container would
    /// follow it (its target created beneath the root), like containerd's layer apply.
    pub fn create_dir_all(&self, rel: &Path, mode: u32, resolve: Resolve) -> io::Result<Root> {
        self.create_dir_all_within(rel, mode, resolve, 0)
    }

    fn create_dir_all_within(
        &self,
        rel: &Path,
        mode: u32,
        resolve: Resolve,
        links: u32,
    ) -> io::Result<Root> {
        match self.open_dir(rel, resolve) {
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
            other => return other,
        }
        let rel = normal_components(rel).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} leaves its root", rel.display()),
            )
        })?;
        let (Some(parent_rel), Some(name)) = (rel.parent(), rel.file_name()) else {
            return self.open_dir(&rel, resolve);
        };
        let parent = self.create_dir_all_within(parent_rel, mode, resolve, links)?;
        match mkdirat(parent.fd(), name, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(errno(e)),
        }
        // Opened again from this root: a name that exists as something else (a file, or a
        // dangling symlink under Beneath) fails here rather than being followed.
        match self.open_dir(&rel, resolve) {
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) && resolve == Resolve::InRoot => {
                // A dangling symlink: make its target (as resolved inside the root) and retry.
                if links >= 40 {
                    return Err(errno(Errno::ELOOP));
                }
                let target = nix::fcntl::readlinkat(parent.fd(), name).map_err(errno)?;
                let target = Path::new(&target);
                let joined = if target.is_absolute() {
                    target.to_owned()
                } else {
                    parent_rel.join(target)
                };
                self.create_dir_all_within(&clamp_to_root(&joined), mode, resolve, links + 1)?;
                self.open_dir(&rel, resolve)
            }
            other => other,
        }
    }

    /// An `O_PATH` descriptor of `rel` below the root (every component a real directory),
    /// made as a directory if nothing is there — how the kubelet opens a subPath — and
    /// whether it is a directory.
    pub fn open_or_make_dir(&self, rel: &Path) -> io::Result<(OwnedFd, bool)> {
        let open = || self.open_at(rel, OFlag::O_PATH, Resolve::Beneath);
        let fd = match open() {
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => self
                .create_dir_all(rel, 0o755, Resolve::Beneath)
                .and_then(|_| open()),
            other => other,
        }?;
        let st = nix::sys::stat::fstat(&fd).map_err(errno)?;
        Ok((fd, st.st_mode & libc::S_IFMT == libc::S_IFDIR))
    }

    /// What `name` (one component) in this directory is, without following a symlink.
    pub fn kind_of(&self, name: &OsStr) -> io::Result<Option<SFlag>> {
        match fstatat(
            self.fd(),
            one_component(name)?,
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => Ok(Some(SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(errno(e)),
        }
    }

    /// Removes `name` (one component) of this directory, recursively if it is a directory;
    /// symlinks are removed, never followed. Absent is fine.
    pub fn remove_all(&self, name: &OsStr) -> io::Result<()> {
        remove_all_at(self.fd(), one_component(name)?)
    }

    /// Every name in this directory (not `.`/`..`).
    pub fn names(&self) -> io::Result<Vec<std::ffi::OsString>> {
        let fd = openat(
            self.fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        list(fd)
    }

    /// Writes `bytes` as the file `name` (one component) of this directory, replacing what
    /// was there (also a symlink or a directory) through a temporary name and a rename.
    pub fn write_file(&self, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
        let name = one_component(name)?;
        let mut tmp = std::ffi::OsString::from(".shoal-tmp-");
        tmp.push(name);
        remove_all_at(self.fd(), &tmp)?;
        let fd = openat(
            self.fd(),
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(errno)?;
        let mut file = std::fs::File::from(fd);
        io::Write::write_all(&mut file, bytes)?;
        nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(mode)).map_err(errno)?;
        drop(file);
        if self.kind_of(name)? == Some(SFlag::S_IFDIR) {
            remove_all_at(self.fd(), name)?;
        }
        nix::fcntl::renameat(self.fd(), tmp.as_os_str(), self.fd(), name).map_err(errno)
    }
}

fn list(fd: OwnedFd) -> io::Result<Vec<std::ffi::OsString>> {
    let mut dir = nix::dir::Dir::from_fd(fd).map_err(errno)?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(errno)?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

fn remove_all_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let st = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(errno(e)),
    };
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let child = openat(
            dir,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        let names = {
            let listing = nix::fcntl::openat(
                child.as_fd(),
                ".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(errno)?;
            list(listing)?
        };
        for n in names {
            remove_all_at(child.as_fd(), &n)?;
        }
        match unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(errno(e)),
        }
    } else {
        match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(errno(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        std::fs::write(dir.path().join("canary"), b"host").unwrap();
        let root = Root::open(&dir.path().join("root")).unwrap();
        (dir, root)
    }

    #[test]
    fn beneath_refuses_symlinks_and_escapes() {
        let (dir, root) = setup();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("root/out")).unwrap();
        std::os::unix::fs::symlink("..", dir.path().join("root/up")).unwrap();
        for rel in ["out", "up", "..", "../root", "out/canary"] {
            let err = root.open_dir(Path::new(rel), Resolve::Beneath).unwrap_err();
            assert!(
                matches!(
                    err.raw_os_error(),
                    Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR)
                ),
                "{rel}: {err}"
            );
        }
        let err = root
            .create_dir_all(Path::new("out/new"), 0o755, Resolve::Beneath)
            .unwrap_err();
        assert!(err.raw_os_error().is_some(), "{err}");
        assert!(!dir.path().join("new").exists());
        let sub = root
            .create_dir_all(Path::new("a/b/c"), 0o755, Resolve::Beneath)
            .unwrap();
        assert!(sub.path().ends_with("a/b/c"));
        assert!(dir.path().join("root/a/b/c").is_dir());
    }

    #[test]
    fn in_root_resolves_symlinks_as_if_the_root_were_slash() {
        let (dir, root) = setup();
        std::os::unix::fs::symlink("/", dir.path().join("root/evil")).unwrap();
        std::os::unix::fs::symlink("../../..", dir.path().join("root/up")).unwrap();
        for rel in ["evil", "up", "evil/up/evil"] {
            let got = root.open_dir(Path::new(rel), Resolve::InRoot).unwrap();
            let st = nix::sys::stat::fstat(got.fd()).unwrap();
            let want = nix::sys::stat::fstat(root.fd()).unwrap();
            assert_eq!((st.st_dev, st.st_ino), (want.st_dev, want.st_ino), "{rel}");
        }
        let made = root
            .create_dir_all(Path::new("evil/etc"), 0o755, Resolve::InRoot)
            .unwrap();
        drop(made);
        assert!(dir.path().join("root/etc").is_dir());
        assert!(!Path::new("/etc/canary-of-shoal").exists());
    }

    #[test]
    fn in_root_creates_the_targets_of_dangling_symlinks_inside_the_root() {
        let (dir, root) = setup();
        let host = dir.path().join("host-dir");
        std::os::unix::fs::symlink(&host, dir.path().join("root/abs")).unwrap();
        std::os::unix::fs::symlink("../../x/y", dir.path().join("root/rel")).unwrap();
        std::os::unix::fs::symlink("loop", dir.path().join("root/loop")).unwrap();
        root.create_dir_all(Path::new("abs/sub"), 0o755, Resolve::InRoot)
            .unwrap();
        assert!(!host.exists(), "the host path was created");
        let inside = dir
            .path()
            .join("root")
            .join(host.strip_prefix("/").unwrap());
        assert!(inside.join("sub").is_dir());
        root.create_dir_all(Path::new("rel/z"), 0o755, Resolve::InRoot)
            .unwrap();
        assert!(dir.path().join("root/x/y/z").is_dir());
        assert!(
            root.create_dir_all(Path::new("loop/z"), 0o755, Resolve::InRoot)
                .is_err()
        );
    }

    #[test]
    fn remove_all_never_follows_links() {
        let (dir, root) = setup();
        std::fs::create_dir_all(dir.path().join("root/d/e")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("root/d/e/host")).unwrap();
        root.remove_all(OsStr::new("d")).unwrap();
        assert!(!dir.path().join("root/d").exists());
        assert_eq!(std::fs::read(dir.path().join("canary")).unwrap(), b"host");
        assert!(root.remove_all(OsStr::new("../canary")).is_err());
        assert!(root.remove_all(OsStr::new("..")).is_err());
        assert!(dir.path().join("canary").exists());
    }

    #[test]
    fn write_file_replaces_a_symlink_instead_of_writing_through_it() {
        let (dir, root) = setup();
        std::os::unix::fs::symlink(dir.path().join("canary"), dir.path().join("root/key")).unwrap();
        root.write_file(OsStr::new("key"), b"value", 0o644).unwrap();
        assert_eq!(std::fs::read(dir.path().join("canary")).unwrap(), b"host");
        assert_eq!(
            std::fs::read(dir.path().join("root/key")).unwrap(),
            b"value"
        );
        assert!(root.write_file(OsStr::new("a/b"), b"x", 0o644).is_err());
        assert_eq!(root.names().unwrap(), vec![std::ffi::OsString::from("key")]);
    }
}

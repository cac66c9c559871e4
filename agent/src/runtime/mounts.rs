//! What a container mounts, resolved on the host when it starts: volumes (and their
//! `subPath`s), host paths under the node's policy, and node-local seccomp profiles, every path
//! opened beneath its root without following a symlink out.

use super::*;

impl Runtime {
    /// Directory of a pod's volume `name` (both checked to be one path component).
    pub fn volume_dir(&self, uid: &str, name: &str) -> Result<PathBuf, RuntimeError> {
        check_id("pod uid", uid)?;
        check_id("volume name", name)?;
        Ok(self.pod_dir(uid).join("volumes").join(name))
    }

    /// Creates (if missing) the directory of a pod's volume `name` beneath the pods
    /// directory, refusing any symlink on the way, and returns it as a [`Root`] for the
    /// kubelet to fill.
    pub fn ensure_volume(&self, uid: &str, name: &str) -> Result<Root, RuntimeError> {
        check_id("pod uid", uid)?;
        check_id("volume name", name)?;
        let rel = Path::new(uid).join("volumes").join(name);
        Root::open(&self.pods_dir)
            .and_then(|pods| pods.create_dir_all(&rel, 0o755, Resolve::Beneath))
            .map_err(io_at(&self.pods_dir.join(&rel)))
    }

    /// [`Runtime::ensure_volume`] with a tmpfs mounted on it (once: a volume that is already a
    /// tmpfs is left as it is), `nosuid,nodev`, world-writable as an emptyDir, of `size_bytes`
    /// if given. Mounted through the directory's descriptor (`/proc/self/fd/N`), so nothing
    /// swapped in on its path since it was opened beneath the pods directory is mounted on;
    /// [`Runtime::remove_sandbox`] unmounts it with the pod's other mounts.
    pub fn ensure_memory_volume(
        &self,
        uid: &str,
        name: &str,
        size_bytes: Option<u64>,
    ) -> Result<Root, RuntimeError> {
        use std::os::fd::AsRawFd;
        let dir = self.ensure_volume(uid, name)?;
        let path = self.volume_dir(uid, name)?;
        let fs = nix::sys::statfs::fstatfs(dir.fd()).map_err(|e| RuntimeError::Io {
            path: path.clone(),
            source: e.into(),
        })?;
        if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC {
            return Ok(dir);
        }
        let target = format!("/proc/self/fd/{}", dir.fd().as_raw_fd());
        let options = match size_bytes {
            Some(bytes) => format!("mode=0777,size={bytes}"),
            None => "mode=0777".to_owned(),
        };
        nix::mount::mount(
            Some("tmpfs"),
            target.as_str(),
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| RuntimeError::Io {
            path: path.clone(),
            source: e.into(),
        })?;
        drop(dir);
        // Opened again: the tmpfs's root now.
        self.ensure_volume(uid, name)
    }

    /// Where attempt `attempt` of container `name` of pod `uid` may write its termination
    /// message: beside its log, kept as long as the log.
    pub fn termination_path(&self, uid: &str, name: &str, attempt: u32) -> PathBuf {
        self.pod_dir(uid)
            .join("logs")
            .join(name)
            .join(format!("{attempt}.termination"))
    }

    /// Makes the attempt's termination message file, empty and writable by any user of the
    /// container (as the kubelet makes it), beneath the pods directory without following a
    /// symlink; returns its path.
    fn termination_log(
        &self,
        uid: &str,
        name: &str,
        attempt: u32,
    ) -> Result<PathBuf, RuntimeError> {
        check_id("pod uid", uid)?;
        check_id("container name", name)?;
        let path = self.termination_path(uid, name, attempt);
        Root::open(&self.pods_dir)
            .and_then(|pods| {
                pods.create_dir_all(
                    &Path::new(uid).join("logs").join(name),
                    0o755,
                    Resolve::Beneath,
                )
            })
            .and_then(|dir| {
                dir.write_file(
                    std::ffi::OsStr::new(&format!("{attempt}.termination")),
                    b"",
                    0o666,
                )
            })
            .map_err(io_at(&path))?;
        Ok(path)
    }

    /// A node-local seccomp profile: `<data-dir>/seccomp/<rel>`, resolved beneath that
    /// directory without following symlinks, at most 1 MiB, checked to be an OCI
    /// `linux.seccomp` object.
    pub fn seccomp_profile(&self, rel: &str) -> Result<serde_json::Value, RuntimeError> {
        let refused = |reason: String| RuntimeError::Seccomp {
            path: rel.to_owned(),
            reason,
        };
        let root = Root::open(&self.seccomp_dir)
            .map_err(|e| refused(format!("{}: {e}", self.seccomp_dir.display())))?;
        let fd = root
            .open_at(
                Path::new(rel),
                nix::fcntl::OFlag::O_RDONLY,
                Resolve::Beneath,
            )
            .map_err(|e| refused(format!("{}: {e}", self.seccomp_dir.join(rel).display())))?;
        let mut bytes = Vec::new();
        io::Read::read_to_end(
            &mut io::Read::take(std::fs::File::from(fd), 1 << 20),
            &mut bytes,
        )
        .map_err(|e| refused(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| refused(format!("not JSON: {e}")))?;
        serde_json::from_value::<oci_spec::runtime::LinuxSeccomp>(value.clone())
            .map_err(|e| refused(format!("not an OCI seccomp profile: {e}")))?;
        Ok(value)
    }

    fn sub_paths_dir(&self, uid: &str, container: &str, attempt: u32) -> PathBuf {
        self.pod_dir(uid)
            .join("subpaths")
            .join(format!("{container}.{attempt}"))
    }

    /// Makes `sub_path` of volume `volume` available to one container attempt, as the kubelet
    /// does since CVE-2017-1002101: the path is opened beneath the volume with every
    /// component a real directory (a symlink the container planted is refused, never
    /// followed), created as a directory if missing, and the opened file itself (through its
    /// descriptor) is bind-mounted at `pods/<uid>/subpaths/<container>.<attempt>/<index>`,
    /// which the container's mount then names. Returns that path.
    pub fn bind_sub_path(
        &self,
        uid: &str,
        volume: &str,
        sub_path: &str,
        container: &str,
        attempt: u32,
        index: usize,
    ) -> Result<PathBuf, RuntimeError> {
        check_id("pod uid", uid)?;
        check_id("volume name", volume)?;
        check_id("container name", container)?;
        let refuse = |reason: String| RuntimeError::SubPath {
            volume: volume.to_owned(),
            sub_path: sub_path.to_owned(),
            reason,
        };
        let rel = crate::beneath::normal_components(Path::new(sub_path))
            .ok_or_else(|| refuse("must be a relative path without '..'".into()))?;
        let root = self.ensure_volume(uid, volume)?;
        let (fd, is_dir) = root
            .open_or_make_dir(&rel)
            .map_err(|err| match err.raw_os_error() {
                Some(libc::ELOOP) => {
                    refuse("a symlink is on its path; it is refused, never followed".into())
                }
                Some(libc::EXDEV) => refuse("it leaves its volume".into()),
                _ => refuse(err.to_string()),
            })?;
        self.stage_bind(uid, container, attempt, index, &fd, is_dir, false)
    }

    /// Makes provisioned volume `volume` (or `sub_path` beneath it) available to one container
    /// attempt: opened beneath the node's volumes directory, every component a real directory,
    /// and bind-mounted through that descriptor at the attempt's staging path.
    pub fn bind_persistent(
        &self,
        uid: &str,
        volume: &str,
        sub_path: Option<&str>,
        container: &str,
        attempt: u32,
        index: usize,
    ) -> Result<PathBuf, RuntimeError> {
        check_id("pod uid", uid)?;
        check_id("container name", container)?;
        let refuse = |reason: String| RuntimeError::SubPath {
            volume: volume.to_owned(),
            sub_path: sub_path.unwrap_or_default().to_owned(),
            reason,
        };
        let root = persistent::open(&self.data_dir, volume)?;
        let (fd, is_dir) = match sub_path {
            None => (
                root.fd()
                    .try_clone_to_owned()
                    .map_err(|e| refuse(e.to_string()))?,
                true,
            ),
            Some(sub) => {
                let rel = crate::beneath::normal_components(Path::new(sub))
                    .ok_or_else(|| refuse("must be a relative path without '..'".into()))?;
                root.open_or_make_dir(&rel)
                    .map_err(|err| match err.raw_os_error() {
                        Some(libc::ELOOP) => {
                            refuse("a symlink is on its path; it is refused, never followed".into())
                        }
                        Some(libc::EXDEV) => refuse("it leaves its volume".into()),
                        _ => refuse(err.to_string()),
                    })?
            }
        };
        self.stage_bind(uid, container, attempt, index, &fd, is_dir, false)
    }

    /// Makes host path `path` (a `hostPath` volume, optionally with `sub_path`) available to
    /// one container attempt: created if its type says so, opened (host symlinks followed:
    /// the host's layout is the administrator's), checked against `policy` on the path the
    /// descriptor resolved to and against its type, then bind-mounted through that very
    /// descriptor at the attempt's staging path (so nothing can swap it between the check
    /// and the mount). Returns the staging path.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_host_path(
        &self,
        uid: &str,
        container: &str,
        attempt: u32,
        index: usize,
        path: &str,
        kind: HostPathType,
        sub_path: Option<&str>,
        policy: &HostPathPolicy,
    ) -> Result<PathBuf, RuntimeError> {
        use std::os::fd::AsRawFd;
        check_id("pod uid", uid)?;
        check_id("container name", container)?;
        let refuse = |reason: String| RuntimeError::HostPath {
            path: path.to_owned(),
            reason,
        };
        let lexical = Path::new(path);
        if !lexical.is_absolute() || path.split('/').any(|p| p == "..") {
            return Err(refuse("must be an absolute path without '..'".into()));
        }
        let allowed = |resolved: &Path| -> Result<(), RuntimeError> {
            let data = &self.data_dir;
            if resolved.starts_with(data) || data.starts_with(resolved) {
                return Err(refuse(format!(
                    "resolves to {}, which is or holds this agent's data dir {}",
                    resolved.display(),
                    data.display()
                )));
            }
            if let Some(secret) = policy.protected.iter().find(|p| p.starts_with(resolved)) {
                return Err(refuse(format!(
                    "resolves to {}, which is or holds {}, a secret of this agent",
                    resolved.display(),
                    secret.display()
                )));
            }
            if let Some(denied) = policy.deny.iter().find(|d| resolved.starts_with(d)) {
                return Err(refuse(format!(
                    "resolves to {}, beneath {}, which the node's --host-path-deny refuses",
                    resolved.display(),
                    denied.display()
                )));
            }
            if !policy.allow.is_empty() && !policy.allow.iter().any(|a| resolved.starts_with(a)) {
                return Err(refuse(format!(
                    "resolves to {}, outside the node's --host-path-allow prefixes",
                    resolved.display()
                )));
            }
            Ok(())
        };
        let exists = std::fs::symlink_metadata(lexical).is_ok();
        // A missing path with no type (`""`) is made a directory, as containerd's CRI does
        // (the fluentd DaemonSet's `/var/lib/docker/containers` on a host without Docker).
        if !exists
            && matches!(
                kind,
                HostPathType::DirectoryOrCreate
                    | HostPathType::FileOrCreate
                    | HostPathType::Unchecked
            )
        {
            // Check where it would land before making it: the deepest existing ancestor,
            // resolved, plus the rest.
            let mut ancestor = lexical.to_owned();
            let mut rest = Vec::new();
            while std::fs::symlink_metadata(&ancestor).is_err() {
                rest.push(ancestor.file_name().unwrap_or_default().to_owned());
                if !ancestor.pop() {
                    break;
                }
            }
            let mut would_be = std::fs::canonicalize(&ancestor).map_err(io_at(&ancestor))?;
            for part in rest.iter().rev() {
                would_be.push(part);
            }
            allowed(&would_be)?;
            if kind != HostPathType::FileOrCreate {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&would_be)
                    .map_err(io_at(&would_be))?;
            } else {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(&would_be)
                    .map_err(io_at(&would_be))?;
            }
        }
        let fd = nix::fcntl::open(
            lexical,
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| refuse(format!("cannot be opened: {e}")))?;
        let resolved = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(io_at(lexical))?;
        allowed(&resolved)?;
        let mode = nix::sys::stat::fstat(&fd)
            .map_err(|e| refuse(e.to_string()))?
            .st_mode
            & libc::S_IFMT;
        let want = match kind {
            HostPathType::Unchecked => None,
            HostPathType::DirectoryOrCreate | HostPathType::Directory => {
                Some((libc::S_IFDIR, "a directory"))
            }
            HostPathType::FileOrCreate | HostPathType::File => Some((libc::S_IFREG, "a file")),
            HostPathType::Socket => Some((libc::S_IFSOCK, "a socket")),
            HostPathType::CharDevice => Some((libc::S_IFCHR, "a character device")),
            HostPathType::BlockDevice => Some((libc::S_IFBLK, "a block device")),
        };
        if let Some((want, what)) = want
            && mode != want
        {
            return Err(refuse(format!("is not {what}, as its type requires")));
        }
        let (fd, is_dir) = match sub_path {
            None => (fd, mode == libc::S_IFDIR),
            Some(sub) => {
                let rel = crate::beneath::normal_components(Path::new(sub))
                    .ok_or_else(|| refuse(format!("subPath {sub:?} must descend")))?;
                Root::from_fd(fd, resolved.clone())
                    .open_or_make_dir(&rel)
                    .map_err(|e| refuse(format!("subPath {sub:?}: {e}")))?
            }
        };
        self.stage_bind(uid, container, attempt, index, &fd, is_dir, true)
    }

    /// Bind-mounts what `fd` refers to at the attempt's staging path `index`.
    #[allow(clippy::too_many_arguments)]
    fn stage_bind(
        &self,
        uid: &str,
        container: &str,
        attempt: u32,
        index: usize,
        fd: &std::os::fd::OwnedFd,
        is_dir: bool,
        recursive: bool,
    ) -> Result<PathBuf, RuntimeError> {
        use std::os::fd::AsRawFd;
        let dir = self.sub_paths_dir(uid, container, attempt);
        std::fs::create_dir_all(&dir).map_err(io_at(&dir))?;
        let target = dir.join(index.to_string());
        unmount(&target)?;
        if is_dir {
            std::fs::create_dir_all(&target).map_err(io_at(&target))?;
        } else {
            std::fs::File::create(&target).map_err(io_at(&target))?;
        }
        let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let mut flags = nix::mount::MsFlags::MS_BIND;
        if recursive {
            flags |= nix::mount::MsFlags::MS_REC;
        }
        nix::mount::mount(Some(&source), &target, None::<&str>, flags, None::<&str>).map_err(
            |e| RuntimeError::Io {
                path: target.clone(),
                source: io::Error::from(e),
            },
        )?;
        Ok(target)
    }

    /// Unmounts and removes the subPath mounts of one container attempt.
    pub(super) fn remove_sub_paths(
        &self,
        uid: &str,
        container: &str,
        attempt: u32,
    ) -> Result<(), RuntimeError> {
        let dir = self.sub_paths_dir(uid, container, attempt);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(());
        };
        for entry in entries.filter_map(Result::ok) {
            unmount(&entry.path())?;
        }
        std::fs::remove_dir_all(&dir).map_err(io_at(&dir))
    }

    /// What `request`'s mounts and seccomp profile are on this node: sandbox files, volume
    /// directories, subPaths and host paths bind-mounted for this attempt (each checked as
    /// [`Self::bind_sub_path`] and [`Self::bind_host_path`] say), the profile read beneath the
    /// node's profile directory; and the pod's namespace and the container's cgroup.
    pub(super) fn resolve(
        &self,
        pod_uid: &str,
        meta: &ContainerMeta,
        request: &ContainerRequest,
    ) -> Result<spec::Resolved, RuntimeError> {
        let mut mounts = Vec::with_capacity(request.mounts.len());
        for (index, mount) in request.mounts.iter().enumerate() {
            let source = match &mount.source {
                spec::MountSource::SandboxFile(name) => Ok(self.etc_dir(pod_uid).join(name)),
                spec::MountSource::TerminationLog => {
                    self.termination_log(pod_uid, &meta.name, meta.attempt)
                }
                spec::MountSource::Volume {
                    volume,
                    sub_path: None,
                } => self.volume_dir(pod_uid, volume),
                spec::MountSource::Volume {
                    volume,
                    sub_path: Some(sub),
                } => self.bind_sub_path(pod_uid, volume, sub, &meta.name, meta.attempt, index),
                spec::MountSource::Persistent { volume, sub_path } => self.bind_persistent(
                    pod_uid,
                    volume,
                    sub_path.as_deref(),
                    &meta.name,
                    meta.attempt,
                    index,
                ),
                spec::MountSource::HostPath {
                    path,
                    kind,
                    sub_path,
                } => self.bind_host_path(
                    pod_uid,
                    &meta.name,
                    meta.attempt,
                    index,
                    path,
                    *kind,
                    sub_path.as_deref(),
                    &self.host_paths,
                ),
            }
            .map_err(|source| RuntimeError::Mount {
                field: mount.field.clone(),
                source: Box::new(source),
            })?;
            mounts.push(BindMount {
                source,
                destination: mount.destination.clone(),
                readonly: mount.readonly,
                recursive_readonly: mount.recursive_readonly,
            });
        }
        let seccomp_profile = match &request.seccomp {
            spec::Seccomp::Localhost(path) => Some(self.seccomp_profile(path)?),
            _ => None,
        };
        Ok(spec::Resolved {
            mounts,
            netns: self.netns_path(pod_uid),
            cgroup_path: meta.cgroup_path.clone(),
            seccomp_profile,
        })
    }
}

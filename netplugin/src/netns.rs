//! Named network namespaces at `/run/netns/<name>` (where iproute2 and runc look), made and
//! removed without running `ip`: a thread unshares a new network namespace and bind-mounts it
//! onto the name, so it outlives the thread; removal unmounts and unlinks it.

use std::future::Future;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use crate::NetError;

/// Where named namespaces live.
pub const NETNS_DIR: &str = "/run/netns";

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> NetError + 'a {
    move |source| NetError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn errno<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(nix::errno::Errno) -> NetError + 'a {
    move |e| NetError::Io {
        op,
        path: path.to_owned(),
        source: std::io::Error::from(e),
    }
}

/// The path of namespace `name`.
pub fn path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

fn is_mount_point(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let path = path.to_string_lossy();
    text.lines()
        .any(|l| l.split(' ').nth(4) == Some(path.as_ref()))
}

/// Creates namespace `name` with its loopback up, unless it exists. Returns its path.
pub fn create(name: &str) -> Result<PathBuf, NetError> {
    let path = path(name);
    if is_mount_point(&path) {
        return Ok(path);
    }
    std::fs::create_dir_all(NETNS_DIR).map_err(io("create", Path::new(NETNS_DIR)))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io("create", &path))?;
    let made = std::thread::scope(|s| {
        s.spawn(|| -> Result<(), NetError> {
            // Only this thread moves; it ends right after, the mount keeps the namespace.
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(errno("unshare", &path))?;
            nix::mount::mount(
                Some("/proc/thread-self/ns/net"),
                &path,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(errno("bind-mount", &path))?;
            block_on(async {
                let handle = connect()?;
                crate::linux::set_up(&handle, "lo").await
            })
        })
        .join()
        .unwrap_or_else(|_| {
            Err(NetError::Netlink {
                op: "create namespace".into(),
                message: "thread panicked".into(),
            })
        })
    });
    if let Err(err) = made {
        let _ = delete_path(&path);
        return Err(err);
    }
    Ok(path)
}

/// Removes namespace `name` if present.
pub fn delete(name: &str) -> Result<(), NetError> {
    delete_path(&path(name))
}

fn delete_path(path: &Path) -> Result<(), NetError> {
    if is_mount_point(path) {
        nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH)
            .map_err(errno("unmount", path))?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", path)(e)),
        _ => Ok(()),
    }
}

/// Runs `f` on a fresh thread (with its own single-threaded tokio runtime and netlink
/// connection) inside the network namespace at `netns`: the socket is bound to the namespace
/// it is opened in, and the thread ends with the operation, so no thread of the agent is ever
/// left in a pod's namespace.
pub fn run_in<T, F, Fut>(netns: &Path, f: F) -> Result<T, NetError>
where
    T: Send,
    F: FnOnce(rtnetlink::Handle) -> Fut + Send,
    Fut: Future<Output = Result<T, NetError>>,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::open(netns).map_err(io("open", netns))?;
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(errno("setns", netns))?;
            block_on(async { f(connect()?).await })
        })
        .join()
        .unwrap_or_else(|_| {
            Err(NetError::Netlink {
                op: format!("in {}", netns.display()),
                message: "thread panicked".into(),
            })
        })
    })
}

/// Runs `f` with a netlink connection in the caller's own namespace (on a scoped thread, so it
/// may be called from anywhere, also from inside a tokio runtime).
pub fn run_here<T, F, Fut>(f: F) -> Result<T, NetError>
where
    T: Send,
    F: FnOnce(rtnetlink::Handle) -> Fut + Send,
    Fut: Future<Output = Result<T, NetError>>,
{
    std::thread::scope(|s| {
        s.spawn(|| block_on(async { f(connect()?).await }))
            .join()
            .unwrap_or_else(|_| {
                Err(NetError::Netlink {
                    op: "netlink".into(),
                    message: "thread panicked".into(),
                })
            })
    })
}

fn block_on<T>(f: impl Future<Output = Result<T, NetError>>) -> Result<T, NetError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(io("start a runtime", Path::new("/")))?
        .block_on(f)
}

/// A netlink connection whose driver runs on the current runtime.
fn connect() -> Result<rtnetlink::Handle, NetError> {
    let (connection, handle, _) =
        rtnetlink::new_connection().map_err(io("netlink", Path::new("netlink")))?;
    tokio::spawn(connection);
    Ok(handle)
}

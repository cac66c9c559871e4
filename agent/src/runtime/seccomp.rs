//! Shoal's `RuntimeDefault` seccomp profile: the `linux.seccomp` object of a container's OCI
//! `config.json`, an allow-list equivalent to the default profile that Docker (moby) and
//! containerd apply to Kubernetes pods with `seccompProfile: RuntimeDefault`. It is written
//! as data: one sorted list of syscalls everyone may make ([`ALLOWED`]), a few rules with
//! argument filters, and one small table per capability that unlocks more.
//!
//! # Upstream version
//!
//! Followed: **moby/profiles `seccomp/v0.2.3`** (May 2026; `seccomp/default.json`, which the
//! Docker daemon embeds), cross-checked against containerd v2.3.4's
//! `contrib/seccomp/seccomp_default.go` (the profile containerd's CRI uses for
//! `RuntimeDefault`). The two allow the same syscalls with one exception:
//! containerd still lets everyone call `lsm_get_self_attr`, `lsm_list_modules` and
//! `lsm_set_self_attr`, while moby (since May 2025) requires CAP_SYS_ADMIN for them. We follow
//! moby there. containerd leaves `defaultErrnoRet` unset (runc then uses EPERM anyway). We set
//! it explicitly.
//!
//! Upstream's conditions are evaluated here, once, when the spec is built:
//! - `includes.arches`: [`std::env::consts::ARCH`]; only x86_64 and aarch64 are described
//!   (ppc64le, s390x, riscv64, mips and loongarch extras are left out);
//! - `includes.caps` / `excludes.caps`: the `capabilities` argument, which must be the
//!   container's bounding set (moby checks `process.capabilities.bounding`), with names like
//!   `"CAP_SYS_ADMIN"`;
//! - `includes.minKernel: 4.8` (ptrace, see below): treated as always true, because Shoal
//!   requires kernel ≥ 5.x.
//!
//! # Decisions
//!
//! - **ptrace**: `ptrace`, `process_vm_readv` and `process_vm_writev` are allowed without a
//!   capability, as upstream does on kernels ≥ 4.8. Since 4.8 the kernel runs seccomp again
//!   after a tracer changes a syscall, so a traced child can't use its tracer to get around
//!   the filter. The kernel's own ptrace access checks (same credentials or CAP_SYS_PTRACE,
//!   Yama) still apply, and the pid namespace limits what can be seen. `kcmp`, `pidfd_getfd`
//!   and `process_madvise` still need CAP_SYS_PTRACE.
//! - **clone / clone3**: seccomp can only look at register arguments, and clone3 passes its
//!   flags in a struct in memory. Without CAP_SYS_ADMIN, `clone` is allowed only when none of
//!   the namespace flags are set ([`CLONE_NAMESPACE_FLAGS`], masked-equal 0 on argument 0; s390
//!   swaps clone's first two arguments and is ignored here). `clone3` is answered with ENOSYS,
//!   not EPERM, so glibc (≥ 2.34) and other libcs fall back to the filtered `clone`, as moby
//!   and containerd do. With CAP_SYS_ADMIN both are allowed without a filter.
//! - **io_uring**: `io_uring_setup`, `io_uring_enter` and `io_uring_register` are not allowed.
//!   Operations submitted through a ring are not syscalls, so seccomp can't see them.
//!   containerd (a48ddf4, 2023-11-02) and moby (0e2acd4, same day) removed them from the
//!   default.
//! - **socket**: every address family except AF_ALG (38) and AF_VSOCK (40), using three
//!   single-condition range rules as upstream does. runc splits two conditions on the same
//!   argument into separate rules that are OR-ed, so `!= 38 && != 40` can't be written as one
//!   rule. On 32-bit x86 binaries (`SCMP_ARCH_X86`), `socket()` can go through `socketcall(2)`,
//!   which is allowed without a filter, so the family filter doesn't apply there. Upstream has
//!   the same gap.
//! - Upstream has no table for CAP_SYS_RESOURCE, and neither do we. Calls like `setrlimit` and
//!   `prlimit64` are allowed to everyone, and the kernel checks the capability itself.
//! - Never allowed, with any capability: `kexec_load`, `kexec_file_load`, `swapon`, `swapoff`,
//!   `keyctl`, `add_key`, `request_key`, `userfaultfd`, `pivot_root`, the io_uring calls and
//!   anything else not listed here.
//!
//! # Names an architecture lacks (runc)
//!
//! The lists include names that exist only on some architectures (`chown32`, `_llseek`,
//! `riscv_hwprobe`) or only in recent kernels (`getxattrat`, 6.13). That is fine: `matchCall` in
//! runc's `libcontainer/seccomp/seccomp_linux.go` (read in v1.1.5, the version Debian 12
//! ships, and on main in 2026) resolves each name with libseccomp's
//! `seccomp_syscall_resolve_name`. If libseccomp doesn't know the name at all (an older
//! libseccomp, a typo), runc skips it with a debug log (`unknown seccomp syscall %q ignored`)
//! and doesn't fail. If libseccomp knows the name but the native architecture lacks it, it
//! resolves to a negative pseudo-syscall number. That becomes a rule only on the filter's
//! architectures that have the syscall; libseccomp's `src/gen_bpf.c` skips pseudo-syscalls
//! when it generates BPF. runc does reject unknown architecture, action or operator names.
//! Its `libcontainer/seccomp/patchbpf` also answers syscalls newer than any syscall the filter
//! names with ENOSYS instead of the default errno, so programs that probe new syscalls fall
//! back cleanly.
//!
//! One consequence: a typo in a name here would be dropped silently by runc. The unit tests
//! only check the names against the upstream list by count (and sortedness), so keep changes
//! to the lists in step with upstream.

use serde_json::{Value, json};

/// The upstream profile this module follows.
pub const UPSTREAM: &str = "moby/profiles seccomp/v0.2.3";

/// What a syscall outside the profile gets: EPERM.
const EPERM: u32 = 1;
/// What `clone3` gets without CAP_SYS_ADMIN: ENOSYS, so callers fall back to `clone`.
const ENOSYS: u32 = 38;

const CLONE_NEWNS: u64 = 0x0002_0000;
const CLONE_NEWCGROUP: u64 = 0x0200_0000;
const CLONE_NEWUTS: u64 = 0x0400_0000;
const CLONE_NEWIPC: u64 = 0x0800_0000;
const CLONE_NEWUSER: u64 = 0x1000_0000;
const CLONE_NEWPID: u64 = 0x2000_0000;
const CLONE_NEWNET: u64 = 0x4000_0000;

/// The `clone` flags that create namespaces: 0x7E020000 (2114060288). Without CAP_SYS_ADMIN
/// none of them may be set.
pub const CLONE_NAMESPACE_FLAGS: u64 = CLONE_NEWNS
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
    | CLONE_NEWCGROUP;

/// Address families `socket(2)` refuses: AF_ALG (kernel crypto API) and AF_VSOCK (host/guest
/// sockets). 39 (AF_NFC) is between them and stays allowed.
const AF_ALG: u64 = 38;
const AF_VSOCK: u64 = 40;

/// `personality(2)` domains that are allowed: PER_LINUX, PER_LINUX32, UNAME26 and
/// UNAME26|PER_LINUX32, plus 0xffffffff, which only queries the current one.
const PERSONALITIES: &[u64] = &[0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// Syscalls every container may make, without argument filters (upstream's first rule,
/// same names, sorted bytewise). `clone`, `clone3`, `personality` and `socket` are not
/// here: they have rules of their own.
pub const ALLOWED: &[&str] = &[
    "_llseek",
    "_newselect",
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "cachestat", // kernel 6.5, libseccomp 2.5.5
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2", // kernel 6.6, libseccomp 2.5.5
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_requeue", // kernel 6.7, libseccomp 2.5.5
    "futex_time64",
    "futex_wait", // kernel 6.7, libseccomp 2.5.5
    "futex_waitv",
    "futex_wake", // kernel 6.7, libseccomp 2.5.5
    "futimesat",
    "get_robust_list",
    "get_thread_area",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "getxattrat", // kernel 6.13, libseccomp 2.6.0
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "io_setup",
    "io_submit",
    "ioctl",
    "ioprio_get",
    "ioprio_set",
    "ipc",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listmount", // kernel 6.8, libseccomp 2.6.0
    "listxattr",
    "listxattrat", // kernel 6.13, libseccomp 2.6.0
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "madvise",
    "map_shadow_stack", // kernel 6.6, libseccomp 2.5.5
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "mseal", // kernel 6.10, libseccomp 2.6.0
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pselect6_time64",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "removexattrat", // kernel 6.13, libseccomp 2.6.0
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "riscv_hwprobe", // kernel 6.12, libseccomp 2.6.0
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "set_robust_list",
    "set_thread_area",
    "set_tid_address",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "setsid",
    "setsockopt",
    "setuid",
    "setuid32",
    "setxattr",
    "setxattrat", // kernel 6.13, libseccomp 2.6.0
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statmount", // kernel 6.8, libseccomp 2.6.0
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "uretprobe", // kernel 6.11, libseccomp 2.6.0
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
];

/// Allowed to everyone as well. Upstream lists them only on kernels ≥ 4.8, where seccomp
/// can't be bypassed through ptrace. Shoal requires ≥ 5.x, so they are always allowed.
const ALLOWED_SINCE_4_8: &[&str] = &["process_vm_readv", "process_vm_writev", "ptrace"];

const X86_64_ARCHITECTURES: &[&str] = &["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"];
const X86_64_EXTRA: &[&str] = &["arch_prctl", "modify_ldt"];

const AARCH64_ARCHITECTURES: &[&str] = &["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"];
const AARCH64_EXTRA: &[&str] = &[
    "arm_fadvise64_64",
    "arm_sync_file_range",
    "breakpoint",
    "cacheflush",
    "set_tls",
    "sync_file_range2",
];

/// The seccomp architectures the filter covers on `arch` (a [`std::env::consts::ARCH`]
/// value): the native one and the compat ABIs its kernel can run. Also returns the syscalls
/// only that platform needs. Other platforms get no extra architectures or syscalls (runc
/// then filters the native ABI only).
fn platform(arch: &str) -> (&'static [&'static str], &'static [&'static str]) {
    match arch {
        "x86_64" => (X86_64_ARCHITECTURES, X86_64_EXTRA),
        "aarch64" => (AARCH64_ARCHITECTURES, AARCH64_EXTRA),
        _ => (&[], &[]),
    }
}

const SYS_ADMIN: &[&str] = &[
    "bpf",
    "clone",
    "clone3",
    "fanotify_init",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "lookup_dcookie",
    "lsm_get_self_attr",
    "lsm_list_modules",
    "lsm_set_self_attr",
    "mount",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "perf_event_open",
    "quotactl",
    "quotactl_fd",
    "setdomainname",
    "sethostname",
    "setns",
    "syslog",
    "umount",
    "umount2",
    "unshare",
];
const SYS_PTRACE: &[&str] = &[
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
];
const SYS_MODULE: &[&str] = &["delete_module", "finit_module", "init_module"];
const SYS_NICE: &[&str] = &[
    "get_mempolicy",
    "mbind",
    "set_mempolicy",
    "set_mempolicy_home_node",
];
const SYS_RAWIO: &[&str] = &["ioperm", "iopl"];
const SYS_TIME: &[&str] = &["clock_settime", "clock_settime64", "settimeofday", "stime"];

/// The syscalls each capability unlocks (upstream's `includes.caps` rules). A syscall may
/// appear under more than one capability (`bpf`, `perf_event_open` and `syslog` are also
/// under CAP_SYS_ADMIN).
const BY_CAPABILITY: &[(&str, &[&str])] = &[
    ("CAP_BPF", &["bpf"]),
    ("CAP_DAC_READ_SEARCH", &["open_by_handle_at"]),
    ("CAP_PERFMON", &["perf_event_open"]),
    ("CAP_SYSLOG", &["syslog"]),
    ("CAP_SYS_ADMIN", SYS_ADMIN),
    ("CAP_SYS_BOOT", &["reboot"]),
    ("CAP_SYS_CHROOT", &["chroot"]),
    ("CAP_SYS_MODULE", SYS_MODULE),
    ("CAP_SYS_NICE", SYS_NICE),
    ("CAP_SYS_PACCT", &["acct"]),
    ("CAP_SYS_PTRACE", SYS_PTRACE),
    ("CAP_SYS_RAWIO", SYS_RAWIO),
    ("CAP_SYS_TIME", SYS_TIME),
    ("CAP_SYS_TTY_CONFIG", &["vhangup"]),
];

/// The `linux.seccomp` object of `config.json` for a container whose bounding capability set
/// is `capabilities` (names like `"CAP_SYS_ADMIN"`), on this machine's architecture.
pub fn runtime_default(capabilities: &[String]) -> Value {
    profile_for(std::env::consts::ARCH, capabilities)
}

/// [`runtime_default`] for the architecture `arch` (a [`std::env::consts::ARCH`] value).
fn profile_for(arch: &str, capabilities: &[String]) -> Value {
    let has = |capability: &str| capabilities.iter().any(|c| c == capability);
    let (architectures, platform_extra) = platform(arch);

    let mut syscalls = vec![allow(ALLOWED), allow(ALLOWED_SINCE_4_8)];
    if !platform_extra.is_empty() {
        syscalls.push(allow(platform_extra));
    }
    // socket(2): every family below AF_ALG, the one between AF_ALG and AF_VSOCK, and every
    // family above AF_VSOCK.
    syscalls.push(allow_if_arg0("socket", "SCMP_CMP_LT", AF_ALG));
    syscalls.push(allow_if_arg0("socket", "SCMP_CMP_EQ", AF_ALG + 1));
    syscalls.push(allow_if_arg0("socket", "SCMP_CMP_GT", AF_VSOCK));
    for &persona in PERSONALITIES {
        syscalls.push(allow_if_arg0("personality", "SCMP_CMP_EQ", persona));
    }
    for &(capability, names) in BY_CAPABILITY {
        if has(capability) {
            syscalls.push(allow(names));
        }
    }
    if !has("CAP_SYS_ADMIN") {
        syscalls.push(json!({
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{
                "index": 0,
                "value": CLONE_NAMESPACE_FLAGS,
                "valueTwo": 0u64,
                "op": "SCMP_CMP_MASKED_EQ",
            }],
        }));
        syscalls.push(json!({
            "names": ["clone3"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": ENOSYS,
        }));
    }

    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        "architectures": architectures,
        "syscalls": syscalls,
    })
}

/// A rule allowing `names` whatever their arguments.
fn allow(names: &[&str]) -> Value {
    json!({"names": names, "action": "SCMP_ACT_ALLOW"})
}

/// A rule allowing `name` when its first argument compares to `value` with `op`.
fn allow_if_arg0(name: &str, op: &str, value: u64) -> Value {
    json!({
        "names": [name],
        "action": "SCMP_ACT_ALLOW",
        "args": [{"index": 0, "value": value, "op": op}],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::spec::DEFAULT_CAPABILITIES;

    /// What the filter answers to a syscall.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Verdict {
        Allow,
        Errno(u64),
    }

    fn caps(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    /// Every capability any rule mentions, plus the container defaults.
    fn all_caps() -> Vec<String> {
        let mut all: Vec<&str> = BY_CAPABILITY.iter().map(|&(cap, _)| cap).collect();
        all.extend(DEFAULT_CAPABILITIES);
        caps(&all)
    }

    /// Evaluates `profile` (only rules on argument 0 occur) for the syscall `name` called
    /// with first argument `arg0`. Also checks that the rules that match agree.
    fn verdict(profile: &Value, name: &str, arg0: u64) -> Verdict {
        let mut matching = Vec::new();
        for rule in profile["syscalls"].as_array().unwrap() {
            if !rule["names"].as_array().unwrap().iter().any(|n| n == name) {
                continue;
            }
            let args_match = match rule["args"].as_array() {
                Some(args) => args.iter().all(|arg| arg_matches(arg, arg0)),
                None => true,
            };
            if args_match {
                matching.push(match rule["action"].as_str().unwrap() {
                    "SCMP_ACT_ALLOW" => Verdict::Allow,
                    "SCMP_ACT_ERRNO" => Verdict::Errno(rule["errnoRet"].as_u64().unwrap()),
                    other => panic!("unexpected action {other}"),
                });
            }
        }
        matching.dedup();
        assert!(
            matching.len() <= 1,
            "{name}({arg0:#x}): conflicting rules {matching:?}"
        );
        matching
            .first()
            .copied()
            .unwrap_or(Verdict::Errno(profile["defaultErrnoRet"].as_u64().unwrap()))
    }

    fn arg_matches(arg: &Value, arg0: u64) -> bool {
        assert_eq!(arg["index"], 0, "{arg}");
        let value = arg["value"].as_u64().unwrap();
        match arg["op"].as_str().unwrap() {
            "SCMP_CMP_EQ" => arg0 == value,
            "SCMP_CMP_LT" => arg0 < value,
            "SCMP_CMP_GT" => arg0 > value,
            "SCMP_CMP_MASKED_EQ" => arg0 & value == arg["valueTwo"].as_u64().unwrap(),
            other => panic!("unexpected operator {other}"),
        }
    }

    fn allowed(profile: &Value, name: &str) -> bool {
        verdict(profile, name, 0) == Verdict::Allow
    }

    /// Never allowed without the capability that unlocks them (most of them never at all).
    const DANGEROUS: &[&str] = &[
        "acct",
        "add_key",
        "bpf",
        "clock_settime",
        "create_module",
        "delete_module",
        "fanotify_init",
        "finit_module",
        "fsconfig",
        "fsmount",
        "fsopen",
        "fspick",
        "init_module",
        "io_uring_enter",
        "io_uring_register",
        "io_uring_setup",
        "ioperm",
        "iopl",
        "kcmp",
        "kexec_file_load",
        "kexec_load",
        "keyctl",
        "lookup_dcookie",
        "lsm_set_self_attr",
        "mbind",
        "mount",
        "mount_setattr",
        "move_mount",
        "nfsservctl",
        "open_by_handle_at",
        "open_tree",
        "perf_event_open",
        "pidfd_getfd",
        "pivot_root",
        "quotactl",
        "reboot",
        "request_key",
        "set_mempolicy",
        "setdomainname",
        "sethostname",
        "setns",
        "settimeofday",
        "swapoff",
        "swapon",
        "syslog",
        "umount",
        "umount2",
        "unshare",
        "uselib",
        "userfaultfd",
        "vhangup",
    ];

    /// Not allowed whatever the capabilities.
    const NEVER: &[&str] = &[
        "add_key",
        "io_uring_enter",
        "io_uring_register",
        "io_uring_setup",
        "kexec_file_load",
        "kexec_load",
        "keyctl",
        "pivot_root",
        "request_key",
        "swapoff",
        "swapon",
        "userfaultfd",
    ];

    #[test]
    fn denies_by_default() {
        for arch in ["x86_64", "aarch64"] {
            let profile = profile_for(arch, &[]);
            assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
            assert_eq!(profile["defaultErrnoRet"], 1);
            assert_eq!(verdict(&profile, "no_such_syscall", 0), Verdict::Errno(1));
            assert_eq!(verdict(&profile, "keyctl", 0), Verdict::Errno(1));
            // Every rule allows, except clone3's ENOSYS.
            for rule in profile["syscalls"].as_array().unwrap() {
                if rule["action"] != "SCMP_ACT_ALLOW" {
                    assert_eq!(rule["names"], json!(["clone3"]), "{rule}");
                }
            }
            assert!(allowed(&profile, "read"));
            assert!(allowed(&profile, "execve"));
            assert!(allowed(&profile, "clone"));
        }
    }

    #[test]
    fn dangerous_syscalls_need_their_capability() {
        for arch in ["x86_64", "aarch64"] {
            for profile in [
                profile_for(arch, &[]),
                profile_for(arch, &caps(&DEFAULT_CAPABILITIES)),
            ] {
                for name in DANGEROUS {
                    assert_eq!(
                        verdict(&profile, name, 0),
                        Verdict::Errno(1),
                        "{arch}: {name}"
                    );
                }
            }
            assert!(!allowed(&profile_for(arch, &[]), "chroot"));
            assert!(allowed(
                &profile_for(arch, &caps(&DEFAULT_CAPABILITIES)),
                "chroot"
            ));
        }
    }

    #[test]
    fn some_syscalls_are_never_allowed() {
        for arch in ["x86_64", "aarch64"] {
            let profile = profile_for(arch, &all_caps());
            for name in NEVER {
                assert_eq!(
                    verdict(&profile, name, 0),
                    Verdict::Errno(1),
                    "{arch}: {name}"
                );
            }
        }
    }

    #[test]
    fn sys_admin_unlocks_mounts_and_namespaces() {
        let profile = profile_for("x86_64", &caps(&["CAP_SYS_ADMIN"]));
        for name in [
            "unshare",
            "setns",
            "mount",
            "umount2",
            "fsopen",
            "move_mount",
            "clone3",
        ] {
            assert!(allowed(&profile, name), "{name}");
        }
        for flag in [CLONE_NEWUSER, CLONE_NAMESPACE_FLAGS] {
            assert_eq!(verdict(&profile, "clone", flag), Verdict::Allow);
        }
        for name in NEVER {
            assert!(!allowed(&profile, name), "{name}");
        }
        assert!(!allowed(&profile, "reboot"));
        assert!(!allowed(&profile, "init_module"));
    }

    #[test]
    fn clone_filter_masks_the_namespace_flags() {
        assert_eq!(CLONE_NAMESPACE_FLAGS, 0x7E02_0000);
        assert_eq!(CLONE_NAMESPACE_FLAGS, 2_114_060_288);
        for arch in ["x86_64", "aarch64"] {
            let profile = profile_for(arch, &caps(&DEFAULT_CAPABILITIES));
            let clone: Vec<&Value> = profile["syscalls"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|rule| {
                    rule["names"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|n| n == "clone")
                })
                .collect();
            assert_eq!(clone.len(), 1);
            assert_eq!(clone[0]["action"], "SCMP_ACT_ALLOW");
            assert_eq!(
                clone[0]["args"],
                json!([{"index": 0, "value": 2_114_060_288u64, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}])
            );
            // fork() (SIGCHLD) and pthread_create()'s flags pass.
            assert_eq!(verdict(&profile, "clone", 17), Verdict::Allow);
            assert_eq!(verdict(&profile, "clone", 0x003d_0f00), Verdict::Allow);
            let namespaces = [
                CLONE_NEWNS,
                CLONE_NEWCGROUP,
                CLONE_NEWUTS,
                CLONE_NEWIPC,
                CLONE_NEWUSER,
                CLONE_NEWPID,
                CLONE_NEWNET,
            ];
            for flag in namespaces {
                assert_eq!(
                    verdict(&profile, "clone", flag | 17),
                    Verdict::Errno(1),
                    "{flag:#x}"
                );
            }
        }
    }

    #[test]
    fn clone3_gets_enosys_unless_sys_admin() {
        let plain = profile_for("x86_64", &caps(&DEFAULT_CAPABILITIES));
        assert_eq!(verdict(&plain, "clone3", 0), Verdict::Errno(38));
        let admin = profile_for("x86_64", &caps(&["CAP_SYS_ADMIN"]));
        assert_eq!(verdict(&admin, "clone3", 0), Verdict::Allow);
    }

    #[test]
    fn capabilities_unlock_their_tables() {
        let none = profile_for("x86_64", &[]);
        for &(capability, names) in BY_CAPABILITY {
            let with = profile_for("x86_64", &caps(&[capability]));
            for name in names {
                assert!(allowed(&with, name), "{capability}: {name}");
                // ptrace & co. are everyone's; clone is everyone's with its filter.
                if !ALLOWED_SINCE_4_8.contains(name) && *name != "clone" {
                    assert!(!allowed(&none, name), "{name} without {capability}");
                }
            }
        }
        // ptrace is everyone's (kernel ≥ 4.8), kcmp is CAP_SYS_PTRACE's.
        assert!(allowed(&none, "ptrace"));
        assert!(allowed(&none, "process_vm_readv"));
        assert!(!allowed(&none, "kcmp"));
        assert!(allowed(
            &profile_for("x86_64", &caps(&["CAP_SYS_PTRACE"])),
            "kcmp"
        ));
    }

    #[test]
    fn personality_only_for_known_domains() {
        let profile = profile_for("x86_64", &[]);
        for persona in [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff] {
            assert_eq!(
                verdict(&profile, "personality", persona),
                Verdict::Allow,
                "{persona:#x}"
            );
        }
        // ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC.
        for persona in [0x0004_0000, 0x0040_0000] {
            assert_eq!(
                verdict(&profile, "personality", persona),
                Verdict::Errno(1),
                "{persona:#x}"
            );
        }
    }

    #[test]
    fn socket_refuses_af_alg_and_af_vsock() {
        let profile = profile_for("x86_64", &[]);
        // AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_NFC, AF_KCM, AF_XDP.
        for family in [1, 2, 10, 16, 17, 39, 41, 44] {
            assert_eq!(
                verdict(&profile, "socket", family),
                Verdict::Allow,
                "{family}"
            );
        }
        for family in [AF_ALG, AF_VSOCK] {
            assert_eq!(
                verdict(&profile, "socket", family),
                Verdict::Errno(1),
                "{family}"
            );
        }
    }

    #[test]
    fn architectures_follow_the_platform() {
        let x86 = profile_for("x86_64", &[]);
        assert_eq!(
            x86["architectures"],
            json!(["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"])
        );
        assert!(allowed(&x86, "arch_prctl"));
        assert!(allowed(&x86, "modify_ldt"));
        assert!(!allowed(&x86, "set_tls"));

        let arm = profile_for("aarch64", &[]);
        assert_eq!(
            arm["architectures"],
            json!(["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"])
        );
        assert!(allowed(&arm, "set_tls"));
        assert!(allowed(&arm, "cacheflush"));
        assert!(!allowed(&arm, "arch_prctl"));
        assert!(!allowed(&arm, "modify_ldt"));

        assert_eq!(
            runtime_default(&[]),
            profile_for(std::env::consts::ARCH, &[])
        );
    }

    #[test]
    fn allowed_list_is_sorted_unique_and_matches_upstream_size() {
        assert!(
            ALLOWED.windows(2).all(|pair| pair[0] < pair[1]),
            "ALLOWED must be sorted and unique"
        );
        // moby/profiles seccomp/v0.2.3's first rule has 361 names.
        assert_eq!(ALLOWED.len(), 361);
        for name in ["clone", "clone3", "personality", "socket"] {
            assert!(!ALLOWED.contains(&name), "{name} has rules of its own");
        }
        for name in DANGEROUS.iter().chain(NEVER) {
            assert!(!ALLOWED.contains(name), "{name}");
        }
        for &(capability, names) in BY_CAPABILITY {
            assert!(
                names.windows(2).all(|pair| pair[0] < pair[1]),
                "{capability}"
            );
            for name in names {
                assert!(
                    !ALLOWED.contains(name),
                    "{capability}: {name} is allowed anyway"
                );
            }
        }
    }

    #[test]
    fn deserializes_into_oci_spec() {
        use oci_spec::runtime::{Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompOperator};

        let cap_sets = [Vec::new(), caps(&DEFAULT_CAPABILITIES), all_caps()];
        for arch in ["x86_64", "aarch64", "riscv64"] {
            for capabilities in &cap_sets {
                let profile = profile_for(arch, capabilities);
                let parsed: LinuxSeccomp = serde_json::from_value(profile.clone()).unwrap();
                // Serde ignores unknown fields: serializing back catches a misspelled one.
                assert_eq!(
                    serde_json::to_value(&parsed).unwrap(),
                    profile,
                    "{arch} {capabilities:?}"
                );
            }
        }

        let parsed: LinuxSeccomp = serde_json::from_value(profile_for("x86_64", &[])).unwrap();
        assert_eq!(parsed.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(parsed.default_errno_ret(), Some(1));
        assert_eq!(
            parsed.architectures().as_deref(),
            Some(&[Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32][..])
        );
        let syscalls = parsed.syscalls().as_ref().unwrap();
        let clone = syscalls
            .iter()
            .find(|rule| rule.names() == &["clone"])
            .unwrap();
        assert_eq!(clone.action(), LinuxSeccompAction::ScmpActAllow);
        let arg = clone.args().as_ref().unwrap()[0];
        assert_eq!(arg.index(), 0);
        assert_eq!(arg.value(), CLONE_NAMESPACE_FLAGS);
        assert_eq!(arg.value_two(), Some(0));
        assert_eq!(arg.op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
        let clone3 = syscalls
            .iter()
            .find(|rule| rule.names() == &["clone3"])
            .unwrap();
        assert_eq!(clone3.action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(clone3.errno_ret(), Some(38));
    }
}

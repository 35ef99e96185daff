//! Seccomp profiles: containerd's default (Kubernetes `RuntimeDefault`) and `Localhost` files.
//!
//! The default profile is equivalent to containerd 2.x's `contrib/seccomp` `DefaultProfile`:
//!
//! * default action `SCMP_ACT_ERRNO` returning `EPERM` (stated explicitly as
//!   `defaultErrnoRet: 1`; runc and libcontainer use EPERM when it is absent, as containerd
//!   leaves it);
//! * the architectures of the build target (x86_64: X86_64, X86, X32; aarch64: ARM, AARCH64);
//! * the unconditional allow-list ([`BASE`]); `socket` for every address family but `AF_ALG`
//!   and `AF_VSOCK`; `personality` for the Linux, Linux32 and query personas; `ptrace` and
//!   `process_vm_*` on kernels ≥ 4.8 (where ptrace can no longer bypass seccomp); the
//!   architecture's own syscalls;
//! * syscalls unlocked by capabilities of the *final* bounding set (`CAP_SYS_ADMIN` → mount,
//!   unshare, setns, clone with namespace flags…; `CAP_SYS_PTRACE` → kcmp…; `CAP_SYS_TIME` →
//!   settimeofday…);
//! * without `CAP_SYS_ADMIN`: `clone` only without namespace flags, and `clone3` fails with
//!   `ENOSYS` so that libc falls back to `clone` (moby#42681).
//!
//! Syscall names the running libseccomp does not know are skipped by the runtimes, so the list
//! may name syscalls newer than the host.

use std::path::Path;

use oci_spec::runtime::{
    Arch, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

use super::SpecError;

/// Syscalls every container may make.
const BASE: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "cachestat",
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
    "fchmodat2",
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
    "futex_requeue",
    "futex_time64",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
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
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "getxattrat",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
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
    "listmount",
    "listxattr",
    "listxattrat",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lsm_get_self_attr",
    "lsm_list_modules",
    "lsm_set_self_attr",
    "lstat",
    "lstat64",
    "madvise",
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
    "map_shadow_stack",
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
    "mseal",
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
    "_newselect",
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
    "removexattrat",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
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
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
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
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setuid32",
    "setxattr",
    "setxattrat",
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
    "statmount",
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
    "uretprobe",
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

/// `personality(2)` arguments allowed: PER_LINUX, PER_LINUX32, PER_LINUX|UNAME26,
/// PER_LINUX32|UNAME26, and the 0xffffffff query.
const PERSONALITIES: [u64; 5] = [0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

/// Address families `socket(2)` refuses: allowed are `< AF_ALG`, `AF_NFC` and `> AF_VSOCK`.
const AF_ALG: u64 = 38;
const AF_VSOCK: u64 = 40;

/// Syscalls unlocked by each capability of the bounding set.
const BY_CAPABILITY: &[(Capability, &[&str])] = &[
    (Capability::DacReadSearch, &["open_by_handle_at"]),
    (
        Capability::SysAdmin,
        &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
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
        ],
    ),
    (Capability::SysBoot, &["reboot"]),
    (Capability::SysChroot, &["chroot"]),
    (
        Capability::SysModule,
        &["delete_module", "init_module", "finit_module"],
    ),
    (Capability::SysPacct, &["acct"]),
    (
        Capability::SysPtrace,
        &[
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
        ],
    ),
    (Capability::SysRawio, &["iopl", "ioperm"]),
    (
        Capability::SysTime,
        &["settimeofday", "stime", "clock_settime", "clock_settime64"],
    ),
    (Capability::SysTtyConfig, &["vhangup"]),
    (
        Capability::SysNice,
        &[
            "get_mempolicy",
            "mbind",
            "set_mempolicy",
            "set_mempolicy_home_node",
        ],
    ),
    (Capability::Syslog, &["syslog"]),
    (Capability::Bpf, &["bpf"]),
    (Capability::Perfmon, &["perf_event_open"]),
];

/// The namespace flags `clone(2)` may not carry without `CAP_SYS_ADMIN`.
const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// The seccomp architectures and extra syscalls of the build target.
fn target_arch() -> (Vec<Arch>, &'static [&'static str]) {
    if cfg!(target_arch = "x86_64") {
        (
            vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32],
            &["arch_prctl", "modify_ldt"],
        )
    } else if cfg!(target_arch = "aarch64") {
        (
            vec![Arch::ScmpArchArm, Arch::ScmpArchAarch64],
            &[
                "arm_fadvise64_64",
                "arm_sync_file_range",
                "sync_file_range2",
                "breakpoint",
                "cacheflush",
                "set_tls",
            ],
        )
    } else if cfg!(target_arch = "s390x") {
        (
            vec![Arch::ScmpArchS390, Arch::ScmpArchS390x],
            &[
                "s390_pci_mmio_read",
                "s390_pci_mmio_write",
                "s390_runtime_instr",
            ],
        )
    } else if cfg!(target_arch = "riscv64") {
        (
            vec![Arch::ScmpArchRiscv64],
            &["riscv_flush_icache", "riscv_hwprobe"],
        )
    } else if cfg!(target_arch = "powerpc64") {
        (vec![], &["sync_file_range2", "swapcontext"])
    } else {
        (vec![], &[])
    }
}

/// containerd's default profile for a process with bounding set `bounding` on a kernel of
/// version `kernel` (`None`: unknown, ptrace stays blocked).
pub(crate) fn runtime_default(
    bounding: &[Capability],
    kernel: Option<(u32, u32)>,
) -> Result<LinuxSeccomp, SpecError> {
    let mut rules = vec![allow(BASE)?];
    rules.push(allow_if(
        "socket",
        0,
        AF_ALG,
        LinuxSeccompOperator::ScmpCmpLt,
    )?);
    rules.push(allow_if(
        "socket",
        0,
        AF_ALG + 1,
        LinuxSeccompOperator::ScmpCmpEq,
    )?);
    rules.push(allow_if(
        "socket",
        0,
        AF_VSOCK,
        LinuxSeccompOperator::ScmpCmpGt,
    )?);
    for persona in PERSONALITIES {
        rules.push(allow_if(
            "personality",
            0,
            persona,
            LinuxSeccompOperator::ScmpCmpEq,
        )?);
    }
    if kernel.is_some_and(|version| version >= (4, 8)) {
        rules.push(allow(&["process_vm_readv", "process_vm_writev", "ptrace"])?);
    }
    let (architectures, arch_syscalls) = target_arch();
    if !arch_syscalls.is_empty() {
        rules.push(allow(arch_syscalls)?);
    }
    for cap in bounding {
        if let Some((_, names)) = BY_CAPABILITY.iter().find(|(c, _)| c == cap) {
            rules.push(allow(names)?);
        }
    }
    if !bounding.contains(&Capability::SysAdmin) {
        let flags_arg: usize = if cfg!(target_arch = "s390x") { 1 } else { 0 };
        let no_namespaces = LinuxSeccompArgBuilder::default()
            .index(flags_arg)
            .value(CLONE_NAMESPACE_FLAGS)
            .value_two(0u64)
            .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
            .build()
            .map_err(SpecError::assemble("seccomp clone rule"))?;
        rules.push(rule(
            &["clone"],
            LinuxSeccompAction::ScmpActAllow,
            None,
            Some(vec![no_namespaces]),
        )?);
        rules.push(rule(
            &["clone3"],
            LinuxSeccompAction::ScmpActErrno,
            Some(libc::ENOSYS as u32),
            None,
        )?);
    }
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(libc::EPERM as u32)
        .architectures(architectures)
        .syscalls(rules)
        .build()
        .map_err(SpecError::assemble("seccomp profile"))
}

fn allow(names: &[&str]) -> Result<LinuxSyscall, SpecError> {
    rule(names, LinuxSeccompAction::ScmpActAllow, None, None)
}

fn allow_if(
    name: &str,
    index: usize,
    value: u64,
    op: LinuxSeccompOperator,
) -> Result<LinuxSyscall, SpecError> {
    let arg: LinuxSeccompArg = LinuxSeccompArgBuilder::default()
        .index(index)
        .value(value)
        .op(op)
        .build()
        .map_err(SpecError::assemble("seccomp argument rule"))?;
    rule(
        &[name],
        LinuxSeccompAction::ScmpActAllow,
        None,
        Some(vec![arg]),
    )
}

fn rule(
    names: &[&str],
    action: LinuxSeccompAction,
    errno: Option<u32>,
    args: Option<Vec<LinuxSeccompArg>>,
) -> Result<LinuxSyscall, SpecError> {
    let mut builder = LinuxSyscallBuilder::default()
        .names(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .action(action);
    if let Some(errno) = errno {
        builder = builder.errno_ret(errno);
    }
    if let Some(args) = args {
        builder = builder.args(args);
    }
    builder.build().map_err(SpecError::assemble("seccomp rule"))
}

/// Largest profile file accepted.
const MAX_PROFILE_SIZE: u64 = 4 << 20;

/// A `Localhost` profile: a JSON file in the OCI `LinuxSeccomp` format.
pub(crate) fn load_localhost(path: &Path) -> Result<LinuxSeccomp, SpecError> {
    if !path.is_absolute() {
        return Err(SpecError::InvalidSeccompProfilePath {
            path: path.to_owned(),
        });
    }
    let read_err = |source| SpecError::ReadSeccompProfile {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() || meta.len() > MAX_PROFILE_SIZE {
        return Err(read_err(std::io::Error::other(format!(
            "not a regular file of at most {MAX_PROFILE_SIZE} bytes"
        ))));
    }
    let profile: LinuxSeccomp =
        serde_json::from_reader(std::io::BufReader::new(file)).map_err(|source| {
            SpecError::ParseSeccompProfile {
                path: path.to_owned(),
                source,
            }
        })?;
    tracing::debug!(
        ?path,
        rules = profile.syscalls().as_ref().map_or(0, Vec::len),
        "loaded localhost seccomp profile"
    );
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed_unconditionally(profile: &LinuxSeccomp, name: &str) -> bool {
        profile.syscalls().iter().flatten().any(|r| {
            r.action() == LinuxSeccompAction::ScmpActAllow
                && r.args().as_ref().is_none_or(Vec::is_empty)
                && r.names().iter().any(|n| n == name)
        })
    }

    #[test]
    fn without_sys_admin_clone_is_masked_and_clone3_gets_enosys() {
        let profile = runtime_default(&super::super::caps::DEFAULT, Some((6, 1))).expect("profile");
        assert!(!allowed_unconditionally(&profile, "clone"));
        assert!(!allowed_unconditionally(&profile, "unshare"));
        let clone3 = profile
            .syscalls()
            .iter()
            .flatten()
            .find(|r| r.names() == &["clone3".to_owned()])
            .expect("clone3 rule");
        assert_eq!(clone3.action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(clone3.errno_ret(), Some(libc::ENOSYS as u32));
    }

    #[test]
    fn sys_admin_unlocks_mount_and_unconditional_clone() {
        let profile = runtime_default(&[Capability::SysAdmin], Some((6, 1))).expect("profile");
        assert!(allowed_unconditionally(&profile, "mount"));
        assert!(allowed_unconditionally(&profile, "clone"));
        assert!(!profile
            .syscalls()
            .iter()
            .flatten()
            .any(|r| r.names() == &["clone3".to_owned()]
                && r.action() == LinuxSeccompAction::ScmpActErrno));
    }

    #[test]
    fn ptrace_is_allowed_only_on_kernels_from_4_8() {
        assert!(allowed_unconditionally(
            &runtime_default(&[], Some((4, 8))).expect("p"),
            "ptrace"
        ));
        assert!(!allowed_unconditionally(
            &runtime_default(&[], Some((4, 4))).expect("p"),
            "ptrace"
        ));
        assert!(!allowed_unconditionally(
            &runtime_default(&[], None).expect("p"),
            "ptrace"
        ));
    }

    #[test]
    fn socket_is_not_in_the_unconditional_list() {
        let profile = runtime_default(&[], Some((6, 1))).expect("profile");
        assert!(!allowed_unconditionally(&profile, "socket"));
        assert!(!BASE.contains(&"socket"));
    }

    #[test]
    fn the_base_list_has_no_duplicates() {
        let mut names = BASE.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BASE.len());
    }
}

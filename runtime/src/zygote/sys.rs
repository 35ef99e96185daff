//! Thin safe wrappers over the few process syscalls the zygote needs that `nix` lacks:
//! pidfds (`pidfd_open`, `pidfd_send_signal`, `waitid(P_PIDFD)`) and `/proc` start times.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::protocol::WireExit;

const P_PIDFD: libc::idtype_t = 3;

/// Opens a pidfd for `pid`. Works for zombies too, so a child that already exited is not
/// missed.
pub(crate) fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` to the process behind `pidfd` (immune to pid reuse).
pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32) -> std::io::Result<()> {
    // SAFETY: valid descriptor, null siginfo is allowed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Reaps the child behind `pidfd` without blocking. `Ok(None)`: still running.
pub(crate) fn reap_pidfd(pidfd: &OwnedFd) -> std::io::Result<Option<WireExit>> {
    // SAFETY: zeroed siginfo is a valid out-parameter for waitid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out-pointer.
    let rc = unsafe {
        libc::waitid(
            P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: waitid filled in a SIGCHLD siginfo (or left it zeroed if nothing exited).
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => WireExit::Code(status),
        _ => WireExit::Signal(status),
    }))
}

/// The process start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`); with the
/// pid it identifies a process across pid reuse.
pub fn process_start_time(pid: i32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| std::io::Error::other("malformed /proc stat"))?;
    after
        .split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("malformed /proc stat"))
}

/// A pipe whose both ends close on exec.
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

/// Log pipes get a larger buffer so a container writes on while the agent is busy; past it
/// a writer blocks (as with conmon) rather than losing data.
pub(crate) const LOG_PIPE_SIZE: i32 = 1024 * 1024;

pub(crate) fn grow_pipe(fd: &OwnedFd) {
    // F_SETPIPE_SZ may fail past /proc/sys/fs/pipe-max-size for unprivileged users; the
    // default 64 KiB still works, so the error is ignored on purpose.
    // SAFETY: fcntl on a valid descriptor.
    unsafe {
        libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, LOG_PIPE_SIZE);
    }
}

/// Unblocks every signal in the calling thread: a forked child must not inherit the
/// supervisor's blocked mask (it survives exec, and containers must get their signals).
pub(crate) fn unblock_all_signals() {
    let _ = nix::sys::signal::SigSet::empty().thread_set_mask();
}

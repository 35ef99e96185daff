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

/// Reaps the zombie children of the calling thread that libcontainer left behind (its
/// `youki:[…]` helper processes, orphaned when the worker that created them ended first,
/// e.g. killed when an exec probe timed out) and that `known` does not claim. Such a zombie
/// sits in the container's pid namespace, and a namespace's init cannot finish dying until
/// every process in it is reaped: left alone, it keeps a killed container "running" for
/// ever. Anything else is left to whoever watches it. Returns how many were reaped.
pub(crate) fn reap_libcontainer_leftovers(known: impl Fn(i32) -> bool) -> usize {
    // One read for the whole list: the file is made afresh at every read, walking every
    // child (a few hundred on a full node), and `read_to_string` starts with 32 bytes.
    let mut children = String::with_capacity(64 << 10);
    let read = std::fs::File::open("/proc/thread-self/children")
        .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut children));
    if read.is_err() {
        return 0;
    }
    let mut reaped = 0;
    for pid in children
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        if known(pid) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state …`; comm may hold spaces and parentheses, the state follows the
        // last `)`.
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map_or("", |(_, c)| c);
        if !comm.starts_with("youki:") || !tail.trim_start().starts_with('Z') {
            continue;
        }
        let flags = nix::sys::wait::WaitPidFlag::WNOHANG;
        if let Ok(status) = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), Some(flags)) {
            if status.pid().is_some() {
                tracing::debug!(pid, comm, "reaped a process libcontainer left behind");
                reaped += 1;
            }
        }
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use nix::unistd::{fork, ForkResult, Pid};

    /// A child named `name` that exits at once; returned once it is a zombie.
    fn zombie(name: &std::ffi::CStr) -> Pid {
        // SAFETY: the child only calls prctl and _exit, both async-signal-safe.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => unsafe {
                libc::prctl(libc::PR_SET_NAME, name.as_ptr());
                libc::_exit(0)
            },
            Ok(ForkResult::Parent { child }) => {
                let stat = format!("/proc/{child}/stat");
                for _ in 0..500 {
                    let state = std::fs::read_to_string(&stat).unwrap_or_default();
                    if state
                        .rsplit_once(')')
                        .is_some_and(|(_, t)| t.trim_start().starts_with('Z'))
                    {
                        return child;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                panic!("{child} did not become a zombie");
            }
            Err(e) => panic!("fork: {e}"),
        }
    }

    #[test]
    fn only_unclaimed_libcontainer_zombies_are_reaped() {
        let left = zombie(c"youki:[1:INTER]");
        let claimed = zombie(c"youki:[2:INIT]");
        let other = zombie(c"sleep");
        let reaped = reap_libcontainer_leftovers(|pid| pid == claimed.as_raw());
        assert_eq!(reaped, 1);
        // Gone: nothing is left to wait for.
        assert!(waitpid(left, Some(WaitPidFlag::WNOHANG)).is_err());
        // Left to their owners, who still get their status.
        for pid in [claimed, other] {
            assert_eq!(
                waitpid(pid, Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::Exited(pid, 0))
            );
        }
    }
}

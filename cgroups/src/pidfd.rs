//! Process file descriptors (`pidfd_open(2)`, `pidfd_send_signal(2)`, Linux ≥ 5.3), used to
//! signal the processes of a cgroup without racing against pid reuse, and to wait for their exit.
//!
//! Guarantee: [`signal_members`] only signals a process that was still a member of the cgroup
//! *after* its pidfd was opened, so a recycled pid belonging to an unrelated process is never
//! signalled. Our own process is never signalled.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use crate::error::Result;
use crate::fs;

/// Opens a pidfd for `pid`. `Ok(None)` if the process is already gone.
pub(crate) fn open(pid: i32) -> io::Result<Option<OwnedFd>> {
    // SAFETY: plain syscall with integer arguments; on success it returns a new fd we own.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ESRCH) => Ok(None),
            _ => Err(err),
        };
    }
    let fd = RawFd::try_from(ret).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Sends `signal` through a pidfd. A process that already exited is not an error.
pub(crate) fn send_signal(fd: &OwnedFd, signal: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: valid fd, null siginfo and zero flags as documented for pidfd_send_signal.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(err);
        }
    }
    Ok(())
}

/// Sends `signal` to every process listed in `dir/cgroup.procs` (this directory only). Returns
/// how many processes were signalled. Falls back to `kill(2)` where pidfds are unsupported.
pub(crate) fn signal_members(dir: &Path, signal: libc::c_int) -> Result<usize> {
    let own = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    let listed: Vec<i32> = fs::procs(dir)?.into_iter().filter(|p| *p != own).collect();
    let mut opened = Vec::with_capacity(listed.len());
    for pid in listed {
        match open(pid) {
            Ok(Some(fd)) => opened.push((pid, Some(fd))),
            Ok(None) => {}
            Err(err) if err.raw_os_error() == Some(libc::ENOSYS) => opened.push((pid, None)),
            Err(err) => tracing::warn!(pid, ?dir, ?err, "pidfd_open failed; not signalling"),
        }
    }
    // Membership is re-checked after the pidfds exist: see the module guarantee.
    let still = fs::procs(dir)?;
    let mut signalled = 0;
    for (pid, fd) in opened.into_iter().filter(|(pid, _)| still.contains(pid)) {
        let sent = match fd {
            Some(fd) => send_signal(&fd, signal),
            // SAFETY: kill(2) with integer arguments.
            None => match unsafe { libc::kill(pid, signal) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            },
        };
        match sent {
            Ok(()) => signalled += 1,
            Err(err) => {
                tracing::warn!(pid, signal, ?dir, ?err, "signalling a cgroup member failed")
            }
        }
    }
    Ok(signalled)
}

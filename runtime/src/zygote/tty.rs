//! Terminals: the pty pairs the zygote allocates for containers and exec processes with
//! `tty`, and the relay that carries a container's terminal output into its log pipe.
//!
//! ```text
//!  container (fds 0,1,2 = pty slave, controlling tty) ──► pty master ─┐ held by the zygote
//!        relay (zygote poll loop): master ──► stdout log pipe ──► agent's log pump (CRI file)
//!  attach / resize: the agent's copy of the master (TakeLogs) — writes are the tty's input
//!  exec with tty: the master goes to the client (stdout and, with stdin, stdin)
//! ```
//!
//! The pair is opened on the host's `/dev/ptmx` before the worker forks (not libcontainer's
//! console socket): the master must outlive the agent, so the process that holds the log
//! pipes — the zygote, which under `ironlet run` is the supervisor — holds it too. The
//! container becomes the slave's session leader through [`make_controlling`], called by the
//! executor right before `execve` (libcontainer has already called `setsid`), so Ctrl-C
//! reaches its foreground process group and job control works.
//!
//! The relay copies through a buffer only while the log pipe has room: once the pipe is
//! full (no agent drains it), the relay stops reading the master, the tty's output queue
//! fills and the container blocks on write, as it would on a full pipe — nothing is lost.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// How much one relay read takes from a master.
const RELAY_CHUNK: usize = 64 * 1024;

/// A fresh pty pair, both ends close-on-exec, the master non-blocking.
pub(crate) fn open_pair() -> Result<(OwnedFd, OwnedFd), String> {
    let pty = nix::pty::openpty(None, None).map_err(|e| format!("openpty: {e}"))?;
    for fd in [&pty.master, &pty.slave] {
        nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|e| format!("pty close-on-exec: {e}"))?;
    }
    nix::fcntl::fcntl(
        pty.master.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .map_err(|e| format!("pty master non-blocking: {e}"))?;
    Ok((pty.master, pty.slave))
}

/// For an exec with a tty into the container whose init is `container_pid`: a pair from the
/// container's own devpts instance, so the process's terminal is a `/dev/pts/N` that exists
/// inside the container (`tty`, `ps`, `script` name it), as runc's console socket gives.
/// Falls back to a host pair when the container's `/dev/pts` is not a devpts (or is gone).
pub(crate) fn open_pair_in_container(container_pid: i32) -> Result<(OwnedFd, OwnedFd), String> {
    match open_container_pair(container_pid) {
        Ok(pair) => Ok(pair),
        Err(err) => {
            tracing::debug!(container_pid, %err, "exec terminal from the host's devpts");
            open_pair()
        }
    }
}

fn open_container_pair(container_pid: i32) -> std::io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    use std::os::fd::FromRawFd;
    let root = nix::fcntl::open(
        format!("/proc/{container_pid}/root").as_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    // SAFETY: `open` returned a fresh descriptor that nothing else owns.
    let root = unsafe { OwnedFd::from_raw_fd(root) };
    // Resolved as if the container's root were `/`: a symlinked /dev/pts cannot reach a host
    // path.
    let how = OpenHow::new()
        .flags(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let master = nix::fcntl::openat2(root.as_raw_fd(), "dev/pts/ptmx", how)?;
    // SAFETY: `openat2` returned a fresh descriptor that nothing else owns.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // Only the multiplexer of a devpts instance hands out ptys; anything else the container
    // put there is refused.
    let fs = nix::sys::statfs::fstatfs(&master)?;
    if fs.filesystem_type() != nix::sys::statfs::DEVPTS_SUPER_MAGIC {
        return Err(std::io::Error::other("/dev/pts/ptmx is not on a devpts"));
    }
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int from a valid pointer; TIOCGPTPEER takes open flags and
    // returns a new descriptor for the pair's slave (Linux ≥ 4.13), without a path lookup.
    let slave = unsafe {
        if libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        OwnedFd::from_raw_fd(fd)
    };
    Ok((master, slave))
}

/// In the container process, just before `execve`: makes the terminal on stdin the
/// controlling terminal of the process's session (it is the session leader: libcontainer
/// called `setsid`). Does nothing when stdin is not a terminal.
pub(crate) fn make_controlling() -> std::io::Result<()> {
    // SAFETY: isatty and ioctl on fd 0 with an integer argument.
    unsafe {
        if libc::isatty(0) != 1 {
            return Ok(());
        }
        if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Sets a terminal's window size (`TIOCSWINSZ` on its master); the foreground process
/// group gets `SIGWINCH`.
pub fn set_window_size(master: &impl AsFd, width: u16, height: u16) -> std::io::Result<()> {
    let size = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
    let rc = unsafe { libc::ioctl(master.as_fd().as_raw_fd(), libc::TIOCSWINSZ, &size) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: &impl AsFd) -> bool {
    // SAFETY: isatty on a valid descriptor.
    unsafe { libc::isatty(fd.as_fd().as_raw_fd()) == 1 }
}

/// Copies a container's terminal output into its stdout log pipe.
pub(super) struct Relay {
    pub(super) id: String,
    pub(super) master: OwnedFd,
    /// The write end of the stdout log pipe (non-blocking).
    pub(super) pipe: OwnedFd,
    buf: Vec<u8>,
    offset: usize,
    /// The terminal has no writer left (or the pipe no reader): drop the relay.
    pub(super) done: bool,
}

/// What a relay waits for.
pub(super) enum RelayWait<'a> {
    /// Output on the master.
    Input(std::os::fd::BorrowedFd<'a>),
    /// Room in the pipe for what is buffered.
    Output(std::os::fd::BorrowedFd<'a>),
}

impl Relay {
    pub(super) fn new(id: String, master: OwnedFd, pipe: OwnedFd) -> Result<Self, String> {
        nix::fcntl::fcntl(
            pipe.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(|e| format!("log pipe non-blocking: {e}"))?;
        Ok(Self {
            id,
            master,
            pipe,
            buf: Vec::new(),
            offset: 0,
            done: false,
        })
    }

    pub(super) fn wait(&self) -> RelayWait<'_> {
        if self.offset < self.buf.len() {
            RelayWait::Output(self.pipe.as_fd())
        } else {
            RelayWait::Input(self.master.as_fd())
        }
    }

    /// Moves what it can without blocking: drains the buffer into the pipe, refills it
    /// from the master.
    pub(super) fn step(&mut self) {
        loop {
            while self.offset < self.buf.len() {
                match nix::unistd::write(&self.pipe, &self.buf[self.offset..]) {
                    Ok(n) => self.offset += n,
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(nix::errno::Errno::EAGAIN) => return,
                    Err(_) => {
                        self.done = true;
                        return;
                    }
                }
            }
            self.buf.resize(RELAY_CHUNK, 0);
            self.offset = 0;
            match nix::unistd::read(self.master.as_raw_fd(), &mut self.buf) {
                Ok(0) => {
                    self.buf.clear();
                    self.done = true;
                    return;
                }
                Ok(n) => self.buf.truncate(n),
                Err(nix::errno::Errno::EINTR) => self.buf.clear(),
                Err(nix::errno::Errno::EAGAIN) => {
                    self.buf.clear();
                    return;
                }
                // EIO: every slave descriptor is closed (the container and whatever
                // inherited its terminal have exited) and the output is read.
                Err(_) => {
                    self.buf.clear();
                    self.done = true;
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_copies_terminal_output_to_the_pipe_and_ends_when_the_slave_closes() {
        let (master, slave) = open_pair().expect("a pty");
        let (pipe_r, pipe_w) = super::super::sys::pipe().expect("a pipe");
        let mut relay = Relay::new("c".into(), master, pipe_w).expect("relay");
        set_window_size(&relay.master, 100, 30).expect("resize");
        let mut size: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes a winsize to a valid pointer.
        unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut size) };
        assert_eq!((size.ws_col, size.ws_row), (100, 30));
        assert!(is_terminal(&slave) && !is_terminal(&pipe_r));
        nix::unistd::write(&slave, b"hello\n").expect("write to the slave");
        relay.step();
        assert!(!relay.done);
        drop(slave);
        relay.step();
        assert!(relay.done, "EIO once the slave is closed");
        drop(relay);
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(pipe_r), &mut out).expect("read");
        // The line discipline turns "\n" into "\r\n".
        assert_eq!(out, b"hello\r\n");
    }
}

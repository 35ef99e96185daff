//! `-i` and `-t` of `ironlet ctr run` and `ironlet ctr exec`: this process's stdin feeds a
//! session's stdin, and with `-t` the local terminal is put in raw mode (restored on every
//! way out, [`RawMode`]'s drop) while the window size follows it (initial size, then on
//! every `SIGWINCH`).
//!
//! ```text
//!  local stdin ──(thread: blocking reads)──► session stdin   (EOF: the session's stdin closes)
//!  SIGWINCH ──► TIOCGWINSZ on the local terminal ──► session resize
//!  session stdout/stderr ──► local stdout/stderr             (exec; `run` uses its output tap)
//! ```
//!
//! Stdin is read by a plain thread rather than tokio's: a blocking read of a terminal
//! cannot be cancelled, and tokio's blocking pool would hold the process at exit until the
//! user typed once more.

use std::io::Read;
use std::os::fd::BorrowedFd;

use ironlet_runtime::types::{ExecSession, ExecWriter, Resize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// The local terminal in raw mode until dropped.
pub struct RawMode {
    saved: nix::sys::termios::Termios,
}

impl RawMode {
    /// Puts stdin's terminal in raw mode; `None` when stdin is not a terminal.
    pub fn enter() -> Option<Self> {
        let stdin = stdin_fd();
        let saved = nix::sys::termios::tcgetattr(stdin).ok()?;
        let mut raw = saved.clone();
        nix::sys::termios::cfmakeraw(&mut raw);
        nix::sys::termios::tcsetattr(stdin, nix::sys::termios::SetArg::TCSANOW, &raw).ok()?;
        Some(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(
            stdin_fd(),
            nix::sys::termios::SetArg::TCSANOW,
            &self.saved,
        );
    }
}

fn stdin_fd() -> BorrowedFd<'static> {
    // SAFETY: fd 0 stays open for the life of the process.
    unsafe { BorrowedFd::borrow_raw(0) }
}

/// The local terminal's window size as `(width, height)`, from stdin or stdout.
fn local_size() -> Option<(u16, u16)> {
    for fd in [0, 1] {
        // SAFETY: zeroed winsize is a valid out-parameter for TIOCGWINSZ.
        let mut size: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes a winsize to a valid pointer.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) } == 0 && size.ws_col > 0 {
            return Some((size.ws_col, size.ws_row));
        }
    }
    None
}

/// Keeps the session's window the size of the local terminal until the task is aborted.
pub fn follow_window_size(resize: Resize) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let apply = |resize: &Resize| {
            if let Some((width, height)) = local_size() {
                let _ = resize(width, height);
            }
        };
        apply(&resize);
        let Ok(mut winch) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        else {
            return;
        };
        while winch.recv().await.is_some() {
            apply(&resize);
        }
    })
}

/// Copies this process's stdin into `to` until end-of-file (then closes `to`, and calls
/// `at_eof`) or until `to` refuses more.
pub fn forward_stdin(
    mut to: ExecWriter,
    at_eof: impl FnOnce() + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(8);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
        drop(to);
        at_eof();
    })
}

/// Runs an interactive exec session to its end: stdin forwarded, output copied to this
/// process's stdout and stderr, the window followed; returns the exit code.
pub async fn run_exec(mut session: ExecSession, tty: bool) -> Option<i32> {
    let _raw = if tty { RawMode::enter() } else { None };
    let window = session.resize.take().map(follow_window_size);
    let input = session.stdin.take().map(|w| forward_stdin(w, || {}));
    let copy = |mut from: ironlet_runtime::types::ExecReader, to: i32| async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Written straight to the descriptor: tokio's stdout may buffer a prompt.
            // SAFETY: fds 1 and 2 stay open for the life of the process.
            let fd = unsafe { BorrowedFd::borrow_raw(to) };
            if write_all_fd(fd, &buf[..n]).is_err() {
                return;
            }
        }
    };
    let stdout = std::mem::replace(&mut session.stdout, Box::new(tokio::io::empty()));
    let stderr = std::mem::replace(&mut session.stderr, Box::new(tokio::io::empty()));
    let (_, _, code) = tokio::join!(copy(stdout, 1), copy(stderr, 2), session.exit.wait());
    if let Some(task) = input {
        task.abort();
    }
    if let Some(task) = window {
        task.abort();
    }
    code
}

/// Writes all of `bytes` to a blocking descriptor.
pub fn write_all_fd(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match nix::unistd::write(fd, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

//! Terminals and attach (CRI `Attach`): a container created with `stdin` or `tty` keeps its
//! input — the pty master, or the write end of its stdin pipe — in the zygote beside its log
//! pipes (`zygote::tty`); the runtime holds a copy ([`ContainerIo`]), and its output reaches
//! attached sessions from the log pump (`logs::Taps::live`), so the CRI log file stays the
//! one complete record and nothing is read twice.
//!
//! ```text
//!  attach ──► stdin:  write to the pty master (tty) or the stdin pipe
//!         ──► resize: TIOCSWINSZ on the master
//!         ◄── stdout/stderr: the log pump's live tap, from the moment of attaching
//!         ◄── end: when the container's output ends (it exited) or the caller leaves
//! ```
//!
//! `stdinOnce`: when the first attached session that wrote stdin ends, the stdin pipe is
//! closed for good (the zygote's copy and ours), so the container reads end-of-file, as
//! containerd does. With a tty there is no pipe to close; the terminal stays.
//!
//! [`PtyMaster`] also carries an exec's terminal ([`Inner::exec`](super::Inner) with `tty`):
//! an async reader and writer over a master descriptor, where `EIO` (no process holds the
//! terminal any more) reads as end-of-file.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{broadcast, oneshot};

use super::logs::{LiveOutput, LogStream, OutputChunk};
use super::{not_found, Inner};
use crate::error::RuntimeError;
use crate::types::{
    ContainerId, ContainerState, ExecExit, ExecReader, ExecRequest, ExecSession, ExecWriter, Resize,
};

/// An async reader and writer over a pty master.
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

impl PtyMaster {
    /// Wraps a master; the descriptor is made non-blocking.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(io::Error::from)?;
        // SAFETY: the descriptor is owned by the AsyncFd and never replaced while registered.
        let fd = unsafe { AsyncFd::register(fd) }?;
        Ok(Self { fd })
    }
}

impl AsyncRead for PtyMaster {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = match self.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(guard)) => guard,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| {
                nix::unistd::read(fd.get_ref().as_raw_fd(), unfilled).map_err(io::Error::from)
            }) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // No process holds the terminal any more: end of stream.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for PtyMaster {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = match self.fd.poll_write_ready(cx) {
                Poll::Ready(Ok(guard)) => guard,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A resize callback over a master descriptor.
pub(crate) fn resizer(master: Arc<OwnedFd>) -> Resize {
    Box::new(move |width, height| crate::zygote::tty::set_window_size(&*master, width, height))
}

/// What the runtime holds of a container's stdio, for attach.
pub(crate) struct ContainerIo {
    /// Output as the log pump sees it; ended when the pump ends, which ends every
    /// attached session's output.
    live: LiveOutput,
    /// The pty master (tty) or stdin pipe write end (`stdin`), until `stdinOnce` closes it.
    input: Mutex<Option<Arc<OwnedFd>>>,
    tty: bool,
    stdin_once: bool,
}

impl ContainerIo {
    /// `input` as the zygote handed it (create or re-adoption).
    pub(crate) fn new(input: Option<OwnedFd>, stdin_once: bool) -> Self {
        let tty = input.as_ref().is_some_and(crate::zygote::tty::is_terminal);
        Self {
            live: LiveOutput::default(),
            input: Mutex::new(input.map(Arc::new)),
            tty,
            stdin_once,
        }
    }

    fn input(&self) -> Option<Arc<OwnedFd>> {
        self.input.lock().ok().and_then(|g| g.clone())
    }

    /// What the log pump feeds.
    pub(crate) fn live_output(&self) -> LiveOutput {
        self.live.clone()
    }

    /// The pump has ended: attached sessions see the end of the output.
    pub(crate) fn output_ended(&self) {
        self.live.end();
    }

    fn subscribe(&self) -> Option<broadcast::Receiver<OutputChunk>> {
        self.live.subscribe()
    }
}

impl Inner {
    /// Attaches to running container `id`'s stdio (see [`crate::Runtime::attach`]).
    pub(crate) async fn attach(
        &self,
        id: &ContainerId,
        request: &ExecRequest,
    ) -> Result<ExecSession, RuntimeError> {
        let (io, exited) = {
            let state = self.lock();
            let entry = state
                .containers
                .get(id)
                .ok_or_else(|| not_found("container", id.as_str()))?;
            let st = entry.record.phase.state();
            // A created container too: `ctr run -it` attaches before the start, so that
            // the first prompt is not missed.
            if st != ContainerState::Running && st != ContainerState::Created {
                return Err(RuntimeError::IncorrectState {
                    id: id.clone(),
                    state: st,
                    action: "attach",
                });
            }
            (entry.io.clone(), entry.exited.subscribe())
        };
        let attach_err = |message: String| RuntimeError::Exec {
            id: id.clone(),
            message,
        };
        let io = io.ok_or_else(|| attach_err("the container's output is not available".into()))?;
        if request.tty && !io.tty {
            return Err(attach_err(
                "tty was requested but the container was not created with one".into(),
            ));
        }
        let input = io.input();
        if request.stdin && input.is_none() {
            return Err(attach_err(
                "stdin was requested but the container was not created with it (or its stdin \
                 was closed after the first attach: stdinOnce)"
                    .into(),
            ));
        }
        let dup = |fd: &Arc<OwnedFd>| fd.try_clone().map_err(|e| attach_err(format!("dup: {e}")));
        let stdin: Option<ExecWriter> = match (&input, request.stdin) {
            (Some(fd), true) if io.tty => Some(Box::new(
                PtyMaster::new(dup(fd)?).map_err(|e| attach_err(e.to_string()))?,
            )),
            (Some(fd), true) => Some(Box::new(
                tokio::net::unix::pipe::Sender::from_owned_fd(dup(fd)?)
                    .map_err(|e| attach_err(e.to_string()))?,
            )),
            _ => None,
        };
        let resize = match &input {
            Some(master) if io.tty => Some(resizer(master.clone())),
            _ => None,
        };
        let live = io
            .subscribe()
            .ok_or_else(|| attach_err("the container's output has ended".into()))?;
        let (stdout, stderr) = forward_live(live);
        let (code_tx, code_rx) = oneshot::channel();
        tokio::spawn(async move {
            let mut exited = exited;
            let _ = exited.wait_for(|done| *done).await;
            let _ = code_tx.send(0);
        });
        // Leaving: with stdinOnce, the first session that had stdin closes it for good.
        let close_stdin = (io.stdin_once && request.stdin && !io.tty).then(|| {
            let inner = self.this.clone();
            let (id, io) = (id.clone(), io.clone());
            move || {
                if let Ok(mut input) = io.input.lock() {
                    input.take();
                }
                if let Some(inner) = inner.upgrade() {
                    tokio::spawn(async move {
                        if let Err(err) = inner.zygote.close_stdin(id.as_str()).await {
                            tracing::debug!(container_id = %id, %err, "closing stdin failed");
                        }
                    });
                }
            }
        });
        let on_leave = move || {
            if let Some(close) = close_stdin {
                close();
            }
        };
        Ok(ExecSession {
            stdin,
            stdout,
            stderr,
            exit: ExecExit::new(code_rx, on_leave),
            resize,
        })
    }
}

/// Splits the live output into a stdout and a stderr stream; both end with the output
/// (the container's pump ended) or when the reader drops them.
fn forward_live(mut rx: broadcast::Receiver<OutputChunk>) -> (ExecReader, ExecReader) {
    let (mut out_w, out_r) = tokio::io::duplex(64 * 1024);
    let (mut err_w, err_r) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        loop {
            let (stream, bytes) = match rx.recv().await {
                Ok(chunk) => chunk,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(missed, "an attached session fell behind; output skipped");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let to = match stream {
                LogStream::Stdout => &mut out_w,
                LogStream::Stderr => &mut err_w,
            };
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    (Box::new(out_r), Box::new(err_r))
}

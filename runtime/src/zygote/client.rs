//! The agent's async end of the zygote socket.
//!
//! Any number of tasks may call at once: each request gets a sequence number and a oneshot
//! for its reply; one reader task routes replies to their callers and events to a single
//! unbounded channel, so no exit is ever dropped for a slow consumer.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};

use super::protocol::{
    recv_message, send_message, Envelope, Event, Hello, Inbound, Reply, Request, MAX_MESSAGE,
};
use super::{ZygoteError, ZygoteHandle};

type Pending = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<(Reply, Vec<OwnedFd>)>>>>>;

/// A connection to the zygote. Cheap to share behind an `Arc`.
pub struct ZygoteClient {
    sock: Arc<AsyncFd<OwnedFd>>,
    pending: Pending,
    next_seq: AtomicU64,
    pub pid: i32,
}

/// A process to run in a running container's namespaces.
pub struct ExecProcess {
    /// Names the exec in exit events.
    pub exec_id: String,
    /// libcontainer's state root.
    pub state_root: PathBuf,
    /// The container's bundle directory.
    pub bundle: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Give the process a stdin pipe (else it reads `/dev/null`).
    pub stdin: bool,
    /// Run it on a new terminal (see [`ExecHandle`]).
    pub tty: bool,
}

/// How a container's stdio is set up at create.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreateStdio {
    /// Keep a stdin pipe open that attach can write to (else it reads `/dev/null`).
    pub stdin: bool,
    /// Run on a terminal whose output goes to the stdout log pipe.
    pub tty: bool,
}

/// What the zygote hands out of a container's stdio: the log pipes' read ends, and the
/// pty master (tty) or stdin write end (stdin), if any.
pub struct ContainerStdio {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub input: Option<OwnedFd>,
}

/// The pipes and pid of a started exec process. With a tty, `stdout` is the pty master,
/// `stdin` (when asked for) a copy of it and `stderr` ends at once.
pub struct ExecHandle {
    pub pid: i32,
    /// The write end of its stdin, when asked for.
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

impl ZygoteClient {
    /// Wraps a spawned zygote; must run inside a tokio runtime. Events go to `events`.
    pub fn new(
        handle: ZygoteHandle,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<Self, ZygoteError> {
        nix::fcntl::fcntl(
            handle.sock.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(|e| ZygoteError::Socket(e.into()))?;
        // SAFETY: the descriptor is owned by the AsyncFd and never replaced while registered.
        let sock =
            unsafe { AsyncFd::register(handle.sock) }.map_err(|e| ZygoteError::Socket(e.into()))?;
        let sock = Arc::new(sock);
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        tokio::spawn(read_loop(sock.clone(), pending.clone(), events));
        Ok(Self {
            sock,
            pending,
            next_seq: AtomicU64::new(1),
            pid: handle.pid,
        })
    }

    async fn call(&self, request: Request) -> Result<(Reply, Vec<OwnedFd>), ZygoteError> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut guard = self.pending.lock().map_err(|_| ZygoteError::Gone)?;
            guard.as_mut().ok_or(ZygoteError::Gone)?.insert(seq, tx);
        }
        let envelope = Envelope { seq, request };
        loop {
            let mut ready = self.sock.writable().await.map_err(ZygoteError::Socket)?;
            match send_message(self.sock.get_ref().as_raw_fd(), &envelope, &[]) {
                Err(ZygoteError::Socket(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    ready.clear_ready();
                }
                Err(e) => {
                    self.forget(seq);
                    return Err(e);
                }
                Ok(()) => break,
            }
        }
        match rx.await {
            Ok((Reply::Failed { message }, _)) => Err(ZygoteError::Failed(message)),
            Ok(reply) => Ok(reply),
            Err(_) => Err(ZygoteError::Gone),
        }
    }

    fn forget(&self, seq: u64) {
        if let Ok(mut guard) = self.pending.lock() {
            if let Some(map) = guard.as_mut() {
                map.remove(&seq);
            }
        }
    }

    /// Creates a container; returns its init pid, start time and its stdio. With
    /// `pod_mounts_root`, the worker keeps other pods' mounts under it out of the container's
    /// mount namespace (`pod_mounts.rs`).
    pub async fn create(
        &self,
        id: &str,
        bundle: PathBuf,
        state_root: PathBuf,
        stdio: CreateStdio,
        pod_mounts_root: Option<PathBuf>,
    ) -> Result<(i32, u64, ContainerStdio), ZygoteError> {
        let (reply, fds) = self
            .call(Request::Create {
                id: id.to_owned(),
                bundle,
                state_root,
                stdin: stdio.stdin,
                tty: stdio.tty,
                pod_mounts_root,
            })
            .await?;
        match (reply, container_stdio(fds)) {
            (Reply::Created { pid, start_time }, Some(got)) => {
                let has_tty = got.input.as_ref().is_some_and(super::tty::is_terminal);
                if (stdio.tty && !has_tty) || (stdio.stdin && got.input.is_none()) {
                    return Err(ZygoteError::Unexpected(format!(
                        "container {id} started without the stdin or tty asked for (supervisor \
                         too old: restart it to upgrade)"
                    )));
                }
                Ok((pid, start_time, got))
            }
            (other, _) => Err(ZygoteError::Unexpected(format!("{other:?}"))),
        }
    }

    pub async fn start(&self, id: &str, state_root: PathBuf) -> Result<(), ZygoteError> {
        self.call(Request::Start {
            id: id.to_owned(),
            state_root,
        })
        .await
        .map(drop)
    }

    pub async fn kill(&self, id: &str, signal: i32) -> Result<(), ZygoteError> {
        self.call(Request::Kill {
            id: id.to_owned(),
            signal,
        })
        .await
        .map(drop)
    }

    pub async fn delete(
        &self,
        id: &str,
        state_root: PathBuf,
        force: bool,
    ) -> Result<(), ZygoteError> {
        self.call(Request::Delete {
            id: id.to_owned(),
            state_root,
            force,
        })
        .await
        .map(drop)
    }

    /// Starts `process` in container `id`'s namespaces; its output arrives on the two pipes
    /// of the returned handle.
    pub async fn exec(&self, id: &str, process: ExecProcess) -> Result<ExecHandle, ZygoteError> {
        let ExecProcess {
            exec_id,
            state_root,
            bundle,
            args,
            env,
            cwd,
            stdin,
            tty,
        } = process;
        let (reply, fds) = self
            .call(Request::Exec {
                id: id.to_owned(),
                exec_id,
                stdin,
                tty,
                state_root,
                bundle,
                args,
                env,
                cwd,
            })
            .await?;
        let mut fds = fds.into_iter();
        let (stdout, stderr, stdin_w) = (fds.next(), fds.next(), fds.next());
        match (reply, stdout, stderr) {
            (Reply::Execd { pid }, Some(stdout), Some(stderr)) => {
                if stdin && stdin_w.is_none() {
                    // A zygote from before stdin pipes: the process reads /dev/null.
                    return Err(ZygoteError::Unexpected(format!(
                        "exec process {pid} started without the stdin pipe asked for (zygote too old)"
                    )));
                }
                if tty && !super::tty::is_terminal(&stdout) {
                    return Err(ZygoteError::Unexpected(format!(
                        "exec process {pid} started without the tty asked for (zygote too old)"
                    )));
                }
                Ok(ExecHandle {
                    pid,
                    stdin: stdin_w,
                    stdout,
                    stderr,
                })
            }
            (other, _, _) => Err(ZygoteError::Unexpected(format!("{other:?}"))),
        }
    }

    pub async fn create_namespaces(
        &self,
        dir: PathBuf,
        hostname: String,
        net: bool,
        ipc: bool,
        uts: bool,
        ipv4_only: bool,
    ) -> Result<(), ZygoteError> {
        self.call(Request::CreateNamespaces {
            dir,
            hostname,
            net,
            ipc,
            uts,
            ipv4_only,
        })
        .await
        .map(drop)
    }

    /// Starts a rootless pod's namespace holder and pasta (see `holder.rs`); returns the
    /// holder's pid and start time once the pod's network is configured.
    pub async fn create_pod_network(
        &self,
        request: crate::network::rootless::HolderRequest,
    ) -> Result<(i32, u64), ZygoteError> {
        let map = |m: &[crate::spec::IdMapping]| {
            m.iter()
                .map(|m| (m.container_id, m.host_id, m.size))
                .collect()
        };
        let reply = self
            .call(Request::CreatePodNetwork {
                id: request.id,
                dir: request.dir,
                hostname: request.hostname,
                uids: map(&request.uids),
                gids: map(&request.gids),
                ipc: request.ipc,
                pasta: request.pasta,
            })
            .await?;
        match reply {
            (Reply::Created { pid, start_time }, _) => Ok((pid, start_time)),
            (other, _) => Err(ZygoteError::Unexpected(format!("{other:?}"))),
        }
    }

    pub async fn adopt(&self, id: &str, pid: i32, start_time: u64) -> Result<(), ZygoteError> {
        self.call(Request::Adopt {
            id: id.to_owned(),
            pid,
            start_time,
        })
        .await
        .map(drop)
    }

    pub async fn set_exit_dir(&self, dir: PathBuf) -> Result<(), ZygoteError> {
        self.call(Request::SetExitDir { dir }).await.map(drop)
    }

    /// Opens the connection: what the zygote watches and holds (see [`Hello`]). Under a
    /// supervisor the answer waits for calls made for an earlier agent to finish.
    pub async fn hello(&self) -> Result<Hello, ZygoteError> {
        match self.call(Request::Hello).await? {
            (Reply::Hello(hello), _) => Ok(hello),
            (other, _) => Err(ZygoteError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Copies of container `id`'s stdout and stderr read ends (and its pty master or stdin
    /// write end), which the zygote holds.
    pub async fn take_logs(&self, id: &str) -> Result<ContainerStdio, ZygoteError> {
        let (reply, fds) = self.call(Request::TakeLogs { id: id.to_owned() }).await?;
        match (reply, container_stdio(fds)) {
            (Reply::Logs, Some(stdio)) => Ok(stdio),
            (other, _) => Err(ZygoteError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Lets the zygote close its copy of container `id`'s stdin pipe (`stdinOnce`).
    pub async fn close_stdin(&self, id: &str) -> Result<(), ZygoteError> {
        self.call(Request::CloseStdin { id: id.to_owned() })
            .await
            .map(drop)
    }

    /// Lets the zygote close its copies of container `id`'s log pipes (drained or removed).
    pub async fn release_logs(&self, id: &str) -> Result<(), ZygoteError> {
        self.call(Request::ReleaseLogs { id: id.to_owned() })
            .await
            .map(drop)
    }
}

fn container_stdio(fds: Vec<OwnedFd>) -> Option<ContainerStdio> {
    let mut it = fds.into_iter();
    Some(ContainerStdio {
        stdout: it.next()?,
        stderr: it.next()?,
        input: it.next(),
    })
}

async fn read_loop(
    sock: Arc<AsyncFd<OwnedFd>>,
    pending: Pending,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut buf = vec![0u8; MAX_MESSAGE];
    'outer: loop {
        let mut ready = match sock.readable().await {
            Ok(r) => r,
            Err(err) => {
                tracing::error!(%err, "zygote socket failed");
                break;
            }
        };
        loop {
            match recv_message::<Inbound>(sock.get_ref().as_raw_fd(), &mut buf) {
                Ok(Some((Inbound::Reply { seq, reply }, fds))) => {
                    let waiter = pending
                        .lock()
                        .ok()
                        .and_then(|mut g| g.as_mut().and_then(|m| m.remove(&seq)));
                    if let Some(tx) = waiter {
                        let _ = tx.send((reply, fds));
                    }
                }
                Ok(Some((Inbound::Event(event), _))) => {
                    let _ = events.send(event);
                }
                Ok(None) => {
                    tracing::error!("the zygote hung up");
                    break 'outer;
                }
                Err(ZygoteError::Socket(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    ready.clear_ready();
                    break;
                }
                Err(ZygoteError::Decode(err)) => tracing::warn!(%err, "undecodable zygote message"),
                Err(err) => {
                    tracing::error!(%err, "zygote socket failed");
                    break 'outer;
                }
            }
        }
    }
    // Fail every caller still waiting, and refuse new calls.
    if let Ok(mut guard) = pending.lock() {
        guard.take();
    }
}

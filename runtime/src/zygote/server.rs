//! The zygote's event loop: a single-threaded process, forked (or, as the supervisor,
//! started) before any thread exists, that owns every container process.
//!
//! ```text
//!   agent (tokio) ══ SOCK_SEQPACKET ══ zygote (this loop, child subreaper)
//!                                        ├─ worker (one libcontainer call, then _exit)
//!                                        ├─ container init  ◄─ reparented here when the
//!                                        └─ exec process       worker exits
//! ```
//!
//! Two modes share this loop:
//! - **private** ([`serve`], from [`super::spawn`]): the zygote of one process (`ironlet
//!   ctr`, tests). When that process hangs up, the zygote kills the containers it created
//!   but never started (nobody could start them any more), keeps reaping and recording
//!   until its last process has ended, then exits.
//! - **supervised** ([`serve_supervised`], `ironlet run`): the loop is also the
//!   [`Supervisor`] of the agent process, which connects anew after every restart (each
//!   connection is a *generation*). See `crate::supervisor`.
//!
//! Guarantees:
//! - libcontainer only ever runs in a worker forked from this single-threaded process, except
//!   `start` (a connect and a write to the container's notify socket), which the zygote
//!   runs itself: a worker's fork, exit and reap were most of its time.
//! - Every process the zygote owns is watched through a pidfd and reaped with
//!   `waitid(P_PIDFD)`; there is no `waitpid(-1)`, so nothing else's exit is stolen.
//! - A call is answered as soon as its worker's result line is whole, not once the worker
//!   has exited (its teardown overlaps the client's next step). A process the worker
//!   created stays the worker's child until then, so its pidfd is polled only after the
//!   worker is reaped: an exit in between is reaped, with its status, a moment later.
//! - A container exit is written durably (`<exit dir>/<id>.json`, temp + fsync + rename)
//!   before the client is told, so an exit code survives a client that is gone.
//! - The zygote holds its own read end of every container's log pipes until the client
//!   releases them (after draining them to end of stream) or deletes the container, so a
//!   container never gets SIGPIPE while its client is gone, and output written just before
//!   an exit is still there for the next client; once a pipe is full the writer blocks.
//! - [`Request::Hello`] is answered only when no worker of an earlier generation runs, and
//!   a container or exec process created for a client that is gone is killed (it never ran
//!   user code, or nobody reads it): a new client sees a settled state.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::calls::Worker;
use super::protocol::{recv_message, send_message, Envelope, Inbound, Reply, Request, MAX_MESSAGE};
use super::reaper::Watched;
use super::ZygoteError;
use crate::supervisor::{Supervisor, SupervisorSource};

pub(super) struct Server {
    pub(super) sock: Option<OwnedFd>,
    /// Increases with every new connection; workers remember the one they serve.
    pub(super) generation: u64,
    /// A `Hello` waiting for the workers of earlier generations.
    pub(super) pending_hello: Option<u64>,
    pub(super) workers: Vec<Worker>,
    pub(super) watched: Vec<Watched>,
    /// Read ends of containers' stdout and stderr pipes (and their stdin or terminal), by
    /// container id.
    pub(super) logs: std::collections::HashMap<String, HeldStdio>,
    /// Terminal output on its way to the stdout log pipes (containers with a tty).
    pub(super) relays: Vec<super::tty::Relay>,
    pub(super) exit_dir: Option<PathBuf>,
    pub(super) filters: super::seccomp::FilterCache,
    supervisor: Option<Supervisor>,
    /// The namespace create workers start from (`pod_mounts.rs`); dropped once no process
    /// is owned, so it never holds a file system the host has let go of.
    pub(super) mount_template: Option<super::pod_mounts::MountTemplate>,
    buf: Vec<u8>,
}

/// Runs a private zygote until its client has hung up and every owned process has ended.
pub(crate) fn serve(sock: OwnedFd) -> ! {
    set_child_subreaper();
    // Own session: a Ctrl-C meant for `ironlet ctr run` must not kill the zygote.
    let _ = nix::unistd::setsid();
    let mut server = Server::new(Some(sock), None, None);
    let result = server.run_private();
    exit_with(result)
}

/// Runs the supervisor: the zygote loop plus the agent's life cycle. Returns never; the
/// process exits when the supervisor is told to stop and the agent has gone.
pub(crate) fn serve_supervised(supervisor: Supervisor, exit_dir: PathBuf) -> ! {
    let mut server = Server::new(None, Some(supervisor), Some(exit_dir));
    let result = server.run_supervised();
    exit_with(result)
}

fn exit_with(result: Result<(), ZygoteError>) -> ! {
    let code = match result {
        Ok(()) => 0,
        Err(err) => {
            tracing::error!(%err, "zygote stopped");
            1
        }
    };
    // SAFETY: leave without running the parent's atexit handlers.
    unsafe { libc::_exit(code) }
}

pub(crate) fn set_child_subreaper() {
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// What one ready descriptor in the poll set stands for.
#[derive(Clone, Copy)]
enum Source {
    Socket,
    WorkerExit(usize),
    WorkerResult(usize),
    Watched(usize),
    Relay(usize),
    Supervisor(SupervisorSource),
}

/// What the zygote holds of one container's stdio.
pub(super) struct HeldStdio {
    /// Read ends of the stdout and stderr log pipes.
    pub(super) out: OwnedFd,
    pub(super) err: OwnedFd,
    /// The pty master of a container with a tty, else the write end of its stdin pipe
    /// (until `CloseStdin`), else nothing.
    pub(super) input: Option<OwnedFd>,
}

impl Server {
    fn new(
        sock: Option<OwnedFd>,
        supervisor: Option<Supervisor>,
        exit_dir: Option<PathBuf>,
    ) -> Self {
        super::cgroup_view::remember_cgroup_mounts();
        Self {
            sock,
            generation: 0,
            pending_hello: None,
            workers: Vec::new(),
            watched: Vec::new(),
            logs: std::collections::HashMap::new(),
            relays: Vec::new(),
            exit_dir,
            filters: super::seccomp::FilterCache::default(),
            supervisor,
            mount_template: None,
            buf: vec![0; MAX_MESSAGE],
        }
    }

    /// In a freshly forked worker: closes the worker's copies of what belongs to the
    /// zygote (client socket, held log pipes, the supervisor's lock, signalfd and agent
    /// pidfd), so that no container inherits them and a lock dies with the supervisor.
    pub(super) fn forget_in_child(&mut self) {
        self.sock = None;
        self.logs.clear();
        self.relays.clear();
        // Other workers' pipes, among them an exec's stdin write end: a copy held here (and
        // by a container init this child makes, until it execs) would keep that exec from
        // ever seeing end-of-file.
        self.workers.clear();
        self.supervisor = None;
        self.mount_template = None;
    }

    pub(super) fn is_supervisor(&self) -> bool {
        self.supervisor.is_some()
    }

    fn run_private(&mut self) -> Result<(), ZygoteError> {
        let mut unstarted_killed = false;
        loop {
            if self.sock.is_none() && !unstarted_killed {
                self.kill_unstarted();
                unstarted_killed = true;
            }
            if self.sock.is_none() && self.workers.is_empty() && self.watched.is_empty() {
                return Ok(());
            }
            self.round(None)?;
        }
    }

    fn run_supervised(&mut self) -> Result<(), ZygoteError> {
        loop {
            let now = Instant::now();
            let Some(outcome) = self.supervisor.as_mut().map(|s| s.tick(now)) else {
                return Ok(());
            };
            if let Some(sock) = outcome.connection {
                self.connect(sock);
            }
            if outcome.exit {
                tracing::info!(
                    containers = self.watched.iter().filter(|w| w.exec_id.is_none()).count(),
                    "supervisor exits; containers keep running"
                );
                return Ok(());
            }
            let timeout = self.supervisor.as_ref().and_then(|s| s.timeout(now));
            self.round(timeout)?;
        }
    }

    /// A new client (a freshly started agent): the previous one is gone for good.
    fn connect(&mut self, sock: OwnedFd) {
        self.generation += 1;
        self.pending_hello = None;
        self.sock = Some(sock);
        tracing::debug!(generation = self.generation, "agent connected");
    }

    /// One poll round: wait, then handle every ready source.
    fn round(&mut self, timeout: Option<std::time::Duration>) -> Result<(), ZygoteError> {
        let ready = self.wait(timeout)?;
        for source in ready {
            match source {
                Source::Socket => self.on_request()?,
                Source::WorkerExit(i) => self.reap_worker(i),
                Source::WorkerResult(i) => self.read_worker(i),
                Source::Watched(i) => self.reap_watched(i),
                Source::Relay(i) => {
                    if let Some(relay) = self.relays.get_mut(i) {
                        relay.step();
                    }
                }
                Source::Supervisor(source) => {
                    if let Some(supervisor) = self.supervisor.as_mut() {
                        supervisor.on_ready(source, Instant::now());
                    }
                }
            }
        }
        self.finish_workers();
        self.watched.retain(|w| w.pid != 0);
        if self.workers.is_empty() && self.watched.is_empty() {
            self.mount_template = None;
        }
        self.relays.retain(|r| {
            if r.done {
                tracing::debug!(container_id = %r.id, "terminal closed; its relay ends");
            }
            !r.done
        });
        self.answer_pending_hello();
        Ok(())
    }

    /// Polls every descriptor; returns the sources that are ready.
    fn wait(&self, timeout: Option<std::time::Duration>) -> Result<Vec<Source>, ZygoteError> {
        let mut sources = Vec::new();
        let mut fds = Vec::new();
        if let Some(sock) = &self.sock {
            sources.push(Source::Socket);
            fds.push(PollFd::new(sock.as_fd(), PollFlags::POLLIN));
        }
        for (i, w) in self.workers.iter().enumerate() {
            if w.exit.is_none() {
                sources.push(Source::WorkerExit(i));
                fds.push(PollFd::new(w.pidfd.as_fd(), PollFlags::POLLIN));
            }
            if let Some(pipe) = &w.result_pipe {
                sources.push(Source::WorkerResult(i));
                fds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLIN));
            }
        }
        for (i, w) in self.watched.iter().enumerate() {
            if w.reparent_from.is_some() {
                continue;
            }
            sources.push(Source::Watched(i));
            fds.push(PollFd::new(w.pidfd.as_fd(), PollFlags::POLLIN));
        }
        for (i, relay) in self.relays.iter().enumerate() {
            sources.push(Source::Relay(i));
            fds.push(match relay.wait() {
                super::tty::RelayWait::Input(fd) => PollFd::new(fd, PollFlags::POLLIN),
                super::tty::RelayWait::Output(fd) => PollFd::new(fd, PollFlags::POLLOUT),
            });
        }
        if let Some(supervisor) = &self.supervisor {
            for (source, fd) in supervisor.poll_fds() {
                sources.push(Source::Supervisor(source));
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
            }
        }
        let timeout = match timeout {
            None => PollTimeout::NONE,
            // Rounded up, so a deadline is never polled for just before it passes.
            Some(t) => PollTimeout::try_from(t.as_millis().saturating_add(1).min(60_000) as i32)
                .unwrap_or(PollTimeout::MAX),
        };
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(ZygoteError::Socket(e.into())),
        }
        Ok(fds
            .iter()
            .zip(sources)
            .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
            .map(|(_, s)| s)
            .collect())
    }

    fn on_request(&mut self) -> Result<(), ZygoteError> {
        let Some(sock) = &self.sock else {
            return Ok(());
        };
        let raw = sock.as_raw_fd();
        let message = match recv_message::<Envelope>(raw, &mut self.buf) {
            Ok(Some((msg, _fds))) => msg,
            Ok(None) => {
                tracing::debug!("client hung up; the zygote keeps reaping");
                self.sock = None;
                return Ok(());
            }
            Err(ZygoteError::Decode(err)) => {
                tracing::warn!(%err, "zygote dropped an undecodable request");
                return Ok(());
            }
            Err(ZygoteError::Socket(err)) => {
                tracing::warn!(%err, "client connection failed; the zygote keeps reaping");
                self.sock = None;
                return Ok(());
            }
            Err(err) => return Err(err),
        };
        let seq = message.seq;
        match message.request {
            Request::Hello => {
                self.pending_hello = Some(seq);
            }
            Request::Kill { id, signal } => {
                let reply = self.kill(&id, signal);
                self.reply(seq, reply, &[]);
            }
            Request::SetExitDir { dir } => {
                self.exit_dir = Some(dir);
                self.reply(seq, Reply::Done, &[]);
            }
            Request::Adopt {
                id,
                pid,
                start_time,
            } => {
                let reply = self.adopt(id, pid, start_time);
                self.reply(seq, reply, &[]);
            }
            Request::Start { id, state_root } => {
                let reply = match super::worker::start_in_zygote(&id, &state_root) {
                    Ok(()) => {
                        self.started(&id);
                        Reply::Done
                    }
                    Err(message) => Reply::Failed { message },
                };
                self.reply(seq, reply, &[]);
            }
            Request::TakeLogs { id } => self.take_logs(seq, &id),
            Request::ReleaseLogs { id } => {
                self.logs.remove(&id);
                self.reply(seq, Reply::Done, &[]);
            }
            Request::CloseStdin { id } => {
                if let Some(held) = self.logs.get_mut(&id) {
                    if held
                        .input
                        .as_ref()
                        .is_some_and(|fd| !super::tty::is_terminal(fd))
                    {
                        held.input = None;
                    }
                }
                self.reply(seq, Reply::Done, &[]);
            }
            request => {
                if let Request::Delete { id, .. } = &request {
                    self.logs.remove(id);
                }
                if let Err(message) = self.spawn_worker(seq, request) {
                    self.reply(seq, Reply::Failed { message }, &[]);
                }
            }
        }
        Ok(())
    }

    /// Answers a waiting `Hello` once no worker of an earlier generation is left.
    fn answer_pending_hello(&mut self) {
        let Some(seq) = self.pending_hello else {
            return;
        };
        if self.workers.iter().any(|w| w.generation != self.generation) {
            return;
        }
        self.pending_hello = None;
        let hello = self.hello();
        self.reply(seq, Reply::Hello(hello), &[]);
    }

    pub(super) fn reply(&mut self, seq: u64, reply: Reply, fds: &[RawFd]) {
        self.send(&Inbound::Reply { seq, reply }, fds);
    }

    pub(super) fn send(&mut self, msg: &Inbound, fds: &[RawFd]) {
        let Some(sock) = &self.sock else {
            return;
        };
        if let Err(err) = send_message(sock.as_raw_fd(), msg, fds) {
            tracing::warn!(%err, "zygote lost its client; it keeps reaping on its own");
            self.sock = None;
        }
    }
}

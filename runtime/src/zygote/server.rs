//! The zygote's event loop: a single-threaded process, forked before any thread exists,
//! that owns every container process.
//!
//! ```text
//!   agent (tokio) ══ SOCK_SEQPACKET ══ zygote (this loop, child subreaper)
//!                                        ├─ worker (one libcontainer call, then _exit)
//!                                        ├─ container init  ◄─ reparented here when the
//!                                        └─ exec process       intermediate process exits
//! ```
//!
//! Guarantees:
//! - libcontainer only ever runs in a worker forked from this single-threaded process.
//! - Every process the zygote owns is watched through a pidfd and reaped with
//!   `waitid(P_PIDFD)`; there is no `waitpid(-1)`, so nothing else's exit is stolen.
//! - A container exit is written durably (`<exit dir>/<id>.json`, temp + fsync + rename)
//!   before the agent is told, so an exit code survives an agent that is gone.
//! - The zygote holds its own read end of every log pipe, so a container never gets SIGPIPE
//!   when the agent is gone; once the pipe is full the container blocks.
//! - When the agent hangs up, the zygote keeps reaping and recording until its last
//!   process has ended, then exits.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::SystemTime;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::unistd::{fork, ForkResult};

use super::protocol::{
    raw_fds, recv_message, send_message, Envelope, Event, Inbound, Reply, Request, WireExit,
    MAX_MESSAGE,
};
use super::sys;
use super::worker::{self, Stdio, WorkerResult};
use super::ZygoteError;

/// A worker running one request.
struct Worker {
    seq: u64,
    pid: i32,
    pidfd: OwnedFd,
    result_pipe: Option<OwnedFd>,
    output: Vec<u8>,
    exit: Option<WireExit>,
    kind: WorkerKind,
}

/// What to do with a worker's success.
enum WorkerKind {
    /// Watch the new container init; hand these log pipe read ends to the agent.
    Create {
        id: String,
        pipes: Vec<OwnedFd>,
    },
    Exec {
        id: String,
        exec_id: String,
        pipes: Vec<OwnedFd>,
    },
    Plain,
}

/// A container init or exec process the zygote reaps.
struct Watched {
    id: String,
    exec_id: Option<String>,
    pid: i32,
    pidfd: OwnedFd,
    /// The zygote's own read ends of the log pipes (see the module guarantees).
    _held_pipes: Vec<OwnedFd>,
}

struct Server {
    sock: Option<OwnedFd>,
    workers: Vec<Worker>,
    watched: Vec<Watched>,
    exit_dir: Option<PathBuf>,
    buf: Vec<u8>,
    filters: super::seccomp::FilterCache,
}

/// Runs the zygote until the agent has hung up and every owned process has ended.
pub(crate) fn serve(sock: OwnedFd) -> ! {
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    // Own session: a Ctrl-C meant for `ironlet ctr run` must not kill the zygote.
    let _ = nix::unistd::setsid();
    let mut server = Server {
        sock: Some(sock),
        workers: Vec::new(),
        watched: Vec::new(),
        exit_dir: None,
        buf: vec![0; MAX_MESSAGE],
        filters: super::seccomp::FilterCache::default(),
    };
    let code = match server.run() {
        Ok(()) => 0,
        Err(err) => {
            tracing::error!(%err, "zygote stopped");
            1
        }
    };
    // SAFETY: leave without running the parent's atexit handlers.
    unsafe { libc::_exit(code) }
}

/// What one ready descriptor in the poll set stands for.
#[derive(Clone, Copy)]
enum Source {
    Socket,
    WorkerExit(usize),
    Watched(usize),
}

impl Server {
    fn run(&mut self) -> Result<(), ZygoteError> {
        loop {
            if self.sock.is_none() && self.workers.is_empty() && self.watched.is_empty() {
                return Ok(());
            }
            let ready = self.wait()?;
            for source in ready {
                match source {
                    Source::Socket => self.on_request()?,
                    Source::WorkerExit(i) => self.reap_worker(i),
                    Source::Watched(i) => self.reap_watched(i),
                }
            }
            self.finish_workers();
            self.watched.retain(|w| w.pid != 0);
        }
    }

    /// Polls every descriptor; returns the sources that are ready.
    fn wait(&self) -> Result<Vec<Source>, ZygoteError> {
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
        }
        for (i, w) in self.watched.iter().enumerate() {
            sources.push(Source::Watched(i));
            fds.push(PollFd::new(w.pidfd.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
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
                tracing::debug!("agent hung up; zygote drains its processes");
                self.sock = None;
                return Ok(());
            }
            Err(ZygoteError::Decode(err)) => {
                tracing::warn!(%err, "zygote dropped an undecodable request");
                return Ok(());
            }
            Err(err) => return Err(err),
        };
        let seq = message.seq;
        match message.request {
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
            request => {
                if let Err(message) = self.spawn_worker(seq, request) {
                    self.reply(seq, Reply::Failed { message }, &[]);
                }
            }
        }
        Ok(())
    }

    fn reply(&mut self, seq: u64, reply: Reply, fds: &[RawFd]) {
        self.send(&Inbound::Reply { seq, reply }, fds);
    }

    fn send(&mut self, msg: &Inbound, fds: &[RawFd]) {
        let Some(sock) = &self.sock else {
            return;
        };
        if let Err(err) = send_message(sock.as_raw_fd(), msg, fds) {
            tracing::warn!(%err, "zygote lost the agent; it keeps reaping on its own");
            self.sock = None;
        }
    }

    fn kill(&self, id: &str, signal: i32) -> Reply {
        match self
            .watched
            .iter()
            .find(|w| w.id == id && w.exec_id.is_none())
        {
            Some(w) => match sys::pidfd_send_signal(&w.pidfd, signal) {
                Ok(()) => Reply::Done,
                Err(e) => Reply::Failed {
                    message: format!("signal {signal} to {id}: {e}"),
                },
            },
            None => Reply::Failed {
                message: format!("container {id} is not running"),
            },
        }
    }

    fn adopt(&mut self, id: String, pid: i32, start_time: u64) -> Reply {
        if self
            .watched
            .iter()
            .any(|w| w.id == id && w.exec_id.is_none())
        {
            return Reply::Done;
        }
        match sys::process_start_time(pid) {
            Ok(t) if t == start_time => {}
            _ => {
                return Reply::Failed {
                    message: format!("process {pid} of {id} is gone"),
                }
            }
        }
        match sys::pidfd_open(pid) {
            Ok(pidfd) => {
                self.watched.push(Watched {
                    id,
                    exec_id: None,
                    pid,
                    pidfd,
                    _held_pipes: Vec::new(),
                });
                Reply::Done
            }
            Err(e) => Reply::Failed {
                message: format!("pidfd_open {pid}: {e}"),
            },
        }
    }

    fn spawn_worker(&mut self, seq: u64, request: Request) -> Result<(), String> {
        let wants_stdio = matches!(request, Request::Create { .. } | Request::Exec { .. });
        // Compiled here, once per profile; the forked worker inherits the program.
        let seccomp = match &request {
            Request::Create { bundle, .. } | Request::Exec { bundle, .. } => {
                self.filters.for_bundle(bundle)?
            }
            _ => None,
        };
        let (mut pipes, stdio) = if wants_stdio {
            let (out_r, out_w) = sys::pipe().map_err(|e| format!("pipe: {e}"))?;
            let (err_r, err_w) = sys::pipe().map_err(|e| format!("pipe: {e}"))?;
            sys::grow_pipe(&out_r);
            sys::grow_pipe(&err_r);
            (
                vec![out_r, err_r],
                Some(Stdio {
                    stdout: out_w,
                    stderr: err_w,
                }),
            )
        } else {
            (Vec::new(), None)
        };
        let kind = match &request {
            Request::Create { id, .. } => WorkerKind::Create {
                id: id.clone(),
                pipes: std::mem::take(&mut pipes),
            },
            Request::Exec { id, exec_id, .. } => WorkerKind::Exec {
                id: id.clone(),
                exec_id: exec_id.clone(),
                pipes: std::mem::take(&mut pipes),
            },
            _ => WorkerKind::Plain,
        };
        let (result_r, result_w) = sys::pipe().map_err(|e| format!("pipe: {e}"))?;
        // SAFETY: the zygote is single-threaded, so the child may run arbitrary code.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                drop(result_r);
                drop(kind);
                self.sock = None;
                worker::run(request, stdio, seccomp, result_w)
            }
            Ok(ForkResult::Parent { child }) => {
                drop(result_w);
                drop(stdio);
                let pidfd = sys::pidfd_open(child.as_raw())
                    .map_err(|e| format!("pidfd_open worker {child}: {e}"))?;
                self.workers.push(Worker {
                    seq,
                    pid: child.as_raw(),
                    pidfd,
                    result_pipe: Some(result_r),
                    output: Vec::new(),
                    exit: None,
                    kind,
                });
                Ok(())
            }
            Err(e) => Err(format!("fork worker: {e}")),
        }
    }

    /// Drains a reaped worker's result. The result is not read to end-of-file: the
    /// container init inherits the pipe's write end and keeps it open until it execs, so
    /// EOF would only come at `start`. The worker wrote everything before exiting.
    fn read_worker_output(w: &mut Worker) {
        let Some(pipe) = w.result_pipe.take() else {
            return;
        };
        let _ = nix::fcntl::fcntl(
            pipe.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        );
        let mut file = std::fs::File::from(pipe);
        let mut chunk = [0u8; 4096];
        loop {
            match file.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => w.output.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn reap_worker(&mut self, i: usize) {
        if let Some(w) = self.workers.get_mut(i) {
            match sys::reap_pidfd(&w.pidfd) {
                Ok(Some(status)) => {
                    w.exit = Some(status);
                    Self::read_worker_output(w);
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(pid = w.pid, %err, "reaping worker failed");
                    w.exit = Some(WireExit::Code(-1));
                    Self::read_worker_output(w);
                }
            }
        }
    }

    /// Replies for every worker whose result is complete and that has been reaped.
    fn finish_workers(&mut self) {
        let mut i = 0;
        while i < self.workers.len() {
            let done = self.workers[i].result_pipe.is_none() && self.workers[i].exit.is_some();
            if !done {
                i += 1;
                continue;
            }
            let w = self.workers.swap_remove(i);
            self.finish_worker(w);
        }
    }

    fn finish_worker(&mut self, w: Worker) {
        let result = serde_json::from_slice::<WorkerResult>(&w.output).unwrap_or_else(|_| {
            WorkerResult::Err {
                message: format!("worker {} died without a result ({:?})", w.pid, w.exit),
            }
        });
        let pid = match result {
            WorkerResult::Err { message } => {
                self.reply(w.seq, Reply::Failed { message }, &[]);
                return;
            }
            WorkerResult::Ok { pid } => pid,
        };
        match (w.kind, pid) {
            (WorkerKind::Plain, _) => self.reply(w.seq, Reply::Done, &[]),
            (WorkerKind::Create { id, pipes }, Some(pid)) => {
                let start_time = sys::process_start_time(pid).unwrap_or(0);
                match self.watch(id, None, pid, &pipes) {
                    Ok(()) => {
                        self.reply(w.seq, Reply::Created { pid, start_time }, &raw_fds(&pipes))
                    }
                    Err(message) => self.reply(w.seq, Reply::Failed { message }, &[]),
                }
            }
            (WorkerKind::Exec { id, exec_id, pipes }, Some(pid)) => {
                match self.watch(id, Some(exec_id), pid, &pipes) {
                    Ok(()) => self.reply(w.seq, Reply::Execd { pid }, &raw_fds(&pipes)),
                    Err(message) => self.reply(w.seq, Reply::Failed { message }, &[]),
                }
            }
            (_, None) => self.reply(
                w.seq,
                Reply::Failed {
                    message: "worker reported no pid".into(),
                },
                &[],
            ),
        }
    }

    fn watch(
        &mut self,
        id: String,
        exec_id: Option<String>,
        pid: i32,
        pipes: &[OwnedFd],
    ) -> Result<(), String> {
        let pidfd = sys::pidfd_open(pid).map_err(|e| format!("pidfd_open {pid}: {e}"))?;
        let held = pipes
            .iter()
            .map(OwnedFd::try_clone)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("dup log pipe: {e}"))?;
        self.watched.push(Watched {
            id,
            exec_id,
            pid,
            pidfd,
            _held_pipes: held,
        });
        Ok(())
    }

    fn reap_watched(&mut self, i: usize) {
        let Some(w) = self.watched.get_mut(i) else {
            return;
        };
        let status = match sys::reap_pidfd(&w.pidfd) {
            Ok(Some(status)) => status,
            Ok(None) => return,
            // ECHILD: an adopted process that is not our child; its code is unknowable.
            Err(err) => {
                tracing::debug!(pid = w.pid, %err, "watched process ended; status unknown");
                WireExit::Signal(0)
            }
        };
        let event = Event::Exited {
            id: w.id.clone(),
            exec_id: w.exec_id.clone(),
            pid: w.pid,
            status,
            at_unix_nanos: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        };
        w.pid = 0; // removed after this round
        if w.exec_id.is_none() {
            self.record_exit(&event);
        }
        self.send(&Inbound::Event(event), &[]);
    }

    fn record_exit(&self, event: &Event) {
        let (Some(dir), Event::Exited { id, .. }) = (&self.exit_dir, event) else {
            return;
        };
        if let Err(err) = super::exits::write(dir, id, event) {
            tracing::error!(container_id = %id, %err, "recording exit failed");
        }
    }
}

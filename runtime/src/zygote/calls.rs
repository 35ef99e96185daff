//! Requests the zygote runs in a forked worker (create, start, delete, exec, namespaces):
//! forking the worker, collecting its result, and replying, or, when the client that asked
//! is gone, cleaning up what the worker made.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::unistd::{fork, ForkResult};

use super::protocol::{raw_fds, Reply, Request, WireExit};
use super::server::Server;
use super::sys;
use super::worker::{self, Stdio, WorkerResult};

/// A worker running one request.
pub(super) struct Worker {
    pub(super) seq: u64,
    /// The connection the request came from (see `Server::generation`).
    pub(super) generation: u64,
    pub(super) pid: i32,
    pub(super) pidfd: OwnedFd,
    result_pipe: Option<OwnedFd>,
    output: Vec<u8>,
    pub(super) exit: Option<WireExit>,
    kind: WorkerKind,
}

/// What to do with a worker's success.
enum WorkerKind {
    /// Watch the new container init; keep and hand out these log pipe read ends.
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

impl Server {
    pub(super) fn spawn_worker(&mut self, seq: u64, request: Request) -> Result<(), String> {
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
                self.logs.clear();
                // The supervisor blocks its signals for its signalfd; the mask is inherited
                // over fork and exec, and containers must get their signals.
                sys::unblock_all_signals();
                // Rust ignores SIGPIPE before `main`; an ignored disposition survives exec,
                // and containers must get the default one.
                // SAFETY: resetting a disposition in a single-threaded child.
                unsafe {
                    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                }
                // Containers never belong to the terminal's process group: a Ctrl-C meant
                // for `ironlet run` must not reach them.
                let _ = nix::unistd::setsid();
                worker::run(request, stdio, seccomp, result_w)
            }
            Ok(ForkResult::Parent { child }) => {
                drop(result_w);
                drop(stdio);
                let pidfd = sys::pidfd_open(child.as_raw())
                    .map_err(|e| format!("pidfd_open worker {child}: {e}"))?;
                self.workers.push(Worker {
                    seq,
                    generation: self.generation,
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

    pub(super) fn reap_worker(&mut self, i: usize) {
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
    pub(super) fn finish_workers(&mut self) {
        let mut i = 0;
        while i < self.workers.len() {
            let done = self.workers[i].result_pipe.is_none() && self.workers[i].exit.is_some();
            if !done {
                i += 1;
                continue;
            }
            let w = self.workers.swap_remove(i);
            if w.generation == self.generation {
                self.finish_worker(w);
            } else {
                self.finish_orphaned_worker(w);
            }
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
                match self.watch(id.clone(), None, pid, Vec::new()) {
                    Ok(()) => {
                        let fds = raw_fds(&pipes);
                        self.reply(w.seq, Reply::Created { pid, start_time }, &fds);
                        let mut pipes = pipes.into_iter();
                        if let (Some(out), Some(err)) = (pipes.next(), pipes.next()) {
                            self.logs.insert(id, [out, err]);
                        }
                    }
                    Err(message) => self.reply(w.seq, Reply::Failed { message }, &[]),
                }
            }
            (WorkerKind::Exec { id, exec_id, pipes }, Some(pid)) => {
                let fds = raw_fds(&pipes);
                match self.watch(id, Some(exec_id), pid, pipes) {
                    Ok(()) => self.reply(w.seq, Reply::Execd { pid }, &fds),
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

    /// The client that asked is gone: a container it created never ran user code and an
    /// exec nobody reads is useless, so both are killed (and still reaped). The next client
    /// rolls back the container's files from its record.
    fn finish_orphaned_worker(&mut self, w: Worker) {
        let Ok(WorkerResult::Ok { pid: Some(pid) }) =
            serde_json::from_slice::<WorkerResult>(&w.output)
        else {
            return;
        };
        let (id, exec_id) = match w.kind {
            WorkerKind::Create { id, .. } => (id, None),
            WorkerKind::Exec { id, exec_id, .. } => (id, Some(exec_id)),
            WorkerKind::Plain => return,
        };
        tracing::info!(container_id = %id, ?exec_id, pid, "killing a process created for a client that is gone");
        match self.watch(id, exec_id, pid, Vec::new()) {
            Ok(()) => {
                if let Some(watched) = self.watched.last() {
                    let _ = sys::pidfd_send_signal(&watched.pidfd, libc::SIGKILL);
                }
            }
            Err(message) => tracing::warn!(pid, %message, "cannot watch an orphaned process"),
        }
    }
}

//! Requests the zygote runs in a forked worker (create, start, delete, exec, namespaces):
//! forking the worker, collecting its result, and replying, or, when the client that asked
//! is gone, cleaning up what the worker made.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::unistd::{fork, ForkResult};

use super::protocol::{raw_fds, Reply, Request, WireExit};
use super::server::{HeldStdio, Server};
use super::sys;
use super::worker::{self, Stdio, WorkerResult};

/// A worker running one request.
pub(super) struct Worker {
    pub(super) seq: u64,
    /// The connection the request came from (see `Server::generation`).
    pub(super) generation: u64,
    pub(super) pid: i32,
    pub(super) pidfd: OwnedFd,
    /// Open until the whole result is in (see `worker::RESULT_END`) or the worker is reaped.
    pub(super) result_pipe: Option<OwnedFd>,
    output: Vec<u8>,
    pub(super) exit: Option<WireExit>,
    /// Whether the client has had its reply; the worker stays listed until reaped.
    replied: bool,
    kind: WorkerKind,
}

/// What to do with a worker's success.
enum WorkerKind {
    /// Watch the new container init; keep and hand out these log pipe read ends and its
    /// input (stdin write end or pty master).
    Create {
        id: String,
        pipes: Vec<OwnedFd>,
        input: Option<OwnedFd>,
        /// With a tty: the stdout pipe's write end, which the relay fills from the master.
        relay_pipe: Option<OwnedFd>,
    },
    Exec {
        id: String,
        exec_id: String,
        pipes: Vec<OwnedFd>,
        /// The write end of the process's stdin, handed to the client (never kept: the
        /// process sees end-of-file once the client closes it).
        stdin: Option<OwnedFd>,
    },
    /// Watch the pod namespace holder; it counts as started (never killed as unstarted).
    Holder {
        id: String,
    },
    Plain,
}

impl Server {
    pub(super) fn spawn_worker(&mut self, seq: u64, request: Request) -> Result<(), String> {
        let wants_stdio = matches!(request, Request::Create { .. } | Request::Exec { .. });
        // Compiled here, once per profile; the forked worker inherits the program.
        let seccomp = match &request {
            Request::Create {
                bundle, state_root, ..
            }
            | Request::Exec {
                bundle, state_root, ..
            } => self.filters.for_bundle(
                bundle,
                super::seccomp::disk_cache_dir(state_root).as_deref(),
                matches!(request, Request::Exec { .. }),
            )?,
            _ => None,
        };
        let (mut pipes, stdio, input, relay_pipe) = if wants_stdio {
            // An exec's terminal comes from the container's devpts, reached through its
            // init process.
            let container_pid = match &request {
                Request::Exec {
                    id,
                    tty: true,
                    state_root,
                    ..
                } => self
                    .watched
                    .iter()
                    .find(|w| w.id == *id && w.exec_id.is_none() && w.pid != 0)
                    .map(|w| w.pid)
                    // A container another zygote created (`ctr exec`): its saved state.
                    .or_else(|| {
                        worker::load(state_root, id)
                            .ok()
                            .and_then(|c| c.pid())
                            .map(|p| p.as_raw())
                    }),
                _ => None,
            };
            stdio_for(&request, container_pid)?
        } else {
            (Vec::new(), None, None, None)
        };
        let kind = match &request {
            Request::Create { id, .. } => WorkerKind::Create {
                id: id.clone(),
                pipes: std::mem::take(&mut pipes),
                input,
                relay_pipe,
            },
            Request::Exec { id, exec_id, .. } => WorkerKind::Exec {
                id: id.clone(),
                exec_id: exec_id.clone(),
                pipes: std::mem::take(&mut pipes),
                stdin: input,
            },
            Request::CreatePodNetwork { id, .. } => WorkerKind::Holder { id: id.clone() },
            _ => WorkerKind::Plain,
        };
        // Made (or checked against the root's bind) here, so the worker inherits it.
        let with_template = match &request {
            Request::Create {
                pod_mounts_root: Some(root),
                ..
            } => {
                self.mount_template =
                    super::pod_mounts::MountTemplate::for_root(self.mount_template.take(), root);
                true
            }
            _ => false,
        };
        let (result_r, result_w) = sys::pipe().map_err(|e| format!("pipe: {e}"))?;
        // Read as it arrives, from the poll loop.
        nix::fcntl::fcntl(
            result_r.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(|e| format!("result pipe: {e}"))?;
        // SAFETY: the zygote is single-threaded, so the child may run arbitrary code.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                drop(result_r);
                drop(kind);
                let mount_template = self
                    .mount_template
                    .take()
                    .filter(|_| with_template)
                    .and_then(super::pod_mounts::MountTemplate::into_ns);
                self.forget_in_child();
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
                worker::run(request, stdio, seccomp, result_w, mount_template)
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
                    replied: false,
                    kind,
                });
                Ok(())
            }
            Err(e) => Err(format!("fork worker: {e}")),
        }
    }

    /// Reads what the worker has written so far, without blocking. The pipe is not read to
    /// end-of-file: the container init inherits its write end and keeps it open until it
    /// execs, so EOF would only come at `start`. Once the result line is whole, or the
    /// worker is gone (and wrote everything it ever will), the pipe is closed.
    fn read_worker_output(w: &mut Worker) {
        let Some(pipe) = w.result_pipe.as_ref() else {
            return;
        };
        let mut chunk = [0u8; 4096];
        let mut ended = false;
        loop {
            match nix::unistd::read(pipe.as_raw_fd(), &mut chunk) {
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(n) => w.output.extend_from_slice(&chunk[..n]),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        if ended || w.exit.is_some() || w.output.contains(&worker::RESULT_END) {
            w.result_pipe = None;
        }
    }

    /// The worker's result pipe is readable.
    pub(super) fn read_worker(&mut self, i: usize) {
        if let Some(w) = self.workers.get_mut(i) {
            Self::read_worker_output(w);
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

    /// Replies for every worker whose result is whole, without waiting for it to finish
    /// exiting (its teardown overlaps the client's next step); drops workers that are both
    /// answered and reaped, and lets the zygote reap what they left to it.
    pub(super) fn finish_workers(&mut self) {
        for i in 0..self.workers.len() {
            let w = &mut self.workers[i];
            if w.replied || w.result_pipe.is_some() {
                continue;
            }
            w.replied = true;
            let (generation, seq, pid, exit) = (w.generation, w.seq, w.pid, w.exit.is_some());
            let output = std::mem::take(&mut w.output);
            let kind = std::mem::replace(&mut w.kind, WorkerKind::Plain);
            let parent = (!exit).then_some(pid);
            if generation == self.generation {
                self.finish_worker(seq, pid, output, kind, parent);
            } else {
                self.finish_orphaned_worker(output, kind, parent);
            }
        }
        let mut i = 0;
        let mut any_gone = false;
        while i < self.workers.len() {
            if self.workers[i].replied && self.workers[i].exit.is_some() {
                let w = self.workers.swap_remove(i);
                self.worker_gone(w.pid);
                any_gone = true;
            } else {
                i += 1;
            }
        }
        // A worker's end is when what libcontainer did not reap becomes ours.
        if any_gone {
            // A set: on a full node every child is a watched container, checked one by one.
            let known: std::collections::HashSet<i32> = (self.workers.iter().map(|w| w.pid))
                .chain(self.watched.iter().map(|w| w.pid))
                .collect();
            sys::reap_libcontainer_leftovers(|pid| known.contains(&pid));
        }
    }

    /// `parent`: the worker, if still alive; what it created is its child until it exits.
    fn finish_worker(
        &mut self,
        seq: u64,
        worker_pid: i32,
        output: Vec<u8>,
        kind: WorkerKind,
        parent: Option<i32>,
    ) {
        let result =
            serde_json::from_slice::<WorkerResult>(&output).unwrap_or_else(|_| WorkerResult::Err {
                message: format!("worker {worker_pid} ended without a result"),
            });
        let pid = match result {
            WorkerResult::Err { message } => {
                self.reply(seq, Reply::Failed { message }, &[]);
                return;
            }
            WorkerResult::Ok { pid } => pid,
        };
        match (kind, pid) {
            (WorkerKind::Plain, _) => self.reply(seq, Reply::Done, &[]),
            (
                WorkerKind::Create {
                    id,
                    pipes,
                    input,
                    relay_pipe,
                },
                Some(pid),
            ) => {
                let start_time = sys::process_start_time(pid).unwrap_or(0);
                let relay = match (relay_pipe, input.as_ref().map(OwnedFd::try_clone)) {
                    (Some(pipe), Some(Ok(master))) => {
                        match super::tty::Relay::new(id.clone(), master, pipe) {
                            Ok(relay) => Some(relay),
                            Err(message) => {
                                self.reply(seq, Reply::Failed { message }, &[]);
                                return;
                            }
                        }
                    }
                    _ => None,
                };
                match self.watch(id.clone(), None, pid, Vec::new(), parent) {
                    Ok(()) => {
                        let mut fds = raw_fds(&pipes);
                        fds.extend(input.as_ref().map(AsRawFd::as_raw_fd));
                        self.reply(seq, Reply::Created { pid, start_time }, &fds);
                        let mut pipes = pipes.into_iter();
                        if let (Some(out), Some(err)) = (pipes.next(), pipes.next()) {
                            self.logs.insert(id, HeldStdio { out, err, input });
                        }
                        self.relays.extend(relay);
                    }
                    Err(message) => self.reply(seq, Reply::Failed { message }, &[]),
                }
            }
            (WorkerKind::Holder { id }, Some(pid)) => {
                let start_time = sys::process_start_time(pid).unwrap_or(0);
                match self.watch(id.clone(), None, pid, Vec::new(), parent) {
                    Ok(()) => {
                        self.started(&id);
                        self.reply(seq, Reply::Created { pid, start_time }, &[]);
                    }
                    Err(message) => self.reply(seq, Reply::Failed { message }, &[]),
                }
            }
            (
                WorkerKind::Exec {
                    id,
                    exec_id,
                    pipes,
                    stdin,
                },
                Some(pid),
            ) => {
                let mut fds = raw_fds(&pipes);
                fds.extend(stdin.as_ref().map(AsRawFd::as_raw_fd));
                match self.watch(id, Some(exec_id), pid, pipes, parent) {
                    Ok(()) => self.reply(seq, Reply::Execd { pid }, &fds),
                    Err(message) => self.reply(seq, Reply::Failed { message }, &[]),
                }
                // `stdin` closes here: the client holds the only write end now.
            }
            (_, None) => self.reply(
                seq,
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
    fn finish_orphaned_worker(&mut self, output: Vec<u8>, kind: WorkerKind, parent: Option<i32>) {
        let Ok(WorkerResult::Ok { pid: Some(pid) }) =
            serde_json::from_slice::<WorkerResult>(&output)
        else {
            return;
        };
        let (id, exec_id) = match kind {
            WorkerKind::Create { id, .. } | WorkerKind::Holder { id } => (id, None),
            WorkerKind::Exec { id, exec_id, .. } => (id, Some(exec_id)),
            WorkerKind::Plain => return,
        };
        tracing::info!(container_id = %id, ?exec_id, pid, "killing a process created for a client that is gone");
        match self.watch(id, exec_id, pid, Vec::new(), parent) {
            Ok(()) => {
                if let Some(watched) = self.watched.last() {
                    let _ = sys::pidfd_send_signal(&watched.pidfd, libc::SIGKILL);
                }
            }
            Err(message) => tracing::warn!(pid, %message, "cannot watch an orphaned process"),
        }
    }
}

/// The descriptors of a create or exec: the pipes the zygote reads (stdout and stderr read
/// ends, or for an exec with a tty the pty master and an empty stderr), what the worker
/// hands to the process, its input (stdin write end or pty master) and, for a container
/// with a tty, the stdout pipe's write end its relay fills.
type StdioPlan = (
    Vec<OwnedFd>,
    Option<Stdio>,
    Option<OwnedFd>,
    Option<OwnedFd>,
);

fn stdio_for(request: &Request, container_pid: Option<i32>) -> Result<StdioPlan, String> {
    let (stdin, tty, exec) = match request {
        Request::Create { stdin, tty, .. } => (*stdin, *tty, false),
        Request::Exec { stdin, tty, .. } => (*stdin, *tty, true),
        _ => (false, false, false),
    };
    let pipe = || sys::pipe().map_err(|e| format!("pipe: {e}"));
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| format!("dup: {e}"));
    if tty {
        let (master, slave) = match container_pid {
            Some(pid) => super::tty::open_pair_in_container(pid)?,
            None => super::tty::open_pair()?,
        };
        let stdio = Stdio {
            stdin: Some(dup(&slave)?),
            stdout: dup(&slave)?,
            stderr: slave,
            terminal: true,
        };
        // Everything goes to the terminal: stderr's pipe ends at once.
        let (err_r, _err_w) = pipe()?;
        if exec {
            let input = if stdin { Some(dup(&master)?) } else { None };
            return Ok((vec![master, err_r], Some(stdio), input, None));
        }
        let (out_r, out_w) = pipe()?;
        sys::grow_pipe(&out_r);
        return Ok((vec![out_r, err_r], Some(stdio), Some(master), Some(out_w)));
    }
    let (stdin_r, stdin_w) = if stdin {
        let (r, w) = pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    sys::grow_pipe(&out_r);
    sys::grow_pipe(&err_r);
    let stdio = Stdio {
        stdin: stdin_r,
        stdout: out_w,
        stderr: err_w,
        terminal: false,
    };
    Ok((vec![out_r, err_r], Some(stdio), stdin_w, None))
}

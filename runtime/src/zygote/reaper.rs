//! The processes the zygote reaps (container inits and exec processes), the log pipes it
//! holds for containers, and what it tells a client about both.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::SystemTime;

use super::protocol::{Event, Hello, Inbound, LiveProcess, Reply, WireExit, PROTOCOL_VERSION};
use super::server::Server;
use super::sys;

/// A container init or exec process the zygote reaps.
pub(super) struct Watched {
    pub(super) id: String,
    pub(super) exec_id: Option<String>,
    /// 0 once reaped (the entry is dropped at the end of the poll round).
    pub(super) pid: i32,
    start_time: u64,
    pub(super) pidfd: OwnedFd,
    /// The zygote's own read ends of an exec process's output pipes, so the process never
    /// gets SIGPIPE while it runs. (Container log pipes live in `Server::logs`.)
    _held_pipes: Vec<OwnedFd>,
    /// The worker whose child this process still is (the zygote replies before a worker
    /// has finished exiting). Until the worker is reaped and the process reparented to the
    /// zygote, its pidfd is not polled: the zygote could not reap it yet.
    pub(super) reparent_from: Option<i32>,
    /// A container init whose `start` has not come yet (it waits on its notify socket and
    /// has run no user code). Exec processes and adopted containers run already.
    pub(super) awaiting_start: bool,
}

impl Server {
    pub(super) fn watch(
        &mut self,
        id: String,
        exec_id: Option<String>,
        pid: i32,
        held_pipes: Vec<OwnedFd>,
        reparent_from: Option<i32>,
    ) -> Result<(), String> {
        let exec_id_is_none = exec_id.is_none();
        let pidfd = sys::pidfd_open(pid).map_err(|e| format!("pidfd_open {pid}: {e}"))?;
        let start_time = sys::process_start_time(pid).unwrap_or(0);
        self.watched.push(Watched {
            id,
            exec_id,
            pid,
            start_time,
            pidfd,
            _held_pipes: held_pipes,
            reparent_from,
            awaiting_start: exec_id_is_none,
        });
        Ok(())
    }

    /// `start` reached the container: from now on it runs user code.
    pub(super) fn started(&mut self, id: &str) {
        for w in &mut self.watched {
            if w.id == id && w.exec_id.is_none() {
                w.awaiting_start = false;
            }
        }
    }

    /// The private client is gone: no one will ever start the containers it created, whose
    /// inits would otherwise wait on their notify sockets, and keep this zygote, forever.
    /// They never ran user code, so they are killed (and reaped as usual).
    pub(super) fn kill_unstarted(&mut self) {
        for w in self
            .watched
            .iter()
            .filter(|w| w.awaiting_start && w.pid != 0)
        {
            tracing::info!(container_id = %w.id, pid = w.pid, "killing a container its client created but never started");
            let _ = sys::pidfd_send_signal(&w.pidfd, libc::SIGKILL);
        }
    }

    /// A worker was reaped: what it created is the zygote's child now.
    pub(super) fn worker_gone(&mut self, worker_pid: i32) {
        for w in &mut self.watched {
            if w.reparent_from == Some(worker_pid) {
                w.reparent_from = None;
            }
        }
    }

    pub(super) fn kill(&self, id: &str, signal: i32) -> Reply {
        match self
            .watched
            .iter()
            .find(|w| w.id == id && w.exec_id.is_none() && w.pid != 0)
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

    /// Watches a container init that is not (or no longer) ours to reap, e.g. after the
    /// supervisor itself restarted: its end is noticed, its status is not knowable.
    pub(super) fn adopt(&mut self, id: String, pid: i32, start_time: u64) -> Reply {
        if self
            .watched
            .iter()
            .any(|w| w.id == id && w.exec_id.is_none() && w.pid != 0)
        {
            return Reply::Done;
        }
        let pidfd = match sys::pidfd_open(pid) {
            Ok(fd) => fd,
            Err(e) => {
                return Reply::Failed {
                    message: format!("process {pid} of {id} is gone: {e}"),
                }
            }
        };
        // Checked after opening the pidfd: from here on the pid cannot be reused under us.
        if sys::process_start_time(pid).ok() != Some(start_time) {
            return Reply::Failed {
                message: format!("process {pid} of {id} is gone"),
            };
        }
        self.watched.push(Watched {
            id,
            exec_id: None,
            pid,
            start_time,
            pidfd,
            _held_pipes: Vec::new(),
            reparent_from: None,
            awaiting_start: false,
        });
        Reply::Done
    }

    pub(super) fn take_logs(&mut self, seq: u64, id: &str) {
        let copies = self.logs.get(id).map(|held| {
            [Some(&held.out), Some(&held.err), held.input.as_ref()]
                .into_iter()
                .flatten()
                .map(OwnedFd::try_clone)
                .collect::<std::io::Result<Vec<OwnedFd>>>()
        });
        match copies {
            Some(Ok(fds)) => {
                let raw: Vec<_> = fds.iter().map(AsRawFd::as_raw_fd).collect();
                self.reply(seq, Reply::Logs, &raw);
            }
            Some(Err(e)) => self.reply(
                seq,
                Reply::Failed {
                    message: format!("dup log pipes of {id}: {e}"),
                },
                &[],
            ),
            None => self.reply(
                seq,
                Reply::Failed {
                    message: format!("no log pipes held for {id}"),
                },
                &[],
            ),
        }
    }

    pub(super) fn hello(&self) -> Hello {
        let mut held_logs: Vec<String> = self.logs.keys().cloned().collect();
        held_logs.sort();
        Hello {
            protocol: PROTOCOL_VERSION,
            supervised: self.is_supervisor(),
            live: self
                .watched
                .iter()
                .filter(|w| w.exec_id.is_none() && w.pid != 0)
                .map(|w| LiveProcess {
                    id: w.id.clone(),
                    pid: w.pid,
                    start_time: w.start_time,
                })
                .collect(),
            held_logs,
        }
    }

    pub(super) fn reap_watched(&mut self, i: usize) {
        let Some(w) = self.watched.get_mut(i) else {
            return;
        };
        if w.pid == 0 {
            return;
        }
        let status = match sys::reap_pidfd(&w.pidfd) {
            Ok(Some(status)) => status,
            Ok(None) => return,
            // ECHILD: an adopted process that is not our child; its code is unknowable.
            Err(err) => {
                tracing::debug!(pid = w.pid, %err, "watched process ended; status unknown");
                WireExit::Unknown
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
                   // A pod namespace holder's end is neither recorded nor sent: its sandbox stops it
                   // and waits on its pid (an event nobody reads would make the client's close a reset).
        if w.id.ends_with(super::holder::HOLDER_ID_SUFFIX) {
            return;
        }
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

//! The supervisor's driver: it owns the agent process (fork + exec, its pidfd), the
//! signalfd, and feeds what happens into the state machine of `agent.rs`, performing the
//! effects. The zygote loop polls the descriptors returned by [`Supervisor::poll_fds`].

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::unistd::{fork, ForkResult};

use super::agent::{self, AgentState, Backoff, Effect, Input, Timing};
use super::{SupervisorConfig, SupervisorError, NODE_SHUTDOWN_ENV, SUPERVISOR_FD_ENV};
use crate::zygote::sys;

/// A descriptor of the supervisor in the zygote's poll set.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SupervisorSource {
    Signals,
    AgentExit,
}

/// What the zygote loop must do after a tick.
#[derive(Debug, Default)]
pub(crate) struct TickOutcome {
    /// The zygote's end of a newly started agent's connection.
    pub(crate) connection: Option<OwnedFd>,
    /// The supervisor is done: leave the loop and exit.
    pub(crate) exit: bool,
}

/// The agent's supervisor; see the module docs of `crate::supervisor`.
pub(crate) struct Supervisor {
    config: SupervisorConfig,
    state: AgentState,
    backoff: Backoff,
    timing: Timing,
    signals: SignalFd,
    agent_pidfd: Option<OwnedFd>,
    connection: Option<OwnedFd>,
    exit: bool,
    /// SIGPWR was received: the node is shutting down (told to every agent from then on).
    node_shutdown: bool,
    /// The data root's lock, held for the supervisor's life (see `lock_root`).
    _lock: std::fs::File,
}

/// The signals the supervisor takes through its signalfd.
fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGPWR,
    ] {
        set.add(s);
    }
    set
}

impl Supervisor {
    /// Blocks the handled signals (they arrive through the signalfd) and schedules the
    /// first agent start.
    pub(crate) fn new(
        config: SupervisorConfig,
        lock: std::fs::File,
    ) -> Result<Self, SupervisorError> {
        let mask = handled_signals();
        mask.thread_block()
            .map_err(|e| SupervisorError::Signals(e.into()))?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| SupervisorError::Signals(e.into()))?;
        Ok(Self {
            backoff: Backoff::new(config.backoff),
            timing: Timing {
                stop_grace: config.stop_grace,
            },
            config,
            state: AgentState::BackingOff { at: Instant::now() },
            signals,
            agent_pidfd: None,
            connection: None,
            exit: false,
            node_shutdown: false,
            _lock: lock,
        })
    }

    pub(crate) fn poll_fds(&self) -> Vec<(SupervisorSource, BorrowedFd<'_>)> {
        let mut fds = vec![(SupervisorSource::Signals, self.signals.as_fd())];
        if let Some(pidfd) = &self.agent_pidfd {
            fds.push((SupervisorSource::AgentExit, pidfd.as_fd()));
        }
        fds
    }

    /// How long the zygote loop may sleep.
    pub(crate) fn timeout(&self, now: Instant) -> Option<Duration> {
        if self.connection.is_some() || self.exit {
            return Some(Duration::ZERO);
        }
        agent::next_deadline(self.state).map(|at| at.saturating_duration_since(now))
    }

    /// Advances time; returns a new connection or the order to exit.
    pub(crate) fn tick(&mut self, now: Instant) -> TickOutcome {
        self.handle(Input::Tick, now);
        TickOutcome {
            connection: self.connection.take(),
            exit: self.exit,
        }
    }

    pub(crate) fn on_ready(&mut self, source: SupervisorSource, now: Instant) {
        match source {
            SupervisorSource::Signals => {
                while let Ok(Some(info)) = self.signals.read_signal() {
                    let input = match Signal::try_from(info.ssi_signo as i32) {
                        Ok(Signal::SIGHUP) => {
                            tracing::info!(
                                binary = %self.config.agent_binary.display(),
                                "SIGHUP: restarting the agent from the binary on disk"
                            );
                            Input::Reload
                        }
                        Ok(Signal::SIGPWR) => {
                            self.power_fail();
                            continue;
                        }
                        Ok(signal) => {
                            tracing::info!(%signal, "stopping the agent; containers keep running");
                            Input::Terminate
                        }
                        Err(_) => continue,
                    };
                    self.handle(input, now);
                }
            }
            SupervisorSource::AgentExit => {
                let Some(pidfd) = &self.agent_pidfd else {
                    return;
                };
                let status = match sys::reap_pidfd(pidfd) {
                    Ok(Some(status)) => status,
                    Ok(None) => return,
                    Err(err) => {
                        tracing::warn!(%err, "reaping the agent failed");
                        crate::zygote::WireExit::Unknown
                    }
                };
                self.agent_pidfd = None;
                self.handle(Input::Exited { status }, now);
            }
        }
    }

    /// SIGPWR: the node is shutting down. The running agent gets SIGPWR (its graceful node
    /// shutdown stops the pods); agents started later get `IRONLET_NODE_SHUTDOWN=1`.
    /// Containers and the supervisor are otherwise left alone: init stops them next.
    fn power_fail(&mut self) {
        self.node_shutdown = true;
        match &self.agent_pidfd {
            Some(pidfd) => {
                tracing::info!("SIGPWR: the node is shutting down; telling the agent");
                if let Err(err) = sys::pidfd_send_signal(pidfd, libc::SIGPWR) {
                    tracing::warn!(%err, "passing SIGPWR to the agent failed");
                }
            }
            None => tracing::info!(
                "SIGPWR: the node is shutting down; the next agent is told at its start"
            ),
        }
    }

    /// Feeds one input to the state machine and performs its effects; a start reports back
    /// as a further input.
    fn handle(&mut self, input: Input, now: Instant) {
        let mut next = Some(input);
        while let Some(input) = next.take() {
            let (state, effects) =
                agent::step(self.state, input, now, &mut self.backoff, self.timing);
            self.state = state;
            for effect in effects {
                match effect {
                    Effect::Start => next = Some(self.start_agent()),
                    Effect::Signal(signal) => {
                        if let Some(pidfd) = &self.agent_pidfd {
                            if let Err(err) = sys::pidfd_send_signal(pidfd, signal) {
                                tracing::warn!(signal, %err, "signalling the agent failed");
                            }
                        }
                    }
                    Effect::Exit => self.exit = true,
                }
            }
        }
    }

    fn start_agent(&mut self) -> Input {
        match spawn_agent(&self.config, self.node_shutdown) {
            Ok((pid, pidfd, connection)) => {
                tracing::info!(pid, binary = %self.config.agent_binary.display(), "agent started");
                self.agent_pidfd = Some(pidfd);
                self.connection = Some(connection);
                Input::Started { pid }
            }
            Err(err) => {
                tracing::error!(%err, binary = %self.config.agent_binary.display(), "starting the agent failed");
                Input::StartFailed
            }
        }
    }
}

fn cstring(bytes: &[u8]) -> Result<CString, SupervisorError> {
    CString::new(bytes)
        .map_err(|_| SupervisorError::Argument(String::from_utf8_lossy(bytes).into()))
}

/// Forks and execs the agent binary with the supervisor's arguments and its end of a new
/// socket pair in `IRONLET_SUPERVISOR_FD` (and `IRONLET_NODE_SHUTDOWN=1` after SIGPWR).
/// Returns its pid, pidfd and the supervisor's end.
fn spawn_agent(
    config: &SupervisorConfig,
    node_shutdown: bool,
) -> Result<(i32, OwnedFd, OwnedFd), SupervisorError> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| SupervisorError::Spawn(e.into()))?;
    let fd = theirs.as_raw_fd();
    // Everything the child needs is allocated before the fork.
    let path = cstring(config.agent_binary.as_os_str().as_bytes())?;
    let argv = config
        .agent_args
        .iter()
        .map(|a| cstring(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut env = Vec::new();
    for (key, value) in std::env::vars_os() {
        if key == SUPERVISOR_FD_ENV || key == NODE_SHUTDOWN_ENV {
            continue;
        }
        let mut pair = OsString::from(&key);
        pair.push("=");
        pair.push(&value);
        env.push(cstring(pair.as_bytes())?);
    }
    env.push(cstring(format!("{SUPERVISOR_FD_ENV}={fd}").as_bytes())?);
    if node_shutdown {
        env.push(cstring(format!("{NODE_SHUTDOWN_ENV}=1").as_bytes())?);
    }
    let supervisor_pid = nix::unistd::getpid();
    // SAFETY: the supervisor is single-threaded; the child only execs.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(ours);
            sys::unblock_all_signals();
            // SAFETY: plain syscalls on integers; the descriptor is ours.
            unsafe {
                libc::fcntl(fd, libc::F_SETFD, 0);
                // The agent cannot work without its supervisor: it stops with it.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0);
            }
            if nix::unistd::getppid() != supervisor_pid {
                // SAFETY: leave at once; the supervisor is already gone.
                unsafe { libc::_exit(1) };
            }
            let err = nix::unistd::execve(&path, &argv, &env).err();
            let message = format!("ironlet supervisor: exec {path:?}: {err:?}\n");
            // SAFETY: writing a buffer to stderr, then leaving without atexit handlers.
            unsafe {
                libc::write(2, message.as_ptr().cast(), message.len());
                libc::_exit(127)
            }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(theirs);
            let pidfd = sys::pidfd_open(child.as_raw()).map_err(SupervisorError::Spawn)?;
            Ok((child.as_raw(), pidfd, ours))
        }
        Err(e) => Err(SupervisorError::Spawn(e.into())),
    }
}

//! The agent's life under the supervisor as a state machine: one [`AgentState`] enum and a
//! pure [`step`] function from (state, input, now) to the next state and the effects the
//! driver (`process.rs`) performs. Unit-tested here without any process.
//!
//! ```text
//!            ┌─────────── Reload (SIGHUP) ───────────┐
//!            ▼                                        │
//!  BackingOff ──at──► Starting ──Started──► Running ──┤── Terminate ──► Stopping{Exit}
//!      ▲                  │                    │      └── Reload ─────► Stopping{Restart}
//!      └── StartFailed ───┘                    │                          │
//!      └────────── Exited(abnormal) ───────────┘         Exited ──► Starting (Restart)
//!                                              │                   or Done (Exit)
//!                         Exited(code 0) ──► Done
//! ```
//!
//! An agent that exits with code 0 on its own was stopped on purpose (SIGTERM sent to it
//! directly, e.g. by a service manager): the supervisor stops too. Any other end is a crash:
//! the agent is started again after a back-off of 100 ms doubling up to 10 s, reset once an
//! agent has run for 60 s.

use std::time::{Duration, Instant};

use crate::zygote::WireExit;

/// Where the supervised agent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AgentState {
    /// Waiting until `at` before starting an agent (after a crash, or at start-up).
    BackingOff {
        at: Instant,
    },
    /// A start was requested; the driver reports `Started` or `StartFailed`.
    Starting,
    Running {
        pid: i32,
        since: Instant,
    },
    /// SIGTERM was sent; after the agent's exit comes `then`. Past `kill_at` it gets SIGKILL.
    Stopping {
        pid: i32,
        since: Instant,
        kill_at: Option<Instant>,
        then: AfterStop,
    },
    /// No agent runs and none will: the supervisor exits.
    Done,
}

/// What follows a requested stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterStop {
    /// Start the agent again from the binary on disk (upgrade in place).
    Restart,
    /// Exit the supervisor; containers keep running.
    Exit,
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
    Started {
        pid: i32,
    },
    StartFailed,
    Exited {
        status: WireExit,
    },
    /// SIGTERM or SIGINT to the supervisor.
    Terminate,
    /// SIGHUP to the supervisor.
    Reload,
    /// Time passed.
    Tick,
}

/// What the driver must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Fork and exec a new agent, then report `Started` or `StartFailed`.
    Start,
    /// Signal the running agent (through its pidfd).
    Signal(i32),
    /// Exit the supervisor.
    Exit,
}

/// Restart delays: `initial` doubling up to `max`; back to `initial` once an agent ran for
/// `reset_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    pub initial: Duration,
    pub max: Duration,
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            reset_after: Duration::from_secs(60),
        }
    }
}

/// The back-off's memory: the next delay.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    config: BackoffConfig,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(config: BackoffConfig) -> Self {
        Self {
            config,
            next: config.initial,
        }
    }

    /// The delay before restarting an agent that crashed after running for `uptime`.
    fn delay_after(&mut self, uptime: Duration) -> Duration {
        if uptime >= self.config.reset_after {
            self.next = self.config.initial;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(self.config.max);
        delay
    }
}

/// Timing of [`step`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// How long a stopping agent gets before SIGKILL.
    pub(crate) stop_grace: Duration,
}

/// The next state and the effects, for one input.
pub(crate) fn step(
    state: AgentState,
    input: Input,
    now: Instant,
    backoff: &mut Backoff,
    timing: Timing,
) -> (AgentState, Vec<Effect>) {
    use AgentState as S;
    let stop = |pid: i32, since: Instant, then: AfterStop| {
        (
            S::Stopping {
                pid,
                since,
                kill_at: Some(now + timing.stop_grace),
                then,
            },
            vec![Effect::Signal(libc::SIGTERM)],
        )
    };
    match (state, input) {
        (S::Done, _) => (S::Done, Vec::new()),
        (S::Starting, Input::Started { pid }) => (S::Running { pid, since: now }, Vec::new()),
        (S::Starting, Input::StartFailed) => (
            S::BackingOff {
                at: now + backoff.delay_after(Duration::ZERO),
            },
            Vec::new(),
        ),
        (S::BackingOff { .. } | S::Starting, Input::Terminate) => (S::Done, vec![Effect::Exit]),
        (S::BackingOff { .. }, Input::Reload) => (S::Starting, vec![Effect::Start]),
        (S::BackingOff { at }, Input::Tick) if now >= at => (S::Starting, vec![Effect::Start]),
        (S::Running { since, .. }, Input::Exited { status }) => {
            if status == WireExit::Code(0) {
                tracing::info!("the agent stopped on its own; the supervisor stops too");
                return (S::Done, vec![Effect::Exit]);
            }
            let delay = backoff.delay_after(now.saturating_duration_since(since));
            tracing::warn!(?status, ?delay, "the agent ended abnormally; restarting it");
            (S::BackingOff { at: now + delay }, Vec::new())
        }
        (S::Running { pid, since }, Input::Terminate) => stop(pid, since, AfterStop::Exit),
        (S::Running { pid, since }, Input::Reload) => stop(pid, since, AfterStop::Restart),
        (S::Stopping { then, .. }, Input::Exited { .. }) => match then {
            AfterStop::Exit => (S::Done, vec![Effect::Exit]),
            AfterStop::Restart => (S::Starting, vec![Effect::Start]),
        },
        (
            S::Stopping {
                pid,
                since,
                kill_at,
                ..
            },
            Input::Terminate,
        ) => (
            S::Stopping {
                pid,
                since,
                kill_at,
                then: AfterStop::Exit,
            },
            Vec::new(),
        ),
        (
            S::Stopping {
                pid,
                since,
                kill_at: Some(kill_at),
                then,
            },
            Input::Tick,
        ) if now >= kill_at => {
            tracing::warn!(pid, "the agent did not stop in time; killing it");
            (
                S::Stopping {
                    pid,
                    since,
                    kill_at: None,
                    then,
                },
                vec![Effect::Signal(libc::SIGKILL)],
            )
        }
        (state, _) => (state, Vec::new()),
    }
}

/// How long until `state` needs a `Tick`.
pub(crate) fn next_deadline(state: AgentState) -> Option<Instant> {
    match state {
        AgentState::BackingOff { at } => Some(at),
        AgentState::Stopping { kill_at, .. } => kill_at,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: Timing = Timing {
        stop_grace: Duration::from_secs(10),
    };

    fn run(
        state: AgentState,
        inputs: &[(Input, Instant)],
        backoff: &mut Backoff,
    ) -> (AgentState, Vec<Effect>) {
        let mut state = state;
        let mut all = Vec::new();
        for (input, now) in inputs {
            let (next, effects) = step(state, *input, *now, backoff, TIMING);
            state = next;
            all.extend(effects);
        }
        (state, all)
    }

    #[test]
    fn a_crashing_agent_is_restarted_after_a_doubling_delay_capped_at_ten_seconds() {
        let t0 = Instant::now();
        let mut backoff = Backoff::new(BackoffConfig::default());
        let mut delays = Vec::new();
        let mut now = t0;
        let mut state = AgentState::Running { pid: 7, since: t0 };
        for _ in 0..9 {
            let crash = Input::Exited {
                status: WireExit::Signal(libc::SIGKILL),
            };
            let (next, _) = step(state, crash, now, &mut backoff, TIMING);
            let AgentState::BackingOff { at } = next else {
                panic!("a crash backs off, got {next:?}");
            };
            delays.push(at - now);
            let (early, effects) = step(
                next,
                Input::Tick,
                at - Duration::from_millis(1),
                &mut backoff,
                TIMING,
            );
            assert!(effects.is_empty(), "no start before the delay: {early:?}");
            let (starting, effects) = step(next, Input::Tick, at, &mut backoff, TIMING);
            assert_eq!(effects, vec![Effect::Start]);
            now = at;
            state = step(
                starting,
                Input::Started { pid: 8 },
                now,
                &mut backoff,
                TIMING,
            )
            .0;
        }
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000]);
    }

    #[test]
    fn the_back_off_resets_after_an_agent_ran_for_a_minute() {
        let t0 = Instant::now();
        let mut backoff = Backoff::new(BackoffConfig::default());
        let crash = Input::Exited {
            status: WireExit::Code(1),
        };
        for _ in 0..3 {
            step(
                AgentState::Running { pid: 1, since: t0 },
                crash,
                t0,
                &mut backoff,
                TIMING,
            );
        }
        let later = t0 + Duration::from_secs(61);
        let (state, _) = step(
            AgentState::Running { pid: 1, since: t0 },
            crash,
            later,
            &mut backoff,
            TIMING,
        );
        assert_eq!(
            state,
            AgentState::BackingOff {
                at: later + Duration::from_millis(100)
            }
        );
    }

    #[test]
    fn sighup_stops_the_agent_gracefully_and_starts_it_again_at_once() {
        let t0 = Instant::now();
        let mut backoff = Backoff::new(BackoffConfig::default());
        let (state, effects) = run(
            AgentState::Running { pid: 5, since: t0 },
            &[
                (Input::Reload, t0),
                (
                    Input::Exited {
                        status: WireExit::Code(0),
                    },
                    t0,
                ),
            ],
            &mut backoff,
        );
        assert_eq!(state, AgentState::Starting);
        assert_eq!(effects, vec![Effect::Signal(libc::SIGTERM), Effect::Start]);
    }

    #[test]
    fn sigterm_stops_the_agent_and_then_the_supervisor() {
        let t0 = Instant::now();
        let mut backoff = Backoff::new(BackoffConfig::default());
        let (state, effects) = run(
            AgentState::Running { pid: 5, since: t0 },
            &[
                (Input::Terminate, t0),
                (
                    Input::Exited {
                        status: WireExit::Code(0),
                    },
                    t0,
                ),
            ],
            &mut backoff,
        );
        assert_eq!(state, AgentState::Done);
        assert_eq!(effects, vec![Effect::Signal(libc::SIGTERM), Effect::Exit]);
    }

    #[test]
    fn an_agent_that_ignores_sigterm_gets_sigkill_after_the_grace_period() {
        let t0 = Instant::now();
        let mut backoff = Backoff::new(BackoffConfig::default());
        let (state, effects) = run(
            AgentState::Running { pid: 5, since: t0 },
            &[
                (Input::Terminate, t0),
                (Input::Tick, t0 + Duration::from_secs(5)),
                (Input::Tick, t0 + Duration::from_secs(10)),
                (Input::Tick, t0 + Duration::from_secs(11)),
            ],
            &mut backoff,
        );
        assert_eq!(
            effects,
            vec![Effect::Signal(libc::SIGTERM), Effect::Signal(libc::SIGKILL)]
        );
        assert!(matches!(
            state,
            AgentState::Stopping {
                kill_at: None,
                then: AfterStop::Exit,
                ..
            }
        ));
    }

    #[test]
    fn an_agent_exiting_cleanly_on_its_own_stops_the_supervisor() {
        let t0 = Instant::now();
        let mut backoff = Backoff::new(BackoffConfig::default());
        let (state, effects) = run(
            AgentState::Running { pid: 5, since: t0 },
            &[(
                Input::Exited {
                    status: WireExit::Code(0),
                },
                t0,
            )],
            &mut backoff,
        );
        assert_eq!((state, effects), (AgentState::Done, vec![Effect::Exit]));
    }

    #[test]
    fn sigterm_during_back_off_exits_without_starting_an_agent() {
        let t0 = Instant::now();
        let mut backoff = Backoff::new(BackoffConfig::default());
        let (state, effects) = run(
            AgentState::BackingOff {
                at: t0 + Duration::from_secs(5),
            },
            &[(Input::Terminate, t0)],
            &mut backoff,
        );
        assert_eq!((state, effects), (AgentState::Done, vec![Effect::Exit]));
    }

    #[test]
    fn a_failed_start_backs_off_like_a_crash() {
        let t0 = Instant::now();
        let mut backoff = Backoff::new(BackoffConfig::default());
        let (state, _) = run(
            AgentState::Starting,
            &[(Input::StartFailed, t0)],
            &mut backoff,
        );
        assert_eq!(
            state,
            AgentState::BackingOff {
                at: t0 + Duration::from_millis(100)
            }
        );
        assert_eq!(next_deadline(state), Some(t0 + Duration::from_millis(100)));
    }
}

//! One probe worker: a task probing one kind of probe of one container (one container id)
//! until its job is over or the manager drops it (kubelet's `worker`).
//!
//! ```text
//!  start ── sleep until started_at + initialDelay ── (liveness/readiness: wait for the
//!  startup gate) ── probe, every periodSeconds ──► step ──► publish when a threshold is met
//!                                                    └──► Done: liveness/startup Failure,
//!                                                         startup Success → task ends
//! ```
//!
//! The counting is [`step`], a pure function of the spec, the [`State`] and one outcome;
//! the driver [`Worker::run`] only sleeps, runs the probe and publishes.
//!
//! Current behaviour, differing from kubelet on purpose: the first probe runs exactly at
//! `started_at + initialDelaySeconds` (kubelet only checks the delay on period ticks, so
//! its first probe comes up to one period later), and liveness/readiness probe at once
//! when the startup probe succeeds (kubelet triggers only readiness early).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ironlet_runtime::types::ContainerId;
use ironlet_runtime::Runtime;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

use super::action::Action;
use super::counts::Counted;
use super::handler::run_handler;
use super::manager::ProbeUpdate;
use super::results::{ResultKey, ResultStore};
use super::spec::ProbeSpec;
use super::{ProbeEvent, ProbeKind, ProbeOutcome, ProbeResult, ProbeTarget};

pub(crate) type ProbeFuture<'a> = Pin<Box<dyn Future<Output = ProbeOutcome> + Send + 'a>>;

/// Runs one probe: the seam between the workers and the real actions.
pub(crate) trait RunProbe: Send + Sync {
    fn run<'a>(
        &'a self,
        action: &'a Action,
        target: &'a ProbeTarget,
        timeout: Duration,
    ) -> ProbeFuture<'a>;
}

/// The real prober: [`run_handler`] against the runtime.
pub(crate) struct RuntimeProber {
    pub runtime: Arc<dyn Runtime>,
}

impl RunProbe for RuntimeProber {
    fn run<'a>(
        &'a self,
        action: &'a Action,
        target: &'a ProbeTarget,
        timeout: Duration,
    ) -> ProbeFuture<'a> {
        Box::pin(run_handler(self.runtime.as_ref(), target, action, timeout))
    }
}

/// What a worker remembers between probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Counting a run of equal results; `last` is `None` before the first decided probe.
    Counting { last: Option<ProbeResult>, run: u32 },
    /// The worker's job for this container is over: a liveness or startup probe failed
    /// (the container must be restarted) or a startup probe succeeded.
    Done,
}

impl Default for State {
    fn default() -> Self {
        Self::Counting { last: None, run: 0 }
    }
}

/// Counts one outcome; returns the result to publish (when its threshold is met) and the
/// next state. An `Unknown` outcome (the probe could not run) is discarded, as kubelet does.
pub(crate) fn step(
    spec: &ProbeSpec,
    state: State,
    outcome: &ProbeOutcome,
) -> (Option<ProbeResult>, State) {
    let State::Counting { last, run } = state else {
        return (None, State::Done);
    };
    let result = match outcome {
        ProbeOutcome::Success | ProbeOutcome::Warning(_) => ProbeResult::Success,
        ProbeOutcome::Failure(_) => ProbeResult::Failure,
        ProbeOutcome::Unknown(_) => return (None, state),
    };
    let run = if last == Some(result) {
        run.saturating_add(1)
    } else {
        1
    };
    let counting = State::Counting {
        last: Some(result),
        run,
    };
    let threshold = match result {
        ProbeResult::Success => spec.success_threshold,
        ProbeResult::Failure => spec.failure_threshold,
    };
    if run < threshold {
        return (None, counting);
    }
    let done = matches!(
        (spec.kind, result),
        (
            ProbeKind::Liveness | ProbeKind::Startup,
            ProbeResult::Failure
        ) | (ProbeKind::Startup, ProbeResult::Success)
    );
    (Some(result), if done { State::Done } else { counting })
}

/// Everything one worker task needs.
pub(crate) struct Worker {
    pub key: ResultKey,
    pub id: ContainerId,
    pub spec: ProbeSpec,
    pub target: Arc<ProbeTarget>,
    /// The container's start plus the initial delay.
    pub first_probe_at: Instant,
    /// The startup gate, shared by the container's workers: true once its startup probe
    /// succeeded, or from the start when it has none.
    pub started: Arc<watch::Sender<bool>>,
    pub runner: Arc<dyn RunProbe>,
    pub results: Arc<ResultStore>,
    pub updates: mpsc::UnboundedSender<ProbeUpdate>,
    /// This worker's `prober_probe_total` series, gone with the worker.
    pub counted: Counted,
}

impl Worker {
    /// Probes until the job is over; the manager aborts the task when the container goes.
    pub async fn run(self) {
        tokio::time::sleep_until(self.first_probe_at).await;
        if self.spec.kind != ProbeKind::Startup {
            let mut started = self.started.subscribe();
            // The sender lives in `self`, so this only ends when the gate opens.
            if started.wait_for(|open| *open).await.is_err() {
                return;
            }
        }
        let mut ticks = tokio::time::interval(self.spec.period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut state = State::default();
        loop {
            ticks.tick().await;
            let outcome = self
                .runner
                .run(&self.spec.action, &self.target, self.spec.timeout)
                .await;
            tracing::debug!(
                pod_uid = %self.key.pod_uid,
                container = %self.key.container,
                kind = %self.spec.kind,
                ?outcome,
                "probe ran"
            );
            self.counted.record(&outcome);
            // As kubelet, the run's event comes before the result it may publish.
            if let Some(event) = ProbeEvent::of(&outcome) {
                self.record(event, &outcome);
            }
            let (publish, next) = step(&self.spec, state, &outcome);
            if let Some(result) = publish {
                self.publish(result, &outcome);
            }
            state = match next {
                State::Done => return,
                counting @ State::Counting { .. } => counting,
            };
        }
    }

    fn publish(&self, result: ProbeResult, outcome: &ProbeOutcome) {
        let message = outcome.message().map(str::to_owned);
        let changed = self
            .results
            .set(&self.key, &self.id, result, message.clone());
        if self.spec.kind == ProbeKind::Startup && result == ProbeResult::Success {
            self.started.send_replace(true);
        }
        if !changed {
            return;
        }
        tracing::info!(
            pod_uid = %self.key.pod_uid,
            container = %self.key.container,
            container_id = %self.id,
            kind = %self.spec.kind,
            ?result,
            message = message.as_deref().unwrap_or(""),
            "probe result changed"
        );
        // The receiver is gone only when the agent is shutting down.
        let _ = self.updates.send(ProbeUpdate {
            pod_uid: self.key.pod_uid.clone(),
            container_name: self.key.container.clone(),
            container_id: self.id.clone(),
            kind: self.spec.kind,
            result,
            message,
            event: None,
        });
    }

    /// Reports a run that kubelet records as an event (`Unhealthy`, `ProbeWarning`).
    fn record(&self, event: ProbeEvent, outcome: &ProbeOutcome) {
        let result = if outcome.is_success() {
            ProbeResult::Success
        } else {
            ProbeResult::Failure
        };
        // The receiver is gone only when the agent is shutting down.
        let _ = self.updates.send(ProbeUpdate {
            pod_uid: self.key.pod_uid.clone(),
            container_name: self.key.container.clone(),
            container_id: self.id.clone(),
            kind: self.spec.kind,
            result,
            message: outcome.message().map(str::to_owned),
            event: Some(event),
        });
    }
}

/// A scripted prober for unit tests: the first word of an exec command names a script.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::{HashMap, VecDeque};
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    pub(crate) struct ScriptedProber {
        /// Outcomes per script name, used in order; Success once a script runs out.
        pub scripts: Mutex<HashMap<String, VecDeque<ProbeOutcome>>>,
        /// (script name, container id, when) of every run.
        pub calls: Mutex<Vec<(String, ContainerId, Instant)>>,
    }

    impl ScriptedProber {
        pub fn script(&self, name: &str, outcomes: impl IntoIterator<Item = ProbeOutcome>) {
            self.scripts
                .lock()
                .expect("script lock")
                .insert(name.to_owned(), outcomes.into_iter().collect());
        }

        pub fn calls_of(&self, name: &str) -> Vec<Instant> {
            self.calls
                .lock()
                .expect("calls lock")
                .iter()
                .filter(|(n, _, _)| n == name)
                .map(|(_, _, at)| *at)
                .collect()
        }
    }

    impl RunProbe for ScriptedProber {
        fn run<'a>(
            &'a self,
            action: &'a Action,
            target: &'a ProbeTarget,
            _timeout: Duration,
        ) -> ProbeFuture<'a> {
            let name = match action {
                Action::Exec { command } => command[0].clone(),
                other => format!("{other:?}"),
            };
            self.calls.lock().expect("calls lock").push((
                name.clone(),
                target.container_id.clone(),
                Instant::now(),
            ));
            let outcome = self
                .scripts
                .lock()
                .expect("script lock")
                .get_mut(&name)
                .and_then(VecDeque::pop_front)
                .unwrap_or(ProbeOutcome::Success);
            Box::pin(async move { outcome })
        }
    }

    pub(crate) fn exec_spec(kind: ProbeKind, name: &str) -> ProbeSpec {
        ProbeSpec {
            kind,
            action: Action::Exec {
                command: vec![name.to_owned()],
            },
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: 1,
            failure_threshold: 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{exec_spec, ScriptedProber};
    use super::*;
    use crate::probes::counts::Series;
    use crate::probes::results::Slot;
    use crate::probes::ProbeNetwork;

    fn fail() -> ProbeOutcome {
        ProbeOutcome::Failure("boom".into())
    }

    /// Feeds outcomes through `step`, returning what was published after each.
    fn run_steps(spec: &ProbeSpec, outcomes: &[ProbeOutcome]) -> (Vec<Option<ProbeResult>>, State) {
        let mut state = State::default();
        let mut published = Vec::new();
        for outcome in outcomes {
            let (p, next) = step(spec, state, outcome);
            published.push(p);
            state = next;
        }
        (published, state)
    }

    #[test]
    fn events_carry_kubelets_reasons_and_messages() {
        let http = ProbeOutcome::Failure("HTTP probe failed with statuscode: 500".into());
        let event = ProbeEvent::of(&http).expect("a failure is an event");
        assert_eq!(
            (event.reason(), event.message(ProbeKind::Liveness).as_str()),
            (
                "Unhealthy",
                "Liveness probe failed: HTTP probe failed with statuscode: 500"
            )
        );
        let exec = ProbeEvent::of(&ProbeOutcome::Failure("not ready\n".into()))
            .expect("a failure is an event");
        assert_eq!(
            exec.message(ProbeKind::Readiness),
            "Readiness probe failed: not ready\n"
        );
        let errored = ProbeEvent::of(&ProbeOutcome::Unknown("no such port".into()))
            .expect("an error is an event");
        assert_eq!(
            (
                errored.reason(),
                errored.message(ProbeKind::Startup).as_str()
            ),
            (
                "Unhealthy",
                "Startup probe errored and resulted in unknown state: no such port"
            )
        );
        let warned = ProbeEvent::of(&ProbeOutcome::Warning("Probe terminated redirects".into()))
            .expect("a warning is an event");
        assert_eq!(
            (
                warned.reason(),
                warned.message(ProbeKind::Liveness).as_str()
            ),
            (
                "ProbeWarning",
                "Liveness probe warning: Probe terminated redirects"
            )
        );
        assert_eq!(ProbeEvent::of(&ProbeOutcome::Success), None);
    }

    #[test]
    fn liveness_publishes_failure_on_the_third_consecutive_failure_and_stops() {
        let spec = exec_spec(ProbeKind::Liveness, "l");
        let (published, state) = run_steps(&spec, &[fail(), fail(), fail()]);
        assert_eq!(published, [None, None, Some(ProbeResult::Failure)]);
        assert_eq!(state, State::Done);
    }

    #[test]
    fn a_success_between_failures_restarts_the_count() {
        let spec = exec_spec(ProbeKind::Liveness, "l");
        let (published, state) = run_steps(
            &spec,
            &[fail(), fail(), ProbeOutcome::Success, fail(), fail()],
        );
        assert_eq!(
            published,
            [None, None, Some(ProbeResult::Success), None, None]
        );
        assert_eq!(
            state,
            State::Counting {
                last: Some(ProbeResult::Failure),
                run: 2
            }
        );
    }

    #[test]
    fn an_unknown_outcome_neither_counts_nor_resets() {
        let spec = exec_spec(ProbeKind::Liveness, "l");
        let unknown = ProbeOutcome::Unknown("no such port".into());
        let (published, state) =
            run_steps(&spec, &[fail(), unknown.clone(), fail(), unknown, fail()]);
        assert_eq!(
            published,
            [None, None, None, None, Some(ProbeResult::Failure)]
        );
        assert_eq!(state, State::Done);
    }

    #[test]
    fn readiness_needs_its_success_threshold_and_keeps_probing_after_failure() {
        let spec = ProbeSpec {
            success_threshold: 2,
            failure_threshold: 1,
            ..exec_spec(ProbeKind::Readiness, "r")
        };
        let ok = ProbeOutcome::Success;
        let (published, state) = run_steps(&spec, &[ok.clone(), ok.clone(), fail(), ok]);
        assert_eq!(
            published,
            [
                None,
                Some(ProbeResult::Success),
                Some(ProbeResult::Failure),
                None
            ]
        );
        assert!(matches!(state, State::Counting { .. }));
    }

    #[test]
    fn startup_is_done_at_its_first_success() {
        let spec = exec_spec(ProbeKind::Startup, "s");
        let (published, state) = run_steps(&spec, &[fail(), ProbeOutcome::Success]);
        assert_eq!(published, [None, Some(ProbeResult::Success)]);
        assert_eq!(state, State::Done);
    }

    struct Rig {
        prober: Arc<ScriptedProber>,
        results: Arc<ResultStore>,
        started: Arc<watch::Sender<bool>>,
        updates: mpsc::UnboundedReceiver<ProbeUpdate>,
        tx: mpsc::UnboundedSender<ProbeUpdate>,
        id: ContainerId,
    }

    impl Rig {
        fn new(gate_open: bool) -> Self {
            let (tx, updates) = mpsc::unbounded_channel();
            Self {
                prober: Arc::default(),
                results: Arc::default(),
                started: Arc::new(watch::channel(gate_open).0),
                updates,
                tx,
                id: ContainerId::random(),
            }
        }

        /// The updates sent so far: published results, and the events of probe runs.
        fn drain(&mut self) -> (Vec<ProbeUpdate>, Vec<ProbeEvent>) {
            let mut published = Vec::new();
            let mut events = Vec::new();
            while let Ok(update) = self.updates.try_recv() {
                match update.event {
                    Some(event) => events.push(event),
                    None => published.push(update),
                }
            }
            (published, events)
        }

        fn spawn(&self, spec: ProbeSpec) -> tokio::task::JoinHandle<()> {
            let spec_kind = spec.kind;
            let key = ResultKey {
                pod_uid: "uid".into(),
                container: "c".into(),
                kind: spec.kind,
            };
            self.results.init(
                key.clone(),
                Slot {
                    id: self.id.clone(),
                    result: spec.kind.initial_result(),
                    message: None,
                },
            );
            let worker = Worker {
                key,
                id: self.id.clone(),
                first_probe_at: Instant::now() + spec.initial_delay,
                spec,
                target: Arc::new(ProbeTarget {
                    container_id: self.id.clone(),
                    network: ProbeNetwork::default(),
                    container_ports: Vec::new(),
                }),
                started: self.started.clone(),
                runner: self.prober.clone(),
                results: self.results.clone(),
                updates: self.tx.clone(),
                counted: Counted {
                    counts: Arc::default(),
                    series: Series {
                        container: "c".into(),
                        namespace: "ns".into(),
                        pod: "p".into(),
                        pod_uid: "uid".into(),
                        kind: spec_kind,
                    },
                },
            };
            tokio::spawn(worker.run())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_probe_waits_the_initial_delay_then_probes_every_period() {
        let rig = Rig::new(true);
        let t0 = Instant::now();
        let spec = ProbeSpec {
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(2),
            ..exec_spec(ProbeKind::Readiness, "r")
        };
        let task = rig.spawn(spec);
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        let offsets: Vec<u64> = rig
            .prober
            .calls_of("r")
            .iter()
            .map(|at| (*at - t0).as_secs())
            .collect();
        assert_eq!(offsets, [5, 7, 9]);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_waits_for_the_startup_gate_and_probes_as_soon_as_it_opens() {
        let mut rig = Rig::new(false);
        let t0 = Instant::now();
        rig.prober.script("s", [fail(), fail()]);
        let liveness = rig.spawn(exec_spec(ProbeKind::Liveness, "l"));
        let startup = rig.spawn(ProbeSpec {
            period: Duration::from_secs(3),
            failure_threshold: 5,
            ..exec_spec(ProbeKind::Startup, "s")
        });
        tokio::time::sleep(Duration::from_millis(5_500)).await;
        assert!(
            rig.prober.calls_of("l").is_empty(),
            "liveness ran before startup"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Startup: fail at 0 s and 3 s, succeed at 6 s; liveness follows at once.
        let startup_runs: Vec<u64> = rig
            .prober
            .calls_of("s")
            .iter()
            .map(|at| (*at - t0).as_secs())
            .collect();
        assert_eq!(startup_runs, [0, 3, 6]);
        let liveness_runs = rig.prober.calls_of("l");
        assert_eq!(liveness_runs.len(), 1);
        assert_eq!((liveness_runs[0] - t0).as_secs(), 6);
        let (published, events) = rig.drain();
        let update = published.first().expect("a startup update");
        assert_eq!(
            (update.kind, update.result),
            (ProbeKind::Startup, ProbeResult::Success)
        );
        assert_eq!(
            events,
            vec![ProbeEvent::Failed("boom".into()); 2],
            "one Unhealthy per failed startup run"
        );
        assert!(startup.is_finished(), "startup kept probing after success");
        liveness.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_liveness_probe_sends_one_update_and_stops_probing() {
        let mut rig = Rig::new(true);
        rig.prober.script("l", [fail(), fail(), fail(), fail()]);
        let task = rig.spawn(exec_spec(ProbeKind::Liveness, "l"));
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        assert_eq!(rig.prober.calls_of("l").len(), 3);
        assert!(task.is_finished());
        let (published, events) = rig.drain();
        let [update] = published.as_slice() else {
            panic!("not one liveness update: {published:?}");
        };
        assert_eq!(
            (update.kind, update.result, update.message.as_deref()),
            (ProbeKind::Liveness, ProbeResult::Failure, Some("boom"))
        );
        assert_eq!(
            events,
            vec![ProbeEvent::Failed("boom".into()); 3],
            "one Unhealthy per failed run"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_errored_run_is_reported_but_not_counted() {
        let mut rig = Rig::new(true);
        let unknown = || ProbeOutcome::Unknown("container is not running".into());
        rig.prober.script("r", [unknown(), ProbeOutcome::Success]);
        let task = rig.spawn(exec_spec(ProbeKind::Readiness, "r"));
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        task.abort();
        let (published, events) = rig.drain();
        let results: Vec<ProbeResult> = published.iter().map(|u| u.result).collect();
        assert_eq!(results, [ProbeResult::Success]);
        assert_eq!(
            events,
            [ProbeEvent::Errored("container is not running".into())]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_warning_counts_as_a_success_and_is_reported_each_time() {
        let mut rig = Rig::new(true);
        let warning = || ProbeOutcome::Warning("Probe terminated redirects".into());
        rig.prober.script("l", [warning(), warning()]);
        let task = rig.spawn(exec_spec(ProbeKind::Liveness, "l"));
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        task.abort();
        let (published, events) = rig.drain();
        assert!(
            published.iter().all(|u| u.result == ProbeResult::Success),
            "{published:?}"
        );
        assert_eq!(
            events,
            vec![ProbeEvent::Warning("Probe terminated redirects".into()); 2],
            "one ProbeWarning per warned run"
        );
    }
}

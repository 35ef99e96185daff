//! Pod workers: one task per pod UID that drives the pod through
//! `syncing → terminating → terminated → finished`, processing updates in order.
//!
//! # Contract
//!
//! [`PodWorkers`] is the source of truth for *where each pod UID is in its life cycle* on
//! this node. Every other component (housekeeping, volume clean-up, status) asks it through
//! the predicates below and never infers the answer from the runtime or the pod manager.
//!
//! Life cycle in one sentence: a UID is synced (containers started, restarted, probed)
//! until termination is requested (kill, deletion, or the pod reaching a terminal phase),
//! then its containers are stopped within the grace period, then its resources (volumes,
//! cgroup, sandbox) are cleaned, and then the worker ends. A UID may start again only after
//! it reached `finished`: a `Create` that arrives earlier is remembered and applied then.
//!
//! ```text
//!   update(Create) ──► Syncing ──kill/terminal──► Terminating ──► Terminated ──► Finished
//!                        ▲  │ sync_pod                │ sync_terminating  │ sync_terminated
//!                        └──┘ (events, resync)        ▼                   ▼
//!
//!   predicate                         Syncing  Terminating  Terminated  Finished  unknown*
//!   is_pod_termination_requested       no       yes          yes         yes       no
//!   could_have_running_containers      yes      yes          no          no        no
//!   is_pod_terminated                  no       no           yes         yes       no
//!   should_pod_runtime_be_removed      no       no           yes         yes       yes
//!   should_pod_content_be_removed      no       no           no          yes       yes
//!
//!   * unknown UIDs: before the first `sync_known_pods` nothing is known, so
//!     `could_have_running_containers` answers yes and the removal predicates no.
//! ```
//!
//! Guarantees:
//! - At most one sync of a UID runs at a time; updates that arrive meanwhile are coalesced
//!   (the newest pod spec wins, a kill is sticky, a shorter grace period wins).
//! - Each sync is told the instant of the worker's previous action, and must act only on a
//!   runtime status read after it (see [`crate::pod_cache`]).
//! - Kill completions fire once the pod's containers are stopped and its resources cleaned.

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{oneshot, Notify};

use crate::config::{pod_full_name, pod_uid};

/// What an update asks of a pod's worker (kubelet's `SyncPodType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateType {
    /// The pod is new to this node.
    Create,
    /// The pod's spec changed.
    Update,
    /// Something changed in the runtime or a probe: sync again.
    Sync,
    /// Stop the pod.
    Kill,
}

/// Where a UID is in its life cycle; see the table in the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodLifecycle {
    /// Containers are started and kept in their desired state.
    Syncing,
    /// Termination was requested at `since`; containers get `grace` to stop.
    Terminating { grace: Duration, since: Instant },
    /// No container runs; resources are being released.
    Terminated,
    /// Everything is released; the record stays until `sync_known_pods` drops it.
    Finished,
}

impl PodLifecycle {
    fn terminating(grace: Duration) -> Self {
        Self::Terminating {
            grace,
            since: Instant::now(),
        }
    }
}

/// Options of a kill (kubelet's `KillPodOptions`).
#[derive(Debug, Default)]
pub struct KillPodOptions {
    /// Overrides the pod's grace period (seconds); it can only get shorter.
    pub grace_period_override: Option<i64>,
    /// Fired when the pod is fully terminated (or was never known).
    pub completed: Option<oneshot::Sender<()>>,
}

/// One update for one pod.
#[derive(Debug)]
pub struct UpdatePodOptions {
    pub update_type: UpdateType,
    pub pod: Arc<Pod>,
    pub kill: Option<KillPodOptions>,
}

impl UpdatePodOptions {
    pub fn new(update_type: UpdateType, pod: Arc<Pod>) -> Self {
        Self {
            update_type,
            pod,
            kill: None,
        }
    }
}

/// How a `sync_pod` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The pod keeps running; sync again after this long at the latest (a back-off expiry,
    /// a probe deadline), or at the periodic resync.
    Running { resync_after: Option<Duration> },
    /// Every container has finished for good (phase Succeeded or Failed): terminate.
    Terminal,
}

/// Why a sync failed: a kubelet reason (`CreatePodSandboxError`, `FailedMount`, …) and a
/// message for the event and the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct SyncError {
    pub reason: &'static str,
    pub message: String,
}

impl SyncError {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// The three steps a worker runs (kubelet's `syncPod`, `syncTerminatingPod`,
/// `syncTerminatedPod`). `status_newer_than` is the instant of the worker's last action.
#[async_trait]
pub trait PodSyncer: Send + Sync + 'static {
    async fn sync_pod(
        &self,
        pod: &Arc<Pod>,
        status_newer_than: Instant,
    ) -> Result<SyncOutcome, SyncError>;
    /// Stops every container within `grace`; returns once none runs.
    async fn sync_terminating_pod(
        &self,
        pod: &Arc<Pod>,
        grace: Duration,
        status_newer_than: Instant,
    ) -> Result<(), SyncError>;
    /// Releases what the pod held: volumes, cgroup, sandbox, containers.
    async fn sync_terminated_pod(&self, pod: &Arc<Pod>) -> Result<(), SyncError>;
}

/// Timing of the workers.
#[derive(Debug, Clone, Copy)]
pub struct PodWorkersConfig {
    /// Periodic resync of a running pod (kubelet `--sync-frequency`, default 1 min).
    pub resync_interval: Duration,
    /// Wait after a failed step before retrying (kubelet's `backOffPeriod`, 10 s).
    pub error_backoff: Duration,
}

impl Default for PodWorkersConfig {
    fn default() -> Self {
        Self {
            resync_interval: Duration::from_secs(60),
            error_backoff: Duration::from_secs(10),
        }
    }
}

/// The workers of all pods. Cheap to clone.
#[derive(Clone)]
pub struct PodWorkers {
    shared: Arc<Shared>,
}

struct Shared {
    syncer: Arc<dyn PodSyncer>,
    config: PodWorkersConfig,
    entries: Mutex<HashMap<String, Entry>>,
    /// Set by the first `sync_known_pods`: from then on, an unknown UID is known not to run.
    known_pods_synced: AtomicBool,
}

/// One UID's worker record.
struct Entry {
    pod: Arc<Pod>,
    state: PodLifecycle,
    wake: Arc<Notify>,
    /// A `Create` for this UID received after termination began: started once finished.
    restart: Option<Arc<Pod>>,
    completions: Vec<oneshot::Sender<()>>,
    /// Whether a task is running for this entry.
    active: bool,
}

impl PodWorkers {
    pub fn new(syncer: Arc<dyn PodSyncer>, config: PodWorkersConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                syncer,
                config,
                entries: Mutex::new(HashMap::new()),
                known_pods_synced: AtomicBool::new(false),
            }),
        }
    }

    /// Hands an update to the pod's worker, starting one if needed. Never blocks on a sync.
    pub fn update_pod(&self, options: UpdatePodOptions) {
        let UpdatePodOptions {
            update_type,
            pod,
            kill,
        } = options;
        let uid = pod_uid(&pod).to_owned();
        let kill_requested = update_type == UpdateType::Kill
            || pod.metadata.deletion_timestamp.is_some()
            || kill.is_some();
        let grace = kill_requested.then(|| grace_period(&pod, kill.as_ref()));
        let completion = kill.and_then(|k| k.completed);

        let mut entries = self.shared.lock();
        let spawn = match entries.get_mut(&uid) {
            None => {
                let state = match grace {
                    Some(grace) => PodLifecycle::terminating(grace),
                    None => PodLifecycle::Syncing,
                };
                tracing::debug!(pod_uid = %uid, pod = %pod_full_name(&pod), ?update_type, "pod worker started");
                entries.insert(
                    uid.clone(),
                    Entry {
                        pod,
                        state,
                        wake: Arc::new(Notify::new()),
                        restart: None,
                        completions: completion.into_iter().collect(),
                        active: true,
                    },
                );
                true
            }
            Some(entry) => {
                entry.completions.extend(completion);
                match (&mut entry.state, grace) {
                    (PodLifecycle::Syncing, Some(grace)) => {
                        entry.state = PodLifecycle::terminating(grace);
                        entry.pod = pod;
                    }
                    (PodLifecycle::Syncing, None) if update_type != UpdateType::Sync => {
                        entry.pod = pod;
                    }
                    (PodLifecycle::Terminating { grace: current, .. }, Some(grace)) => {
                        *current = (*current).min(grace);
                    }
                    (_, None) if update_type == UpdateType::Create => {
                        // Same UID again after termination began: restart once finished.
                        entry.restart = Some(pod);
                    }
                    _ => {}
                }
                entry.wake.notify_one();
                // A finished worker whose UID came back: start it again.
                let restart = !entry.active && entry.restart.is_some();
                if restart {
                    entry.active = true;
                }
                restart
            }
        };
        if spawn {
            drop(entries);
            tokio::spawn(run_worker(self.shared.clone(), uid));
        }
    }

    /// Forgets finished workers of pods that are no longer desired, and marks every UID not
    /// known as not running from now on. Returns the state of every UID known before the
    /// call, including the finished ones it just forgot (so their leftovers can be removed).
    pub fn sync_known_pods(&self, desired: &HashSet<String>) -> HashMap<String, PodLifecycle> {
        let mut entries = self.shared.lock();
        let states = entries
            .iter()
            .map(|(uid, e)| (uid.clone(), e.state.clone()))
            .collect();
        entries.retain(|uid, entry| {
            desired.contains(uid)
                || entry.state != PodLifecycle::Finished
                || entry.restart.is_some()
                || entry.active
        });
        self.shared.known_pods_synced.store(true, Ordering::SeqCst);
        states
    }

    fn lifecycle(&self, uid: &str) -> Option<PodLifecycle> {
        self.shared.lock().get(uid).map(|e| e.state.clone())
    }

    fn known_pods_synced(&self) -> bool {
        self.shared.known_pods_synced.load(Ordering::SeqCst)
    }

    pub fn is_pod_termination_requested(&self, uid: &str) -> bool {
        self.lifecycle(uid)
            .is_some_and(|l| l != PodLifecycle::Syncing)
    }

    pub fn could_have_running_containers(&self, uid: &str) -> bool {
        match self.lifecycle(uid) {
            Some(l) => matches!(l, PodLifecycle::Syncing | PodLifecycle::Terminating { .. }),
            None => !self.known_pods_synced(),
        }
    }

    pub fn is_pod_terminated(&self, uid: &str) -> bool {
        self.lifecycle(uid)
            .is_some_and(|l| matches!(l, PodLifecycle::Terminated | PodLifecycle::Finished))
    }

    pub fn should_pod_runtime_be_removed(&self, uid: &str) -> bool {
        match self.lifecycle(uid) {
            Some(l) => matches!(l, PodLifecycle::Terminated | PodLifecycle::Finished),
            None => self.known_pods_synced(),
        }
    }

    pub fn should_pod_content_be_removed(&self, uid: &str) -> bool {
        match self.lifecycle(uid) {
            Some(l) => l == PodLifecycle::Finished,
            None => self.known_pods_synced(),
        }
    }

    /// The pod a worker currently works on, and its lifecycle.
    pub fn pod(&self, uid: &str) -> Option<(Arc<Pod>, PodLifecycle)> {
        self.shared
            .lock()
            .get(uid)
            .map(|e| (e.pod.clone(), e.state.clone()))
    }

    /// Every UID with a worker record.
    pub fn known_uids(&self) -> Vec<String> {
        self.shared.lock().keys().cloned().collect()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Entries are updated field by field under the lock without calls that can panic.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The grace period of a kill: the override if shorter, else the pod's deletion grace
/// period, else its spec's (kubelet's default 30 s). Never negative.
fn grace_period(pod: &Pod, kill: Option<&KillPodOptions>) -> Duration {
    let spec = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(crate::config::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    let mut seconds = pod.metadata.deletion_grace_period_seconds.unwrap_or(spec);
    if let Some(over) = kill.and_then(|k| k.grace_period_override) {
        seconds = seconds.min(over);
    }
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// What the worker does next, read under the lock.
enum Step {
    Sync(Arc<Pod>),
    Terminate(Arc<Pod>, Duration),
    Clean(Arc<Pod>),
    Exit,
}

/// The task of one UID: runs steps until the pod is finished (and not asked to restart).
async fn run_worker(shared: Arc<Shared>, uid: String) {
    let mut last_action = Instant::now();
    loop {
        let (step, wake) = {
            let mut entries = shared.lock();
            let Some(entry) = entries.get_mut(&uid) else {
                return;
            };
            let step = match &entry.state {
                PodLifecycle::Syncing => Step::Sync(entry.pod.clone()),
                PodLifecycle::Terminating { grace, .. } => {
                    Step::Terminate(entry.pod.clone(), *grace)
                }
                PodLifecycle::Terminated => Step::Clean(entry.pod.clone()),
                PodLifecycle::Finished => match entry.restart.take() {
                    Some(pod) => {
                        tracing::info!(pod_uid = %uid, "pod restarted with the same UID");
                        entry.pod = pod.clone();
                        entry.state = PodLifecycle::Syncing;
                        Step::Sync(pod)
                    }
                    None => {
                        entry.active = false;
                        Step::Exit
                    }
                },
            };
            (step, entry.wake.clone())
        };

        let next_wait = match step {
            Step::Exit => return,
            Step::Sync(pod) => {
                let result = shared.syncer.sync_pod(&pod, last_action).await;
                last_action = Instant::now();
                match result {
                    Ok(SyncOutcome::Running { resync_after }) => {
                        let after = resync_after
                            .unwrap_or(shared.config.resync_interval)
                            .min(shared.config.resync_interval);
                        Some(after)
                    }
                    Ok(SyncOutcome::Terminal) => {
                        let grace = grace_period(&pod, None);
                        transition(&shared, &uid, |state| {
                            if *state == PodLifecycle::Syncing {
                                *state = PodLifecycle::terminating(grace);
                            }
                        });
                        None
                    }
                    Err(err) => {
                        tracing::warn!(pod_uid = %uid, pod = %pod_full_name(&pod), reason = err.reason, message = %err.message, "pod sync failed");
                        Some(shared.config.error_backoff)
                    }
                }
            }
            Step::Terminate(pod, grace) => {
                let result = shared
                    .syncer
                    .sync_terminating_pod(&pod, grace, last_action)
                    .await;
                last_action = Instant::now();
                match result {
                    Ok(()) => {
                        transition(&shared, &uid, |state| {
                            *state = PodLifecycle::Terminated;
                        });
                        None
                    }
                    Err(err) => {
                        tracing::warn!(pod_uid = %uid, reason = err.reason, message = %err.message, "terminating pod failed");
                        Some(shared.config.error_backoff.min(Duration::from_secs(1)))
                    }
                }
            }
            Step::Clean(pod) => match shared.syncer.sync_terminated_pod(&pod).await {
                Ok(()) => {
                    let completions = {
                        let mut entries = shared.lock();
                        match entries.get_mut(&uid) {
                            Some(entry) => {
                                entry.state = PodLifecycle::Finished;
                                std::mem::take(&mut entry.completions)
                            }
                            None => Vec::new(),
                        }
                    };
                    for done in completions {
                        let _ = done.send(());
                    }
                    tracing::debug!(pod_uid = %uid, "pod worker finished");
                    None
                }
                Err(err) => {
                    tracing::warn!(pod_uid = %uid, reason = err.reason, message = %err.message, "cleaning up pod failed");
                    Some(shared.config.error_backoff)
                }
            },
        };

        if let Some(after) = next_wait {
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(after) => {}
            }
        }
    }
}

fn transition(shared: &Shared, uid: &str, change: impl FnOnce(&mut PodLifecycle)) {
    if let Some(entry) = shared.lock().get_mut(uid) {
        change(&mut entry.state);
    }
}

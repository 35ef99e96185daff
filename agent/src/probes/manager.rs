//! [`ProbeManager`]: keeps one worker per (pod uid, container name, probe kind) for the
//! running containers the pod workers report, and answers readiness, startup and liveness
//! questions about them (kubelet's `prober.Manager`).
//!
//! Contract with the pod workers and the status code:
//! - Call [`ProbeManager::update_pod`] with a pod's running containers whenever they change
//!   (after a sync); it is idempotent. A container's workers start when it first appears
//!   with a given id and stop (their results forgotten) when it disappears or its id
//!   changes. Call [`ProbeManager::stop_liveness_and_startup`] when the pod starts
//!   terminating (readiness keeps being probed through the grace period, kubelet's
//!   `StopLivenessAndStartup`) and [`ProbeManager::remove_pod`] when it is terminated.
//! - Every published result change arrives on the update channel as a [`ProbeUpdate`];
//!   the sync loop syncs the pod. A liveness or startup Failure
//!   ([`ProbeManager::restart_reason`]) means the pod worker must kill and restart the
//!   container; readiness feeds the container's `ready` and the pod's Ready condition.
//! - Queries name the container id they ask about; an id the manager does not track
//!   answers "not started / not ready / not failed".
//! - Must be used inside a tokio runtime (workers are tasks).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use ironlet_runtime::types::ContainerId;
use ironlet_runtime::Runtime;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::counts::{Counted, ProbeCounts, Series};
use super::results::{ResultKey, ResultStore, Slot};
use super::spec::ProbeSpec;
use super::worker::{RunProbe, RuntimeProber, Worker};
use super::{ProbeEvent, ProbeKind, ProbeNetwork, ProbeResult, ProbeTarget};

/// A published probe result changed, or a probe run asks for an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeUpdate {
    pub pod_uid: String,
    pub container_name: String,
    pub container_id: ContainerId,
    pub kind: ProbeKind,
    pub result: ProbeResult,
    /// The failure message of the probe run that decided a Failure.
    pub message: Option<String>,
    /// Set on an update sent for one probe run that kubelet records as an event on the
    /// pod (`Unhealthy`, `ProbeWarning`); such an update says nothing about the published
    /// result, which arrives in an update of its own when it changes.
    pub event: Option<ProbeEvent>,
}

/// A running container as the pod worker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningContainer {
    pub name: String,
    pub id: ContainerId,
    pub started_at: SystemTime,
    /// What this very container (same id) was known to be before its probe workers
    /// start: set for a container re-adopted after an agent restart, from the status the
    /// previous agent recorded, so that readiness and `started` carry over instead of
    /// restarting from their initial results (a ready container would flap to not ready
    /// until its next probe; one that had started would run its startup probe again).
    pub carried: Carried,
}

/// Probe results a running container carries from before its workers started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Carried {
    /// Its startup probe had succeeded (or it had none).
    pub started: bool,
    /// Its readiness probe had succeeded (or it had none) and it had started.
    pub ready: bool,
}

/// The probe workers of one container; dropping it stops them and forgets their results.
struct ContainerProbes {
    pod_uid: String,
    name: String,
    id: ContainerId,
    /// The kinds this container has a probe of (valid or not).
    kinds: Vec<ProbeKind>,
    workers: Vec<(ProbeKind, JoinHandle<()>)>,
    results: Arc<ResultStore>,
}

impl ContainerProbes {
    fn has(&self, kind: ProbeKind) -> bool {
        self.kinds.contains(&kind)
    }

    fn key(&self, kind: ProbeKind) -> ResultKey {
        ResultKey {
            pod_uid: self.pod_uid.clone(),
            container: self.name.clone(),
            kind,
        }
    }

    fn result(&self, kind: ProbeKind) -> Option<ProbeResult> {
        self.results
            .get(&self.key(kind), &self.id)
            .and_then(|slot| slot.result)
    }

    /// Started: running, and its startup probe (if any) succeeded.
    fn started(&self) -> bool {
        !self.has(ProbeKind::Startup)
            || self.result(ProbeKind::Startup) == Some(ProbeResult::Success)
    }

    /// Ready: started, and its readiness probe (if any) says Success.
    fn ready(&self) -> bool {
        self.started()
            && (!self.has(ProbeKind::Readiness)
                || self.result(ProbeKind::Readiness) == Some(ProbeResult::Success))
    }
}

impl Drop for ContainerProbes {
    fn drop(&mut self) {
        for (_, worker) in &self.workers {
            worker.abort();
        }
        for kind in &self.kinds {
            self.results.remove(&self.key(*kind), &self.id);
        }
    }
}

/// Probe workers of all pods, by pod uid then container name.
pub struct ProbeManager {
    runner: Arc<dyn RunProbe>,
    results: Arc<ResultStore>,
    updates: mpsc::UnboundedSender<ProbeUpdate>,
    pods: Mutex<HashMap<String, HashMap<String, ContainerProbes>>>,
    counts: Arc<ProbeCounts>,
}

impl ProbeManager {
    /// A manager probing through `runtime`, and the receiving end of its updates.
    pub fn new(runtime: Arc<dyn Runtime>) -> (Self, mpsc::UnboundedReceiver<ProbeUpdate>) {
        Self::with_runner(Arc::new(RuntimeProber { runtime }))
    }

    pub(crate) fn with_runner(
        runner: Arc<dyn RunProbe>,
    ) -> (Self, mpsc::UnboundedReceiver<ProbeUpdate>) {
        let (updates, rx) = mpsc::unbounded_channel();
        let manager = Self {
            runner,
            results: Arc::default(),
            updates,
            pods: Mutex::default(),
            counts: Arc::default(),
        };
        (manager, rx)
    }

    /// The workers' `prober_probe_total` counters (the kubelet API's `/metrics/probes`).
    pub fn counts(&self) -> Arc<ProbeCounts> {
        self.counts.clone()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, HashMap<String, ContainerProbes>>> {
        // Critical sections only insert or remove map entries: nothing is left torn.
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reconciles the workers of `pod` with its `running` containers (regular containers
    /// and restartable init containers); `network` is read when a container's workers
    /// start. Idempotent.
    pub fn update_pod(&self, pod: &Pod, running: &[RunningContainer], network: &ProbeNetwork) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            tracing::warn!(pod = ?pod.metadata.name, "pod without a uid is not probed");
            return;
        };
        let probed: HashMap<&str, &Container> = probed_containers(pod)
            .map(|c| (c.name.as_str(), c))
            .collect();
        let wanted: HashMap<&str, (&Container, &RunningContainer)> = running
            .iter()
            .filter_map(|r| {
                probed
                    .get(r.name.as_str())
                    .map(|c| (r.name.as_str(), (*c, r)))
            })
            .collect();
        let mut pods = self.lock();
        let containers = pods.entry(uid.to_owned()).or_default();
        containers.retain(|name, probes| {
            wanted
                .get(name.as_str())
                .is_some_and(|(_, r)| r.id == probes.id)
        });
        for (name, (container, running)) in wanted {
            if !containers.contains_key(name) {
                let probes = self.start(pod, uid, container, running, network);
                containers.insert(name.to_owned(), probes);
            }
        }
        if containers.is_empty() {
            pods.remove(uid);
        }
    }

    /// The pod is terminating: its liveness and startup workers stop and their results
    /// become Success (kubelet's quiet shutdown: no restart, no `Unhealthy` event during the
    /// grace period); readiness workers go on.
    pub fn stop_liveness_and_startup(&self, uid: &str) {
        let mut pods = self.lock();
        let Some(containers) = pods.get_mut(uid) else {
            return;
        };
        for probes in containers.values_mut() {
            probes.workers.retain(|(kind, worker)| {
                let stop = matches!(kind, ProbeKind::Liveness | ProbeKind::Startup);
                if stop {
                    worker.abort();
                }
                !stop
            });
            for kind in [ProbeKind::Liveness, ProbeKind::Startup] {
                if probes.has(kind) {
                    probes
                        .results
                        .set(&probes.key(kind), &probes.id, ProbeResult::Success, None);
                }
            }
        }
    }

    /// Stops every worker of the pod and forgets its results.
    pub fn remove_pod(&self, uid: &str) {
        let removed = self.lock().remove(uid);
        drop(removed);
    }

    /// Readiness of the container the manager tracks under this name, `None` when it
    /// tracks none (not running, or not reported yet).
    pub fn readiness(&self, uid: &str, container_name: &str) -> Option<bool> {
        self.with_container(uid, container_name, None, ContainerProbes::ready)
    }

    /// Whether container `id` is ready: started, and its readiness probe (if any) passed.
    pub fn is_ready(&self, uid: &str, container_name: &str, id: &ContainerId) -> bool {
        self.with_container(uid, container_name, Some(id), ContainerProbes::ready)
            .unwrap_or(false)
    }

    /// Whether container `id` has started (its startup probe, if any, succeeded); `None`
    /// when the manager does not track that container.
    pub fn startup_done(&self, uid: &str, container_name: &str, id: &ContainerId) -> Option<bool> {
        self.with_container(uid, container_name, Some(id), ContainerProbes::started)
    }

    /// Whether container `id`'s liveness probe reached its failure threshold.
    pub fn liveness_failed(&self, uid: &str, container_name: &str, id: &ContainerId) -> bool {
        self.with_container(uid, container_name, Some(id), |c| {
            c.result(ProbeKind::Liveness) == Some(ProbeResult::Failure)
        })
        .unwrap_or(false)
    }

    /// Which probe requires container `id` to be restarted, if any (liveness first, as
    /// kubelet's `computePodActions` checks).
    pub fn restart_reason(
        &self,
        uid: &str,
        container_name: &str,
        id: &ContainerId,
    ) -> Option<ProbeKind> {
        self.with_container(uid, container_name, Some(id), |c| {
            [ProbeKind::Liveness, ProbeKind::Startup]
                .into_iter()
                .find(|kind| c.result(*kind) == Some(ProbeResult::Failure))
        })
        .flatten()
    }

    /// The last failure message of a probe of container `id`, or why the probe is invalid.
    pub fn message(
        &self,
        uid: &str,
        container_name: &str,
        id: &ContainerId,
        kind: ProbeKind,
    ) -> Option<String> {
        self.with_container(uid, container_name, Some(id), |c| {
            self.results.get(&c.key(kind), id).and_then(|s| s.message)
        })
        .flatten()
    }

    fn with_container<T>(
        &self,
        uid: &str,
        name: &str,
        id: Option<&ContainerId>,
        f: impl FnOnce(&ContainerProbes) -> T,
    ) -> Option<T> {
        let pods = self.lock();
        let probes = pods.get(uid)?.get(name)?;
        if id.is_some_and(|id| *id != probes.id) {
            return None;
        }
        Some(f(probes))
    }

    /// Initialises the container's result slots and spawns a worker per valid probe.
    fn start(
        &self,
        pod: &Pod,
        uid: &str,
        container: &Container,
        running: &RunningContainer,
        network: &ProbeNetwork,
    ) -> ContainerProbes {
        let specs = ProbeSpec::from_container(container);
        let has_startup = specs.iter().any(|(k, _)| *k == ProbeKind::Startup);
        let carried = running.carried;
        let started = Arc::new(watch::channel(!has_startup || carried.started).0);
        let target = Arc::new(ProbeTarget::for_container(
            running.id.clone(),
            network.clone(),
            container,
        ));
        // Measured from the container's start, as kubelet does; tokio's clock so that
        // tests can pause time.
        let since_start = SystemTime::now()
            .duration_since(running.started_at)
            .unwrap_or_default();
        let mut probes = ContainerProbes {
            pod_uid: uid.to_owned(),
            name: container.name.clone(),
            id: running.id.clone(),
            kinds: specs.iter().map(|(k, _)| *k).collect(),
            workers: Vec::new(),
            results: self.results.clone(),
        };
        for (kind, spec) in specs {
            let key = probes.key(kind);
            let message = spec.as_ref().err().map(ToString::to_string);
            let result = match kind {
                ProbeKind::Startup if carried.started => Some(ProbeResult::Success),
                ProbeKind::Readiness if carried.ready => Some(ProbeResult::Success),
                _ => kind.initial_result(),
            };
            self.results.init(
                key.clone(),
                Slot {
                    id: running.id.clone(),
                    result,
                    message,
                },
            );
            // kubelet stops probing for startup once a container has started.
            if kind == ProbeKind::Startup && carried.started {
                continue;
            }
            let spec = match spec {
                Ok(spec) => spec,
                Err(err) => {
                    tracing::warn!(
                        pod_uid = %uid,
                        container = %container.name,
                        %kind,
                        %err,
                        "invalid probe is not run; the container keeps its initial result"
                    );
                    continue;
                }
            };
            let delay = spec.initial_delay.saturating_sub(since_start);
            let worker = Worker {
                key,
                id: running.id.clone(),
                first_probe_at: tokio::time::Instant::now() + delay,
                spec,
                target: target.clone(),
                started: started.clone(),
                runner: self.runner.clone(),
                results: self.results.clone(),
                updates: self.updates.clone(),
                counted: Counted {
                    counts: self.counts.clone(),
                    series: Series {
                        container: container.name.clone(),
                        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                        pod: pod.metadata.name.clone().unwrap_or_default(),
                        pod_uid: uid.to_owned(),
                        kind,
                    },
                },
            };
            probes.workers.push((kind, tokio::spawn(worker.run())));
        }
        tracing::debug!(
            pod_uid = %uid,
            container = %container.name,
            container_id = %running.id,
            workers = probes.workers.len(),
            "probe workers started"
        );
        probes
    }
}

/// The containers kubelet probes: regular ones and restartable (sidecar) init containers.
fn probed_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let sidecars = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let regular = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter();
    sidecars.chain(regular)
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;

//! [`NodeSyncer`]: the real [`PodSyncer`] — kubelet's `SyncPod`, `SyncTerminatingPod` and
//! `SyncTerminatedPod` composed from the runtime, the cgroup tree, volumes, probes and the
//! decision logic in [`crate::sync`].
//!
//! Every step reads the runtime's status through the [`PodCache`] at or after the worker's
//! last action, decides, acts, and stores the resulting API status in the [`StatusStore`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use ironlet_cgroups::{CgroupPath, NodeCgroups, QosClass};
use ironlet_runtime::types::{ContainerId, ContainerState, PodSandboxConfig, PodStatus};
use ironlet_runtime::{ImageService, Runtime, RuntimeError};
use k8s_openapi::api::core::v1::Pod;

use super::active_deadline::{self, Deadline};
use super::config::KubeletConfig;
use super::events::{reason, EventRecorder, EventType};
use super::status_store::StatusStore;
use crate::config::{pod_full_name, pod_uid};
use crate::objects::ObjectSource;
use crate::pod_cache::{CachedStatus, PodCache};
use crate::pod_workers::{PodSyncer, SyncError, SyncOutcome};
use crate::probes::ProbeKind;
use crate::probes::ProbeManager;
use crate::status::{ImageRefs, PodLifecycle as StatusLifecycle, WaitingReason, WaitingReasons};
use crate::sync::backoff::Backoff;
use crate::sync::{
    compute_pod_actions, filter_backoff, ActionsInput, ContainerKind, PodActions, ProbeResults,
    ProbeVerdict,
};
use crate::volumes::VolumeManager;

mod etc;
mod kill;
mod pull;
mod start;
mod status;

/// The node's resources as container configs need them.
#[derive(Debug, Clone, Default)]
pub struct NodeResources {
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    pub host_ip: Option<String>,
}

/// Everything a pod sync touches.
pub struct NodeSyncer {
    pub(crate) config: KubeletConfig,
    pub(crate) runtime: Arc<dyn Runtime>,
    pub(crate) images: Arc<dyn ImageService>,
    pub(crate) cache: Arc<PodCache>,
    pub(crate) cgroups: Option<NodeCgroups>,
    /// Pod cgroups the PLEG watches for emptiness and OOM kills.
    pub(crate) cgroup_watches: crate::pleg::CgroupWatches,
    pub(crate) volumes: VolumeManager,
    pub(crate) objects: Arc<dyn ObjectSource>,
    /// The Service cache for service link variables; `None` without an API server.
    pub(crate) services: Option<Arc<dyn crate::env::ServiceLister>>,
    pub(crate) probes: ProbeManager,
    pub(crate) backoff: Mutex<Backoff>,
    pub(crate) statuses: Arc<StatusStore>,
    pub(crate) metrics: Arc<crate::server::Metrics>,
    pub(crate) events: Arc<dyn EventRecorder>,
    pub(crate) node: NodeResources,
    /// Termination messages read after a container exited, by container id.
    pub(crate) termination_messages: Mutex<HashMap<String, String>>,
    /// Waiting reasons from the last sync, by pod UID then container name.
    pub(crate) waiting: Mutex<HashMap<String, WaitingReasons>>,
    /// Image id → repo digest, for `imageID` in container statuses.
    pub(crate) image_refs: Mutex<ImageRefs>,
    /// Failed image pulls in back-off, by pod UID and image.
    pub(crate) pull_backoff: Mutex<pull::PullBackoff>,
    /// Pods the eviction manager evicted, by UID: the status they report from then on.
    pub(crate) evictions: Mutex<HashMap<String, StatusLifecycle>>,
    /// The node-wide limit on image pulls at once (`--serialize-image-pulls`,
    /// `--max-parallel-image-pulls`); `None`: no limit.
    pub(crate) pull_slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Notified after a pull, so the node status lists the new image soon.
    pub(crate) images_changed: Arc<tokio::sync::Notify>,
    /// Pods being killed, by UID: notified when a probe result or a container changed, so
    /// that their status follows during the grace period.
    pub(crate) terminating: Mutex<HashMap<String, Arc<tokio::sync::Notify>>>,
}

impl NodeSyncer {
    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, WaitingReasons>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pod's cgroup, created with the pod's limits; `None` without cgroups (rootless
    /// on v1).
    fn ensure_pod_cgroup(&self, pod: &Pod) -> Result<Option<CgroupPath>, SyncError> {
        let Some(cgroups) = &self.cgroups else {
            return Ok(None);
        };
        let resources = crate::qos::pod_resources(pod)
            .map_err(|e| SyncError::new("InvalidResources", e.to_string()))?;
        let path = cgroups
            .pod_path(resources.qos(), pod_uid(pod))
            .map_err(|e| SyncError::new("FailedCreatePodCgroup", e.to_string()))?;
        let settings = resources.cgroup_settings(&self.config.cgroup_options);
        cgroups
            .create_pod(&path, &settings)
            .map_err(|e| SyncError::new("FailedCreatePodCgroup", e.to_string()))?;
        self.cgroup_watches.watch(pod_uid(pod), &path);
        Ok(Some(path))
    }

    fn sandbox_config(
        &self,
        pod: &Pod,
        attempt: u32,
        cgroup: Option<&CgroupPath>,
    ) -> PodSandboxConfig {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let name = meta.name.clone().unwrap_or_default();
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let uid = pod_uid(pod).to_owned();
        PodSandboxConfig {
            log_directory: self.config.pod_log_directory(&namespace, &name, &uid),
            pod_uid: uid,
            hostname: self.pod_hostname(pod),
            name,
            namespace,
            attempt,
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            host_ipc: spec.and_then(|s| s.host_ipc).unwrap_or(false),
            host_pid: spec.and_then(|s| s.host_pid).unwrap_or(false),
            cgroup_parent: cgroup.map(|c| c.as_str().to_owned()),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: Default::default(),
            port_mappings: host_ports(pod),
        }
    }

    /// A status read after `after`, with termination messages filled in.
    async fn runtime_status(&self, pod: &Pod, after: Instant) -> Result<CachedStatus, SyncError> {
        let mut cached = self
            .cache
            .get_newer_than(pod_uid(pod), after)
            .await
            .map_err(|e| SyncError::new("RuntimeStatusError", e.to_string()))?;
        self.fill_termination_messages(pod, &mut cached);
        Ok(cached)
    }

    /// Node allocatable as environment and volume sizing see it.
    fn allocatable(&self) -> crate::env::Allocatable {
        crate::env::Allocatable {
            cpu_milli: self.node.cpu_milli,
            memory_bytes: self.node.memory_bytes,
            ephemeral_storage_bytes: 0,
        }
    }

    pub(crate) fn event(&self, pod: &Pod, kind: EventType, reason: &'static str, message: String) {
        self.events.event(pod, kind, reason, message);
    }

    fn lock_evictions(&self) -> std::sync::MutexGuard<'_, HashMap<String, StatusLifecycle>> {
        self.evictions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on pod `uid` reports phase Failed with `reason` and `message` (kubelet's
    /// eviction `PodStatusFunc`), with a `DisruptionTarget` condition when
    /// `disruption_target` (node-pressure evictions); the caller kills it.
    pub(crate) fn record_eviction(
        &self,
        uid: &str,
        reason: &str,
        message: String,
        disruption_target: bool,
    ) {
        self.lock_evictions().insert(
            uid.to_owned(),
            StatusLifecycle::Evicted {
                reason: reason.to_owned(),
                message,
                disruption_target,
            },
        );
    }

    /// The eviction recorded for pod `uid`, if any.
    pub(crate) fn eviction_of(&self, uid: &str) -> Option<StatusLifecycle> {
        self.lock_evictions().get(uid).cloned()
    }

    /// kubelet's active deadline handler: the event, the status from now on (phase Failed,
    /// `DeadlineExceeded`); the worker then kills the pod with its grace period.
    fn deadline_exceeded(&self, pod: &Arc<Pod>, runtime: &PodStatus) {
        tracing::info!(pod = %pod_full_name(pod), pod_uid = %pod_uid(pod), "pod exceeded its active deadline");
        self.record_eviction(
            pod_uid(pod),
            active_deadline::REASON,
            active_deadline::MESSAGE.into(),
            false,
        );
        self.event(
            pod,
            EventType::Normal,
            reason::DEADLINE_EXCEEDED,
            active_deadline::MESSAGE.into(),
        );
        self.probes.remove_pod(pod_uid(pod));
        self.record_status(pod, runtime, &StatusLifecycle::Active);
    }

    /// Keeps the remembered termination messages of the containers `exists` names.
    pub(crate) fn forget_termination_messages(&self, exists: impl Fn(&str) -> bool) {
        self.termination_messages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| exists(id));
    }

    /// Forgets the eviction of a pod that is gone.
    pub(crate) fn forget_eviction(&self, uid: &str) {
        self.lock_evictions().remove(uid);
    }
}

#[async_trait]
impl PodSyncer for NodeSyncer {
    async fn sync_pod(
        &self,
        pod: &Arc<Pod>,
        status_newer_than: Instant,
    ) -> Result<SyncOutcome, SyncError> {
        let started = Instant::now();
        let cached = self.runtime_status(pod, status_newer_than).await?;
        // Probes first: a status must never show a running container as not started or
        // not ready merely because its probe workers were not set up yet (a container
        // re-adopted after an agent restart, or one started by the previous sync).
        self.update_probes(pod, &cached.status);
        self.learn_image_refs(&cached.status).await;
        let api = self.record_status(pod, &cached.status, &StatusLifecycle::Active);
        if crate::status::pod_is_terminal(&api) {
            self.probes.remove_pod(pod_uid(pod));
            return Ok(SyncOutcome::Terminal);
        }
        let deadline = active_deadline::check(pod, api.start_time.as_ref(), SystemTime::now());
        if deadline == Deadline::Exceeded {
            self.deadline_exceeded(pod, &cached.status);
            return Ok(SyncOutcome::Terminal);
        }
        let result = self
            .sync_running_pod(pod, &cached.status)
            .await
            .map(|outcome| resync_at_deadline(outcome, deadline));
        let fresh = self.runtime_status(pod, Instant::now()).await?;
        self.update_probes(pod, &fresh.status);
        self.record_status(pod, &fresh.status, &StatusLifecycle::Active);
        tracing::debug!(pod = %pod_full_name(pod), took_us = started.elapsed().as_micros() as u64, "pod synced");
        result
    }

    /// kubelet's `SyncTerminatingPod`: the status first, liveness and startup probes off
    /// (readiness goes on), then the kill; while it lasts, the status follows readiness and
    /// container changes ([`NodeSyncer::pod_changed`]), so a pod whose containers stop being
    /// ready during the grace period turns not Ready at once.
    async fn sync_terminating_pod(
        &self,
        pod: &Arc<Pod>,
        grace: Duration,
        status_newer_than: Instant,
    ) -> Result<(), SyncError> {
        let uid = pod_uid(pod);
        let cached = self.runtime_status(pod, status_newer_than).await?;
        self.record_status(pod, &cached.status, &StatusLifecycle::Active);
        self.probes.stop_liveness_and_startup(uid);
        let changed = TerminatingWatch::register(self, uid);
        // The status follows in a future of its own, so that reading the runtime (which
        // may wait for an exited container's logs) never holds up the kill.
        let follow = async {
            loop {
                changed.notify.notified().await;
                if let Ok(now) = self.runtime_status(pod, Instant::now()).await {
                    self.record_status(pod, &now.status, &StatusLifecycle::Active);
                }
            }
        };
        let killed = tokio::select! {
            killed = self.kill_pod(pod, &cached.status, grace) => killed,
            never = follow => never,
        };
        drop(changed);
        killed?;
        self.probes.remove_pod(uid);
        let fresh = self.runtime_status(pod, Instant::now()).await?;
        self.record_status(pod, &fresh.status, &StatusLifecycle::Terminal);
        tracing::debug!(pod = %pod_full_name(pod), pod_uid = %uid, "pod's containers stopped; final status recorded");
        Ok(())
    }

    async fn sync_terminated_pod(&self, pod: &Arc<Pod>) -> Result<(), SyncError> {
        let uid = pod_uid(pod);
        self.cgroup_watches.unwatch(uid);
        self.volumes
            .teardown_pod_volumes(uid)
            .await
            .map_err(|e| SyncError::new("FailedUnmount", e.to_string()))?;
        if let Some(cgroups) = &self.cgroups {
            // The pod's QoS class may be unknown (an orphan from a previous run): try all.
            for qos in [
                QosClass::Guaranteed,
                QosClass::Burstable,
                QosClass::BestEffort,
            ] {
                let Ok(path) = cgroups.pod_path(qos, uid) else {
                    continue;
                };
                cgroups
                    .remove(&path)
                    .map_err(|e| SyncError::new("FailedRemovePodCgroup", e.to_string()))?;
            }
        }
        self.lock_waiting().remove(uid);
        Ok(())
    }
}

/// A terminating pod's entry in [`NodeSyncer::terminating`], removed when dropped.
struct TerminatingWatch<'a> {
    syncer: &'a NodeSyncer,
    uid: &'a str,
    notify: Arc<tokio::sync::Notify>,
}

impl<'a> TerminatingWatch<'a> {
    fn register(syncer: &'a NodeSyncer, uid: &'a str) -> Self {
        let notify = Arc::new(tokio::sync::Notify::new());
        syncer
            .lock_terminating()
            .insert(uid.to_owned(), notify.clone());
        Self {
            syncer,
            uid,
            notify,
        }
    }
}

impl Drop for TerminatingWatch<'_> {
    fn drop(&mut self) {
        self.syncer.lock_terminating().remove(self.uid);
    }
}

impl NodeSyncer {
    fn lock_terminating(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Notify>>> {
        self.terminating.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A probe result or a container of pod `uid` changed: if the pod is being killed, its
    /// status is recomputed now (the pod worker is busy until the kill ends).
    pub(crate) fn pod_changed(&self, uid: &str) {
        if let Some(notify) = self.lock_terminating().get(uid) {
            notify.notify_one();
        }
    }

    /// Sandbox, init containers, containers: one step of kubelet's `SyncPod`.
    async fn sync_running_pod(
        &self,
        pod: &Arc<Pod>,
        status: &PodStatus,
    ) -> Result<SyncOutcome, SyncError> {
        let uid = pod_uid(pod);
        let cgroup = self.ensure_pod_cgroup(pod)?;
        let volumes = match self
            .volumes
            .setup_pod_volumes(pod, &self.allocatable())
            .await
        {
            Ok(v) => v,
            Err(err) => {
                self.event(
                    pod,
                    EventType::Warning,
                    reason::FAILED_MOUNT,
                    err.to_string(),
                );
                return Err(SyncError::new(reason::FAILED_MOUNT, err.to_string()));
            }
        };
        let probes = PodProbes {
            manager: &self.probes,
            uid,
        };
        let actions = compute_pod_actions(&ActionsInput {
            pod,
            status,
            probes: &probes,
        });
        let (sandbox_id, kills, starts) = match actions {
            PodActions::KillPod { cause } => {
                tracing::debug!(pod_uid = %uid, ?cause, "nothing will run again in the pod");
                self.kill_pod(pod, status, grace_of(pod)).await?;
                return Ok(SyncOutcome::Running { resync_after: None });
            }
            PodActions::CreateSandbox {
                attempt,
                cause,
                start,
            } => {
                if let Some(message) = cause.event_message() {
                    self.event(
                        pod,
                        EventType::Normal,
                        reason::SANDBOX_CHANGED,
                        message.into(),
                    );
                }
                if !status.sandboxes.is_empty() {
                    self.kill_pod(pod, status, grace_of(pod)).await?;
                }
                let config = self.sandbox_config(pod, attempt, cgroup.as_ref());
                let id = self
                    .runtime
                    .run_pod_sandbox(&config)
                    .await
                    .map_err(|err| self.sandbox_failed(pod, &err))?;
                (id, Vec::new(), start)
            }
            PodActions::Sync {
                sandbox_id,
                kill,
                start,
            } => (sandbox_id, kill, start),
        };

        for kill in &kills {
            self.kill_container(
                pod,
                &kill.id,
                &kill.name,
                &kill.message(),
                kill.grace_period(pod),
                None,
            )
            .await?;
        }
        if starts.is_empty() {
            self.lock_waiting()
                .insert(uid.to_owned(), WaitingReasons::new());
            return Ok(SyncOutcome::Running { resync_after: None });
        }

        let mut sandbox_status = self
            .runtime
            .pod_sandbox_status(&sandbox_id)
            .await
            .map_err(|e| SyncError::new("CreatePodSandboxError", e.to_string()))?;
        let now = SystemTime::now();
        let filtered = filter_backoff(pod, starts, &mut self.lock_backoff(), now);
        let mut waiting = WaitingReasons::new();
        for held in &filtered.waiting {
            self.event(
                pod,
                EventType::Warning,
                reason::BACK_OFF,
                held.message.clone(),
            );
            waiting.insert(
                held.container.clone(),
                WaitingReason::new(crate::status::CRASH_LOOP_BACK_OFF, held.message.clone()),
            );
        }
        let mut resync_after = filtered
            .next_resync()
            .map(|at| at.duration_since(SystemTime::now()).unwrap_or_default());
        for start in &filtered.to_start {
            let retry = match self
                .start_container(pod, &sandbox_id, &mut sandbox_status, start, &volumes)
                .await
            {
                Err(failure) => {
                    waiting.insert(
                        start.name.clone(),
                        WaitingReason::new(failure.reason, failure.message.clone()),
                    );
                    START_FAILURE_RETRY
                }
                // The next init container (or the regular ones) may start once this sidecar
                // runs: no runtime event says so (kubelet's 1 s relist would), so sync again
                // now. One with a startup probe is waited for by its probe's update.
                Ok(()) if start.kind == ContainerKind::Sidecar => Duration::ZERO,
                Ok(()) => continue,
            };
            resync_after = Some(resync_after.map_or(retry, |r| r.min(retry)));
        }
        self.lock_waiting().insert(uid.to_owned(), waiting);
        Ok(SyncOutcome::Running { resync_after })
    }
}

impl NodeSyncer {
    /// A sandbox that could not be made (or whose network failed): kubelet's
    /// `FailedCreatePodSandBox` event, and the sync's error.
    pub(super) fn sandbox_failed(&self, pod: &Pod, err: &RuntimeError) -> SyncError {
        let message = format!("Failed to create pod sandbox: {err}");
        self.event(
            pod,
            EventType::Warning,
            reason::FAILED_CREATE_POD_SANDBOX,
            message.clone(),
        );
        SyncError::new("CreatePodSandboxError", message)
    }
}

/// Syncs a running pod again no later than its active deadline (kubelet enqueues it then).
fn resync_at_deadline(outcome: SyncOutcome, deadline: Deadline) -> SyncOutcome {
    match (outcome, deadline) {
        (SyncOutcome::Running { resync_after }, Deadline::In(left)) => SyncOutcome::Running {
            resync_after: Some(resync_after.map_or(left, |r| r.min(left))),
        },
        (outcome, _) => outcome,
    }
}

/// A failed container start (config error, missing image) is retried this soon.
const START_FAILURE_RETRY: Duration = Duration::from_secs(10);

/// The probe manager's verdicts for one pod, as the action computation reads them.
struct PodProbes<'a> {
    manager: &'a ProbeManager,
    uid: &'a str,
}

impl ProbeResults for PodProbes<'_> {
    fn liveness(&self, container: &str, id: &ContainerId) -> ProbeVerdict {
        if self.manager.liveness_failed(self.uid, container, id) {
            ProbeVerdict::Failure
        } else {
            ProbeVerdict::Pending
        }
    }

    fn startup(&self, container: &str, id: &ContainerId) -> ProbeVerdict {
        if self.manager.restart_reason(self.uid, container, id) == Some(ProbeKind::Startup) {
            return ProbeVerdict::Failure;
        }
        match self.manager.startup_done(self.uid, container, id) {
            Some(true) => ProbeVerdict::Success,
            _ => ProbeVerdict::Pending,
        }
    }
}

/// The pod's termination grace period.
pub(crate) fn grace_of(pod: &Pod) -> Duration {
    let seconds = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(crate::config::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

pub(crate) fn running_containers(
    status: &PodStatus,
) -> impl Iterator<Item = &ironlet_runtime::types::ContainerStatus> {
    status
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
}

/// The pod's `hostPort`s, as kubelet hands them to the runtime (its containers' ports with a
/// host port; SCTP is not published).
fn host_ports(pod: &Pod) -> Vec<ironlet_runtime::types::PortMapping> {
    use ironlet_runtime::types::{PortMapping, Protocol};
    let containers = pod.spec.iter().flat_map(|s| s.containers.iter());
    containers
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let protocol = match p.protocol.as_deref() {
                None | Some("TCP") => Protocol::Tcp,
                Some("UDP") => Protocol::Udp,
                Some(_) => return None,
            };
            Some(PortMapping {
                protocol,
                container_port: u16::try_from(p.container_port).ok()?,
                host_port: u16::try_from(p.host_port?).ok().filter(|port| *port > 0)?,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
        })
        .collect()
}

//! The node-pressure half of the eviction loop (kubelet's eviction manager `synchronize`):
//! observe the signals, publish the pressure conditions, and when a threshold is due,
//! record `EvictionThresholdMet` on the Node, reclaim node-level resources (for disk: dead
//! containers and unused images, through the sync loop) and, if that was not enough, evict
//! the first pod of kubelet's ranking, then wait (up to 30 s) for it to be cleaned up.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, oneshot, watch};

use super::manager::{
    eviction_message, rank, ContainerUsage, Observations, PodUsage, PressureTracker,
};
use super::notifier::Notifiers;
use super::signals::{observe, SignalSources};
use super::thresholds::{EvictionSettings, PressureKind, Signal, Threshold};
use super::{evict_pod, is_critical, IMMEDIATE_EVICTION_GRACE_SECONDS};
use crate::config::pod_uid;
use crate::kubelet::events::{reason, EventType};
use crate::kubelet::stats::KubeletStats;
use crate::kubelet::syncer::NodeSyncer;
use crate::node::Pressure;
use crate::pod_workers::{PodLifecycle, PodWorkers};
use crate::server::kubelet_api::stats::{FsStats, StatsProvider, Summary};

/// kubelet's `podCleanupTimeout`.
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A request to the sync loop to reclaim node-level disk (container and image GC); the
/// sender is told when it is done.
pub type ReclaimRequest = oneshot::Sender<()>;

/// The state of node-pressure eviction.
pub struct NodePressure {
    pub settings: EvictionSettings,
    pub root_dir: PathBuf,
    pub image_dir: PathBuf,
    pub allocatable_memory_bytes: u64,
    pub stats: Arc<KubeletStats>,
    pub published: watch::Sender<Pressure>,
    pub reclaim: mpsc::Sender<ReclaimRequest>,
    pub tracker: PressureTracker,
    pub notifiers: Notifiers,
    /// When `EvictionThresholdMet` was last recorded, and for which signal.
    pub last_announced: Option<(Signal, Instant)>,
}

/// How often `EvictionThresholdMet` is recorded while the same threshold stays met
/// (kubelet records it at each 10 s synchronization).
const ANNOUNCE_PERIOD: Duration = Duration::from_secs(10);

/// The pressure conditions as the node controller reports them.
pub fn to_pressure(conditions: &BTreeSet<PressureKind>) -> Pressure {
    Pressure {
        memory: conditions.contains(&PressureKind::Memory),
        disk: conditions.contains(&PressureKind::Disk),
        pid: conditions.contains(&PressureKind::Pid),
    }
}

/// The conditions of a published pressure.
pub fn from_pressure(pressure: Pressure) -> BTreeSet<PressureKind> {
    [
        (pressure.memory, PressureKind::Memory),
        (pressure.disk, PressureKind::Disk),
        (pressure.pid, PressureKind::Pid),
    ]
    .into_iter()
    .filter_map(|(on, kind)| on.then_some(kind))
    .collect()
}

impl NodePressure {
    async fn observe(&self) -> Observations {
        let root_dir = self.root_dir.clone();
        let image_dir = self.image_dir.clone();
        let cgroups = self.stats.cgroups.clone();
        let allocatable_memory_bytes = self.allocatable_memory_bytes;
        tokio::task::spawn_blocking(move || {
            observe(&SignalSources {
                root_dir: &root_dir,
                image_dir: &image_dir,
                cgroups: cgroups.as_ref(),
                allocatable_memory_bytes,
            })
        })
        .await
        .unwrap_or_default()
    }

    fn publish(&self, conditions: &BTreeSet<PressureKind>) {
        let pressure = to_pressure(conditions);
        self.published.send_if_modified(|current| {
            if *current == pressure {
                return false;
            }
            for kind in [PressureKind::Memory, PressureKind::Disk, PressureKind::Pid] {
                let (was, is) = (
                    from_pressure(*current).contains(&kind),
                    conditions.contains(&kind),
                );
                if was != is {
                    tracing::info!(
                        condition = kind.condition(),
                        status = is,
                        "node condition changed"
                    );
                }
            }
            *current = pressure;
            true
        });
    }

    /// Waits for a memory threshold notification (cgroup v1) or memory pressure
    /// notification (cgroup v2); never without cgroups.
    pub async fn notified(&mut self) -> Signal {
        self.notifiers.fired().await
    }

    /// Re-arms the memory notifiers at the largest threshold of each memory signal.
    fn arm_notifiers(&mut self, observations: &Observations) {
        self.notifiers.start(self.stats.cgroups.as_ref());
        for (signal, notifier) in [
            (Signal::MemoryAvailable, &mut self.notifiers.node),
            (Signal::AllocatableMemoryAvailable, &mut self.notifiers.pods),
        ] {
            let (Some(armed), Some(observation)) = (notifier.as_mut(), observations.get(&signal))
            else {
                continue;
            };
            let Some(threshold) = self
                .settings
                .thresholds
                .iter()
                .filter(|t| t.signal == signal)
                .map(|t| t.value.amount(observation.capacity))
                .max()
            else {
                *notifier = None;
                continue;
            };
            if let Err(err) = armed.arm(observation.capacity, threshold) {
                tracing::info!(%err, signal = signal.name(), "memory threshold notifications unavailable; the monitoring period applies");
                *notifier = None;
            }
        }
    }

    /// One monitoring period.
    pub async fn step(&mut self, workers: &PodWorkers, syncer: &NodeSyncer) {
        let observations = self.observe().await;
        self.arm_notifiers(&observations);
        let decision = self
            .tracker
            .observe(&self.settings, &observations, Instant::now());
        self.publish(&decision.conditions);
        let Some(threshold) = decision.reclaim else {
            return;
        };
        let resource = threshold.signal.resource();
        let now = Instant::now();
        let announce = self.last_announced.is_none_or(|(signal, at)| {
            signal != threshold.signal || now.saturating_duration_since(at) >= ANNOUNCE_PERIOD
        });
        if announce {
            self.last_announced = Some((threshold.signal, now));
            syncer.events.node_event(
                EventType::Warning,
                reason::EVICTION_THRESHOLD_MET,
                format!("Attempting to reclaim {resource}"),
            );
        }
        let mut observations = observations;
        if threshold.signal.pressure() == PressureKind::Disk {
            let (done, reclaimed) = oneshot::channel();
            if self.reclaim.send(done).await.is_ok() {
                let _ = reclaimed.await;
            }
            observations = self.observe().await;
            let still = self
                .tracker
                .observe(&self.settings, &observations, Instant::now());
            if still
                .reclaim
                .is_none_or(|t| t.signal.pressure() != PressureKind::Disk)
            {
                tracing::info!(
                    resource,
                    "node-level reclaim relieved the pressure; no pod evicted"
                );
                return;
            }
        }
        self.evict_one(workers, syncer, &threshold, &observations, announce)
            .await;
    }

    async fn evict_one(
        &self,
        workers: &PodWorkers,
        syncer: &NodeSyncer,
        threshold: &Threshold,
        observations: &Observations,
        announce: bool,
    ) {
        let candidates: Vec<Arc<Pod>> = workers
            .known_uids()
            .iter()
            .filter_map(|uid| workers.pod(uid))
            .filter(|(pod, state)| {
                *state == PodLifecycle::Syncing
                    && !is_critical(pod)
                    && syncer.eviction_of(pod_uid(pod)).is_none()
            })
            .map(|(pod, _)| pod)
            .collect();
        if candidates.is_empty() {
            if !announce {
                return;
            }
            tracing::warn!(
                resource = threshold.signal.resource(),
                "eviction threshold met, but no pod to evict"
            );
            return;
        }
        let stats = self.stats.clone();
        let kind = threshold.signal.pressure();
        let listed = candidates.clone();
        let measured = tokio::task::spawn_blocking(move || {
            let summary = stats.summary().ok();
            listed
                .into_iter()
                .map(|pod| measure(pod, summary.as_ref(), kind))
                .collect::<Vec<_>>()
        })
        .await;
        let Ok(mut measured) = measured else { return };
        let mut ranked: Vec<PodUsage> = measured.iter().map(|(usage, _)| usage.clone()).collect();
        rank(&mut ranked, kind);
        let Some(victim) = ranked.first() else { return };
        let uid = pod_uid(&victim.pod).to_owned();
        let containers = measured
            .iter_mut()
            .find(|(usage, _)| pod_uid(&usage.pod) == uid)
            .map(|(_, containers)| std::mem::take(containers))
            .unwrap_or_default();
        let message = eviction_message(threshold, observations.get(&threshold.signal), &containers);
        let grace = if threshold.is_hard() {
            IMMEDIATE_EVICTION_GRACE_SECONDS
        } else {
            let own = victim
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30);
            self.settings.max_pod_grace_period_seconds.min(own).max(0)
        };
        evict_pod(workers, syncer, victim.pod.clone(), message, grace, true);
        syncer
            .metrics
            .evictions
            .with([threshold.signal.name()])
            .inc();
        // kubelet's waitForPodsCleanup: the next decision sees the freed resources.
        let deadline = Instant::now() + POD_CLEANUP_TIMEOUT;
        while Instant::now() < deadline && !workers.is_pod_terminated(&uid) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A pod's usage of the starved resource and its containers' (memory and disk), from the
/// Summary (pods without a running container have none: they rank first, as in kubelet).
fn measure(
    pod: Arc<Pod>,
    summary: Option<&Summary>,
    kind: PressureKind,
) -> (PodUsage, Vec<ContainerUsage>) {
    let uid = pod_uid(&pod).to_owned();
    let stats = summary.and_then(|s| s.pods.iter().find(|p| p.pod_ref.uid == uid));
    let spec_containers = pod.spec.iter().flat_map(|s| s.containers.iter());
    let container_request = |name: &str| -> u64 {
        let Some(container) = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .find(|c| c.name == name)
        else {
            return 0;
        };
        match kind {
            PressureKind::Memory => crate::qos::container_requirements(container)
                .ok()
                .and_then(|r| r.memory_request_bytes)
                .unwrap_or(0),
            PressureKind::Disk => ephemeral_request(container),
            PressureKind::Pid => 0,
        }
    };
    let (usage, request, containers) = match kind {
        PressureKind::Memory => {
            let request = crate::qos::pod_requests(&pod).map_or(0, |r| r.memory_bytes);
            let containers = stats
                .map(|s| {
                    s.containers
                        .iter()
                        .filter_map(|c| {
                            Some(ContainerUsage {
                                name: c.name.clone(),
                                usage: c.memory?.working_set_bytes,
                                request: container_request(&c.name),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                stats.and_then(|s| s.memory.map(|m| m.working_set_bytes)),
                request,
                containers,
            )
        }
        PressureKind::Disk => {
            // kubelet's `podDiskUsage` over rootfs, logs and local volumes: the Summary's
            // `ephemeral-storage`; a container's share is its writable layer and its logs.
            let request = spec_containers.map(ephemeral_request).sum();
            let used = |fs: Option<FsStats>| fs.and_then(|f| f.used_bytes).unwrap_or(0);
            let containers: Vec<ContainerUsage> = stats
                .map(|s| {
                    s.containers
                        .iter()
                        .map(|c| ContainerUsage {
                            name: c.name.clone(),
                            usage: used(c.rootfs) + used(c.logs),
                            request: container_request(&c.name),
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                stats.map(|s| used(s.ephemeral_storage)),
                request,
                containers,
            )
        }
        PressureKind::Pid => (
            stats.and_then(|s| s.process_stats.map(|p| p.process_count)),
            0,
            Vec::new(),
        ),
    };
    let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    (
        PodUsage {
            pod,
            usage,
            request,
            priority,
        },
        containers,
    )
}

/// A container's `requests.ephemeral-storage` in bytes (0 when unset or malformed).
fn ephemeral_request(container: &k8s_openapi::api::core::v1::Container) -> u64 {
    container
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("ephemeral-storage"))
        .and_then(|q| crate::qos::Quantity::parse(&q.0).ok())
        .and_then(|q| q.amount().ok())
        .unwrap_or(0)
}

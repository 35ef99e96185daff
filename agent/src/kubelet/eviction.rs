//! Local storage eviction: kubelet's eviction manager `localStorageEviction` →
//! `emptyDirLimitEviction` (`pkg/kubelet/eviction/eviction_manager.go`, v1.37).
//!
//! Every [`KubeletConfig::eviction_monitoring_period`](super::KubeletConfig) the disk usage
//! of each disk-backed emptyDir with a positive `sizeLimit` of each pod being synced is
//! measured (allocated blocks, as `du -x`). A pod whose volume uses more than its limit is
//! evicted as kubelet evicts it:
//!
//! * a `Warning` event with reason `Evicted` and kubelet's message
//!   `Usage of EmptyDir volume "<name>" exceeds the limit "<sizeLimit>". `;
//! * its containers are killed with a grace period of 1 s (kubelet's
//!   `immediateEvictionGracePeriodSeconds`; shorter when the pod's own is);
//! * its status becomes phase `Failed`, reason `Evicted`, that message; it is not restarted
//!   (its worker terminates; a static pod comes back only with a changed manifest).
//!
//! Differences from kubelet, on purpose or not yet done:
//! * kubelet adds no `DisruptionTarget` condition for local-storage evictions (the condition
//!   argument of `evictPod` is nil there) and neither does ironlet;
//! * kubelet never evicts "critical" pods, and every static pod is critical to it
//!   (`IsCriticalPod`): there a static pod may fill the node's disk. ironlet's static pods
//!   are its ordinary workload, so only pods of system-critical priority (≥ 2 000 000 000)
//!   are exempt;
//! * the limit in the message is the spec's text (the API server's canonical form for API
//!   pods; kubelet re-formats a static pod's `1024Ki` as `1Mi`, ironlet does not);
//! * memory-backed emptyDirs are bounded by their tmpfs `size=` instead (kubelet does the
//!   same with `InPlacePodVerticalScalingMemoryBackedVolumes`); pod and container
//!   `ephemeral-storage` limits are not enforced.
//!
//! Node-pressure eviction (signals, thresholds, conditions, ranking) is in [`thresholds`],
//! [`manager`] and [`pressure`]; it runs in the same loop, after the emptyDir check.

pub mod manager;
pub mod notifier;
pub mod pressure;
pub mod signals;
pub mod thresholds;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::events::{reason, EventType};
use super::syncer::NodeSyncer;
use crate::config::{pod_full_name, pod_uid};
use crate::pod_workers::{KillPodOptions, PodLifecycle, PodWorkers, UpdatePodOptions, UpdateType};
use crate::qos::Quantity;
use crate::volumes::VolumePlugin;

/// kubelet's `immediateEvictionGracePeriodSeconds`.
pub const IMMEDIATE_EVICTION_GRACE_SECONDS: i64 = 1;
/// kubelet's `SystemCriticalPriority`: pods at or above it are never evicted.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One emptyDir whose usage eviction watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitedVolume {
    /// The volume's name.
    pub name: String,
    /// `<pods_dir>/<uid>/volumes/kubernetes.io~empty-dir/<name>`.
    pub path: PathBuf,
    /// The limit in bytes (positive).
    pub limit_bytes: u64,
    /// The limit as the spec spells it.
    pub limit_text: String,
}

/// The disk-backed emptyDirs of `pod` with a positive `sizeLimit` (unparsable limits are
/// skipped: volume set-up refuses them already).
pub fn limited_volumes(pod: &Pod, pods_dir: &Path) -> Vec<LimitedVolume> {
    let uid = pod_uid(pod);
    if uid.is_empty() || uid.contains('/') || uid == "." || uid == ".." {
        return Vec::new();
    }
    let dir = pods_dir
        .join(uid)
        .join("volumes")
        .join(VolumePlugin::EmptyDir.dir_name());
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|volume| {
            let empty_dir = volume.empty_dir.as_ref()?;
            if empty_dir.medium.as_deref().is_some_and(|m| !m.is_empty()) {
                return None;
            }
            let text = &empty_dir.size_limit.as_ref()?.0;
            let limit_bytes = Quantity::parse(text).and_then(|q| q.amount()).ok()?;
            if limit_bytes == 0 || volume.name.contains('/') || volume.name.starts_with('.') {
                return None;
            }
            Some(LimitedVolume {
                name: volume.name.clone(),
                path: dir.join(&volume.name),
                limit_bytes,
                limit_text: text.clone(),
            })
        })
        .collect()
}

/// kubelet's `emptyDirMessageFmt`.
pub fn empty_dir_message(volume: &str, limit: &str) -> String {
    format!("Usage of EmptyDir volume {volume:?} exceeds the limit {limit:?}. ")
}

/// The eviction message for the first volume of `volumes` that uses more than its limit.
pub fn over_limit(volumes: &[LimitedVolume], usage: impl Fn(&Path) -> u64) -> Option<String> {
    volumes
        .iter()
        .find(|v| usage(&v.path) > v.limit_bytes)
        .map(|v| empty_dir_message(&v.name, &v.limit_text))
}

/// Whether eviction leaves `pod` alone (see the module docs on static pods).
pub fn is_critical(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.priority)
        .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// Checks every pod being synced every `period` until the task is aborted: emptyDir limits,
/// then node pressure.
pub(super) async fn run(
    workers: PodWorkers,
    syncer: Arc<NodeSyncer>,
    pods_dir: PathBuf,
    period: Duration,
    mut node: pressure::NodePressure,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            signal = node.notified() => {
                // The node's level is crossed often (page cache comes and goes).
                if signal == thresholds::Signal::MemoryAvailable {
                    tracing::debug!(signal = signal.name(), "memory threshold notification; synchronizing now");
                } else {
                    tracing::info!(signal = signal.name(), "memory threshold notification; synchronizing now");
                }
            }
        }
        empty_dir_step(&workers, &syncer, &pods_dir).await;
        node.step(&workers, &syncer).await;
    }
}

async fn empty_dir_step(workers: &PodWorkers, syncer: &NodeSyncer, pods_dir: &Path) {
    let candidates: Vec<(Arc<Pod>, Vec<LimitedVolume>)> = workers
        .known_uids()
        .iter()
        .filter_map(|uid| workers.pod(uid))
        .filter(|(pod, state)| *state == PodLifecycle::Syncing && !is_critical(pod))
        .map(|(pod, _)| {
            let volumes = limited_volumes(&pod, pods_dir);
            (pod, volumes)
        })
        .filter(|(_, volumes)| !volumes.is_empty())
        .collect();
    if candidates.is_empty() {
        return;
    }
    let measured = tokio::task::spawn_blocking(move || {
        candidates
            .into_iter()
            .filter_map(|(pod, volumes)| {
                over_limit(&volumes, ironlet_runtime::fsutil::disk_usage)
                    .map(|message| (pod, message))
            })
            .collect::<Vec<_>>()
    })
    .await;
    let evict = match measured {
        Ok(evict) => evict,
        Err(err) => {
            tracing::warn!(%err, "measuring emptyDir usage failed");
            return;
        }
    };
    for (pod, message) in evict {
        // kubelet's local-storage evictions set no DisruptionTarget condition.
        let disruption_target = false;
        syncer.metrics.evictions.with(["emptydirfs.limit"]).inc();
        evict_pod(
            workers,
            syncer,
            pod,
            message,
            IMMEDIATE_EVICTION_GRACE_SECONDS,
            disruption_target,
        );
    }
}

/// kubelet's `evictPod`: event, the status to report, the kill.
fn evict_pod(
    workers: &PodWorkers,
    syncer: &NodeSyncer,
    pod: Arc<Pod>,
    message: String,
    grace_seconds: i64,
    disruption_target: bool,
) {
    tracing::info!(pod = %pod_full_name(&pod), pod_uid = %pod_uid(&pod), %message, grace_seconds, "evicting pod");
    syncer.record_eviction(
        pod_uid(&pod),
        reason::EVICTED,
        message.clone(),
        disruption_target,
    );
    syncer.event(&pod, EventType::Warning, reason::EVICTED, message);
    workers.update_pod(UpdatePodOptions {
        update_type: UpdateType::Kill,
        pod,
        kill: Some(KillPodOptions {
            grace_period_override: Some(grace_seconds),
            completed: None,
        }),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(volumes: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: p, uid: u1}}\nspec:\n  containers: [{{name: c, image: i}}]\n  volumes:\n{volumes}"
        ))
        .unwrap()
    }

    #[test]
    fn only_disk_empty_dirs_with_a_positive_limit_are_watched() {
        let pod = pod(concat!(
            "  - {name: a, emptyDir: {sizeLimit: 1Mi}}\n",
            "  - {name: b, emptyDir: {}}\n",
            "  - {name: c, emptyDir: {medium: Memory, sizeLimit: 1Mi}}\n",
            "  - {name: d, emptyDir: {sizeLimit: \"0\"}}\n",
            "  - {name: e, hostPath: {path: /tmp}}\n",
        ));
        let watched = limited_volumes(&pod, Path::new("/r/pods"));
        assert_eq!(
            watched,
            vec![LimitedVolume {
                name: "a".into(),
                path: "/r/pods/u1/volumes/kubernetes.io~empty-dir/a".into(),
                limit_bytes: 1 << 20,
                limit_text: "1Mi".into(),
            }]
        );
    }

    #[test]
    fn usage_above_the_limit_gives_kubelets_message_and_equal_usage_does_not() {
        let pod = pod("  - {name: scratch, emptyDir: {sizeLimit: 1Mi}}\n");
        let watched = limited_volumes(&pod, Path::new("/r/pods"));
        assert_eq!(over_limit(&watched, |_| 1 << 20), None);
        assert_eq!(
            over_limit(&watched, |_| (1 << 20) + 1).as_deref(),
            Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ")
        );
    }

    #[test]
    fn system_critical_pods_are_exempt() {
        let mut p = pod("  - {name: a, emptyDir: {sizeLimit: 1Mi}}\n");
        assert!(!is_critical(&p));
        p.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY);
        assert!(is_critical(&p));
    }
}

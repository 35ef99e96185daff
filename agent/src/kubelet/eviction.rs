//! Local storage eviction: kubelet's eviction manager `localStorageEviction`
//! (`pkg/kubelet/eviction/eviction_manager.go`, v1.37), its three checks in its order:
//!
//! 1. `emptyDirLimitEviction`: the disk usage of each disk-backed emptyDir with a positive
//!    `sizeLimit` (allocated blocks, as `du -x`) above that limit:
//!    `Usage of EmptyDir volume "<name>" exceeds the limit "<sizeLimit>". `;
//! 2. `podEphemeralStorageLimitEviction`: the pod's `ephemeral-storage` usage (the Summary's:
//!    writable layers, logs, disk-backed volumes) above the pod's limit, kubelet's
//!    `PodLimits` (the containers' and sidecars' limits summed, at least the largest init
//!    container's): `Pod ephemeral local storage usage exceeds the total limit of containers
//!    <limit>. `;
//! 3. `containerEphemeralStorageLimitEviction`: a container's writable layer plus logs above
//!    its `limits.ephemeral-storage`:
//!    `Container <name> exceeded its local ephemeral storage limit "<limit>". `
//!
//! They run every [`KubeletConfig::eviction_monitoring_period`](super::KubeletConfig) on each
//! pod being synced (the Summary is only read when some pod has an `ephemeral-storage`
//! limit). A pod over one of them is evicted as kubelet evicts it:
//!
//! * a `Warning` event with reason `Evicted` and that message;
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
//! * an emptyDir's limit in the message is the spec's text (the API server's canonical form
//!   for API pods; kubelet re-formats a static pod's `1024Ki` as `1Mi`, ironlet does not);
//!   `ephemeral-storage` limits are written in the canonical form, as kubelet does;
//! * memory-backed emptyDirs are bounded by their tmpfs `size=` instead (kubelet does the
//!   same with `InPlacePodVerticalScalingMemoryBackedVolumes`).
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
use super::stats::KubeletStats;
use super::syncer::NodeSyncer;
use crate::config::{pod_full_name, pod_uid};
use crate::pod_workers::{KillPodOptions, PodLifecycle, PodWorkers, UpdatePodOptions, UpdateType};
use crate::qos::Quantity;
use crate::server::kubelet_api::stats::{FsStats, PodStats, StatsProvider};
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

/// An `ephemeral-storage` limit: bytes and kubelet's canonical rendering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageLimit {
    /// The limit in bytes (positive).
    pub bytes: u64,
    /// As Go's `resource.Quantity.String()` prints it.
    pub text: String,
}

/// The `ephemeral-storage` limits of a pod: kubelet's `PodLimits` and each regular
/// container's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageLimits {
    /// The pod's limit, when any container sets one.
    pub pod: Option<StorageLimit>,
    /// Regular containers with a positive limit.
    pub containers: Vec<(String, StorageLimit)>,
}

impl StorageLimits {
    /// Reads them from `pod`'s spec (unparsable limits count as unset: admission refuses
    /// them already).
    pub fn of(pod: &Pod) -> Self {
        let Some(spec) = pod.spec.as_ref() else {
            return Self::default();
        };
        let limit = |c: &k8s_openapi::api::core::v1::Container| {
            let text = &c
                .resources
                .as_ref()?
                .limits
                .as_ref()?
                .get("ephemeral-storage")?
                .0;
            let bytes = Quantity::parse(text).and_then(|q| q.amount()).ok()?;
            Some((bytes, binary_suffix(text)))
        };
        let sidecar = |c: &&k8s_openapi::api::core::v1::Container| {
            c.restart_policy.as_deref() == Some("Always")
        };
        let init = spec.init_containers.iter().flatten();
        // kubelet's PodLimits: the sum keeps the format of its first addend.
        let mut sum: Option<(u64, bool)> = None;
        for (bytes, binary) in spec
            .containers
            .iter()
            .chain(init.clone().filter(sidecar))
            .filter_map(limit)
        {
            sum = Some(match sum {
                None => (bytes, binary),
                Some((total, first_binary)) => (total.saturating_add(bytes), first_binary),
            });
        }
        let largest_init = init
            .filter(|c| !sidecar(c))
            .filter_map(limit)
            .max_by_key(|(bytes, _)| *bytes);
        let pod_limit = match (sum, largest_init) {
            (Some((total, binary)), Some((init, _))) if init <= total => Some((total, binary)),
            (_, Some(init)) => Some(init),
            (sum, None) => sum,
        };
        Self {
            pod: pod_limit
                .filter(|(bytes, _)| *bytes > 0)
                .map(|(bytes, binary)| StorageLimit {
                    bytes,
                    text: canonical_bytes(bytes, binary),
                }),
            containers: spec
                .containers
                .iter()
                .filter_map(|c| {
                    let (bytes, binary) = limit(c).filter(|(bytes, _)| *bytes > 0)?;
                    let text = canonical_bytes(bytes, binary);
                    Some((c.name.clone(), StorageLimit { bytes, text }))
                })
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.pod.is_none() && self.containers.is_empty()
    }
}

/// Whether a quantity's text has a binary suffix (Go's `BinarySI` format).
fn binary_suffix(text: &str) -> bool {
    let text = text.trim();
    ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
        .iter()
        .any(|suffix| text.ends_with(suffix))
}

/// Go's canonical rendering of a whole number of bytes: `1Mi`, `1536Ki`, `2M`, `1500k`,
/// `999` (binary below 1024 prints as decimal, as Go does).
pub fn canonical_bytes(bytes: u64, binary: bool) -> String {
    let (base, suffixes) = if binary && bytes >= 1024 {
        (1024, ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
    } else {
        (1000, ["", "k", "M", "G", "T", "P", "E"])
    };
    let (mut number, mut power) = (bytes, 0);
    while number != 0 && number % base == 0 && power + 1 < suffixes.len() {
        number /= base;
        power += 1;
    }
    format!("{number}{}", suffixes[power])
}

/// kubelet's `podEphemeralStorageMessageFmt`.
pub fn pod_storage_message(limit: &str) -> String {
    format!("Pod ephemeral local storage usage exceeds the total limit of containers {limit}. ")
}

/// kubelet's `containerEphemeralStorageMessageFmt`.
pub fn container_storage_message(container: &str, limit: &str) -> String {
    format!("Container {container} exceeded its local ephemeral storage limit {limit:?}. ")
}

/// kubelet's pod, then container `ephemeral-storage` checks against `stats` (the pod's
/// Summary entry): the first limit exceeded, as kubelet's eviction signal name
/// (`ephemeralpodfs.limit`, `ephemeralcontainerfs.limit`) and message.
pub fn over_storage_limit(
    limits: &StorageLimits,
    stats: &PodStats,
) -> Option<(&'static str, String)> {
    let used = |fs: &Option<FsStats>| fs.as_ref().and_then(|f| f.used_bytes).unwrap_or(0);
    if let Some(limit) = &limits.pod {
        if used(&stats.ephemeral_storage) > limit.bytes {
            return Some(("ephemeralpodfs.limit", pod_storage_message(&limit.text)));
        }
    }
    stats.containers.iter().find_map(|c| {
        let (_, limit) = limits.containers.iter().find(|(name, _)| *name == c.name)?;
        // No dedicated image filesystem: the writable layer counts, as with kubelet.
        let usage = used(&c.logs).saturating_add(used(&c.rootfs));
        (usage > limit.bytes).then(|| {
            let message = container_storage_message(&c.name, &limit.text);
            ("ephemeralcontainerfs.limit", message)
        })
    })
}

/// Whether eviction leaves `pod` alone (see the module docs on static pods).
pub fn is_critical(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.priority)
        .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// Checks every pod being synced every `period` until the task is aborted: local storage
/// limits, then node pressure.
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
        local_storage_step(&workers, &syncer, &pods_dir, &node.stats).await;
        node.step(&workers, &syncer).await;
    }
}

/// A pod with local storage limits: its limited emptyDirs and `ephemeral-storage` limits.
type LimitedPod = (Arc<Pod>, Vec<LimitedVolume>, StorageLimits);

async fn local_storage_step(
    workers: &PodWorkers,
    syncer: &NodeSyncer,
    pods_dir: &Path,
    stats: &Arc<KubeletStats>,
) {
    let candidates: Vec<LimitedPod> = workers
        .known_uids()
        .iter()
        .filter_map(|uid| workers.pod(uid))
        .filter(|(pod, state)| *state == PodLifecycle::Syncing && !is_critical(pod))
        .map(|(pod, _)| {
            let volumes = limited_volumes(&pod, pods_dir);
            let limits = StorageLimits::of(&pod);
            (pod, volumes, limits)
        })
        .filter(|(_, volumes, limits)| !volumes.is_empty() || !limits.is_empty())
        .collect();
    if candidates.is_empty() {
        return;
    }
    let stats = stats.clone();
    let measured = tokio::task::spawn_blocking(move || {
        // The Summary walks every pod's files: read it only when a limit needs it.
        let summary = candidates
            .iter()
            .any(|(_, _, limits)| !limits.is_empty())
            .then(|| stats.summary())
            .transpose();
        let summary = match summary {
            Ok(summary) => summary,
            Err(err) => {
                tracing::warn!(%err, "reading pod storage usage failed");
                None
            }
        };
        candidates
            .into_iter()
            .filter_map(|(pod, volumes, limits)| {
                if let Some(message) = over_limit(&volumes, ironlet_runtime::fsutil::disk_usage) {
                    return Some((pod, "emptydirfs.limit", message));
                }
                let uid = pod_uid(&pod);
                let pod_stats = summary
                    .as_ref()?
                    .pods
                    .iter()
                    .find(|p| p.pod_ref.uid == uid)?;
                let (signal, message) = over_storage_limit(&limits, pod_stats)?;
                Some((pod, signal, message))
            })
            .collect::<Vec<_>>()
    })
    .await;
    let evict = match measured {
        Ok(evict) => evict,
        Err(err) => {
            tracing::warn!(%err, "measuring local storage usage failed");
            return;
        }
    };
    for (pod, signal, message) in evict {
        // kubelet's local-storage evictions set no DisruptionTarget condition.
        let disruption_target = false;
        syncer.metrics.evictions.with([signal]).inc();
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
    use crate::server::kubelet_api::stats::ContainerStats;

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

    fn limits_of(containers: &str) -> StorageLimits {
        let pod: Pod = serde_yaml::from_str(&format!(
            "metadata: {{name: p, uid: u1}}\nspec:\n{containers}"
        ))
        .unwrap();
        StorageLimits::of(&pod)
    }

    #[test]
    fn canonical_quantities_are_gos() {
        assert_eq!(canonical_bytes(1 << 20, true), "1Mi");
        assert_eq!(canonical_bytes(1536 * 1024, true), "1536Ki");
        assert_eq!(canonical_bytes(1000, true), "1k");
        assert_eq!(canonical_bytes(2_000_000, false), "2M");
        assert_eq!(canonical_bytes(1_500_000, false), "1500k");
        assert_eq!(canonical_bytes(999, false), "999");
        assert_eq!(canonical_bytes(0, false), "0");
    }

    #[test]
    fn the_pod_limit_sums_containers_and_sidecars_and_is_at_least_the_largest_init() {
        let limits = limits_of(concat!(
            "  initContainers:\n",
            "  - {name: i, image: b, resources: {limits: {ephemeral-storage: 3Mi}}}\n",
            "  - {name: s, image: b, restartPolicy: Always, resources: {limits: {ephemeral-storage: 1Mi}}}\n",
            "  containers:\n",
            "  - {name: a, image: b, resources: {limits: {ephemeral-storage: 1024Ki}}}\n",
            "  - {name: b, image: b, resources: {limits: {ephemeral-storage: 2Mi}}}\n",
            "  - {name: c, image: b}\n",
        ));
        let mib = |n: u64| StorageLimit {
            bytes: n << 20,
            text: format!("{n}Mi"),
        };
        assert_eq!(limits.pod, Some(mib(4)));
        assert_eq!(
            limits.containers,
            vec![("a".to_owned(), mib(1)), ("b".to_owned(), mib(2))]
        );
        let init_wins = limits_of(concat!(
            "  initContainers: [{name: i, image: b, resources: {limits: {ephemeral-storage: 5M}}}]\n",
            "  containers: [{name: a, image: b, resources: {limits: {ephemeral-storage: 1Mi}}}]\n",
        ));
        assert_eq!(init_wins.pod.map(|l| l.text).as_deref(), Some("5M"));
        assert!(limits_of("  containers: [{name: a, image: b}]\n").is_empty());
    }

    #[test]
    fn the_pod_limit_is_checked_before_the_containers_and_usage_equal_to_a_limit_is_fine() {
        let limits = limits_of(concat!(
            "  containers:\n",
            "  - {name: a, image: b, resources: {limits: {ephemeral-storage: 1Mi}}}\n",
            "  - {name: b, image: b, resources: {limits: {ephemeral-storage: 1Mi}}}\n",
        ));
        let fs = |bytes: u64| {
            Some(FsStats {
                used_bytes: Some(bytes),
                ..FsStats::default()
            })
        };
        let container = |name: &str| ContainerStats {
            name: name.into(),
            ..ContainerStats::default()
        };
        let stats = |pod: u64, a_rootfs: u64, a_logs: u64| -> PodStats {
            let mut stats = PodStats {
                containers: vec![container("a"), container("b")],
                ephemeral_storage: fs(pod),
                ..PodStats::default()
            };
            stats.containers[0].rootfs = fs(a_rootfs);
            stats.containers[0].logs = fs(a_logs);
            stats
        };
        let mib = 1u64 << 20;
        assert_eq!(over_storage_limit(&limits, &stats(2 * mib, mib, 0)), None);
        assert_eq!(
            over_storage_limit(&limits, &stats(2 * mib, mib - 10, 11)),
            Some((
                "ephemeralcontainerfs.limit",
                "Container a exceeded its local ephemeral storage limit \"1Mi\". ".to_owned()
            ))
        );
        assert_eq!(
            over_storage_limit(&limits, &stats(2 * mib + 1, 2 * mib, 0)),
            Some((
                "ephemeralpodfs.limit",
                "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. "
                    .to_owned()
            ))
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

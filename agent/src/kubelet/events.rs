//! Kubernetes events about pods (`Pulled`, `Created`, `Started`, `Killing`, `BackOff`,
//! `Unhealthy`, `FailedMount`, …) behind the [`EventRecorder`] seam: logged through
//! `tracing` without an API server; with one, [`crate::apiserver::ApiRecorder`] writes them.

use k8s_openapi::api::core::v1::Pod;

use crate::config::pod_full_name;

/// `Normal` or `Warning`, as in `v1.Event.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// kubelet's event reasons (`pkg/kubelet/events`), as values to match.
pub mod reason {
    pub const PULLING: &str = "Pulling";
    pub const PULLED: &str = "Pulled";
    /// The waiting reason of a container whose image pull is in back-off.
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    pub const FAILED: &str = "Failed";
    pub const CREATED: &str = "Created";
    pub const STARTED: &str = "Started";
    pub const KILLING: &str = "Killing";
    pub const BACK_OFF: &str = "BackOff";
    pub const UNHEALTHY: &str = "Unhealthy";
    /// A probe succeeded with a warning (a redirect to another host).
    pub const PROBE_WARNING: &str = "ProbeWarning";
    pub const FAILED_MOUNT: &str = "FailedMount";
    pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
    pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";
    pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";
    pub const SANDBOX_CHANGED: &str = "SandboxChanged";
    /// ironlet's own: a rootless pod's pasta ended and was restarted (no kubelet
    /// equivalent; rootless pods have no CNI plugin whose failure kubelet would report).
    pub const POD_NETWORK_RESTARTED: &str = "PodNetworkRestarted";
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    /// The eviction manager evicted the pod (kubelet's `eviction.Reason`).
    pub const EVICTED: &str = "Evicted";
    /// The pod ran past its `activeDeadlineSeconds` (kubelet's active deadline handler).
    pub const DEADLINE_EXCEEDED: &str = crate::kubelet::active_deadline::REASON;
    /// Image GC could not free enough (a Node event).
    pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";
    /// Image GC failed twice in a row (a Node event).
    pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";
    /// The image file system reports no capacity (a Node event).
    pub const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";
    /// A node event: an eviction threshold is met (kubelet's `EvictionThresholdMet`).
    pub const EVICTION_THRESHOLD_MET: &str = "EvictionThresholdMet";
}

/// Where pod events go.
pub trait EventRecorder: Send + Sync {
    fn event(&self, pod: &Pod, kind: EventType, reason: &'static str, message: String);
    /// An event about the node itself (image GC, …). Default: logged.
    fn node_event(&self, kind: EventType, reason: &'static str, message: String) {
        match kind {
            EventType::Normal => tracing::info!(object = "node", reason, %message, "event"),
            EventType::Warning => tracing::warn!(object = "node", reason, %message, "event"),
        }
    }
}

/// Logs events; the default without an API server.
#[derive(Debug, Default)]
pub struct TracingRecorder;

impl EventRecorder for TracingRecorder {
    fn event(&self, pod: &Pod, kind: EventType, reason: &'static str, message: String) {
        let pod = pod_full_name(pod);
        match kind {
            EventType::Normal => tracing::info!(%pod, reason, %message, "event"),
            EventType::Warning => tracing::warn!(%pod, reason, %message, "event"),
        }
    }
}

//! The two seams the agent programs against: [`Runtime`] (sandboxes and containers) and
//! [`ImageService`] (the local image store).
//!
//! They follow the kubelet's CRI split (`RuntimeService` / `ImageService`) at the level of
//! sandboxes and containers; the pod-level sync logic (`SyncPod`, `KillPod`) lives in the
//! agent, which composes these calls. Every method is async and cancel-safe in the sense
//! that dropping the future never leaves a half-created container behind: creation rolls
//! back on its own error paths, and the state directory records what was made so that a
//! later `remove_*` or start-up can finish the job.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{ImageError, RuntimeError};
use crate::image::{PullReport, PullRequest};
use crate::types::{
    ContainerConfig, ContainerFilter, ContainerId, ContainerStatus, ExecOutput, ExecRequest,
    ExecSession, Image, ImageStats, PodSandboxConfig, PodSandboxStatus, PodStatus, SandboxId,
};

/// An event the runtime reports without being asked: what the PLEG is fed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeEvent {
    /// A container's init process exited (observed through its pidfd / the reaper).
    ContainerExited {
        id: ContainerId,
        pod_uid: String,
        exit_code: i32,
        /// The monotonic instant the exit was observed.
        observed_at: std::time::Instant,
    },
    /// The kernel OOM killer killed a process in the container's cgroup.
    ContainerOom { id: ContainerId, pod_uid: String },
    /// A rootless pod's pasta ended and was restarted: its published ports were down
    /// meanwhile and connections through it were lost. `message` says how it ended.
    PodNetworkRestarted {
        sandbox_id: SandboxId,
        pod_uid: String,
        message: String,
    },
}

/// Sandboxes and containers (CRI `RuntimeService`).
#[async_trait]
pub trait Runtime: Send + Sync {
    /// `ironlet` and its version, as `kubectl get node -o wide` shows in CONTAINER-RUNTIME.
    fn version(&self) -> RuntimeVersion;

    /// Creates the pod's shared namespaces (net, ipc, uts unless host*), its directories and
    /// its log directory. Idempotent for the same pod uid and attempt.
    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<SandboxId, RuntimeError>;
    /// Stops every container of the sandbox (grace period zero) and releases its network.
    async fn stop_pod_sandbox(&self, id: &SandboxId) -> Result<(), RuntimeError>;
    /// Removes a stopped sandbox with all its containers and state. Removing an unknown
    /// sandbox is not an error.
    async fn remove_pod_sandbox(&self, id: &SandboxId) -> Result<(), RuntimeError>;
    async fn pod_sandbox_status(&self, id: &SandboxId) -> Result<PodSandboxStatus, RuntimeError>;
    /// Waits until the sandbox's network is up, for a runtime whose `run_pod_sandbox`
    /// returns while it still connects (a rootless pod's pasta, see
    /// `LocalRuntime::network_ready_at_start`); the sandbox's status has its IP afterwards.
    /// A failed network turns the sandbox NotReady (it is to be recreated). Returns at once
    /// when there is nothing to wait for: the default.
    async fn await_pod_network(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let _ = id;
        Ok(())
    }
    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandboxStatus>, RuntimeError>;

    /// Creates (but does not start) a container in a sandbox. On error nothing is left.
    async fn create_container(
        &self,
        sandbox: &SandboxId,
        config: &ContainerConfig,
    ) -> Result<ContainerId, RuntimeError>;
    async fn start_container(&self, id: &ContainerId) -> Result<(), RuntimeError>;
    /// SIGTERM (or the image's stop signal), then SIGKILL after `grace`; returns when the
    /// container has exited.
    async fn stop_container(&self, id: &ContainerId, grace: Duration) -> Result<(), RuntimeError>;
    /// Removes an exited or created container; a running one is killed first.
    async fn remove_container(&self, id: &ContainerId) -> Result<(), RuntimeError>;
    async fn container_status(&self, id: &ContainerId) -> Result<ContainerStatus, RuntimeError>;
    async fn list_containers(
        &self,
        filter: &ContainerFilter,
    ) -> Result<Vec<ContainerStatus>, RuntimeError>;
    /// All sandboxes and containers (running and exited) of one pod.
    async fn pod_status(&self, pod_uid: &str) -> Result<PodStatus, RuntimeError>;

    /// Runs `cmd` in a running container and collects its output (CRI `ExecSync`).
    async fn exec_sync(
        &self,
        id: &ContainerId,
        cmd: &[String],
        timeout: Option<Duration>,
    ) -> Result<ExecOutput, RuntimeError>;

    /// Starts `request.cmd` in a running container with its stdio as streams (CRI `Exec`,
    /// for `kubectl exec`). The process runs until it exits or the session is dropped.
    async fn exec(
        &self,
        id: &ContainerId,
        request: &ExecRequest,
    ) -> Result<ExecSession, RuntimeError>;

    /// Attaches to a running container's own stdio (CRI `Attach`, for `kubectl attach`):
    /// `request.cmd` is ignored; `stdin` and `tty` must match how the container was
    /// created. Output arrives from the moment of attaching; the session ends when the
    /// container's output does. Dropping it leaves the container running.
    async fn attach(
        &self,
        id: &ContainerId,
        request: &ExecRequest,
    ) -> Result<ExecSession, RuntimeError> {
        let _ = request;
        Err(RuntimeError::Exec {
            id: id.clone(),
            message: "attach is not supported by this runtime".into(),
        })
    }

    /// What the container's writable layer holds (CRI `ContainerStats.writable_layer`), for
    /// the kubelet's `rootfs` figures; `None` for a container unknown or without one. Walks
    /// the layer's files: call it where blocking is fine (`spawn_blocking`).
    fn writable_layer_usage(&self, id: &ContainerId) -> Option<crate::fsutil::DiskUsage> {
        let _ = id;
        None
    }

    /// Subscribes to container exits, OOM kills and pod network restarts.
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<RuntimeEvent>;
}

/// Name and version of the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    pub runtime_name: &'static str,
    pub runtime_version: &'static str,
}

/// The local image store (CRI `ImageService`).
#[async_trait]
pub trait ImageService: Send + Sync {
    /// Imports an OCI image layout directory, an OCI archive or a docker-archive tarball;
    /// returns the images it contained.
    async fn import(&self, path: &Path) -> Result<Vec<Image>, ImageError>;
    /// Resolves a reference (`busybox`, `busybox:1`, `docker.io/library/busybox@sha256:…`, or
    /// an image id) to a local image, if present.
    async fn get_image(&self, reference: &str) -> Result<Option<Image>, ImageError>;
    async fn list_images(&self) -> Result<Vec<Image>, ImageError>;
    /// Removes a tag; the image's blobs go when no tag refers to them and no container uses it.
    async fn remove_image(&self, reference: &str) -> Result<(), ImageError>;
    async fn image_stats(&self) -> Result<ImageStats, ImageError>;
    /// Whether the local image `reference` names came from a registry pull; an imported
    /// image is the node's own copy, which an `Always` pull policy does not replace.
    async fn is_pulled(&self, reference: &str) -> Result<bool, ImageError>;
    /// Pulls `reference` from its registry (CRI `PullImage`), trying `request`'s
    /// credentials before the node's; concurrent pulls of one image share one download.
    async fn pull_image(
        &self,
        reference: &str,
        request: PullRequest,
    ) -> Result<PullReport, ImageError>;
}

//! Test seams shared by unit tests: [`StaticRuntime`], a [`Runtime`] that has no pods and
//! refuses to make any. Only for logic that the real-container tests also cover.

use std::time::Duration;

use async_trait::async_trait;
use ironlet_runtime::types::{
    ContainerConfig, ContainerFilter, ContainerId, ContainerStatus, ExecOutput, ExecRequest,
    ExecSession, PodSandboxConfig, PodSandboxStatus, PodStatus, SandboxId,
};
use ironlet_runtime::{Runtime, RuntimeError, RuntimeEvent, RuntimeVersion};

/// A runtime with no sandboxes and no containers.
#[derive(Debug, Default, Clone, Copy)]
pub struct StaticRuntime;

fn refused() -> RuntimeError {
    RuntimeError::InvalidConfig("StaticRuntime makes nothing".into())
}

#[async_trait]
impl Runtime for StaticRuntime {
    fn version(&self) -> RuntimeVersion {
        RuntimeVersion {
            runtime_name: "static",
            runtime_version: "0",
        }
    }
    async fn run_pod_sandbox(&self, _: &PodSandboxConfig) -> Result<SandboxId, RuntimeError> {
        Err(refused())
    }
    async fn stop_pod_sandbox(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Ok(())
    }
    async fn remove_pod_sandbox(&self, _: &SandboxId) -> Result<(), RuntimeError> {
        Ok(())
    }
    async fn pod_sandbox_status(&self, _: &SandboxId) -> Result<PodSandboxStatus, RuntimeError> {
        Err(refused())
    }
    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandboxStatus>, RuntimeError> {
        Ok(Vec::new())
    }
    async fn create_container(
        &self,
        _: &SandboxId,
        _: &ContainerConfig,
    ) -> Result<ContainerId, RuntimeError> {
        Err(refused())
    }
    async fn start_container(&self, _: &ContainerId) -> Result<(), RuntimeError> {
        Err(refused())
    }
    async fn stop_container(&self, _: &ContainerId, _: Duration) -> Result<(), RuntimeError> {
        Ok(())
    }
    async fn remove_container(&self, _: &ContainerId) -> Result<(), RuntimeError> {
        Ok(())
    }
    async fn container_status(&self, _: &ContainerId) -> Result<ContainerStatus, RuntimeError> {
        Err(refused())
    }
    async fn list_containers(
        &self,
        _: &ContainerFilter,
    ) -> Result<Vec<ContainerStatus>, RuntimeError> {
        Ok(Vec::new())
    }
    async fn pod_status(&self, pod_uid: &str) -> Result<PodStatus, RuntimeError> {
        Ok(PodStatus {
            pod_uid: pod_uid.to_owned(),
            name: String::new(),
            namespace: String::new(),
            sandboxes: Vec::new(),
            containers: Vec::new(),
        })
    }
    async fn exec_sync(
        &self,
        _: &ContainerId,
        _: &[String],
        _: Option<Duration>,
    ) -> Result<ExecOutput, RuntimeError> {
        Err(refused())
    }
    async fn exec(&self, _: &ContainerId, _: &ExecRequest) -> Result<ExecSession, RuntimeError> {
        Err(refused())
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<RuntimeEvent> {
        tokio::sync::broadcast::channel(1).1
    }
}

//! [`PodView`]: a runtime [`PodStatus`] indexed the way the sync decision reads it — the
//! newest instance of each container name, overall or within one sandbox.
//!
//! "Newest" is the latest `created_at`, ties broken by the higher attempt (kubelet sorts
//! container statuses newest first and takes the first match by name).

use ironlet_runtime::types::{
    ContainerState, ContainerStatus, PodSandboxStatus, PodStatus, SandboxId,
};

/// Containers and sandboxes of one pod, newest first.
pub(super) struct PodView<'a> {
    containers: Vec<&'a ContainerStatus>,
    sandboxes: Vec<&'a PodSandboxStatus>,
}

impl<'a> PodView<'a> {
    pub(super) fn new(status: &'a PodStatus) -> Self {
        let mut containers: Vec<_> = status.containers.iter().collect();
        containers.sort_by_key(|c| std::cmp::Reverse((c.created_at, c.attempt)));
        let mut sandboxes: Vec<_> = status.sandboxes.iter().collect();
        sandboxes.sort_by_key(|s| std::cmp::Reverse((s.created_at, s.config.attempt)));
        Self {
            containers,
            sandboxes,
        }
    }

    /// All sandboxes, newest first.
    pub(super) fn sandboxes(&self) -> &[&'a PodSandboxStatus] {
        &self.sandboxes
    }

    /// All container instances, newest first.
    pub(super) fn containers(&self) -> &[&'a ContainerStatus] {
        &self.containers
    }

    /// The newest instance named `name` in any sandbox.
    pub(super) fn newest(&self, name: &str) -> Option<&'a ContainerStatus> {
        self.containers.iter().copied().find(|c| c.name == name)
    }

    /// The newest instance named `name` in sandbox `sandbox`.
    pub(super) fn newest_in(&self, name: &str, sandbox: &SandboxId) -> Option<&'a ContainerStatus> {
        self.containers
            .iter()
            .copied()
            .find(|c| c.name == name && &c.sandbox_id == sandbox)
    }

    /// The newest exited instance named `name` (the one back-off counts from).
    pub(super) fn newest_exited(&self, name: &str) -> Option<&'a ContainerStatus> {
        self.containers
            .iter()
            .copied()
            .find(|c| c.name == name && c.state == ContainerState::Exited)
    }

    /// The restart count of the next instance named `name`: the newest one's plus one.
    pub(super) fn next_restart_count(&self, name: &str) -> u32 {
        self.newest(name).map_or(0, |c| c.attempt.saturating_add(1))
    }
}

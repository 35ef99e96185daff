//! Stopping containers (kubelet's `killContainer` / `killPodWithSyncResult`): the preStop
//! hook within the grace period, then SIGTERM, then SIGKILL when the grace runs out; and
//! the postStart hook, whose failure kills the container it ran in.
//!
//! When the whole pod stops, every container's preStop hook starts at once; in a pod with
//! sidecars, a sidecar's SIGTERM then waits (within what is left of its grace period) until
//! the regular containers and the sidecars declared after it have stopped
//! ([`termination_prerequisites`]), so the main containers' hooks can still reach them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ironlet_runtime::types::{ContainerId, PodSandboxStatus, PodStatus};
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use super::{running_containers, NodeSyncer};
use crate::kubelet::events::{reason, EventType};
use crate::pod_workers::SyncError;
use crate::probes::{Action, ProbeNetwork, ProbeOutcome, ProbeTarget};
use crate::sync::termination_prerequisites;

/// kubelet's `minimumGracePeriodInSeconds`: after a preStop hook, the container still gets
/// at least this long to handle SIGTERM.
const MINIMUM_GRACE_AFTER_HOOK: Duration = Duration::from_secs(2);

impl NodeSyncer {
    /// Stops every running container of the pod in parallel (sidecars after the others, see
    /// the module docs) and the pod's sandboxes.
    pub(super) async fn kill_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        grace: Duration,
    ) -> Result<(), SyncError> {
        let turns = TerminationTurns::new(pod, status);
        let kills = running_containers(status).map(|c| {
            self.kill_container(
                pod,
                &c.id,
                &c.name,
                "Stopping container",
                grace,
                turns.as_ref(),
            )
        });
        let results = futures_util::future::join_all(kills).await;
        for sandbox in &status.sandboxes {
            if let Err(err) = self.runtime.stop_pod_sandbox(&sandbox.id).await {
                return Err(SyncError::new("KillPodSandboxError", err.to_string()));
            }
        }
        results.into_iter().collect()
    }

    /// Runs the container's preStop hook (if any), waits for its turn in `turns` (if any)
    /// and stops it within `grace`.
    pub(super) async fn kill_container(
        &self,
        pod: &Pod,
        id: &ContainerId,
        name: &str,
        message: &str,
        grace: Duration,
        turns: Option<&TerminationTurns>,
    ) -> Result<(), SyncError> {
        let started = Instant::now();
        self.event(
            pod,
            EventType::Normal,
            reason::KILLING,
            format!("{message} {name}"),
        );
        let container = super::start::find_container(pod, name, false)
            .or_else(|| super::start::find_container(pod, name, true));
        let pre_stop = container
            .and_then(|c| c.lifecycle.as_ref())
            .and_then(|l| l.pre_stop.as_ref());
        let mut remaining = grace;
        // After a hook or a wait, the container still gets kubelet's minimum to stop.
        let mut at_least_minimum = false;
        if let (Some(hook), false) = (pre_stop, grace.is_zero()) {
            at_least_minimum = true;
            let target = self.probe_target(pod, id).await;
            match tokio::time::timeout(grace, self.run_hook(hook, &target, grace)).await {
                Ok(Ok(())) => {}
                Ok(Err(msg)) => self.event(
                    pod,
                    EventType::Warning,
                    reason::FAILED_PRE_STOP_HOOK,
                    format!("PreStopHook failed: {msg}"),
                ),
                Err(_) => tracing::info!(
                    container = name,
                    "preStop hook did not finish within the grace period"
                ),
            }
            remaining = grace.saturating_sub(started.elapsed());
        }
        if let Some(turns) = turns.filter(|_| !remaining.is_zero()) {
            if turns.must_wait(name) {
                at_least_minimum = true;
                turns.wait_for_turn(name, remaining).await;
                remaining = grace.saturating_sub(started.elapsed());
            }
        }
        if at_least_minimum {
            remaining = remaining.max(MINIMUM_GRACE_AFTER_HOOK);
        }
        self.runtime
            .stop_container(id, remaining)
            .await
            .map_err(|e| SyncError::new("KillContainerError", e.to_string()))?;
        if let Some(turns) = turns {
            turns.stopped(name);
        }
        Ok(())
    }

    /// Runs the postStart hook; a failure kills the container (kubelet's
    /// `FailedPostStartHook`), and the back-off applies to its restart.
    pub(super) async fn run_post_start(
        &self,
        pod: &Pod,
        container: &Container,
        id: &ContainerId,
        sandbox: &PodSandboxStatus,
    ) -> Result<(), SyncError> {
        let Some(hook) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        else {
            return Ok(());
        };
        let network = ProbeNetwork {
            ip: sandbox.ip.clone(),
            netns_path: sandbox.netns_path.clone(),
        };
        let target = ProbeTarget::for_container(id.clone(), network, container);
        let grace = super::grace_of(pod);
        if let Err(msg) = self.run_hook(hook, &target, grace).await {
            let message = format!("PostStartHook failed: {msg}");
            self.event(
                pod,
                EventType::Warning,
                reason::FAILED_POST_START_HOOK,
                message.clone(),
            );
            self.kill_container(pod, id, &container.name, "FailedPostStartHook", grace, None)
                .await?;
            return Err(SyncError::new("PostStartHookError", message));
        }
        Ok(())
    }

    async fn run_hook(
        &self,
        hook: &LifecycleHandler,
        target: &ProbeTarget,
        timeout: Duration,
    ) -> Result<(), String> {
        let action = Action::from_lifecycle_handler(hook).map_err(|e| e.to_string())?;
        match crate::probes::run_hook(self.runtime.as_ref(), target, &action, timeout).await {
            ProbeOutcome::Success | ProbeOutcome::Warning(_) => Ok(()),
            ProbeOutcome::Failure(msg) | ProbeOutcome::Unknown(msg) => Err(msg),
        }
    }

    /// Where hooks of a running container connect to.
    async fn probe_target(&self, pod: &Pod, id: &ContainerId) -> ProbeTarget {
        let status = self.runtime.container_status(id).await.ok();
        let sandbox = match &status {
            Some(s) => self.runtime.pod_sandbox_status(&s.sandbox_id).await.ok(),
            None => None,
        };
        let ports = status
            .as_ref()
            .and_then(|s| super::start::find_container(pod, &s.name, false))
            .and_then(|c| c.ports.clone())
            .unwrap_or_default();
        ProbeTarget {
            container_id: id.clone(),
            network: ProbeNetwork {
                ip: sandbox.as_ref().and_then(|s| s.ip.clone()),
                netns_path: sandbox.and_then(|s| s.netns_path),
            },
            container_ports: ports,
        }
    }
}

/// kubelet's `terminationOrdering` while a pod is being killed: which containers must wait
/// for which, and how many running instances of each name are left.
pub(super) struct TerminationTurns {
    prerequisites: HashMap<String, Vec<String>>,
    left: tokio::sync::watch::Sender<HashMap<String, usize>>,
}

impl TerminationTurns {
    /// The ordering of the running containers of `status`; `None` when the pod has no
    /// sidecar (everything stops at once).
    fn new(pod: &Pod, status: &PodStatus) -> Option<Self> {
        let running: Vec<&str> = running_containers(status)
            .map(|c| c.name.as_str())
            .collect();
        let prerequisites = termination_prerequisites(pod, running.iter().copied());
        if prerequisites.is_empty() {
            return None;
        }
        let mut left = HashMap::new();
        for name in running {
            *left.entry(name.to_owned()).or_insert(0) += 1;
        }
        Some(Self {
            prerequisites,
            left: tokio::sync::watch::Sender::new(left),
        })
    }

    fn must_wait(&self, name: &str) -> bool {
        self.prerequisites.get(name).is_some_and(|p| !p.is_empty())
    }

    /// Waits until every prerequisite of `name` has stopped, at most `limit`.
    async fn wait_for_turn(&self, name: &str, limit: Duration) {
        let Some(waits) = self.prerequisites.get(name) else {
            return;
        };
        let mut rx = self.left.subscribe();
        let turn = rx.wait_for(|left| waits.iter().all(|w| left.get(w).is_none_or(|n| *n == 0)));
        if tokio::time::timeout(limit, turn).await.is_err() {
            tracing::info!(
                container = name,
                "the containers it waits for did not stop within its grace period"
            );
        }
    }

    /// One running instance of `name` has stopped.
    fn stopped(&self, name: &str) {
        self.left.send_modify(|left| {
            if let Some(n) = left.get_mut(name) {
                *n = n.saturating_sub(1);
            }
        });
    }
}

//! The working state of one [`compute_pod_actions`](super::compute_pod_actions) call: what it
//! reads ([`Ctx`]) and what it has decided so far ([`Plan`]), with the rules the init and
//! regular container passes share (restart policy, "is this running container still good").

use std::collections::HashSet;

use ironlet_runtime::types::{ContainerId, ContainerState, ContainerStatus, ExitReason};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::actions::{
    ActionsInput, ContainerKill, ContainerKind, ContainerStart, KillReason, ProbeResults,
    ProbeVerdict,
};
use super::hash::container_hash;
use super::labels::HASH;
pub(super) use super::restart::RestartPolicy;
use super::restart::{effective_policy, should_restart};
use super::view::PodView;

/// What the decision reads.
pub(super) struct Ctx<'a> {
    pub(super) view: PodView<'a>,
    pub(super) pod: &'a Pod,
    probes: &'a dyn ProbeResults,
    pub(super) policy: RestartPolicy,
    /// The pod has a deletion timestamp: nothing new is started in it.
    pub(super) deleting: bool,
    pub(super) init: &'a [Container],
    pub(super) regular: &'a [Container],
    /// `spec.ephemeralContainers`, converted.
    pub(super) ephemeral: Vec<Container>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(input: &ActionsInput<'a>) -> Self {
        let spec = input.pod.spec.as_ref();
        Self {
            view: PodView::new(input.status),
            pod: input.pod,
            probes: input.probes,
            policy: RestartPolicy::of_pod(spec),
            deleting: input.pod.metadata.deletion_timestamp.is_some(),
            init: spec
                .and_then(|s| s.init_containers.as_deref())
                .unwrap_or_default(),
            regular: spec.map_or(&[], |s| s.containers.as_slice()),
            ephemeral: super::ephemeral::ephemeral_containers(input.pod),
        }
    }

    /// The kind of the spec container named `name`, `None` when the spec has none.
    pub(super) fn kind_of(&self, name: &str) -> Option<ContainerKind> {
        if let Some(init) = self.init.iter().find(|c| c.name == name) {
            Some(ContainerKind::of_init(init))
        } else if self.regular.iter().any(|c| c.name == name) {
            Some(ContainerKind::Regular)
        } else {
            self.ephemeral
                .iter()
                .any(|c| c.name == name)
                .then_some(ContainerKind::Ephemeral)
        }
    }

    /// Appends a start of `container` (position `index` in its list) to `plan`.
    pub(super) fn start(
        &self,
        plan: &mut Plan,
        kind: ContainerKind,
        index: usize,
        container: &Container,
    ) {
        plan.start.push(ContainerStart {
            name: container.name.clone(),
            kind,
            index,
            restart_count: self.view.next_restart_count(&container.name),
            hash: container_hash(container),
            last_exit: self
                .view
                .newest_exited(&container.name)
                .and_then(|s| s.finished_at),
        });
    }

    /// Why running instance `status` of `container` must be killed, if it must: its spec
    /// changed, or its liveness or startup probe failed (in kubelet's order of precedence).
    pub(super) fn running_kill_reason(
        &self,
        container: &Container,
        status: &ContainerStatus,
    ) -> Option<KillReason> {
        let running_hash = status.annotations.get(HASH).map(String::as_str);
        if running_hash != Some(container_hash(container).as_str()) {
            Some(KillReason::DefinitionChanged)
        } else if self.probes.liveness(&container.name, &status.id) == ProbeVerdict::Failure {
            Some(KillReason::LivenessProbeFailed)
        } else if self.probes.startup(&container.name, &status.id) == ProbeVerdict::Failure {
            Some(KillReason::StartupProbeFailed)
        } else {
            None
        }
    }

    /// Whether running instance `status` of `container` has passed its startup probe (a
    /// container without one has started once it runs).
    pub(super) fn has_started(&self, container: &Container, status: &ContainerStatus) -> bool {
        container.startup_probe.is_none()
            || self.probes.startup(&container.name, &status.id) == ProbeVerdict::Success
    }

    /// kubelet `ShouldContainerBeRestarted` for regular container `container` whose newest
    /// instance is `newest` and does not run in the current sandbox: an exited one restarts
    /// as its own or the pod's restart policy says ([`should_restart`]).
    pub(super) fn should_start(
        &self,
        container: &Container,
        newest: Option<&ContainerStatus>,
    ) -> bool {
        if self.deleting {
            return false;
        }
        let Some(newest) = newest else { return true };
        match newest.state {
            ContainerState::Running | ContainerState::Created | ContainerState::Unknown => true,
            ContainerState::Exited => {
                should_restart(container, self.pod.spec.as_ref(), newest.exit_code)
            }
        }
    }

    /// Whether running `container`, killed by a failed liveness or startup probe, is started
    /// again: unless its own (else the pod's) restart policy is `Never`. Exit-code rules do
    /// not apply, the container has not exited by itself.
    pub(super) fn restarts_after_probe_kill(&self, container: &Container) -> bool {
        effective_policy(container, self.pod.spec.as_ref()) != RestartPolicy::Never
    }
}

/// An init container instance that failed: a non-zero exit, an OOM kill, or an unknown
/// state (kubelet `isInitContainerFailed`).
pub(super) fn init_failed(status: &ContainerStatus) -> bool {
    status.reason == Some(ExitReason::OOMKilled)
        || status.state == ContainerState::Unknown
        || (status.state == ContainerState::Exited && status.exit_code != Some(0))
}

/// The decisions taken so far.
#[derive(Debug, Default)]
pub(super) struct Plan {
    pub(super) kill: Vec<ContainerKill>,
    pub(super) start: Vec<ContainerStart>,
    /// Running instances deliberately left running.
    pub(super) kept: HashSet<ContainerId>,
}

impl Plan {
    pub(super) fn kill(
        &mut self,
        status: &ContainerStatus,
        kind: Option<ContainerKind>,
        reason: KillReason,
        restart: bool,
    ) {
        self.kill.push(ContainerKill {
            id: status.id.clone(),
            name: status.name.clone(),
            kind,
            reason,
            restart,
        });
    }

    pub(super) fn keep(&mut self, status: &ContainerStatus) {
        self.kept.insert(status.id.clone());
    }

    /// Whether `id` already has a decision (kept or killed).
    pub(super) fn decided(&self, id: &ContainerId) -> bool {
        self.kept.contains(id) || self.kill.iter().any(|k| &k.id == id)
    }
}

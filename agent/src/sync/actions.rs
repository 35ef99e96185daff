//! What one sync of a pod must do — the input and output of
//! [`compute_pod_actions`](super::compute_pod_actions) (kubelet's `podActions`).
//!
//! The output is one [`PodActions`] value, an enum whose variants carry exactly the data
//! their case needs, instead of kubelet's struct of flags (`KillPod`, `CreateSandbox`, …)
//! that allowed impossible combinations:
//!
//! ```text
//!  CreateSandbox { attempt, cause, start }   kill every container, stop every sandbox of the
//!                                            pod, create sandbox `attempt`, start `start`
//!  Sync { sandbox_id, kill, start }          in the current sandbox: kill `kill`, then start
//!                                            `start` in order (empty + empty = nothing to do)
//!  KillPod { cause }                         nothing will run again: kill every container
//!                                            and stop the sandbox; `cause` says why
//! ```
//!
//! Before starting, the caller passes `start` through
//! [`filter_backoff`](super::filter_backoff) so that crash-looping containers wait.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use ironlet_runtime::types::{ContainerId, PodStatus, SandboxId};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::labels::ContainerType;

/// Everything [`compute_pod_actions`](super::compute_pod_actions) looks at.
#[derive(Clone, Copy)]
pub struct ActionsInput<'a> {
    /// The desired pod (its spec, restart policy, deletion timestamp).
    pub pod: &'a Pod,
    /// The runtime's view: all sandboxes and all containers of the pod, exited ones included.
    pub status: &'a PodStatus,
    /// The latest liveness and startup verdicts of running containers.
    pub probes: &'a dyn ProbeResults,
}

/// The latest result of a probe for one container instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProbeVerdict {
    /// Not probed yet (or no such probe): neither success nor failure.
    #[default]
    Pending,
    Success,
    /// The failure threshold was reached.
    Failure,
}

/// The prober's verdicts, as the sync needs them (kubelet's liveness and startup managers).
pub trait ProbeResults {
    /// The liveness verdict of container instance `id` (named `container` in the pod spec).
    fn liveness(&self, container: &str, id: &ContainerId) -> ProbeVerdict;
    /// The startup verdict of container instance `id`.
    fn startup(&self, container: &str, id: &ContainerId) -> ProbeVerdict;
}

/// A snapshot of probe verdicts by container instance; anything absent is
/// [`ProbeVerdict::Pending`]. Also the fake for tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeVerdicts {
    pub liveness: HashMap<ContainerId, ProbeVerdict>,
    pub startup: HashMap<ContainerId, ProbeVerdict>,
}

impl ProbeResults for ProbeVerdicts {
    fn liveness(&self, _container: &str, id: &ContainerId) -> ProbeVerdict {
        self.liveness.get(id).copied().unwrap_or_default()
    }

    fn startup(&self, _container: &str, id: &ContainerId) -> ProbeVerdict {
        self.startup.get(id).copied().unwrap_or_default()
    }
}

/// The decision of one sync. See the module docs for what the caller does with each variant.
#[derive(Debug, Clone, PartialEq)]
pub enum PodActions {
    /// There is no usable sandbox: kill all containers of the pod, stop all its sandboxes,
    /// then create sandbox number `attempt` and start `start` in it, in order.
    CreateSandbox {
        attempt: u32,
        cause: SandboxChange,
        /// The first init container, or (without init containers) the regular containers.
        start: Vec<ContainerStart>,
    },
    /// Keep sandbox `sandbox_id`: kill `kill` (with their grace periods and preStop hooks),
    /// then start `start` in order. Both empty means the pod is as it should be.
    Sync {
        sandbox_id: SandboxId,
        kill: Vec<ContainerKill>,
        start: Vec<ContainerStart>,
    },
    /// Nothing in the pod will run again: kill every container and stop the sandbox. The
    /// pod's phase (Succeeded or Failed) follows from its container statuses.
    KillPod { cause: PodDone },
}

impl PodActions {
    /// The containers this sync would start, in order.
    #[must_use]
    pub fn starts(&self) -> &[ContainerStart] {
        match self {
            Self::CreateSandbox { start, .. } | Self::Sync { start, .. } => start,
            Self::KillPod { .. } => &[],
        }
    }

    /// Whether the pod is already in its desired state.
    #[must_use]
    pub fn is_noop(&self) -> bool {
        matches!(self, Self::Sync { kill, start, .. } if kill.is_empty() && start.is_empty())
    }
}

/// Why a new sandbox is needed (kubelet `PodSandboxChanged`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxChange {
    /// The pod has never had a sandbox (or all were removed).
    NoSandbox,
    /// The newest sandbox is not ready (its namespaces or network are gone).
    NotReady,
    /// More than one sandbox is ready; none of them is trusted.
    SeveralReady,
    /// `hostNetwork` of the pod differs from that of its sandbox.
    HostNetworkChanged,
}

impl SandboxChange {
    /// kubelet's `SandboxChanged` event message, or `None` for a pod's first sandbox.
    #[must_use]
    pub fn event_message(self) -> Option<&'static str> {
        match self {
            Self::NoSandbox => None,
            Self::NotReady | Self::SeveralReady | Self::HostNetworkChanged => {
                Some("Pod sandbox changed, it will be killed and re-created.")
            }
        }
    }
}

/// Why nothing in the pod will run again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodDone {
    /// Every regular container has exited and the restart policy restarts none of them
    /// (or the pod is being deleted).
    Completed,
    /// Init container `name` failed and the restart policy is `Never`: the pod fails.
    InitContainerFailed {
        name: String,
        exit_code: Option<i32>,
    },
    /// The sandbox is gone, the restart policy is `Never` and containers had already run:
    /// kubelet does not recreate the sandbox.
    SandboxLost,
}

/// Which list of the pod spec a container comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// An init container that runs to completion.
    Init,
    /// An init container with `restartPolicy: Always`: started in init order, then kept
    /// running alongside the regular containers.
    Sidecar,
    Regular,
    /// From `spec.ephemeralContainers`: started once, never restarted.
    Ephemeral,
}

impl ContainerKind {
    /// The kind of `container` found in the pod's init containers.
    #[must_use]
    pub fn of_init(container: &Container) -> Self {
        if container.restart_policy.as_deref() == Some("Always") {
            Self::Sidecar
        } else {
            Self::Init
        }
    }

    /// The value of the `io.kubernetes.container.type` label.
    #[must_use]
    pub fn container_type(self) -> ContainerType {
        match self {
            Self::Init | Self::Sidecar => ContainerType::Init,
            Self::Regular => ContainerType::Regular,
            Self::Ephemeral => ContainerType::Ephemeral,
        }
    }

    /// "Container" or "Init container", as kubelet's messages start.
    fn noun(self) -> &'static str {
        match self {
            Self::Init | Self::Sidecar => "Init container",
            Self::Regular => "Container",
            Self::Ephemeral => "Ephemeral container",
        }
    }
}

/// One container to create and start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStart {
    pub name: String,
    pub kind: ContainerKind,
    /// Position in `spec.initContainers` (init, sidecar), `spec.containers` (regular) or
    /// `spec.ephemeralContainers` (ephemeral).
    pub index: usize,
    /// Its restart count (CRI `attempt`): the newest instance's plus one, 0 for the first.
    pub restart_count: u32,
    /// [`container_hash`](super::container_hash) of the spec, for the container's
    /// annotations and the back-off key.
    pub hash: String,
    /// When the newest exited instance of this name finished: back-off counts from there.
    pub last_exit: Option<SystemTime>,
}

impl ContainerStart {
    /// The container's spec in `pod`, if `pod` is the pod the start was computed for (an
    /// ephemeral container's as a [`Container`]).
    #[must_use]
    pub fn spec<'p>(&self, pod: &'p Pod) -> Option<Cow<'p, Container>> {
        let spec = pod.spec.as_ref()?;
        let list = match self.kind {
            ContainerKind::Init | ContainerKind::Sidecar => spec.init_containers.as_deref()?,
            ContainerKind::Regular => &spec.containers,
            ContainerKind::Ephemeral => {
                let ec = spec.ephemeral_containers.as_deref()?.get(self.index)?;
                return (ec.name == self.name)
                    .then(|| Cow::Owned(super::ephemeral::as_container(ec)));
            }
        };
        list.get(self.index)
            .filter(|c| c.name == self.name)
            .map(Cow::Borrowed)
    }
}

/// One running (or unknown-state) container instance to kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerKill {
    pub id: ContainerId,
    pub name: String,
    /// `None` when the name is not in the pod spec.
    pub kind: Option<ContainerKind>,
    pub reason: KillReason,
    /// Whether a new instance is started in the same sync.
    pub restart: bool,
}

impl ContainerKill {
    /// kubelet's message for the `Killing` event, e.g.
    /// `Container web failed liveness probe, will be restarted`.
    #[must_use]
    pub fn message(&self) -> String {
        let noun = self.kind.map_or("Container", ContainerKind::noun);
        let name = &self.name;
        let base = match self.reason {
            KillReason::DefinitionChanged => format!("{noun} {name} definition changed"),
            KillReason::LivenessProbeFailed => format!("{noun} {name} failed liveness probe"),
            KillReason::StartupProbeFailed => format!("{noun} {name} failed startup probe"),
            KillReason::UnknownState => {
                format!("{noun} is in \"unknown\" state, try killing it before restart")
            }
            KillReason::NotInSpec => format!("Container {name} is not in the pod spec"),
            KillReason::Superseded => {
                format!("Container {name} is superseded by a newer instance or sandbox")
            }
        };
        let says_restart = self.restart
            && self.kind == Some(ContainerKind::Regular)
            && matches!(
                self.reason,
                KillReason::DefinitionChanged
                    | KillReason::LivenessProbeFailed
                    | KillReason::StartupProbeFailed
            );
        if says_restart {
            format!("{base}, will be restarted")
        } else {
            base
        }
    }
}

impl ContainerKill {
    /// The grace period of this kill, kubelet's `setTerminationGracePeriod`: the pod's
    /// deletion grace period when it is being deleted; else, for a kill by a failed liveness
    /// or startup probe, that probe's own `terminationGracePeriodSeconds` when set; else the
    /// pod's `terminationGracePeriodSeconds` (default 30 s). Negative values count as zero.
    #[must_use]
    pub fn grace_period(&self, pod: &Pod) -> Duration {
        let seconds = pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| self.probe_grace_seconds(pod))
            .or_else(|| {
                pod.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(crate::config::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }

    /// The `terminationGracePeriodSeconds` of the probe that failed, for probe kills.
    fn probe_grace_seconds(&self, pod: &Pod) -> Option<i64> {
        let spec = pod.spec.as_ref()?;
        let list = match self.kind? {
            ContainerKind::Init | ContainerKind::Sidecar => spec.init_containers.as_deref()?,
            ContainerKind::Regular => &spec.containers,
            ContainerKind::Ephemeral => return None,
        };
        let container = list.iter().find(|c| c.name == self.name)?;
        let probe = match self.reason {
            KillReason::LivenessProbeFailed => container.liveness_probe.as_ref(),
            KillReason::StartupProbeFailed => container.startup_probe.as_ref(),
            _ => None,
        }?;
        probe.termination_grace_period_seconds
    }
}

/// Why a container is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Its spec hash differs from the desired container's.
    DefinitionChanged,
    LivenessProbeFailed,
    StartupProbeFailed,
    /// The runtime does not know whether it runs; killed before starting another instance.
    UnknownState,
    /// No container of that name is in the pod spec.
    NotInSpec,
    /// A newer instance of the same name exists, or it runs outside the current sandbox
    /// (never two running instances of one container).
    Superseded,
}

impl fmt::Display for KillReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // kubelet's containerKillReason values where it has one.
        f.write_str(match self {
            Self::DefinitionChanged => "DefinitionChanged",
            Self::LivenessProbeFailed => "LivenessProbe",
            Self::StartupProbeFailed => "StartupProbe",
            Self::UnknownState => "Unknown",
            Self::NotInSpec => "NotInSpec",
            Self::Superseded => "Superseded",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kill(kind: Option<ContainerKind>, reason: KillReason, restart: bool) -> ContainerKill {
        ContainerKill {
            id: ContainerId::parse("c1").expect("id"),
            name: "web".into(),
            kind,
            reason,
            restart,
        }
    }

    #[test]
    fn kill_messages_match_kubelet() {
        let regular = Some(ContainerKind::Regular);
        let cases = [
            (
                kill(regular, KillReason::DefinitionChanged, true),
                "Container web definition changed, will be restarted",
            ),
            (
                kill(regular, KillReason::LivenessProbeFailed, true),
                "Container web failed liveness probe, will be restarted",
            ),
            (
                kill(regular, KillReason::LivenessProbeFailed, false),
                "Container web failed liveness probe",
            ),
            (
                kill(regular, KillReason::StartupProbeFailed, true),
                "Container web failed startup probe, will be restarted",
            ),
            (
                kill(
                    Some(ContainerKind::Sidecar),
                    KillReason::StartupProbeFailed,
                    true,
                ),
                "Init container web failed startup probe",
            ),
            (
                kill(regular, KillReason::UnknownState, true),
                "Container is in \"unknown\" state, try killing it before restart",
            ),
            (
                kill(None, KillReason::NotInSpec, false),
                "Container web is not in the pod spec",
            ),
        ];
        for (kill, message) in cases {
            assert_eq!(kill.message(), message);
        }
    }

    fn pod_with_probe_graces(pod_grace: Option<i64>, liveness: Option<i64>) -> Pod {
        use k8s_openapi::api::core::v1::{PodSpec, Probe};
        let probe = |grace| Probe {
            termination_grace_period_seconds: grace,
            ..Probe::default()
        };
        let container = Container {
            name: "web".into(),
            liveness_probe: Some(probe(liveness)),
            startup_probe: Some(probe(Some(3))),
            ..Container::default()
        };
        Pod {
            spec: Some(PodSpec {
                termination_grace_period_seconds: pod_grace,
                init_containers: Some(vec![container.clone()]),
                containers: vec![container],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn a_probe_kill_uses_the_probe_grace_period_over_the_pod_one() {
        let pod = pod_with_probe_graces(Some(600), Some(5));
        let regular = Some(ContainerKind::Regular);
        let secs = |k: ContainerKill| k.grace_period(&pod).as_secs();
        assert_eq!(
            secs(kill(regular, KillReason::LivenessProbeFailed, true)),
            5
        );
        assert_eq!(secs(kill(regular, KillReason::StartupProbeFailed, true)), 3);
        assert_eq!(
            secs(kill(
                Some(ContainerKind::Sidecar),
                KillReason::LivenessProbeFailed,
                true
            )),
            5,
            "restartable init containers too"
        );
        assert_eq!(
            secs(kill(regular, KillReason::DefinitionChanged, true)),
            600
        );
        assert_eq!(secs(kill(None, KillReason::NotInSpec, false)), 600);
    }

    #[test]
    fn a_probe_without_its_own_grace_period_falls_back_to_the_pod_then_the_default() {
        let regular = Some(ContainerKind::Regular);
        let liveness = kill(regular, KillReason::LivenessProbeFailed, true);
        let pod = pod_with_probe_graces(Some(600), None);
        assert_eq!(liveness.grace_period(&pod).as_secs(), 600);
        let pod = pod_with_probe_graces(None, None);
        assert_eq!(liveness.grace_period(&pod).as_secs(), 30);
        let mut deleting = pod_with_probe_graces(Some(600), Some(5));
        deleting.metadata.deletion_grace_period_seconds = Some(1);
        assert_eq!(liveness.grace_period(&deleting).as_secs(), 1);
    }

    #[test]
    fn only_an_empty_sync_is_a_noop() {
        let sandbox_id = ContainerId::parse("s1").expect("id");
        let empty = PodActions::Sync {
            sandbox_id: sandbox_id.clone(),
            kill: vec![],
            start: vec![],
        };
        assert!(empty.is_noop());
        let killing = PodActions::Sync {
            sandbox_id,
            kill: vec![kill(None, KillReason::NotInSpec, false)],
            start: vec![],
        };
        assert!(!killing.is_noop());
        assert!(!PodActions::KillPod {
            cause: PodDone::Completed
        }
        .is_noop());
    }

    #[test]
    fn sidecars_are_init_containers_with_restart_policy_always() {
        let mut c = Container {
            name: "proxy".into(),
            ..Container::default()
        };
        assert_eq!(ContainerKind::of_init(&c), ContainerKind::Init);
        c.restart_policy = Some("Always".into());
        assert_eq!(ContainerKind::of_init(&c), ContainerKind::Sidecar);
        assert_eq!(ContainerKind::Sidecar.container_type(), ContainerType::Init);
    }
}

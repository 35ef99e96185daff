//! The kubelet-owned pod conditions (kubelet's `status/generate.go`) and their
//! `lastTransitionTime` (the status manager's `updateLastTransitionTime`).
//!
//! | type | True when | else reason, message |
//! |---|---|---|
//! | `PodReadyToStartContainers` | the newest sandbox is ready (the only ready one, with the pod's network mode) | — |
//! | `Initialized` | every init container finished (a sidecar: started), or an app container has run | `ContainersNotInitialized`, `containers with incomplete status: [a b]` |
//! | `ContainersReady` | every app container and sidecar is ready | `ContainersNotReady`, `containers with unready status: [c]` |
//! | `Ready` | `ContainersReady` and every readiness gate's condition | as `ContainersReady`, or `ReadinessGatesNotReady` |
//! | `PodScheduled` | always (the pod is on this node) | — |
//!
//! A Succeeded pod is Initialized with reason `PodCompleted` and not ready with reason
//! `PodCompleted`; a Failed pod is not ready with reason `PodFailed`. Conditions of other
//! types (readiness gates set by controllers) are kept from the pod's status; a
//! `DisruptionTarget` from the previous status.
//!
//! `lastTransitionTime` is the previous one while the condition's status is unchanged, and
//! "now" when it changes or first appears.

use ironlet_runtime::types::{PodStatus as RuntimePodStatus, SandboxState};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::phase::Phase;
use crate::qos::is_restartable_init_container;

pub const POD_READY_TO_START_CONTAINERS: &str = "PodReadyToStartContainers";
pub const INITIALIZED: &str = "Initialized";
pub const CONTAINERS_READY: &str = "ContainersReady";
pub const READY: &str = "Ready";
pub const POD_SCHEDULED: &str = "PodScheduled";
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// Types the kubelet computes itself and so replaces on every update.
const KUBELET_OWNED: [&str; 5] = [
    POD_SCHEDULED,
    READY,
    INITIALIZED,
    CONTAINERS_READY,
    POD_READY_TO_START_CONTAINERS,
];

/// What the conditions are computed from.
pub(super) struct Inputs<'a> {
    pub pod: &'a Pod,
    pub runtime: &'a RuntimePodStatus,
    pub init_statuses: &'a [ContainerStatus],
    pub statuses: &'a [ContainerStatus],
    pub phase: Phase,
}

impl Inputs<'_> {
    /// All conditions in kubelet's order: the pod's own, `DisruptionTarget`,
    /// `PodReadyToStartContainers`, `Initialized`, `Ready`, `ContainersReady`, `PodScheduled`.
    pub(super) fn all(&self, api: &PodStatus, old: &PodStatus) -> Vec<PodCondition> {
        let mut conditions: Vec<PodCondition> = api
            .conditions
            .iter()
            .flatten()
            .filter(|c| !KUBELET_OWNED.contains(&c.type_.as_str()))
            .cloned()
            .collect();
        if let Some(disruption) = find(old, DISRUPTION_TARGET) {
            conditions.retain(|c| c.type_ != DISRUPTION_TARGET);
            conditions.push(disruption.clone());
        }
        let ready = self.ready(&conditions);
        let observed = generation(self.pod);
        conditions.extend(
            [
                self.ready_to_start_containers(),
                self.initialized(),
                ready,
                self.containers_ready(),
                condition(POD_SCHEDULED, true, None, None),
            ]
            .map(|c| PodCondition {
                observed_generation: observed,
                ..c
            }),
        );
        conditions
    }

    fn spec_init(&self) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Container> {
        self.pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
    }

    fn spec_apps(&self) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Container> {
        self.pod.spec.iter().flat_map(|s| &s.containers)
    }

    fn status_of(&self, name: &str) -> Option<&ContainerStatus> {
        let all = self.init_statuses.iter().chain(self.statuses);
        all.into_iter().find(|s| s.name == name)
    }

    /// kubelet's `GeneratePodReadyToStartContainersCondition` (`!PodSandboxChanged`).
    fn ready_to_start_containers(&self) -> PodCondition {
        let sandboxes = &self.runtime.sandboxes;
        let ready_count = sandboxes
            .iter()
            .filter(|s| s.state == SandboxState::Ready)
            .count();
        let host_network = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let newest_fits = sandboxes
            .iter()
            .max_by_key(|s| s.created_at)
            .is_some_and(|s| {
                s.state == SandboxState::Ready && s.config.host_network == host_network
            });
        condition(
            POD_READY_TO_START_CONTAINERS,
            ready_count == 1 && newest_fits,
            None,
            None,
        )
    }

    /// kubelet's `GeneratePodInitializedCondition`.
    fn initialized(&self) -> PodCondition {
        let (mut unknown, mut incomplete) = (Vec::new(), Vec::new());
        for c in self.spec_init() {
            match self.status_of(&c.name) {
                None => unknown.push(c.name.as_str()),
                Some(s) => {
                    let done = if is_restartable_init_container(c) {
                        s.started == Some(true)
                    } else {
                        s.ready
                    };
                    if !done {
                        incomplete.push(c.name.as_str());
                    }
                }
            }
        }
        if self.phase == Phase::Succeeded && unknown.is_empty() {
            return condition(INITIALIZED, true, Some("PodCompleted"), None);
        }
        if self.any_app_container_has_run() {
            return condition(INITIALIZED, true, None, None);
        }
        let message = messages(&[
            ("containers with unknown status", &unknown),
            ("containers with incomplete status", &incomplete),
        ]);
        match message {
            Some(m) => condition(
                INITIALIZED,
                false,
                Some("ContainersNotInitialized"),
                Some(m),
            ),
            None => condition(INITIALIZED, true, None, None),
        }
    }

    /// kubelet's `HasAnyRegularContainerStarted`.
    fn any_app_container_has_run(&self) -> bool {
        self.spec_apps().any(|c| {
            self.status_of(&c.name)
                .and_then(|s| s.state.as_ref())
                .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
        })
    }

    /// kubelet's `GenerateContainersReadyCondition`.
    fn containers_ready(&self) -> PodCondition {
        let (mut unknown, mut unready) = (Vec::new(), Vec::new());
        let sidecars = self
            .spec_init()
            .filter(|c| is_restartable_init_container(c));
        for c in sidecars.chain(self.spec_apps()) {
            match self.status_of(&c.name) {
                None => unknown.push(c.name.as_str()),
                Some(s) if !s.ready => unready.push(c.name.as_str()),
                Some(_) => {}
            }
        }
        match self.phase {
            Phase::Succeeded if unknown.is_empty() => {
                return condition(CONTAINERS_READY, false, Some("PodCompleted"), None)
            }
            Phase::Failed => return condition(CONTAINERS_READY, false, Some("PodFailed"), None),
            _ => {}
        }
        let message = messages(&[
            ("containers with unknown status", &unknown),
            ("containers with unready status", &unready),
        ]);
        match message {
            Some(m) => condition(CONTAINERS_READY, false, Some("ContainersNotReady"), Some(m)),
            None => condition(CONTAINERS_READY, true, None, None),
        }
    }

    /// kubelet's `GeneratePodReadyCondition`: `ContainersReady`, then the readiness gates.
    fn ready(&self, conditions: &[PodCondition]) -> PodCondition {
        let containers = self.containers_ready();
        if containers.status != "True" {
            return PodCondition {
                type_: READY.to_owned(),
                ..containers
            };
        }
        gates_ready(self.pod, conditions)
    }
}

/// The Ready condition once the containers are ready: True when every readiness gate's
/// condition is True in `conditions`, else `ReadinessGatesNotReady` with kubelet's message.
fn gates_ready(pod: &Pod, conditions: &[PodCondition]) -> PodCondition {
    let gates = pod
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten());
    let unready: Vec<String> = gates
        .filter_map(|g| {
            let gate = &g.condition_type;
            match conditions.iter().find(|c| &c.type_ == gate) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate \"{gate}\" does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate \"{gate}\" is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect();
    if unready.is_empty() {
        condition(READY, true, None, None)
    } else {
        condition(
            READY,
            false,
            Some("ReadinessGatesNotReady"),
            Some(unready.join(", ")),
        )
    }
}

/// kubelet's `NeedToReconcilePodReadiness`: the pod has readiness gates and the `Ready`
/// condition in its own status disagrees (status or message) with what its
/// `ContainersReady` condition and gate conditions make it — a client changed a gate's
/// condition, so the node must recompute `Ready`.
pub fn needs_readiness_reconcile(pod: &Pod) -> bool {
    let has_gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let Some(current) = find(status, READY) else {
        return false;
    };
    if !has_gates {
        return false;
    }
    let expected = match find(status, CONTAINERS_READY) {
        Some(c) if c.status == "True" => {
            gates_ready(pod, status.conditions.as_deref().unwrap_or_default())
        }
        Some(c) => c.clone(),
        None => return false,
    };
    current.status != expected.status || current.message != expected.message
}

/// Whether the kubelet writes conditions of this type (the ones it owns, and
/// `DisruptionTarget`, which it shares): the others belong to clients and are never sent.
pub fn written_by_kubelet(type_: &str) -> bool {
    KUBELET_OWNED.contains(&type_) || type_ == DISRUPTION_TARGET
}

/// `"<what>: [a b]"` parts joined by `", "`, as Go prints a `[]string` with `%s`.
fn messages(parts: &[(&str, &Vec<&str>)]) -> Option<String> {
    let parts: Vec<String> = parts
        .iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(what, names)| format!("{what}: [{}]", names.join(" ")))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn condition(
    type_: &str,
    status: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> PodCondition {
    PodCondition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.map(str::to_owned),
        message,
        ..PodCondition::default()
    }
}

fn find<'s>(status: &'s PodStatus, type_: &str) -> Option<&'s PodCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
}

/// Adds kubelet's `DisruptionTarget=True` (reason `TerminationByKubelet`, the eviction
/// message) before the kubelet-owned conditions, unless one is there already: what a
/// node-pressure eviction sets.
/// The pod's `metadata.generation` as kubelet's status manager records it
/// (PodObservedGenerationTracking, GA in 1.35): the generation of the pod object a status
/// was computed from, in `status.observedGeneration` and in each condition the kubelet
/// writes; none for a pod without one (a static pod's file).
pub(super) fn generation(pod: &Pod) -> Option<i64> {
    pod.metadata.generation.filter(|g| *g != 0)
}

pub(super) fn with_disruption_target(
    mut conditions: Vec<PodCondition>,
    message: &str,
    observed_generation: Option<i64>,
) -> Vec<PodCondition> {
    if conditions.iter().any(|c| c.type_ == DISRUPTION_TARGET) {
        return conditions;
    }
    let at = conditions
        .iter()
        .position(|c| {
            KUBELET_OWNED.contains(&c.type_.as_str()) || c.type_ == POD_READY_TO_START_CONTAINERS
        })
        .unwrap_or(conditions.len());
    conditions.insert(
        at,
        PodCondition {
            observed_generation,
            ..condition(
                DISRUPTION_TARGET,
                true,
                Some("TerminationByKubelet"),
                Some(message.to_owned()),
            )
        },
    );
    conditions
}

/// Sets `lastTransitionTime` of the kubelet's conditions: the previous one while the status is
/// unchanged, else `now`.
pub(super) fn with_transition_times(
    mut conditions: Vec<PodCondition>,
    old: &PodStatus,
    now: &Time,
) -> Vec<PodCondition> {
    for c in &mut conditions {
        let ours = KUBELET_OWNED.contains(&c.type_.as_str()) || c.type_ == DISRUPTION_TARGET;
        if !ours {
            continue;
        }
        let previous = find(old, &c.type_).filter(|p| p.status == c.status);
        c.last_transition_time = previous
            .and_then(|p| p.last_transition_time.clone())
            .or_else(|| Some(now.clone()));
    }
    conditions
}

#[cfg(test)]
mod tests {
    use ironlet_runtime::types::ExitReason;

    use crate::status::testing::*;

    const TWO_INITS: &str = "initContainers: [{name: a, image: i}, {name: b, image: i}]\ncontainers: [{name: c, image: i}]";
    const TWO: &str = "containers: [{name: c, image: i}, {name: d, image: i}]";

    fn f(s: &str) -> String {
        s.to_owned()
    }

    #[test]
    fn every_container_ready_makes_the_pod_ready_scheduled_and_initialized() {
        let status =
            Scenario::new(TWO, vec![running("c", 0, 100), running("d", 0, 100)]).generate();
        for type_ in [
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        ] {
            assert_eq!(cond(&status, type_), (f("True"), None, None), "{type_}");
        }
    }

    #[test]
    fn conditions_come_in_kubelets_order() {
        let status = Scenario::new(TWO, vec![]).generate();
        let types: Vec<_> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            [
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled"
            ]
        );
    }

    #[test]
    fn an_unready_container_is_named_by_ready_and_containers_ready() {
        let mut s = Scenario::new(TWO, vec![running("c", 0, 100), running("d", 0, 100)]);
        s.probes = Probes::unready(&["d"]);
        let status = s.generate();
        let want = (
            f("False"),
            Some(f("ContainersNotReady")),
            Some(f("containers with unready status: [d]")),
        );
        assert_eq!(cond(&status, "ContainersReady"), want);
        assert_eq!(cond(&status, "Ready"), want);
    }

    #[test]
    fn pending_init_containers_are_named_by_initialized() {
        let status = Scenario::new(TWO_INITS, vec![]).generate();
        assert_eq!(
            cond(&status, "Initialized"),
            (
                f("False"),
                Some(f("ContainersNotInitialized")),
                Some(f("containers with incomplete status: [a b]"))
            )
        );
        assert_eq!(
            cond(&status, "Ready").2.as_deref(),
            Some("containers with unready status: [c]")
        );
    }

    #[test]
    fn finished_init_containers_initialize_the_pod() {
        let containers = vec![
            exited("a", 0, 100, 0, ExitReason::Completed),
            exited("b", 0, 110, 0, ExitReason::Completed),
        ];
        let status = Scenario::new(TWO_INITS, containers).generate();
        assert_eq!(cond(&status, "Initialized"), (f("True"), None, None));
    }

    #[test]
    fn a_succeeded_pod_is_initialized_and_not_ready_with_pod_completed() {
        let spec = format!("restartPolicy: Never\n{TWO}");
        let containers = vec![
            exited("c", 0, 100, 0, ExitReason::Completed),
            exited("d", 0, 100, 0, ExitReason::Completed),
        ];
        let status = Scenario::new(&spec, containers).generate();
        assert_eq!(phase(&status), "Succeeded");
        assert_eq!(
            cond(&status, "Initialized"),
            (f("True"), Some(f("PodCompleted")), None)
        );
        assert_eq!(
            cond(&status, "Ready"),
            (f("False"), Some(f("PodCompleted")), None)
        );
        assert_eq!(
            cond(&status, "ContainersReady"),
            (f("False"), Some(f("PodCompleted")), None)
        );
    }

    #[test]
    fn a_failed_pod_is_not_ready_with_pod_failed() {
        let spec = format!("restartPolicy: Never\n{TWO}");
        let containers = vec![
            exited("c", 0, 100, 1, ExitReason::Error),
            exited("d", 0, 100, 0, ExitReason::Completed),
        ];
        let status = Scenario::new(&spec, containers).generate();
        assert_eq!(phase(&status), "Failed");
        assert_eq!(
            cond(&status, "Ready"),
            (f("False"), Some(f("PodFailed")), None)
        );
    }

    #[test]
    fn ready_to_start_containers_needs_a_ready_sandbox() {
        let mut s = Scenario::new(TWO, vec![]);
        assert_eq!(cond(&s.generate(), "PodReadyToStartContainers").0, "True");
        s.runtime.sandboxes.clear();
        assert_eq!(cond(&s.generate(), "PodReadyToStartContainers").0, "False");
        s.runtime.sandboxes = vec![sandbox(None)];
        s.runtime.sandboxes[0].state = ironlet_runtime::types::SandboxState::NotReady;
        assert_eq!(cond(&s.generate(), "PodReadyToStartContainers").0, "False");
    }

    #[test]
    fn a_missing_readiness_gate_keeps_the_pod_unready() {
        let spec = format!("readinessGates: [{{conditionType: example.com/lb}}]\n{TWO}");
        let mut s = Scenario::new(&spec, vec![running("c", 0, 100), running("d", 0, 100)]);
        let status = s.generate();
        assert_eq!(cond(&status, "ContainersReady").0, "True");
        assert_eq!(
            cond(&status, "Ready"),
            (
                f("False"),
                Some(f("ReadinessGatesNotReady")),
                Some(f("corresponding condition of pod readiness gate \"example.com/lb\" does not exist."))
            )
        );
        let gate = k8s_openapi::api::core::v1::PodCondition {
            type_: f("example.com/lb"),
            status: f("True"),
            ..Default::default()
        };
        s.pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            conditions: Some(vec![gate.clone()]),
            ..Default::default()
        });
        let status = s.generate();
        assert_eq!(cond(&status, "Ready").0, "True");
        assert_eq!(
            condition(&status, "example.com/lb"),
            &gate,
            "other conditions are kept as they are"
        );
    }

    #[test]
    fn last_transition_time_is_kept_while_the_status_is_unchanged() {
        let mut s = Scenario::new(TWO, vec![running("c", 0, 100), running("d", 0, 100)]);
        s.now = t(1000);
        let first = s.generate();
        s.previous = Some(first);
        s.now = t(2000);
        let second = s.generate();
        let at = |type_| {
            condition(&second, type_)
                .last_transition_time
                .as_ref()
                .unwrap()
                .0
                .as_second()
        };
        assert_eq!(at("Ready"), 1000);
        assert_eq!(at("PodScheduled"), 1000);

        s.probes = Probes::unready(&["c"]);
        s.previous = Some(second);
        s.now = t(3000);
        let third = s.generate();
        let at = |type_| {
            condition(&third, type_)
                .last_transition_time
                .as_ref()
                .unwrap()
                .0
                .as_second()
        };
        assert_eq!(at("Ready"), 3000, "Ready flipped to False");
        assert_eq!(at("ContainersReady"), 3000);
        assert_eq!(at("Initialized"), 1000);
    }
}

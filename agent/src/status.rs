//! A pod's API status (`v1.PodStatus`), computed from what the runtime sees, as kubelet's
//! `generateAPIPodStatus` computes it, and the one-line summary `ironlet pods` prints.
//!
//! ```text
//!  desired Pod ─┐
//!  runtime PodStatus (sandboxes, containers incl. dead ones) ─┤
//!  probes (started / ready) ─┤   containers.rs    phase.rs    conditions.rs
//!  waiting reasons of the last sync ─┼─► container ──► phase ──► conditions ──► v1.PodStatus
//!  previous API status ─┤             statuses                  (+ IPs, startTime, QoS)
//!  host IPs, now, lifecycle ─┘
//! ```
//!
//! Start at [`generate_pod_status`]. Everything here is pure: no clock, no I/O; the caller
//! passes "now" and the probe results, so every rule is unit-tested.
//!
//! Guarantees:
//! * `initContainerStatuses` follow the spec order; `containerStatuses` are sorted by name, as
//!   kubelet sorts them (`SortedContainerStatuses`); one entry per spec container, always.
//! * A phase never leaves `Succeeded`/`Failed` once the previous status (or the pod's own
//!   `status`) had it.
//! * `startTime` and each condition's `lastTransitionTime` are kept from the previous status
//!   while they apply (the condition's status is unchanged); times are whole seconds, as the
//!   API serialises them, so a status survives a round trip unchanged.
//! * `lastState` is the second most recent instance the runtime still has, and `restartCount`
//!   the newest instance's attempt — kubelet's rules, so a runtime that garbage-collected older
//!   instances still yields the right count.
//!
//! Current behaviour, apart from the contract: ephemeral containers get no status; a static pod
//! that the worker has terminated gets a terminal phase (kubelet skips this for static pods, a
//! TODO upstream); pod IPs are kept from the previous status once the sandbox is gone.

mod columns;
mod conditions;
pub use conditions::{needs_readiness_reconcile, written_by_kubelet};
mod containers;
mod phase;
#[cfg(test)]
mod testing;
mod time;

use std::collections::BTreeMap;
use std::time::SystemTime;

use ironlet_runtime::types::{ContainerId, PodStatus as RuntimePodStatus};
use k8s_openapi::api::core::v1::{HostIP, Pod, PodIP, PodStatus};

pub use columns::{kubectl_columns, PodColumns};
pub use containers::{api_container_id, CONTAINER_ID_SCHEME};
pub use phase::Phase;

/// A container not created yet, in a pod without init containers.
pub const CONTAINER_CREATING: &str = "ContainerCreating";
/// A container not created yet while the pod has init containers.
pub const POD_INITIALIZING: &str = "PodInitializing";
/// A failed container waits out its back-off.
pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
/// A container the runtime lost track of.
pub const CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// Readiness and start-up as the probe workers last saw them.
///
/// Only asked about a container that is running now; the implementation answers `true` for a
/// container without such a probe (kubelet: "no readinessProbe -> always ready").
pub trait ProbeState {
    /// Whether the readiness probe of this instance succeeded last.
    fn is_ready(&self, container_name: &str, container_id: &ContainerId) -> bool;
    /// Whether the startup probe of this instance has succeeded.
    fn is_started(&self, container_name: &str, container_id: &ContainerId) -> bool;
}

/// Every running container is started and ready: a pod without probes.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProbes;

impl ProbeState for NoProbes {
    fn is_ready(&self, _: &str, _: &ContainerId) -> bool {
        true
    }
    fn is_started(&self, _: &str, _: &ContainerId) -> bool {
        true
    }
}

/// Why the pod worker's last sync left a container waiting (kubelet's `reasonCache`): e.g.
/// `CrashLoopBackOff`, `CreateContainerConfigError`, `ErrImagePull`, `ErrImageNeverPull`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingReason {
    pub reason: String,
    pub message: String,
}

impl WaitingReason {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// kubelet's back-off reason: `back-off 10s restarting failed container=c pod=p_ns(uid)`.
    pub fn crash_loop_back_off(delay: std::time::Duration, container: &str, pod: &Pod) -> Self {
        let pod = crate::config::pod_desc(pod);
        Self::new(
            CRASH_LOOP_BACK_OFF,
            format!(
                "back-off {} restarting failed container={container} pod={pod}",
                time::go_duration(delay)
            ),
        )
    }
}

/// Waiting reasons by container name.
pub type WaitingReasons = BTreeMap<String, WaitingReason>;

/// Image ids (`sha256:<config digest>`) to the reference reported as `imageID`
/// (`docker.io/library/busybox@sha256:<manifest digest>`); an id not found is reported as is.
pub type ImageRefs = BTreeMap<String, String>;

/// Where the pod is in its life, as far as its status is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PodLifecycle {
    /// Admitted and being synced: containers may still start and restart.
    #[default]
    Active,
    /// The worker has stopped the pod for good (kubelet's `podIsTerminal`): its containers will
    /// not restart, so the phase is Succeeded or Failed once they have all stopped.
    Terminal,
    /// Admission rejected the pod (kubelet's `rejectPod`): phase Failed with admission's reason
    /// (`OutOfmemory`…) and message; no container status, no condition.
    Rejected { reason: String, message: String },
    /// An internal module failed the pod (kubelet's `ShouldEvict`, e.g. `DeadlineExceeded`,
    /// or the eviction manager): phase Failed with this reason and message, container
    /// statuses as usual; node-pressure evictions also get kubelet's `DisruptionTarget`
    /// condition (`disruption_target`).
    Evicted {
        reason: String,
        message: String,
        disruption_target: bool,
    },
}

/// Everything [`generate_pod_status`] reads.
#[derive(Clone, Copy)]
pub struct StatusInputs<'a> {
    /// The desired pod.
    pub pod: &'a Pod,
    /// The runtime's view of it; a pod the runtime has never seen has no sandbox or container.
    pub runtime: &'a RuntimePodStatus,
    pub probes: &'a dyn ProbeState,
    pub waiting: &'a WaitingReasons,
    /// The status generated last time (the status manager's copy); `None` falls back to the
    /// pod's own `status`.
    pub previous: Option<&'a PodStatus>,
    /// The node's IPs, primary first (`hostIP`, `hostIPs`; a hostNetwork pod's `podIPs`).
    pub host_ips: &'a [String],
    pub image_refs: &'a ImageRefs,
    pub lifecycle: &'a PodLifecycle,
    pub now: SystemTime,
}

/// Whether a status is final: `Succeeded` or `Failed`.
pub fn pod_is_terminal(status: &PodStatus) -> bool {
    Phase::of(status).is_terminal()
}

/// kubelet's status manager (`mergePodStatus`): "the Kubelet should never transition a pod to
/// terminal status that could have running containers". While a container of the pod still
/// runs, a terminal `status` (an eviction, a node shutdown, an active deadline: phase Failed
/// as soon as the kill starts) is published with the phase, reason and message of `old` (the
/// status published before, or the pod's own; `Pending` without one); a new
/// `DisruptionTarget` condition waits for the terminal phase too, as in kubelet. Once the kill
/// has stopped every container, both go out. What the worker decides on is the status as
/// computed, not this one.
///
/// Difference from kubelet: the other conditions and the container statuses stay as
/// computed for the terminal phase, so a pod killed by an eviction or a node shutdown is
/// `Ready=False` (`PodFailed`) from the start of its kill; kubelet keeps its readiness until
/// the terminal phase is sent.
pub fn delay_terminal_phase(
    mut status: PodStatus,
    runtime: &RuntimePodStatus,
    old: Option<&PodStatus>,
) -> PodStatus {
    let running = runtime
        .containers
        .iter()
        .any(|c| c.state == ironlet_runtime::types::ContainerState::Running);
    if !running || !pod_is_terminal(&status) {
        return status;
    }
    // A terminal phase published before stays (a phase never leaves Succeeded/Failed).
    if old.is_some_and(pod_is_terminal) {
        return status;
    }
    status.phase = Some(
        old.and_then(|o| o.phase.clone())
            .unwrap_or_else(|| Phase::Pending.as_str().to_owned()),
    );
    status.reason = old.and_then(|o| o.reason.clone());
    status.message = old.and_then(|o| o.message.clone());
    // kubelet sends a new `DisruptionTarget` only with the terminal phase.
    let had_target = old
        .and_then(|o| o.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == conditions::DISRUPTION_TARGET));
    if !had_target {
        if let Some(list) = status.conditions.as_mut() {
            list.retain(|c| c.type_ != conditions::DISRUPTION_TARGET);
        }
    }
    status
}

/// kubelet's `generateAPIPodStatus` followed by the status manager's time keeping.
pub fn generate_pod_status(inputs: &StatusInputs<'_>) -> PodStatus {
    let pod = inputs.pod;
    let empty = PodStatus::default();
    let api = pod.status.as_ref().unwrap_or(&empty);
    let old = inputs.previous.unwrap_or(api);
    let now = time::api_time(inputs.now);
    let start_time = Some(
        old.start_time
            .clone()
            .or(api.start_time.clone())
            .unwrap_or_else(|| now.clone()),
    );
    let qos_class = match crate::qos::qos_class(pod) {
        Ok(class) => Some(class.as_str().to_owned()),
        Err(err) => {
            tracing::warn!(pod_uid = pod.metadata.uid.as_deref().unwrap_or_default(), %err, "pod QoS class not computable");
            old.qos_class.clone()
        }
    };

    // kubelet's `SetPodStatus`: the generation of the pod the status reflects, never older
    // than the one published before (a status computed from an older copy of the pod).
    let observed_generation = conditions::generation(pod)
        .max(old.observed_generation)
        .filter(|g| *g != 0);

    if let PodLifecycle::Rejected { reason, message } = inputs.lifecycle {
        return PodStatus {
            observed_generation,
            phase: Some(Phase::Failed.as_str().to_owned()),
            reason: Some(reason.clone()),
            message: Some(format!("Pod was rejected: {message}")),
            qos_class,
            start_time,
            ..PodStatus::default()
        };
    }

    let ctx = containers::Context::new(inputs);
    let init_statuses = ctx.init_statuses(old);
    let statuses = ctx.regular_statuses(old);
    let ephemeral_statuses = ctx.ephemeral_statuses(old);
    let terminal = matches!(inputs.lifecycle, PodLifecycle::Terminal);
    let mut phase = phase::get_phase(
        pod,
        &init_statuses,
        &statuses,
        terminal,
        ctx.has_active_regular_container(),
    );
    let (old_phase, api_phase) = (Phase::of(old), Phase::of(api));
    if !phase.is_terminal() {
        if old_phase.is_terminal() {
            phase = old_phase;
        } else if api_phase.is_terminal() {
            phase = api_phase;
        }
    }
    let (mut reason, mut message) = (None, None);
    if phase == old_phase {
        reason = non_empty(&old.reason).or_else(|| non_empty(&api.reason));
        message = non_empty(&old.message).or_else(|| non_empty(&api.message));
    }
    if let PodLifecycle::Evicted {
        reason: r,
        message: m,
        ..
    } = inputs.lifecycle
    {
        (phase, reason, message) = (Phase::Failed, Some(r.clone()), Some(m.clone()));
    }
    if api_phase.is_terminal() && phase != api_phase {
        tracing::error!(
            pod_uid = pod.metadata.uid.as_deref().unwrap_or_default(),
            from = api_phase.as_str(),
            to = phase.as_str(),
            "pod attempted illegal phase transition"
        );
        phase = api_phase;
    }

    let generated = conditions::Inputs {
        pod,
        runtime: inputs.runtime,
        init_statuses: &init_statuses,
        statuses: &statuses,
        phase,
    };
    let mut all = generated.all(api, old);
    if let PodLifecycle::Evicted {
        message,
        disruption_target: true,
        ..
    } = inputs.lifecycle
    {
        all = conditions::with_disruption_target(all, message, conditions::generation(pod));
    }
    let conditions = conditions::with_transition_times(all, old, &now);

    let (host_ip, host_ips) = host_ips(inputs.host_ips);
    let mut pod_ips = ctx.sandbox_ips();
    if pod_ips.is_empty() && is_host_network(pod) {
        pod_ips = inputs.host_ips.iter().take(1).cloned().collect();
    }
    if pod_ips.is_empty() {
        pod_ips = old.pod_ips.iter().flatten().map(|p| p.ip.clone()).collect();
    }

    PodStatus {
        observed_generation,
        phase: Some(phase.as_str().to_owned()),
        reason,
        message,
        conditions: Some(conditions),
        host_ip,
        host_ips,
        pod_ip: pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty())
            .then(|| pod_ips.into_iter().map(|ip| PodIP { ip }).collect()),
        start_time,
        qos_class,
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(statuses),
        ephemeral_container_statuses: (!ephemeral_statuses.is_empty())
            .then_some(ephemeral_statuses),
        ..PodStatus::default()
    }
}

fn non_empty(s: &Option<String>) -> Option<String> {
    s.as_ref().filter(|s| !s.is_empty()).cloned()
}

fn host_ips(ips: &[String]) -> (Option<String>, Option<Vec<HostIP>>) {
    let host_ips: Vec<HostIP> = ips
        .iter()
        .take(2)
        .map(|ip| HostIP { ip: ip.clone() })
        .collect();
    (
        ips.first().cloned(),
        (!host_ips.is_empty()).then_some(host_ips),
    )
}

fn is_host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ironlet_runtime::types::ExitReason;

    use super::testing::*;
    use super::*;

    const ONE: &str = "containers: [{name: a, image: i}]";

    #[test]
    fn a_running_pod_reports_ips_start_time_and_qos() {
        let status = Scenario::new(ONE, vec![running("a", 0, 100)]).generate();
        assert_eq!(phase(&status), "Running");
        assert_eq!(status.pod_ip.as_deref(), Some("10.88.0.5"));
        assert_eq!(
            status.pod_ips,
            Some(vec![PodIP {
                ip: "10.88.0.5".into()
            }])
        );
        assert_eq!(status.host_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(
            status.host_ips,
            Some(vec![HostIP {
                ip: "192.168.1.10".into()
            }])
        );
        assert_eq!(status.start_time.as_ref().unwrap().0.as_second(), 1000);
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(status.init_container_statuses, None);
    }

    #[test]
    fn a_host_network_pod_has_the_host_ip_as_pod_ip() {
        let mut s = Scenario::new(
            &format!("hostNetwork: true\n{ONE}"),
            vec![running("a", 0, 100)],
        );
        s.runtime.sandboxes = vec![sandbox(None)];
        s.runtime.sandboxes[0].config.host_network = true;
        let status = s.generate();
        assert_eq!(status.pod_ip, status.host_ip);
        assert_eq!(status.pod_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(
            condition(&status, "PodReadyToStartContainers").status,
            "True"
        );
    }

    #[test]
    fn start_time_is_the_first_time_the_pod_was_seen() {
        let mut s = Scenario::new(ONE, vec![]);
        s.now = t(500);
        s.previous = Some(s.generate());
        s.now = t(900);
        assert_eq!(s.generate().start_time.unwrap().0.as_second(), 500);
    }

    #[test]
    fn pod_ips_outlive_the_sandbox() {
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        s.previous = Some(s.generate());
        s.runtime.sandboxes.clear();
        assert_eq!(s.generate().pod_ip.as_deref(), Some("10.88.0.5"));
    }

    #[test]
    fn the_status_and_the_kubelets_conditions_carry_the_pods_generation() {
        let mut s = Scenario::new(
            "readinessGates: [{conditionType: example.com/gate}]\ncontainers: [{name: a, image: i}]",
            vec![running("a", 0, 100)],
        );
        let gate = k8s_openapi::api::core::v1::PodCondition {
            type_: "example.com/gate".into(),
            status: "True".into(),
            observed_generation: Some(1),
            ..Default::default()
        };
        s.pod.status = Some(PodStatus {
            conditions: Some(vec![gate.clone()]),
            ..PodStatus::default()
        });
        let status = s.generate();
        assert_eq!(
            status.observed_generation, None,
            "a pod without a generation"
        );
        s.pod.metadata.generation = Some(3);
        let status = s.generate();
        assert_eq!(status.observed_generation, Some(3));
        for c in status.conditions.iter().flatten() {
            let want = if c.type_ == gate.type_ {
                Some(1)
            } else {
                Some(3)
            };
            assert_eq!(c.observed_generation, want, "{c:?}");
        }
        // A status from an older copy of the pod never takes the published one back.
        s.previous = Some(PodStatus {
            observed_generation: Some(5),
            ..status
        });
        assert_eq!(s.generate().observed_generation, Some(5));
        s.previous = None;
        s.lifecycle = PodLifecycle::Rejected {
            reason: "OutOfmemory".into(),
            message: "no".into(),
        };
        assert_eq!(s.generate().observed_generation, Some(3));
        s.lifecycle = PodLifecycle::Evicted {
            reason: "Evicted".into(),
            message: "low".into(),
            disruption_target: true,
        };
        let status = s.generate();
        assert_eq!(
            condition(&status, "DisruptionTarget").observed_generation,
            Some(3)
        );
    }

    #[test]
    fn a_rejected_pod_is_failed_with_admissions_reason_and_nothing_else() {
        let mut s = Scenario::new(ONE, vec![]);
        s.lifecycle = PodLifecycle::Rejected {
            reason: "OutOfmemory".into(),
            message: "Node didn't have enough resource: memory, requested: 2, used: 0, capacity: 1"
                .into(),
        };
        let status = s.generate();
        assert_eq!(phase(&status), "Failed");
        assert_eq!(status.reason.as_deref(), Some("OutOfmemory"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was rejected: Node didn't have enough resource: memory, requested: 2, used: 0, capacity: 1")
        );
        assert_eq!(status.container_statuses, None);
        assert_eq!(status.conditions, None);
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
        assert!(pod_is_terminal(&status));
    }

    #[test]
    fn a_pressure_eviction_adds_kubelets_disruption_target_condition() {
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        s.lifecycle = PodLifecycle::Evicted {
            reason: "Evicted".into(),
            message: "The node was low on resource: memory. ".into(),
            disruption_target: true,
        };
        let status = s.generate();
        let disruption = condition(&status, "DisruptionTarget");
        assert_eq!(disruption.status, "True");
        assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
        assert_eq!(
            disruption.message.as_deref(),
            Some("The node was low on resource: memory. ")
        );
        assert!(disruption.last_transition_time.is_some());
        let types: Vec<&str> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types[0], "DisruptionTarget", "{types:?}");
    }

    #[test]
    fn an_evicted_pod_is_failed_with_its_reason_and_keeps_its_container_statuses() {
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        s.lifecycle = PodLifecycle::Evicted {
            reason: "DeadlineExceeded".into(),
            message: "Pod was active on the node longer than the specified deadline".into(),
            disruption_target: false,
        };
        let status = s.generate();
        assert!(status
            .conditions
            .iter()
            .flatten()
            .all(|c| c.type_ != "DisruptionTarget"));
        assert_eq!(
            (phase(&status), status.reason.as_deref()),
            ("Failed", Some("DeadlineExceeded"))
        );
        assert!(container(&status, "a")
            .state
            .as_ref()
            .unwrap()
            .running
            .is_some());
        assert_eq!(
            condition(&status, "Ready").reason.as_deref(),
            Some("PodFailed")
        );
    }

    #[test]
    fn a_killed_pods_terminal_phase_is_published_only_once_no_container_runs() {
        // A node shutdown: Failed from the start of the kill, as the worker decides.
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        let before = s.generate();
        s.previous = Some(before.clone());
        s.lifecycle = PodLifecycle::Evicted {
            reason: "Terminated".into(),
            message: "Pod was terminated in response to imminent node shutdown.".into(),
            disruption_target: true,
        };
        let computed = s.generate();
        assert_eq!(phase(&computed), "Failed");
        let published = delay_terminal_phase(computed.clone(), &s.runtime, Some(&before));
        assert_eq!(
            (phase(&published), published.reason.as_deref()),
            ("Running", None),
            "a container still runs: {published:?}"
        );
        assert!(
            published
                .conditions
                .iter()
                .flatten()
                .all(|c| c.type_ != "DisruptionTarget"),
            "DisruptionTarget goes out with the terminal phase"
        );
        let ready = condition(&published, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("PodFailed"))
        );
        assert_eq!(published.container_statuses, computed.container_statuses);
        // Once published (an agent restarted in the middle of the kill), it stays.
        let mut running_with_target = computed.clone();
        running_with_target.phase = Some("Running".into());
        let again = delay_terminal_phase(computed.clone(), &s.runtime, Some(&running_with_target));
        assert_eq!(phase(&again), "Running");
        assert_eq!(condition(&again, "DisruptionTarget").status, "True");
        // Without a status before it, the held phase is Pending.
        let first = delay_terminal_phase(computed, &s.runtime, None);
        assert_eq!(phase(&first), "Pending");

        // The kill stopped it: the terminal phase goes out.
        s.previous = Some(published);
        s.runtime.containers = vec![exited("a", 0, 100, 143, ExitReason::Error)];
        s.lifecycle = PodLifecycle::Evicted {
            reason: "Terminated".into(),
            message: "Pod was terminated in response to imminent node shutdown.".into(),
            disruption_target: true,
        };
        let done = s.generate();
        let published = delay_terminal_phase(done.clone(), &s.runtime, s.previous.as_ref());
        assert_eq!(published, done);
        assert_eq!(
            (phase(&published), published.reason.as_deref()),
            ("Failed", Some("Terminated"))
        );
        assert_eq!(condition(&published, "DisruptionTarget").status, "True");
        // A phase published terminal stays so even if a container were seen running.
        let failed = delay_terminal_phase(
            published.clone(),
            &runtime(vec![sandbox(None)], vec![running("a", 1, 200)]),
            Some(&published),
        );
        assert_eq!(phase(&failed), "Failed");
    }

    #[test]
    fn a_terminated_pod_ends_succeeded_even_under_restart_policy_always() {
        let mut s = Scenario::new(ONE, vec![exited("a", 0, 100, 0, ExitReason::Completed)]);
        assert_eq!(phase(&s.generate()), "Running");
        s.lifecycle = PodLifecycle::Terminal;
        assert_eq!(phase(&s.generate()), "Succeeded");
        s.runtime.containers = vec![exited("a", 0, 100, 143, ExitReason::Error)];
        assert_eq!(phase(&s.generate()), "Failed");
    }

    #[test]
    fn a_terminal_phase_is_never_left() {
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        s.previous = Some(PodStatus {
            phase: Some("Failed".into()),
            reason: Some("OutOfmemory".into()),
            ..PodStatus::default()
        });
        let status = s.generate();
        assert_eq!(phase(&status), "Failed");
        assert_eq!(
            status.reason.as_deref(),
            Some("OutOfmemory"),
            "the phase's reason stays with it"
        );

        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        s.pod.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..PodStatus::default()
        });
        assert_eq!(phase(&s.generate()), "Succeeded");
    }

    #[test]
    fn a_reason_is_dropped_when_the_phase_changes() {
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        s.previous = Some(PodStatus {
            phase: Some("Pending".into()),
            reason: Some("SomethingPending".into()),
            ..PodStatus::default()
        });
        assert_eq!(s.generate().reason, None);
    }

    #[test]
    fn a_status_survives_a_json_round_trip_unchanged() {
        let mut containers = vec![
            exited("a", 1, 100, 1, ExitReason::Error),
            running("a", 2, 200),
        ];
        containers[1].started_at = Some(t(201) + Duration::from_millis(750));
        let mut s = Scenario::new(ONE, containers);
        s.now = t(1000) + Duration::from_millis(999);
        let status = s.generate();
        let json = serde_json::to_string(&status).unwrap();
        let back: PodStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(back, status);
    }

    #[test]
    fn the_next_status_from_the_previous_one_is_identical_when_nothing_changed() {
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        let first = s.generate();
        s.previous = Some(first.clone());
        s.now = t(5000);
        assert_eq!(s.generate(), first);
    }

    #[test]
    fn crash_loop_back_off_reads_as_kubelet_writes_it() {
        let pod = pod(ONE);
        let r = WaitingReason::crash_loop_back_off(Duration::from_secs(80), "a", &pod);
        assert_eq!(r.reason, "CrashLoopBackOff");
        assert_eq!(
            r.message,
            "back-off 1m20s restarting failed container=a pod=p_ns(u1)"
        );
    }
}

//! The pod phase, and kubelet's `getPhase`: how the states of the init, sidecar and app
//! containers and the restart policy make Pending, Running, Succeeded or Failed.
//!
//! The rules, in order:
//! 1. an init container that failed (exit code ≠ 0, now or in its last state) and is not
//!    restarted (its own `restartPolicy`/`restartPolicyRules`, else the pod's `Never`)
//!    ⇒ **Failed**;
//! 2. a regular init container not finished, a sidecar not started while no app container has
//!    run in the current sandbox, or an app container waiting for its first run ⇒ **Pending**;
//! 3. app containers all known and one running ⇒ **Running**;
//! 4. app containers all known and all stopped: **Running** while one of them will restart
//!    (its own `restartPolicy`/`restartPolicyRules`, else the pod's: `Always` restarts every
//!    one, `OnFailure` the failed ones) and the pod is not terminal; otherwise **Succeeded**
//!    when every one exited 0 and **Failed** otherwise;
//! 5. anything else ⇒ **Pending**.
//!
//! Sidecars (init containers with `restartPolicy: Always`) count like app containers while
//! they run, and never make the pod fail by stopping.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};

use crate::qos::is_restartable_init_container;
use crate::sync::restart::should_restart;

/// `status.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Unknown => "Unknown",
        }
    }

    /// The phase a status reports; a missing or unrecognised phase reads as Pending.
    pub fn of(status: &PodStatus) -> Self {
        match status.phase.as_deref() {
            Some("Running") => Self::Running,
            Some("Succeeded") => Self::Succeeded,
            Some("Failed") => Self::Failed,
            Some("Unknown") => Self::Unknown,
            _ => Self::Pending,
        }
    }

    /// Succeeded or Failed: the pod will not run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// Where one container stands, for the phase.
enum Stand {
    Unknown,
    Running,
    /// Terminated now, with this exit code.
    Exited(i32),
    /// Waiting after a previous run that ended with this exit code.
    Restarting(i32),
    /// Waiting, never run (or no previous termination known).
    Waiting,
}

fn stand(status: Option<&ContainerStatus>) -> Stand {
    let Some(status) = status else {
        return Stand::Unknown;
    };
    let state = status.state.as_ref();
    if state.is_some_and(|s| s.running.is_some()) {
        return Stand::Running;
    }
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return Stand::Exited(t.exit_code);
    }
    if state.is_some_and(|s| s.waiting.is_some()) {
        return match status
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
        {
            Some(t) => Stand::Restarting(t.exit_code),
            None => Stand::Waiting,
        };
    }
    Stand::Unknown
}

#[derive(Default)]
struct Counts {
    pending_init: u32,
    pending_sidecars: u32,
    failed_init: u32,
    unknown: u32,
    running: u32,
    waiting: u32,
    stopped: u32,
    succeeded: u32,
    /// Stopped app containers that their restart policy (their own or the pod's) restarts.
    restarting: u32,
}

fn find<'a>(list: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    list.iter().find(|s| s.name == name)
}

/// kubelet's `getPhase`. `terminal`: the worker has stopped the pod for good;
/// `initialized`: an app container exists in the current sandbox (kubelet's
/// `HasAnyActiveRegularContainerStarted`), so a restarting sidecar does not make it Pending.
pub(super) fn get_phase(
    pod: &Pod,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    terminal: bool,
    initialized: bool,
) -> Phase {
    let Some(spec) = pod.spec.as_ref() else {
        return Phase::Pending;
    };
    let mut n = Counts::default();
    for c in spec.init_containers.iter().flatten() {
        let status = find(init_statuses, &c.name);
        let started = status.and_then(|s| s.started).unwrap_or(false);
        match (is_restartable_init_container(c), stand(status)) {
            (false, Stand::Exited(code) | Stand::Restarting(code)) => {
                // Failed for good when the container's own policy (else the pod's) gives up.
                let gives_up = match c.restart_policy {
                    Some(_) => !should_restart(c, Some(spec), Some(code)),
                    None => spec.restart_policy.as_deref() == Some("Never"),
                };
                n.failed_init += u32::from(code != 0 && gives_up);
            }
            (false, _) => n.pending_init += 1,
            (true, Stand::Running) => {
                n.pending_sidecars += u32::from(!started);
                n.running += 1;
            }
            (true, Stand::Exited(_) | Stand::Restarting(_)) => {}
            (true, Stand::Waiting) => {
                n.pending_sidecars += 1;
                n.waiting += 1;
            }
            (true, Stand::Unknown) => {
                n.pending_sidecars += 1;
                n.unknown += 1;
            }
        }
    }
    for c in &spec.containers {
        match stand(find(statuses, &c.name)) {
            Stand::Unknown => n.unknown += 1,
            Stand::Running => n.running += 1,
            Stand::Exited(code) => {
                n.stopped += 1;
                n.succeeded += u32::from(code == 0);
                n.restarting += u32::from(should_restart(c, Some(spec), Some(code)));
            }
            Stand::Restarting(code) => {
                n.stopped += 1;
                n.restarting += u32::from(should_restart(c, Some(spec), Some(code)));
            }
            Stand::Waiting => n.waiting += 1,
        }
    }

    if n.failed_init > 0 {
        return Phase::Failed;
    }
    if n.pending_init > 0 || (n.pending_sidecars > 0 && !initialized) || n.waiting > 0 {
        return Phase::Pending;
    }
    if n.running > 0 && n.unknown == 0 {
        return Phase::Running;
    }
    if n.running == 0 && n.stopped > 0 && n.unknown == 0 {
        return if !terminal && n.restarting > 0 {
            Phase::Running
        } else if n.stopped == n.succeeded {
            Phase::Succeeded
        } else {
            Phase::Failed
        };
    }
    Phase::Pending
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::testing::{pod, status, State};

    fn phase(spec: &str, init: &[(&str, State)], app: &[(&str, State)]) -> Phase {
        phase_with(spec, init, app, false, false)
    }

    fn phase_with(
        spec: &str,
        init: &[(&str, State)],
        app: &[(&str, State)],
        terminal: bool,
        initialized: bool,
    ) -> Phase {
        let to =
            |list: &[(&str, State)]| list.iter().map(|(n, s)| status(n, *s)).collect::<Vec<_>>();
        get_phase(&pod(spec), &to(init), &to(app), terminal, initialized)
    }

    const ONE: &str = "containers: [{name: a, image: i}]";
    const TWO: &str = "containers: [{name: a, image: i}, {name: b, image: i}]";
    const INIT_NEVER: &str =
        "restartPolicy: Never\ninitContainers: [{name: i, image: i}]\ncontainers: [{name: a, image: i}]";
    const INIT_ON_FAILURE: &str = "restartPolicy: OnFailure\ninitContainers: [{name: i, image: i}]\ncontainers: [{name: a, image: i}]";
    const SIDECAR: &str = "initContainers: [{name: s, image: i, restartPolicy: Always}]\ncontainers: [{name: a, image: i}]";

    #[test]
    fn a_container_not_created_yet_keeps_the_pod_pending() {
        assert_eq!(phase(ONE, &[], &[("a", State::Creating)]), Phase::Pending);
        assert_eq!(phase(ONE, &[], &[]), Phase::Pending);
    }

    #[test]
    fn all_containers_running_is_running() {
        let app = [("a", State::Running), ("b", State::Running)];
        assert_eq!(phase(TWO, &[], &app), Phase::Running);
    }

    #[test]
    fn one_exited_container_under_restart_policy_always_is_still_running() {
        let app = [("a", State::Running), ("b", State::Exited(1))];
        assert_eq!(phase(TWO, &[], &app), Phase::Running);
        let crashlooping = [("a", State::Running), ("b", State::BackOff(1))];
        assert_eq!(phase(TWO, &[], &crashlooping), Phase::Running);
    }

    #[test]
    fn all_exited_under_always_is_running_because_they_restart() {
        let app = [("a", State::Exited(0)), ("b", State::Exited(1))];
        assert_eq!(phase(TWO, &[], &app), Phase::Running);
    }

    #[test]
    fn all_exited_zero_under_never_or_on_failure_is_succeeded() {
        let app = [("a", State::Exited(0)), ("b", State::Exited(0))];
        for policy in ["Never", "OnFailure"] {
            let spec = format!("restartPolicy: {policy}\n{TWO}");
            assert_eq!(phase(&spec, &[], &app), Phase::Succeeded, "{policy}");
        }
    }

    #[test]
    fn one_failure_under_never_is_failed_and_under_on_failure_running() {
        let app = [("a", State::Exited(0)), ("b", State::Exited(2))];
        assert_eq!(
            phase(&format!("restartPolicy: Never\n{TWO}"), &[], &app),
            Phase::Failed
        );
        assert_eq!(
            phase(&format!("restartPolicy: OnFailure\n{TWO}"), &[], &app),
            Phase::Running
        );
    }

    #[test]
    fn containers_that_their_own_policy_does_not_restart_end_the_pod_under_always() {
        let never = "containers: [{name: a, image: i, restartPolicy: Never}]";
        assert_eq!(phase(never, &[], &[("a", State::Exited(1))]), Phase::Failed);
        assert_eq!(
            phase(never, &[], &[("a", State::Exited(0))]),
            Phase::Succeeded
        );
        let rules = "containers: [{name: a, image: i, restartPolicy: Never, \
                     restartPolicyRules: [{action: Restart, exitCodes: {operator: In, values: [42]}}]}]";
        assert_eq!(
            phase(rules, &[], &[("a", State::Exited(42))]),
            Phase::Running
        );
        assert_eq!(phase(rules, &[], &[("a", State::Exited(1))]), Phase::Failed);
        let always_in_never =
            "restartPolicy: Never\ncontainers: [{name: a, image: i, restartPolicy: Always}]";
        assert_eq!(
            phase(always_in_never, &[], &[("a", State::Exited(0))]),
            Phase::Running
        );
    }

    #[test]
    fn an_init_container_whose_own_policy_is_never_fails_the_pod_under_always() {
        let spec = "initContainers: [{name: i, image: i, restartPolicy: Never}]\ncontainers: [{name: a, image: i}]";
        assert_eq!(
            phase(spec, &[("i", State::Exited(1))], &[("a", State::Creating)]),
            Phase::Failed
        );
    }

    #[test]
    fn a_terminal_pod_ends_succeeded_or_failed_whatever_its_restart_policy() {
        let ok = [("a", State::Exited(0))];
        let bad = [("a", State::Exited(137))];
        assert_eq!(phase_with(ONE, &[], &ok, true, true), Phase::Succeeded);
        assert_eq!(phase_with(ONE, &[], &bad, true, true), Phase::Failed);
    }

    #[test]
    fn a_failed_init_container_under_never_fails_the_pod() {
        let init = [("i", State::Exited(1))];
        let app = [("a", State::Initializing)];
        assert_eq!(phase(INIT_NEVER, &init, &app), Phase::Failed);
    }

    #[test]
    fn a_failed_init_container_under_on_failure_keeps_the_pod_pending() {
        let app = [("a", State::Initializing)];
        assert_eq!(
            phase(INIT_ON_FAILURE, &[("i", State::Exited(1))], &app),
            Phase::Pending
        );
        assert_eq!(
            phase(INIT_ON_FAILURE, &[("i", State::BackOff(1))], &app),
            Phase::Pending
        );
    }

    #[test]
    fn a_running_init_container_keeps_the_pod_pending() {
        let app = [("a", State::Initializing)];
        assert_eq!(
            phase(INIT_NEVER, &[("i", State::Running)], &app),
            Phase::Pending
        );
    }

    #[test]
    fn init_done_and_app_running_is_running() {
        let init = [("i", State::Exited(0))];
        assert_eq!(
            phase(INIT_NEVER, &init, &[("a", State::Running)]),
            Phase::Running
        );
    }

    #[test]
    fn a_started_sidecar_counts_as_a_running_container() {
        let init = [("s", State::Running)];
        assert_eq!(
            phase(SIDECAR, &init, &[("a", State::Running)]),
            Phase::Running
        );
    }

    #[test]
    fn a_sidecar_not_started_keeps_an_uninitialized_pod_pending() {
        let init = [("s", State::RunningNotStarted)];
        let app = [("a", State::Exited(0))];
        assert_eq!(
            phase_with(SIDECAR, &init, &app, false, false),
            Phase::Pending
        );
        assert_eq!(
            phase_with(SIDECAR, &init, &app, false, true),
            Phase::Running
        );
    }

    #[test]
    fn a_stopped_sidecar_does_not_fail_a_succeeded_pod() {
        let spec = format!("restartPolicy: Never\n{SIDECAR}");
        let init = [("s", State::Exited(137))];
        assert_eq!(
            phase(&spec, &init, &[("a", State::Exited(0))]),
            Phase::Succeeded
        );
    }

    #[test]
    fn phases_parse_from_status_and_missing_reads_as_pending() {
        let mut s = PodStatus::default();
        assert_eq!(Phase::of(&s), Phase::Pending);
        s.phase = Some("Failed".into());
        assert!(Phase::of(&s).is_terminal());
        s.phase = Some("Running".into());
        assert!(!Phase::of(&s).is_terminal());
    }
}

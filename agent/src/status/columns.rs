//! The READY, STATUS, RESTARTS and IP columns of `ironlet pods`, computed from a pod's status
//! exactly as `kubectl get pods` computes them (kubectl's `printPod`).
//!
//! STATUS, in order of precedence (later wins):
//! 1. the pod's `status.reason` if any (`OutOfmemory`, `Evicted`), else its phase;
//! 2. the first init container not done: `Init:<reason>` of its termination or waiting reason,
//!    `Init:ExitCode:<n>`, or `Init:<i>/<n>` while it runs or waits to initialize;
//! 3. once initialized, the first app container (in status order) with a waiting or terminated
//!    reason (`CrashLoopBackOff`, `ContainerCreating`, `Completed`, `Error`, `OOMKilled`…);
//!    `Completed` reads `Running` (or `NotReady`) while another container still runs ready;
//! 4. `Terminating` once the pod is deleted and not terminal.
//!
//! READY counts ready app containers and started sidecars over app containers plus sidecars;
//! RESTARTS sums restart counts (the init containers' only while initializing).

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodStatus};

use super::phase::Phase;
use crate::qos::is_restartable_init_container;

/// One row of `ironlet pods` (kubectl's columns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodColumns {
    /// `ready/total`, e.g. `1/2`.
    pub ready: String,
    /// kubectl's STATUS column.
    pub status: String,
    pub restarts: i32,
    /// The first pod IP.
    pub ip: Option<String>,
}

/// kubectl's `printPod` over `pod.status`.
pub fn kubectl_columns(pod: &Pod) -> PodColumns {
    let empty = PodStatus::default();
    let status = pod.status.as_ref().unwrap_or(&empty);
    let init_specs: &[Container] = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let app_count = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    let is_sidecar = |name: &str| {
        init_specs
            .iter()
            .any(|c| c.name == name && is_restartable_init_container(c))
    };
    let total = app_count
        + init_specs
            .iter()
            .filter(|c| is_restartable_init_container(c))
            .count();

    let phase = Phase::of(status);
    let mut reason = status
        .reason
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| phase.as_str().to_owned());
    let (mut ready, mut restarts, mut sidecar_restarts) = (0, 0, 0);
    let mut initializing = false;
    let init_statuses = status
        .init_container_statuses
        .as_deref()
        .unwrap_or_default();
    for (i, c) in init_statuses.iter().enumerate() {
        restarts += c.restart_count;
        let sidecar = is_sidecar(&c.name);
        if sidecar {
            sidecar_restarts += c.restart_count;
        }
        let state = c.state.as_ref();
        let terminated = state.and_then(|s| s.terminated.as_ref());
        let waiting = state.and_then(|s| s.waiting.as_ref());
        let waiting_reason = waiting
            .and_then(|w| w.reason.as_deref())
            .filter(|r| !r.is_empty() && *r != super::POD_INITIALIZING);
        if terminated.is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if sidecar && c.started == Some(true) {
            ready += i32::from(c.ready);
            continue;
        }
        reason = match (terminated, waiting_reason) {
            (Some(t), _) => match t.reason.as_deref().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None => match t.signal.filter(|s| *s != 0) {
                    Some(s) => format!("Init:Signal:{s}"),
                    None => format!("Init:ExitCode:{}", t.exit_code),
                },
            },
            (None, Some(r)) => format!("Init:{r}"),
            (None, None) => format!("Init:{i}/{}", init_specs.len()),
        };
        initializing = true;
        break;
    }

    if !initializing || condition_is_true(status, "Initialized") {
        restarts = sidecar_restarts;
        let mut has_running = false;
        let statuses = status.container_statuses.as_deref().unwrap_or_default();
        for c in statuses.iter().rev() {
            restarts += c.restart_count;
            match container_reason(c) {
                Some(r) => reason = r,
                None if c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()) => {
                    has_running = true;
                    ready += 1;
                }
                None => {}
            }
        }
        if reason == "Completed" && has_running {
            reason = if condition_is_true(status, "Ready") {
                "Running"
            } else {
                "NotReady"
            }
            .to_owned();
        }
    }

    if pod.metadata.deletion_timestamp.is_some() {
        if status.reason.as_deref() == Some("NodeLost") {
            reason = "Unknown".to_owned();
        } else if !phase.is_terminal() {
            reason = "Terminating".to_owned();
        }
    }

    let ip = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.clone())
        .next()
        .or_else(|| status.pod_ip.clone())
        .filter(|ip| !ip.is_empty());
    PodColumns {
        ready: format!("{ready}/{total}"),
        status: reason,
        restarts,
        ip,
    }
}

/// The reason an app container shows, if it is waiting or terminated.
fn container_reason(c: &ContainerStatus) -> Option<String> {
    let state = c.state.as_ref()?;
    if let Some(r) = state
        .waiting
        .as_ref()
        .and_then(|w| w.reason.as_deref())
        .filter(|r| !r.is_empty())
    {
        return Some(r.to_owned());
    }
    let t = state.terminated.as_ref()?;
    Some(match t.reason.as_deref().filter(|r| !r.is_empty()) {
        Some(r) => r.to_owned(),
        None => match t.signal.filter(|s| *s != 0) {
            Some(s) => format!("Signal:{s}"),
            None => format!("ExitCode:{}", t.exit_code),
        },
    })
}

fn condition_is_true(status: &PodStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

#[cfg(test)]
mod tests {
    use ironlet_runtime::types::ExitReason;

    use super::*;
    use crate::status::testing::*;
    use crate::status::PodLifecycle;

    const ONE: &str = "containers: [{name: a, image: i}]";
    const NEVER: &str = "restartPolicy: Never\ncontainers: [{name: a, image: i}]";
    const INIT: &str = "initContainers: [{name: i, image: i}]\ncontainers: [{name: a, image: i}]";
    const TWO_INITS: &str =
        "initContainers: [{name: i, image: i}, {name: j, image: i}]\ncontainers: [{name: a, image: i}]";

    fn columns(s: &Scenario) -> PodColumns {
        kubectl_columns(&s.pod_with_status())
    }

    fn status_column(s: &Scenario) -> String {
        columns(s).status
    }

    #[test]
    fn a_running_pod_shows_running_ready_restarts_and_ip() {
        let s = Scenario::new(
            ONE,
            vec![
                exited("a", 1, 50, 1, ExitReason::Error),
                running("a", 2, 100),
            ],
        );
        assert_eq!(
            columns(&s),
            PodColumns {
                ready: "1/1".into(),
                status: "Running".into(),
                restarts: 2,
                ip: Some("10.88.0.5".into()),
            }
        );
    }

    #[test]
    fn a_container_not_created_shows_container_creating() {
        let s = Scenario::new(ONE, vec![]);
        assert_eq!(status_column(&s), "ContainerCreating");
        assert_eq!(columns(&s).ready, "0/1");
    }

    #[test]
    fn finished_containers_show_completed_error_or_oom_killed() {
        let cases = [
            (0, ExitReason::Completed, "Completed"),
            (1, ExitReason::Error, "Error"),
            (137, ExitReason::OOMKilled, "OOMKilled"),
        ];
        for (code, reason, want) in cases {
            let s = Scenario::new(NEVER, vec![exited("a", 0, 100, code, reason)]);
            assert_eq!(status_column(&s), want);
            assert_eq!(columns(&s).ready, "0/1");
        }
    }

    #[test]
    fn a_crash_looping_container_shows_crash_loop_back_off() {
        let s = Scenario::new(ONE, vec![exited("a", 3, 100, 1, ExitReason::Error)]).waiting(
            "a",
            "CrashLoopBackOff",
            "back-off",
        );
        assert_eq!(status_column(&s), "CrashLoopBackOff");
        assert_eq!(columns(&s).restarts, 3);
    }

    #[test]
    fn a_running_init_container_shows_its_index() {
        assert_eq!(
            status_column(&Scenario::new(INIT, vec![running("i", 0, 100)])),
            "Init:0/1"
        );
        let containers = vec![
            exited("i", 0, 100, 0, ExitReason::Completed),
            running("j", 0, 110),
        ];
        assert_eq!(
            status_column(&Scenario::new(TWO_INITS, containers)),
            "Init:1/2"
        );
        assert_eq!(status_column(&Scenario::new(INIT, vec![])), "Init:0/1");
    }

    #[test]
    fn a_failing_init_container_shows_its_reason() {
        let crashing = Scenario::new(INIT, vec![exited("i", 2, 100, 1, ExitReason::Error)])
            .waiting("i", "CrashLoopBackOff", "back-off");
        assert_eq!(status_column(&crashing), "Init:CrashLoopBackOff");
        assert_eq!(
            columns(&crashing).restarts,
            2,
            "init restarts count while initializing"
        );
        let mut failed = Scenario::new(INIT, vec![exited("i", 0, 100, 1, ExitReason::Error)]);
        failed.pod.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        assert_eq!(status_column(&failed), "Init:Error");
    }

    #[test]
    fn app_containers_waiting_for_creation_after_init_show_pod_initializing() {
        let s = Scenario::new(INIT, vec![exited("i", 0, 100, 0, ExitReason::Completed)]);
        assert_eq!(status_column(&s), "PodInitializing");
    }

    #[test]
    fn a_deleted_running_pod_shows_terminating() {
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        s.pod.metadata.deletion_timestamp = Some(crate::status::time::api_time(t(900)));
        assert_eq!(status_column(&s), "Terminating");
    }

    #[test]
    fn a_completed_container_beside_a_running_one_shows_not_ready() {
        let spec =
            "restartPolicy: OnFailure\ncontainers: [{name: a, image: i}, {name: b, image: i}]";
        let s = Scenario::new(
            spec,
            vec![
                exited("a", 0, 100, 0, ExitReason::Completed),
                running("b", 0, 100),
            ],
        );
        assert_eq!(status_column(&s), "NotReady");
        assert_eq!(columns(&s).ready, "1/2");
    }

    #[test]
    fn a_rejected_pod_shows_the_admission_reason() {
        let mut s = Scenario::new(ONE, vec![]);
        s.lifecycle = PodLifecycle::Rejected {
            reason: "OutOfmemory".into(),
            message: "Node didn't have enough resource: memory".into(),
        };
        assert_eq!(
            columns(&s),
            PodColumns {
                ready: "0/1".into(),
                status: "OutOfmemory".into(),
                restarts: 0,
                ip: None,
            }
        );
    }

    #[test]
    fn a_started_sidecar_counts_in_ready_and_total() {
        let spec = "initContainers: [{name: s, image: i, restartPolicy: Always}]\ncontainers: [{name: a, image: i}]";
        let s = Scenario::new(spec, vec![running("s", 1, 100), running("a", 0, 110)]);
        assert_eq!(
            (columns(&s).ready, status_column(&s), columns(&s).restarts),
            ("2/2".to_owned(), "Running".to_owned(), 1)
        );
    }

    #[test]
    fn a_pod_without_status_shows_pending() {
        let c = kubectl_columns(&pod(ONE));
        assert_eq!(
            (c.ready.as_str(), c.status.as_str(), c.restarts, c.ip),
            ("0/1", "Pending", 0, None)
        );
    }
}

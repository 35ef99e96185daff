//! The init phase of a pod in its current sandbox — kubelet's `computeInitContainerActions`,
//! written as a forward walk.
//!
//! ```text
//!  init[0] ──exit 0──► init[1] ──exit 0──► … ──► regular containers start
//!     │ running: wait      │ sidecar (restartPolicy Always): next one starts once it runs
//!     │                    │ and has passed its startup probe; it is kept running after
//!     └ failed: restart it (Always, OnFailure) or fail the pod (Never)
//! ```
//!
//! Guarantees:
//! - At most one init container is started per sync, and only once every earlier one has
//!   succeeded (or, for a sidecar, started).
//! - Only instances in the *current* sandbox count: a recreated sandbox runs every init
//!   container again, without deleting the old sandbox's instances first (kubelet purges
//!   them instead).
//! - The pod is initialized once any regular container has an instance in the current
//!   sandbox; from then on plain init containers are ignored and sidecars are kept running
//!   (restarted when they exit or fail a probe, whatever the pod's restart policy).
//!
//! Current behaviour: the walk needs the newest instance of each finished init container of
//! the sandbox; container GC (`kubelet::container_gc`) never removes the newest dead instance
//! of a container of a pod still wanted, which suffices. kubelet walks backwards to survive a GC that removes them all.

use ironlet_runtime::types::{ContainerState, ContainerStatus, SandboxId};
use k8s_openapi::api::core::v1::Container;

use super::actions::{ContainerKind, KillReason};
use super::plan::{init_failed, Ctx, Plan, RestartPolicy};
use super::restart::should_restart;

/// Where the init phase stands after this sync's decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum InitOutcome {
    /// Every init container has done its part: regular containers may run.
    Done,
    /// An init container runs or is being (re)started: regular containers wait.
    Pending,
    /// Init container `name` failed under restart policy `Never`: the pod fails.
    Failed {
        name: String,
        exit_code: Option<i32>,
    },
}

/// What one init container means for the walk.
enum Step {
    /// It has done its part; look at the next one.
    Next,
    /// It runs or is being started; stop here.
    Wait,
    /// It failed for good.
    Fail { exit_code: Option<i32> },
}

/// Decides the init containers' actions into `plan`.
pub(super) fn init_phase(ctx: &Ctx<'_>, sandbox: &SandboxId, plan: &mut Plan) -> InitOutcome {
    let initialized = ctx
        .regular
        .iter()
        .any(|c| ctx.view.newest_in(&c.name, sandbox).is_some());
    if initialized {
        for (index, container) in ctx.init.iter().enumerate() {
            if ContainerKind::of_init(container) == ContainerKind::Sidecar && !ctx.deleting {
                sidecar_step(
                    ctx,
                    plan,
                    index,
                    container,
                    ctx.view.newest_in(&container.name, sandbox),
                );
            }
        }
        return InitOutcome::Done;
    }
    for (index, container) in ctx.init.iter().enumerate() {
        let newest = ctx.view.newest_in(&container.name, sandbox);
        let step = match ContainerKind::of_init(container) {
            ContainerKind::Sidecar => sidecar_step(ctx, plan, index, container, newest),
            ContainerKind::Init | ContainerKind::Regular | ContainerKind::Ephemeral => {
                init_step(ctx, plan, index, container, newest)
            }
        };
        match step {
            Step::Next => {}
            Step::Wait => return InitOutcome::Pending,
            Step::Fail { exit_code } => {
                return InitOutcome::Failed {
                    name: container.name.clone(),
                    exit_code,
                }
            }
        }
    }
    InitOutcome::Done
}

/// A plain init container: it must run to a zero exit.
fn init_step(
    ctx: &Ctx<'_>,
    plan: &mut Plan,
    index: usize,
    container: &Container,
    newest: Option<&ContainerStatus>,
) -> Step {
    let Some(status) = newest else {
        ctx.start(plan, ContainerKind::Init, index, container);
        return Step::Wait;
    };
    if init_failed(status) {
        // The container's own restart policy and rules when it has them (kubelet's
        // ContainerShouldRestart), else the pod's: only `Never` gives up.
        let gives_up = match container.restart_policy {
            Some(_) => !should_restart(container, ctx.pod.spec.as_ref(), status.exit_code),
            None => ctx.policy == RestartPolicy::Never,
        };
        if gives_up {
            return Step::Fail {
                exit_code: status.exit_code,
            };
        }
        if status.state == ContainerState::Unknown {
            plan.kill(
                status,
                Some(ContainerKind::Init),
                KillReason::UnknownState,
                true,
            );
        }
        ctx.start(plan, ContainerKind::Init, index, container);
        return Step::Wait;
    }
    match status.state {
        ContainerState::Exited => Step::Next,
        ContainerState::Running => {
            plan.keep(status);
            Step::Wait
        }
        // Created but never started: the start failed half-way; create another.
        ContainerState::Created | ContainerState::Unknown => {
            ctx.start(plan, ContainerKind::Init, index, container);
            Step::Wait
        }
    }
}

/// A sidecar: it must be running (and started, if it has a startup probe).
fn sidecar_step(
    ctx: &Ctx<'_>,
    plan: &mut Plan,
    index: usize,
    container: &Container,
    newest: Option<&ContainerStatus>,
) -> Step {
    let kind = ContainerKind::Sidecar;
    match newest {
        Some(status) if status.state == ContainerState::Running => {
            if let Some(reason) = ctx.running_kill_reason(container, status) {
                plan.kill(status, Some(kind), reason, true);
                ctx.start(plan, kind, index, container);
                return Step::Wait;
            }
            plan.keep(status);
            if ctx.has_started(container, status) {
                Step::Next
            } else {
                Step::Wait
            }
        }
        Some(status) if status.state == ContainerState::Unknown => {
            plan.kill(status, Some(kind), KillReason::UnknownState, true);
            ctx.start(plan, kind, index, container);
            Step::Wait
        }
        None | Some(_) => {
            ctx.start(plan, kind, index, container);
            Step::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use ironlet_runtime::types::ContainerState;
    use ironlet_runtime::types::SandboxState::{NotReady, Ready};
    use k8s_openapi::api::core::v1::Probe;

    use super::super::actions::{
        ContainerKind, KillReason, PodActions, PodDone, ProbeVerdict, ProbeVerdicts, SandboxChange,
    };
    use super::super::fixtures::{
        compute, compute_with, exited, id, pod, running, spec_mut, status, with_policy,
        with_sidecar,
    };

    /// (name, restart count) of each start.
    fn starts(actions: &PodActions) -> Vec<(&str, u32)> {
        actions
            .starts()
            .iter()
            .map(|s| (s.name.as_str(), s.restart_count))
            .collect()
    }

    #[test]
    fn new_pod_gets_a_sandbox_and_its_first_init_container() {
        let pod = pod(&["init-a", "init-b"], &["web"]);
        let actions = compute(&pod, &status(&pod).build());
        let PodActions::CreateSandbox {
            attempt,
            cause,
            start,
        } = &actions
        else {
            panic!("expected a new sandbox, got {actions:?}");
        };
        assert_eq!((*attempt, *cause), (0, SandboxChange::NoSandbox));
        assert_eq!(start.len(), 1);
        assert_eq!(start[0].name, "init-a");
        assert_eq!(start[0].kind, ContainerKind::Init);
        assert_eq!((start[0].index, start[0].restart_count), (0, 0));
    }

    #[test]
    fn regular_containers_wait_for_init_containers() {
        let pod = pod(&["init-a", "init-b"], &["web", "db"]);
        let running_a = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("init-a"))
            .build();
        assert_eq!(starts(&compute(&pod, &running_a)), vec![]);

        let a_done = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("init-a", 0))
            .build();
        assert_eq!(starts(&compute(&pod, &a_done)), vec![("init-b", 0)]);

        let all_done = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("init-a", 0))
            .container(exited("init-b", 0))
            .build();
        assert_eq!(
            starts(&compute(&pod, &all_done)),
            vec![("web", 0), ("db", 0)]
        );
    }

    #[test]
    fn failed_init_container_is_restarted_under_always_and_on_failure() {
        for policy in ["Always", "OnFailure"] {
            let pod = with_policy(pod(&["init-a"], &["web"]), policy);
            let failed = status(&pod)
                .sandbox("s1", 0, Ready)
                .container(exited("init-a", 1).attempt(2))
                .build();
            assert_eq!(
                starts(&compute(&pod, &failed)),
                vec![("init-a", 3)],
                "{policy}"
            );
        }
    }

    #[test]
    fn failed_init_container_with_restart_never_fails_the_pod() {
        let pod = with_policy(pod(&["init-a", "init-b"], &["web"]), "Never");
        let failed = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("init-a", 0))
            .container(exited("init-b", 3))
            .build();
        assert_eq!(
            compute(&pod, &failed),
            PodActions::KillPod {
                cause: PodDone::InitContainerFailed {
                    name: "init-b".into(),
                    exit_code: Some(3)
                }
            }
        );
    }

    #[test]
    fn an_init_container_whose_own_policy_is_never_fails_the_pod_under_always() {
        let mut pod = pod(&["init-a"], &["web"]);
        spec_mut(&mut pod, "init-a").restart_policy = Some("Never".into());
        let failed = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("init-a", 3))
            .build();
        assert!(matches!(
            compute(&pod, &failed),
            PodActions::KillPod {
                cause: PodDone::InitContainerFailed { .. }
            }
        ));
        // A rule matching the exit code restarts it after all.
        spec_mut(&mut pod, "init-a").restart_policy_rules =
            Some(vec![k8s_openapi::api::core::v1::ContainerRestartRule {
                action: "Restart".into(),
                exit_codes: Some(
                    k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes {
                        operator: "In".into(),
                        values: Some(vec![3]),
                    },
                ),
            }]);
        let failed = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("init-a", 3))
            .build();
        assert_eq!(compute(&pod, &failed).starts()[0].name, "init-a");
    }

    #[test]
    fn an_oom_killed_init_container_failed_even_with_exit_code_zero() {
        let pod = with_policy(pod(&["init-a"], &["web"]), "Never");
        let oom = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("init-a", 0).oom_killed())
            .build();
        assert!(matches!(
            compute(&pod, &oom),
            PodActions::KillPod {
                cause: PodDone::InitContainerFailed { .. }
            }
        ));
    }

    #[test]
    fn an_init_container_in_unknown_state_is_killed_before_it_is_restarted() {
        let pod = pod(&["init-a"], &["web"]);
        let unknown = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("init-a").id("lost").state(ContainerState::Unknown))
            .build();
        let PodActions::Sync { kill, start, .. } = compute(&pod, &unknown) else {
            panic!("expected a sync");
        };
        assert_eq!(kill.len(), 1);
        assert_eq!(
            (kill[0].id.as_str(), kill[0].reason),
            ("lost", KillReason::UnknownState)
        );
        assert_eq!(start.len(), 1);
        assert_eq!(
            (start[0].name.as_str(), start[0].restart_count),
            ("init-a", 1)
        );
    }

    #[test]
    fn a_recreated_sandbox_runs_the_init_containers_again() {
        let pod = pod(&["init-a", "init-b"], &["web"]);
        // Everything ran in s1; s1 died; s2 was created and init-a runs in it.
        let old = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("init-a", 0))
            .container(exited("init-b", 0))
            .container(exited("web", 137).id("old-web"));
        let died = old.build();
        let mut died_not_ready = died.clone();
        died_not_ready.sandboxes[0].state = NotReady;
        let PodActions::CreateSandbox { attempt, start, .. } = compute(&pod, &died_not_ready)
        else {
            panic!("expected a new sandbox");
        };
        assert_eq!(attempt, 1);
        assert_eq!(start.len(), 1);
        assert_eq!(
            (start[0].name.as_str(), start[0].restart_count),
            ("init-a", 1)
        );

        let mut in_s2 = status(&pod)
            .sandbox("s1", 0, NotReady)
            .container(exited("init-a", 0))
            .container(exited("init-b", 0))
            .container(exited("web", 137))
            .sandbox("s2", 1, Ready)
            .container(exited("init-a", 0).attempt(1))
            .build();
        assert_eq!(starts(&compute(&pod, &in_s2)), vec![("init-b", 1)]);
        in_s2.containers.pop();
        assert_eq!(starts(&compute(&pod, &in_s2)), vec![("init-a", 1)]);
    }

    #[test]
    fn a_sidecar_must_be_started_before_the_next_init_container() {
        let mut pod = with_sidecar(pod(&["proxy", "init-b"], &["web"]), "proxy");
        let proxy_running = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("proxy").id("proxy-1"))
            .build();
        assert_eq!(starts(&compute(&pod, &proxy_running)), vec![("init-b", 0)]);

        spec_mut(&mut pod, "proxy").startup_probe = Some(Probe::default());
        let proxy_running = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("proxy").id("proxy-1"))
            .build();
        assert_eq!(starts(&compute(&pod, &proxy_running)), vec![]);
        let mut probes = ProbeVerdicts::default();
        probes.startup.insert(id("proxy-1"), ProbeVerdict::Success);
        assert_eq!(
            starts(&compute_with(&pod, &proxy_running, &probes)),
            vec![("init-b", 0)]
        );
    }

    #[test]
    fn an_exited_sidecar_restarts_even_under_never_and_the_pod_keeps_running() {
        let pod = with_policy(with_sidecar(pod(&["proxy"], &["web"]), "proxy"), "Never");
        let proxy_exited = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("proxy", 1))
            .container(running("web"))
            .build();
        let actions = compute(&pod, &proxy_exited);
        assert_eq!(starts(&actions), vec![("proxy", 1)]);
        assert_eq!(actions.starts()[0].kind, ContainerKind::Sidecar);
    }

    #[test]
    fn sidecars_do_not_keep_a_completed_pod_alive() {
        let pod = with_policy(with_sidecar(pod(&["proxy"], &["job"]), "proxy"), "Never");
        let job_done = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("proxy"))
            .container(exited("job", 0))
            .build();
        assert_eq!(
            compute(&pod, &job_done),
            PodActions::KillPod {
                cause: PodDone::Completed
            }
        );
    }

    #[test]
    fn a_sidecar_failing_liveness_is_restarted_after_initialization() {
        let pod = with_sidecar(pod(&["proxy"], &["web"]), "proxy");
        let running_pod = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("proxy").id("proxy-1"))
            .container(running("web"))
            .build();
        let mut probes = ProbeVerdicts::default();
        probes.liveness.insert(id("proxy-1"), ProbeVerdict::Failure);
        let PodActions::Sync { kill, start, .. } = compute_with(&pod, &running_pod, &probes) else {
            panic!("expected a sync");
        };
        assert_eq!(kill.len(), 1);
        assert_eq!(kill[0].reason, KillReason::LivenessProbeFailed);
        assert_eq!(
            kill[0].message(),
            "Init container proxy failed liveness probe"
        );
        assert_eq!(start.len(), 1);
        assert_eq!(
            (start[0].name.as_str(), start[0].restart_count),
            ("proxy", 1)
        );
    }

    #[test]
    fn a_sidecar_whose_definition_changed_is_restarted_with_kubelets_message() {
        let pod = with_sidecar(pod(&["proxy"], &["web"]), "proxy");
        let running_pod = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("proxy").id("proxy-1").hash("0123456789abcdef"))
            .container(running("web"))
            .build();
        let actions = compute(&pod, &running_pod);
        let PodActions::Sync { kill, .. } = &actions else {
            panic!("expected a sync, got {actions:?}");
        };
        assert_eq!(kill.len(), 1);
        assert_eq!(kill[0].message(), "Init container proxy definition changed");
        assert_eq!(starts(&actions), vec![("proxy", 1)]);
    }
}

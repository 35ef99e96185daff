//! [`compute_pod_actions`]: from a desired pod and what the runtime has, what one sync must
//! do — kubelet's `kubeGenericRuntimeManager.computePodActions`, as a pure function.
//!
//! ```text
//!  sandboxes ─► keep the ready one? ──no──► CreateSandbox (or KillPod when it must not be
//!                      │ yes                 recreated: restartPolicy Never after a run, or
//!                      ▼                     every container is done)
//!              ephemeral containers (ephemeral.rs): start the new ones, keep the running ones
//!                      ▼
//!              init phase (init.rs) ──pending──► Sync (init and ephemeral actions only)
//!                      │ done        ──failed (Never)──► KillPod
//!                      ▼
//!              regular containers: start missing / restartable ones, kill changed or
//!              unhealthy ones ──► Sync, or KillPod when nothing runs and nothing starts
//! ```
//!
//! Restart rules for a regular container whose newest instance is not running here: never
//! started → start; `Created`/`Unknown` → start (an `Unknown` one is killed first); exited →
//! `Always` restarts, `OnFailure` restarts a non-zero (or lost) exit code, `Never` does not —
//! the container's own `restartPolicy` and `restartPolicyRules` first, when it has them
//! (see `restart.rs`).
//! A pod with a deletion timestamp starts nothing. A running container is killed when its
//! spec hash changed (and restarted whatever the policy), or when its liveness or startup
//! probe failed (restarted unless the container's, else the pod's, policy is `Never`).
//!
//! Guarantees beyond kubelet's: every running or unknown-state instance that is not the one
//! instance the decision keeps — an older duplicate, one in a stale sandbox, one whose name
//! is not in the spec — is killed, so no container ever runs twice.

use ironlet_runtime::types::{ContainerState, SandboxId};

use super::actions::{ActionsInput, ContainerKind, KillReason, PodActions, PodDone, SandboxChange};
use super::ephemeral::ephemeral_step;
use super::init::{init_phase, InitOutcome};
use super::plan::{Ctx, Plan, RestartPolicy};
use super::restart::should_restart;
use super::sandbox::{sandbox_decision, SandboxDecision};

/// Decides what one sync of `input.pod` must do. Pure: same input, same output.
#[must_use]
pub fn compute_pod_actions(input: &ActionsInput<'_>) -> PodActions {
    let ctx = Ctx::new(input);
    match sandbox_decision(ctx.pod, &ctx.view) {
        SandboxDecision::Recreate { cause, attempt } => for_new_sandbox(&ctx, cause, attempt),
        SandboxDecision::Keep(sandbox_id) => in_sandbox(&ctx, sandbox_id),
    }
}

/// The pod needs a new sandbox: what to start in it, or whether to give up on the pod.
fn for_new_sandbox(ctx: &Ctx<'_>, cause: SandboxChange, attempt: u32) -> PodActions {
    if ctx.policy == RestartPolicy::Never && attempt != 0 && !ctx.view.containers().is_empty() {
        return PodActions::KillPod {
            cause: PodDone::SandboxLost,
        };
    }
    let to_start: Vec<_> = ctx
        .regular
        .iter()
        .enumerate()
        .filter(|(_, c)| match ctx.view.newest(&c.name) {
            // kubelet skips a container that is done under its restart policy.
            Some(newest) if newest.state == ContainerState::Exited => {
                should_restart(c, ctx.pod.spec.as_ref(), newest.exit_code)
            }
            _ => true,
        })
        .collect();
    let ever_ran = ctx
        .regular
        .iter()
        .any(|c| ctx.view.newest(&c.name).is_some());
    if to_start.is_empty() && ever_ran {
        return PodActions::KillPod {
            cause: PodDone::Completed,
        };
    }
    let mut plan = Plan::default();
    if let Some(first) = ctx.init.first() {
        ctx.start(&mut plan, ContainerKind::of_init(first), 0, first);
    } else {
        for (index, container) in to_start {
            ctx.start(&mut plan, ContainerKind::Regular, index, container);
        }
    }
    PodActions::CreateSandbox {
        attempt,
        cause,
        start: plan.start,
    }
}

/// The pod keeps sandbox `sandbox_id`: ephemeral containers, init phase, then regular
/// containers.
fn in_sandbox(ctx: &Ctx<'_>, sandbox_id: SandboxId) -> PodActions {
    let mut plan = Plan::default();
    ephemeral_step(ctx, &sandbox_id, &mut plan);
    match init_phase(ctx, &sandbox_id, &mut plan) {
        InitOutcome::Failed { name, exit_code } => {
            return PodActions::KillPod {
                cause: PodDone::InitContainerFailed { name, exit_code },
            }
        }
        InitOutcome::Pending => return sync(ctx, sandbox_id, plan),
        InitOutcome::Done => {}
    }
    let before = plan.start.len();
    let mut keep_count = 0;
    for (index, container) in ctx.regular.iter().enumerate() {
        let newest = ctx.view.newest(&container.name);
        match newest {
            Some(status)
                if status.state == ContainerState::Running && status.sandbox_id == sandbox_id =>
            {
                match ctx.running_kill_reason(container, status) {
                    None => {
                        plan.keep(status);
                        keep_count += 1;
                    }
                    Some(reason) => {
                        let restart = reason == KillReason::DefinitionChanged
                            || ctx.restarts_after_probe_kill(container);
                        plan.kill(status, Some(ContainerKind::Regular), reason, restart);
                        if restart {
                            ctx.start(&mut plan, ContainerKind::Regular, index, container);
                        }
                    }
                }
            }
            _ if ctx.should_start(container, newest) => {
                if let Some(unknown) = newest.filter(|s| s.state == ContainerState::Unknown) {
                    plan.kill(
                        unknown,
                        Some(ContainerKind::Regular),
                        KillReason::UnknownState,
                        true,
                    );
                }
                ctx.start(&mut plan, ContainerKind::Regular, index, container);
            }
            _ => {}
        }
    }
    let regular_starts = plan.start.len() - before;
    if keep_count == 0 && regular_starts == 0 {
        return PodActions::KillPod {
            cause: PodDone::Completed,
        };
    }
    sync(ctx, sandbox_id, plan)
}

/// Finishes `plan` by killing every running or unknown instance nothing decided about, and
/// wraps it up.
fn sync(ctx: &Ctx<'_>, sandbox_id: SandboxId, mut plan: Plan) -> PodActions {
    for status in ctx.view.containers() {
        let live = matches!(
            status.state,
            ContainerState::Running | ContainerState::Unknown
        );
        if !live || plan.decided(&status.id) {
            continue;
        }
        let kind = ctx.kind_of(&status.name);
        let reason = if kind.is_some() {
            KillReason::Superseded
        } else {
            KillReason::NotInSpec
        };
        tracing::debug!(container = %status.name, id = %status.id, %reason, "killing a stray container");
        plan.kill(status, kind, reason, false);
    }
    PodActions::Sync {
        sandbox_id,
        kill: plan.kill,
        start: plan.start,
    }
}

#[cfg(test)]
mod tests {
    use ironlet_runtime::types::ContainerState;
    use ironlet_runtime::types::SandboxState::{NotReady, Ready};
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::super::actions::{
        ContainerKill, KillReason, PodActions, PodDone, ProbeVerdict, ProbeVerdicts, SandboxChange,
    };
    use super::super::fixtures::{
        compute, compute_with, exited, id, pod, running, spec_mut, status, t0, with_policy,
    };
    use super::*;

    fn starts(actions: &PodActions) -> Vec<(&str, u32)> {
        actions
            .starts()
            .iter()
            .map(|s| (s.name.as_str(), s.restart_count))
            .collect()
    }

    fn kills(actions: &PodActions) -> &[ContainerKill] {
        match actions {
            PodActions::Sync { kill, .. } => kill,
            other => panic!("expected a sync, got {other:?}"),
        }
    }

    #[test]
    fn new_pod_without_init_containers_starts_every_container_in_a_new_sandbox() {
        let pod = pod(&[], &["web", "db"]);
        let actions = compute(&pod, &status(&pod).build());
        assert!(matches!(
            actions,
            PodActions::CreateSandbox {
                attempt: 0,
                cause: SandboxChange::NoSandbox,
                ..
            }
        ));
        assert_eq!(starts(&actions), vec![("web", 0), ("db", 0)]);
        assert!(actions
            .starts()
            .iter()
            .all(|s| s.kind == ContainerKind::Regular));
        assert_eq!(actions.starts()[1].index, 1);
        assert_eq!(
            actions.starts()[1]
                .spec(&pod)
                .map(|c| c.name.clone())
                .as_deref(),
            Some("db")
        );
    }

    #[test]
    fn a_healthy_running_pod_needs_nothing() {
        let pod = pod(&["init-a"], &["web", "db"]);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("init-a", 0))
            .container(running("web"))
            .container(running("db"))
            .build();
        assert!(compute(&pod, &status).is_noop());
    }

    #[test]
    fn exited_container_restarts_under_always_but_not_never() {
        let always = pod(&[], &["web", "db"]);
        let web_exited = |pod| {
            status(pod)
                .sandbox("s1", 0, Ready)
                .container(exited("web", 0))
                .container(running("db"))
                .build()
        };
        assert_eq!(
            starts(&compute(&always, &web_exited(&always))),
            vec![("web", 1)]
        );

        let never = with_policy(pod(&[], &["web", "db"]), "Never");
        assert!(compute(&never, &web_exited(&never)).is_noop());
    }

    #[test]
    fn on_failure_restarts_only_non_zero_exits() {
        let pod = with_policy(pod(&[], &["ok", "bad", "killed", "db"]), "OnFailure");
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("ok", 0))
            .container(exited("bad", 2).attempt(4))
            .container(exited("killed", 137))
            .container(running("db"))
            .build();
        assert_eq!(
            starts(&compute(&pod, &status)),
            vec![("bad", 5), ("killed", 1)]
        );
    }

    #[test]
    fn a_pod_whose_containers_all_finished_is_killed_as_completed() {
        let pod = with_policy(pod(&[], &["web", "db"]), "OnFailure");
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("web", 0))
            .container(exited("db", 0))
            .build();
        assert_eq!(
            compute(&pod, &status),
            PodActions::KillPod {
                cause: PodDone::Completed
            }
        );
    }

    #[test]
    fn changed_spec_hash_kills_and_restarts_the_container() {
        let mut pod = with_policy(pod(&[], &["web", "db"]), "Never");
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("web").id("web-1").attempt(2))
            .container(running("db"))
            .build();
        spec_mut(&mut pod, "web").image = Some("busybox:1.37".into());
        let actions = compute(&pod, &status);
        let kill = kills(&actions);
        assert_eq!(kill.len(), 1);
        assert_eq!(kill[0].id, id("web-1"));
        assert_eq!(kill[0].reason, KillReason::DefinitionChanged);
        assert!(kill[0].restart, "a changed spec restarts even under Never");
        assert_eq!(
            kill[0].message(),
            "Container web definition changed, will be restarted"
        );
        assert_eq!(starts(&actions), vec![("web", 3)]);
    }

    #[test]
    fn a_container_without_a_recorded_hash_counts_as_changed() {
        let pod = pod(&[], &["web"]);
        let mut status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("web"))
            .build();
        status.containers[0].annotations.clear();
        assert_eq!(
            kills(&compute(&pod, &status))[0].reason,
            KillReason::DefinitionChanged
        );
    }

    #[test]
    fn liveness_failure_kills_the_container() {
        let pod = pod(&[], &["web", "db"]);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("web").id("web-1"))
            .container(running("db").id("db-1"))
            .build();
        let mut probes = ProbeVerdicts::default();
        probes.liveness.insert(id("web-1"), ProbeVerdict::Failure);
        probes.liveness.insert(id("db-1"), ProbeVerdict::Success);
        let actions = compute_with(&pod, &status, &probes);
        let kill = kills(&actions);
        assert_eq!(kill.len(), 1);
        assert_eq!(
            (kill[0].id.clone(), kill[0].reason),
            (id("web-1"), KillReason::LivenessProbeFailed)
        );
        assert_eq!(
            kill[0].message(),
            "Container web failed liveness probe, will be restarted"
        );
        assert_eq!(starts(&actions), vec![("web", 1)]);
    }

    #[test]
    fn liveness_failure_under_never_kills_without_restart() {
        let pod = with_policy(pod(&[], &["web", "db"]), "Never");
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("web").id("web-1"))
            .container(running("db"))
            .build();
        let mut probes = ProbeVerdicts::default();
        probes.liveness.insert(id("web-1"), ProbeVerdict::Failure);
        let actions = compute_with(&pod, &status, &probes);
        assert_eq!(kills(&actions).len(), 1);
        assert!(!kills(&actions)[0].restart);
        assert_eq!(
            kills(&actions)[0].message(),
            "Container web failed liveness probe"
        );
        assert_eq!(starts(&actions), vec![]);
    }

    #[test]
    fn startup_failure_kills_and_restarts_the_container() {
        let pod = pod(&[], &["web"]);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("web").id("web-1"))
            .build();
        let mut probes = ProbeVerdicts::default();
        probes.startup.insert(id("web-1"), ProbeVerdict::Failure);
        let actions = compute_with(&pod, &status, &probes);
        assert_eq!(kills(&actions)[0].reason, KillReason::StartupProbeFailed);
        assert_eq!(
            kills(&actions)[0].message(),
            "Container web failed startup probe, will be restarted"
        );
        assert_eq!(starts(&actions), vec![("web", 1)]);
    }

    #[test]
    fn restart_count_is_previous_attempt_plus_one() {
        let pod = pod(&[], &["web", "db"]);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("web", 1).attempt(6))
            .container(exited("web", 1).attempt(7))
            .container(exited("db", 1).attempt(3))
            .build();
        assert_eq!(starts(&compute(&pod, &status)), vec![("web", 8), ("db", 4)]);
    }

    #[test]
    fn back_off_counts_from_the_newest_exit() {
        let pod = pod(&[], &["web"]);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("web", 1))
            .container(exited("web", 1).attempt(1))
            .build();
        let actions = compute(&pod, &status);
        assert_eq!(
            actions.starts()[0].last_exit,
            status.containers[1].finished_at
        );
        assert!(actions.starts()[0].last_exit > Some(t0()));
    }

    #[test]
    fn containers_not_in_the_spec_are_killed() {
        let pod = pod(&[], &["web"]);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("web"))
            .container(running("old-sidecar").id("stray"))
            .build();
        let actions = compute(&pod, &status);
        let kill = kills(&actions);
        assert_eq!(kill.len(), 1);
        assert_eq!(
            (kill[0].id.clone(), kill[0].kind, kill[0].reason),
            (id("stray"), None, KillReason::NotInSpec)
        );
        assert_eq!(
            kill[0].message(),
            "Container old-sidecar is not in the pod spec"
        );
    }

    #[test]
    fn an_older_running_duplicate_is_killed_and_the_newest_kept() {
        let pod = pod(&[], &["web"]);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("web").id("web-old"))
            .container(running("web").id("web-new").attempt(1))
            .build();
        let actions = compute(&pod, &status);
        let kill = kills(&actions);
        assert_eq!(kill.len(), 1);
        assert_eq!(
            (kill[0].id.clone(), kill[0].reason),
            (id("web-old"), KillReason::Superseded)
        );
        assert_eq!(starts(&actions), vec![]);
    }

    #[test]
    fn an_unknown_state_container_is_killed_and_restarted_even_under_never() {
        let pod = with_policy(pod(&[], &["web"]), "Never");
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("web").id("web-1").state(ContainerState::Unknown))
            .build();
        let actions = compute(&pod, &status);
        assert_eq!(kills(&actions)[0].reason, KillReason::UnknownState);
        assert_eq!(starts(&actions), vec![("web", 1)]);
    }

    fn with_container_policy(
        mut pod: Pod,
        name: &str,
        policy: &str,
        rule: Option<(&str, i32)>,
    ) -> Pod {
        use k8s_openapi::api::core::v1::{ContainerRestartRule, ContainerRestartRuleOnExitCodes};
        let c = spec_mut(&mut pod, name);
        c.restart_policy = Some(policy.into());
        c.restart_policy_rules = rule.map(|(operator, code)| {
            vec![ContainerRestartRule {
                action: "Restart".into(),
                exit_codes: Some(ContainerRestartRuleOnExitCodes {
                    operator: operator.into(),
                    values: Some(vec![code]),
                }),
            }]
        });
        pod
    }

    #[test]
    fn a_container_whose_own_policy_is_never_is_not_restarted_under_pod_policy_always() {
        let pod = with_container_policy(pod(&[], &["once", "web"]), "once", "Never", None);
        let once_failed = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("once", 1).id("once-1"))
            .container(running("web").id("web-1"))
            .build();
        assert!(compute(&pod, &once_failed).is_noop());
        let done = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("once", 0).id("once-1"))
            .container(exited("web", 0).id("web-1"))
            .build();
        assert_eq!(starts(&compute(&pod, &done)), vec![("web", 1)]);
    }

    #[test]
    fn restart_rules_restart_on_listed_exit_codes_only() {
        let pod = with_container_policy(pod(&[], &["web"]), "web", "Never", Some(("In", 42)));
        let listed = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("web", 42))
            .build();
        assert_eq!(starts(&compute(&pod, &listed)), vec![("web", 1)]);
        let other = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("web", 1))
            .build();
        assert_eq!(
            compute(&pod, &other),
            PodActions::KillPod {
                cause: PodDone::Completed
            }
        );
        let pod = with_container_policy(
            with_policy(pod.clone(), "Always"),
            "web",
            "Never",
            Some(("NotIn", 0)),
        );
        let failed = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("web", 3))
            .build();
        assert_eq!(starts(&compute(&pod, &failed)), vec![("web", 1)]);
    }

    #[test]
    fn a_container_policy_always_restarts_under_pod_policy_never() {
        let pod = with_container_policy(
            with_policy(pod(&[], &["web"]), "Never"),
            "web",
            "Always",
            None,
        );
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("web", 0))
            .build();
        assert_eq!(starts(&compute(&pod, &status)), vec![("web", 1)]);
    }

    #[test]
    fn a_liveness_failure_does_not_restart_a_container_whose_own_policy_is_never() {
        let pod = with_container_policy(pod(&[], &["web", "db"]), "web", "Never", None);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(running("web").id("web-1"))
            .container(running("db").id("db-1"))
            .build();
        let mut probes = ProbeVerdicts::default();
        probes.liveness.insert(id("web-1"), ProbeVerdict::Failure);
        let actions = compute_with(&pod, &status, &probes);
        let kill = kills(&actions);
        assert_eq!(kill.len(), 1);
        assert!(!kill[0].restart);
        assert_eq!(kill[0].message(), "Container web failed liveness probe");
        assert_eq!(starts(&actions), vec![]);
    }

    #[test]
    fn a_new_sandbox_skips_a_container_done_under_its_own_policy() {
        let pod = with_container_policy(pod(&[], &["once", "web"]), "once", "OnFailure", None);
        let status = status(&pod)
            .sandbox("s1", 2, NotReady)
            .container(exited("once", 0))
            .container(exited("web", 137))
            .build();
        assert_eq!(starts(&compute(&pod, &status)), vec![("web", 1)]);
    }

    #[test]
    fn a_deleted_pod_starts_nothing() {
        let mut pod = pod(&[], &["web", "db"]);
        pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .container(exited("web", 1))
            .container(running("db"))
            .build();
        assert!(compute(&pod, &status).is_noop());
    }

    #[test]
    fn a_dead_sandbox_is_recreated_and_succeeded_containers_skipped_under_on_failure() {
        let pod = with_policy(pod(&[], &["ok", "web"]), "OnFailure");
        let status = status(&pod)
            .sandbox("s1", 2, NotReady)
            .container(exited("ok", 0))
            .container(exited("web", 137).attempt(1))
            .build();
        let actions = compute(&pod, &status);
        assert!(matches!(
            actions,
            PodActions::CreateSandbox {
                attempt: 3,
                cause: SandboxChange::NotReady,
                ..
            }
        ));
        assert_eq!(starts(&actions), vec![("web", 2)]);
    }

    #[test]
    fn a_dead_sandbox_is_not_recreated_under_never_once_containers_ran() {
        let pod = with_policy(pod(&[], &["web"]), "Never");
        let status = status(&pod)
            .sandbox("s1", 0, NotReady)
            .container(exited("web", 137))
            .build();
        assert_eq!(
            compute(&pod, &status),
            PodActions::KillPod {
                cause: PodDone::SandboxLost
            }
        );
    }

    #[test]
    fn a_dead_sandbox_of_a_finished_pod_is_not_recreated() {
        let pod = with_policy(pod(&[], &["web"]), "OnFailure");
        let status = status(&pod)
            .sandbox("s1", 0, NotReady)
            .container(exited("web", 0))
            .build();
        assert_eq!(
            compute(&pod, &status),
            PodActions::KillPod {
                cause: PodDone::Completed
            }
        );
    }

    #[test]
    fn a_container_still_running_in_a_stale_sandbox_is_killed_and_started_in_the_current_one() {
        let pod = pod(&[], &["web"]);
        let status = status(&pod)
            .sandbox("s1", 0, NotReady)
            .sandbox("s2", 1, Ready)
            .container(running("web").id("web-s1").in_sandbox("s1"))
            .build();
        let actions = compute(&pod, &status);
        let kill = kills(&actions);
        assert_eq!(kill.len(), 1);
        assert_eq!(
            (kill[0].id.clone(), kill[0].reason),
            (id("web-s1"), KillReason::Superseded)
        );
        assert_eq!(starts(&actions), vec![("web", 1)]);
    }
}

//! Ephemeral containers (`kubectl debug`, the `pods/ephemeralcontainers` subresource) in the
//! sync decision — kubelet's `computePodActions` loop over `spec.ephemeralContainers`.
//!
//! ```text
//!  spec.ephemeralContainers[i] ──no instance ever──► start (even while init containers run)
//!                              ──running here──────► keep (never killed as a stray)
//!                              ──exited────────────► nothing: never restarted
//! ```
//!
//! Nothing is started in a pod being deleted, nor in a new sandbox (kubelet starts only the
//! first init or the regular containers there). Ephemeral containers have no probes, ports
//! or lifecycle hooks (the API server refuses them), and they do not keep a completed pod
//! alive.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};

use super::actions::ContainerKind;
use super::plan::{Ctx, Plan};
use ironlet_runtime::types::{ContainerState, SandboxId};

/// The ephemeral container as a [`Container`] (kubelet converts `EphemeralContainerCommon`
/// the same way: the fields are identical).
#[must_use]
pub fn as_container(ec: &EphemeralContainer) -> Container {
    Container {
        name: ec.name.clone(),
        image: ec.image.clone(),
        command: ec.command.clone(),
        args: ec.args.clone(),
        working_dir: ec.working_dir.clone(),
        ports: ec.ports.clone(),
        env_from: ec.env_from.clone(),
        env: ec.env.clone(),
        resources: ec.resources.clone(),
        resize_policy: ec.resize_policy.clone(),
        restart_policy: ec.restart_policy.clone(),
        restart_policy_rules: ec.restart_policy_rules.clone(),
        volume_mounts: ec.volume_mounts.clone(),
        volume_devices: ec.volume_devices.clone(),
        liveness_probe: ec.liveness_probe.clone(),
        readiness_probe: ec.readiness_probe.clone(),
        startup_probe: ec.startup_probe.clone(),
        lifecycle: ec.lifecycle.clone(),
        termination_message_path: ec.termination_message_path.clone(),
        termination_message_policy: ec.termination_message_policy.clone(),
        image_pull_policy: ec.image_pull_policy.clone(),
        security_context: ec.security_context.clone(),
        stdin: ec.stdin,
        stdin_once: ec.stdin_once,
        tty: ec.tty,
    }
}

/// The pod's ephemeral containers as [`Container`]s, in spec order.
#[must_use]
pub fn ephemeral_containers(pod: &Pod) -> Vec<Container> {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .map(as_container)
        .collect()
}

/// The `targetContainerName` of ephemeral container `name`, if it has one.
#[must_use]
pub fn target_of<'p>(pod: &'p Pod, name: &str) -> Option<&'p str> {
    pod.spec
        .as_ref()?
        .ephemeral_containers
        .as_deref()?
        .iter()
        .find(|ec| ec.name == name)?
        .target_container_name
        .as_deref()
}

/// Starts the ephemeral containers that never ran and keeps the running ones.
pub(super) fn ephemeral_step(ctx: &Ctx<'_>, sandbox_id: &SandboxId, plan: &mut Plan) {
    for (index, container) in ctx.ephemeral.iter().enumerate() {
        match ctx.view.newest(&container.name) {
            None if !ctx.deleting => {
                ctx.start(plan, ContainerKind::Ephemeral, index, container);
            }
            Some(status)
                if status.state == ContainerState::Running && &status.sandbox_id == sandbox_id =>
            {
                plan.keep(status);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use ironlet_runtime::types::SandboxState::Ready;
    use k8s_openapi::api::core::v1::EphemeralContainer;

    use super::super::actions::{ContainerKind, PodActions};
    use super::super::fixtures::{
        compute, exited, pod, running, status, with_policy, with_sidecar,
    };
    use super::*;

    fn with_ephemeral(mut p: Pod, name: &str) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            spec.ephemeral_containers
                .get_or_insert_with(Vec::new)
                .push(EphemeralContainer {
                    name: name.into(),
                    image: Some("busybox".into()),
                    target_container_name: Some("web".into()),
                    ..EphemeralContainer::default()
                });
        }
        p
    }

    fn sync_parts(actions: &PodActions) -> (Vec<&str>, Vec<&str>) {
        match actions {
            PodActions::Sync { kill, start, .. } => (
                kill.iter().map(|k| k.name.as_str()).collect(),
                start.iter().map(|s| s.name.as_str()).collect(),
            ),
            other => panic!("expected a sync, got {other:?}"),
        }
    }

    #[test]
    fn a_new_ephemeral_container_starts_in_a_running_pod_with_its_kind() {
        let p = with_ephemeral(pod(&[], &["web"]), "debugger");
        let actions = compute(
            &p,
            &status(&p)
                .sandbox("s1", 0, Ready)
                .container(running("web"))
                .build(),
        );
        let (kills, starts) = sync_parts(&actions);
        assert!(kills.is_empty());
        assert_eq!(starts, ["debugger"]);
        assert_eq!(actions.starts()[0].kind, ContainerKind::Ephemeral);
        assert_eq!(
            actions.starts()[0]
                .spec(&p)
                .map(|c| c.name.clone())
                .as_deref(),
            Some("debugger")
        );
        assert_eq!(target_of(&p, "debugger"), Some("web"));
    }

    #[test]
    fn a_running_ephemeral_container_is_kept_and_an_exited_one_never_restarted() {
        let p = with_ephemeral(with_ephemeral(pod(&[], &["web"]), "a"), "b");
        let runtime = status(&p)
            .sandbox("s1", 0, Ready)
            .container(running("web"))
            .container(running("a"))
            .container(exited("b", 1))
            .build();
        let actions = compute(&p, &runtime);
        assert!(actions.is_noop(), "{actions:?}");
    }

    #[test]
    fn an_ephemeral_container_starts_while_init_containers_run() {
        let p = with_ephemeral(pod(&["setup"], &["web"]), "debugger");
        let actions = compute(
            &p,
            &status(&p)
                .sandbox("s1", 0, Ready)
                .container(running("setup"))
                .build(),
        );
        let (_, starts) = sync_parts(&actions);
        assert_eq!(starts, ["debugger"]);
    }

    #[test]
    fn an_ephemeral_container_does_not_keep_a_completed_pod_alive() {
        let p = with_ephemeral(with_policy(pod(&[], &["job"]), "Never"), "debugger");
        let runtime = status(&p)
            .sandbox("s1", 0, Ready)
            .container(exited("job", 0))
            .container(running("debugger"))
            .build();
        assert!(matches!(compute(&p, &runtime), PodActions::KillPod { .. }));
        let p = with_sidecar(
            with_ephemeral(with_policy(pod(&["proxy"], &["job"]), "Never"), "debugger"),
            "proxy",
        );
        let runtime = status(&p)
            .sandbox("s1", 0, Ready)
            .container(exited("job", 0))
            .container(running("proxy"))
            .build();
        assert!(matches!(compute(&p, &runtime), PodActions::KillPod { .. }));
    }
}

//! Whether a pod can keep its sandbox — kubelet's `PodSandboxChanged`.
//!
//! The newest sandbox is kept when it is the only ready one and its `hostNetwork` matches
//! the pod. Otherwise a new sandbox is needed, numbered one past the newest (0 for a pod
//! that never had one).
//!
//! Current behaviour: kubelet also recreates a ready sandbox that has no IP; ironlet does not,
//! because a sandbox legitimately has none where no network is set up (rootless).

use ironlet_runtime::types::{SandboxId, SandboxState};
use k8s_openapi::api::core::v1::Pod;

use super::actions::SandboxChange;
use super::view::PodView;

/// The outcome of looking at a pod's sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SandboxDecision {
    /// Keep using this (ready) sandbox.
    Keep(SandboxId),
    /// Create sandbox number `attempt`.
    Recreate { cause: SandboxChange, attempt: u32 },
}

pub(super) fn sandbox_decision(pod: &Pod, view: &PodView<'_>) -> SandboxDecision {
    let Some(newest) = view.sandboxes().first() else {
        return SandboxDecision::Recreate {
            cause: SandboxChange::NoSandbox,
            attempt: 0,
        };
    };
    let recreate = |cause| SandboxDecision::Recreate {
        cause,
        attempt: newest.config.attempt.saturating_add(1),
    };
    let ready = view
        .sandboxes()
        .iter()
        .filter(|s| s.state == SandboxState::Ready)
        .count();
    if ready > 1 {
        return recreate(SandboxChange::SeveralReady);
    }
    if newest.state != SandboxState::Ready {
        return recreate(SandboxChange::NotReady);
    }
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if newest.config.host_network != host_network {
        return recreate(SandboxChange::HostNetworkChanged);
    }
    SandboxDecision::Keep(newest.id.clone())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{pod, status};
    use super::*;
    use ironlet_runtime::types::SandboxState::{NotReady, Ready};

    fn decide(pod: &Pod, status: &ironlet_runtime::types::PodStatus) -> SandboxDecision {
        sandbox_decision(pod, &PodView::new(status))
    }

    #[test]
    fn a_pod_without_sandboxes_gets_sandbox_zero() {
        let pod = pod(&[], &["web"]);
        assert_eq!(
            decide(&pod, &status(&pod).build()),
            SandboxDecision::Recreate {
                cause: SandboxChange::NoSandbox,
                attempt: 0
            }
        );
    }

    #[test]
    fn the_newest_ready_sandbox_is_kept() {
        let pod = pod(&[], &["web"]);
        let status = status(&pod)
            .sandbox("old", 0, NotReady)
            .sandbox("new", 1, Ready)
            .build();
        assert_eq!(
            decide(&pod, &status),
            SandboxDecision::Keep(SandboxId::parse("new").expect("id"))
        );
    }

    #[test]
    fn a_not_ready_newest_sandbox_is_replaced_with_the_next_attempt() {
        let pod = pod(&[], &["web"]);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .sandbox("s2", 3, NotReady)
            .build();
        assert_eq!(
            decide(&pod, &status),
            SandboxDecision::Recreate {
                cause: SandboxChange::NotReady,
                attempt: 4
            }
        );
    }

    #[test]
    fn two_ready_sandboxes_are_both_replaced() {
        let pod = pod(&[], &["web"]);
        let status = status(&pod)
            .sandbox("s1", 0, Ready)
            .sandbox("s2", 1, Ready)
            .build();
        assert_eq!(
            decide(&pod, &status),
            SandboxDecision::Recreate {
                cause: SandboxChange::SeveralReady,
                attempt: 2
            }
        );
    }

    #[test]
    fn a_host_network_mismatch_replaces_the_sandbox() {
        let mut pod = pod(&[], &["web"]);
        let status = status(&pod).sandbox("s1", 0, Ready).build();
        if let Some(spec) = pod.spec.as_mut() {
            spec.host_network = Some(true);
        }
        assert_eq!(
            decide(&pod, &status),
            SandboxDecision::Recreate {
                cause: SandboxChange::HostNetworkChanged,
                attempt: 1
            }
        );
    }
}

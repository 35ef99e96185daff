//! Whether a regular container that exited is restarted: the pod's `restartPolicy`, unless
//! the container has its own `restartPolicy` and `restartPolicyRules` (ContainerRestartRules,
//! on by default in Kubernetes 1.37) — kubelet's `podutil.ContainerShouldRestart`.
//!
//! ```text
//!  container.restartPolicy set? ──no──► the pod's policy (Always / OnFailure / Never)
//!         │ yes
//!         ▼
//!  first rule whose onExitCodes matches the exit code (In / NotIn), action Restart ─► restart
//!         │ none
//!         ▼
//!  the container's own policy (Always / OnFailure / Never)
//! ```
//!
//! Rules are only read when the container has its own `restartPolicy` (the API requires it
//! with rules). An exit code the runtime lost matches no `In` and every `NotIn` rule, and is
//! a failure for `OnFailure`.

use k8s_openapi::api::core::v1::{Container, ContainerRestartRule, PodSpec};

/// A restart policy, of the pod or of one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The policy named `name`; anything unknown is `None` (validation rejects it first).
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "Always" => Some(Self::Always),
            "OnFailure" => Some(Self::OnFailure),
            "Never" => Some(Self::Never),
            _ => None,
        }
    }

    /// The pod's `spec.restartPolicy`, `Always` by default.
    #[must_use]
    pub fn of_pod(spec: Option<&PodSpec>) -> Self {
        spec.and_then(|s| s.restart_policy.as_deref())
            .and_then(Self::parse)
            .unwrap_or(Self::Always)
    }

    /// Whether a container that ended with `exit_code` restarts under this policy.
    #[must_use]
    pub fn restarts_after(self, exit_code: Option<i32>) -> bool {
        match self {
            Self::Always => true,
            Self::OnFailure => exit_code != Some(0),
            Self::Never => false,
        }
    }
}

/// The policy that governs `container` when no rule matched: its own, else the pod's.
#[must_use]
pub fn effective_policy(container: &Container, spec: Option<&PodSpec>) -> RestartPolicy {
    container
        .restart_policy
        .as_deref()
        .and_then(RestartPolicy::parse)
        .unwrap_or_else(|| RestartPolicy::of_pod(spec))
}

/// kubelet's `ContainerShouldRestart`: whether regular container `container`, whose newest
/// instance exited with `exit_code`, is started again.
#[must_use]
pub fn should_restart(
    container: &Container,
    spec: Option<&PodSpec>,
    exit_code: Option<i32>,
) -> bool {
    if container.restart_policy.is_some()
        && container
            .restart_policy_rules
            .iter()
            .flatten()
            .find(|rule| rule_matches(rule, exit_code))
            .is_some_and(|rule| rule.action == "Restart")
    {
        return true;
    }
    effective_policy(container, spec).restarts_after(exit_code)
}

/// Whether `rule`'s `onExitCodes` requirement holds for `exit_code` (a rule without one, or
/// with an unknown operator, never matches).
fn rule_matches(rule: &ContainerRestartRule, exit_code: Option<i32>) -> bool {
    let Some(codes) = &rule.exit_codes else {
        return false;
    };
    let listed = exit_code.is_some_and(|code| codes.values.iter().flatten().any(|v| *v == code));
    match codes.operator.as_str() {
        "In" => listed,
        "NotIn" => !listed,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes;

    use super::*;

    fn container(policy: Option<&str>, rules: &[(&str, &[i32])]) -> Container {
        Container {
            name: "c".into(),
            restart_policy: policy.map(str::to_owned),
            restart_policy_rules: (!rules.is_empty()).then(|| {
                rules
                    .iter()
                    .map(|(operator, values)| ContainerRestartRule {
                        action: "Restart".into(),
                        exit_codes: Some(ContainerRestartRuleOnExitCodes {
                            operator: (*operator).into(),
                            values: Some(values.to_vec()),
                        }),
                    })
                    .collect()
            }),
            ..Container::default()
        }
    }

    fn spec(policy: &str) -> PodSpec {
        PodSpec {
            restart_policy: Some(policy.into()),
            ..PodSpec::default()
        }
    }

    #[test]
    fn without_a_container_policy_the_pod_policy_decides() {
        let c = container(None, &[]);
        assert!(should_restart(&c, Some(&spec("Always")), Some(0)));
        assert!(should_restart(&c, Some(&spec("OnFailure")), Some(1)));
        assert!(!should_restart(&c, Some(&spec("OnFailure")), Some(0)));
        assert!(should_restart(&c, Some(&spec("OnFailure")), None));
        assert!(!should_restart(&c, Some(&spec("Never")), Some(1)));
        assert!(should_restart(&c, None, Some(0)), "Always by default");
    }

    #[test]
    fn a_container_policy_overrides_the_pod_policy() {
        let never = container(Some("Never"), &[]);
        assert!(!should_restart(&never, Some(&spec("Always")), Some(1)));
        let on_failure = container(Some("OnFailure"), &[]);
        assert!(!should_restart(&on_failure, Some(&spec("Always")), Some(0)));
        assert!(should_restart(&on_failure, Some(&spec("Never")), Some(2)));
        let always = container(Some("Always"), &[]);
        assert!(should_restart(&always, Some(&spec("Never")), Some(0)));
    }

    #[test]
    fn a_matching_rule_restarts_and_otherwise_the_container_policy_applies() {
        let pod = spec("Always");
        let in_42 = container(Some("Never"), &[("In", &[42])]);
        assert!(should_restart(&in_42, Some(&pod), Some(42)));
        assert!(!should_restart(&in_42, Some(&pod), Some(1)));
        assert!(!should_restart(&in_42, Some(&pod), None));
        let not_in_0 = container(Some("Never"), &[("NotIn", &[0, 1])]);
        assert!(should_restart(&not_in_0, Some(&pod), Some(7)));
        assert!(!should_restart(&not_in_0, Some(&pod), Some(1)));
        assert!(should_restart(&not_in_0, Some(&pod), None));
    }

    #[test]
    fn rules_are_ignored_without_a_container_policy_and_unknown_operators_never_match() {
        let mut no_policy = container(None, &[("In", &[3])]);
        assert!(!should_restart(&no_policy, Some(&spec("Never")), Some(3)));
        no_policy.restart_policy = Some("Never".into());
        assert!(should_restart(&no_policy, Some(&spec("Never")), Some(3)));
        let odd = container(Some("Never"), &[("Maybe", &[3])]);
        assert!(!should_restart(&odd, Some(&spec("Always")), Some(3)));
    }
}

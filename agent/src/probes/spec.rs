//! [`ProbeSpec`]: a `v1.Probe` with the API server's defaults applied (kubelet relies on
//! `SetDefaults_Probe`; static pods never see the API server, so ironlet applies them here)
//! and validated as the API server would.
//!
//! Defaults (a missing field or 0, as `SetDefaults_Probe`): periodSeconds 10,
//! timeoutSeconds 1, successThreshold 1, failureThreshold 3; initialDelaySeconds 0.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};

use super::action::{Action, ActionError};
use super::ProbeKind;

/// One probe of one container, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    pub kind: ProbeKind,
    pub action: Action,
    /// Measured from the container's start.
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    /// Consecutive successes that publish Success (always 1 for liveness and startup).
    pub success_threshold: u32,
    /// Consecutive failures that publish Failure.
    pub failure_threshold: u32,
}

/// Why a probe is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeSpecError {
    #[error("{kind} probe: {source}")]
    Action {
        kind: ProbeKind,
        #[source]
        source: ActionError,
    },
    #[error("{kind} probe: {field} must not be negative, got {value}")]
    Negative {
        kind: ProbeKind,
        field: &'static str,
        value: i32,
    },
    #[error("{kind} probe: successThreshold must be 1, got {value}")]
    SuccessThresholdNotOne { kind: ProbeKind, value: i32 },
}

impl ProbeSpec {
    /// Validates `probe` and applies the defaults.
    pub fn from_probe(kind: ProbeKind, probe: &Probe) -> Result<Self, ProbeSpecError> {
        let action =
            Action::from_probe(probe).map_err(|source| ProbeSpecError::Action { kind, source })?;
        let field = |field: &'static str, value: Option<i32>, default: u32| match value {
            None | Some(0) => Ok(default),
            Some(v) => u32::try_from(v).map_err(|_| ProbeSpecError::Negative {
                kind,
                field,
                value: v,
            }),
        };
        let initial_delay = field("initialDelaySeconds", probe.initial_delay_seconds, 0)?;
        let period = field("periodSeconds", probe.period_seconds, 10)?;
        let timeout = field("timeoutSeconds", probe.timeout_seconds, 1)?;
        let success_threshold = field("successThreshold", probe.success_threshold, 1)?;
        let failure_threshold = field("failureThreshold", probe.failure_threshold, 3)?;
        if kind != ProbeKind::Readiness && success_threshold != 1 {
            return Err(ProbeSpecError::SuccessThresholdNotOne {
                kind,
                value: probe.success_threshold.unwrap_or_default(),
            });
        }
        Ok(Self {
            kind,
            action,
            initial_delay: Duration::from_secs(initial_delay.into()),
            period: Duration::from_secs(period.into()),
            timeout: Duration::from_secs(timeout.into()),
            success_threshold,
            failure_threshold,
        })
    }

    /// The container's probes that are set, in gating order (startup, liveness,
    /// readiness), each validated on its own.
    pub fn from_container(container: &Container) -> Vec<(ProbeKind, Result<Self, ProbeSpecError>)> {
        ProbeKind::ALL
            .into_iter()
            .filter_map(|kind| {
                let probe = match kind {
                    ProbeKind::Startup => container.startup_probe.as_ref(),
                    ProbeKind::Liveness => container.liveness_probe.as_ref(),
                    ProbeKind::Readiness => container.readiness_probe.as_ref(),
                }?;
                Some((kind, Self::from_probe(kind, probe)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ExecAction;

    fn exec_probe() -> Probe {
        Probe {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            ..Probe::default()
        }
    }

    #[test]
    fn missing_and_zero_fields_take_the_api_defaults() {
        let probe = Probe {
            period_seconds: Some(0),
            ..exec_probe()
        };
        let spec = ProbeSpec::from_probe(ProbeKind::Readiness, &probe);
        assert_eq!(
            spec,
            Ok(ProbeSpec {
                kind: ProbeKind::Readiness,
                action: Action::Exec {
                    command: vec!["true".into()]
                },
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(10),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 3,
            })
        );
    }

    #[test]
    fn liveness_and_startup_refuse_a_success_threshold_above_one() {
        let probe = Probe {
            success_threshold: Some(2),
            ..exec_probe()
        };
        for kind in [ProbeKind::Liveness, ProbeKind::Startup] {
            assert_eq!(
                ProbeSpec::from_probe(kind, &probe),
                Err(ProbeSpecError::SuccessThresholdNotOne { kind, value: 2 })
            );
        }
        let readiness = ProbeSpec::from_probe(ProbeKind::Readiness, &probe);
        assert_eq!(readiness.map(|s| s.success_threshold), Ok(2));
    }

    #[test]
    fn negative_timings_are_rejected_naming_the_field() {
        let probe = Probe {
            timeout_seconds: Some(-5),
            ..exec_probe()
        };
        assert_eq!(
            ProbeSpec::from_probe(ProbeKind::Liveness, &probe),
            Err(ProbeSpecError::Negative {
                kind: ProbeKind::Liveness,
                field: "timeoutSeconds",
                value: -5
            })
        );
    }

    #[test]
    fn a_container_lists_only_its_set_probes_in_gating_order() {
        let container = Container {
            readiness_probe: Some(exec_probe()),
            startup_probe: Some(Probe::default()),
            ..Container::default()
        };
        let specs = ProbeSpec::from_container(&container);
        let kinds: Vec<_> = specs.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, [ProbeKind::Startup, ProbeKind::Readiness]);
        assert!(matches!(
            specs[0].1,
            Err(ProbeSpecError::Action {
                source: ActionError::NoAction,
                ..
            })
        ));
        assert!(specs[1].1.is_ok());
    }
}

//! Our four node conditions with kubelet's reasons and messages
//! (`pkg/kubelet/nodestatus/setters.go`), and their transition times.
//!
//! | type             | False                                          | True                                         |
//! |------------------|------------------------------------------------|----------------------------------------------|
//! | `MemoryPressure` | `KubeletHasSufficientMemory`                   | `KubeletHasInsufficientMemory`               |
//! | `DiskPressure`   | `KubeletHasNoDiskPressure`                     | `KubeletHasDiskPressure`                     |
//! | `PIDPressure`    | `KubeletHasSufficientPID`                      | `KubeletHasInsufficientPID`                  |
//! | `Ready`          | `KubeletNotReady` (errors joined by ", ")      | `KubeletReady` "kubelet is posting ready status" |

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::provider::{Pressure, Readiness};

/// The `Ready` condition type.
pub const READY: &str = "Ready";
/// The `MemoryPressure` condition type.
pub const MEMORY_PRESSURE: &str = "MemoryPressure";
/// The `DiskPressure` condition type.
pub const DISK_PRESSURE: &str = "DiskPressure";
/// The `PIDPressure` condition type.
pub const PID_PRESSURE: &str = "PIDPressure";
/// The condition types this controller writes, in kubelet's order; others are left alone.
pub const OUR_CONDITION_TYPES: [&str; 4] = [MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE, READY];
/// The `Ready=False` message written when the agent stops.
pub const SHUTTING_DOWN_MESSAGE: &str = "ironlet is shutting down";

const KUBELET_NOT_READY: &str = "KubeletNotReady";

/// One condition without its times: what decides whether the status changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Condition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Condition {
    fn new(type_: &'static str, status: bool, reason: &'static str, message: &str) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.to_owned(),
        }
    }

    fn status_str(&self) -> &'static str {
        if self.status {
            "True"
        } else {
            "False"
        }
    }
}

/// Our four conditions for this pressure and readiness, in kubelet's order.
pub(crate) fn conditions(pressure: Pressure, readiness: &Readiness) -> Vec<Condition> {
    let memory = if pressure.memory {
        Condition::new(
            MEMORY_PRESSURE,
            true,
            "KubeletHasInsufficientMemory",
            "kubelet has insufficient memory available",
        )
    } else {
        Condition::new(
            MEMORY_PRESSURE,
            false,
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        )
    };
    let disk = if pressure.disk {
        Condition::new(
            DISK_PRESSURE,
            true,
            "KubeletHasDiskPressure",
            "kubelet has disk pressure",
        )
    } else {
        Condition::new(
            DISK_PRESSURE,
            false,
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        )
    };
    let pid = if pressure.pid {
        Condition::new(
            PID_PRESSURE,
            true,
            "KubeletHasInsufficientPID",
            "kubelet has insufficient PID available",
        )
    } else {
        Condition::new(
            PID_PRESSURE,
            false,
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        )
    };
    let ready = match readiness {
        Readiness::Ready => Condition::new(
            READY,
            true,
            "KubeletReady",
            "kubelet is posting ready status",
        ),
        Readiness::NotReady(errors) => {
            Condition::new(READY, false, KUBELET_NOT_READY, &errors.join(", "))
        }
    };
    vec![memory, disk, pid, ready]
}

/// `Ready=False` at shutdown.
pub(crate) fn shutting_down() -> Condition {
    Condition::new(READY, false, KUBELET_NOT_READY, SHUTTING_DOWN_MESSAGE)
}

/// When each of our conditions last changed status, so that `lastTransitionTime` only moves
/// on a change (kubelet keeps it the same way).
#[derive(Debug, Clone, Default)]
pub(crate) struct Transitions {
    last: BTreeMap<&'static str, (bool, Timestamp)>,
}

impl Transitions {
    /// Starts from the conditions of a Node that already existed.
    pub fn from_existing(existing: &[NodeCondition]) -> Self {
        let mut last = BTreeMap::new();
        for type_ in OUR_CONDITION_TYPES {
            let found = existing.iter().find(|c| c.type_ == type_);
            if let Some((condition, time)) =
                found.and_then(|c| c.last_transition_time.as_ref().map(|t| (c, t.0)))
            {
                last.insert(type_, (condition.status == "True", time));
            }
        }
        Self { last }
    }

    /// The API conditions for `conditions` as reported at `now`: heartbeat `now`, transition
    /// kept when the status is the one last reported, else `now`.
    pub fn stamp(&mut self, conditions: &[Condition], now: Timestamp) -> Vec<NodeCondition> {
        conditions
            .iter()
            .map(|condition| {
                let transition = match self.last.get(condition.type_) {
                    Some((status, since)) if *status == condition.status => *since,
                    _ => now,
                };
                self.last
                    .insert(condition.type_, (condition.status, transition));
                NodeCondition {
                    type_: condition.type_.to_owned(),
                    status: condition.status_str().to_owned(),
                    reason: Some(condition.reason.to_owned()),
                    message: Some(condition.message.clone()),
                    last_heartbeat_time: Some(Time(now)),
                    last_transition_time: Some(Time(transition)),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn a_healthy_node_reports_kubelets_ready_and_no_pressure() {
        let reported = conditions(Pressure::default(), &Readiness::Ready);
        let summary: Vec<_> = reported
            .iter()
            .map(|c| (c.type_, c.status, c.reason))
            .collect();
        assert_eq!(
            summary,
            [
                (MEMORY_PRESSURE, false, "KubeletHasSufficientMemory"),
                (DISK_PRESSURE, false, "KubeletHasNoDiskPressure"),
                (PID_PRESSURE, false, "KubeletHasSufficientPID"),
                (READY, true, "KubeletReady"),
            ]
        );
        assert_eq!(reported[3].message, "kubelet is posting ready status");
    }

    #[test]
    fn not_ready_joins_the_errors_into_the_message() {
        let reported = conditions(
            Pressure {
                memory: true,
                disk: true,
                pid: true,
            },
            &Readiness::NotReady(vec!["runtime down".into(), "network down".into()]),
        );
        assert!(reported[..3].iter().all(|c| c.status));
        assert_eq!(reported[0].reason, "KubeletHasInsufficientMemory");
        assert_eq!(reported[3].reason, "KubeletNotReady");
        assert_eq!(reported[3].message, "runtime down, network down");
    }

    #[test]
    fn transition_time_moves_only_when_the_status_changes() {
        let mut transitions = Transitions::default();
        let ready = conditions(Pressure::default(), &Readiness::Ready);
        let first = transitions.stamp(&ready, at(100));
        let again = transitions.stamp(&ready, at(110));
        assert_eq!(again[3].last_transition_time, Some(Time(at(100))));
        assert_eq!(again[3].last_heartbeat_time, Some(Time(at(110))));
        let down = transitions.stamp(&[shutting_down()], at(120));
        assert_eq!(down[0].last_transition_time, Some(Time(at(120))));
        assert_eq!(down[0].status, "False");
        assert_eq!(first[0].last_transition_time, Some(Time(at(100))));
    }

    #[test]
    fn transitions_continue_from_an_existing_node() {
        let existing = NodeCondition {
            type_: READY.to_owned(),
            status: "True".to_owned(),
            last_transition_time: Some(Time(at(50))),
            ..NodeCondition::default()
        };
        let mut transitions = Transitions::from_existing(&[existing]);
        let stamped =
            transitions.stamp(&conditions(Pressure::default(), &Readiness::Ready), at(90));
        assert_eq!(stamped[3].last_transition_time, Some(Time(at(50))));
        assert_eq!(stamped[0].last_transition_time, Some(Time(at(90))));
    }
}

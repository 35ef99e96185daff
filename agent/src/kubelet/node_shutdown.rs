//! Graceful node shutdown: kubelet's `GracefulNodeShutdown` (`pkg/kubelet/nodeshutdown`,
//! v1.37) with `--shutdown-grace-period` and `--shutdown-grace-period-critical-pods`
//! (KubeletConfiguration `shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`,
//! `shutdownGracePeriodByPodPriority`). Off while every period is 0, kubelet's default.
//!
//! When the system shuts down:
//! 1. the node turns `Ready=False` (`KubeletNotReady`, "node is shutting down"), at once,
//!    and a `Shutdown` node event is recorded; new pods are rejected by admission (reason
//!    `NodeShutdown`, "Pod was rejected as the node is shutting down.");
//! 2. the pods are killed group by group, lowest priority first. Without
//!    `shutdownGracePeriodByPodPriority` there are kubelet's two groups: regular pods
//!    (priority < 2 000 000 000) get `grace - critical` seconds, then critical pods
//!    (system-cluster-critical and system-node-critical) get `critical` seconds. A pod's
//!    own `terminationGracePeriodSeconds` applies when shorter. preStop hooks run as in any
//!    kill. The next group starts once every pod of the group is terminated, or when the
//!    group's period is over;
//! 3. each pod's status becomes phase `Failed`, reason `Terminated`, message "Pod was
//!    terminated in response to imminent node shutdown.", with a `DisruptionTarget`
//!    condition (reason `TerminationByKubelet`); it is not restarted. As in kubelet, the API
//!    sees phase `Failed` and the `DisruptionTarget` condition only once none of the pod's
//!    containers runs; during the kill the phase stays `Running` (with `Ready=False`, see
//!    [`crate::status::delay_terminal_phase`]).
//!
//! How the shutdown is detected (`ironlet run` wires it; see the README):
//! * where systemd-logind runs, through its D-Bus API as kubelet does ([`logind`]): a
//!   "delay" inhibitor lock for `shutdown`, held until the pods are stopped, and the
//!   `PrepareForShutdown(true)` signal. `InhibitDelayMaxSec` is raised with a drop-in when it
//!   is shorter than the grace period;
//! * everywhere, the supervisor receiving SIGPWR (what init sends on a power failure, and
//!   what a non-systemd init or a container manager can be told to send before stopping
//!   the node): it signals the agent, and every agent it starts afterwards, with
//!   `IRONLET_NODE_SHUTDOWN=1`. SIGTERM to the supervisor keeps its meaning: ironlet stops,
//!   pods keep running.
//!
//! Differences from kubelet: the shutdown state is not written to disk (kubelet records the
//! start and end times in `graceful_node_shutdown_state` for its metrics); an agent that
//! restarts during a shutdown learns of it again only from the supervisor's variable or
//! from logind.

pub mod logind;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, oneshot, watch};

use super::events::EventType;
use super::syncer::NodeSyncer;
use crate::config::{pod_full_name, pod_uid};
use crate::pod_workers::{KillPodOptions, PodLifecycle, PodWorkers, UpdatePodOptions, UpdateType};

/// kubelet's `nodeShutdownReason`: the reason of a pod killed for the shutdown.
pub const SHUTDOWN_REASON: &str = "Terminated";
/// kubelet's `nodeShutdownMessage`.
pub const SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// kubelet's `nodeShutdownNotAdmittedReason`.
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
/// kubelet's `nodeShutdownNotAdmittedMessage`.
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The error the `Ready` condition carries during a shutdown (kubelet's `ShutdownStatus`).
pub const NOT_READY_MESSAGE: &str = "node is shutting down";
/// kubelet's node event reason (`events.NodeShutdown`).
pub const EVENT_REASON: &str = "Shutdown";
/// kubelet's `SystemCriticalPriority`.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One entry of `shutdownGracePeriodByPodPriority`: pods of at least `priority` (and below
/// the next entry's) get `grace_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorityGrace {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

/// The configured grace periods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownSettings {
    /// `--shutdown-grace-period`: the whole shutdown.
    pub grace_period: Duration,
    /// `--shutdown-grace-period-critical-pods`: the part reserved for critical pods.
    pub grace_period_critical_pods: Duration,
    /// `shutdownGracePeriodByPodPriority` (exclusive with the two above).
    pub by_priority: Vec<PriorityGrace>,
}

impl ShutdownSettings {
    /// kubelet's validation (`ValidateKubeletConfiguration`), with its messages.
    pub fn validate(&self) -> Result<(), String> {
        if self.grace_period_critical_pods > self.grace_period {
            return Err(format!(
                "invalid configuration: shutdownGracePeriodCriticalPods ({:?}) must be <= shutdownGracePeriod ({:?})",
                self.grace_period_critical_pods, self.grace_period
            ));
        }
        if !self.by_priority.is_empty() && !self.grace_period.is_zero() {
            return Err("invalid configuration: Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time".into());
        }
        if let Some(bad) = self
            .by_priority
            .iter()
            .find(|g| g.shutdown_grace_period_seconds < 0)
        {
            return Err(format!(
                "invalid configuration: shutdownGracePeriodByPodPriority priority {} has a negative grace period",
                bad.priority
            ));
        }
        Ok(())
    }

    /// The priority groups, lowest priority first (kubelet's `migrateConfig` turns the two
    /// flags into a regular and a critical group).
    pub fn groups(&self) -> Vec<PriorityGrace> {
        let mut groups = if self.by_priority.is_empty() {
            if self.grace_period.is_zero() || self.grace_period_critical_pods > self.grace_period {
                return Vec::new();
            }
            let regular = self.grace_period - self.grace_period_critical_pods;
            vec![
                PriorityGrace {
                    priority: 0,
                    shutdown_grace_period_seconds: regular.as_secs() as i64,
                },
                PriorityGrace {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    shutdown_grace_period_seconds: self.grace_period_critical_pods.as_secs() as i64,
                },
            ]
        } else {
            self.by_priority.clone()
        };
        groups.sort_by_key(|g| g.priority);
        groups
    }

    /// Whether graceful node shutdown is on (kubelet: some group has a period).
    pub fn enabled(&self) -> bool {
        self.groups()
            .iter()
            .any(|g| g.shutdown_grace_period_seconds > 0)
    }

    /// The whole shutdown: the sum of the groups' periods (what the logind inhibitor
    /// delay must cover).
    pub fn total(&self) -> Duration {
        Duration::from_secs(
            self.groups()
                .iter()
                .map(|g| g.shutdown_grace_period_seconds.max(0) as u64)
                .sum(),
        )
    }
}

/// One group of pods to kill together.
#[derive(Debug, Clone)]
pub struct ShutdownGroup {
    pub grace: PriorityGrace,
    /// Each pod with the grace period (seconds) it is killed with.
    pub pods: Vec<(Arc<Pod>, i64)>,
}

/// kubelet's `groupByPriority`: each pod goes to the group with the highest priority not
/// above its own (the lowest group when below all), and gets the group's period, or its
/// own `terminationGracePeriodSeconds` when that is not longer.
pub fn plan(groups: &[PriorityGrace], pods: Vec<Arc<Pod>>) -> Vec<ShutdownGroup> {
    let mut out: Vec<ShutdownGroup> = groups
        .iter()
        .map(|g| ShutdownGroup {
            grace: *g,
            pods: Vec::new(),
        })
        .collect();
    if out.is_empty() {
        return out;
    }
    for pod in pods {
        let spec = pod.spec.as_ref();
        let priority = spec.and_then(|s| s.priority).unwrap_or(0);
        let index = out
            .iter()
            .rposition(|g| g.grace.priority <= priority)
            .unwrap_or(0);
        let group_seconds = out[index].grace.shutdown_grace_period_seconds;
        let seconds = match spec.and_then(|s| s.termination_grace_period_seconds) {
            Some(own) if own <= group_seconds => own,
            _ => group_seconds,
        };
        out[index].pods.push((pod, seconds));
    }
    out
}

/// What starts or cancels a shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownEvent {
    /// The system is shutting down (logind `PrepareForShutdown(true)`, SIGPWR).
    Start,
    /// The shutdown was cancelled (logind `PrepareForShutdown(false)`).
    Cancel,
}

/// The agent's side of the shutdown manager: where events come in and what others watch.
#[derive(Debug, Clone)]
pub struct NodeShutdown {
    events: mpsc::UnboundedSender<ShutdownEvent>,
    shutting_down: watch::Receiver<bool>,
    done: watch::Receiver<bool>,
}

impl NodeShutdown {
    /// Reports a shutdown event.
    pub fn send(&self, event: ShutdownEvent) {
        let _ = self.events.send(event);
    }

    /// True from the start of a shutdown until it is cancelled: the node is not ready.
    pub fn shutting_down(&self) -> watch::Receiver<bool> {
        self.shutting_down.clone()
    }

    /// Turns true once the pods of a shutdown are stopped (the inhibitor lock may go).
    pub fn done(&self) -> watch::Receiver<bool> {
        self.done.clone()
    }
}

/// The kubelet's end of [`NodeShutdown`].
#[derive(Debug)]
pub(super) struct ShutdownManager {
    pub(super) settings: ShutdownSettings,
    pub(super) events: mpsc::UnboundedReceiver<ShutdownEvent>,
    pub(super) shutting_down: watch::Sender<bool>,
    pub(super) done: watch::Sender<bool>,
    handle: NodeShutdown,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ShutdownManager {
    pub(super) fn new(settings: ShutdownSettings) -> Self {
        let (events_tx, events) = mpsc::unbounded_channel();
        let (shutting_down, shutting_down_rx) = watch::channel(false);
        let (done, done_rx) = watch::channel(false);
        Self {
            settings,
            events,
            shutting_down,
            done,
            handle: NodeShutdown {
                events: events_tx,
                shutting_down: shutting_down_rx,
                done: done_rx,
            },
            task: None,
        }
    }

    pub(super) fn handle(&self) -> NodeShutdown {
        self.handle.clone()
    }

    /// Whether admission must reject new pods.
    pub(super) fn is_shutting_down(&self) -> bool {
        *self.shutting_down.borrow()
    }

    /// Acts on one event: a start marks the node and kills the pods (in a task).
    pub(super) fn on_event(
        &mut self,
        event: ShutdownEvent,
        workers: &PodWorkers,
        syncer: &Arc<NodeSyncer>,
    ) {
        if !self.settings.enabled() {
            tracing::warn!(
                ?event,
                "node shutdown event ignored: graceful node shutdown is off (--shutdown-grace-period=0)"
            );
            return;
        }
        match event {
            ShutdownEvent::Start => {
                if self.is_shutting_down() {
                    return;
                }
                tracing::info!(grace_period = ?self.settings.total(), "Shutdown manager detected new shutdown event");
                syncer.events.node_event(
                    EventType::Normal,
                    EVENT_REASON,
                    "Shutdown manager detected shutdown event".into(),
                );
                self.shutting_down.send_replace(true);
                self.done.send_replace(false);
                let pods: Vec<Arc<Pod>> = workers
                    .known_uids()
                    .iter()
                    .filter_map(|uid| workers.pod(uid))
                    .filter(|(_, state)| *state == PodLifecycle::Syncing)
                    .map(|(pod, _)| pod)
                    .collect();
                let groups = plan(&self.settings.groups(), pods);
                let (workers, syncer, done) = (workers.clone(), syncer.clone(), self.done.clone());
                self.task = Some(tokio::spawn(async move {
                    kill_pods(&workers, &syncer, groups).await;
                    tracing::info!("Shutdown manager completed processing shutdown event, node will shutdown shortly");
                    done.send_replace(true);
                }));
            }
            ShutdownEvent::Cancel => {
                if !self.is_shutting_down() {
                    return;
                }
                tracing::info!("Shutdown manager detected shutdown cancellation");
                syncer.events.node_event(
                    EventType::Normal,
                    EVENT_REASON,
                    "Shutdown manager detected shutdown cancellation".into(),
                );
                // As in kubelet, pods already stopped stay stopped.
                self.shutting_down.send_replace(false);
                self.done.send_replace(false);
            }
        }
    }
}

impl Drop for ShutdownManager {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// kubelet's `podManager.killPods`: group after group, each pod killed with its period and
/// the shutdown status; a group is waited for until its pods are terminated or its period
/// is over.
async fn kill_pods(workers: &PodWorkers, syncer: &NodeSyncer, groups: Vec<ShutdownGroup>) {
    for group in groups {
        if group.pods.is_empty() {
            continue;
        }
        let mut completions = Vec::with_capacity(group.pods.len());
        for (pod, seconds) in group.pods {
            tracing::info!(pod = %pod_full_name(&pod), pod_uid = %pod_uid(&pod), grace_period = seconds, "Shutdown manager killing pod with gracePeriod");
            syncer.record_eviction(
                pod_uid(&pod),
                SHUTDOWN_REASON,
                SHUTDOWN_MESSAGE.into(),
                true,
            );
            let (completed, terminated) = oneshot::channel();
            workers.update_pod(UpdatePodOptions {
                update_type: UpdateType::Kill,
                pod,
                kill: Some(KillPodOptions {
                    grace_period_override: Some(seconds),
                    completed: Some(completed),
                }),
            });
            completions.push(terminated);
        }
        let wait = Duration::from_secs(group.grace.shutdown_grace_period_seconds.max(0) as u64);
        let all = futures_util::future::join_all(completions);
        if tokio::time::timeout(wait, all).await.is_err() {
            tracing::info!(
                priority = group.grace.priority,
                ?wait,
                "Shutdown manager pod killing time out"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: Option<i32>, grace: Option<i64>) -> Arc<Pod> {
        let mut pod: Pod = serde_yaml::from_str(&format!(
            "metadata: {{name: {name}, uid: {name}}}\nspec:\n  containers: [{{name: c, image: i}}]\n"
        ))
        .unwrap();
        let spec = pod.spec.as_mut().unwrap();
        spec.priority = priority;
        spec.termination_grace_period_seconds = grace;
        Arc::new(pod)
    }

    fn flags(grace: u64, critical: u64) -> ShutdownSettings {
        ShutdownSettings {
            grace_period: Duration::from_secs(grace),
            grace_period_critical_pods: Duration::from_secs(critical),
            by_priority: Vec::new(),
        }
    }

    fn names(group: &ShutdownGroup) -> Vec<(String, i64)> {
        group
            .pods
            .iter()
            .map(|(p, s)| (p.metadata.name.clone().unwrap_or_default(), *s))
            .collect()
    }

    #[test]
    fn the_two_flags_make_kubelets_regular_and_critical_groups() {
        let settings = flags(30, 10);
        assert!(settings.enabled());
        assert_eq!(settings.total(), Duration::from_secs(30));
        assert_eq!(
            settings.groups(),
            vec![
                PriorityGrace {
                    priority: 0,
                    shutdown_grace_period_seconds: 20
                },
                PriorityGrace {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    shutdown_grace_period_seconds: 10
                },
            ]
        );
        assert!(!flags(0, 0).enabled(), "kubelet's default: off");
        assert!(flags(0, 0).groups().is_empty());
    }

    #[test]
    fn regular_pods_go_first_with_the_shorter_of_their_own_and_the_group_period() {
        let groups = plan(
            &flags(30, 10).groups(),
            vec![
                pod("critical", Some(2_000_001_000), None),
                pod("plain", None, Some(60)),
                pod("quick", Some(1000), Some(3)),
                pod("negative", Some(-5), None),
                pod("cluster-critical", Some(SYSTEM_CRITICAL_PRIORITY), Some(30)),
            ],
        );
        assert_eq!(groups.len(), 2);
        assert_eq!(
            names(&groups[0]),
            [
                ("plain".into(), 20),
                ("quick".into(), 3),
                ("negative".into(), 20)
            ]
        );
        assert_eq!(
            names(&groups[1]),
            [("critical".into(), 10), ("cluster-critical".into(), 10)]
        );
    }

    #[test]
    fn by_priority_groups_take_the_highest_group_not_above_the_pod() {
        let settings = ShutdownSettings {
            by_priority: vec![
                PriorityGrace {
                    priority: 100_000,
                    shutdown_grace_period_seconds: 5,
                },
                PriorityGrace {
                    priority: 1,
                    shutdown_grace_period_seconds: 7,
                },
                PriorityGrace {
                    priority: 10_000,
                    shutdown_grace_period_seconds: 0,
                },
            ],
            ..ShutdownSettings::default()
        };
        assert!(settings.validate().is_ok());
        assert_eq!(settings.total(), Duration::from_secs(12));
        let groups = plan(
            &settings.groups(),
            vec![
                pod("zero", Some(0), None),
                pod("ten-k", Some(10_000), None),
                pod("between", Some(50_000), None),
                pod("top", Some(i32::MAX), None),
            ],
        );
        let priorities: Vec<i32> = groups.iter().map(|g| g.grace.priority).collect();
        assert_eq!(priorities, [1, 10_000, 100_000]);
        assert_eq!(names(&groups[0]), [("zero".into(), 7)]);
        assert_eq!(
            names(&groups[1]),
            [("ten-k".into(), 0), ("between".into(), 0)]
        );
        assert_eq!(names(&groups[2]), [("top".into(), 5)]);
    }

    #[test]
    fn validation_is_kubelets() {
        let err = flags(10, 20).validate().unwrap_err();
        assert!(
            err.contains("shutdownGracePeriodCriticalPods") && err.contains("must be <="),
            "{err}"
        );
        let both = ShutdownSettings {
            by_priority: vec![PriorityGrace {
                priority: 0,
                shutdown_grace_period_seconds: 1,
            }],
            ..flags(10, 0)
        };
        assert!(both.validate().unwrap_err().contains("Cannot specify both"));
        assert!(flags(10, 10).validate().is_ok());
    }
}

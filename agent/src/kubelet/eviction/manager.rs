//! The decisions of kubelet's eviction manager `synchronize`
//! (`pkg/kubelet/eviction/eviction_manager.go`, helpers.go), without I/O: which thresholds
//! are met, which pressure conditions hold (with the transition period), which threshold
//! to reclaim for once its grace period passed, how pods are ranked and the eviction
//! message.
//!
//! One [`PressureTracker::observe`] per monitoring period:
//! 1. thresholds met now (`available < threshold`), plus those met last time and not yet
//!    resolved by `--eviction-minimum-reclaim` (`available < threshold + min reclaim`);
//! 2. a condition is True while one of its thresholds is met and for
//!    `--eviction-pressure-transition-period` after the last time one was;
//! 3. a threshold leads to eviction once met for its grace period (0 for hard ones);
//!    memory first, then disk, then pids.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use super::thresholds::{EvictionSettings, PressureKind, Signal, Threshold};

/// One signal's reading: what is left, and of how much (for percentage thresholds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Bytes, inodes or pids left; negative when more is used than there is.
    pub available: i64,
    pub capacity: u64,
}

/// Readings by signal; a signal without one never meets its thresholds.
pub type Observations = BTreeMap<Signal, Observation>;

/// What one monitoring period decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The pressure conditions that are True.
    pub conditions: BTreeSet<PressureKind>,
    /// The threshold to reclaim for now (met for its grace period), if any.
    pub reclaim: Option<Threshold>,
    /// Every threshold met for its grace period (for the message's figures).
    pub met: Vec<Threshold>,
}

/// The state kubelet's manager keeps between periods.
#[derive(Debug, Default)]
pub struct PressureTracker {
    /// Indices (into the settings' thresholds) met at the last period.
    last_met: BTreeSet<usize>,
    first_observed: HashMap<usize, Instant>,
    condition_last_observed: BTreeMap<PressureKind, Instant>,
}

fn is_met(threshold: &Threshold, observation: Option<&Observation>, min_reclaim: bool) -> bool {
    let Some(observation) = observation else {
        return false;
    };
    let mut amount = threshold.value.amount(observation.capacity);
    if min_reclaim {
        if let Some(extra) = threshold.min_reclaim {
            amount = amount.saturating_add(extra.amount(observation.capacity));
        }
    }
    i128::from(observation.available) < i128::from(amount)
}

impl PressureTracker {
    /// One period at `now` with `observations`.
    pub fn observe(
        &mut self,
        settings: &EvictionSettings,
        observations: &Observations,
        now: Instant,
    ) -> Decision {
        let thresholds = &settings.thresholds;
        let mut met: BTreeSet<usize> = (0..thresholds.len())
            .filter(|&i| {
                is_met(
                    &thresholds[i],
                    observations.get(&thresholds[i].signal),
                    false,
                )
            })
            .collect();
        met.extend(self.last_met.iter().copied().filter(|&i| {
            thresholds
                .get(i)
                .is_some_and(|t| is_met(t, observations.get(&t.signal), true))
        }));
        self.first_observed.retain(|i, _| met.contains(i));
        for &i in &met {
            self.first_observed.entry(i).or_insert(now);
        }
        for &i in &met {
            self.condition_last_observed
                .insert(thresholds[i].signal.pressure(), now);
        }
        let period = settings.pressure_transition_period;
        self.condition_last_observed
            .retain(|_, last| now.saturating_duration_since(*last) < period || *last == now);
        let conditions = self.condition_last_observed.keys().copied().collect();
        let due: Vec<usize> = met
            .iter()
            .copied()
            .filter(|i| {
                self.first_observed.get(i).is_some_and(|since| {
                    now.saturating_duration_since(*since) >= thresholds[*i].grace_period
                })
            })
            .collect();
        // kubelet keeps only the thresholds past their grace period as "met".
        self.last_met = due.iter().copied().collect();
        let mut ordered: Vec<Threshold> = due.iter().map(|&i| thresholds[i]).collect();
        ordered.sort_by_key(|t| (t.signal.pressure(), !t.is_hard(), t.signal));
        Decision {
            conditions,
            reclaim: ordered.first().copied(),
            met: ordered,
        }
    }
}

/// What ranking needs of one pod.
#[derive(Debug, Clone)]
pub struct PodUsage {
    pub pod: std::sync::Arc<Pod>,
    /// The measured usage of the starved resource (bytes or processes); `None`: no stats.
    pub usage: Option<u64>,
    /// The pod's request of it (0 for pids).
    pub request: u64,
    /// `spec.priority` (0 when unset).
    pub priority: i32,
}

/// kubelet's ranking for `kind`: memory and disk: pods using more than they requested
/// first, then lower priority, then larger usage above the request; pids: lower priority,
/// then more processes. Pods without stats come first, as in kubelet.
pub fn rank(pods: &mut [PodUsage], kind: PressureKind) {
    let exceeds = |p: &PodUsage| p.usage.is_some_and(|u| u > p.request);
    let above = |p: &PodUsage| p.usage.map_or(0, |u| i128::from(u) - i128::from(p.request));
    pods.sort_by(|a, b| {
        let stats = b.usage.is_none().cmp(&a.usage.is_none());
        if stats != Ordering::Equal || a.usage.is_none() {
            return stats;
        }
        match kind {
            PressureKind::Memory | PressureKind::Disk => exceeds(b)
                .cmp(&exceeds(a))
                .then(a.priority.cmp(&b.priority))
                .then(above(b).cmp(&above(a))),
            PressureKind::Pid => a.priority.cmp(&b.priority).then(b.usage.cmp(&a.usage)),
        }
    });
}

/// One container's figures for the eviction message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerUsage {
    pub name: String,
    pub usage: u64,
    pub request: u64,
}

/// kubelet's `evictionMessage`: `The node was low on resource: memory. Threshold quantity:
/// 100Mi, available: 90Mi. Container x was using 500Mi, request is 0, has larger consumption
/// of memory. ` (a container line for each container using more than it requested; only
/// for memory and ephemeral storage, which kubelet measures per container).
pub fn eviction_message(
    threshold: &Threshold,
    observation: Option<&Observation>,
    containers: &[ContainerUsage],
) -> String {
    let resource = threshold.signal.resource();
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some(observation) = observation {
        let quantity = threshold.value.amount(observation.capacity);
        message += &format!(
            "Threshold quantity: {}, available: {}. ",
            format_amount(threshold.signal, quantity as i128),
            format_amount(threshold.signal, i128::from(observation.available)),
        );
    }
    if matches!(resource, "memory" | "ephemeral-storage") {
        for c in containers.iter().filter(|c| c.usage > c.request) {
            message += &format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                crate::node::memory_quantity(c.usage).0,
                crate::node::memory_quantity(c.request).0,
            );
        }
    }
    message
}

/// Bytes as Kubernetes' binary quantities (`90Mi`, `93804Ki`), counts as plain numbers.
fn format_amount(signal: Signal, amount: i128) -> String {
    let bytes = matches!(signal.resource(), "memory" | "ephemeral-storage");
    match u64::try_from(amount) {
        Ok(value) if bytes => crate::node::memory_quantity(value).0,
        Ok(value) => value.to_string(),
        Err(_) if bytes => format!(
            "-{}",
            crate::node::memory_quantity(amount.unsigned_abs() as u64).0
        ),
        Err(_) => amount.to_string(),
    }
}

/// kubelet's admission under pressure (`managerImpl.Admit`): `None` admits; `Some(message)`
/// rejects with reason `Evicted`. Critical pods are always admitted; under memory pressure
/// alone, pods that are not BestEffort, or that tolerate the memory-pressure taint, are too.
pub fn admission_message(
    pod: &Pod,
    conditions: &BTreeSet<PressureKind>,
    critical: bool,
) -> Option<String> {
    if conditions.is_empty() || critical {
        return None;
    }
    if conditions.len() == 1 && conditions.contains(&PressureKind::Memory) {
        let best_effort = matches!(
            crate::qos::qos_class(pod),
            Ok(crate::qos::QosClass::BestEffort)
        );
        if !best_effort || tolerates_memory_pressure(pod) {
            return None;
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.condition()).collect();
    Some(format!("The node had condition: [{}]. ", names.join(" ")))
}

/// The taint key the node lifecycle controller adds under `MemoryPressure`.
pub const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

/// `TolerationsTolerateTaint` for `node.kubernetes.io/memory-pressure:NoSchedule`.
fn tolerates_memory_pressure(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.tolerations.iter().flatten())
        .any(|t| {
            let effect_ok = t
                .effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == "NoSchedule");
            let key_ok = match t.key.as_deref() {
                None | Some("") => t.operator.as_deref() == Some("Exists"),
                Some(key) => key == MEMORY_PRESSURE_TAINT,
            };
            let value_ok = match t.operator.as_deref() {
                Some("Exists") => true,
                _ => t.value.as_deref().unwrap_or("").is_empty(),
            };
            effect_ok && key_ok && value_ok
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::kubelet::eviction::thresholds::{SignalMap, ThresholdMap, ThresholdValue};

    fn settings(
        hard: &str,
        soft: &str,
        grace: &str,
        reclaim: &str,
        transition: u64,
    ) -> EvictionSettings {
        EvictionSettings::build(
            &ThresholdMap::parse_flag(hard).unwrap(),
            &ThresholdMap::parse_flag(soft).unwrap(),
            &SignalMap::parse_flag(grace).unwrap(),
            &SignalMap::parse_flag(reclaim).unwrap(),
            0,
            Duration::from_secs(transition),
        )
        .unwrap()
    }

    fn memory(available_mi: i64) -> Observations {
        Observations::from([(
            Signal::MemoryAvailable,
            Observation {
                available: available_mi << 20,
                capacity: 1 << 34,
            },
        )])
    }

    #[test]
    fn a_hard_threshold_evicts_at_once_and_the_condition_outlives_it_by_the_transition_period() {
        let settings = settings("memory.available<100Mi", "", "", "", 10);
        let mut tracker = PressureTracker::default();
        let t0 = Instant::now();
        let calm = tracker.observe(&settings, &memory(500), t0);
        assert!(calm.conditions.is_empty() && calm.reclaim.is_none());
        let low = tracker.observe(&settings, &memory(90), t0 + Duration::from_secs(1));
        assert_eq!(low.conditions, BTreeSet::from([PressureKind::Memory]));
        assert_eq!(low.reclaim.map(|t| t.signal), Some(Signal::MemoryAvailable));
        let recovered = tracker.observe(&settings, &memory(500), t0 + Duration::from_secs(5));
        assert!(recovered.reclaim.is_none());
        assert_eq!(recovered.conditions, BTreeSet::from([PressureKind::Memory]));
        let later = tracker.observe(&settings, &memory(500), t0 + Duration::from_secs(12));
        assert!(later.conditions.is_empty());
    }

    #[test]
    fn a_soft_threshold_waits_for_its_grace_period_and_min_reclaim_keeps_it_met() {
        let settings = settings(
            "memory.available<10Mi",
            "memory.available<200Mi",
            "memory.available=30s",
            "memory.available=100Mi",
            0,
        );
        let mut tracker = PressureTracker::default();
        let t0 = Instant::now();
        let first = tracker.observe(&settings, &memory(150), t0);
        assert_eq!(first.conditions.len(), 1, "the condition does not wait");
        assert!(first.reclaim.is_none());
        let due = tracker.observe(&settings, &memory(150), t0 + Duration::from_secs(30));
        let reclaim = due.reclaim.unwrap();
        assert!(!reclaim.is_hard());
        // 250Mi is above the threshold but below threshold + minimum reclaim (300Mi).
        let still = tracker.observe(&settings, &memory(250), t0 + Duration::from_secs(31));
        assert!(still.reclaim.is_some());
        let done = tracker.observe(&settings, &memory(350), t0 + Duration::from_secs(32));
        assert!(done.reclaim.is_none());
    }

    fn pod(name: &str, priority: i32) -> Arc<Pod> {
        let mut pod: Pod = serde_yaml::from_str(&format!(
            "metadata: {{name: {name}, uid: {name}}}\nspec: {{containers: [{{name: c, image: i}}]}}"
        ))
        .unwrap();
        pod.spec.as_mut().unwrap().priority = Some(priority);
        Arc::new(pod)
    }

    fn usage(name: &str, usage: Option<u64>, request: u64, priority: i32) -> PodUsage {
        PodUsage {
            pod: pod(name, priority),
            usage,
            request,
            priority,
        }
    }

    fn names(pods: &[PodUsage]) -> Vec<String> {
        pods.iter()
            .map(|p| p.pod.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn memory_ranking_is_exceeding_requests_then_priority_then_usage_above_request() {
        let mut pods = vec![
            usage("within", Some(100), 200, 0),
            usage("small-hog", Some(300), 0, 0),
            usage("big-hog", Some(900), 0, 0),
            usage("important-hog", Some(2000), 0, 1000),
            usage("big-request", Some(1000), 800, 0),
        ];
        rank(&mut pods, PressureKind::Memory);
        assert_eq!(
            names(&pods),
            [
                "big-hog",
                "small-hog",
                "big-request",
                "important-hog",
                "within"
            ]
        );
        let mut with_unknown = vec![usage("known", Some(10), 0, 0), usage("unknown", None, 0, 0)];
        rank(&mut with_unknown, PressureKind::Disk);
        assert_eq!(names(&with_unknown), ["unknown", "known"]);
    }

    #[test]
    fn pid_ranking_is_priority_then_processes() {
        let mut pods = vec![
            usage("few", Some(3), 0, 0),
            usage("many", Some(300), 0, 0),
            usage("important-many", Some(3000), 0, 10),
        ];
        rank(&mut pods, PressureKind::Pid);
        assert_eq!(names(&pods), ["many", "few", "important-many"]);
    }

    #[test]
    fn the_message_is_kubelets() {
        let settings = settings("memory.available<100Mi", "", "", "", 0);
        let threshold = settings.thresholds[0];
        let observation = memory(90)[&Signal::MemoryAvailable];
        let message = eviction_message(
            &threshold,
            Some(&observation),
            &[
                ContainerUsage {
                    name: "x".into(),
                    usage: 500 << 20,
                    request: 0,
                },
                ContainerUsage {
                    name: "quiet".into(),
                    usage: 1 << 20,
                    request: 2 << 20,
                },
            ],
        );
        assert_eq!(
            message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi. \
             Container x was using 500Mi, request is 0, has larger consumption of memory. "
        );
        let pids = Threshold {
            signal: Signal::PidAvailable,
            value: ThresholdValue::Quantity(1000),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        };
        let observation = Observation {
            available: 900,
            capacity: 4_194_304,
        };
        assert_eq!(
            eviction_message(&pids, Some(&observation), &[]),
            "The node was low on resource: pids. Threshold quantity: 1000, available: 900. "
        );
    }

    fn admission_pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn admission_under_pressure_is_kubelets() {
        let best_effort =
            admission_pod("metadata: {name: p}\nspec: {containers: [{name: c, image: i}]}");
        let burstable = admission_pod(
            "metadata: {name: p}\nspec: {containers: [{name: c, image: i, resources: {requests: {memory: 1Mi}}}]}",
        );
        let tolerating = admission_pod(
            "metadata: {name: p}\nspec:\n  containers: [{name: c, image: i}]\n  tolerations: [{key: node.kubernetes.io/memory-pressure, operator: Exists, effect: NoSchedule}]",
        );
        let memory = BTreeSet::from([PressureKind::Memory]);
        assert_eq!(
            admission_message(&best_effort, &BTreeSet::new(), false),
            None
        );
        assert_eq!(
            admission_message(&best_effort, &memory, false).as_deref(),
            Some("The node had condition: [MemoryPressure]. ")
        );
        assert_eq!(admission_message(&best_effort, &memory, true), None);
        assert_eq!(admission_message(&burstable, &memory, false), None);
        assert_eq!(admission_message(&tolerating, &memory, false), None);
        let both = BTreeSet::from([PressureKind::Memory, PressureKind::Disk]);
        assert_eq!(
            admission_message(&burstable, &both, false).as_deref(),
            Some("The node had condition: [MemoryPressure DiskPressure]. ")
        );
        assert!(
            admission_message(&tolerating, &BTreeSet::from([PressureKind::Pid]), false).is_some()
        );
    }
}

//! [`QosClass`]: a pod's Quality of Service class, computed exactly as kubelet's `GetPodQOS`
//! (`pkg/apis/core/v1/helper/qos/qos.go`) does, and its cgroup directory name.
//!
//! The rules, over app and init containers together:
//!
//! * no container requests or limits any CPU or memory (zero counts as none) ⇒ `BestEffort`;
//! * every container has CPU **and** memory limits, and for each resource the sum of requests
//!   equals the sum of limits (requests default to limits when unset) ⇒ `Guaranteed`;
//! * anything else ⇒ `Burstable`.

use crate::resources::ResourceRequirements;

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    /// Requests equal limits for CPU and memory in every container.
    Guaranteed,
    /// Some requests or limits, but not guaranteed.
    Burstable,
    /// No requests or limits at all.
    BestEffort,
}

impl QosClass {
    /// The Kubernetes name, as in `status.qosClass` (`"Guaranteed"`, …).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }

    /// The QoS cgroup's directory under the node root with kubelet's cgroupfs driver; `None` for
    /// Guaranteed, whose pods sit directly under the root.
    #[must_use]
    pub fn cgroup_dir(self) -> Option<&'static str> {
        match self {
            Self::Guaranteed => None,
            Self::Burstable => Some("burstable"),
            Self::BestEffort => Some("besteffort"),
        }
    }

    /// kubelet's `GetPodQOS` over all of a pod's containers (app and init).
    #[must_use]
    pub fn from_requirements(containers: &[ResourceRequirements]) -> Self {
        let mut requests = Sums::default();
        let mut limits = Sums::default();
        let mut guaranteed = true;
        for c in containers {
            requests.add(
                c.effective_cpu_request_milli(),
                c.effective_memory_request_bytes(),
            );
            limits.add(c.cpu_limit_milli, c.memory_limit_bytes);
            let has_cpu_limit = c.cpu_limit_milli.is_some_and(|v| v > 0);
            let has_memory_limit = c.memory_limit_bytes.is_some_and(|v| v > 0);
            guaranteed &= has_cpu_limit && has_memory_limit;
        }
        if requests.is_empty() && limits.is_empty() {
            Self::BestEffort
        } else if guaranteed && requests == limits {
            Self::Guaranteed
        } else {
            Self::Burstable
        }
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-resource sums of positive quantities; `None` when no container named the resource, like
/// the absent key of kubelet's `ResourceList`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Sums {
    cpu_milli: Option<u64>,
    memory_bytes: Option<u64>,
}

impl Sums {
    fn add(&mut self, cpu: Option<u64>, memory: Option<u64>) {
        fn add_one(total: &mut Option<u64>, value: Option<u64>) {
            if let Some(v) = value.filter(|v| *v > 0) {
                *total = Some(total.unwrap_or(0).saturating_add(v));
            }
        }
        add_one(&mut self.cpu_milli, cpu);
        add_one(&mut self.memory_bytes, memory);
    }

    fn is_empty(&self) -> bool {
        self.cpu_milli.is_none() && self.memory_bytes.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;

    fn container(
        cpu_req: Option<u64>,
        mem_req: Option<u64>,
        cpu_lim: Option<u64>,
        mem_lim: Option<u64>,
    ) -> ResourceRequirements {
        ResourceRequirements {
            cpu_request_milli: cpu_req,
            memory_request_bytes: mem_req,
            cpu_limit_milli: cpu_lim,
            memory_limit_bytes: mem_lim,
        }
    }

    fn guaranteed() -> ResourceRequirements {
        container(Some(100), Some(100 * MI), Some(100), Some(100 * MI))
    }

    #[test]
    fn names_match_kubernetes_status_values() {
        assert_eq!(QosClass::Guaranteed.as_str(), "Guaranteed");
        assert_eq!(QosClass::Burstable.to_string(), "Burstable");
        assert_eq!(QosClass::BestEffort.as_str(), "BestEffort");
    }

    #[test]
    fn containers_without_resources_are_best_effort() {
        let none = ResourceRequirements::default();
        assert_eq!(QosClass::from_requirements(&[none]), QosClass::BestEffort);
        assert_eq!(
            QosClass::from_requirements(&[none, none]),
            QosClass::BestEffort
        );
        let zeros = container(Some(0), Some(0), Some(0), Some(0));
        assert_eq!(QosClass::from_requirements(&[zeros]), QosClass::BestEffort);
    }

    #[test]
    fn equal_requests_and_limits_everywhere_are_guaranteed() {
        assert_eq!(
            QosClass::from_requirements(&[guaranteed()]),
            QosClass::Guaranteed
        );
        assert_eq!(
            QosClass::from_requirements(&[guaranteed(), guaranteed()]),
            QosClass::Guaranteed
        );
    }

    #[test]
    fn limits_alone_are_guaranteed_because_requests_default_to_limits() {
        let limits_only = container(None, None, Some(100), Some(100 * MI));
        assert_eq!(
            QosClass::from_requirements(&[limits_only]),
            QosClass::Guaranteed
        );
    }

    #[test]
    fn best_effort_next_to_guaranteed_is_burstable() {
        let none = ResourceRequirements::default();
        assert_eq!(
            QosClass::from_requirements(&[none, guaranteed()]),
            QosClass::Burstable
        );
    }

    #[test]
    fn requests_without_limits_are_burstable() {
        let cpu_only = container(Some(1000), None, None, None);
        assert_eq!(
            QosClass::from_requirements(&[cpu_only]),
            QosClass::Burstable
        );
        let no_limits = container(Some(100), Some(100 * MI), None, None);
        assert_eq!(
            QosClass::from_requirements(&[no_limits]),
            QosClass::Burstable
        );
    }

    #[test]
    fn a_missing_cpu_limit_is_burstable_even_with_equal_memory() {
        let memory_guaranteed = container(None, Some(100 * MI), None, Some(100 * MI));
        assert_eq!(
            QosClass::from_requirements(&[memory_guaranteed]),
            QosClass::Burstable
        );
    }

    #[test]
    fn requests_below_limits_are_burstable() {
        let c = container(Some(100), Some(100 * MI), Some(200), Some(200 * MI));
        assert_eq!(QosClass::from_requirements(&[c]), QosClass::Burstable);
    }

    #[test]
    fn an_init_container_without_limits_makes_the_pod_burstable() {
        let init = container(Some(100), Some(100 * MI), None, None);
        assert_eq!(
            QosClass::from_requirements(&[guaranteed(), init]),
            QosClass::Burstable
        );
    }

    #[test]
    fn qos_directories_follow_the_cgroupfs_driver_layout() {
        assert_eq!(QosClass::Guaranteed.cgroup_dir(), None);
        assert_eq!(QosClass::Burstable.cgroup_dir(), Some("burstable"));
        assert_eq!(QosClass::BestEffort.cgroup_dir(), Some("besteffort"));
    }
}

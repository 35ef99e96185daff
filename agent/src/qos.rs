//! A pod's compute resources, as numbers: the quantity parser ([`Quantity`]), per-container
//! requirements and the pod's effective requests ([`pod_requests`], [`pod_resources`]), and
//! its QoS class ([`qos_class`]).
//!
//! The numbers feed admission (`crate::admission`) and the cgroups crate's mapping
//! (`ironlet_cgroups::PodResources`, `ResourceRequirements`, `QosClass`); this module only
//! turns Kubernetes objects into those types, it does not re-implement the mapping.

mod quantity;
mod requests;

use k8s_openapi::api::core::v1::Pod;

pub use ironlet_cgroups::QosClass;
pub use quantity::{Quantity, QuantityError};
pub use requests::{
    all_container_requirements, container_requirements, is_restartable_init_container,
    pod_requests, pod_resources, ResourceAmounts, ResourceError, CPU, MEMORY,
};

/// kubelet's `GetPodQOS` over the pod's app and init containers:
///
/// * no CPU or memory request or limit anywhere (zero counts as none) ⇒ `BestEffort`;
/// * every container limits CPU **and** memory, and per resource the requests add up to the
///   limits ⇒ `Guaranteed`;
/// * anything else ⇒ `Burstable`.
///
/// Current behaviour: pod-level `spec.resources` is not considered.
pub fn qos_class(pod: &Pod) -> Result<QosClass, ResourceError> {
    Ok(QosClass::from_requirements(&all_container_requirements(
        pod,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qos(containers: &str) -> QosClass {
        let pod: Pod =
            serde_yaml::from_str(&format!("spec:\n  containers:\n{containers}")).unwrap();
        qos_class(&pod).unwrap()
    }

    #[test]
    fn a_pod_without_requests_or_limits_is_best_effort() {
        assert_eq!(qos("  - {name: a, image: i}\n"), QosClass::BestEffort);
        assert_eq!(
            qos("  - {name: a, image: i, resources: {requests: {cpu: 0}}}\n"),
            QosClass::BestEffort
        );
    }

    #[test]
    fn equal_cpu_and_memory_limits_and_requests_everywhere_is_guaranteed() {
        let c = "  - {name: a, image: i, resources: {limits: {cpu: 1, memory: 1Gi}, requests: {cpu: 1000m, memory: 1024Mi}}}\n  - {name: b, image: i, resources: {limits: {cpu: 100m, memory: 1Mi}}}\n";
        assert_eq!(qos(c), QosClass::Guaranteed);
    }

    #[test]
    fn a_missing_memory_limit_or_a_lower_request_is_burstable() {
        assert_eq!(
            qos("  - {name: a, image: i, resources: {limits: {cpu: 1}}}\n"),
            QosClass::Burstable
        );
        assert_eq!(
            qos("  - {name: a, image: i, resources: {limits: {cpu: 1, memory: 1Gi}, requests: {cpu: 500m}}}\n"),
            QosClass::Burstable
        );
        assert_eq!(
            qos("  - {name: a, image: i, resources: {limits: {cpu: 1, memory: 1Gi}}}\n  - {name: b, image: i}\n"),
            QosClass::Burstable
        );
    }

    #[test]
    fn init_containers_count_for_qos() {
        let pod: Pod = serde_yaml::from_str(
            "spec:\n  initContainers: [{name: i, image: i, resources: {requests: {memory: 1Mi}}}]\n  containers: [{name: a, image: i}]\n",
        )
        .unwrap();
        assert_eq!(qos_class(&pod).unwrap(), QosClass::Burstable);
    }
}

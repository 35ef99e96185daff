//! A pod's compute resources as numbers: per-container requests and limits in the shape the
//! cgroups crate maps to cgroup settings ([`ResourceRequirements`], [`PodResources`]), and the
//! pod's effective requests for admission ([`pod_requests`]).
//!
//! Only `cpu` (millicores) and `memory` (bytes) are read; other resources are ignored. A request
//! left unset counts as its limit (the API server's defaulting, also applied to static pods by
//! the config layer). Every quantity must parse and be non-negative, otherwise the function
//! fails with a [`ResourceError`] naming the container and the field — pods that passed the
//! config layer's validation never do.

use std::collections::BTreeMap;

use ironlet_cgroups::{PodResources, ResourceRequirements};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::quantity::{Quantity, QuantityError};

/// The resource name of CPU in requests and limits.
pub const CPU: &str = "cpu";
/// The resource name of memory in requests and limits.
pub const MEMORY: &str = "memory";

/// A quantity of a pod that could not be turned into a number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{owner} {field}.{resource}: {source}")]
pub struct ResourceError {
    /// `container "name"`, `init container "name"` or `pod overhead`.
    pub owner: String,
    /// `requests`, `limits` or `overhead`.
    pub field: &'static str,
    /// `cpu` or `memory`.
    pub resource: &'static str,
    /// Why the quantity was rejected.
    #[source]
    pub source: QuantityError,
}

/// CPU and memory amounts, e.g. a pod's total requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceAmounts {
    /// Millicores.
    pub cpu_milli: u64,
    /// Bytes.
    pub memory_bytes: u64,
}

impl ResourceAmounts {
    fn add(self, other: Self) -> Self {
        Self {
            cpu_milli: self.cpu_milli.saturating_add(other.cpu_milli),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
        }
    }

    fn max(self, other: Self) -> Self {
        Self {
            cpu_milli: self.cpu_milli.max(other.cpu_milli),
            memory_bytes: self.memory_bytes.max(other.memory_bytes),
        }
    }

    /// Whether both amounts are zero.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        self.cpu_milli == 0 && self.memory_bytes == 0
    }
}

type ResourceList = BTreeMap<String, K8sQuantity>;

fn amount(
    list: Option<&ResourceList>,
    resource: &'static str,
    owner: &dyn Fn() -> String,
    field: &'static str,
) -> Result<Option<u64>, ResourceError> {
    let Some(quantity) = list.and_then(|l| l.get(resource)) else {
        return Ok(None);
    };
    let parsed = Quantity::parse(&quantity.0).and_then(|q| {
        if resource == CPU {
            q.milli_amount()
        } else {
            q.amount()
        }
    });
    parsed.map(Some).map_err(|source| ResourceError {
        owner: owner(),
        field,
        resource,
        source,
    })
}

fn requirements(
    container: &Container,
    owner: &dyn Fn() -> String,
) -> Result<ResourceRequirements, ResourceError> {
    let resources = container.resources.as_ref();
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    Ok(ResourceRequirements {
        cpu_request_milli: amount(requests, CPU, owner, "requests")?,
        cpu_limit_milli: amount(limits, CPU, owner, "limits")?,
        memory_request_bytes: amount(requests, MEMORY, owner, "requests")?,
        memory_limit_bytes: amount(limits, MEMORY, owner, "limits")?,
    })
}

/// One app container's CPU and memory requests and limits.
pub fn container_requirements(
    container: &Container,
) -> Result<ResourceRequirements, ResourceError> {
    requirements(container, &|| format!("container {:?}", container.name))
}

fn init_requirements(container: &Container) -> Result<ResourceRequirements, ResourceError> {
    requirements(container, &|| {
        format!("init container {:?}", container.name)
    })
}

/// Whether an init container is a sidecar (`restartPolicy: Always`): it keeps running beside
/// the app containers instead of finishing before them.
#[must_use]
pub fn is_restartable_init_container(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

fn effective_requests(r: &ResourceRequirements) -> ResourceAmounts {
    ResourceAmounts {
        cpu_milli: r.effective_cpu_request_milli().unwrap_or(0),
        memory_bytes: r.effective_memory_request_bytes().unwrap_or(0),
    }
}

/// The requirements of every container of `pod`, app and init, in spec order (init first).
pub fn all_container_requirements(pod: &Pod) -> Result<Vec<ResourceRequirements>, ResourceError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Vec::new());
    };
    let init = spec.init_containers.iter().flatten().map(init_requirements);
    let app = spec.containers.iter().map(container_requirements);
    init.chain(app).collect()
}

/// The pod's containers as the cgroups crate sizes them. Sidecar init containers run beside the
/// app containers, so they are listed with them; the others count by maximum.
pub fn pod_resources(pod: &Pod) -> Result<PodResources, ResourceError> {
    let mut resources = PodResources::default();
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(resources);
    };
    for container in spec.init_containers.iter().flatten() {
        let r = init_requirements(container)?;
        if is_restartable_init_container(container) {
            resources.containers.push(r);
        } else {
            resources.init_containers.push(r);
        }
    }
    for container in &spec.containers {
        resources
            .containers
            .push(container_requirements(container)?);
    }
    Ok(resources)
}

/// kubelet's `PodRequests` (component-helpers `resource.PodRequests`): what the pod asks of the
/// node, as admission and the scheduler count it.
///
/// * app containers and sidecars are summed;
/// * each other init container runs alone, beside the sidecars started before it, so the pod
///   needs at least that much: the total is the maximum of the sum and those;
/// * `spec.overhead` (set by a RuntimeClass) is added.
pub fn pod_requests(pod: &Pod) -> Result<ResourceAmounts, ResourceError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(ResourceAmounts::default());
    };
    let mut total = ResourceAmounts::default();
    for container in &spec.containers {
        total = total.add(effective_requests(&container_requirements(container)?));
    }
    let mut sidecars = ResourceAmounts::default();
    let mut init_peak = ResourceAmounts::default();
    for container in spec.init_containers.iter().flatten() {
        let requests = effective_requests(&init_requirements(container)?);
        let while_running = if is_restartable_init_container(container) {
            total = total.add(requests);
            sidecars = sidecars.add(requests);
            sidecars
        } else {
            requests.add(sidecars)
        };
        init_peak = init_peak.max(while_running);
    }
    total = total.max(init_peak);
    let overhead = spec.overhead.as_ref();
    let owner = || "pod overhead".to_owned();
    Ok(total.add(ResourceAmounts {
        cpu_milli: amount(overhead, CPU, &owner, "overhead")?.unwrap_or(0),
        memory_bytes: amount(overhead, MEMORY, &owner, "overhead")?.unwrap_or(0),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn app_container_requests_are_summed() {
        let p = pod(r#"
spec:
  containers:
  - {name: a, image: i, resources: {requests: {cpu: 100m, memory: 64Mi}}}
  - {name: b, image: i, resources: {requests: {cpu: "0.5", memory: 1Gi}}}
"#);
        assert_eq!(
            pod_requests(&p).unwrap(),
            ResourceAmounts {
                cpu_milli: 600,
                memory_bytes: (64 << 20) + (1 << 30)
            }
        );
    }

    #[test]
    fn the_largest_init_container_wins_over_a_smaller_app_sum() {
        let p = pod(r#"
spec:
  initContainers:
  - {name: i1, image: i, resources: {requests: {cpu: "2", memory: 10Mi}}}
  - {name: i2, image: i, resources: {requests: {cpu: 1, memory: 1Gi}}}
  containers:
  - {name: a, image: i, resources: {requests: {cpu: 500m, memory: 100Mi}}}
"#);
        assert_eq!(
            pod_requests(&p).unwrap(),
            ResourceAmounts {
                cpu_milli: 2000,
                memory_bytes: 1 << 30
            }
        );
    }

    #[test]
    fn sidecars_add_to_the_app_sum_and_to_later_init_containers() {
        let p = pod(r#"
spec:
  initContainers:
  - {name: side, image: i, restartPolicy: Always, resources: {requests: {cpu: 300m}}}
  - {name: setup, image: i, resources: {requests: {cpu: 1}}}
  containers:
  - {name: a, image: i, resources: {requests: {cpu: 200m}}}
"#);
        // app 200m + sidecar 300m = 500m; setup runs beside the sidecar: 1000m + 300m.
        assert_eq!(pod_requests(&p).unwrap().cpu_milli, 1300);
    }

    #[test]
    fn pod_overhead_is_added_and_unset_requests_default_to_limits() {
        let p = pod(r#"
spec:
  overhead: {cpu: 50m, memory: 1Mi}
  containers:
  - {name: a, image: i, resources: {limits: {cpu: 1, memory: 2Mi}}}
"#);
        assert_eq!(
            pod_requests(&p).unwrap(),
            ResourceAmounts {
                cpu_milli: 1050,
                memory_bytes: 3 << 20
            }
        );
    }

    #[test]
    fn a_bad_quantity_names_the_container_and_field() {
        let p =
            pod("spec: {containers: [{name: web, image: i, resources: {limits: {memory: lots}}}]}");
        let err = pod_requests(&p).unwrap_err();
        assert_eq!(err.owner, r#"container "web""#);
        assert_eq!((err.field, err.resource), ("limits", MEMORY));
        assert!(
            err.to_string()
                .starts_with(r#"container "web" limits.memory: "lots""#),
            "{err}"
        );
    }

    #[test]
    fn sidecars_are_sized_with_the_app_containers_for_cgroups() {
        let p = pod(r#"
spec:
  initContainers:
  - {name: side, image: i, restartPolicy: Always}
  - {name: setup, image: i, resources: {limits: {cpu: 1}}}
  containers:
  - {name: a, image: i, resources: {requests: {memory: 1Ki}}}
"#);
        let r = pod_resources(&p).unwrap();
        assert_eq!(r.containers.len(), 2);
        assert_eq!(r.init_containers.len(), 1);
        assert_eq!(r.init_containers[0].cpu_limit_milli, Some(1000));
        assert_eq!(r.containers[1].memory_request_bytes, Some(1024));
    }
}

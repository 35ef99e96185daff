//! Downward API resource selectors (`resourceFieldRef`): a container's request or limit,
//! divided by the selector's divisor and rounded up, as kubelet's
//! `ExtractContainerResourceValue` on a pod defaulted by `defaultPodLimitsForDownwardAPI`.
//!
//! Supported: `limits.cpu`, `requests.cpu` (millicores ÷ divisor millicores),
//! `limits.memory`, `requests.memory`, `limits.ephemeral-storage`,
//! `requests.ephemeral-storage` (bytes ÷ divisor bytes) and `limits|requests.hugepages-<size>`.
//! A CPU, memory or ephemeral-storage limit that is unset or zero reads as the node's
//! allocatable amount; an unset request reads as 0. The divisor defaults to `1`.

use k8s_openapi::api::core::v1::{Container, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::qos::{Quantity, QuantityError};

/// What the node offers pods: the value of a limit a container leaves unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allocatable {
    /// CPU, in millicores.
    pub cpu_milli: u64,
    /// Memory, in bytes.
    pub memory_bytes: u64,
    /// Ephemeral storage, in bytes (0 when unknown).
    pub ephemeral_storage_bytes: u64,
}

/// Why a resource selector has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceFieldError {
    /// A resource kubelet does not serve (the message is kubelet's, space included).
    #[error("unsupported container resource : {0}")]
    Unsupported(String),
    /// `containerName` names no container of the pod.
    #[error("container {0} not found")]
    ContainerNotFound(String),
    /// The container's quantity or the divisor is not a usable quantity.
    #[error("{resource}: {source}")]
    Quantity {
        /// The selector's resource, or `divisor`.
        resource: String,
        /// Why the quantity was rejected.
        #[source]
        source: QuantityError,
    },
}

/// The unit a resource is counted in.
#[derive(Debug, Clone, Copy)]
enum Unit {
    Millis,
    Units,
}

/// The value of `selector` for `container` (or the pod's container named by the selector).
pub fn resource_field_value(
    selector: &ResourceFieldSelector,
    pod: &Pod,
    container: Option<&Container>,
    allocatable: &Allocatable,
) -> Result<String, ResourceFieldError> {
    let container = match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => find_container(pod, name)
            .ok_or_else(|| ResourceFieldError::ContainerNotFound(name.to_owned()))?,
        None => container.ok_or_else(|| ResourceFieldError::ContainerNotFound(String::new()))?,
    };
    let unsupported = || ResourceFieldError::Unsupported(selector.resource.clone());
    let (field, name) = selector.resource.split_once('.').ok_or_else(unsupported)?;
    let (unit, default_limit) = match name {
        "cpu" => (Unit::Millis, Some(allocatable.cpu_milli)),
        "memory" => (Unit::Units, Some(allocatable.memory_bytes)),
        "ephemeral-storage" => (Unit::Units, Some(allocatable.ephemeral_storage_bytes)),
        hugepages if hugepages.starts_with("hugepages-") => (Unit::Units, None),
        _ => return Err(unsupported()),
    };
    let resources = container.resources.as_ref();
    let (quantities, is_limit) = match field {
        "limits" => (resources.and_then(|r| r.limits.as_ref()), true),
        "requests" => (resources.and_then(|r| r.requests.as_ref()), false),
        _ => return Err(unsupported()),
    };
    let declared = match quantities.and_then(|q| q.get(name)) {
        Some(q) => amount(q, unit, &selector.resource)?,
        None => 0,
    };
    let value = match default_limit {
        Some(node) if is_limit && declared == 0 => node,
        _ => declared,
    };
    let divisor = match selector.divisor.as_ref() {
        Some(d) if !parse(d, "divisor")?.is_zero() => amount(d, unit, "divisor")?,
        _ => match unit {
            Unit::Millis => 1000,
            Unit::Units => 1,
        },
    };
    // A non-zero divisor rounds up to at least one unit.
    Ok(value.div_ceil(divisor.max(1)).to_string())
}

fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

fn parse(quantity: &K8sQuantity, resource: &str) -> Result<Quantity, ResourceFieldError> {
    Quantity::parse(&quantity.0).map_err(|source| ResourceFieldError::Quantity {
        resource: resource.to_owned(),
        source,
    })
}

fn amount(quantity: &K8sQuantity, unit: Unit, resource: &str) -> Result<u64, ResourceFieldError> {
    let parsed = parse(quantity, resource)?;
    match unit {
        Unit::Millis => parsed.milli_amount(),
        Unit::Units => parsed.amount(),
    }
    .map_err(|source| ResourceFieldError::Quantity {
        resource: resource.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    use super::*;

    const NODE: Allocatable = Allocatable {
        cpu_milli: 4000,
        memory_bytes: 8 << 30,
        ephemeral_storage_bytes: 100 << 30,
    };

    fn quantities(items: &[(&str, &str)]) -> Option<BTreeMap<String, K8sQuantity>> {
        Some(
            items
                .iter()
                .map(|(k, v)| ((*k).to_owned(), K8sQuantity((*v).to_owned())))
                .collect(),
        )
    }

    fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: quantities(requests),
                limits: quantities(limits),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn pod(containers: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn value(
        c: &Container,
        resource: &str,
        divisor: Option<&str>,
    ) -> Result<String, ResourceFieldError> {
        let selector = ResourceFieldSelector {
            container_name: None,
            divisor: divisor.map(|d| K8sQuantity(d.into())),
            resource: resource.into(),
        };
        resource_field_value(&selector, &pod(vec![c.clone()]), Some(c), &NODE)
    }

    #[test]
    fn cpu_is_in_cores_rounded_up_unless_a_divisor_says_otherwise() {
        let c = container("c", &[("cpu", "250m")], &[("cpu", "1500m")]);
        assert_eq!(value(&c, "requests.cpu", None).unwrap(), "1");
        assert_eq!(value(&c, "limits.cpu", None).unwrap(), "2");
        assert_eq!(value(&c, "limits.cpu", Some("1m")).unwrap(), "1500");
        assert_eq!(value(&c, "requests.cpu", Some("100m")).unwrap(), "3");
    }

    #[test]
    fn memory_is_in_bytes_divided_and_rounded_up() {
        let c = container("c", &[("memory", "64Mi")], &[("memory", "100Mi")]);
        assert_eq!(value(&c, "requests.memory", None).unwrap(), "67108864");
        assert_eq!(value(&c, "limits.memory", Some("1Mi")).unwrap(), "100");
        assert_eq!(value(&c, "limits.memory", Some("1Gi")).unwrap(), "1");
    }

    #[test]
    fn unset_limits_read_as_node_allocatable_and_unset_requests_as_zero() {
        let c = container("c", &[], &[]);
        assert_eq!(value(&c, "limits.cpu", None).unwrap(), "4");
        assert_eq!(value(&c, "limits.memory", Some("1Gi")).unwrap(), "8");
        assert_eq!(
            value(&c, "limits.ephemeral-storage", Some("1Gi")).unwrap(),
            "100"
        );
        assert_eq!(value(&c, "requests.cpu", None).unwrap(), "0");
        assert_eq!(value(&c, "requests.memory", None).unwrap(), "0");
        let zero = container("c", &[], &[("cpu", "0")]);
        assert_eq!(value(&zero, "limits.cpu", Some("1m")).unwrap(), "4000");
    }

    #[test]
    fn a_named_container_is_looked_up_in_the_pod() {
        let other = container("other", &[("cpu", "2")], &[]);
        let me = container("me", &[], &[]);
        let selector = ResourceFieldSelector {
            container_name: Some("other".into()),
            divisor: None,
            resource: "requests.cpu".into(),
        };
        let p = pod(vec![me.clone(), other]);
        assert_eq!(
            resource_field_value(&selector, &p, Some(&me), &NODE).unwrap(),
            "2"
        );
        let missing = ResourceFieldSelector {
            container_name: Some("ghost".into()),
            ..selector
        };
        assert_eq!(
            resource_field_value(&missing, &p, Some(&me), &NODE)
                .unwrap_err()
                .to_string(),
            "container ghost not found"
        );
    }

    #[test]
    fn unknown_resources_and_negative_divisors_are_errors() {
        let c = container("c", &[], &[]);
        assert_eq!(
            value(&c, "limits.gpu", None).unwrap_err().to_string(),
            "unsupported container resource : limits.gpu"
        );
        assert!(value(&c, "cpu", None).is_err());
        assert_eq!(
            value(&c, "limits.memory", Some("1m")).unwrap(),
            (8u64 << 30).to_string()
        );
        assert!(matches!(
            value(&c, "limits.cpu", Some("-1")),
            Err(ResourceFieldError::Quantity { .. })
        ));
    }
}

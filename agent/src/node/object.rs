//! The Node object as registered: name, labels and the first status, plus the quantity
//! formatting kubelet uses for resources.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The architecture as Go (and so Kubernetes) names it: `amd64`, `arm64`, …
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// kubelet's default labels: `kubernetes.io/hostname`, `kubernetes.io/os`,
/// `kubernetes.io/arch` and their deprecated `beta.kubernetes.io/` twins.
pub fn default_labels(hostname: &str) -> BTreeMap<String, String> {
    let os = std::env::consts::OS;
    [
        ("kubernetes.io/hostname", hostname),
        ("kubernetes.io/os", os),
        ("kubernetes.io/arch", go_arch()),
        ("beta.kubernetes.io/os", os),
        ("beta.kubernetes.io/arch", go_arch()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The Node to create: our labels (defaults, then `extra`) and `status`.
pub(crate) fn initial_node(
    name: &str,
    extra: &BTreeMap<String, String>,
    status: NodeStatus,
) -> Node {
    let mut labels = default_labels(name);
    labels.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(status),
    }
}

/// CPU as Kubernetes writes it: whole cores (`2`) or millicores (`1500m`).
pub(crate) fn cpu_quantity(milli: u64) -> Quantity {
    if milli.is_multiple_of(1000) {
        Quantity((milli / 1000).to_string())
    } else {
        Quantity(format!("{milli}m"))
    }
}

/// Bytes in Kubernetes' canonical binary form: the largest of `Ki`…`Ei` dividing the value
/// exactly (`24105Mi`), else plain bytes.
pub fn memory_quantity(bytes: u64) -> Quantity {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return Quantity("0".to_owned());
    }
    let mut value = bytes;
    let mut suffix = "";
    for next in SUFFIXES {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = next;
    }
    Quantity(format!("{value}{suffix}"))
}

/// A plain count (`pods`).
pub(crate) fn integer_quantity(value: u64) -> Quantity {
    Quantity(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_written_in_cores_or_millicores() {
        assert_eq!(cpu_quantity(2000).0, "2");
        assert_eq!(cpu_quantity(1500).0, "1500m");
        assert_eq!(cpu_quantity(0).0, "0");
    }

    #[test]
    fn memory_uses_the_largest_exact_binary_suffix() {
        assert_eq!(memory_quantity(24_683_520 * 1024).0, "24105Mi");
        assert_eq!(memory_quantity(2 << 30).0, "2Gi");
        assert_eq!(memory_quantity(1023).0, "1023");
        assert_eq!(memory_quantity(1536).0, "1536");
        assert_eq!(memory_quantity(0).0, "0");
    }

    #[test]
    fn extra_labels_are_added_to_kubelets_defaults() {
        let extra = BTreeMap::from([("role".to_owned(), "edge".to_owned())]);
        let node = initial_node("n1", &extra, NodeStatus::default());
        let labels = node.metadata.labels.unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["kubernetes.io/arch"], go_arch());
        assert_eq!(labels["beta.kubernetes.io/arch"], go_arch());
        assert_eq!(labels["role"], "edge");
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
    }
}

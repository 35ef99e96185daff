//! Downward API field selectors (`fieldRef`): a pod field path → its value as a string, as
//! kubelet's `podFieldSelectorRuntimeValue` (env) and `fieldpath.ExtractFieldPathAsString`
//! (downwardAPI volume files) compute it.
//!
//! Metadata paths (both env and volumes): `metadata.name`, `metadata.namespace`,
//! `metadata.uid`, `metadata.labels`, `metadata.annotations` (the whole map as sorted
//! `key="value"` lines, values Go-quoted) and `metadata.labels['key']`,
//! `metadata.annotations['key']` (empty when absent). Env only: `spec.nodeName`,
//! `spec.serviceAccountName`, `spec.terminationGracePeriodSeconds`, `status.hostIP`,
//! `status.hostIPs`, `status.podIP`, `status.podIPs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{ObjectFieldSelector, Pod};

/// Why a field selector has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldPathError {
    /// `apiVersion` other than `v1`.
    #[error("unsupported pod version: {0}")]
    Version(String),
    /// A path kubelet does not serve (in this context).
    #[error("unsupported fieldPath: {0}")]
    Unsupported(String),
    /// `['…']` on a path that is not a map.
    #[error("fieldPath {0:?} does not support subscript")]
    Subscript(String),
}

/// The pod's network and node facts that are not in the pod object.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodRuntimeFields<'a> {
    /// The node's name, used when `spec.nodeName` is empty.
    pub node_name: &'a str,
    /// The pod's IP, if it has one yet.
    pub pod_ip: Option<&'a str>,
    /// The node's IP, if known.
    pub host_ip: Option<&'a str>,
}

/// The value of `selector` for an environment variable.
pub fn env_field_value(
    selector: &ObjectFieldSelector,
    pod: &Pod,
    runtime: &PodRuntimeFields<'_>,
) -> Result<String, FieldPathError> {
    check_version(selector)?;
    let spec = pod.spec.as_ref();
    let path = selector.field_path.as_str();
    Ok(match path {
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| runtime.node_name.to_owned()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "spec.terminationGracePeriodSeconds" => spec
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
            .to_string(),
        "status.hostIP" | "status.hostIPs" => runtime.host_ip.unwrap_or_default().to_owned(),
        "status.podIP" | "status.podIPs" => runtime.pod_ip.unwrap_or_default().to_owned(),
        _ => return metadata_field_value(pod, path),
    })
}

/// The value of `selector` for a downwardAPI volume file (metadata paths only).
pub fn volume_field_value(
    selector: &ObjectFieldSelector,
    pod: &Pod,
) -> Result<String, FieldPathError> {
    check_version(selector)?;
    metadata_field_value(pod, &selector.field_path)
}

fn check_version(selector: &ObjectFieldSelector) -> Result<(), FieldPathError> {
    match selector.api_version.as_deref() {
        None | Some("" | "v1") => Ok(()),
        Some(other) => Err(FieldPathError::Version(other.to_owned())),
    }
}

/// kubelet's `ExtractFieldPathAsString` for a pod.
fn metadata_field_value(pod: &Pod, path: &str) -> Result<String, FieldPathError> {
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    if let Some((map_path, key)) = split_subscript(path) {
        return match map_path {
            "metadata.labels" => Ok(labels.get(key).cloned().unwrap_or_default()),
            "metadata.annotations" => Ok(annotations.get(key).cloned().unwrap_or_default()),
            _ => Err(FieldPathError::Subscript(path.to_owned())),
        };
    }
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(labels),
        "metadata.annotations" => format_map(annotations),
        _ => return Err(FieldPathError::Unsupported(path.to_owned())),
    })
}

/// `path['key']` → `(path, key)`.
fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let inner = path.strip_suffix("']")?;
    let (map, key) = inner.split_once("['")?;
    (!map.is_empty()).then_some((map, key))
}

/// kubelet's `FormatMap`: `key="value"` lines in key order, no trailing newline.
#[must_use]
pub fn format_map(map: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (key, value) in map {
        if !out.is_empty() {
            out.push('\n');
        }
        let _ = write!(out, "{key}={}", go_quote(value));
    }
    out
}

/// Go's `%q` of a string: double-quoted with Go escapes, printable characters kept.
fn go_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-node1".into()),
                namespace: Some("default".into()),
                uid: Some("u-1".into()),
                labels: Some(
                    [
                        ("app".into(), "web".into()),
                        ("tier".into(), "front".into()),
                    ]
                    .into(),
                ),
                annotations: Some([("note".into(), "say \"hi\"\nbye".into())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node1".into()),
                service_account_name: Some("sa".into()),
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn selector(path: &str) -> ObjectFieldSelector {
        ObjectFieldSelector {
            api_version: None,
            field_path: path.into(),
        }
    }

    fn env(path: &str) -> Result<String, FieldPathError> {
        let runtime = PodRuntimeFields {
            node_name: "ignored",
            pod_ip: Some("10.0.0.5"),
            host_ip: Some("192.168.1.2"),
        };
        env_field_value(&selector(path), &pod(), &runtime)
    }

    #[test]
    fn env_field_paths_resolve_like_kubelet() {
        assert_eq!(env("metadata.name").unwrap(), "web-node1");
        assert_eq!(env("metadata.namespace").unwrap(), "default");
        assert_eq!(env("metadata.uid").unwrap(), "u-1");
        assert_eq!(env("metadata.labels['app']").unwrap(), "web");
        assert_eq!(env("metadata.labels['absent']").unwrap(), "");
        assert_eq!(
            env("metadata.annotations['note']").unwrap(),
            "say \"hi\"\nbye"
        );
        assert_eq!(env("spec.nodeName").unwrap(), "node1");
        assert_eq!(env("spec.serviceAccountName").unwrap(), "sa");
        assert_eq!(env("spec.terminationGracePeriodSeconds").unwrap(), "30");
        assert_eq!(env("status.podIP").unwrap(), "10.0.0.5");
        assert_eq!(env("status.podIPs").unwrap(), "10.0.0.5");
        assert_eq!(env("status.hostIP").unwrap(), "192.168.1.2");
        assert_eq!(env("status.hostIPs").unwrap(), "192.168.1.2");
    }

    #[test]
    fn whole_maps_are_sorted_go_quoted_lines() {
        assert_eq!(
            env("metadata.labels").unwrap(),
            "app=\"web\"\ntier=\"front\""
        );
        assert_eq!(
            env("metadata.annotations").unwrap(),
            "note=\"say \\\"hi\\\"\\nbye\""
        );
    }

    #[test]
    fn unsupported_paths_and_versions_are_errors() {
        assert_eq!(
            env("status.phase").unwrap_err().to_string(),
            "unsupported fieldPath: status.phase"
        );
        assert_eq!(
            env("metadata.name['x']").unwrap_err(),
            FieldPathError::Subscript("metadata.name['x']".into())
        );
        let mut versioned = selector("metadata.name");
        versioned.api_version = Some("v2".into());
        assert_eq!(
            volume_field_value(&versioned, &pod()).unwrap_err(),
            FieldPathError::Version("v2".into())
        );
    }

    #[test]
    fn volumes_serve_metadata_only() {
        assert_eq!(
            volume_field_value(&selector("metadata.name"), &pod()).unwrap(),
            "web-node1"
        );
        assert!(volume_field_value(&selector("spec.nodeName"), &pod()).is_err());
    }

    #[test]
    fn go_quoting_escapes_controls_and_keeps_unicode() {
        assert_eq!(go_quote("a\u{1}b\\é"), "\"a\\x01b\\\\é\"");
    }
}

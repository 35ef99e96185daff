//! Validation of a pod before the agent accepts it: the subset of the API server's
//! `ValidatePodCreate` that matters for running it.
//!
//! Checked (after defaulting, so names carry the node suffix):
//!
//! * `metadata.name` a DNS-1123 subdomain, `metadata.namespace` a DNS-1123 label, `metadata.uid`
//!   set;
//! * annotations at most 256 KiB in total; label keys qualified names, values label values;
//! * volume names unique DNS-1123 labels (so `..` or `a/../../b` never reach a path);
//! * at least one container; container names DNS-1123 labels, unique across init and app
//!   containers; every image non-empty;
//! * `restartPolicy` one of `Always`, `OnFailure`, `Never`; an init container's only
//!   `Always` (a sidecar);
//! * ports in 1–65535 (`hostPort` 0 means none), protocol `TCP`, `UDP` or `SCTP`;
//! * CPU and memory quantities parse, are not negative, and no request exceeds its limit;
//! * `allowPrivilegeEscalation: false` neither with `privileged: true` nor with
//!   `capabilities.add` `CAP_SYS_ADMIN` (the process could regain what `no_new_privs` takes).
//!
//! Every broken rule is reported ([`ValidationErrors`]), not just the first.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::qos::{Quantity, QuantityError, CPU, MEMORY};

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// `metadata.name` is empty.
    #[error("metadata.name is required")]
    MissingName,
    /// `metadata.name` is not a DNS-1123 subdomain.
    #[error("metadata.name {name:?} is not a DNS-1123 subdomain: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// `metadata.namespace` is not a DNS-1123 label.
    #[error("metadata.namespace {namespace:?} is not a DNS-1123 label: {reason}")]
    InvalidNamespace {
        /// The namespace.
        namespace: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// `metadata.annotations` keys and values total more than 256 KiB (apimachinery's
    /// `TotalAnnotationSizeLimitB`).
    #[error("metadata.annotations: Too long: must have at most {limit} bytes (has {size})")]
    AnnotationsTooLong {
        /// Bytes of keys and values.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A label key is not a qualified name, or its value not a label value.
    #[error("metadata.labels: Invalid value: {key:?}: {value:?}: {reason}")]
    InvalidLabel {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A volume name is not a DNS-1123 label (`..`, `a/../../b`), or is used twice.
    #[error("spec.volumes[{index}].name: Invalid value: {name:?}: {reason}")]
    InvalidVolumeName {
        /// Index in `spec.volumes`.
        index: usize,
        /// The name.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// `metadata.uid` is empty.
    #[error("metadata.uid is required")]
    MissingUid,
    /// No `spec.containers`.
    #[error("spec.containers must have at least one container")]
    NoContainers,
    /// A container name is not a DNS-1123 label.
    #[error("container name {name:?} is not a DNS-1123 label: {reason}")]
    InvalidContainerName {
        /// The name.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// Two containers (init or app) share a name.
    #[error("container name {name:?} is used more than once")]
    DuplicateContainerName {
        /// The name.
        name: String,
    },
    /// A container has no image.
    #[error("container {container:?} has no image")]
    EmptyImage {
        /// The container.
        container: String,
    },
    /// `spec.restartPolicy` is not `Always`, `OnFailure` or `Never`.
    #[error("spec.restartPolicy {policy:?} is not Always, OnFailure or Never")]
    InvalidRestartPolicy {
        /// The policy.
        policy: String,
    },
    /// An init container's `restartPolicy` is set to something other than `Always`.
    #[error("init container {container:?} restartPolicy {policy:?} must be Always or unset")]
    InvalidInitRestartPolicy {
        /// The init container.
        container: String,
        /// The policy.
        policy: String,
    },
    /// A port number is outside 1–65535.
    #[error("container {container:?} {field} {port} is not in 1-65535")]
    InvalidPort {
        /// The container.
        container: String,
        /// `containerPort` or `hostPort`.
        field: &'static str,
        /// The number.
        port: i32,
    },
    /// A port protocol is not TCP, UDP or SCTP.
    #[error("container {container:?} port protocol {protocol:?} is not TCP, UDP or SCTP")]
    InvalidProtocol {
        /// The container.
        container: String,
        /// The protocol.
        protocol: String,
    },
    /// A CPU or memory quantity does not parse or is negative.
    #[error("container {container:?} {field}.{resource}: {source}")]
    InvalidQuantity {
        /// The container.
        container: String,
        /// `requests` or `limits`.
        field: &'static str,
        /// `cpu` or `memory`.
        resource: &'static str,
        /// Why.
        #[source]
        source: QuantityError,
    },
    /// `allowPrivilegeEscalation: false` together with `privileged: true` or with
    /// `capabilities.add` `CAP_SYS_ADMIN` (the API server's `ValidateSecurityContext`).
    #[error("container {container:?} securityContext: Invalid value: cannot set `allowPrivilegeEscalation` to false and {conflict}")]
    NoEscalationConflict {
        /// The container.
        container: String,
        /// `` `privileged` to true `` or `` `capabilities.Add` CAP_SYS_ADMIN ``.
        conflict: &'static str,
    },
    /// A request is larger than the limit of the same resource.
    #[error("container {container:?} requests.{resource} {request:?} exceeds limits.{resource} {limit:?}")]
    RequestAboveLimit {
        /// The container.
        container: String,
        /// `cpu` or `memory`.
        resource: &'static str,
        /// The request as written.
        request: String,
        /// The limit as written.
        limit: String,
    },
}

/// Every rule a pod broke, in the order checked. Never empty when returned as an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, err) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{err}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}

/// Checks `pod` against the rules in the module docs.
pub fn validate_pod(pod: &Pod) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    let meta = &pod.metadata;
    match meta.name.as_deref() {
        None | Some("") => errors.push(ValidationError::MissingName),
        Some(name) => {
            if let Err(reason) = check_dns1123_subdomain(name) {
                errors.push(ValidationError::InvalidName {
                    name: name.to_owned(),
                    reason,
                });
            }
        }
    }
    if let Some(namespace) = meta.namespace.as_deref() {
        if let Err(reason) = check_dns1123_label(namespace) {
            errors.push(ValidationError::InvalidNamespace {
                namespace: namespace.to_owned(),
                reason,
            });
        }
    }
    if meta.uid.as_deref().unwrap_or_default().is_empty() {
        errors.push(ValidationError::MissingUid);
    }
    check_metadata_maps(pod, &mut errors);
    let Some(spec) = pod.spec.as_ref() else {
        errors.push(ValidationError::NoContainers);
        return finish(errors);
    };
    if spec.containers.is_empty() {
        errors.push(ValidationError::NoContainers);
    }
    if let Some(policy) = spec.restart_policy.as_deref() {
        if !matches!(policy, "Always" | "OnFailure" | "Never") {
            errors.push(ValidationError::InvalidRestartPolicy {
                policy: policy.to_owned(),
            });
        }
    }
    let mut volumes = BTreeSet::new();
    for (index, volume) in spec.volumes.iter().flatten().enumerate() {
        let reason = check_dns1123_label(&volume.name)
            .err()
            .or((!volumes.insert(volume.name.as_str())).then_some("Duplicate value"));
        if let Some(reason) = reason {
            errors.push(ValidationError::InvalidVolumeName {
                index,
                name: volume.name.clone(),
                reason,
            });
        }
    }
    let mut names = BTreeSet::new();
    for container in spec.init_containers.iter().flatten() {
        if let Some(policy) = container.restart_policy.as_deref() {
            if policy != "Always" {
                errors.push(ValidationError::InvalidInitRestartPolicy {
                    container: container.name.clone(),
                    policy: policy.to_owned(),
                });
            }
        }
        check_container(container, &mut names, &mut errors);
    }
    for container in &spec.containers {
        check_container(container, &mut names, &mut errors);
    }
    finish(errors)
}

/// apimachinery's `TotalAnnotationSizeLimitB`.
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

fn check_metadata_maps(pod: &Pod, errors: &mut Vec<ValidationError>) {
    let meta = &pod.metadata;
    let size: usize = meta
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if size > TOTAL_ANNOTATION_SIZE_LIMIT {
        errors.push(ValidationError::AnnotationsTooLong {
            size,
            limit: TOTAL_ANNOTATION_SIZE_LIMIT,
        });
    }
    for (key, value) in meta.labels.iter().flatten() {
        if let Err(reason) = check_qualified_name(key).and_then(|()| check_label_value(value)) {
            errors.push(ValidationError::InvalidLabel {
                key: key.clone(),
                value: value.clone(),
                reason,
            });
        }
    }
}

/// `[prefix/]name`: prefix a DNS-1123 subdomain, name at most 63 characters of
/// `[A-Za-z0-9_.-]` starting and ending alphanumeric (apimachinery `IsQualifiedName`).
fn check_qualified_name(value: &str) -> Result<(), &'static str> {
    let name = match value.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() {
                return Err("prefix part must be non-empty");
            }
            check_dns1123_subdomain(prefix)?;
            name
        }
        None => value,
    };
    if name.is_empty() {
        return Err("name part must be non-empty");
    }
    check_label_value(name)
}

/// At most 63 characters of `[A-Za-z0-9_.-]`, empty or starting and ending alphanumeric
/// (apimachinery `IsValidLabelValue`).
fn check_label_value(value: &str) -> Result<(), &'static str> {
    if value.len() > 63 {
        return Err("must be no more than 63 characters");
    }
    let ok = value.is_empty()
        || (value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && value
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric())
            && value
                .bytes()
                .last()
                .is_some_and(|b| b.is_ascii_alphanumeric()));
    if ok {
        Ok(())
    } else {
        Err(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
             with an alphanumeric character",
        )
    }
}

/// What the agent itself needs of an API pod, which the API server has already validated: a
/// name and a UID to key it by. Nothing stricter, so that no admitted pod is dropped.
pub fn validate_api_pod(pod: &Pod) -> Result<(), ValidationErrors> {
    let mut errors = Vec::new();
    if pod.metadata.name.as_deref().unwrap_or_default().is_empty() {
        errors.push(ValidationError::MissingName);
    }
    if pod.metadata.uid.as_deref().unwrap_or_default().is_empty() {
        errors.push(ValidationError::MissingUid);
    }
    finish(errors)
}

fn finish(errors: Vec<ValidationError>) -> Result<(), ValidationErrors> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errors))
    }
}

fn check_container(
    container: &Container,
    names: &mut BTreeSet<String>,
    errors: &mut Vec<ValidationError>,
) {
    let name = &container.name;
    if let Err(reason) = check_dns1123_label(name) {
        errors.push(ValidationError::InvalidContainerName {
            name: name.clone(),
            reason,
        });
    }
    if !names.insert(name.clone()) {
        errors.push(ValidationError::DuplicateContainerName { name: name.clone() });
    }
    if container
        .image
        .as_deref()
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        errors.push(ValidationError::EmptyImage {
            container: name.clone(),
        });
    }
    for port in container.ports.iter().flatten() {
        if !(1..=65535).contains(&port.container_port) {
            errors.push(ValidationError::InvalidPort {
                container: name.clone(),
                field: "containerPort",
                port: port.container_port,
            });
        }
        if let Some(host_port) = port.host_port.filter(|p| *p != 0) {
            if !(1..=65535).contains(&host_port) {
                errors.push(ValidationError::InvalidPort {
                    container: name.clone(),
                    field: "hostPort",
                    port: host_port,
                });
            }
        }
        if let Some(protocol) = port.protocol.as_deref() {
            if !matches!(protocol, "TCP" | "UDP" | "SCTP") {
                errors.push(ValidationError::InvalidProtocol {
                    container: name.clone(),
                    protocol: protocol.to_owned(),
                });
            }
        }
    }
    check_resources(container, errors);
    check_escalation(container, errors);
}

fn check_escalation(container: &Container, errors: &mut Vec<ValidationError>) {
    let Some(sc) = container.security_context.as_ref() else {
        return;
    };
    if sc.allow_privilege_escalation != Some(false) {
        return;
    }
    let mut conflict = |conflict| {
        errors.push(ValidationError::NoEscalationConflict {
            container: container.name.clone(),
            conflict,
        })
    };
    if sc.privileged == Some(true) {
        conflict("`privileged` to true");
    }
    let added = sc.capabilities.as_ref().and_then(|c| c.add.as_ref());
    for _ in added
        .into_iter()
        .flatten()
        .filter(|c| *c == "CAP_SYS_ADMIN")
    {
        conflict("`capabilities.Add` CAP_SYS_ADMIN");
    }
}

fn check_resources(container: &Container, errors: &mut Vec<ValidationError>) {
    let Some(resources) = container.resources.as_ref() else {
        return;
    };
    for resource in [CPU, MEMORY] {
        let mut parsed = [None, None];
        for (slot, (field, list)) in parsed.iter_mut().zip([
            ("requests", &resources.requests),
            ("limits", &resources.limits),
        ]) {
            let Some(text) = list.as_ref().and_then(|l| l.get(resource)) else {
                continue;
            };
            // The units the agent uses (millicores, bytes): negatives and overflow fail here.
            let checked = Quantity::parse(&text.0).and_then(|q| {
                if resource == CPU {
                    q.milli_amount()
                } else {
                    q.amount()
                }
            });
            match checked {
                Ok(amount) => *slot = Some((text.0.clone(), amount)),
                Err(source) => errors.push(ValidationError::InvalidQuantity {
                    container: container.name.clone(),
                    field,
                    resource,
                    source,
                }),
            }
        }
        if let [Some((request, req)), Some((limit, lim))] = parsed {
            if req > lim {
                errors.push(ValidationError::RequestAboveLimit {
                    container: container.name.clone(),
                    resource,
                    request,
                    limit,
                });
            }
        }
    }
}

/// A DNS-1123 label: at most 63 characters of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn check_dns1123_label(value: &str) -> Result<(), &'static str> {
    if value.is_empty() {
        return Err("must not be empty");
    }
    if value.len() > 63 {
        return Err("must be no more than 63 characters");
    }
    if !is_label_shaped(value) {
        return Err(if value.bytes().all(is_label_byte) {
            "must start and end with an alphanumeric character"
        } else {
            "must consist of lower case alphanumeric characters or '-'"
        });
    }
    Ok(())
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated parts of `[a-z0-9-]` that start
/// and end alphanumeric. As in apimachinery's `IsDNS1123Subdomain`, the parts have no length
/// limit of their own: a 69-character pod name is valid.
pub fn check_dns1123_subdomain(value: &str) -> Result<(), &'static str> {
    if value.len() > 253 {
        return Err("must be no more than 253 characters");
    }
    if value.split('.').all(is_label_shaped) {
        Ok(())
    } else {
        Err(
            "must consist of lower case alphanumeric characters, '-' or '.', and must start \
             and end with an alphanumeric character",
        )
    }
}

fn is_label_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn is_label_shaped(value: &str) -> bool {
    let alnum = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    value.bytes().all(is_label_byte) && alnum(value.bytes().next()) && alnum(value.bytes().last())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        let mut pod: Pod = serde_yaml::from_str(yaml).unwrap();
        pod.metadata.uid.get_or_insert_with(|| "uid-1".into());
        pod
    }

    fn errors(yaml: &str) -> Vec<ValidationError> {
        validate_pod(&pod(yaml))
            .map(|()| Vec::new())
            .unwrap_or_else(|e| e.0)
    }

    const GOOD: &str = "metadata: {name: web-node1, namespace: default}\nspec:\n  restartPolicy: Always\n  containers:\n  - name: web\n    image: nginx:1.27\n    ports: [{containerPort: 80, hostPort: 8080, protocol: TCP}]\n    resources: {requests: {cpu: 100m}, limits: {cpu: 1, memory: 1Gi}}\n";

    #[test]
    fn a_well_formed_pod_passes() {
        assert_eq!(errors(GOOD), []);
    }

    #[test]
    fn names_must_be_dns_1123() {
        assert_eq!(
            errors(&GOOD.replace("web-node1", "Web_1")),
            [ValidationError::InvalidName {
                name: "Web_1".into(),
                reason: "must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            }]
        );
        assert!(matches!(
            errors(&GOOD.replace("namespace: default", "namespace: a.b"))[..],
            [ValidationError::InvalidNamespace { .. }]
        ));
        assert_eq!(
            errors(&GOOD.replace("name: web-node1, ", "")),
            [ValidationError::MissingName]
        );
        assert_eq!(
            check_dns1123_label(&"a".repeat(64)),
            Err("must be no more than 63 characters")
        );
        assert_eq!(check_dns1123_subdomain("kube-apiserver.node-1"), Ok(()));
        // apimachinery: only the whole subdomain is length-limited, not its parts.
        assert_eq!(check_dns1123_subdomain(&"a".repeat(69)), Ok(()));
        assert!(check_dns1123_subdomain(&"a".repeat(254)).is_err());
        assert!(check_dns1123_subdomain("a..b").is_err());
    }

    #[test]
    fn annotations_labels_and_volume_names_are_checked_as_the_api_server_does() {
        let mut p = pod(GOOD);
        let big = "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT);
        p.metadata.annotations = Some([("a".to_owned(), big)].into());
        p.metadata.labels = Some([("app/".to_owned(), "ok".to_owned())].into());
        let spec = p.spec.as_mut().unwrap();
        spec.volumes = Some(
            ["..", "a/../../b", "data", "data"]
                .map(|name| k8s_openapi::api::core::v1::Volume {
                    name: name.into(),
                    ..Default::default()
                })
                .into(),
        );
        let errs = validate_pod(&p).unwrap_err().0;
        assert!(
            matches!(
                errs[..],
                [
                    ValidationError::AnnotationsTooLong { size: 262_145, .. },
                    ValidationError::InvalidLabel { .. },
                    ValidationError::InvalidVolumeName { index: 0, .. },
                    ValidationError::InvalidVolumeName { index: 1, .. },
                    ValidationError::InvalidVolumeName {
                        index: 3,
                        reason: "Duplicate value",
                        ..
                    },
                ]
            ),
            "{errs:?}"
        );
        assert_eq!(check_qualified_name("example.com/my-app_1.x"), Ok(()));
        assert_eq!(check_label_value(""), Ok(()));
    }

    #[test]
    fn a_pod_needs_a_uid_and_a_container() {
        let mut p = pod("metadata: {name: a}\nspec: {containers: []}\n");
        p.metadata.uid = None;
        assert_eq!(
            validate_pod(&p).unwrap_err().0,
            [ValidationError::MissingUid, ValidationError::NoContainers]
        );
        assert_eq!(
            errors("metadata: {name: a}\n"),
            [ValidationError::NoContainers]
        );
    }

    #[test]
    fn container_names_must_be_unique_across_init_and_app_containers() {
        let yaml = "metadata: {name: a}\nspec:\n  initContainers: [{name: web, image: x}]\n  containers: [{name: web, image: y}]\n";
        assert_eq!(
            errors(yaml),
            [ValidationError::DuplicateContainerName { name: "web".into() }]
        );
    }

    #[test]
    fn every_container_needs_an_image() {
        assert_eq!(
            errors("metadata: {name: a}\nspec: {containers: [{name: c}]}\n"),
            [ValidationError::EmptyImage {
                container: "c".into()
            }]
        );
    }

    #[test]
    fn restart_policies_are_checked() {
        assert_eq!(
            errors(&GOOD.replace("restartPolicy: Always", "restartPolicy: Sometimes")),
            [ValidationError::InvalidRestartPolicy {
                policy: "Sometimes".into()
            }]
        );
        let yaml = "metadata: {name: a}\nspec:\n  initContainers: [{name: i, image: x, restartPolicy: Never}]\n  containers: [{name: c, image: y}]\n";
        assert!(matches!(
            errors(yaml)[..],
            [ValidationError::InvalidInitRestartPolicy { .. }]
        ));
    }

    #[test]
    fn ports_must_be_in_range_with_a_known_protocol() {
        let yaml = GOOD
            .replace("containerPort: 80", "containerPort: 0")
            .replace("hostPort: 8080", "hostPort: 70000")
            .replace("protocol: TCP", "protocol: HTTP");
        assert_eq!(
            errors(&yaml),
            [
                ValidationError::InvalidPort {
                    container: "web".into(),
                    field: "containerPort",
                    port: 0
                },
                ValidationError::InvalidPort {
                    container: "web".into(),
                    field: "hostPort",
                    port: 70000
                },
                ValidationError::InvalidProtocol {
                    container: "web".into(),
                    protocol: "HTTP".into()
                },
            ]
        );
        assert_eq!(errors(&GOOD.replace("hostPort: 8080", "hostPort: 0")), []);
    }

    #[test]
    fn quantities_must_parse_be_non_negative_and_requests_stay_within_limits() {
        let bad = errors(
            &GOOD
                .replace("cpu: 100m", "cpu: lots")
                .replace("memory: 1Gi", "memory: -1"),
        );
        assert!(
            matches!(
                bad[..],
                [
                    ValidationError::InvalidQuantity {
                        field: "requests",
                        resource: "cpu",
                        source: QuantityError::Malformed { .. },
                        ..
                    },
                    ValidationError::InvalidQuantity {
                        field: "limits",
                        resource: "memory",
                        source: QuantityError::Negative { .. },
                        ..
                    },
                ]
            ),
            "{bad:?}"
        );
        assert_eq!(
            errors(&GOOD.replace("cpu: 100m", "cpu: 1500m")),
            [ValidationError::RequestAboveLimit {
                container: "web".into(),
                resource: "cpu",
                request: "1500m".into(),
                limit: "1".into(),
            }]
        );
    }

    #[test]
    fn no_escalation_conflicts_with_privileged_and_cap_sys_admin() {
        let with = |sc: &str| {
            errors(&GOOD.replace(
                "    image: nginx:1.27\n",
                &format!("    image: nginx:1.27\n    securityContext: {sc}\n"),
            ))
        };
        let conflict = |conflict| ValidationError::NoEscalationConflict {
            container: "web".into(),
            conflict,
        };
        assert_eq!(
            with("{allowPrivilegeEscalation: false, privileged: true}"),
            [conflict("`privileged` to true")]
        );
        assert_eq!(
            with("{allowPrivilegeEscalation: false, capabilities: {add: [NET_ADMIN, CAP_SYS_ADMIN]}}"),
            [conflict("`capabilities.Add` CAP_SYS_ADMIN")]
        );
        let both = with("{allowPrivilegeEscalation: false, privileged: true, capabilities: {add: [CAP_SYS_ADMIN]}}");
        assert_eq!(both.len(), 2, "{both:?}");
        assert!(both[0]
            .to_string()
            .contains("cannot set `allowPrivilegeEscalation` to false and `privileged` to true"));
        // Escalation allowed (or unset), or no CAP_SYS_ADMIN: nothing to refuse.
        assert_eq!(
            with("{allowPrivilegeEscalation: true, privileged: true}"),
            []
        );
        assert_eq!(
            with("{privileged: true, capabilities: {add: [CAP_SYS_ADMIN]}}"),
            []
        );
        assert_eq!(
            with("{allowPrivilegeEscalation: false, capabilities: {add: [NET_ADMIN]}}"),
            []
        );
    }

    #[test]
    fn all_broken_rules_are_reported_joined() {
        let err = validate_pod(&pod(
            "metadata: {name: A}\nspec: {containers: [{name: c}]}\n",
        ))
        .unwrap_err();
        assert_eq!(err.0.len(), 2);
        assert!(
            err.to_string().contains("; container \"c\" has no image"),
            "{err}"
        );
    }
}

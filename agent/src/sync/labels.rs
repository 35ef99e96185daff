//! The labels and annotations the agent puts on every container it creates, and their typed
//! reading back — kubelet's `kuberuntime/labels.go`.
//!
//! ```text
//!  labels:       io.kubernetes.pod.{name,namespace,uid}, io.kubernetes.container.{name,type}
//!  annotations:  io.kubernetes.container.{hash,restartCount,terminationMessagePath,
//!                terminationMessagePolicy,preStopHandler}, io.kubernetes.pod.terminationGracePeriod
//! ```
//!
//! They make a container self-describing: after an agent restart, or for a container whose
//! pod is gone from the config, the agent still knows which spec it ran (the hash), its
//! restart count, where its termination message lives and which preStop hook and grace
//! period to honour when killing it.
//!
//! Guarantees: [`ContainerLabels::parse`] reads back exactly what [`container_labels`] and
//! [`container_annotations`] wrote; a missing required key or an unparsable value is a typed
//! [`LabelError`] naming the container and the key — never a silent default.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use ironlet_runtime::types::{ContainerId, ContainerStatus};
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use super::hash::container_hash;
use crate::config::DEFAULT_TERMINATION_MESSAGE_PATH;

/// Label: the pod's name.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// Label: the pod's namespace.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label: the pod's UID.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// Label: the container's name in the pod spec.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Label: `init` for init containers (sidecars included), `regular` otherwise.
pub const CONTAINER_TYPE: &str = "io.kubernetes.container.type";
/// Annotation: [`container_hash`] of the spec the container was created from.
pub const HASH: &str = "io.kubernetes.container.hash";
/// Annotation: the container's restart count (equal to its runtime `attempt`).
pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Annotation: `terminationMessagePath`.
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// Annotation: `terminationMessagePolicy`.
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
/// Annotation: the pod's grace period in seconds, when the pod sets one.
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Annotation: the container's `lifecycle.preStop` handler as JSON, when it has one.
pub const PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";

/// Whether a container is one of the pod's init containers or a regular one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerType {
    /// From `spec.initContainers`, sidecars (`restartPolicy: Always`) included.
    Init,
    /// From `spec.containers`.
    Regular,
    /// From `spec.ephemeralContainers`.
    Ephemeral,
}

impl ContainerType {
    /// The value of the [`CONTAINER_TYPE`] label.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::Regular => "regular",
            Self::Ephemeral => "ephemeral",
        }
    }
}

impl FromStr for ContainerType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "init" => Ok(Self::Init),
            "regular" => Ok(Self::Regular),
            "ephemeral" => Ok(Self::Ephemeral),
            other => Err(format!(
                "expected init, regular or ephemeral, got {other:?}"
            )),
        }
    }
}

/// Where the termination message comes from (`v1.TerminationMessagePolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TerminationMessagePolicy {
    /// Only the file at the termination message path (the API default).
    #[default]
    File,
    /// The file, or the tail of the log when the file is empty and the container failed.
    FallbackToLogsOnError,
}

impl TerminationMessagePolicy {
    /// The API spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "File",
            Self::FallbackToLogsOnError => "FallbackToLogsOnError",
        }
    }
}

impl FromStr for TerminationMessagePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "File" => Ok(Self::File),
            "FallbackToLogsOnError" => Ok(Self::FallbackToLogsOnError),
            other => Err(format!(
                "expected File or FallbackToLogsOnError, got {other:?}"
            )),
        }
    }
}

impl fmt::Display for TerminationMessagePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Writing or reading container labels failed.
#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    /// The preStop handler of a container could not be encoded as JSON.
    #[error("encoding the preStop handler of container {container}: {source}")]
    EncodePreStop {
        container: String,
        #[source]
        source: serde_json::Error,
    },
    /// A required label or annotation is absent.
    #[error("container {id}: {key} is missing")]
    Missing { id: ContainerId, key: &'static str },
    /// A label or annotation holds a value that does not parse.
    #[error("container {id}: {key}={value:?} is garbled: {reason}")]
    Garbled {
        id: ContainerId,
        key: &'static str,
        value: String,
        reason: String,
    },
}

/// The labels of a new container (kubelet `newContainerLabels`), for `ContainerConfig::labels`.
#[must_use]
pub fn container_labels(
    pod: &Pod,
    container_name: &str,
    container_type: ContainerType,
) -> BTreeMap<String, String> {
    let meta = &pod.metadata;
    BTreeMap::from([
        (POD_NAME.to_owned(), meta.name.clone().unwrap_or_default()),
        (
            POD_NAMESPACE.to_owned(),
            meta.namespace.clone().unwrap_or_default(),
        ),
        (POD_UID.to_owned(), meta.uid.clone().unwrap_or_default()),
        (CONTAINER_NAME.to_owned(), container_name.to_owned()),
        (
            CONTAINER_TYPE.to_owned(),
            container_type.as_str().to_owned(),
        ),
    ])
}

/// The annotations of a new container (kubelet `newContainerAnnotations`), for
/// `ContainerConfig::annotations`. The grace period is the pod's deletion grace period when
/// it is being deleted, else its `terminationGracePeriodSeconds`, and absent when neither is set.
pub fn container_annotations(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
) -> Result<BTreeMap<String, String>, LabelError> {
    let mut annotations = BTreeMap::from([
        (HASH.to_owned(), container_hash(container)),
        (RESTART_COUNT.to_owned(), restart_count.to_string()),
        (
            TERMINATION_MESSAGE_PATH.to_owned(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_PATH.to_owned()),
        ),
        (
            TERMINATION_MESSAGE_POLICY.to_owned(),
            container
                .termination_message_policy
                .clone()
                .unwrap_or_else(|| TerminationMessagePolicy::File.as_str().to_owned()),
        ),
    ]);
    let grace = pod.metadata.deletion_grace_period_seconds.or_else(|| {
        pod.spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
    });
    if let Some(grace) = grace {
        annotations.insert(POD_TERMINATION_GRACE_PERIOD.to_owned(), grace.to_string());
    }
    if let Some(pre_stop) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
    {
        let json = serde_json::to_string(pre_stop).map_err(|source| LabelError::EncodePreStop {
            container: container.name.clone(),
            source,
        })?;
        annotations.insert(PRE_STOP_HANDLER.to_owned(), json);
    }
    Ok(annotations)
}

/// What a container's labels and annotations say about it (kubelet `labeledContainerInfo` +
/// `annotatedContainerInfo`).
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerLabels {
    pub name: String,
    pub container_type: ContainerType,
    pub hash: String,
    pub restart_count: u32,
    pub termination_message_path: String,
    pub termination_message_policy: TerminationMessagePolicy,
    pub pre_stop: Option<LifecycleHandler>,
    /// Seconds, as the pod set it when the container was created.
    pub grace_period: Option<i64>,
}

impl ContainerLabels {
    /// Reads the labels and annotations of a runtime container.
    pub fn from_status(status: &ContainerStatus) -> Result<Self, LabelError> {
        Self::parse(&status.id, &status.labels, &status.annotations)
    }

    /// Reads `labels` and `annotations` of container `id`.
    pub fn parse(
        id: &ContainerId,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Self, LabelError> {
        let required = |map: &BTreeMap<String, String>, key: &'static str| {
            map.get(key).cloned().ok_or_else(|| LabelError::Missing {
                id: id.clone(),
                key,
            })
        };
        Ok(Self {
            name: required(labels, CONTAINER_NAME)?,
            container_type: parse_value(id, CONTAINER_TYPE, &required(labels, CONTAINER_TYPE)?)?,
            hash: required(annotations, HASH)?,
            restart_count: parse_value(id, RESTART_COUNT, &required(annotations, RESTART_COUNT)?)?,
            termination_message_path: required(annotations, TERMINATION_MESSAGE_PATH)?,
            termination_message_policy: parse_value(
                id,
                TERMINATION_MESSAGE_POLICY,
                &required(annotations, TERMINATION_MESSAGE_POLICY)?,
            )?,
            pre_stop: annotations
                .get(PRE_STOP_HANDLER)
                .map(|json| {
                    serde_json::from_str(json).map_err(|e| garbled(id, PRE_STOP_HANDLER, json, e))
                })
                .transpose()?,
            grace_period: annotations
                .get(POD_TERMINATION_GRACE_PERIOD)
                .map(|v| parse_value(id, POD_TERMINATION_GRACE_PERIOD, v))
                .transpose()?,
        })
    }

    /// Whether the container is an init container (a sidecar included).
    #[must_use]
    pub fn is_init(&self) -> bool {
        self.container_type == ContainerType::Init
    }
}

fn parse_value<T>(id: &ContainerId, key: &'static str, value: &str) -> Result<T, LabelError>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    value.parse().map_err(|e| garbled(id, key, value, e))
}

fn garbled(
    id: &ContainerId,
    key: &'static str,
    value: &str,
    reason: impl fmt::Display,
) -> LabelError {
    LabelError::Garbled {
        id: id.clone(),
        key,
        value: value.to_owned(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ExecAction, Lifecycle, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(grace: Option<i64>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-node1".into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                termination_grace_period_seconds: grace,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn with_pre_stop() -> Container {
        Container {
            name: "app".into(),
            image: Some("busybox".into()),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            lifecycle: Some(Lifecycle {
                pre_stop: Some(LifecycleHandler {
                    exec: Some(ExecAction {
                        command: Some(vec!["sh".into(), "-c".into(), "sleep 1".into()]),
                    }),
                    ..LifecycleHandler::default()
                }),
                ..Lifecycle::default()
            }),
            ..Container::default()
        }
    }

    fn id() -> ContainerId {
        ContainerId::parse("c1").expect("valid id")
    }

    #[test]
    fn written_labels_read_back_to_the_same_values() {
        let pod = pod(Some(45));
        let container = with_pre_stop();
        let labels = container_labels(&pod, "app", ContainerType::Init);
        let annotations = container_annotations(&pod, &container, 3).expect("annotations");
        assert_eq!(labels[POD_NAME], "web-node1");
        assert_eq!(labels[POD_NAMESPACE], "default");
        assert_eq!(labels[POD_UID], "uid-1");

        let parsed = ContainerLabels::parse(&id(), &labels, &annotations).expect("parses");
        assert_eq!(
            parsed,
            ContainerLabels {
                name: "app".into(),
                container_type: ContainerType::Init,
                hash: container_hash(&container),
                restart_count: 3,
                termination_message_path: "/dev/termination-log".into(),
                termination_message_policy: TerminationMessagePolicy::FallbackToLogsOnError,
                pre_stop: container.lifecycle.and_then(|l| l.pre_stop),
                grace_period: Some(45),
            }
        );
        assert!(parsed.is_init());
    }

    #[test]
    fn deletion_grace_period_wins_over_the_spec_and_absent_values_stay_absent() {
        let mut deleting = pod(Some(30));
        deleting.metadata.deletion_grace_period_seconds = Some(5);
        let plain = Container {
            name: "app".into(),
            ..Container::default()
        };
        let annotations = container_annotations(&deleting, &plain, 0).expect("annotations");
        assert_eq!(annotations[POD_TERMINATION_GRACE_PERIOD], "5");
        assert!(!annotations.contains_key(PRE_STOP_HANDLER));

        let annotations = container_annotations(&pod(None), &plain, 0).expect("annotations");
        assert!(!annotations.contains_key(POD_TERMINATION_GRACE_PERIOD));
        let labels = container_labels(&pod(None), "app", ContainerType::Regular);
        let parsed = ContainerLabels::parse(&id(), &labels, &annotations).expect("parses");
        assert_eq!(parsed.grace_period, None);
        assert_eq!(parsed.pre_stop, None);
        assert_eq!(
            parsed.termination_message_policy,
            TerminationMessagePolicy::File
        );
        assert!(!parsed.is_init());
    }

    #[test]
    fn a_missing_hash_is_an_error_naming_the_key_and_container() {
        let pod = pod(None);
        let labels = container_labels(&pod, "app", ContainerType::Regular);
        let mut annotations = container_annotations(&pod, &with_pre_stop(), 0).expect("ok");
        annotations.remove(HASH);
        let err = ContainerLabels::parse(&id(), &labels, &annotations).expect_err("missing");
        assert!(
            matches!(&err, LabelError::Missing { key: HASH, id } if id.as_str() == "c1"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "container c1: io.kubernetes.container.hash is missing"
        );
    }

    #[test]
    fn garbled_values_are_errors_naming_the_key_and_value() {
        let pod = pod(Some(30));
        let labels = container_labels(&pod, "app", ContainerType::Regular);
        let good = container_annotations(&pod, &with_pre_stop(), 0).expect("ok");
        for (key, value) in [
            (RESTART_COUNT, "-1"),
            (TERMINATION_MESSAGE_POLICY, "Sometimes"),
            (POD_TERMINATION_GRACE_PERIOD, "soon"),
            (PRE_STOP_HANDLER, "{not json"),
        ] {
            let mut annotations = good.clone();
            annotations.insert(key.to_owned(), value.to_owned());
            let err = ContainerLabels::parse(&id(), &labels, &annotations).expect_err(key);
            assert!(
                matches!(&err, LabelError::Garbled { key: k, value: v, .. } if *k == key && v == value),
                "{err:?}"
            );
        }
        let mut bad_type = labels.clone();
        bad_type.insert(CONTAINER_TYPE.to_owned(), "sidecar".to_owned());
        assert!(matches!(
            ContainerLabels::parse(&id(), &bad_type, &good),
            Err(LabelError::Garbled {
                key: CONTAINER_TYPE,
                ..
            })
        ));
    }
}

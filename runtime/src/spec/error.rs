//! The one error type of spec generation.
//!
//! Variants are grouped as elsewhere in the crate: bad input first (each names the field of
//! [`ContainerConfig`](crate::types::ContainerConfig), [`ImageConfig`](crate::types::ImageConfig)
//! or [`SpecInputs`](super::SpecInputs) it came from and the offending value), then the steps
//! that can fail on a correct input (reading the rootfs, the profile file, the host, writing the
//! bundle). All of them map to the kubelet reason `CreateContainerConfigError`.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    // ---- bad input ----
    #[error(
        "container {container:?} has no command: neither command/args nor the image's \
         entrypoint/cmd give one"
    )]
    NoCommand { container: String },
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidValue {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidUser {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("{field} names user {name:?}, which is not in the image's /etc/passwd")]
    UnknownUser { field: &'static str, name: String },
    #[error("{field} names group {name:?}, which is not in the image's /etc/group")]
    UnknownGroup { field: &'static str, name: String },
    #[error(
        "{field} {id} is not mapped by the container's user namespace (it maps container \
         ids {mapped}; rootless, ids beyond 0 come from the user's /etc/subuid and /etc/subgid \
         ranges)"
    )]
    UnmappedId {
        field: &'static str,
        id: u32,
        mapped: String,
    },
    #[error("{field} names unknown capability {name:?}")]
    UnknownCapability { field: &'static str, name: String },
    #[error("invalid mount {field} {path:?}: {reason}")]
    InvalidMount {
        field: &'static str,
        path: String,
        reason: &'static str,
    },
    #[error("{kind} namespace path {path:?} must be absolute")]
    InvalidNamespacePath { kind: &'static str, path: PathBuf },
    #[error("invalid user namespace: {reason}")]
    InvalidUserNamespace { reason: &'static str },
    #[error("seccomp profile path {path:?} must be absolute")]
    InvalidSeccompProfilePath { path: PathBuf },

    // ---- failed steps ----
    #[error("root filesystem {path:?} is not a directory")]
    RootfsNotADirectory { path: PathBuf },
    #[error("reading {path:?} from the root filesystem: {source}")]
    ReadRootfsFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading seccomp profile {path:?}: {source}")]
    ReadSeccompProfile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("seccomp profile {path:?} is not a valid OCI LinuxSeccomp document: {source}")]
    ParseSeccompProfile {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("listing host devices under {path:?} for a privileged container: {source}")]
    ReadHostDevices {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("assembling the spec's {part}: {source}")]
    Assemble {
        part: &'static str,
        #[source]
        source: oci_spec::OciSpecError,
    },
    #[error("serializing the spec: {source}")]
    Serialize {
        #[source]
        source: serde_json::Error,
    },
    #[error("writing bundle config {path:?}: {source}")]
    WriteBundle {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SpecError {
    pub(crate) fn invalid(
        field: &'static str,
        value: impl Into<String>,
        reason: &'static str,
    ) -> Self {
        Self::InvalidValue {
            field,
            value: value.into(),
            reason,
        }
    }

    pub(crate) fn assemble(part: &'static str) -> impl FnOnce(oci_spec::OciSpecError) -> Self {
        move |source| Self::Assemble { part, source }
    }
}

//! The volume manager's errors. Messages of [`SetUpError`] are kubelet's where kubelet has
//! one, so `MountVolume.SetUp failed for volume "cfg" : configmap "cfg" not found` reads the
//! same in a FailedMount event as it does with kubelet.

use std::io;
use std::path::PathBuf;

use nix::errno::Errno;

use crate::env::{FieldPathError, MissingVariables, ResourceFieldError};
use crate::objects::ObjectError;
use crate::qos::QuantityError;

/// What went wrong setting up, mounting or tearing down a pod's volumes.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The pod has no `metadata.uid`.
    #[error("pod has no UID")]
    MissingUid,
    /// The pod UID cannot name a directory (empty, `.`, `..` or containing `/`).
    #[error("pod UID {uid:?} cannot name a directory")]
    InvalidUid {
        /// The UID.
        uid: String,
    },
    /// The pod's volume directories could not be created.
    #[error("creating pod directory {}: {source}", path.display())]
    PodDirectory {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// One volume could not be set up (kubelet's FailedMount event message).
    #[error("MountVolume.SetUp failed for volume {volume:?} : {source}")]
    SetUp {
        /// The volume's name in the pod.
        volume: String,
        /// Why.
        #[source]
        source: SetUpError,
    },
    /// A container mounts a volume the pod does not declare (or that is not set up).
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    VolumeNotFound {
        /// The volume mount's name.
        volume: String,
        /// The container.
        container: String,
    },
    /// A volume mount's subPath cannot be used.
    #[error(
        "failed to prepare subPath for volumeMount {mount:?} of container {container:?}: {source}"
    )]
    SubPath {
        /// The container.
        container: String,
        /// The volume mount's name.
        mount: String,
        /// Why.
        #[source]
        source: SubPathError,
    },
    /// A mount under the pod's directory could not be unmounted.
    #[error("unmounting {}: {source}", path.display())]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        source: Errno,
    },
    /// A mount is still present after unmounting; the directory is left in place so that
    /// nothing behind the mount is deleted.
    #[error("{} is still mounted; not removing the pod's volumes", path.display())]
    StillMounted {
        /// The mount point.
        path: PathBuf,
    },
    /// Removing the pod's volume directories failed.
    #[error("removing {}: {source}", path.display())]
    Remove {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `/proc/self/mountinfo` could not be read.
    #[error("reading the mount table: {source}")]
    MountTable {
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The blocking filesystem task did not complete.
    #[error("volume task failed: {reason}")]
    Task {
        /// What the task runtime reported.
        reason: String,
    },
}

impl VolumeError {
    /// The kubelet reason to report: `CreateContainerConfigError` for a container's mounts
    /// (kubelet fails `GenerateRunContainerOptions` with them), `FailedMount` otherwise.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::VolumeNotFound { .. } | Self::SubPath { .. } => "CreateContainerConfigError",
            _ => "FailedMount",
        }
    }
}

/// Why one volume could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetUpError {
    /// A non-optional ConfigMap does not exist.
    #[error("configmap {name:?} not found")]
    ConfigMapNotFound {
        /// Its name.
        name: String,
    },
    /// A non-optional Secret does not exist.
    #[error("secret {name:?} not found")]
    SecretNotFound {
        /// Its name.
        name: String,
    },
    /// Looking up a ConfigMap or Secret failed (not: it does not exist).
    #[error("getting {kind} {name:?}: {source}")]
    Lookup {
        /// `configmap`, `secret` or `serviceaccount token`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Why.
        #[source]
        source: ObjectError,
    },
    /// An item names a key the ConfigMap lacks.
    #[error("configmap references non-existent config key: {key}")]
    ConfigMapKey {
        /// The key.
        key: String,
    },
    /// An item names a key the Secret lacks.
    #[error("references non-existent secret key: {key}")]
    SecretKey {
        /// The key.
        key: String,
    },
    /// A file path of the volume's payload is unusable.
    #[error("invalid path: {reason}: {path}")]
    InvalidPath {
        /// The path.
        path: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A downwardAPI `fieldRef` has no value.
    #[error(transparent)]
    FieldPath(#[from] FieldPathError),
    /// A downwardAPI `resourceFieldRef` has no value.
    #[error(transparent)]
    ResourceField(#[from] ResourceFieldError),
    /// The hostPath is not an absolute path without `..`.
    #[error("invalid HostPath `{path}`: {reason}")]
    InvalidHostPath {
        /// The path.
        path: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// The hostPath `type` is not one Kubernetes defines.
    #[error("{type_} is an invalid volume type")]
    InvalidHostPathType {
        /// The type.
        type_: String,
    },
    /// The hostPath does not exist (and the type does not create it).
    #[error("hostPath {path} doesn't exist")]
    HostPathMissing {
        /// The path.
        path: String,
    },
    /// The hostPath exists with another type than required.
    #[error("hostPath type check failed: {path} is not a {expected}, it's a {actual}")]
    HostPathType {
        /// The path.
        path: String,
        /// What the volume requires (`directory`, `socket file`…).
        expected: &'static str,
        /// What it is (`Directory`, `File`…).
        actual: &'static str,
    },
    /// The hostPath's type could not be determined (e.g. a FIFO, or stat failed).
    #[error("hostPath type check failed, {path} is not a {expected}, unable to determine its type: {reason}")]
    HostPathUnknownType {
        /// The path.
        path: String,
        /// What the volume requires.
        expected: &'static str,
        /// Why the type is unknown.
        reason: String,
    },
    /// The emptyDir `sizeLimit` is not a quantity.
    #[error("emptyDir sizeLimit: {0}")]
    SizeLimit(#[source] QuantityError),
    /// A directory or file could not be created.
    #[error("creating {}: {source}", path.display())]
    Create {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Giving the volume to the pod's `fsGroup` (group owner, mode) failed.
    #[error("setting the fsGroup ownership of {}: {source}", path.display())]
    Ownership {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Writing the volume's files failed.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Mounting the volume's tmpfs failed.
    #[error("mounting tmpfs on {}: {source}", path.display())]
    MountTmpfs {
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        source: Errno,
    },
    /// `/proc/self/mountinfo` could not be read.
    #[error("reading the mount table: {source}")]
    MountTable {
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A volume type ironlet does not implement (persistentVolumeClaim, csi, nfs…).
    #[error("volume type {kind} is not supported by ironlet")]
    Unsupported {
        /// The volume source's field name.
        kind: String,
    },
}

/// Why a volume mount's subPath cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    /// The subPath is absolute.
    #[error("error SubPath `{0}` must not be an absolute path")]
    Absolute(String),
    /// The subPath contains a `..` component.
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    Backsteps(String),
    /// The subPathExpr references unset variables.
    #[error(transparent)]
    Expand(#[from] MissingVariables),
    /// The subPath leaves the volume (through a symlink or a mount).
    #[error("subPath {sub_path:?} resolves outside volume {}", volume.display())]
    Escapes {
        /// The subPath.
        sub_path: String,
        /// The volume's directory.
        volume: PathBuf,
    },
    /// The volume's directory cannot be opened.
    #[error("opening volume {}: {source}", path.display())]
    OpenVolume {
        /// The volume's directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: Errno,
    },
    /// A component of the subPath cannot be opened or created.
    #[error("{step} {sub_path:?} in volume {}: {source}", volume.display())]
    Resolve {
        /// `opening` or `creating`.
        step: &'static str,
        /// The subPath (up to the failing component).
        sub_path: String,
        /// The volume's directory.
        volume: PathBuf,
        /// Why.
        #[source]
        source: Errno,
    },
    /// The bind mount target could not be prepared.
    #[error("preparing bind target {}: {source}", target.display())]
    Target {
        /// The target.
        target: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The bind mount failed.
    #[error("bind-mounting onto {}: {source}", target.display())]
    Bind {
        /// The target.
        target: PathBuf,
        /// Why.
        #[source]
        source: Errno,
    },
}

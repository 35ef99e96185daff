//! Pod volumes on the node: materialised under the agent's root directory in kubelet's layout,
//! turned into container bind mounts, and removed when the pod is gone.
//!
//! ```text
//! <root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>/      emptyDir (tmpfs if Memory)
//!                           kubernetes.io~configmap/<name>/       configMap (atomic writer)
//!                           kubernetes.io~secret/<name>/          secret (on tmpfs)
//!                           kubernetes.io~downward-api/<name>/    downwardAPI (on tmpfs)
//!                           kubernetes.io~projected/<name>/       projected (on tmpfs)
//! <root>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>  subPath bind mounts
//! hostPath volumes are used in place (type-checked, never modified or removed).
//! ```
//!
//! Where to start: [`VolumeManager::setup_pod_volumes`] (called on every pod sync before
//! containers start; idempotent: directories and tmpfs mounts are created once, file contents
//! of configMap/secret/downwardAPI/projected volumes are refreshed when they changed),
//! [`container_mounts`] (a container's `volumeMounts` → runtime `Mount`s), and
//! [`VolumeManager::teardown_pod_volumes`] (after the pod's containers are gone).
//!
//! Guarantees:
//! * teardown unmounts every mount under the pod's `volumes` and `volume-subpaths`
//!   directories (busy ones lazily) and removes those directories only when nothing is mounted
//!   there any more, without following symlinks: hostPath contents and anything else outside
//!   the pod's directory are never deleted;
//! * configMap, secret, downwardAPI and projected volumes are mounted read-only into
//!   containers whatever the volumeMount says (kubelet does the same);
//! * calls for one pod must not overlap (the pod worker serialises them); different pods are
//!   independent.
//!
//! Current behaviour: an emptyDir `sizeLimit` on disk is recorded in [`VolumeInfo`] and
//! enforced by eviction ([`crate::kubelet::eviction`]), not here; a Memory emptyDir's tmpfs is sized as kubelet's
//! `calculateEmptyDirMemorySize` (the smallest of node allocatable memory, the pod's memory
//! limit when every container has one, and `sizeLimit`); `fsGroup` ownership,
//! `mountPropagation` and `recursiveReadOnly` are not applied; PVC, CSI, image and other
//! network volumes are refused as unsupported.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::env::Allocatable;
use crate::objects::ObjectSource;

mod atomic_writer;
mod error;
mod host_path;
mod mount_table;
mod mounts;
mod payload;
mod setup;
mod subpath;
mod teardown;

pub use error::{SetUpError, SubPathError, VolumeError};
pub use mounts::container_mounts;

/// The volume plugins ironlet implements, named by their kubelet directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VolumePlugin {
    /// `emptyDir`.
    EmptyDir,
    /// `hostPath`.
    HostPath,
    /// `configMap`.
    ConfigMap,
    /// `secret`.
    Secret,
    /// `downwardAPI`.
    DownwardApi,
    /// `projected`.
    Projected,
}

impl VolumePlugin {
    /// kubelet's escaped plugin name, the directory under `volumes/`.
    #[must_use]
    pub fn dir_name(self) -> &'static str {
        match self {
            Self::EmptyDir => "kubernetes.io~empty-dir",
            Self::HostPath => "kubernetes.io~host-path",
            Self::ConfigMap => "kubernetes.io~configmap",
            Self::Secret => "kubernetes.io~secret",
            Self::DownwardApi => "kubernetes.io~downward-api",
            Self::Projected => "kubernetes.io~projected",
        }
    }

    /// Whether containers always get this volume read-only (kubelet's `Attributes.ReadOnly`).
    #[must_use]
    pub fn always_read_only(self) -> bool {
        matches!(
            self,
            Self::ConfigMap | Self::Secret | Self::DownwardApi | Self::Projected
        )
    }
}

/// Where a volume's data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Medium {
    /// The node's disk (the root directory's filesystem, or the hostPath's).
    Disk,
    /// A tmpfs mounted on the volume directory; `size_bytes: None` is the kernel default.
    Memory {
        /// The tmpfs `size=` option.
        size_bytes: Option<u64>,
    },
}

/// One set-up volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Its plugin.
    pub plugin: VolumePlugin,
    /// What containers bind-mount: the volume directory, or the hostPath.
    pub path: PathBuf,
    /// Its medium.
    pub medium: Medium,
    /// An emptyDir's `sizeLimit` in bytes (enforced by eviction when on disk).
    pub size_limit_bytes: Option<u64>,
}

/// A pod's set-up volumes, by volume name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodVolumes {
    /// The pod's UID.
    pub pod_uid: String,
    /// `<root>/pods/<uid>`.
    pub pod_dir: PathBuf,
    /// Every volume of the pod spec.
    pub volumes: BTreeMap<String, VolumeInfo>,
}

/// Sets up and tears down pod volumes under one root directory.
#[derive(Clone)]
pub struct VolumeManager {
    root_dir: PathBuf,
    objects: Arc<dyn ObjectSource>,
}

impl std::fmt::Debug for VolumeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManager")
            .field("root_dir", &self.root_dir)
            .finish_non_exhaustive()
    }
}

impl VolumeManager {
    /// A manager for pods under `<root_dir>/pods`, reading ConfigMaps and Secrets from
    /// `objects`.
    #[must_use]
    pub fn new(root_dir: PathBuf, objects: Arc<dyn ObjectSource>) -> Self {
        Self { root_dir, objects }
    }

    /// `<root>/pods/<uid>`.
    #[must_use]
    pub fn pod_dir(&self, pod_uid: &str) -> PathBuf {
        self.root_dir.join("pods").join(pod_uid)
    }

    /// Materialises every volume of `pod` (see the module docs); `allocatable` sizes memory
    /// volumes and answers `resourceFieldRef` items for unset limits. Stops at the first
    /// volume that fails.
    pub async fn setup_pod_volumes(
        &self,
        pod: &Pod,
        allocatable: &Allocatable,
    ) -> Result<PodVolumes, VolumeError> {
        setup::setup(self, pod, allocatable).await
    }

    /// Unmounts and removes the volumes of pod `pod_uid` (see the module docs). Calling it for
    /// a pod without volumes, or twice, is fine.
    pub async fn teardown_pod_volumes(&self, pod_uid: &str) -> Result<(), VolumeError> {
        let pod_dir = self.pod_dir(teardown::checked_uid(pod_uid)?);
        tokio::task::spawn_blocking(move || teardown::teardown(&pod_dir))
            .await
            .map_err(|err| VolumeError::Task {
                reason: err.to_string(),
            })?
    }
}

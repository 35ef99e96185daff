//! [`NodeStatusProvider`]: what the agent tells the node controller about the node —
//! resources, addresses, system info, pressure and readiness. [`MachineStatus`](super::MachineStatus)
//! is the implementation reading this machine.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ContainerImage, NodeAddress, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// `status.capacity` and `status.allocatable`, keyed by resource name (`cpu`, `memory`,
/// `pods`, `ephemeral-storage`, …), as the quantities kubelet would write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeResources {
    /// What the machine has.
    pub capacity: BTreeMap<String, Quantity>,
    /// What pods may use: capacity minus reservations and hard eviction thresholds.
    pub allocatable: BTreeMap<String, Quantity>,
}

/// Which resources are under pressure (the `*Pressure` conditions turn True).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    /// Available memory is below the hard eviction threshold.
    pub memory: bool,
    /// The node filesystem is below its hard eviction threshold.
    pub disk: bool,
    /// Process ids are running out.
    pub pid: bool,
}

/// Whether the node may run pods (the `Ready` condition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Ready: `KubeletReady`, "kubelet is posting ready status".
    Ready,
    /// Not ready: `KubeletNotReady` with these errors joined by ", " as the message (kubelet
    /// lists runtime, network and storage errors this way).
    NotReady(Vec<String>),
}

/// The agent's view of the node, polled every status period (and at registration).
///
/// Calls are synchronous and should be cheap (reads of `/proc`, cached values): they run on
/// the controller's task.
pub trait NodeStatusProvider: Send + Sync + 'static {
    /// Capacity and allocatable.
    fn resources(&self) -> Result<NodeResources, ProviderError>;
    /// `status.addresses` (InternalIP, Hostname, …).
    fn addresses(&self) -> Vec<NodeAddress>;
    /// `status.nodeInfo`.
    fn system_info(&self) -> NodeSystemInfo;
    /// The kubelet API port (`daemonEndpoints.kubeletEndpoint.Port`). Default: none.
    fn kubelet_port(&self) -> Option<u16> {
        None
    }
    /// Resource pressure. Default: none.
    fn pressure(&self) -> Pressure {
        Pressure::default()
    }
    /// Readiness. Default: ready.
    fn readiness(&self) -> Readiness {
        Readiness::Ready
    }
    /// `status.images` (largest first, already cut to `--node-status-max-images`); `None`
    /// leaves the field alone. Default: none.
    fn images(&self) -> Option<Vec<ContainerImage>> {
        None
    }
}

/// Reading the machine failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The cgroups crate could not find the hierarchy or read the capacity.
    #[error("reading the node capacity")]
    Capacity(#[source] ironlet_cgroups::Error),
    /// `statvfs` of the data root (or its closest existing ancestor) failed.
    #[error("statvfs {path}")]
    Statvfs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    /// A file under `/proc` could not be read.
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file under `/proc` did not say what we expected.
    #[error("parsing {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}

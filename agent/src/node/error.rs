//! The node controller's errors, one variant per API call that can fail, carrying the node.

use std::time::Duration;

use super::provider::ProviderError;

/// `Result` of the node controller.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong talking to the apiserver or reading the machine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// POST of the Node failed (other than AlreadyExists).
    #[error("creating node {node}")]
    CreateNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// GET of a Node that already existed failed.
    #[error("reading existing node {node}")]
    GetNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// Patching our labels onto a Node that already existed failed.
    #[error("patching the labels of existing node {node}")]
    PatchLabels {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// The apiserver answered with a Node without `metadata.uid`.
    #[error("node {node} has no uid")]
    MissingUid { node: String },
    /// PATCH of `nodes/<node>/status` failed.
    #[error("patching the status of node {node}")]
    PatchStatus {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// A status patch got no answer within the heartbeat timeout.
    #[error("patching the status of node {node}: no answer within {timeout:?}")]
    RequestTimeout { node: String, timeout: Duration },
    /// The final Ready=False patch did not finish in time.
    #[error("marking node {node} not ready at shutdown took over {timeout:?}")]
    ShutdownTimeout { node: String, timeout: Duration },
    /// GET of the Lease failed (other than NotFound).
    #[error("reading lease kube-node-lease/{node}")]
    GetLease {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// POST of the Lease failed.
    #[error("creating lease kube-node-lease/{node}")]
    CreateLease {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// PUT of the renewed Lease failed (a conflict included).
    #[error("renewing lease kube-node-lease/{node}")]
    RenewLease {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// The status provider could not read the machine.
    #[error(transparent)]
    Provider(#[from] ProviderError),
}

//! Errors of the runtime crate.
//!
//! One enum per seam: [`RuntimeError`] for sandboxes and containers, [`ImageError`] (defined
//! with the image store) for images. Variants are grouped as in youki: bad input first, then
//! errors of submodules (transparent), then failures of a step, each naming what failed.
//! The kubelet reason a failure maps to is a method ([`RuntimeError::kubelet_reason`]),
//! never parsed out of a message.

use std::path::PathBuf;

pub use crate::image::ImageError;
pub use crate::spec::SpecError;
use crate::types::{ContainerId, ContainerState};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    // ---- bad input ----
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    #[error("container {id} is {state:?}; cannot {action}")]
    IncorrectState {
        id: ContainerId,
        state: ContainerState,
        action: &'static str,
    },
    #[error("invalid container config: {0}")]
    InvalidConfig(String),

    // ---- errors of submodules ----
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Cgroups(#[from] ironlet_cgroups::Error),
    #[error(transparent)]
    Zygote(#[from] crate::zygote::ZygoteError),
    #[error("pod network of sandbox {sandbox_id}: {source}")]
    Network {
        sandbox_id: crate::types::SandboxId,
        #[source]
        source: Box<crate::network::NetworkError>,
    },

    // ---- failed steps ----
    #[error("creating container {id}: {message}")]
    Create { id: ContainerId, message: String },
    #[error("starting container {id}: {message}")]
    Start { id: ContainerId, message: String },
    #[error("signalling container {id}: {message}")]
    Kill { id: ContainerId, message: String },
    #[error("exec in container {id}: {message}")]
    Exec { id: ContainerId, message: String },
    #[error("exec in container {id} timed out after {seconds}s")]
    ExecTimeout { id: ContainerId, seconds: u64 },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{original}; cleaning up also failed: {cleanup}")]
    Rollback {
        original: Box<RuntimeError>,
        cleanup: Box<RuntimeError>,
    },
}

impl RuntimeError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// The waiting reason the kubelet shows for this failure (`CreateContainerError`, …).
    pub fn kubelet_reason(&self) -> &'static str {
        match self {
            Self::Image(e) => e.kubelet_reason(),
            Self::Spec(_) | Self::InvalidConfig(_) => "CreateContainerConfigError",
            Self::Start { .. } => "RunContainerError",
            Self::Rollback { original, .. } => original.kubelet_reason(),
            _ => "CreateContainerError",
        }
    }
}

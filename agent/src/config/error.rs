//! Errors of the config layer: where a manifest came from ([`ManifestOrigin`]) and why it, or a
//! pod in it, was not accepted ([`ManifestError`], [`DecodeError`]).
//!
//! These errors never stop a source: the source logs them with the origin, publishes them on
//! its `problems()` channel and keeps serving every other manifest. They are `Clone` so that
//! the current list of problems can be shared.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::validate::ValidationErrors;

/// Where a manifest was read from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ManifestOrigin {
    /// A file of the static pod path.
    File(PathBuf),
    /// The manifest URL.
    Url(String),
}

impl fmt::Display for ManifestOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Url(url) => f.write_str(url),
        }
    }
}

/// Why the bytes of a manifest did not yield pods. Documents are numbered from 1, as an editor
/// would count them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not UTF-8, YAML or JSON.
    #[error("document {document}: not valid YAML or JSON: {reason}")]
    Syntax {
        /// 1-based document index.
        document: usize,
        /// The parser's message.
        reason: String,
    },
    /// A document has no `kind`.
    #[error("document {document}: missing \"kind\" (expected Pod, PodList or List)")]
    MissingKind {
        /// 1-based document index.
        document: usize,
    },
    /// A document (or a list item) is something other than a pod.
    #[error("document {document}: kind {kind:?} is not a Pod, PodList or List")]
    UnsupportedKind {
        /// 1-based document index.
        document: usize,
        /// The offending kind.
        kind: String,
    },
    /// A manifest file with nothing but whitespace. For files this is an error (most likely
    /// a write in progress), so the file keeps its last good pods; an empty HTTP body is a
    /// valid empty set.
    #[error("the manifest is empty")]
    Empty,
    /// A document or list item has the right kind but does not fit the Pod schema.
    #[error("document {document}{}: not a valid Pod object: {reason}", item_suffix(*item))]
    Pod {
        /// 1-based document index.
        document: usize,
        /// 0-based index in `items` when the document is a list.
        item: Option<usize>,
        /// The deserializer's message (which field had which wrong type).
        reason: String,
    },
}

fn item_suffix(item: Option<usize>) -> String {
    item.map(|i| format!(", items[{i}]")).unwrap_or_default()
}

/// Why an HTTP fetch of the manifest URL failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchFailure {
    /// Connecting, sending or reading failed (or timed out).
    #[error("request failed: {0}")]
    Transport(#[source] Arc<reqwest::Error>),
    /// The server answered with something other than 200 OK.
    #[error("server answered {0}")]
    Status(reqwest::StatusCode),
    /// The body was larger than the source accepts.
    #[error("response body larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
}

/// A manifest, or a pod in it, that a source could not use.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error("reading manifest {origin}: {source}")]
    Read {
        /// The file.
        origin: ManifestOrigin,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The URL could not be fetched.
    #[error("fetching manifest {origin}: {source}")]
    Fetch {
        /// The URL.
        origin: ManifestOrigin,
        /// What went wrong.
        #[source]
        source: FetchFailure,
    },
    /// The file is larger than [`MAX_MANIFEST_BYTES`](super::manifest::MAX_MANIFEST_BYTES);
    /// it was not read.
    #[error("manifest {origin} is {size} bytes, larger than the limit of {limit} bytes; not read")]
    TooLarge {
        /// The file.
        origin: ManifestOrigin,
        /// Its size (or the bytes read before giving up, when it grew while read).
        size: u64,
        /// The limit in bytes.
        limit: usize,
    },
    /// The content is not a pod, a list of pods or a YAML stream of them.
    #[error("decoding manifest {origin}: {source}")]
    Decode {
        /// The file or URL.
        origin: ManifestOrigin,
        /// What went wrong.
        #[source]
        source: DecodeError,
    },
    /// A pod decoded but failed validation; the other pods of the manifest are still used.
    #[error("manifest {origin}: pod {pod:?} is invalid: {source}")]
    Invalid {
        /// The file or URL.
        origin: ManifestOrigin,
        /// The pod's name as written in the manifest.
        pod: String,
        /// Every rule it broke.
        #[source]
        source: ValidationErrors,
    },
}

impl ManifestError {
    /// The file or URL the error is about.
    #[must_use]
    pub fn origin(&self) -> &ManifestOrigin {
        match self {
            Self::Read { origin, .. }
            | Self::Fetch { origin, .. }
            | Self::TooLarge { origin, .. }
            | Self::Decode { origin, .. }
            | Self::Invalid { origin, .. } => origin,
        }
    }

    /// Whether the error is about a whole manifest (so the source keeps that manifest's last
    /// good pods) rather than one invalid pod in it.
    #[must_use]
    pub fn is_whole_manifest(&self) -> bool {
        !matches!(self, Self::Invalid { .. })
    }
}

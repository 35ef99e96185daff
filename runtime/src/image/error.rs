//! [`ImageError`]: every way the image store can fail, and the kubelet reason each maps to.
//!
//! Variants are grouped as in the rest of the crate: bad input, bad content (digests, unsafe
//! layer entries, limits), then failed steps. Each names what failed: the reference, the
//! digest, the path, or the offending tar entry exactly as it was written in the archive.
//! The kubelet reason is a method ([`ImageError::kubelet_reason`]), never parsed from text.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why a layer entry was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsafeEntryReason {
    /// The entry's path has a `..` component.
    ParentComponent,
    /// Resolving the entry's parent left the layer root (absolute symlink or `..` in a symlink).
    SymlinkEscape,
    /// A parent component exists and is not a directory (or is a dangling symlink).
    ParentNotDirectory,
    /// A hard link whose target path has `..`, or resolves outside the layer root.
    HardLinkOutside,
    /// A hard link whose target does not exist (earlier) in the same layer.
    HardLinkTargetMissing,
    /// A hard link to a directory.
    HardLinkToDirectory,
    /// A character or block device node (all device nodes are refused).
    DeviceNode,
    /// A whiteout whose name is empty, `.` or `..`.
    InvalidWhiteout,
    /// A path or link target containing a NUL byte or not representable.
    InvalidName,
}

impl fmt::Display for UnsafeEntryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ParentComponent => "path has a '..' component",
            Self::SymlinkEscape => "path resolves outside the layer through a symlink",
            Self::ParentNotDirectory => "a parent component is not a directory",
            Self::HardLinkOutside => "hard link target is outside the layer",
            Self::HardLinkTargetMissing => "hard link target does not exist in the layer",
            Self::HardLinkToDirectory => "hard link target is a directory",
            Self::DeviceNode => "device nodes are not allowed in layers",
            Self::InvalidWhiteout => "whiteout names no file",
            Self::InvalidName => "name is not a valid path",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    // ---- bad input ----
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference {
        reference: String,
        reason: &'static str,
    },
    /// The reference (or id) that names no local image.
    #[error("image {0} not found")]
    NotFound(String),
    #[error("image {reference} is not present and the pull policy is Never")]
    NeverPull { reference: String },
    #[error("image id prefix {prefix} matches more than one image")]
    AmbiguousId { prefix: String },
    #[error("{path}: not an OCI image layout, OCI archive or docker archive")]
    UnknownFormat { path: PathBuf },

    // ---- bad content ----
    #[error("{location}: invalid {what}: {message}")]
    InvalidImage {
        location: String,
        what: &'static str,
        message: String,
    },
    #[error("{location}: parsing {what}: {source}")]
    Json {
        location: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{location}: unsupported media type {media_type} for {digest}")]
    UnsupportedMediaType {
        location: String,
        media_type: String,
        digest: String,
    },
    #[error("{location}: no manifest for platform {platform}")]
    NoMatchingPlatform { location: String, platform: String },
    #[error("{location}: blob {digest} is missing")]
    BlobMissing { location: String, digest: String },
    #[error(
        "{location}: blob is corrupt: expected {expected} ({expected_size:?} bytes), \
         got {actual} ({actual_size} bytes)"
    )]
    DigestMismatch {
        location: String,
        expected: String,
        actual: String,
        expected_size: Option<u64>,
        actual_size: u64,
    },
    #[error("layer {layer}: uncompressed content is {actual}, the image config says {expected}")]
    DiffIdMismatch {
        layer: String,
        expected: String,
        actual: String,
    },
    #[error("layer {layer}: refusing entry {entry:?}: {reason}")]
    UnsafeEntry {
        layer: String,
        entry: String,
        reason: UnsafeEntryReason,
    },
    #[error("layer {layer}: entry {entry:?} takes the layer past {limit} unpacked bytes")]
    LayerTooLarge {
        layer: String,
        entry: String,
        limit: u64,
    },
    #[error("layer {layer}: entry {entry:?} takes the layer past {limit} entries")]
    TooManyEntries {
        layer: String,
        entry: String,
        limit: u64,
    },
    #[error(
        "layer {layer}: more than {limit} bytes after the end of the tar archive \
         (refused unread: its diff_id cannot be checked without decompressing it all)"
    )]
    TrailingData { layer: String, limit: u64 },
    #[error("layer {layer}: reading the tar stream: {source}")]
    ReadLayer {
        layer: String,
        #[source]
        source: io::Error,
    },
    #[error("layer {layer}: writing entry {entry:?}: {source}")]
    WriteEntry {
        layer: String,
        entry: String,
        #[source]
        source: io::Error,
    },
    #[error("no space left on device writing {path}")]
    DiskFull { path: PathBuf },

    // ---- root file systems ----
    #[error("overlay is unavailable for {target}: {reason}")]
    OverlayUnavailable { target: PathBuf, reason: String },
    #[error("mounting overlay at {target}: {step}: {source}{kernel_log}")]
    Mount {
        target: PathBuf,
        step: &'static str,
        #[source]
        source: io::Error,
        /// Messages the kernel left in the fs context (", kernel: …"), possibly empty.
        kernel_log: String,
    },
    #[error(
        "mounting overlay at {target}: the kernel lacks lowerdir+ and the legacy option \
         string for {layers} layers is {len} bytes (limit {limit})"
    )]
    MountOptionsTooLong {
        target: PathBuf,
        layers: usize,
        len: usize,
        limit: usize,
    },
    #[error("unmounting {path}: {source}")]
    Unmount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    // ---- failed steps ----
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("image index {op} {path}: {source}")]
    Index {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("image store task failed: {0}")]
    Task(String),

    // ---- pulls ----
    /// The registry (or every endpoint of its mirrors) refused or failed the request; the
    /// message is the registry's own.
    #[error("pulling {reference} from {endpoint}: {message}")]
    Registry {
        reference: String,
        endpoint: String,
        message: String,
    },
    /// The registry asked for credentials and refused the ones given (or none were).
    #[error("pulling {reference} from {endpoint}: authorization failed: {message}")]
    Unauthorized {
        reference: String,
        endpoint: String,
        message: String,
    },
    /// A foreign (non-distributable) layer: its content lives elsewhere by design.
    #[error("{reference}: layer {digest} is a foreign/non-distributable layer ({media_type}); ironlet does not fetch those")]
    ForeignLayer {
        reference: String,
        digest: String,
        media_type: String,
    },
    #[error("{path}: {message}")]
    RegistryConfig { path: PathBuf, message: String },
    /// `--image-credential-provider-config` is invalid or names a missing plugin binary.
    #[error("credential provider config {path}: {message}")]
    CredentialProviderConfig { path: PathBuf, message: String },
    /// Another pull of the same image, that this one joined, failed.
    #[error(transparent)]
    Shared(std::sync::Arc<ImageError>),
}

impl ImageError {
    /// An I/O failure of step `op` on `path`; "no space"/"quota" become [`Self::DiskFull`].
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        if crate::image::sys::is_disk_full(&source) {
            Self::DiskFull { path }
        } else {
            Self::Io { op, path, source }
        }
    }

    pub(crate) fn index(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Index {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(location: impl Into<String>, what: &'static str, msg: String) -> Self {
        Self::InvalidImage {
            location: location.into(),
            what,
            message: msg,
        }
    }

    /// The waiting reason the kubelet shows for this failure.
    pub fn kubelet_reason(&self) -> &'static str {
        match self {
            Self::InvalidReference { .. } => "InvalidImageName",
            Self::NeverPull { .. } => "ErrImageNeverPull",
            Self::AmbiguousId { .. } | Self::Index { .. } => "ImageInspectError",
            Self::OverlayUnavailable { .. }
            | Self::Mount { .. }
            | Self::MountOptionsTooLong { .. }
            | Self::Unmount { .. } => "CreateContainerError",
            Self::Shared(inner) => inner.kubelet_reason(),
            _ => "ErrImagePull",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_reference_maps_to_invalid_image_name() {
        let e = ImageError::InvalidReference {
            reference: "UPPER".into(),
            reason: "x",
        };
        assert_eq!(e.kubelet_reason(), "InvalidImageName");
    }

    #[test]
    fn no_space_left_becomes_disk_full_naming_the_path() {
        let e = ImageError::io(
            "writing",
            "/x/y",
            io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert!(matches!(e, ImageError::DiskFull { ref path } if path == &PathBuf::from("/x/y")));
        assert_eq!(e.kubelet_reason(), "ErrImagePull");
    }

    #[test]
    fn unsafe_entry_message_names_the_entry() {
        let e = ImageError::UnsafeEntry {
            layer: "sha256:ab".into(),
            entry: "../escape".into(),
            reason: UnsafeEntryReason::ParentComponent,
        };
        assert!(e.to_string().contains("\"../escape\""), "{e}");
    }
}

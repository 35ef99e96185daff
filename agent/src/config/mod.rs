//! Pod sources and their merge into one update stream — kubelet's `pkg/kubelet/config`.
//!
//! ```text
//!  FileSource (--pod-manifest-path) ─┐
//!  HttpSource (--manifest-url)      ─┼─► PodConfig ──► PodUpdate { op, pods, source } ──► sync loop
//!  API watch (later, via channel()) ─┘      └──► SourcesReady
//! ```
//!
//! Where to start: [`PodConfig`] (the merger and its guarantees), [`PodSource`] (how a source
//! plugs in), [`FileSource`] and [`HttpSource`]. Static manifests go through one pipeline —
//! decode, API defaults, kubelet's static defaults (name `-<node>`, content-derived UID,
//! `config.hash`), validation — shared by both static sources.

mod annotations;
mod decode;
mod defaults;
mod error;
mod file;
mod file_scan;
mod http;
pub(crate) mod inotify;
mod manifest;
mod pod_config;
mod source;
mod storage;
mod update;
mod validate;

pub use annotations::{
    annotation, is_mirror_pod, is_static_pod, pod_desc, pod_full_name, pod_source, pod_uid,
    CONFIG_HASH, CONFIG_MIRROR, CONFIG_SEEN, CONFIG_SOURCE, LOCAL_ANNOTATIONS,
};
pub(crate) use decode::decode_documents;
pub use decode::decode_pods;
pub use defaults::{
    apply_api_defaults, apply_static_defaults, default_pull_policy, static_pod_name,
    static_pod_uid, DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS, DEFAULT_TERMINATION_MESSAGE_PATH,
};
pub use error::{DecodeError, FetchFailure, ManifestError, ManifestOrigin};
pub use file::{FileSource, FileSourceConfig};
pub use http::{HttpSource, HttpSourceConfig, HttpSourceError};
pub use inotify::WatchError;
pub use manifest::{read_manifest, ManifestPods};
pub use pod_config::{DuplicateSource, PodConfig, PodConfigOptions, SourcesReady};
pub use source::{MergerGone, PodSource, ProblemReporter, SetDeduper, SourceSender};
pub use update::{ConfigSource, PodOp, PodUpdate, SourceChange, UnknownSource};
pub use validate::{
    check_dns1123_label, check_dns1123_subdomain, validate_api_pod, validate_pod, ValidationError,
    ValidationErrors,
};

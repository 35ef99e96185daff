//! The vocabulary of the config layer: which source a pod came from ([`ConfigSource`]), what a
//! source tells the merger ([`SourceChange`]), and what the merger tells the sync loop
//! ([`PodUpdate`] with a [`PodOp`]) — kubelet's `kubetypes.PodUpdate`.
//!
//! Sources speak in whole sets or upserts; the merger turns that into per-pod operations so
//! that the sync loop never has to diff anything itself.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::Pod;

/// Where a pod came from. The string forms are kubelet's and end up in the
/// `kubernetes.io/config.source` annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConfigSource {
    /// A static manifest file or directory (`--pod-manifest-path`).
    File,
    /// A manifest URL polled periodically (`--manifest-url`).
    Http,
    /// The API server (pods bound to this node, and mirror pods).
    Api,
}

impl ConfigSource {
    /// kubelet's name for the source: `file`, `http` or `api`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Http => "http",
            Self::Api => "api",
        }
    }
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not one of kubelet's source names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pod source {0:?} (expected file, http or api)")]
pub struct UnknownSource(pub String);

impl FromStr for ConfigSource {
    type Err = UnknownSource;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "file" => Ok(Self::File),
            "http" => Ok(Self::Http),
            "api" => Ok(Self::Api),
            other => Err(UnknownSource(other.to_owned())),
        }
    }
}

/// What one source tells the merger.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceChange {
    /// The complete current set of the source's pods (kubelet `SET`): anything the source sent
    /// before and is missing here is gone. The first `Set` marks the source as seen.
    Set(Vec<Pod>),
    /// Pods that are new or changed (kubelet `ADD`/`UPDATE`/`DELETE` from a source: the merger
    /// decides which one each pod is).
    Upsert(Vec<Pod>),
    /// Pods that are gone, matched by UID (kubelet `REMOVE`).
    Remove(Vec<Pod>),
}

/// The operation the sync loop must perform for the pods of one [`PodUpdate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodOp {
    /// Pods new to the agent (kubelet `ADD`). An `Add` with no pods is sent once per source, on
    /// its first complete set, when that set brought nothing else: it signals readiness.
    Add,
    /// Pods whose spec, labels or annotations changed (kubelet `UPDATE`).
    Update,
    /// Pods that are gone from their source (kubelet `REMOVE`): stop and forget them.
    Remove,
    /// Pods whose status alone changed (kubelet `RECONCILE`).
    Reconcile,
    /// Pods marked for graceful deletion (`deletionTimestamp` set, kubelet `DELETE`).
    Delete,
}

impl PodOp {
    /// kubelet's spelling (`ADD`, `UPDATE`, …), for logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Update => "UPDATE",
            Self::Remove => "REMOVE",
            Self::Reconcile => "RECONCILE",
            Self::Delete => "DELETE",
        }
    }
}

impl fmt::Display for PodOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One batch of the merged stream: the same operation for some pods of one source.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUpdate {
    /// What to do with the pods.
    pub op: PodOp,
    /// The pods, annotated with `config.source` (and `config.seen` once added).
    pub pods: Vec<Pod>,
    /// The source the pods came from.
    pub source: ConfigSource,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_names_round_trip_through_their_kubelet_spelling() {
        for s in [ConfigSource::File, ConfigSource::Http, ConfigSource::Api] {
            assert_eq!(s.as_str().parse::<ConfigSource>(), Ok(s));
        }
        assert_eq!(
            "etcd".parse::<ConfigSource>(),
            Err(UnknownSource("etcd".into()))
        );
    }
}

//! The seam between pod sources and the merger: the [`PodSource`] trait, the [`SourceSender`]
//! each source gets, and two helpers of the source loops — [`SetDeduper`] (send a set only
//! when it changed; the file source does the same on the reads it shares with its cache) and
//! [`ProblemReporter`] (log and publish the source's current problems).
//!
//! A source owns its loop. It sends [`SourceChange::Set`] with everything it currently serves
//! (file and HTTP sources always do), or [`SourceChange::Upsert`]/[`SourceChange::Remove`] for
//! incremental changes (a future API watch). Its first `Set` marks it as seen for
//! `SourcesReady`. It stops when [`SourceSender::closed`] resolves: the merger is gone.

use std::future::Future;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};

use super::error::ManifestError;
use super::update::{ConfigSource, SourceChange};

/// Something that produces pods for the merger.
pub trait PodSource: Send + 'static {
    /// Which source this is; everything it sends is tagged with it.
    fn source(&self) -> ConfigSource;

    /// Runs until the merger stops (see [`SourceSender::closed`]).
    fn run(self, updates: SourceSender) -> impl Future<Output = ()> + Send;
}

/// The merger has stopped; the change was discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pod config merger has stopped; {0} source updates are discarded")]
pub struct MergerGone(pub ConfigSource);

/// A source's handle on the merger, tagged with the source's name.
#[derive(Debug, Clone)]
pub struct SourceSender {
    source: ConfigSource,
    tx: mpsc::Sender<(ConfigSource, SourceChange)>,
}

impl SourceSender {
    pub(crate) fn new(
        source: ConfigSource,
        tx: mpsc::Sender<(ConfigSource, SourceChange)>,
    ) -> Self {
        Self { source, tx }
    }

    /// The source this sender speaks for.
    #[must_use]
    pub fn source(&self) -> ConfigSource {
        self.source
    }

    /// Hands `change` to the merger, waiting while its queue is full.
    pub async fn send(&self, change: SourceChange) -> Result<(), MergerGone> {
        self.tx
            .send((self.source, change))
            .await
            .map_err(|_| MergerGone(self.source))
    }

    /// Resolves once the merger has stopped; a source's loop selects on it to end.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

/// Remembers the last set a source sent so that unchanged re-reads send nothing.
#[derive(Debug, Default)]
pub struct SetDeduper {
    sent: Option<Vec<Pod>>,
}

impl SetDeduper {
    /// `Some(Set(pods))` if `pods` differs from the last set offered (or none was), else `None`.
    pub fn offer(&mut self, pods: Vec<Pod>) -> Option<SourceChange> {
        if self.sent.as_ref() == Some(&pods) {
            return None;
        }
        self.sent = Some(pods.clone());
        Some(SourceChange::Set(pods))
    }

    /// Whether a set was ever offered.
    #[must_use]
    pub fn has_sent(&self) -> bool {
        self.sent.is_some()
    }
}

/// A source's current problems: logged when they appear or clear, and published on a watch
/// channel so that tests, the HTTP server or events can show them.
#[derive(Debug)]
pub struct ProblemReporter {
    source: ConfigSource,
    tx: watch::Sender<Vec<ManifestError>>,
}

impl ProblemReporter {
    /// A reporter for `source` with no problems.
    #[must_use]
    pub fn new(source: ConfigSource) -> Self {
        Self {
            source,
            tx: watch::Sender::new(Vec::new()),
        }
    }

    /// A receiver of the current problem list.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Vec<ManifestError>> {
        self.tx.subscribe()
    }

    /// Replaces the problem list: new problems are logged at warn, cleared ones at info, and
    /// receivers are notified only when the list changed.
    pub fn publish(&self, problems: Vec<ManifestError>) {
        let render =
            |list: &[ManifestError]| list.iter().map(ToString::to_string).collect::<Vec<_>>();
        let new = render(&problems);
        let old = render(&self.tx.borrow());
        if new == old {
            return;
        }
        let source = self.source;
        for (problem, text) in problems.iter().zip(&new) {
            if !old.contains(text) {
                tracing::warn!(
                    %source,
                    origin = %problem.origin(),
                    error = %problem,
                    "pod source problem",
                );
            }
        }
        for text in old.iter().filter(|t| !new.contains(t)) {
            tracing::info!(%source, problem = %text, "pod source problem resolved");
        }
        self.tx.send_replace(problems);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::error::{DecodeError, ManifestOrigin};

    #[test]
    fn the_deduper_sends_the_first_set_and_then_only_changes() {
        let mut d = SetDeduper::default();
        assert!(!d.has_sent());
        assert_eq!(d.offer(vec![]), Some(SourceChange::Set(vec![])));
        assert_eq!(d.offer(vec![]), None);
        let pod = Pod::default();
        assert_eq!(
            d.offer(vec![pod.clone()]),
            Some(SourceChange::Set(vec![pod.clone()]))
        );
        assert_eq!(d.offer(vec![pod]), None);
        assert!(d.has_sent());
    }

    #[test]
    fn the_reporter_notifies_only_on_change() {
        let reporter = ProblemReporter::new(ConfigSource::File);
        let mut rx = reporter.subscribe();
        let problem = ManifestError::Decode {
            origin: ManifestOrigin::File(PathBuf::from("/m/x.yaml")),
            source: DecodeError::MissingKind { document: 1 },
        };
        reporter.publish(vec![problem.clone()]);
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().len(), 1);
        reporter.publish(vec![problem]);
        assert!(!rx.has_changed().unwrap());
        reporter.publish(vec![]);
        assert!(rx.borrow_and_update().is_empty());
    }
}

//! [`PodConfig`]: merges every pod source into the one stream of [`PodUpdate`]s the sync loop
//! reads, and tracks which sources have delivered their first complete set ([`SourcesReady`]).
//!
//! ```text
//!  FileSource ─┐ SourceSender(file)
//!  HttpSource ─┼──────────────────► merger task ──► mpsc::Receiver<PodUpdate> ──► sync loop
//!  (api watch) ┘ SourceSender(api)  (PodStorage)          │
//!                                        └── first Set ──► SourcesReady
//! ```
//!
//! Guarantees:
//!
//! * Updates of one source are delivered in the order the source sent its changes; within one
//!   change, in kubelet's order (REMOVE, ADD, UPDATE, DELETE, RECONCILE).
//! * A source is marked ready only *after* the updates of its first complete set are queued on
//!   the output channel; a sync loop that drains the channel before consulting
//!   [`SourcesReady::all_ready`] has therefore seen every pod that made it ready.
//! * Shutdown cascades: dropping the output receiver stops the merger, which makes every
//!   source's [`SourceSender::closed`] resolve; dropping the `PodConfig` and every source
//!   closes the output channel.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{SecondsFormat, Utc};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::source::{PodSource, SourceSender};
use super::storage::PodStorage;
use super::update::{ConfigSource, PodUpdate, SourceChange};

/// Tuning of the merger.
#[derive(Debug, Clone)]
pub struct PodConfigOptions {
    /// Capacity of the output channel (kubelet: 50).
    pub update_capacity: usize,
    /// Capacity of the channel from sources to the merger.
    pub source_capacity: usize,
}

impl Default for PodConfigOptions {
    fn default() -> Self {
        Self {
            // kubelet's PodConfig channel is buffered to 50 updates.
            update_capacity: 50,
            source_capacity: 50,
        }
    }
}

/// A source name was registered twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("pod source {0} is already registered")]
pub struct DuplicateSource(pub ConfigSource);

#[derive(Debug, Default, Clone)]
struct ReadyState {
    expected: BTreeSet<ConfigSource>,
    seen: BTreeSet<ConfigSource>,
}

impl ReadyState {
    fn all_ready(&self) -> bool {
        self.expected.is_subset(&self.seen)
    }
}

/// Answers whether every registered source has delivered its first complete set (kubelet
/// `SourcesReady.AllReady`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct SourcesReady {
    rx: watch::Receiver<ReadyState>,
}

impl SourcesReady {
    /// True once every registered source sent its first `Set` (true with no sources).
    #[must_use]
    pub fn all_ready(&self) -> bool {
        self.rx.borrow().all_ready()
    }

    /// The sources that have delivered a complete set so far.
    #[must_use]
    pub fn seen(&self) -> BTreeSet<ConfigSource> {
        self.rx.borrow().seen.clone()
    }

    /// Waits until [`Self::all_ready`]; returns early if the merger stopped first.
    pub async fn wait_all_ready(&self) {
        let mut rx = self.rx.clone();
        // An error means the merger stopped: nothing will become ready any more.
        let _ = rx.wait_for(ReadyState::all_ready).await;
    }
}

/// The merger's front door: hands out [`SourceSender`]s and [`SourcesReady`].
#[derive(Debug)]
pub struct PodConfig {
    tx: mpsc::Sender<(ConfigSource, SourceChange)>,
    ready: Arc<watch::Sender<ReadyState>>,
    merger: JoinHandle<()>,
}

impl PodConfig {
    /// Starts the merger task (call inside a tokio runtime) and returns the stream of merged
    /// updates.
    #[must_use]
    pub fn new(options: &PodConfigOptions) -> (Self, mpsc::Receiver<PodUpdate>) {
        let (tx, rx) = mpsc::channel(options.source_capacity.max(1));
        let (out_tx, out_rx) = mpsc::channel(options.update_capacity.max(1));
        let ready = Arc::new(watch::Sender::new(ReadyState::default()));
        let merger = tokio::spawn(run_merger(rx, out_tx, Arc::clone(&ready)));
        (Self { tx, ready, merger }, out_rx)
    }

    /// Registers `source` (it now counts for [`SourcesReady`]) and returns its sender.
    pub fn channel(&self, source: ConfigSource) -> Result<SourceSender, DuplicateSource> {
        let mut fresh = false;
        self.ready
            .send_modify(|s| fresh = s.expected.insert(source));
        if !fresh {
            return Err(DuplicateSource(source));
        }
        Ok(SourceSender::new(source, self.tx.clone()))
    }

    /// Registers `source` and spawns its loop.
    pub fn spawn<S: PodSource>(&self, source: S) -> Result<JoinHandle<()>, DuplicateSource> {
        let sender = self.channel(source.source())?;
        Ok(tokio::spawn(source.run(sender)))
    }

    /// A handle answering whether all registered sources are ready.
    #[must_use]
    pub fn sources_ready(&self) -> SourcesReady {
        SourcesReady {
            rx: self.ready.subscribe(),
        }
    }

    /// Whether all registered sources have delivered their first complete set.
    #[must_use]
    pub fn all_sources_ready(&self) -> bool {
        self.ready.borrow().all_ready()
    }

    /// Whether the merger task has ended.
    #[must_use]
    pub fn is_stopped(&self) -> bool {
        self.merger.is_finished()
    }
}

async fn run_merger(
    mut rx: mpsc::Receiver<(ConfigSource, SourceChange)>,
    out: mpsc::Sender<PodUpdate>,
    ready: Arc<watch::Sender<ReadyState>>,
) {
    let mut storage = PodStorage::default();
    while let Some((source, change)) = rx.recv().await {
        let now = Utc::now().to_rfc3339_opts(SecondsFormat::Nanos, true);
        let outcome = storage.merge(source, change, &now);
        for update in outcome.updates {
            tracing::debug!(
                op = %update.op,
                source = %update.source,
                pods = update.pods.len(),
                "pod update",
            );
            if out.send(update).await.is_err() {
                tracing::debug!("pod update receiver dropped; merger stops");
                return;
            }
        }
        if outcome.first_set {
            tracing::info!(%source, "pod source delivered its first complete set");
            ready.send_modify(|s| {
                s.seen.insert(source);
            });
        }
    }
    tracing::debug!("every pod source is gone; merger stops");
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::config::update::PodOp;

    async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), fut)
            .await
            .unwrap_or_else(|_| panic!("timed out: {what}"))
    }

    fn pod(name: &str, uid: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: {name}, uid: {uid}}}\nspec: {{containers: [{{name: c, image: i}}]}}\n"
        ))
        .unwrap()
    }

    #[tokio::test]
    async fn sources_become_ready_after_their_first_set_is_delivered() {
        let (config, mut updates) = PodConfig::new(&PodConfigOptions::default());
        let ready = config.sources_ready();
        let file = config.channel(ConfigSource::File).unwrap();
        let http = config.channel(ConfigSource::Http).unwrap();
        assert!(!ready.all_ready());

        file.send(SourceChange::Set(vec![pod("a", "u1")]))
            .await
            .unwrap();
        let update = within("merger should forward the file ADD", updates.recv())
            .await
            .unwrap();
        assert_eq!((update.op, update.source), (PodOp::Add, ConfigSource::File));
        http.send(SourceChange::Set(vec![])).await.unwrap();
        let update = within("merger should send the empty readiness ADD", updates.recv())
            .await
            .unwrap();
        assert_eq!((update.op, update.pods.len()), (PodOp::Add, 0));
        within(
            "sources_ready should flip after both first sets",
            ready.wait_all_ready(),
        )
        .await;
        assert!(config.all_sources_ready());
        assert_eq!(
            ready.seen(),
            [ConfigSource::File, ConfigSource::Http]
                .into_iter()
                .collect()
        );
    }

    #[tokio::test]
    async fn a_source_cannot_be_registered_twice() {
        let (config, _updates) = PodConfig::new(&PodConfigOptions::default());
        config.channel(ConfigSource::Api).unwrap();
        assert_eq!(
            config.channel(ConfigSource::Api).unwrap_err(),
            DuplicateSource(ConfigSource::Api)
        );
    }

    #[tokio::test]
    async fn dropping_the_update_receiver_stops_the_merger_and_closes_sources() {
        let (config, updates) = PodConfig::new(&PodConfigOptions::default());
        let file = config.channel(ConfigSource::File).unwrap();
        drop(updates);
        // The merger notices on its next send.
        let _ = file.send(SourceChange::Set(vec![pod("a", "u1")])).await;
        within(
            "source sender should observe the merger stopping",
            file.closed(),
        )
        .await;
        assert!(file.send(SourceChange::Set(vec![])).await.is_err());
    }

    #[tokio::test]
    async fn dropping_config_and_sources_ends_the_update_stream() {
        let (config, mut updates) = PodConfig::new(&PodConfigOptions::default());
        let file = config.channel(ConfigSource::File).unwrap();
        drop(file);
        drop(config);
        assert!(within("update stream should end", updates.recv())
            .await
            .is_none());
    }
}

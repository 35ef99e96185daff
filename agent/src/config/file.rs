//! [`FileSource`]: static pods from a manifest directory or file (kubelet
//! `--pod-manifest-path`).
//!
//! The loop re-reads the whole path (see `file_scan` for which files count and how broken ones
//! are treated) at start, after every inotify change (once the change has been quiet for
//! [`FileSourceConfig::debounce`]), and every [`FileSourceConfig::resync_period`] as a safety
//! net. It sends a `Set` only when the set of pods changed, so the first read always sends
//! one (which marks the source ready) and idle re-reads send nothing.
//!
//! ```text
//!            ┌──────────── resync tick ─────────────┐
//!  start ──► read ──► Set if changed ──► wait ──────┤
//!            ▲                            │         └── inotify change ─► debounce ─┐
//!            └────────────────────────────┴─────────────────────────────────────────┘
//! ```
//!
//! The watch is a small state machine ([`Watch`]): `Active` while inotify works, `Inactive`
//! when the path (or its directory) is missing or inotify failed; an inactive watch is retried
//! before every read, so a directory created later is picked up without a restart.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use super::error::ManifestError;
use super::file_scan::{scan_cached, FileSourceState, ReadCache, Scan};
use super::inotify::{DirWatch, WatchError};
use super::source::{PodSource, ProblemReporter, SourceSender};
use super::update::ConfigSource;

/// Settings of the file source.
#[derive(Debug, Clone)]
pub struct FileSourceConfig {
    /// The manifest directory, or a single manifest file.
    pub path: PathBuf,
    /// This node's name: static pods are named `<name>-<node>` and bound to it.
    pub node_name: String,
    /// Period of the full re-read (kubelet `fileCheckFrequency`, default 20 s).
    pub resync_period: Duration,
    /// Quiet time after an inotify event before re-reading, so an editor's burst of writes is
    /// read once.
    pub debounce: Duration,
}

impl FileSourceConfig {
    /// Defaults for `path` on node `node_name`.
    #[must_use]
    pub fn new(path: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            node_name: node_name.into(),
            // kubelet: fileCheckFrequency defaults to 20s.
            resync_period: Duration::from_secs(20),
            // Coalesces an editor's write + rename (microseconds apart) without showing in
            // pod start latency; a half-written file read early only reports an error and
            // keeps the file's previous pods until the next event re-reads it.
            debounce: Duration::from_millis(2),
        }
    }

    /// Sets the full re-read period.
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = period.max(Duration::from_millis(1));
        self
    }

    /// Sets the quiet time after a change.
    #[must_use]
    pub fn debounce(mut self, debounce: Duration) -> Self {
        self.debounce = debounce;
        self
    }
}

/// Static pods from the manifest path.
#[derive(Debug)]
pub struct FileSource {
    config: FileSourceConfig,
    problems: ProblemReporter,
    /// The last read of each manifest file, so a change re-parses only that file.
    cache: Arc<Mutex<ReadCache>>,
}

/// The inotify side of the loop.
#[derive(Debug)]
enum Watch {
    /// Changes wake the loop.
    Active(DirWatch),
    /// No watch (path missing, inotify failed): only the resync tick wakes the loop.
    Inactive,
}

impl Watch {
    /// Tries to watch `config.path`, logging why not.
    fn establish(config: &FileSourceConfig) -> Self {
        match DirWatch::new(&config.path) {
            Ok(watch) => {
                tracing::debug!(dir = %watch.dir().display(), "watching static pod path");
                Self::Active(watch)
            }
            Err(err) => {
                tracing::debug!(
                    path = %config.path.display(),
                    error = %err,
                    "cannot watch static pod path; relying on periodic re-reads",
                );
                Self::Inactive
            }
        }
    }

    /// Waits for a change; never resolves while inactive.
    async fn changed(&mut self) -> Result<(), WatchError> {
        match self {
            Self::Active(watch) => watch.changed().await,
            Self::Inactive => std::future::pending().await,
        }
    }
}

impl FileSource {
    /// A source for `config`.
    #[must_use]
    pub fn new(config: FileSourceConfig) -> Self {
        Self {
            config,
            problems: ProblemReporter::new(ConfigSource::File),
            cache: Arc::default(),
        }
    }

    /// The current problems (unreadable, undecodable or invalid manifests), updated after every
    /// read that changes them.
    #[must_use]
    pub fn problems(&self) -> watch::Receiver<Vec<ManifestError>> {
        self.problems.subscribe()
    }

    async fn read(&self) -> Option<Scan> {
        let path = self.config.path.clone();
        let node_name = self.config.node_name.clone();
        let cache = self.cache.clone();
        let read = move || {
            // Only this source's reads take the lock, one at a time.
            let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
            scan_cached(&path, &node_name, &mut cache)
        };
        match tokio::task::spawn_blocking(read).await {
            Ok(scan) => Some(scan),
            Err(err) => {
                tracing::error!(
                    path = %self.config.path.display(),
                    error = %err,
                    "reading static pod path failed",
                );
                None
            }
        }
    }
}

impl PodSource for FileSource {
    fn source(&self) -> ConfigSource {
        ConfigSource::File
    }

    async fn run(self, updates: SourceSender) {
        let config = &self.config;
        let mut state = FileSourceState::default();
        let mut watch = Watch::Inactive;
        let mut resync = interval_at(Instant::now() + config.resync_period, config.resync_period);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tracing::info!(path = %config.path.display(), "static pod file source started");
        loop {
            // Watch before reading, so that nothing changed between the two goes unseen.
            if matches!(watch, Watch::Inactive) {
                watch = Watch::establish(config);
            }
            if let Some(scan) = self.read().await {
                let out = state.step(scan);
                self.problems.publish(out.problems);
                if let Some(change) = out.change {
                    if updates.send(change).await.is_err() {
                        return;
                    }
                }
            }
            tokio::select! {
                _ = resync.tick() => {}
                result = watch.changed() => {
                    tokio::time::sleep(config.debounce).await;
                    let drained = match (result, &mut watch) {
                        (Ok(()), Watch::Active(w)) => w.drain(),
                        (result, _) => result,
                    };
                    if let Err(err) = drained {
                        tracing::debug!(
                            path = %config.path.display(),
                            error = %err,
                            "static pod watch lost; will re-establish",
                        );
                        watch = Watch::Inactive;
                    }
                }
                () = updates.closed() => {
                    tracing::debug!("pod config merger stopped; file source ends");
                    return;
                }
            }
        }
    }
}

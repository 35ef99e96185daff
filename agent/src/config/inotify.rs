//! [`DirWatch`]: inotify on the static pod path, as an async "something changed" signal.
//!
//! A directory path is watched itself; a single-file path is watched through its parent
//! directory, filtered to that file's name, so that editors that replace the file by a rename
//! are still seen. Events about hidden files (names starting with `.`, e.g. editor swap files)
//! are ignored, like the files themselves.
//!
//! The watch is one subscriber of the runtime's shared inotify instance
//! ([`ironlet_cgroups::inotify`]): a `kubectl logs -f` follower or a static pod path costs a
//! watch, not an instance of the user's 128 (`fs.inotify.max_user_instances`).
//!
//! The watch only says *that* something changed; the file source then re-reads everything. When
//! the watched directory itself goes away, [`DirWatch::changed`] fails with
//! [`WatchError::Gone`] and the source falls back to its periodic re-read until it can watch
//! again.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use ironlet_cgroups::inotify::{self, Instance, Watch};
use nix::sys::inotify::AddWatchFlags;

/// Why the watch could not be set up or stopped working.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// Joining the runtime's shared inotify instance or watching the directory failed (the
    /// per-user limits, or the directory does not exist).
    #[error("watching {path}")]
    Setup {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: inotify::Error,
    },
    /// The shared instance stopped reading events.
    #[error("reading inotify events for {path}")]
    Read {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: inotify::Error,
    },
    /// The watched directory was deleted or moved.
    #[error("watched directory {path} is gone")]
    Gone {
        /// The directory.
        path: PathBuf,
    },
}

/// An inotify watch on the static pod path (or on a log's directory), on the runtime's shared
/// inotify instance.
pub struct DirWatch {
    watch: Watch,
    dir: PathBuf,
    /// For a single-file path, the file's name: other entries of the directory are ignored.
    only: Option<OsString>,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatch")
            .field("dir", &self.dir)
            .field("only", &self.only)
            .finish_non_exhaustive()
    }
}

impl DirWatch {
    /// Watches `manifest_path` (a directory, or a file through its directory). Must be called
    /// inside a tokio runtime.
    pub fn new(manifest_path: &Path) -> Result<Self, WatchError> {
        let (dir, only) = if manifest_path.is_dir() {
            (manifest_path.to_path_buf(), None)
        } else {
            let parent = manifest_path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            (
                parent.to_path_buf(),
                manifest_path.file_name().map(ToOwned::to_owned),
            )
        };
        let setup = |source| WatchError::Setup {
            path: dir.clone(),
            source,
        };
        let wanted = only.clone();
        let filter = move |name: &OsStr| {
            let hidden = name.as_encoded_bytes().first() == Some(&b'.');
            !hidden && wanted.as_deref().is_none_or(|only| only == name)
        };
        let mut watch = Instance::shared()
            .map_err(setup)?
            .watch_filtered(Box::new(filter));
        let mask = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_ONLYDIR;
        watch.add(&dir, mask).map_err(setup)?;
        Ok(Self { watch, dir, only })
    }

    /// The directory being watched.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits for a relevant change.
    pub async fn changed(&mut self) -> Result<(), WatchError> {
        let changes = self.watch.changed().await.map_err(|e| self.failed(e))?;
        self.classify(changes)
    }

    /// Consumes every change seen so far without waiting; still reports a vanished directory.
    pub fn drain(&mut self) -> Result<(), WatchError> {
        let changes = self.watch.take().map_err(|e| self.failed(e))?;
        self.classify(changes)
    }

    fn failed(&self, source: inotify::Error) -> WatchError {
        WatchError::Read {
            path: self.dir.clone(),
            source,
        }
    }

    /// An error if the directory went away. Every change that reaches here is relevant: the
    /// shared instance's filter dropped hidden and other files' entries.
    fn classify(&self, changes: inotify::Changes) -> Result<(), WatchError> {
        let gone = AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF;
        if changes.removed || changes.events.intersects(gone) {
            return Err(WatchError::Gone {
                path: self.dir.clone(),
            });
        }
        Ok(())
    }
}

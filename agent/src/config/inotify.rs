//! [`DirWatch`]: inotify on the static pod path, as an async "something changed" signal.
//!
//! A directory path is watched itself; a single-file path is watched through its parent
//! directory, filtered to that file's name, so that editors that replace the file by a rename
//! are still seen. Events about hidden files (names starting with `.`, e.g. editor swap files)
//! are ignored, like the files themselves.
//!
//! The watch only says *that* something changed; the file source then re-reads everything. When
//! the watched directory itself goes away, [`DirWatch::changed`] fails with
//! [`WatchError::Gone`] and the source falls back to its periodic re-read until it can watch
//! again.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent};
use tokio::io::unix::AsyncFd;

/// Why the watch could not be set up or stopped working.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// `inotify_init1` failed (e.g. the per-user instance limit).
    #[error("creating an inotify instance: {0}")]
    Init(#[source] Errno),
    /// `inotify_add_watch` failed (e.g. the directory does not exist).
    #[error("watching {path}: {source}")]
    AddWatch {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: Errno,
    },
    /// Registering the descriptor with tokio or reading events failed.
    #[error("reading inotify events for {path}: {source}")]
    Read {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The watched directory was deleted or moved.
    #[error("watched directory {path} is gone")]
    Gone {
        /// The directory.
        path: PathBuf,
    },
}

/// The inotify descriptor in the shape tokio's `AsyncFd` wants.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// An inotify watch on the static pod path.
pub struct DirWatch {
    fd: AsyncFd<InotifyFd>,
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
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(WatchError::Init)?;
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
        inotify
            .add_watch(dir.as_path(), mask)
            .map_err(|source| WatchError::AddWatch {
                path: dir.clone(),
                source,
            })?;
        // SAFETY: `InotifyFd` owns the descriptor (an `OwnedFd` inside `Inotify`), always
        // returns that same descriptor, and lives inside the `AsyncFd` until it is dropped, so
        // the descriptor stays open and unchanged for as long as tokio has it registered.
        let fd =
            unsafe { AsyncFd::register(InotifyFd(inotify)) }.map_err(|err| WatchError::Read {
                path: dir.clone(),
                source: err.into_parts().1,
            })?;
        Ok(Self { fd, dir, only })
    }

    /// The directory being watched.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits for a relevant change.
    pub async fn changed(&mut self) -> Result<(), WatchError> {
        loop {
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|source| WatchError::Read {
                    path: self.dir.clone(),
                    source,
                })?;
            match guard.get_inner().0.read_events() {
                Ok(events) => {
                    if self.classify(&events)? {
                        return Ok(());
                    }
                }
                Err(Errno::EAGAIN) => guard.clear_ready(),
                Err(errno) => {
                    return Err(WatchError::Read {
                        path: self.dir.clone(),
                        source: errno.into(),
                    })
                }
            }
        }
    }

    /// Consumes every queued event without waiting; still reports a vanished directory.
    pub fn drain(&mut self) -> Result<(), WatchError> {
        loop {
            match self.fd.get_ref().0.read_events() {
                Ok(events) => {
                    self.classify(&events)?;
                }
                Err(Errno::EAGAIN) => return Ok(()),
                Err(errno) => {
                    return Err(WatchError::Read {
                        path: self.dir.clone(),
                        source: errno.into(),
                    })
                }
            }
        }
    }

    /// Whether `events` contain a relevant change; an error if the directory went away.
    fn classify(&self, events: &[InotifyEvent]) -> Result<bool, WatchError> {
        let gone =
            AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED;
        let mut relevant = false;
        for event in events {
            if event.mask.intersects(gone) {
                return Err(WatchError::Gone {
                    path: self.dir.clone(),
                });
            }
            if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                relevant = true;
                continue;
            }
            let Some(name) = event.name.as_ref() else {
                continue;
            };
            let hidden = name.as_encoded_bytes().first() == Some(&b'.');
            let wanted = self.only.as_ref().is_none_or(|only| only == name);
            relevant |= wanted && !hidden;
        }
        Ok(relevant)
    }
}

//! Event sources for the event-driven PLEG: [`OomWatcher`] (an OOM kill happened in a cgroup)
//! and [`EmptyWatcher`] (a cgroup has no processes left); and for node-pressure eviction on
//! cgroup v2, [`MemoryPressureWatcher`] (PSI trigger and `memory.events.local`, see `pressure`).
//!
//! ```text
//!            v2                                   v1
//!  OOM    inotify IN_MODIFY on memory.events    eventfd via cgroup.event_control +
//!         → compare oom_kill                    memory.oom_control of every cgroup of the
//!                                               subtree (inotify IN_CREATE adds new ones)
//!                                               → compare oom_kill
//!  empty  inotify IN_MODIFY on cgroup.events    pidfd of the oldest member → rescan on its exit;
//!         → "populated 0"                       poll cgroup.procs every 250 ms while empty
//! ```
//!
//! Contract shared by both watchers:
//!
//! * `next().await` returns `Ok(Some(event))` per event, and `Ok(None)` once the cgroup has been
//!   removed — after that every call returns `Ok(None)` (the stream has ended).
//! * Events carry the monotonic instant they were observed at, for the pod cache's ordering.
//! * Every wait is bounded by a safety re-check (5 min, kubelet's relist period with its
//!   evented PLEG), so a lost notification delays an event but never loses it. Nothing waits
//!   for it in the normal case: every exit, OOM kill and removal wakes a watcher by itself.
//! * They need a tokio runtime with I/O and time enabled (`AsyncFd`, `sleep`).

mod empty;
mod oom;
mod pressure;

pub use empty::{EmptyEvent, EmptyWatcher};
pub use oom::{OomEvent, OomWatcher};
pub use pressure::{MemoryPressureWatcher, PressureEvent, PressureSource, PsiTrigger};

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use nix::sys::inotify::AddWatchFlags;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::error::{Error, Result};
use crate::inotify::{Instance, Watch};

/// Safety re-check interval of the watchers. Each re-check walks the pod's cgroup subtree:
/// at 1 s, then 10 s, per pod, this was most of the agent's idle CPU at a few hundred pods
/// (issue 14's density benchmark), for notifications that are not lost: exits wake pidfds
/// (v1) or `cgroup.events` (v2), OOM kills and removals the eventfds (v1) or `memory.events`
/// (v2). kubelet relists every 5 min with its evented PLEG; so do these, and the PLEG's own
/// relist comes first.
const SAFETY_INTERVAL: Duration = Duration::from_secs(300);

/// Types that own their file descriptor: `as_raw_fd` returns the same open fd for as long as the
/// value lives, which is what `AsyncFd::register_with_interest` requires.
pub(crate) trait OwnsFd: AsRawFd {}
impl OwnsFd for OwnedFd {}
impl OwnsFd for EventFd {}

/// Registers `inner` with the tokio reactor for readability.
pub(crate) fn register_readable<T: OwnsFd>(inner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: `OwnsFd` types own their fd, which stays open and unchanged until `inner` (moved
    // into the `AsyncFd`) is dropped.
    Ok(unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }?)
}

/// A watch of one cgroup interface file for modification and of its directory for deletion,
/// on the runtime's shared inotify instance (see [`crate::inotify`]): the directory's watch
/// is one wd for all the watchers of that cgroup.
struct FileWatch {
    watch: Watch,
    file: PathBuf,
}

impl FileWatch {
    fn new(dir: &Path, file_name: &str) -> Result<Self> {
        let file = dir.join(file_name);
        let setup = |source| Error::Inotify {
            path: file.clone(),
            source,
        };
        let mut watch = Instance::shared().map_err(setup)?.watch();
        watch.add(&file, AddWatchFlags::IN_MODIFY).map_err(setup)?;
        watch
            .add(
                dir,
                AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_ONLYDIR,
            )
            .map_err(setup)?;
        Ok(Self { watch, file })
    }

    /// Waits until the file was modified or a watch ended (the cgroup was removed, or the
    /// shared queue overflowed): the caller re-reads the file either way.
    async fn wait(&self) -> Result<()> {
        self.watch
            .changed()
            .await
            .map(drop)
            .map_err(|source| Error::Inotify {
                path: self.file.clone(),
                source,
            })
    }
}

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
//!  empty  inotify IN_MODIFY on cgroup.events    pidfd of every member → rescan on exit;
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
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::error::{Error, Result};

/// Safety re-check interval of the watchers. Each re-check walks the pod's cgroup subtree (and
/// a v1 emptiness re-check opens a pidfd per member): at 1 s, then 10 s, per pod, this was most
/// of the agent's idle CPU at a few hundred pods (issue 14's density benchmark), for
/// notifications that are not lost: exits wake pidfds (v1) or `cgroup.events` (v2), OOM kills
/// and removals the eventfds (v1) or `memory.events` (v2). kubelet relists every 5 min with
/// its evented PLEG; so do these, and the PLEG's own relist comes first.
const SAFETY_INTERVAL: Duration = Duration::from_secs(300);

/// Types that own their file descriptor: `as_raw_fd` returns the same open fd for as long as the
/// value lives, which is what `AsyncFd::register_with_interest` requires.
trait OwnsFd: AsRawFd {}
impl OwnsFd for OwnedFd {}
impl OwnsFd for EventFd {}
impl OwnsFd for InotifyFd {}

/// Registers `inner` with the tokio reactor for readability.
fn register_readable<T: OwnsFd>(inner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: `OwnsFd` types own their fd, which stays open and unchanged until `inner` (moved
    // into the `AsyncFd`) is dropped.
    Ok(unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }?)
}

/// nix's `Inotify` only implements `AsFd`; `AsyncFd` wants `AsRawFd`.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// An inotify instance watching one cgroup interface file for modification and its directory
/// for deletion.
struct FileWatch {
    fd: AsyncFd<InotifyFd>,
    file: PathBuf,
}

impl FileWatch {
    fn new(dir: &Path, file_name: &str) -> Result<Self> {
        let file = dir.join(file_name);
        let setup = |source: io::Error| Error::WatchSetup {
            what: "inotify",
            path: file.clone(),
            source,
        };
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| setup(e.into()))?;
        inotify
            .add_watch(&file, AddWatchFlags::IN_MODIFY)
            .map_err(|e| setup(e.into()))?;
        inotify
            .add_watch(
                dir,
                AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_ONLYDIR,
            )
            .map_err(|e| setup(e.into()))?;
        let fd = register_readable(InotifyFd(inotify)).map_err(setup)?;
        Ok(Self { fd, file })
    }

    /// Waits until at least one inotify event arrived and consumes the pending ones.
    async fn wait(&self) -> Result<()> {
        loop {
            let mut guard = self.fd.readable().await.map_err(|e| self.failed(e))?;
            match guard.try_io(|inner| inner.get_ref().0.read_events().map_err(io::Error::from)) {
                Ok(Ok(_events)) => return Ok(()),
                Ok(Err(e)) => return Err(self.failed(e)),
                Err(_would_block) => {}
            }
        }
    }

    fn failed(&self, source: io::Error) -> Error {
        Error::Watch {
            what: "inotify",
            path: self.file.clone(),
            source,
        }
    }
}

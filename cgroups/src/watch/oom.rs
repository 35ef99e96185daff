//! [`OomWatcher`]: one event per observed increase of a cgroup's OOM-kill counter (see
//! `Hierarchy::oom_kill_count`; kills before the watcher was created are not reported).
//!
//! v2: inotify on `memory.events`, which the kernel touches for every memory event in the
//! cgroup or below; the `oom_kill` counter tells kills apart from other events.
//!
//! v1: an eventfd registered through `cgroup.event_control` for `memory.oom_control`. The kernel
//! signals it when this cgroup **or an ancestor** runs out of memory — *before* the victim is
//! chosen — and once more when the cgroup is removed. So after a wake-up the counter is re-read
//! for up to 1 s until the kill shows up. OOMs caused by a *descendant's* own limit do not
//! signal us; the 10 s safety re-check picks those up (a container whose init is the victim is
//! reported at once by its exit, with the counter read then).
//!
//! Limitation: the counter lives in the cgroup. A kill that is followed by the cgroup's removal
//! before the watcher has read the counter is not reported; read
//! [`Hierarchy::oom_kill_count`] before removing a cgroup whose OOM kills matter.

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::unix::AsyncFd;

use super::{register_readable, FileWatch, V1_SAFETY_INTERVAL, V2_SAFETY_INTERVAL};
use crate::error::{Error, Result};
use crate::fs;
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;

/// How long the v1 counter is re-read after a notification.
const V1_SETTLE: Duration = Duration::from_secs(1);
const V1_SETTLE_POLL: Duration = Duration::from_millis(20);

/// An OOM kill observed in the watched cgroup (or below it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomEvent {
    /// Kills since the previous event (usually 1; more if several happened between reads).
    pub new_kills: u64,
    /// The cgroup's OOM-kill counter after these kills.
    pub total_kills: u64,
    /// When the kill was observed.
    pub observed_at: Instant,
}

/// Watches one cgroup for OOM kills. Created by [`Hierarchy::watch_oom`]; see the `watch` module
/// docs for the contract of `next`.
pub struct OomWatcher {
    hierarchy: Hierarchy,
    path: CgroupPath,
    memory_dir: PathBuf,
    source: Source,
    last_total: u64,
    ended: bool,
}

enum Source {
    V1(AsyncFd<EventFd>),
    V2(FileWatch),
}

impl Hierarchy {
    /// Starts watching cgroup `path` for OOM kills. Must be called inside a tokio runtime.
    pub fn watch_oom(&self, path: &CgroupPath) -> Result<OomWatcher> {
        let memory_dir = self.require_dir("memory", path)?;
        let source = match self {
            Self::V1 { .. } => Source::V1(register_v1(&memory_dir)?),
            Self::V2 { .. } => Source::V2(FileWatch::new(&memory_dir, "memory.events")?),
        };
        let last_total = self.oom_kill_count(path)?;
        tracing::debug!(cgroup = %path, last_total, "watching for OOM kills");
        Ok(OomWatcher {
            hierarchy: self.clone(),
            path: path.clone(),
            memory_dir,
            source,
            last_total,
            ended: false,
        })
    }
}

/// `echo "<eventfd> <fd of memory.oom_control>" > cgroup.event_control`.
fn register_v1(memory_dir: &std::path::Path) -> Result<AsyncFd<EventFd>> {
    use std::os::fd::AsRawFd;
    let control = memory_dir.join("cgroup.event_control");
    let setup = |source: io::Error| Error::WatchSetup {
        what: "eventfd",
        path: control.clone(),
        source,
    };
    let eventfd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
        .map_err(|e| setup(e.into()))?;
    let oom_control = std::fs::File::open(memory_dir.join("memory.oom_control")).map_err(setup)?;
    let line = format!("{} {}", eventfd.as_raw_fd(), oom_control.as_raw_fd());
    fs::write_raw(&control, &line).map_err(setup)?;
    register_readable(eventfd).map_err(setup)
}

impl OomWatcher {
    /// The watched cgroup.
    #[must_use]
    pub fn path(&self) -> &CgroupPath {
        &self.path
    }

    /// The next OOM kill, or `None` once the cgroup is gone.
    pub async fn next(&mut self) -> Result<Option<OomEvent>> {
        let mut settle_until: Option<Instant> = None;
        loop {
            if self.ended || !self.memory_dir.is_dir() {
                return Ok(self.end());
            }
            let total = self.hierarchy.oom_kill_count(&self.path)?;
            if total > self.last_total {
                let event = OomEvent {
                    new_kills: total - self.last_total,
                    total_kills: total,
                    observed_at: Instant::now(),
                };
                self.last_total = total;
                tracing::info!(cgroup = %self.path, new_kills = event.new_kills, total, "OOM kill");
                return Ok(Some(event));
            }
            // v1 sums over descendants, which can disappear and take their counts with them.
            self.last_total = total;
            if settle_until.is_some_and(|until| Instant::now() < until) {
                tokio::time::sleep(V1_SETTLE_POLL).await;
                continue;
            }
            settle_until = None;
            if self.wait().await? {
                settle_until = Some(Instant::now() + V1_SETTLE);
            }
        }
    }

    /// Waits for a notification or the safety interval. `true` if a v1 eventfd fired.
    async fn wait(&mut self) -> Result<bool> {
        match &self.source {
            Source::V1(eventfd) => {
                tokio::select! {
                    woke = wait_eventfd(eventfd, &self.memory_dir) => woke.map(|()| true),
                    () = tokio::time::sleep(V1_SAFETY_INTERVAL) => Ok(false),
                }
            }
            Source::V2(watch) => {
                tokio::select! {
                    woke = watch.wait() => woke.map(|()| false),
                    () = tokio::time::sleep(V2_SAFETY_INTERVAL) => Ok(false),
                }
            }
        }
    }

    fn end(&mut self) -> Option<OomEvent> {
        if !self.ended {
            tracing::debug!(cgroup = %self.path, "cgroup gone; OOM watch ended");
            self.ended = true;
        }
        None
    }
}

async fn wait_eventfd(eventfd: &AsyncFd<EventFd>, dir: &std::path::Path) -> Result<()> {
    let failed = |source: io::Error| Error::Watch {
        what: "eventfd",
        path: dir.join("cgroup.event_control"),
        source,
    };
    loop {
        let mut guard = eventfd.readable().await.map_err(failed)?;
        match guard.try_io(|inner| inner.get_ref().read().map_err(io::Error::from)) {
            Ok(Ok(_count)) => return Ok(()),
            Ok(Err(e)) => return Err(failed(e)),
            Err(_would_block) => {}
        }
    }
}

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
//! signal an ancestor's eventfd, so every cgroup of the subtree gets one (as containerd
//! registers one per container). The set is re-read after every wake-up and on
//! [`OomWatcher::rescan`], which the owner calls when it created a child cgroup (a container
//! started after the watch began; an inotify instance per watcher would exhaust
//! `fs.inotify.max_user_instances`, 128 by default, at a few hundred pods). No periodic
//! re-check is needed; the safety one is minutes apart.
//!
//! Limitation: the counter lives in the cgroup. A kill that is followed by the cgroup's removal
//! before the watcher has read the counter is not reported; read
//! [`Hierarchy::oom_kill_count`] before removing a cgroup whose OOM kills matter.

use std::future::poll_fn;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::unix::AsyncFd;

use super::{register_readable, FileWatch, SAFETY_INTERVAL};
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
    /// Until when the counter is re-read after a v1 notification (kept across a cancelled
    /// `next`).
    settle_until: Option<Instant>,
}

enum Source {
    V1(V1Sources),
    V2(FileWatch),
}

/// v1: an eventfd per memory cgroup of the subtree, and those cgroups.
struct V1Sources {
    eventfds: Vec<AsyncFd<EventFd>>,
    dirs: Vec<PathBuf>,
}

impl Hierarchy {
    /// Starts watching cgroup `path` for OOM kills. Must be called inside a tokio runtime.
    pub fn watch_oom(&self, path: &CgroupPath) -> Result<OomWatcher> {
        let memory_dir = self.require_dir("memory", path)?;
        let source = match self {
            Self::V1 { .. } => Source::V1(v1_sources(&memory_dir, fs::subtree(&memory_dir)?)?),
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
            settle_until: None,
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

/// An eventfd for every memory cgroup of the subtree at `memory_dir` (`dirs`, as
/// [`fs::subtree`] lists them). A descendant removed meanwhile is skipped; the root must be
/// there.
fn v1_sources(memory_dir: &Path, dirs: Vec<PathBuf>) -> Result<V1Sources> {
    let mut eventfds = Vec::new();
    for dir in &dirs {
        match register_v1(dir) {
            Ok(eventfd) => eventfds.push(eventfd),
            Err(err) if dir == memory_dir => return Err(err),
            Err(err) => tracing::debug!(dir = %dir.display(), %err, "child cgroup not watched"),
        }
    }
    Ok(V1Sources { eventfds, dirs })
}

/// Polls `fd` for readability and consumes what is there with `read`.
fn poll_consume<T: AsRawFd>(
    fd: &AsyncFd<T>,
    cx: &mut Context<'_>,
    read: impl Fn(&T) -> io::Result<()>,
) -> Poll<io::Result<()>> {
    loop {
        let mut guard = ready!(fd.poll_read_ready(cx))?;
        if let Ok(result) = guard.try_io(|inner| read(inner.get_ref())) {
            return Poll::Ready(result);
        }
    }
}

/// Waits until an eventfd fires.
async fn wait_v1(sources: &V1Sources, dir: &Path) -> Result<()> {
    poll_fn(|cx| {
        for eventfd in &sources.eventfds {
            if let Poll::Ready(read) =
                poll_consume(eventfd, cx, |e| e.read().map(drop).map_err(io::Error::from))
            {
                return Poll::Ready(read.map_err(|source| Error::Watch {
                    what: "eventfd",
                    path: dir.join("cgroup.event_control"),
                    source,
                }));
            }
        }
        Poll::Pending
    })
    .await
}

impl OomWatcher {
    /// The watched cgroup.
    #[must_use]
    pub fn path(&self) -> &CgroupPath {
        &self.path
    }

    /// The next OOM kill, or `None` once the cgroup is gone.
    pub async fn next(&mut self) -> Result<Option<OomEvent>> {
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
            if self
                .settle_until
                .is_some_and(|until| Instant::now() < until)
            {
                tokio::time::sleep(V1_SETTLE_POLL).await;
                continue;
            }
            self.settle_until = None;
            if self.wait().await? {
                self.settle_until = Some(Instant::now() + V1_SETTLE);
            }
        }
    }

    /// Waits for a notification or the safety interval. `true` if a v1 eventfd fired. A v1
    /// wake-up re-reads the subtree's cgroups (some may be new, some gone).
    async fn wait(&mut self) -> Result<bool> {
        match &mut self.source {
            Source::V1(sources) => {
                let woke = tokio::select! {
                    woke = wait_v1(sources, &self.memory_dir) => { woke?; true }
                    () = tokio::time::sleep(SAFETY_INTERVAL) => false,
                };
                self.rescan()?;
                Ok(woke)
            }
            Source::V2(watch) => {
                tokio::select! {
                    woke = watch.wait() => woke.map(|()| false),
                    () = tokio::time::sleep(SAFETY_INTERVAL) => Ok(false),
                }
            }
        }
    }

    /// Re-reads which cgroups the subtree has (v1: each needs its own eventfd). Call it
    /// after creating a child cgroup of the watched one; cheap when nothing changed (the
    /// subtree's directories are listed, nothing registered). Not needed on v2.
    pub fn rescan(&mut self) -> Result<()> {
        let Source::V1(sources) = &mut self.source else {
            return Ok(());
        };
        let dirs = fs::subtree(&self.memory_dir)?;
        if dirs == sources.dirs {
            return Ok(());
        }
        match v1_sources(&self.memory_dir, dirs) {
            Ok(fresh) => *sources = fresh,
            // Gone: the next round ends the stream.
            Err(_) if !self.memory_dir.is_dir() => {}
            Err(err) => return Err(err),
        }
        Ok(())
    }

    fn end(&mut self) -> Option<OomEvent> {
        if !self.ended {
            tracing::debug!(cgroup = %self.path, "cgroup gone; OOM watch ended");
            self.ended = true;
        }
        None
    }
}

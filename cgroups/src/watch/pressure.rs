//! Memory pressure of a cgroup v2 group as it happens, for node-pressure eviction (issue
//! 14): cgroup v2 has no usage threshold event (v1's `memory.usage_in_bytes` eventfd), so
//! [`MemoryPressureWatcher`] wakes on what v2 does signal:
//!
//! * a PSI trigger on the group's `memory.pressure` (`some <stall µs> <window µs>`, polled
//!   for `POLLPRI`): tasks of the group stalled on memory (reclaim, refaults, throttling
//!   above `memory.high`) for longer than the stall time within the window;
//! * inotify `IN_MODIFY` on its `memory.events.local`: a `low`, `high`, `max`, `oom` or
//!   `oom_kill` counter of the group's own limits moved (not its children's: a pod at its
//!   own limit does not wake the watcher of the pods' tree; the root group has no such
//!   file: PSI only there).
//!
//! PSI is hierarchical: stalls of the group's descendants count.
//!
//! The kernel signals a PSI trigger at most once per window. The root group's
//! `memory.pressure` is the system-wide `/proc/pressure/memory` where the root has none.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::{Interest, Ready};

use super::{FileWatch, OwnsFd};
use crate::error::{Error, Result};
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;

/// A PSI trigger: notify when tasks stalled on memory for `stall` within `window` (the
/// kernel accepts windows of 500 ms to 10 s, and a stall shorter than the window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PsiTrigger {
    /// Total stall time ("some": at least one task stalled) that fires the trigger.
    pub stall: Duration,
    /// The tracking window.
    pub window: Duration,
}

impl Default for PsiTrigger {
    /// 100 ms of stall within 1 s: seen within a second of the pressure starting.
    fn default() -> Self {
        Self {
            stall: Duration::from_millis(100),
            window: Duration::from_secs(1),
        }
    }
}

impl PsiTrigger {
    /// The line written to a pressure file.
    fn line(self) -> String {
        format!(
            "some {} {}",
            self.stall.as_micros(),
            self.window.as_micros()
        )
    }
}

/// Which source woke a [`MemoryPressureWatcher`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PressureSource {
    /// The PSI trigger on `memory.pressure` fired.
    Stall,
    /// A `memory.events.local` counter changed.
    Events,
}

/// One memory pressure notification.
#[derive(Debug, Clone, Copy)]
pub struct PressureEvent {
    /// What signalled it.
    pub source: PressureSource,
    /// When it was observed (monotonic).
    pub observed_at: Instant,
}

/// Watches one cgroup v2 group for memory pressure. See the module documentation.
pub struct MemoryPressureWatcher {
    path: CgroupPath,
    dir: PathBuf,
    psi: Option<(AsyncFd<OwnedFd>, PathBuf)>,
    events: Option<FileWatch>,
    ended: bool,
}

impl std::fmt::Debug for MemoryPressureWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPressureWatcher")
            .field("path", &self.path)
            .field("psi", &self.psi.as_ref().map(|(_, file)| file))
            .field("events", &self.events.is_some())
            .finish()
    }
}

/// Opens `file` and writes the trigger; the trigger lives as long as the descriptor.
fn open_trigger(file: &Path, trigger: PsiTrigger) -> Result<AsyncFd<OwnedFd>> {
    let setup = |source: io::Error| Error::WatchSetup {
        what: "PSI trigger",
        path: file.to_path_buf(),
        source,
    };
    let mut handle = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(file)
        .map_err(setup)?;
    handle.write_all(trigger.line().as_bytes()).map_err(setup)?;
    register_priority(OwnedFd::from(handle)).map_err(setup)
}

/// Registers `inner` with the tokio reactor for `POLLPRI` (a PSI trigger's event).
fn register_priority<T: OwnsFd>(inner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: `OwnsFd` types own their fd, which stays open and unchanged until `inner`
    // (moved into the `AsyncFd`) is dropped.
    unsafe { AsyncFd::register_with_interest(inner, Interest::PRIORITY) }
        .map_err(|e| e.into_parts().1)
}

impl Hierarchy {
    /// Starts watching cgroup `path` for memory pressure (cgroup v2 only: v1 has no PSI
    /// per group and signals usage levels instead). Must be called inside a tokio runtime.
    pub fn watch_memory_pressure(
        &self,
        path: &CgroupPath,
        trigger: PsiTrigger,
    ) -> Result<MemoryPressureWatcher> {
        let dir = self.require_dir("memory", path)?;
        if !self.is_v2() {
            return Err(Error::WatchSetup {
                what: "PSI trigger",
                path: dir.join("memory.pressure"),
                source: io::Error::new(
                    io::ErrorKind::Unsupported,
                    "memory pressure triggers need cgroup v2",
                ),
            });
        }
        let mut pressure_file = dir.join("memory.pressure");
        if !pressure_file.exists() && path.is_root() {
            pressure_file = PathBuf::from("/proc/pressure/memory");
        }
        let psi = open_trigger(&pressure_file, trigger)?;
        let events = if dir.join("memory.events.local").exists() {
            Some(FileWatch::new(&dir, "memory.events.local")?)
        } else {
            None
        };
        tracing::debug!(cgroup = %path, file = %pressure_file.display(), trigger = trigger.line(), events = events.is_some(), "watching for memory pressure");
        Ok(MemoryPressureWatcher {
            path: path.clone(),
            dir,
            psi: Some((psi, pressure_file)),
            events,
            ended: false,
        })
    }
}

impl MemoryPressureWatcher {
    /// The watched cgroup.
    #[must_use]
    pub fn path(&self) -> &CgroupPath {
        &self.path
    }

    /// The next notification, or `None` once the cgroup is gone.
    pub async fn next(&mut self) -> Result<Option<PressureEvent>> {
        if self.ended || !self.dir.is_dir() {
            self.ended = true;
            return Ok(None);
        }
        let source = tokio::select! {
            stall = wait_psi(self.psi.as_ref()) => { stall?; PressureSource::Stall }
            events = wait_events(self.events.as_ref()) => { events?; PressureSource::Events }
        };
        if !self.dir.is_dir() {
            self.ended = true;
            return Ok(None);
        }
        tracing::debug!(cgroup = %self.path, ?source, "memory pressure");
        Ok(Some(PressureEvent {
            source,
            observed_at: Instant::now(),
        }))
    }
}

async fn wait_psi(psi: Option<&(AsyncFd<OwnedFd>, PathBuf)>) -> Result<()> {
    let Some((fd, file)) = psi else {
        return std::future::pending().await;
    };
    let mut guard = fd
        .ready(Interest::PRIORITY)
        .await
        .map_err(|source| Error::Watch {
            what: "PSI trigger",
            path: file.clone(),
            source,
        })?;
    // The kernel's poll consumed the event; wait for the next wake-up.
    guard.clear_ready_matching(Ready::PRIORITY);
    Ok(())
}

async fn wait_events(events: Option<&FileWatch>) -> Result<()> {
    match events {
        Some(watch) => watch.wait().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_trigger_is_100ms_of_stall_in_a_1s_window() {
        assert_eq!(PsiTrigger::default().line(), "some 100000 1000000");
    }
}

//! [`EmptyWatcher`]: an event each time a cgroup (with its descendants) is observed without
//! processes.
//!
//! Semantics: level-triggered at the start (a cgroup that is already empty yields one event right
//! away, so an exit that happened before the watch began is not lost), edge-triggered after that
//! (the next event needs the cgroup to have been seen populated in between). A cgroup removed
//! while last seen populated (it was killed and removed between two observations) yields one
//! final event before the stream ends, since removal implies it emptied.
//!
//! v2: inotify on `cgroup.events`, whose `populated` line the kernel updates (and notifies) when
//! the last process of the subtree exits.
//!
//! v1 has no such notification for non-root cgroups (`notify_on_release` runs a global
//! `release_agent` binary: not usable by a library). Instead, while the cgroup is populated we hold
//! a pidfd for each member (up to [`MAX_PIDFDS`]); a pidfd becomes readable when its process
//! exits, and we rescan `cgroup.procs` of the subtree then. Exits are therefore reported without
//! polling delay. While the cgroup is empty (or holds more members than we hold pidfds for), we
//! poll `cgroup.procs` every 250 ms, which is also how removal is noticed.

use std::future::poll_fn;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use super::{register_readable, FileWatch, SAFETY_INTERVAL};
use crate::error::{Error, Result};
use crate::fs;
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;
use crate::pidfd;

/// v1 polling interval while the cgroup is empty or pidfds do not cover every member.
const V1_POLL: Duration = Duration::from_millis(250);
/// Most pidfds held per v1 watcher.
const MAX_PIDFDS: usize = 64;

/// The watched cgroup was observed without processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmptyEvent {
    /// When emptiness was observed.
    pub observed_at: Instant,
}

/// Watches one cgroup for becoming empty. Created by [`Hierarchy::watch_empty`]; see the `watch`
/// module docs for the contract of `next`.
pub struct EmptyWatcher {
    path: CgroupPath,
    dir: PathBuf,
    source: Source,
    /// What the last observation saw: `None` before the first.
    was_empty: Option<bool>,
    ended: bool,
}

enum Source {
    V1 {
        /// The member pids at the last pidfd wake-up, to detect zombies that stay listed.
        last_woken_with: Option<Vec<i32>>,
    },
    V2(FileWatch),
}

impl Hierarchy {
    /// Starts watching cgroup `path` for emptiness. Must be called inside a tokio runtime.
    pub fn watch_empty(&self, path: &CgroupPath) -> Result<EmptyWatcher> {
        let dir = self
            .membership_dir(path)
            .ok_or_else(|| Error::ControllerMissing {
                controller: "pids",
                path: path.clone(),
            })?;
        let source = match self {
            Self::V1 { .. } => Source::V1 {
                last_woken_with: None,
            },
            Self::V2 { .. } => Source::V2(FileWatch::new(&dir, "cgroup.events")?),
        };
        tracing::debug!(cgroup = %path, ?dir, "watching for emptiness");
        Ok(EmptyWatcher {
            path: path.clone(),
            dir,
            source,
            was_empty: None,
            ended: false,
        })
    }
}

impl EmptyWatcher {
    /// The watched cgroup.
    #[must_use]
    pub fn path(&self) -> &CgroupPath {
        &self.path
    }

    /// The next time the cgroup is observed empty, or `None` once the cgroup is gone.
    pub async fn next(&mut self) -> Result<Option<EmptyEvent>> {
        loop {
            if self.ended || !self.dir.is_dir() {
                return Ok(self.end());
            }
            let members = match &self.source {
                Source::V1 { .. } => fs::procs_recursive(&self.dir)?,
                Source::V2(_) => match populated_v2(&self.dir)? {
                    None => return Ok(self.end()),
                    Some(true) => vec![0],
                    Some(false) => Vec::new(),
                },
            };
            let empty = members.is_empty();
            let edge = self.was_empty != Some(true);
            self.was_empty = Some(empty);
            if empty && edge {
                tracing::debug!(cgroup = %self.path, "cgroup is empty");
                return Ok(Some(EmptyEvent {
                    observed_at: Instant::now(),
                }));
            }
            match &mut self.source {
                Source::V1 { last_woken_with } => wait_v1(members, last_woken_with).await,
                Source::V2(watch) => {
                    tokio::select! {
                        woke = watch.wait() => woke?,
                        () = tokio::time::sleep(SAFETY_INTERVAL) => {}
                    }
                }
            }
        }
    }

    /// Ends the stream. A cgroup can only be removed once empty, so if it was last seen
    /// populated, that emptiness is reported first (once) instead of being lost.
    fn end(&mut self) -> Option<EmptyEvent> {
        if self.ended {
            return None;
        }
        self.ended = true;
        tracing::debug!(cgroup = %self.path, "cgroup gone; emptiness watch ended");
        (self.was_empty == Some(false)).then(|| EmptyEvent {
            observed_at: Instant::now(),
        })
    }
}

/// `Some(populated)` from `cgroup.events`, `None` if the cgroup is gone.
fn populated_v2(dir: &std::path::Path) -> Result<Option<bool>> {
    let file = dir.join("cgroup.events");
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Read { path: file, source }),
    };
    Ok(Some(
        fs::required_keyed_value(&file, &text, "populated")? != 0,
    ))
}

/// v1: waits for one of `members` to exit (pidfds), or polls. See the module docs.
async fn wait_v1(members: Vec<i32>, last_woken_with: &mut Option<Vec<i32>>) {
    // A pidfd of a process that already exited is readable at once; if the previous wake-up saw
    // exactly these members, someone is a lingering zombie: poll instead of spinning.
    let stale = last_woken_with.as_ref() == Some(&members);
    if members.is_empty() || stale {
        *last_woken_with = None;
        tokio::time::sleep(V1_POLL).await;
        return;
    }
    let mut fds: Vec<AsyncFd<OwnedFd>> = Vec::new();
    let mut already_gone = false;
    for pid in members.iter().take(MAX_PIDFDS) {
        match pidfd::open(*pid) {
            Ok(Some(fd)) => fds.extend(register_readable(fd).ok()),
            Ok(None) => already_gone = true,
            Err(err) => tracing::debug!(pid, ?err, "no pidfd; polling for this member"),
        }
    }
    if already_gone {
        // A member exited between the scan and now: rescan at once.
        *last_woken_with = Some(members);
        return;
    }
    if fds.is_empty() {
        tokio::time::sleep(V1_POLL).await;
        return;
    }
    // Every member has a pidfd: the cgroup cannot empty without one of them exiting.
    let fallback = if fds.len() < members.len() {
        V1_POLL
    } else {
        SAFETY_INTERVAL
    };
    let any_exit = poll_fn(|cx| {
        if fds.iter().any(|fd| fd.poll_read_ready(cx).is_ready()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    tokio::select! {
        () = any_exit => *last_woken_with = Some(members),
        () = tokio::time::sleep(fallback) => *last_woken_with = None,
    }
}

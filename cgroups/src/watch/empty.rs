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
//! a pidfd of **one** member, the oldest (earliest start time): the cgroup cannot empty while it
//! lives. Its pidfd becomes readable when it exits; we rescan `cgroup.procs` of the subtree then
//! and watch the oldest member left, so the last exit is reported without polling delay. The
//! watched member is kept across rescans: a container whose shell runs a short-lived command
//! every 100 ms (a `while … sleep 0.1` loop) wakes nobody; holding a pidfd of every member, as
//! this did, woke the watcher at each of those exits to list the cgroup and register pidfds
//! again (at 100 such pods, a thousand wake-ups a second of allocation churn in the agent).
//! While the cgroup is empty, or no member could be watched, we poll `cgroup.procs` every
//! 250 ms, which is also how removal is noticed.
//!
//! A member is watched only once a scan made *after* its pidfd was opened still lists its pid
//! while the pidfd shows it alive: the pid cannot have been reused by then, so the watched
//! process is a member (not an unrelated process that got a recycled pid).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use super::{register_readable, FileWatch, SAFETY_INTERVAL};
use crate::error::{Error, Result};
use crate::fs;
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;
use crate::pidfd;

/// v1 polling interval while the cgroup is empty or no member can be watched.
const V1_POLL: Duration = Duration::from_millis(250);
/// Most members whose start time is read to pick the oldest.
const MAX_CANDIDATES: usize = 64;

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
    /// How many times the members were listed.
    scans: u64,
}

enum Source {
    V1(V1Watch),
    V2(FileWatch),
}

/// v1: the member whose exit is waited for, see the module docs.
#[derive(Default)]
struct V1Watch {
    /// Its pid and pidfd (a member once a scan made after the pidfd was opened listed it).
    watched: Option<Watched>,
    /// The last wait returned at once because a member had exited since its scan.
    just_rescanned: bool,
}

struct Watched {
    pid: i32,
    fd: AsyncFd<OwnedFd>,
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
            Self::V1 { .. } => Source::V1(V1Watch::default()),
            Self::V2 { .. } => Source::V2(FileWatch::new(&dir, "cgroup.events")?),
        };
        tracing::debug!(cgroup = %path, ?dir, "watching for emptiness");
        Ok(EmptyWatcher {
            path: path.clone(),
            dir,
            source,
            was_empty: None,
            ended: false,
            scans: 0,
        })
    }
}

impl EmptyWatcher {
    /// The watched cgroup.
    #[must_use]
    pub fn path(&self) -> &CgroupPath {
        &self.path
    }

    /// How many times the watcher has looked at the cgroup's members (`cgroup.procs` on v1,
    /// `cgroup.events` on v2): what a watcher costs while the cgroup stays populated.
    #[must_use]
    pub fn scans(&self) -> u64 {
        self.scans
    }

    /// The next time the cgroup is observed empty, or `None` once the cgroup is gone.
    pub async fn next(&mut self) -> Result<Option<EmptyEvent>> {
        loop {
            if self.ended || !self.dir.is_dir() {
                return Ok(self.end());
            }
            self.scans += 1;
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
                Source::V1(watch) => watch.wait(&members).await,
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

impl V1Watch {
    /// Waits until the watched member exits (or the safety interval passes); returns at once
    /// to have a newly chosen member confirmed by a rescan; polls when none can be watched.
    /// `members`: the scan just made.
    async fn wait(&mut self, members: &[i32]) {
        if let Some(w) = self.watched.take() {
            if members.contains(&w.pid) && !exited(&w.fd) {
                // Listed by a scan made after its pidfd was opened, and alive since: a member.
                let watched = self.watched.insert(w);
                // The cgroup cannot empty before it exits (unless it is moved out: the
                // safety re-check).
                tokio::select! {
                    _ = watched.fd.readable() => {}
                    () = tokio::time::sleep(SAFETY_INTERVAL) => {}
                }
                return;
            }
            // Exited, or no longer a member: choose another.
        }
        match oldest_alive(members) {
            Pick::Member(watched) => {
                self.watched = Some(watched);
                self.just_rescanned = false;
            }
            // A member exited since the scan: the cgroup may be empty now; rescan at once,
            // but not twice in a row (then poll).
            Pick::Exited if !self.just_rescanned => self.just_rescanned = true,
            Pick::Exited | Pick::None => {
                self.just_rescanned = false;
                tokio::time::sleep(V1_POLL).await;
            }
        }
    }
}

/// What [`oldest_alive`] found.
enum Pick {
    Member(Watched),
    /// No member to watch: some had exited since the scan.
    Exited,
    /// No member to watch (no pidfds here).
    None,
}

/// Whether the process of `fd` has exited (its pidfd is readable).
fn exited(fd: &AsyncFd<OwnedFd>) -> bool {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: fd.get_ref().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
    ready != 0
}

/// A pidfd of the member of `members` that started first and still runs (unconfirmed: the
/// next scan confirms it).
fn oldest_alive(members: &[i32]) -> Pick {
    let mut candidates: Vec<(u64, i32)> = members
        .iter()
        .take(MAX_CANDIDATES)
        .map(|&pid| (start_time(pid).unwrap_or(u64::MAX), pid))
        .collect();
    candidates.sort_unstable();
    let mut any_exited = false;
    for (_, pid) in candidates {
        let fd = match pidfd::open(pid) {
            Ok(Some(fd)) => fd,
            Ok(None) => {
                any_exited = true;
                continue;
            }
            Err(err) => {
                tracing::debug!(pid, ?err, "no pidfd for a cgroup member");
                continue;
            }
        };
        let Ok(fd) = register_readable(fd) else {
            continue;
        };
        if exited(&fd) {
            any_exited = true;
            continue;
        }
        return Pick::Member(Watched { pid, fd });
    }
    if any_exited {
        Pick::Exited
    } else {
        Pick::None
    }
}

/// A process's start time (clock ticks after boot, `/proc/<pid>/stat` field 22).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

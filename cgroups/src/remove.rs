//! `Hierarchy::kill` and `Hierarchy::remove`: empty a cgroup subtree of processes, then delete
//! its directories bottom-up in every controller.
//!
//! ```text
//!  v2: write 1 to cgroup.kill ─┐                      ┌─► rmdir children, then the cgroup,
//!  v1: freeze (freezer.state) ─┴─► SIGKILL members ───┤   in every controller
//!      …thaw so they can die      (pidfd, re-checked) └── until no member is left, ≤ 5 s
//! ```
//!
//! Guarantees: removing a cgroup that does not exist is `Ok`; the hierarchy root is never
//! removed; our own process is never signalled (a cgroup holding it cannot be removed and
//! reports [`Error::KillProcesses`]). These calls block for at most ~5 s; async callers should
//! use `spawn_blocking`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fs;
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;
use crate::pidfd;

/// How long killed processes get to vanish before `kill` reports them.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a v1 freeze may take before we signal anyway.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `rmdir` is retried on `EBUSY` (a v1 cgroup stays busy briefly after its last exit).
const RMDIR_TIMEOUT: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(10);

impl Hierarchy {
    /// SIGKILLs every process in cgroup `path` and its descendants and waits until none is left.
    pub fn kill(&self, path: &CgroupPath) -> Result<()> {
        if path.is_root() {
            return Err(Error::RemoveRoot);
        }
        let own = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let dirs = self.dirs(path);
        let deadline = Instant::now() + KILL_TIMEOUT;
        let mut frozen = match self {
            Self::V2 { .. } => {
                kill_v2(&dirs)?;
                None
            }
            Self::V1 { .. } => self.controller_dir("freezer", path).and_then(Freeze::start),
        };
        loop {
            let mut remaining = 0;
            for dir in &dirs {
                remaining += fs::procs_recursive(dir)?.len();
            }
            if remaining == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                let own_inside = dirs
                    .iter()
                    .any(|d| fs::procs_recursive(d).is_ok_and(|p| p.contains(&own)));
                tracing::warn!(cgroup = %path, remaining, own_inside, "processes survived SIGKILL");
                return Err(Error::KillProcesses {
                    path: path.clone(),
                    remaining,
                });
            }
            for dir in &dirs {
                for sub in fs::subtree(dir)? {
                    pidfd::signal_members(&sub, libc::SIGKILL)?;
                }
            }
            // Frozen v1 tasks only die once thawed; they cannot fork any more by now.
            if let Some(freeze) = frozen.take() {
                freeze.thaw();
            }
            std::thread::sleep(POLL);
        }
    }

    /// Kills the processes of cgroup `path` (see [`Hierarchy::kill`]) and removes its directory
    /// and all descendants in every controller. A missing cgroup is `Ok`.
    pub fn remove(&self, path: &CgroupPath) -> Result<()> {
        if path.is_root() {
            return Err(Error::RemoveRoot);
        }
        let dirs: Vec<PathBuf> = self.dirs(path).into_iter().filter(|d| d.is_dir()).collect();
        if dirs.is_empty() {
            return Ok(());
        }
        self.kill(path)?;
        for dir in &dirs {
            remove_tree(dir)?;
        }
        tracing::debug!(cgroup = %path, "cgroup removed");
        Ok(())
    }
}

/// v2: `cgroup.kill` (Linux ≥ 5.14) kills the whole subtree at once; older kernels fall back to
/// the signalling loop in `kill`.
fn kill_v2(dirs: &[PathBuf]) -> Result<()> {
    for dir in dirs {
        let file = dir.join("cgroup.kill");
        if file.exists() {
            match fs::write_raw(&file, "1") {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::Write {
                        path: file,
                        value: "1".to_owned(),
                        source: e,
                    })
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// A v1 freezer cgroup we froze; thawed when dropped.
struct Freeze {
    state: PathBuf,
}

impl Freeze {
    /// Freezes `dir` (the cgroup in the freezer hierarchy) and waits up to [`FREEZE_TIMEOUT`].
    /// `None` if there is nothing to freeze or freezing failed (we then just signal).
    fn start(dir: PathBuf) -> Option<Self> {
        let state = dir.join("freezer.state");
        if !state.exists() {
            return None;
        }
        if let Err(err) = fs::write(&state, "FROZEN") {
            tracing::warn!(?err, "freezing before kill failed; signalling unfrozen");
            return None;
        }
        let freeze = Self { state };
        let deadline = Instant::now() + FREEZE_TIMEOUT;
        while Instant::now() < deadline {
            match fs::read(&freeze.state) {
                Ok(s) if s.trim() == "FROZEN" => break,
                Ok(_) => std::thread::sleep(POLL),
                Err(_) => break,
            }
        }
        Some(freeze)
    }

    fn thaw(self) {
        drop(self);
    }
}

impl Drop for Freeze {
    fn drop(&mut self) {
        if let Err(err) = fs::write(&self.state, "THAWED") {
            tracing::warn!(?err, "thawing after kill failed");
        }
    }
}

/// Removes `dir` and its descendants, deepest first, retrying `EBUSY` for a moment.
fn remove_tree(dir: &Path) -> Result<()> {
    for sub in fs::subtree(dir)?.iter().rev() {
        let deadline = Instant::now() + RMDIR_TIMEOUT;
        loop {
            match std::fs::remove_dir(sub) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    std::thread::sleep(POLL);
                }
                Err(source) => {
                    return Err(Error::RemoveDir {
                        path: sub.clone(),
                        source,
                    })
                }
            }
        }
    }
    Ok(())
}

//! The crate's one error type.
//!
//! Variants are grouped as in the rest of ironlet: bad input first (a caller can fix it), then the
//! environment (what this machine lacks), then the step that failed on a cgroup file or directory.
//! Every variant carries what failed — the cgroup path, or the file on disk — so the message that
//! reaches a pod status names it without extra context.

use std::io;
use std::path::PathBuf;

use crate::path::CgroupPath;

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `ironlet-cgroups`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- bad input -------------------------------------------------------------------------
    /// A cgroup path or a path component (pod UID, container id) is malformed.
    #[error("invalid cgroup path {path:?}: {reason}")]
    InvalidPath {
        /// The rejected input.
        path: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A node-tree operation was asked to touch a cgroup outside the node's root.
    #[error("cgroup {path} is outside the node tree {root}")]
    OutsideNodeTree {
        /// The path that was asked for.
        path: CgroupPath,
        /// The node tree's root.
        root: CgroupPath,
    },
    /// Removing (or killing) the hierarchy root was requested.
    #[error("refusing to remove the root of the cgroup hierarchy")]
    RemoveRoot,

    // ---- environment -----------------------------------------------------------------------
    /// Neither a cgroup v1 controller nor a cgroup2 file system is mounted.
    #[error("no cgroup file system found in {mountinfo}")]
    NoCgroupMounts {
        /// The mount table that was searched.
        mountinfo: PathBuf,
    },
    /// A setting or a readout needs a controller that this cgroup does not have.
    #[error("controller {controller} is not available for cgroup {path}")]
    ControllerMissing {
        /// The controller's kernel name (`memory`, `pids`, …).
        controller: &'static str,
        /// The cgroup that lacks it.
        path: CgroupPath,
    },

    /// Remounting the cgroup2 file system (to add `favordynmods`) failed.
    #[error("remounting {path} with options {options:?}")]
    Remount {
        /// The mount point.
        path: PathBuf,
        /// The option string passed.
        options: String,
        /// The error from mount(2).
        source: io::Error,
    },
    /// A remount went through but changed other options of the mount; they were restored.
    #[error("remounting {path} changed its options from {before} to {after}; restored")]
    RemountChangedOptions {
        /// The mount point.
        path: PathBuf,
        /// Per-mount / super-block options before.
        before: String,
        /// The same, after.
        after: String,
    },

    /// A mount(2) while building a container's cgroup view failed.
    #[error("mounting {source_path:?} on {target} ({flags})")]
    Mount {
        /// What was mounted (`None` for a remount).
        source_path: Option<PathBuf>,
        /// Where.
        target: PathBuf,
        /// The mount flags, for the message.
        flags: String,
        /// The error from mount(2).
        source: io::Error,
    },

    // ---- steps on cgroup files -------------------------------------------------------------
    /// Reading a file (cgroup interface file or `/proc`) failed.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Writing a value into a cgroup interface file failed.
    #[error("writing {value:?} to {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The I/O error.
        source: io::Error,
    },
    /// A file's content did not have the expected format.
    #[error("parsing {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Creating a cgroup directory failed.
    #[error("creating cgroup directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Removing a cgroup directory failed.
    #[error("removing cgroup directory {path}")]
    RemoveDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Processes were still in the cgroup after they were killed and waited for.
    #[error("{remaining} process(es) still in cgroup {path} after SIGKILL")]
    KillProcesses {
        /// The cgroup being emptied.
        path: CgroupPath,
        /// How many processes were left.
        remaining: usize,
    },
    /// Setting up an event source (eventfd, inotify, pidfd) failed.
    #[error("setting up {what} for {path}")]
    WatchSetup {
        /// Which event source.
        what: &'static str,
        /// The file or directory watched.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Watching a cgroup file on the shared inotify instance failed (setting it up or
    /// waiting on it).
    #[error("inotify watch of {path}")]
    Inotify {
        /// The file watched.
        path: PathBuf,
        /// What failed.
        source: crate::inotify::Error,
    },
    /// Waiting on an event source failed after it was set up.
    #[error("waiting for {what} on {path}")]
    Watch {
        /// Which event source.
        what: &'static str,
        /// The file or directory watched.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

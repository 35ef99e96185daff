//! File-system helpers of the image store: crash-safe writes, `flock` guards, tree removal
//! that copes with read-only directories, and disk-usage sums.
//!
//! Guarantees:
//! - [`write_atomic`] leaves either the old or the new content at `path` after a crash
//!   (unique temp file in the same directory, fsync, rename, fsync of the directory);
//! - a [`FileLock`] holds an `flock` on its lock file until dropped; locks taken by two
//!   processes, or by two threads of one process, exclude each other;
//! - [`remove_tree`] never follows symlinks (it descends through directory descriptors).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::ImageError;
use super::sys;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name unique to this process and call, for temp files and directories.
pub(crate) fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}{}-{n}-{nanos:x}", std::process::id())
}

/// Creates a new file only its owner may read (0600): nothing in the store is for others.
pub(crate) fn private_file(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(crate::fsutil::PRIVATE_FILE_MODE)
        .open(path)
}

/// Writes `bytes` to `path` atomically and durably (mode 0600).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(unique_name(".tmp-"));
    let result = (|| {
        let mut file = private_file(&tmp).map_err(|e| ImageError::io("creating", &tmp, e))?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| ImageError::io("writing", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| ImageError::io("renaming into", path, e))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes a per-container file of the store (a lease, a rootfs description) atomically;
/// durably unless the process's container state is throwaway
/// ([`crate::fsutil::set_state_throwaway`]).
pub(crate) fn write_state(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    crate::fsutil::write_state(path, bytes).map_err(|e| ImageError::io("writing", path, e))
}

/// fsyncs a directory so that renames into it survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), ImageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ImageError::io("syncing directory", dir, e))
}

/// Whether a lock excludes everyone or only exclusive holders.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LockKind {
    Shared,
    Exclusive,
}

/// An `flock` held until drop (closing the descriptor releases it).
#[derive(Debug)]
pub(crate) struct FileLock {
    _file: File,
}

impl FileLock {
    /// Blocks until the lock on `path` (created if missing) is held.
    pub(crate) fn acquire(path: &Path, kind: LockKind) -> Result<Self, ImageError> {
        Self::lock(path, kind, false)?
            .ok_or_else(|| ImageError::Task(format!("lock {} not taken", path.display())))
    }

    /// The lock on `path` if no one holds a conflicting one now; `None` otherwise.
    pub(crate) fn try_acquire(path: &Path, kind: LockKind) -> Result<Option<Self>, ImageError> {
        Self::lock(path, kind, true)
    }

    fn lock(path: &Path, kind: LockKind, nonblocking: bool) -> Result<Option<Self>, ImageError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(crate::fsutil::PRIVATE_FILE_MODE)
            .open(path)
            .map_err(|e| ImageError::index("opening lock", path, e))?;
        let mut op = match kind {
            LockKind::Shared => libc::LOCK_SH,
            LockKind::Exclusive => libc::LOCK_EX,
        };
        if nonblocking {
            op |= libc::LOCK_NB;
        }
        loop {
            // SAFETY: plain syscall on a descriptor we own.
            let ret = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), op) };
            if ret == 0 {
                return Ok(Some(Self { _file: file }));
            }
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(ImageError::index("locking", path, err));
            }
        }
    }
}

/// Removes `path` and everything below it; missing is fine. Read-only directories (as layers
/// often contain) are made writable first so that this works without root too.
pub(crate) fn remove_tree(path: &Path) -> Result<(), ImageError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(ImageError::io(
            "removing",
            path,
            io::Error::from_raw_os_error(libc::EINVAL),
        ));
    };
    let dir = match sys::open_dir(parent) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ImageError::io("opening", parent, e)),
    };
    sys::remove_at(dir.as_fd(), name).map_err(|e| ImageError::io("removing", path, e))
}

pub(crate) use crate::fsutil::disk_usage;

/// Creates `path` (and parents) with mode 0700, narrowing an existing directory that grants
/// other users anything (a store made before the modes were set).
pub(crate) fn ensure_private_dir(path: &Path) -> Result<(), ImageError> {
    crate::fsutil::private_dir(path).map_err(|e| ImageError::io("creating directory", path, e))
}

/// Creates `path` (and parents) as a directory.
pub(crate) fn ensure_dir(path: &Path) -> Result<(), ImageError> {
    std::fs::create_dir_all(path).map_err(|e| ImageError::io("creating directory", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn remove_tree_removes_read_only_directories_and_does_not_follow_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let victim = tmp.path().join("victim");
        std::fs::create_dir_all(victim.join("ro/sub")).unwrap();
        std::fs::write(victim.join("ro/sub/f"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, victim.join("ro/link")).unwrap();
        std::fs::set_permissions(victim.join("ro"), std::fs::Permissions::from_mode(0o555))
            .unwrap();
        remove_tree(&victim).unwrap();
        assert!(!victim.exists());
        assert!(outside.join("keep").exists());
        remove_tree(&victim).unwrap();
    }

    #[test]
    fn write_atomic_replaces_content_and_leaves_no_temp_files() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("index.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }
}

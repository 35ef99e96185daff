//! Opening a container's log file without following symlinks out of its pod log directory.
//!
//! A container that can write into the pod log directory (a hostPath of `/var/log/pods`)
//! could replace `<container>/<n>.log`, or `<container>/` itself, with a symlink to a host
//! file or directory, so that the agent appends the next instance's output there. So:
//!
//! - the pod log directory is opened with `O_NOFOLLOW`, each directory below it with
//!   `mkdirat` + `openat(O_NOFOLLOW)` from its parent's descriptor, and the file with
//!   `openat(O_NOFOLLOW)`; a symlink anywhere from the pod log directory down is refused
//!   (`ELOOP`/`ENOTDIR`), as containerd refuses one for the file (`O_NOFOLLOW`);
//! - a new instance's file is created with `O_CREAT|O_EXCL`; a regular file already there
//!   (a record lost in a crash, then the same name again) is continued, as containerd
//!   appends to it;
//! - the file must be a regular file with one link: a hard link to a host file is refused.
//!
//! Modes match containerd and the kubelet: directories 0755 (kubelet's pod and container
//! log directories), files 0640 owned by the agent's user (containerd's `openLogFile`), so
//! other host users can see which containers ran but not read what they printed. A file
//! left with a wider mode by an older ironlet is narrowed when it is continued.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// Mode of a container log file (containerd's `openLogFile`).
pub const LOG_FILE_MODE: u32 = 0o640;
/// Mode of the directories of container logs (kubelet's pod and container log dirs).
pub const LOG_DIR_MODE: u32 = 0o755;

/// Whether the file belongs to a new container instance or one being re-adopted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOpen {
    /// A container just created: its file should not exist yet.
    New,
    /// A container re-adopted after an agent restart: its file is continued.
    Continue,
}

/// Where a container's log file is: the pod's log directory and the path below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTarget<'a> {
    pub pod_dir: &'a Path,
    pub relative: &'a Path,
}

impl<'a> LogTarget<'a> {
    /// Splits `log_path` (`<pod_dir>/<relative>`) given the relative part the container
    /// was configured with; `None` if `log_path` does not end with it.
    pub fn split(log_path: &'a Path, relative: &'a Path) -> Option<Self> {
        if relative.as_os_str().is_empty() || !log_path.ends_with(relative) {
            return None;
        }
        let mut pod_dir = log_path;
        for _ in relative.components() {
            pod_dir = pod_dir.parent()?;
        }
        // No pod log directory: the path was relative to the working directory.
        if pod_dir.as_os_str().is_empty() {
            pod_dir = Path::new(".");
        }
        Some(Self { pod_dir, relative })
    }
}

fn open_at(dir: Option<&OwnedFd>, path: &Path, flags: OFlag, mode: u32) -> Result<OwnedFd, Errno> {
    let fd = nix::fcntl::openat(
        dir.map(AsRawFd::as_raw_fd),
        path,
        flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::from_bits_truncate(mode),
    )?;
    // SAFETY: openat returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn refused(path: &Path, why: &str) -> std::io::Error {
    std::io::Error::other(format!("refusing log path {}: {why}", path.display()))
}

/// Opens (creating as needed) the directory that holds the log file at `target`, without
/// following a symlink from the pod log directory down; returns it and the file's name.
fn open_log_dir<'a>(target: &LogTarget<'a>) -> std::io::Result<(OwnedFd, &'a std::ffi::OsStr)> {
    let full = target.pod_dir.join(target.relative);
    let mut names: Vec<&std::ffi::OsStr> = Vec::new();
    for component in target.relative.components() {
        match component {
            Component::Normal(name) => names.push(name),
            _ => return Err(refused(&full, "not a plain relative path")),
        }
    }
    let Some((&file_name, dirs)) = names.split_last() else {
        return Err(refused(&full, "no file name"));
    };
    let directory = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
    if let Err(Errno::ENOENT) = nix::sys::stat::stat(target.pod_dir).map(drop) {
        // The sandbox makes it; a pump after a crash may find it gone with the pod.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(LOG_DIR_MODE)
            .create(target.pod_dir)?;
    }
    let mut dir = open_at(None, target.pod_dir, directory, 0).map_err(|e| {
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("opening log directory {}: {e}", target.pod_dir.display()),
        )
    })?;
    for name in dirs {
        match nix::sys::stat::mkdirat(
            Some(dir.as_raw_fd()),
            *name,
            Mode::from_bits_truncate(LOG_DIR_MODE),
        ) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        dir = open_at(Some(&dir), Path::new(name), directory, 0)
            .map_err(|e| refused(&full, &format!("directory {name:?}: {e}")))?;
    }
    Ok((dir, file_name))
}

/// Opens (creating as needed) the log file at `target` for reading and writing, without
/// following a symlink from the pod log directory down.
pub fn open_log_file(target: &LogTarget<'_>, how: LogOpen) -> std::io::Result<File> {
    let full = target.pod_dir.join(target.relative);
    let (dir, file_name) = open_log_dir(target)?;
    let rw = OFlag::O_RDWR | OFlag::O_NONBLOCK;
    let file_name = Path::new(file_name);
    let fd = match how {
        LogOpen::New => match open_at(
            Some(&dir),
            file_name,
            rw | OFlag::O_CREAT | OFlag::O_EXCL,
            LOG_FILE_MODE,
        ) {
            Err(Errno::EEXIST) => open_at(Some(&dir), file_name, rw, 0),
            other => other,
        },
        LogOpen::Continue => open_at(Some(&dir), file_name, rw | OFlag::O_CREAT, LOG_FILE_MODE),
    }
    .map_err(|e| refused(&full, &e.to_string()))?;
    let file = File::from(fd);
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(refused(&full, "not a regular file"));
    }
    if meta.nlink() != 1 {
        return Err(refused(&full, "the file has other hard links"));
    }
    if meta.mode() & 0o777 != LOG_FILE_MODE {
        file.set_permissions(std::fs::Permissions::from_mode(LOG_FILE_MODE))?;
    }
    // Back to blocking for the writes (O_NONBLOCK only kept a FIFO from blocking the open).
    nix::fcntl::fcntl(
        file.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()),
    )?;
    Ok(file)
}

/// Renames the log file at `target` to `<name>.<suffix>` in its directory (kubelet's
/// rotation), then removes the oldest rotated files `<name>.*` so that at most `keep` are
/// left. Returns `false` (nothing done) if a rotated file with that name exists already.
pub fn rotate_log_file(target: &LogTarget<'_>, suffix: &str, keep: usize) -> std::io::Result<bool> {
    let (dir, file_name) = open_log_dir(target)?;
    let mut rotated = file_name.to_owned();
    rotated.push(".");
    rotated.push(suffix);
    match nix::sys::stat::fstatat(
        Some(dir.as_raw_fd()),
        rotated.as_os_str(),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Err(Errno::ENOENT) => {}
        Ok(_) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    nix::fcntl::renameat(
        Some(dir.as_raw_fd()),
        file_name,
        Some(dir.as_raw_fd()),
        rotated.as_os_str(),
    )?;
    let mut prefix = file_name.as_encoded_bytes().to_vec();
    prefix.push(b'.');
    // The directory is read through its descriptor: `/proc/self/fd/N` names it.
    let listing = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?;
    let mut old: Vec<std::ffi::OsString> = listing
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.as_encoded_bytes().starts_with(&prefix))
        .collect();
    old.sort();
    let excess = old.len().saturating_sub(keep);
    for name in &old[..excess] {
        match nix::unistd::unlinkat(
            Some(dir.as_raw_fd()),
            name.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Opens a log file for reading (termination messages, `ctr logs`): a symlink in its place
/// is refused, as is anything but a regular file, so a container cannot have the agent
/// read a host file into a pod's status.
pub fn open_log_for_reading(path: &Path) -> std::io::Result<File> {
    let fd = open_at(None, path, OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0).map_err(|e| {
        // The kind is kept: a file not written yet is no error for a reader.
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            refused(path, &e.to_string()).to_string(),
        )
    })?;
    let file = File::from(fd);
    if !file.metadata()?.file_type().is_file() {
        return Err(refused(path, "not a regular file"));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target<'a>(pod_dir: &'a Path, relative: &'a str) -> LogTarget<'a> {
        LogTarget {
            pod_dir,
            relative: Path::new(relative),
        }
    }

    #[test]
    fn a_log_path_splits_into_the_pod_directory_and_the_configured_part() {
        let split = LogTarget::split(
            Path::new("/var/log/pods/ns_p_u/c/0.log"),
            Path::new("c/0.log"),
        );
        assert_eq!(
            split.map(|t| t.pod_dir),
            Some(Path::new("/var/log/pods/ns_p_u"))
        );
        assert_eq!(
            LogTarget::split(Path::new("/a/b/0.log"), Path::new("c/0.log")),
            None
        );
    }

    #[test]
    fn a_new_file_is_0640_in_0755_directories() {
        let dir = tempfile::tempdir().unwrap();
        let file = open_log_file(&target(dir.path(), "c/0.log"), LogOpen::New).unwrap();
        assert_eq!(file.metadata().unwrap().mode() & 0o777, 0o640);
        let sub = std::fs::metadata(dir.path().join("c")).unwrap();
        assert_eq!(sub.mode() & 0o777, 0o755);
    }

    #[test]
    fn a_symlinked_file_or_directory_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host-file");
        std::fs::write(&host, b"host\n").unwrap();
        let pod = dir.path().join("pod");
        std::fs::create_dir_all(pod.join("c")).unwrap();
        std::os::unix::fs::symlink(&host, pod.join("c/1.log")).unwrap();
        for how in [LogOpen::New, LogOpen::Continue] {
            assert!(
                open_log_file(&target(&pod, "c/1.log"), how).is_err(),
                "{how:?}"
            );
        }
        let host_dir = dir.path().join("host-dir");
        std::fs::create_dir(&host_dir).unwrap();
        std::os::unix::fs::symlink(&host_dir, pod.join("d")).unwrap();
        assert!(open_log_file(&target(&pod, "d/0.log"), LogOpen::New).is_err());
        assert!(
            !host_dir.join("0.log").exists(),
            "a file was made through the link"
        );
        std::os::unix::fs::symlink(&pod, dir.path().join("pod-link")).unwrap();
        assert!(open_log_file(
            &target(&dir.path().join("pod-link"), "c/2.log"),
            LogOpen::New
        )
        .is_err());
        assert_eq!(std::fs::read(&host).unwrap(), b"host\n");
        assert!(open_log_file(&target(&pod, "../x.log"), LogOpen::New).is_err());
        assert!(open_log_for_reading(&pod.join("c/1.log")).is_err());
        assert!(open_log_for_reading(&pod.join("c")).is_err());
    }

    #[test]
    fn a_hard_link_is_refused_and_an_existing_file_continued_and_narrowed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("c")).unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, b"x").unwrap();
        std::fs::hard_link(&other, dir.path().join("c/0.log")).unwrap();
        assert!(open_log_file(&target(dir.path(), "c/0.log"), LogOpen::Continue).is_err());
        let old = dir.path().join("c/1.log");
        std::fs::write(&old, b"earlier\n").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        let file = open_log_file(&target(dir.path(), "c/1.log"), LogOpen::New).unwrap();
        assert_eq!(
            file.metadata().unwrap().len(),
            8,
            "continued, not truncated"
        );
        assert_eq!(file.metadata().unwrap().mode() & 0o777, 0o640);
    }
}

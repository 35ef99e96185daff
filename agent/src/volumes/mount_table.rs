//! The mount table (`/proc/self/mountinfo`) and the mount calls the volume manager makes:
//! tmpfs for memory-backed volumes, unmounting at teardown.
//!
//! Paths compared against the table must be canonical (no symlinks, no `..`), as the kernel
//! reports mount points that way.

use std::io;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// One line of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The filesystem type (`tmpfs`, `ext4`…).
    pub fs_type: String,
}

/// Reads this process's mount table.
pub(crate) fn read() -> io::Result<Vec<MountEntry>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Parses mountinfo text; malformed lines are skipped.
fn parse(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let mount_point = fields.get(4)?;
            let separator = fields.iter().position(|f| *f == "-")?;
            let fs_type = fields.get(separator + 1)?;
            Some(MountEntry {
                mount_point: ironlet_cgroups::unescape_mountinfo_path(mount_point),
                fs_type: (*fs_type).to_owned(),
            })
        })
        .collect()
}

/// Whether `path` (canonical) is a mount point.
pub(crate) fn is_mount_point(path: &Path) -> io::Result<bool> {
    Ok(read()?.iter().any(|m| m.mount_point == path))
}

/// Mount points at or below `dir` (canonical), deepest first; a path mounted several times
/// is listed once per mount.
pub(crate) fn mounts_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = read()?
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    Ok(found)
}

/// Mounts a tmpfs on `path` (`nosuid,nodev`, `size=` when given, else the kernel's default of
/// half the RAM).
pub(crate) fn mount_tmpfs(path: &Path, size_bytes: Option<u64>) -> Result<(), Errno> {
    let options = size_bytes.map(|size| format!("size={size}"));
    mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        options.as_deref(),
    )
}

/// Unmounts `path`; when it is busy (a process still uses it) it is detached instead, which
/// removes it from the tree at once and frees it when the last user goes. Not mounted is
/// success.
pub(crate) fn unmount(path: &Path) -> Result<(), Errno> {
    match umount2(path, MntFlags::empty()) {
        Ok(()) | Err(Errno::EINVAL | Errno::ENOENT) => Ok(()),
        Err(Errno::EBUSY) => {
            tracing::warn!(path = %path.display(), "mount busy; detaching it lazily");
            umount2(path, MntFlags::MNT_DETACH)
        }
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_yield_mount_point_and_type_with_escapes_undone() {
        let text = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
                    99 22 0:50 / /var/lib/ironlet/pods/u/volumes/kubernetes.io~empty-dir/a\\040b rw shared:5 - tmpfs tmpfs rw,size=1024k\n\
                    garbage\n";
        let entries = parse(text);
        assert_eq!(
            entries,
            [
                MountEntry {
                    mount_point: "/proc".into(),
                    fs_type: "proc".into()
                },
                MountEntry {
                    mount_point: "/var/lib/ironlet/pods/u/volumes/kubernetes.io~empty-dir/a b"
                        .into(),
                    fs_type: "tmpfs".into()
                },
            ]
        );
    }

    #[test]
    fn the_root_filesystem_is_a_mount_point_and_proc_self_is_not() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        assert!(!is_mount_point(Path::new("/proc/self")).unwrap());
    }
}

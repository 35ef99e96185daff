//! Resolving layer paths inside the unpack target, never outside it.
//!
//! Guarantees: [`clean_path`] turns a tar name into a relative path or refuses it (any `..`);
//! [`open_dir`] opens (and with `create`, makes) a directory below `root` one component at
//! a time, each time resolving the whole prefix from `root` with
//! `openat2(RESOLVE_BENEATH)`. A symlink inside the target is followed; one that leads out
//! (absolute, or too many `..`) fails with [`UnsafeEntryReason::SymlinkEscape`]; a
//! component that is a file or a dangling symlink fails with
//! [`UnsafeEntryReason::ParentNotDirectory`]. Nothing is created through a symlink.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::error::UnsafeEntryReason;
use super::sys;

/// Why a path could not be resolved.
#[derive(Debug)]
pub(crate) enum Resolve {
    Unsafe(UnsafeEntryReason),
    Io(io::Error),
}

/// Opens the directory `rel` beneath `root`, creating missing components when `create`.
pub(crate) fn open_dir(root: BorrowedFd<'_>, rel: &Path, create: bool) -> Result<OwnedFd, Resolve> {
    let mut cur = sys::open_dir_beneath(root, Path::new("."), 0).map_err(Resolve::Io)?;
    let mut prefix = PathBuf::new();
    for comp in rel.components() {
        let Component::Normal(c) = comp else {
            return Err(Resolve::Unsafe(UnsafeEntryReason::ParentComponent));
        };
        prefix.push(c);
        let mut opened = sys::open_dir_beneath(root, &prefix, 0);
        if create && matches!(&opened, Err(e) if e.kind() == io::ErrorKind::NotFound) {
            match sys::mkdir_at(cur.as_fd(), c, 0o755) {
                Ok(()) => {}
                // Something (a dangling symlink) is there: never create through it.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Err(Resolve::Unsafe(UnsafeEntryReason::ParentNotDirectory))
                }
                Err(e) => return Err(Resolve::Io(e)),
            }
            opened = sys::open_dir_beneath(root, &prefix, 0);
        }
        cur = opened.map_err(|e| match e.raw_os_error() {
            Some(libc::EXDEV) => Resolve::Unsafe(UnsafeEntryReason::SymlinkEscape),
            Some(libc::ENOTDIR) | Some(libc::ELOOP) => {
                Resolve::Unsafe(UnsafeEntryReason::ParentNotDirectory)
            }
            _ => Resolve::Io(e),
        })?;
    }
    Ok(cur)
}

/// A tar path made relative: leading `/` and `.` components dropped, `..` refused.
pub(crate) fn clean_path(raw: &Path) -> Result<PathBuf, UnsafeEntryReason> {
    let mut out = PathBuf::new();
    for comp in raw.components() {
        match comp {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => return Err(UnsafeEntryReason::ParentComponent),
            Component::Normal(c) => {
                if c.as_bytes().contains(&0) {
                    return Err(UnsafeEntryReason::InvalidName);
                }
                out.push(c);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_slash_is_relative_and_dot_dot_is_refused() {
        assert_eq!(
            clean_path(Path::new("/etc/passwd")).unwrap(),
            Path::new("etc/passwd")
        );
        assert_eq!(clean_path(Path::new("./a/./b")).unwrap(), Path::new("a/b"));
        assert_eq!(
            clean_path(Path::new("/abs/../../escape")),
            Err(UnsafeEntryReason::ParentComponent)
        );
        assert_eq!(
            clean_path(Path::new("a/../b")),
            Err(UnsafeEntryReason::ParentComponent)
        );
    }
}

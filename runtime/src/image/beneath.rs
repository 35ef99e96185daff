//! Resolving layer paths inside the unpack target, never outside it, at a cost linear in
//! the layer.
//!
//! Guarantees: [`clean_path`] turns a tar name into a relative path or refuses it (any `..`).
//! A [`DirCache`] opens (and with `create`, makes) directories below its root one component
//! at a time, each with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the descriptor
//! of its parent. A component that is a symlink is resolved here, as `openat2(RESOLVE_BENEATH)`
//! from the root would: its target is walked from the directory holding it, `..` may not
//! climb above the root and an absolute target is an escape
//! ([`UnsafeEntryReason::SymlinkEscape`]); more than 40 symlinks on one path, a dangling
//! symlink when creating, or a component that is a file, fail with
//! [`UnsafeEntryReason::ParentNotDirectory`]. Nothing is created through a symlink.
//!
//! Cost: the cache keeps the path of the last directory it opened. The next path shares a
//! prefix with it; only the components after that prefix are opened, and the cache returns
//! to the prefix through `..` (one `openat` per level it leaves). Every level is so entered
//! and left at most once per path component of an entry, so unpacking a layer makes O(its
//! size) system calls whatever its depth (the per-entry resolution from the root was
//! quadratic in depth). Descriptors held: the top level, plus the directory holding each
//! symlink on the path (at most 40).
//!
//! Coherence: `..` of a directory reached without a symlink is the level below it, and the
//! unpacker only ever removes entries of the directory it just resolved, which cannot be an
//! ancestor of such a chain. A directory reached through a symlink can be, so
//! [`DirCache::removed`] forgets every level from the first symlink up.

use std::ffi::{OsStr, OsString};
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

/// The most symlinks one path may traverse (the kernel's `MAXSYMLINKS`).
const MAX_SYMLINKS: u32 = 40;

/// One directory on the cached path.
#[derive(Debug)]
struct Level {
    name: OsString,
    /// Held by the top level and by the directory holding a symlinked level.
    fd: Option<OwnedFd>,
    /// Depth below the root of the directory actually reached (bounds `..` in symlinks).
    depth: usize,
    /// Symlinks followed from the root to reach it.
    links: u32,
    /// Opened by name in the level below, so that `..` leads back to that level.
    plain: bool,
}

/// Opens directories beneath a root, remembering the last path (see the module doc).
#[derive(Debug)]
pub(crate) struct DirCache {
    root: OwnedFd,
    levels: Vec<Level>,
    /// The first component the last `open` created (all after it were created too).
    created_from: Option<usize>,
}

fn unsafe_or_io(e: io::Error) -> Resolve {
    match e.raw_os_error() {
        Some(libc::EXDEV) => Resolve::Unsafe(UnsafeEntryReason::SymlinkEscape),
        Some(libc::ENOTDIR) | Some(libc::ELOOP) => {
            Resolve::Unsafe(UnsafeEntryReason::ParentNotDirectory)
        }
        _ => Resolve::Io(e),
    }
}

/// The directory `name` in `dir`, failing with `ELOOP` if it is a symlink.
fn open_child(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    sys::open_dir_beneath(dir, Path::new(name), libc::RESOLVE_NO_SYMLINKS)
}

/// Resolves the symlink `name` in `dir` (at `depth` below the root, reached through
/// `links` symlinks) to the directory it names: `(descriptor, depth, links)`.
fn follow(
    dir: BorrowedFd<'_>,
    depth: usize,
    name: &OsStr,
    links: u32,
    create: bool,
) -> Result<(OwnedFd, usize, u32), Resolve> {
    let mut links = links + 1;
    if links > MAX_SYMLINKS {
        return Err(Resolve::Unsafe(UnsafeEntryReason::ParentNotDirectory));
    }
    let target = sys::readlink_at(dir, name).map_err(Resolve::Io)?;
    let dangling = || {
        if create {
            Resolve::Unsafe(UnsafeEntryReason::ParentNotDirectory)
        } else {
            Resolve::Io(io::Error::from_raw_os_error(libc::ENOENT))
        }
    };
    if target.is_empty() {
        return Err(dangling());
    }
    if target.as_bytes().starts_with(b"/") {
        return Err(Resolve::Unsafe(UnsafeEntryReason::SymlinkEscape));
    }
    let mut cur = sys::open_dir_beneath(dir, Path::new("."), 0).map_err(Resolve::Io)?;
    let mut depth = depth;
    for comp in target.as_bytes().split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                depth = depth
                    .checked_sub(1)
                    .ok_or(Resolve::Unsafe(UnsafeEntryReason::SymlinkEscape))?;
                cur = sys::open_dotdot(cur.as_fd()).map_err(Resolve::Io)?;
            }
            n => {
                let n = OsStr::from_bytes(n);
                match open_child(cur.as_fd(), n) {
                    Ok(fd) => {
                        cur = fd;
                        depth += 1;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                        (cur, depth, links) = follow(cur.as_fd(), depth, n, links, create)?;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(dangling()),
                    Err(e) => return Err(unsafe_or_io(e)),
                }
            }
        }
    }
    Ok((cur, depth, links))
}

impl DirCache {
    pub(crate) fn new(root: BorrowedFd<'_>) -> io::Result<Self> {
        Ok(Self {
            root: root.try_clone_to_owned()?,
            levels: Vec::new(),
            created_from: None,
        })
    }

    /// Opens the directory `rel` beneath the root, creating missing components when
    /// `create`. The descriptor is valid until the next call.
    pub(crate) fn open(&mut self, rel: &Path, create: bool) -> Result<BorrowedFd<'_>, Resolve> {
        self.created_from = None;
        let mut comps: Vec<&OsStr> = Vec::new();
        for comp in rel.components() {
            match comp {
                Component::Normal(c) => comps.push(c),
                Component::CurDir => {}
                _ => return Err(Resolve::Unsafe(UnsafeEntryReason::ParentComponent)),
            }
        }
        let common = self
            .levels
            .iter()
            .zip(&comps)
            .take_while(|(l, c)| l.name.as_os_str() == **c)
            .count();
        if let Err(e) = self.truncate(common) {
            tracing::debug!(err = %e, "directory cache lost its path; resolving from the root");
            self.levels.clear();
        }
        for c in &comps[self.levels.len()..] {
            self.push(c, create)?;
        }
        self.top().map_err(Resolve::Io)
    }

    /// The index of the first path component the last [`Self::open`] created, if any: it
    /// and every component after it are new, empty directories.
    pub(crate) fn created_from(&self) -> Option<usize> {
        self.created_from
    }

    /// To be called after an entry of the last directory opened was removed.
    pub(crate) fn removed(&mut self) {
        if let Some(first) = self.levels.iter().position(|l| !l.plain) {
            // Its parent holds a descriptor (see `Level::fd`).
            self.levels.truncate(first);
        }
    }

    /// Forgets the cached path.
    pub(crate) fn clear(&mut self) {
        self.levels.clear();
    }

    fn top(&self) -> io::Result<BorrowedFd<'_>> {
        match self.levels.last() {
            None => Ok(self.root.as_fd()),
            Some(l) => {
                l.fd.as_ref()
                    .map(|f| f.as_fd())
                    .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
            }
        }
    }

    /// Keeps the first `keep` levels, reopening the new top through `..` if needed.
    fn truncate(&mut self, keep: usize) -> io::Result<()> {
        let len = self.levels.len();
        if len <= keep {
            return Ok(());
        }
        if keep == 0 || self.levels[keep - 1].fd.is_some() {
            self.levels.truncate(keep);
            return Ok(());
        }
        // Levels from `keep` up to the lowest one holding a descriptor were all opened by
        // name in the level below (a symlinked one would make its parent hold one).
        let held = (keep..len)
            .find(|&i| self.levels[i].fd.is_some())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let mut fd = self.levels[held]
            .fd
            .take()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        for _ in keep..=held {
            fd = sys::open_dotdot(fd.as_fd())?;
        }
        self.levels.truncate(keep);
        self.levels[keep - 1].fd = Some(fd);
        Ok(())
    }

    fn push(&mut self, name: &OsStr, create: bool) -> Result<(), Resolve> {
        let (depth, links) = self.levels.last().map_or((0, 0), |l| (l.depth, l.links));
        let parent = self.top().map_err(Resolve::Io)?;
        let mut created = false;
        let mut opened = open_child(parent, name);
        if create && matches!(&opened, Err(e) if e.raw_os_error() == Some(libc::ENOENT)) {
            match sys::mkdir_at(parent, name, 0o755) {
                Ok(()) => created = true,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    return Err(Resolve::Unsafe(UnsafeEntryReason::ParentNotDirectory))
                }
                Err(e) => return Err(Resolve::Io(e)),
            }
            opened = open_child(parent, name);
        }
        let level = match opened {
            Ok(fd) => Level {
                name: name.to_os_string(),
                fd: Some(fd),
                depth: depth + 1,
                links,
                plain: true,
            },
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                let (fd, depth, links) = follow(parent, depth, name, links, create)?;
                Level {
                    name: name.to_os_string(),
                    fd: Some(fd),
                    depth,
                    links,
                    plain: false,
                }
            }
            Err(e) => return Err(unsafe_or_io(e)),
        };
        if created {
            self.created_from.get_or_insert(self.levels.len());
        }
        if level.plain {
            // `..` of the new level leads back to the old top.
            if let Some(top) = self.levels.last_mut() {
                top.fd = None;
            }
        }
        self.levels.push(level);
        Ok(())
    }
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

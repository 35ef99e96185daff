//! File ownership of rootless images: recorded at unpack, applied inside the container's user
//! namespace at create, handed back at delete.
//!
//! An unprivileged store cannot `chown` to the subordinate ids, and a tree owned by them could
//! no longer be removed by the agent (which has no capability on the host). So:
//!
//! 1. unpacking without root writes each entry's owner from the tar, when it is not `0:0`,
//!    into the xattr [`OWNER_XATTR`] (`uid:gid`, container ids) of the snapshot file; the
//!    snapshot itself stays the user's, so image GC, re-unpacking and `rm -rf` keep working.
//!    Layering needs nothing more: the rootfs copy takes every file, xattrs included, from the
//!    topmost layer that has it.
//! 2. the zygote's worker, once root of the container's user namespace (full subordinate
//!    mapping, see `zygote/userns.rs`) and before libcontainer runs, walks the container's
//!    rootfs copy (or overlay, which copies those files up into its `upper`) and `lchown`s
//!    what carries the xattr ([`apply_recorded`]): inside, files belong to whom the image
//!    says.
//! 3. the `delete` worker, in the same namespace, gives the tree back to container root (the
//!    user on the host, [`hand_back_rootfs`]: the copy, or an overlay's `upper` and `work`), so
//!    the agent can remove it as before. Only a rootfs marked by [`mark_applied`] needs that
//!    (the agent's removal skips its fast path for it).
//!
//! Chosen over unpacking inside the user namespace (podman's way) because that would make
//! the whole store, its GC and every removal need the namespace; here only a container's own
//! copy does, for its lifetime. A tar cannot forge the xattr (it is dropped from layers) and
//! gains nothing by it: the worker can only give ids the namespace maps. Symlinks and FIFOs
//! carry no user xattr and stay container root's. A snapshot unpacked before this scheme has
//! no records (its files stay container root's, as before); removing the image and pulling it
//! again records them.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::sys;

/// The xattr holding an entry's owner from its layer, `uid:gid`.
pub const OWNER_XATTR: &str = "user.ironlet.owner";

/// The xattr value of owner `uid:gid`; `None` for `0:0` (nothing to record).
pub(crate) fn record(uid: u32, gid: u32) -> Option<Vec<u8>> {
    (uid != 0 || gid != 0).then(|| format!("{uid}:{gid}").into_bytes())
}

fn parse(value: &[u8]) -> Option<(u32, u32)> {
    let (uid, gid) = std::str::from_utf8(value).ok()?.split_once(':')?;
    Some((uid.parse().ok()?, gid.parse().ok()?))
}

/// Gives every entry of `rootfs` carrying [`OWNER_XATTR`] that owner (set-id bits restored);
/// returns how many. Run as root of the container's user namespace.
pub fn apply_recorded(rootfs: &Path) -> io::Result<u64> {
    let mut changed = 0;
    walk(rootfs, &mut |dir, name, st| {
        let kind = st.st_mode & libc::S_IFMT;
        if kind != libc::S_IFREG && kind != libc::S_IFDIR {
            return Ok(());
        }
        let path = Path::new("/proc/self/fd")
            .join(dir.as_raw_fd().to_string())
            .join(name);
        let Some((uid, gid)) = xattr::get(&path, OWNER_XATTR)
            .ok()
            .flatten()
            .and_then(|v| parse(&v))
        else {
            return Ok(());
        };
        sys::lchown_at(dir, name, uid, gid)?;
        // chown clears set-user-id and set-group-id bits.
        if st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
            chmod_at(dir, name, st.st_mode & 0o7777)?;
        }
        changed += 1;
        Ok(())
    })?;
    Ok(changed)
}

/// Gives every entry of `rootfs` not owned by container root back to it (the user on the
/// host), so that the agent can remove the tree. Run as root of the container's namespace.
pub fn hand_back(rootfs: &Path) -> io::Result<()> {
    walk(rootfs, &mut |dir, name, st| {
        if st.st_uid == 0 && st.st_gid == 0 {
            return Ok(());
        }
        sys::lchown_at(dir, name, 0, 0)
    })
}

/// [`hand_back`] of a container's rootfs and, for an overlay rootfs (not mounted in the
/// caller's mount namespace), of its `upper` and `work` directories beside it, where copied-up
/// and written files are.
pub fn hand_back_rootfs(rootfs: &Path) -> io::Result<()> {
    hand_back(rootfs)?;
    let Some(dir) = rootfs.parent() else {
        return Ok(());
    };
    for layer in ["upper", "work"] {
        let path = dir.join(layer);
        if path.is_dir() {
            hand_back(&path)?;
        }
    }
    Ok(())
}

/// The file beside a bundle's rootfs saying [`apply_recorded`] changed owners in it, so that
/// its removal needs [`hand_back`] first (a rootfs whose files all belong to container root
/// needs nothing).
const APPLIED_MARKER: &str = "rootfs-owners-applied";

/// Marks the bundle `bundle` (see [`needs_hand_back`]).
pub fn mark_applied(bundle: &Path) -> io::Result<()> {
    std::fs::write(bundle.join(APPLIED_MARKER), b"")
}

/// Whether the rootfs of bundle `bundle` has owners only its namespace can undo.
pub fn needs_hand_back(bundle: &Path) -> bool {
    bundle.join(APPLIED_MARKER).exists()
}

fn chmod_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    let name = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid descriptor and NUL-terminated name for the call.
    let ret = unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode, 0) };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Calls `visit(parent, name, stat)` for every entry below `root` and for `root` itself, never
/// following a symlink nor leaving the file system of `root` (which may be a mount point: an
/// overlay rootfs). Iterative (layers can be 10 000
/// directories deep), one descriptor held at a time, as `sys::remove_at` walks.
fn walk(
    root: &Path,
    visit: &mut dyn FnMut(BorrowedFd<'_>, &OsStr, &libc::stat) -> io::Result<()>,
) -> io::Result<()> {
    let (Some(parent), Some(name)) = (root.parent(), root.file_name()) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    let top = sys::open_dir(parent)?;
    let Some(st) = sys::lstat_at(top.as_fd(), name)? else {
        return Ok(());
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return visit(top.as_fd(), name, &st);
    }
    /// Opens `name` below `parent`, visits its non-directory children and returns the
    /// subdirectories left to enter.
    fn enter(
        parent: BorrowedFd<'_>,
        name: &OsStr,
        resolve: u64,
        visit: &mut dyn FnMut(BorrowedFd<'_>, &OsStr, &libc::stat) -> io::Result<()>,
    ) -> io::Result<(OwnedFd, Vec<OsString>)> {
        let fd = sys::open_dir_beneath(parent, Path::new(name), resolve)?;
        let mut subdirs = Vec::new();
        for child in sys::list_dir(fd.as_fd())? {
            match sys::lstat_at(fd.as_fd(), &child)? {
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => subdirs.push(child),
                Some(st) => visit(fd.as_fd(), &child, &st)?,
                None => {}
            }
        }
        Ok((fd, subdirs))
    }
    let (mut cur, subdirs) = enter(top.as_fd(), name, libc::RESOLVE_NO_SYMLINKS, visit)?;
    // Each level: its name in its parent and the subdirectories left.
    let mut path = vec![(name.to_os_string(), subdirs)];
    while let Some((_, subdirs)) = path.last_mut() {
        if let Some(sub) = subdirs.pop() {
            let no_xdev = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_XDEV;
            let (fd, subdirs) = enter(cur.as_fd(), &sub, no_xdev, visit)?;
            cur = fd;
            path.push((sub, subdirs));
            continue;
        }
        let Some((done, _)) = path.pop() else { break };
        if path.is_empty() {
            break;
        }
        // `..` of a directory entered by name, without crossing a mount, is its parent.
        cur = sys::open_dotdot(cur.as_fd())?;
        if let Some(st) = sys::lstat_at(cur.as_fd(), &done)? {
            visit(cur.as_fd(), &done, &st)?;
        }
    }
    visit(top.as_fd(), name, &st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_back_and_root_records_nothing() {
        assert_eq!(record(0, 0), None);
        let v = record(1000, 0).unwrap();
        assert_eq!(parse(&v), Some((1000, 0)));
        assert_eq!(parse(b"1000"), None);
        assert_eq!(parse(b"a:b"), None);
    }

    #[test]
    fn walk_visits_every_entry_once_without_following_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/b/c/f"), b"x").unwrap();
        std::fs::write(root.join("g"), b"x").unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("a/out")).unwrap();
        let mut seen = Vec::new();
        walk(&root, &mut |_, name, _| {
            seen.push(name.to_string_lossy().into_owned());
            Ok(())
        })
        .unwrap();
        seen.sort();
        assert_eq!(seen, ["a", "b", "c", "f", "g", "out", "root"]);
    }
}

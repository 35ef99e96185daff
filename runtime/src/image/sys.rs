//! Thin, safe wrappers over the `*at` system calls the image store needs, all working on
//! directory file descriptors so that a path is never re-resolved from the top.
//!
//! Guarantees:
//! - every descriptor returned is an [`OwnedFd`] opened with `O_CLOEXEC`;
//! - [`open_beneath`] resolves a relative path with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS)`: symlinks are followed only while they stay inside the starting
//!   directory, and an escape (absolute symlink, `..` past the start) fails with `EXDEV`;
//! - functions that create or change an entry by name never follow a symlink in that last
//!   component (`O_EXCL`, `AT_SYMLINK_NOFOLLOW`, or the call's own no-follow semantics);
//! - a name containing a NUL byte is rejected with `EINVAL` before any call is made.
//!
//! Nothing here knows about images: the callers decide what a failure means.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn owned(ret: libc::c_long) -> io::Result<OwnedFd> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(ret).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor to us and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a directory by absolute or cwd-relative path without following a final symlink.
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let p = cstr(path.as_os_str())?;
    // SAFETY: p is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    owned(libc::c_long::from(fd))
}

/// `openat2(dir, path, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
pub(crate) fn open_beneath(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
    extra_resolve: u64,
) -> io::Result<OwnedFd> {
    let p = cstr(path.as_os_str())?;
    // SAFETY: open_how is plain data; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | extra_resolve;
    // SAFETY: p and how outlive the call; the size passed is the size of `how`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            p.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    owned(ret)
}

/// Opens a directory named `path` beneath `dir` (see [`open_beneath`]).
pub(crate) fn open_dir_beneath(
    dir: BorrowedFd<'_>,
    path: &Path,
    extra_resolve: u64,
) -> io::Result<OwnedFd> {
    open_beneath(dir, path, libc::O_RDONLY | libc::O_DIRECTORY, extra_resolve)
}

/// Opens the parent of the directory `dir` (`..`, which is never a symlink).
pub(crate) fn open_dotdot(dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: the name is a valid NUL-terminated string literal.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c"..".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    owned(libc::c_long::from(fd))
}

/// The target of the symlink `name` in `dir`.
pub(crate) fn readlink_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<std::ffi::OsString> {
    let n = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: n is valid for the call and buf has the length passed.
    let len = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let len = usize::try_from(len).map_err(|_| io::Error::last_os_error())?;
    buf.truncate(len);
    Ok(std::ffi::OsString::from_vec(buf))
}

/// Creates and opens a new regular file `name` in `dir`; fails if anything exists there.
pub(crate) fn create_file_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<std::fs::File> {
    let n = cstr(name)?;
    // SAFETY: n is valid for the call; O_EXCL|O_CREAT never follows a final symlink.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            n.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    Ok(std::fs::File::from(owned(libc::c_long::from(fd))?))
}

pub(crate) fn mkdir_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: n is valid for the call.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), n.as_ptr(), mode as libc::mode_t) })
}

pub(crate) fn mknod_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32, dev: u64) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: n is valid for the call.
    check(unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            n.as_ptr(),
            mode as libc::mode_t,
            dev as libc::dev_t,
        )
    })
}

pub(crate) fn symlink_at(target: &OsStr, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let t = cstr(target)?;
    let n = cstr(name)?;
    // SAFETY: t and n are valid for the call.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), n.as_ptr()) })
}

/// `linkat(old_dir, old_name, new_dir, new_name, 0)`: a final symlink is linked, not followed.
pub(crate) fn link_at(
    old_dir: BorrowedFd<'_>,
    old_name: &OsStr,
    new_dir: BorrowedFd<'_>,
    new_name: &OsStr,
) -> io::Result<()> {
    let o = cstr(old_name)?;
    let n = cstr(new_name)?;
    // SAFETY: o and n are valid for the call.
    check(unsafe {
        libc::linkat(
            old_dir.as_raw_fd(),
            o.as_ptr(),
            new_dir.as_raw_fd(),
            n.as_ptr(),
            0,
        )
    })
}

pub(crate) fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr, is_dir: bool) -> io::Result<()> {
    let n = cstr(name)?;
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: n is valid for the call.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), n.as_ptr(), flags) })
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; `Ok(None)` when nothing is there.
pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<libc::stat>> {
    let n = cstr(name)?;
    // SAFETY: an all-zero `stat` is a valid value to be overwritten by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: n and st are valid for the call.
    let ret = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            n.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match check(ret) {
        Ok(()) => Ok(Some(st)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `fstat(fd)`.
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is valid for the call.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `fchownat(dir, name, uid, gid, AT_SYMLINK_NOFOLLOW)`; an empty name means `dir` itself.
pub(crate) fn lchown_at(dir: BorrowedFd<'_>, name: &OsStr, uid: u32, gid: u32) -> io::Result<()> {
    let n = cstr(name)?;
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    // SAFETY: n is valid for the call.
    check(unsafe { libc::fchownat(dir.as_raw_fd(), n.as_ptr(), uid, gid, flags) })
}

pub(crate) fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we borrow.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) })
}

fn timespec(secs: i64, nanos: u32) -> libc::timespec {
    libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: libc::c_long::from(nanos as i32),
    }
}

/// Sets atime and mtime of `name` in `dir` (an empty name means `dir` itself) without
/// following a final symlink.
pub(crate) fn set_times_at(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    secs: i64,
    nanos: u32,
) -> io::Result<()> {
    let n = cstr(name)?;
    let times = [timespec(secs, nanos), timespec(secs, nanos)];
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    // SAFETY: n and times are valid for the call.
    check(unsafe { libc::utimensat(dir.as_raw_fd(), n.as_ptr(), times.as_ptr(), flags) })
}

/// Sets atime and mtime of an open file.
pub(crate) fn set_times(fd: BorrowedFd<'_>, secs: i64, nanos: u32) -> io::Result<()> {
    let times = [timespec(secs, nanos), timespec(secs, nanos)];
    // SAFETY: times is valid for the call.
    check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) })
}

pub(crate) fn fsetxattr(fd: BorrowedFd<'_>, name: &str, value: &[u8]) -> io::Result<()> {
    let n = cstr(OsStr::new(name))?;
    // SAFETY: n and value are valid for the call.
    check(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

/// Flushes the file system holding `fd` (used before writing a done-marker).
pub(crate) fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we borrow.
    check(unsafe { libc::syncfs(fd.as_raw_fd()) })
}

/// Removes `name` in `dir`, whatever it is; a directory is emptied first, descending only
/// through directory descriptors (never through symlinks, never into another mount: that
/// fails with `EXDEV`). Missing is not an error.
///
/// Iterative, holding one descriptor and the names on the current path, each directory
/// listed once: a layer can be 10 000 directories deep (recursion overflowed the stack).
pub(crate) fn remove_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let Some(st) = lstat_at(dir, name)? else {
        return Ok(());
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return unlink_at(dir, name, false);
    }
    /// A directory being emptied: its name in its parent and the subdirectories left.
    struct Frame {
        name: std::ffi::OsString,
        subdirs: Vec<std::ffi::OsString>,
    }
    /// Opens the subdirectory `name` of `parent` and removes everything in it but its
    /// subdirectories, which it returns.
    fn enter(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<(OwnedFd, Frame)> {
        let open = || {
            open_dir_beneath(
                parent,
                Path::new(name),
                libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_XDEV,
            )
        };
        let fd = match open() {
            // A directory without read permission (mode 000, as overlayfs makes its
            // `work/work`) is made enterable first.
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                let n = cstr(name)?;
                // SAFETY: n is a valid C string for the call.
                let _ = unsafe { libc::fchmodat(parent.as_raw_fd(), n.as_ptr(), 0o700, 0) };
                open()?
            }
            other => other?,
        };
        // A read-only directory (mode 0555 from a layer) must become writable to be
        // emptied when we are not root.
        let _ = fchmod(fd.as_fd(), 0o700);
        let mut subdirs = Vec::new();
        for child in list_dir(fd.as_fd())? {
            match lstat_at(fd.as_fd(), &child)? {
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => subdirs.push(child),
                Some(_) => unlink_at(fd.as_fd(), &child, false)?,
                None => {}
            }
        }
        let frame = Frame {
            name: name.to_os_string(),
            subdirs,
        };
        Ok((fd, frame))
    }
    let (mut cur, frame) = enter(dir, name)?;
    let mut path = vec![frame];
    while let Some(top) = path.last_mut() {
        if let Some(sub) = top.subdirs.pop() {
            let (fd, frame) = enter(cur.as_fd(), &sub)?;
            cur = fd;
            path.push(frame);
            continue;
        }
        let done = path.pop().map(|f| f.name).unwrap_or_default();
        if path.is_empty() {
            break;
        }
        // `..` of a directory entered by name, without crossing a mount, is its parent.
        cur = open_dotdot(cur.as_fd())?;
        unlink_at(cur.as_fd(), &done, true)?;
    }
    unlink_at(dir, name, true)
}

/// Removes everything inside the directory `dir`, keeping `dir` itself.
pub(crate) fn clear_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    for name in list_dir(dir)? {
        remove_at(dir, &name)?;
    }
    Ok(())
}

/// The names in the directory `dir` (without `.` and `..`).
pub(crate) fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<std::ffi::OsString>> {
    // Read through a fresh descriptor so that the caller's offset is untouched; fdopendir
    // takes ownership of it and closedir closes it.
    let fd = open_dir_beneath(dir, Path::new("."), 0)?;
    let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
    // SAFETY: raw is an open directory descriptor we own.
    let dirp = unsafe { libc::fdopendir(raw) };
    if dirp.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so raw is still ours to close.
        unsafe { libc::close(raw) };
        return Err(e);
    }
    let mut names = Vec::new();
    let result = loop {
        // readdir reports errors only through errno; clear it first.
        // SAFETY: __errno_location always returns this thread's errno.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: dirp is a valid DIR* until closedir below.
        let ent = unsafe { libc::readdir(dirp) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break if e.raw_os_error().unwrap_or(0) == 0 {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: d_name is a NUL-terminated array inside the entry readdir returned.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_os_string());
        }
    };
    // SAFETY: dirp came from fdopendir and is closed exactly once.
    unsafe { libc::closedir(dirp) };
    result.map(|()| names)
}

/// `true` if the error is "no space left" or "quota exceeded".
pub(crate) fn is_disk_full(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// The effective user id of this process.
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

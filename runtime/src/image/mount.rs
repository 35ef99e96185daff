//! Overlay mounts through the new mount API, with a legacy fallback, and unmounting.
//!
//! ```text
//!  fsopen("overlay") ─► fsconfig(SET_STRING "lowerdir+", dir) × layers (top first)
//!                    ─► fsconfig "upperdir", "workdir" ─► fsconfig(CMD_CREATE)
//!                    ─► fsmount ─► move_mount(target)
//! ```
//!
//! `lowerdir+` (Linux 6.8) passes one layer per call, so the number of layers is limited by
//! overlayfs (500), not by the one-page option string of mount(2) (~40 layers of our paths).
//! If the kernel rejects `lowerdir+`, the legacy `mount(2)` string is used when it fits in
//! a page, else [`ImageError::MountOptionsTooLong`]. Errors carry the messages the kernel
//! wrote to the fs context.
//!
//! Container root filesystems are mounted `volatile` (Linux 5.10; older kernels refuse the
//! flag and get a plain overlay), as podman does for `--rm` containers: overlayfs then skips
//! every sync of the upper layer, above all the `syncfs` of the whole upper file system at
//! unmount, which waits for *everyone's* dirty data on that disk (80–190 ms measured with
//! 200 MB written by another process, against 3–10 ms volatile). What volatile gives up is
//! the writable layer's durability across a host crash (and remounting it after one), which
//! a Kubernetes container never uses: after a crash or restart it is created anew, on a
//! fresh upper directory.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::error::ImageError;

/// Largest legacy option string (one page, including the NUL).
const LEGACY_LIMIT: usize = 4095;

/// What an overlay mount is made of.
#[derive(Debug, Clone)]
pub(crate) struct OverlaySpec {
    /// Lower layers, top first.
    pub lower: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Mounted by root of a user namespace: overlay state in `user.overlay.*` xattrs.
    pub userxattr: bool,
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// An fs context from `fsopen`.
struct FsContext {
    fd: OwnedFd,
}

impl FsContext {
    fn open(fstype: &str) -> io::Result<Self> {
        let name = cstr(fstype)?;
        // SAFETY: name is a valid C string; the syscall returns a new descriptor or -1.
        let ret = unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), libc::FSOPEN_CLOEXEC) };
        Ok(Self { fd: owned(ret)? })
    }

    fn set_string(&self, key: &str, value: &str) -> io::Result<()> {
        self.set(libc::FSCONFIG_SET_STRING, key, Some(&cstr(value)?))
    }

    fn set_flag(&self, key: &str) -> io::Result<()> {
        self.set(libc::FSCONFIG_SET_FLAG, key, None)
    }

    /// `fsconfig(cmd, key, value)`; a flag has no value.
    fn set(&self, cmd: libc::c_uint, key: &str, value: Option<&CString>) -> io::Result<()> {
        let k = cstr(key)?;
        let v = value.map_or(std::ptr::null(), |v| v.as_ptr());
        // SAFETY: k and v (when not null) are valid C strings for the duration of the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                cmd,
                k.as_ptr(),
                v,
                0,
            )
        };
        check(ret)
    }

    fn create(&self) -> io::Result<()> {
        // SAFETY: no pointers are passed.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                libc::FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_void>(),
                0,
            )
        };
        check(ret)
    }

    fn mount(&self) -> io::Result<OwnedFd> {
        // SAFETY: plain syscall on our descriptor.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                self.fd.as_raw_fd(),
                libc::FSMOUNT_CLOEXEC,
                0,
            )
        };
        owned(ret)
    }

    /// Messages the kernel logged in this context ("e overlayfs: …"), joined.
    fn log(&self) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        for _ in 0..16 {
            // SAFETY: buf is valid for buf.len() bytes.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            out.push(
                String::from_utf8_lossy(&buf[..n as usize])
                    .trim()
                    .to_owned(),
            );
        }
        if out.is_empty() {
            String::new()
        } else {
            format!(", kernel: {}", out.join("; "))
        }
    }
}

fn owned(ret: libc::c_long) -> io::Result<OwnedFd> {
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(ret).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: a fresh descriptor from the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(ret: libc::c_long) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A detached copy (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`) of the mount tree at
/// `path`, to attach elsewhere or in another namespace with [`move_mount`].
pub(crate) fn open_tree_clone(path: &Path) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as u32;
    // SAFETY: c is a valid C string for the call.
    owned(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) })
}

/// Attaches the detached mount `mnt` (from `fsmount` or `open_tree`) at `target`.
pub(crate) fn move_mount(mnt: &OwnedFd, target: &Path) -> io::Result<()> {
    let empty = cstr("")?;
    let t = cpath(target)?;
    // SAFETY: empty and t are valid C strings for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(ret)
}

/// Mounts an overlay at `target`.
pub(crate) fn mount_overlay(spec: &OverlaySpec, target: &Path) -> Result<(), ImageError> {
    let err = |step: &'static str, source: io::Error, ctx: Option<&FsContext>| ImageError::Mount {
        target: target.to_path_buf(),
        step,
        source,
        kernel_log: ctx.map(FsContext::log).unwrap_or_default(),
    };
    let path_str = |p: &Path| -> Result<String, ImageError> {
        p.to_str().map(str::to_owned).ok_or_else(|| {
            err(
                "encoding path",
                io::Error::from_raw_os_error(libc::EINVAL),
                None,
            )
        })
    };
    let ctx = FsContext::open("overlay").map_err(|e| err("fsopen(overlay)", e, None))?;
    for (i, lower) in spec.lower.iter().enumerate() {
        if let Err(e) = ctx.set_string("lowerdir+", &path_str(lower)?) {
            if i == 0 && e.raw_os_error() == Some(libc::EINVAL) {
                let log = ctx.log();
                tracing::info!(kernel_log = %log, "kernel rejects lowerdir+; using the legacy option string");
                return mount_legacy(spec, target);
            }
            return Err(err("fsconfig(lowerdir+)", e, Some(&ctx)));
        }
    }
    ctx.set_string("upperdir", &path_str(&spec.upper)?)
        .map_err(|e| err("fsconfig(upperdir)", e, Some(&ctx)))?;
    ctx.set_string("workdir", &path_str(&spec.work)?)
        .map_err(|e| err("fsconfig(workdir)", e, Some(&ctx)))?;
    if spec.userxattr {
        ctx.set_flag("userxattr")
            .map_err(|e| err("fsconfig(userxattr)", e, Some(&ctx)))?;
    }
    if let Err(e) = ctx.set_flag("volatile") {
        tracing::debug!(err = %e, kernel_log = %ctx.log(), "kernel refuses volatile overlays; syncing at unmount");
    }
    ctx.create()
        .map_err(|e| err("fsconfig(FSCONFIG_CMD_CREATE)", e, Some(&ctx)))?;
    let mnt = ctx.mount().map_err(|e| err("fsmount", e, Some(&ctx)))?;
    move_mount(&mnt, target).map_err(|e| err("move_mount", e, None))?;
    tracing::debug!(?target, layers = spec.lower.len(), "overlay mounted");
    Ok(())
}

/// The legacy option string (`lowerdir=a:b,upperdir=…,workdir=…`), if it fits.
fn mount_legacy(spec: &OverlaySpec, target: &Path) -> Result<(), ImageError> {
    let lower: Vec<String> = spec
        .lower
        .iter()
        .map(|p| {
            p.display()
                .to_string()
                .replace('\\', "\\\\")
                .replace(':', "\\:")
        })
        .collect();
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}{}",
        lower.join(":"),
        spec.upper.display(),
        spec.work.display(),
        if spec.userxattr { ",userxattr" } else { "" }
    );
    if opts.len() > LEGACY_LIMIT {
        return Err(ImageError::MountOptionsTooLong {
            target: target.to_path_buf(),
            layers: spec.lower.len(),
            len: opts.len(),
            limit: LEGACY_LIMIT,
        });
    }
    let err = |source| ImageError::Mount {
        target: target.to_path_buf(),
        step: "mount(2) overlay",
        source,
        kernel_log: String::new(),
    };
    let src = cstr("overlay").map_err(err)?;
    let data = cstr(&opts).map_err(err)?;
    let t = cpath(target).map_err(err)?;
    // SAFETY: all pointers are valid C strings for the call.
    let ret = unsafe {
        libc::mount(
            src.as_ptr(),
            t.as_ptr(),
            src.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    check(libc::c_long::from(ret)).map_err(err)
}

/// Unmounts `path`: a plain unmount, a lazy detach if it is busy; "not mounted" and "does
/// not exist" are success.
pub(crate) fn unmount(path: &Path) -> Result<(), ImageError> {
    // A copied rootfs is no mount; asking an unprivileged umount2 gives EPERM, not EINVAL.
    if !is_mount_point(path) {
        return Ok(());
    }
    let p = cpath(path).map_err(|source| ImageError::Unmount {
        path: path.to_path_buf(),
        source,
    })?;
    for flags in [0, libc::MNT_DETACH] {
        // SAFETY: p is a valid C string.
        let ret = unsafe { libc::umount2(p.as_ptr(), flags) };
        if ret == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOENT) => return Ok(()),
            Some(libc::EBUSY) if flags == 0 => {
                tracing::warn!(?path, "rootfs busy; detaching lazily");
                continue;
            }
            _ => {
                return Err(ImageError::Unmount {
                    path: path.to_path_buf(),
                    source: e,
                })
            }
        }
    }
    Ok(())
}

/// `true` if `path` is a mount point (its device differs from its parent's).
pub(crate) fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(me), Some(parent)) = (std::fs::symlink_metadata(path), path.parent()) else {
        return false;
    };
    std::fs::symlink_metadata(parent).is_ok_and(|p| p.dev() != me.dev())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_in(dir: &Path, layers: usize) -> OverlaySpec {
        let lower: Vec<PathBuf> = (0..layers).map(|i| dir.join(format!("l{i}"))).collect();
        for l in &lower {
            std::fs::create_dir_all(l).unwrap();
        }
        for d in ["upper", "work", "merged"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        OverlaySpec {
            lower,
            upper: dir.join("upper"),
            work: dir.join("work"),
            userxattr: false,
        }
    }

    #[test]
    fn the_legacy_fallback_refuses_option_strings_longer_than_a_page() {
        let long = PathBuf::from(format!("/{}", "x".repeat(200)));
        let spec = OverlaySpec {
            lower: vec![long.clone(); 30],
            upper: long.clone(),
            work: long,
            userxattr: false,
        };
        let err = mount_legacy(&spec, Path::new("/nonexistent")).unwrap_err();
        assert!(
            matches!(err, ImageError::MountOptionsTooLong { layers: 30, .. }),
            "{err}"
        );
    }

    #[test]
    fn the_legacy_fallback_and_the_new_api_mount_the_same_stack() {
        if !crate::image::sys::is_root() {
            eprintln!("skipped: mounting needs root");
            return;
        }
        for legacy in [true, false] {
            let tmp = tempfile::tempdir().unwrap();
            let spec = spec_in(tmp.path(), 2);
            std::fs::write(spec.lower[0].join("top"), b"t").unwrap();
            std::fs::write(spec.lower[1].join("bottom"), b"b").unwrap();
            let merged = tmp.path().join("merged");
            if legacy {
                mount_legacy(&spec, &merged).unwrap();
            } else {
                mount_overlay(&spec, &merged).unwrap();
            }
            assert!(is_mount_point(&merged));
            assert!(merged.join("top").exists() && merged.join("bottom").exists());
            if !legacy {
                // The kernel here (6.x) takes the flag: no sync of the upper at unmount.
                let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
                let line = mountinfo
                    .lines()
                    .find(|l| l.contains(&*merged.to_string_lossy()))
                    .unwrap_or_default();
                assert!(line.contains("volatile"), "not volatile: {line}");
            }
            unmount(&merged).unwrap();
            assert!(!is_mount_point(&merged));
            unmount(&merged).unwrap();
        }
    }
}

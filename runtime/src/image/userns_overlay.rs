//! Rootless container root file systems as overlayfs, mounted inside the container's user
//! namespace ([`RootfsMode::UsernsOverlay`](super::RootfsMode::UsernsOverlay)).
//!
//! An unprivileged agent cannot mount on the host, but root of a user namespace may mount
//! overlayfs (option `userxattr`) in a mount namespace that namespace owns, and the zygote's
//! worker is exactly that when it creates a rootless container (`zygote/userns.rs`):
//!
//! ```text
//!  agent: prepare_rootfs                        worker (container's userns, own mount ns)
//!  target/rootfs  (empty)                        mount overlay on target/rootfs:
//!        /upper /work                              lowerdir+ = snapshots (top first),
//!        /rootfs-overlay.json ──── read by ──►     upperdir, workdir, userxattr, volatile
//!                                                libcontainer's container copies that mount
//! ```
//!
//! Guarantees:
//! - nothing is mounted on the host: the overlay lives in the worker's mount namespace and the
//!   container's copy of it, and goes with them; a failed create leaves nothing mounted and
//!   [`release_rootfs`](super::ImageStore::release_rootfs) only removes directories;
//! - the snapshots must all carry [`WhiteoutFormat::UserXattr`](super::WhiteoutFormat)
//!   whiteouts, which overlayfs with `userxattr` reads (older `Sidecar` snapshots are copied);
//! - whether this kernel allows it is [`probe`]d once per store, by a forked process that
//!   makes a user and mount namespace, mounts two such layers and checks that a whiteout, a
//!   whiteout beside a kept file and an opaque directory hide what they must and that the
//!   upper layer takes writes; on any failure root file systems are copies and one log line
//!   says why;
//! - the lower files belong to the user, i.e. to root inside: files the image gives other
//!   owners (recorded in xattrs, `owners.rs`) are chowned by the worker in the overlay,
//!   which copies them up into `upper` (only images that have such files pay for it);
//! - before the container runs, the spec reads image files (`/etc/passwd`) through
//!   [`open_merged`], a lookup of the merged view that follows overlayfs's rules.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::ImageError;
use super::fsx;
use super::mount::{self, OverlaySpec};
use super::whiteout::{USER_OPAQUE_XATTR, USER_WHITEOUT_XATTR};

/// The file beside `rootfs` describing the overlay to mount on it.
pub(crate) const DESCRIPTION: &str = "rootfs-overlay.json";

/// What the worker mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Description {
    /// Snapshot trees, top first.
    pub lower: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Some layer may hold files with recorded owners (`owners.rs`): the worker must apply
    /// them (a walk of the whole tree; skipped when no layer has any).
    pub owners: bool,
}

/// Writes the description for the rootfs under `target_dir`.
pub(crate) fn describe(target_dir: &Path, d: &Description) -> Result<(), ImageError> {
    let path = target_dir.join(DESCRIPTION);
    let bytes = serde_json::to_vec(d)
        .map_err(|e| ImageError::io("encoding", &path, std::io::Error::other(e)))?;
    fsx::write_state(&path, &bytes)
}

/// The description for the rootfs under `target_dir`, if there is one.
pub(crate) fn read(target_dir: &Path) -> Option<Description> {
    let bytes = std::fs::read(target_dir.join(DESCRIPTION)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// In the zygote's worker, as root of the container's user namespace in a mount namespace it
/// owns: mounts the overlay described beside `rootfs` on it. `None` when there is no
/// description (a copied rootfs); else whether owners must be applied.
pub(crate) fn mount_described(rootfs: &Path) -> Result<Option<bool>, String> {
    let Some(target_dir) = rootfs.parent() else {
        return Ok(None);
    };
    let Some(d) = read(target_dir) else {
        return Ok(None);
    };
    let spec = OverlaySpec {
        lower: d.lower,
        upper: d.upper,
        work: d.work,
        userxattr: true,
    };
    mount::mount_overlay(&spec, rootfs)
        .map_err(|e| format!("rootless: mount the overlay on {}: {e}", rootfs.display()))?;
    Ok(Some(d.owners))
}

/// Checks, in a forked process, that overlayfs with `userxattr` mounts in a new user
/// namespace and reads [`WhiteoutFormat::UserXattr`](super::WhiteoutFormat) whiteouts.
/// `scratch` is a new empty directory on the snapshots' file system; the caller removes it.
pub(crate) fn probe(scratch: &Path) -> Result<(), String> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |e: std::io::Error| format!("preparing the probe ({what}): {e}")
    };
    let (l1, l2) = (scratch.join("l1"), scratch.join("l2"));
    for d in ["l1/d", "l1/o", "l2/d", "l2/o", "u", "w", "m"] {
        std::fs::create_dir_all(scratch.join(d)).map_err(io(d))?;
    }
    for f in [
        "l1/hidden",
        "l1/d/hidden",
        "l1/d/kept",
        "l1/o/old",
        "l2/o/new",
    ] {
        std::fs::write(scratch.join(f), b"x").map_err(io(f))?;
    }
    for w in ["l2/hidden", "l2/d/hidden"] {
        std::fs::write(scratch.join(w), b"").map_err(io(w))?;
        xattr::set(scratch.join(w), USER_WHITEOUT_XATTR, b"y").map_err(io(w))?;
    }
    for (d, v) in [("l2", b"x"), ("l2/d", b"x"), ("l2/o", b"y")] {
        xattr::set(scratch.join(d), USER_OPAQUE_XATTR, v).map_err(io(d))?;
    }
    let m = scratch.join("m");
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|e| e.to_string());
    let options = format!(
        "lowerdir={}:{},upperdir={},workdir={},userxattr",
        l2.display(),
        l1.display(),
        scratch.join("u").display(),
        scratch.join("w").display()
    );
    // Everything the child needs is made before the fork: it may only make system calls.
    let plan = Plan {
        uid_map: format!("0 {} 1", nix::unistd::geteuid()).into_bytes(),
        gid_map: format!("0 {} 1", nix::unistd::getegid()).into_bytes(),
        options: CString::new(options).map_err(|e| e.to_string())?,
        target: c(&m)?,
        absent: [
            c(&m.join("hidden"))?,
            c(&m.join("d/hidden"))?,
            c(&m.join("o/old"))?,
        ],
        present: [c(&m.join("d/kept"))?, c(&m.join("o/new"))?],
        write: c(&m.join("written"))?,
    };
    plan.run()
}

/// The forked probe's steps, in order (its exit report names one).
const STEPS: [&str; 8] = [
    "unshare(CLONE_NEWUSER|CLONE_NEWNS)",
    "write /proc/self/setgroups",
    "write /proc/self/uid_map",
    "write /proc/self/gid_map",
    "mount -t overlay -o userxattr",
    "a user.overlay.whiteout file or an opaque directory did not hide a lower file",
    "a lower file beside a whiteout or below an opaque directory was hidden",
    "write into the upper layer",
];

struct Plan {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    options: CString,
    target: CString,
    absent: [CString; 3],
    present: [CString; 2],
    write: CString,
}

impl Plan {
    fn run(&self) -> Result<(), String> {
        let (read_end, write_end) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
        // SAFETY: the child only makes system calls on data prepared above, writes its
        // report and `_exit`s: nothing that needs the allocator or a lock another thread holds.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!("fork: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            let report = self.child();
            let bytes = [
                report.0,
                report.1 .0[0],
                report.1 .0[1],
                report.1 .0[2],
                report.1 .0[3],
            ];
            // SAFETY: a valid descriptor and buffer; then the child ends without unwinding.
            unsafe {
                libc::write(
                    std::os::fd::AsRawFd::as_raw_fd(&write_end),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                );
                libc::_exit(i32::from(report.0 != 0));
            }
        }
        drop(write_end);
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::fs::File::from(read_end), &mut buf);
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None)
            .map_err(|e| format!("waiting for the probe: {e}"))?;
        match (buf.as_slice(), status) {
            ([0, ..], nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
            ([step, a, b, c, d], _) if *step > 0 => {
                let name = STEPS.get(usize::from(*step) - 1).unwrap_or(&"?");
                let errno = i32::from_ne_bytes([*a, *b, *c, *d]);
                Err(if errno == 0 {
                    (*name).to_owned()
                } else {
                    format!("{name}: {}", std::io::Error::from_raw_os_error(errno))
                })
            }
            (_, other) => Err(format!("the probe ended with {other:?}")),
        }
    }

    /// The child's side: `(step, errno)`, step 0 when everything worked.
    fn child(&self) -> (u8, Errno) {
        let errno = || {
            Errno(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(0)
                    .to_ne_bytes(),
            )
        };
        // SAFETY (all calls below): valid NUL-terminated strings and buffers that outlive
        // each call; no allocation.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return (1, errno());
            }
            for (step, file, content) in [
                (2, c"/proc/self/setgroups", &b"deny"[..]),
                (3, c"/proc/self/uid_map", &self.uid_map[..]),
                (4, c"/proc/self/gid_map", &self.gid_map[..]),
            ] {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return (step, errno());
                }
                let n = libc::write(fd, content.as_ptr().cast(), content.len());
                if n < 0 {
                    return (step, errno());
                }
                libc::close(fd);
            }
            if libc::mount(
                c"overlay".as_ptr(),
                self.target.as_ptr(),
                c"overlay".as_ptr(),
                0,
                self.options.as_ptr().cast(),
            ) != 0
            {
                return (5, errno());
            }
            let mut st: libc::stat = std::mem::zeroed();
            for path in &self.absent {
                if libc::fstatat(
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                ) == 0
                {
                    return (6, Errno([0; 4]));
                }
            }
            for path in &self.present {
                if libc::fstatat(
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                ) != 0
                {
                    return (7, errno());
                }
            }
            let fd = libc::open(
                self.write.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600,
            );
            if fd < 0 {
                return (8, errno());
            }
            libc::close(fd);
        }
        (0, Errno([0; 4]))
    }
}

/// An errno in native byte order (what the child reports).
struct Errno([u8; 4]);

/// Opens the regular file `inner` (absolute inside the root) of the merged view overlayfs with
/// `userxattr` gives `layers` (top first), before anything mounts it: the `/etc/passwd` the
/// spec resolves users with. `None` when the merged view has nothing there.
///
/// Each component is looked up in the layers top first, as overlayfs does: a whiteout
/// (`user.overlay.whiteout` file, 0:0 device) ends the lookup, a non-directory is the
/// answer unless a directory above it was found, directories merge down to the first opaque
/// one. Symlinks are resolved inside the merged root (absolute ones from its top, `..`
/// never above it), at most 40; every component is opened by name from its parent without
/// following anything, so the lookup never leaves the layers.
pub fn open_merged(layers: &[PathBuf], inner: &str) -> std::io::Result<Option<std::fs::File>> {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    use std::os::fd::{AsFd, OwnedFd};
    let roots: Vec<OwnedFd> = layers
        .iter()
        .map(|l| super::sys::open_dir(l))
        .collect::<Result<_, _>>()?;
    let components = |p: &Path| -> Vec<OsString> {
        p.components()
            .filter_map(|c| match c {
                std::path::Component::Normal(n) => Some(n.to_os_string()),
                std::path::Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect()
    };
    // The merged directories entered, each as its layers' directories (top first).
    let mut stack: Vec<Vec<OwnedFd>> = Vec::new();
    let mut todo: VecDeque<OsString> = components(Path::new(inner)).into();
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            stack.pop();
            continue;
        }
        let dirs = stack.last().unwrap_or(&roots);
        match merged_child(dirs, &name)? {
            Merged::Missing => return Ok(None),
            Merged::Dir(fds) => stack.push(fds),
            Merged::Symlink(target) => {
                links += 1;
                if links > 40 {
                    return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = Path::new(&target);
                if target.is_absolute() {
                    stack.clear();
                }
                for c in components(target).into_iter().rev() {
                    todo.push_front(c);
                }
            }
            Merged::File(dir, st) if todo.is_empty() => {
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(std::io::Error::other("not a regular file"));
                }
                let fd = super::sys::open_beneath(
                    dir.as_fd(),
                    Path::new(&name),
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
                    libc::RESOLVE_NO_SYMLINKS,
                )?;
                return Ok(Some(std::fs::File::from(fd)));
            }
            // A non-directory in the middle of the path.
            Merged::File(..) => return Ok(None),
        }
    }
    Err(std::io::Error::other("not a regular file"))
}

/// What the merged view has at one name of a merged directory.
enum Merged {
    Missing,
    Dir(Vec<std::os::fd::OwnedFd>),
    Symlink(std::ffi::OsString),
    /// A non-directory, non-symlink: the layer directory holding it and its stat.
    File(std::os::fd::OwnedFd, libc::stat),
}

fn merged_child(dirs: &[std::os::fd::OwnedFd], name: &std::ffi::OsStr) -> std::io::Result<Merged> {
    use super::sys;
    use std::os::fd::{AsFd, AsRawFd};
    let mut found = Vec::new();
    for dir in dirs {
        let Some(st) = sys::lstat_at(dir.as_fd(), name)? else {
            continue;
        };
        let kind = st.st_mode & libc::S_IFMT;
        if kind == libc::S_IFDIR {
            let fd =
                sys::open_dir_beneath(dir.as_fd(), Path::new(name), libc::RESOLVE_NO_SYMLINKS)?;
            // `.`: the directory itself, not the magic link to it (xattr reads do not follow).
            let by_fd = PathBuf::from(format!("/proc/self/fd/{}/.", fd.as_raw_fd()));
            let opaque = matches!(xattr::get(&by_fd, USER_OPAQUE_XATTR), Ok(Some(v)) if v == b"y");
            found.push(fd);
            if opaque {
                break;
            }
            continue;
        }
        if !found.is_empty() {
            // Below a directory of a layer above: hidden, as is everything further down.
            break;
        }
        let by_name = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
        let device_whiteout = kind == libc::S_IFCHR && st.st_rdev == 0;
        if device_whiteout || super::whiteout::is_xattr_whiteout(&by_name, st.st_mode, st.st_size) {
            return Ok(Merged::Missing);
        }
        if kind == libc::S_IFLNK {
            return Ok(Merged::Symlink(sys::readlink_at(dir.as_fd(), name)?));
        }
        return Ok(Merged::File(dir.try_clone()?, st));
    }
    Ok(if found.is_empty() {
        Merged::Missing
    } else {
        Merged::Dir(found)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn read(layers: &[PathBuf], inner: &str) -> Option<String> {
        let mut s = String::new();
        open_merged(layers, inner)
            .unwrap()?
            .read_to_string(&mut s)
            .unwrap();
        Some(s)
    }

    #[test]
    fn merged_reads_follow_overlayfs_whiteouts_opaque_dirs_and_symlinks_across_layers() {
        let tmp = tempfile::tempdir().unwrap();
        let (top, bottom) = (tmp.path().join("top"), tmp.path().join("bottom"));
        for d in [
            "bottom/etc",
            "bottom/opq",
            "bottom/real",
            "top/etc",
            "top/opq",
            "top/a/b",
        ] {
            std::fs::create_dir_all(tmp.path().join(d)).unwrap();
        }
        for (f, content) in [
            ("bottom/etc/passwd", "lower passwd"),
            ("bottom/etc/group", "lower group"),
            ("bottom/opq/old", "old"),
            ("bottom/real/file", "real"),
            ("top/opq/new", "new"),
        ] {
            std::fs::write(tmp.path().join(f), content).unwrap();
        }
        std::fs::write(top.join("etc/passwd"), b"").unwrap();
        xattr::set(top.join("etc/passwd"), USER_WHITEOUT_XATTR, b"y").unwrap();
        xattr::set(top.join("etc"), USER_OPAQUE_XATTR, b"x").unwrap();
        xattr::set(top.join("opq"), USER_OPAQUE_XATTR, b"y").unwrap();
        std::os::unix::fs::symlink("/real/file", top.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../../real/file", top.join("a/b/rel")).unwrap();
        std::os::unix::fs::symlink("loop", top.join("loop")).unwrap();
        let layers = [top, bottom];

        assert_eq!(read(&layers, "/etc/passwd"), None, "whited out above");
        assert_eq!(read(&layers, "/etc/group").as_deref(), Some("lower group"));
        assert_eq!(read(&layers, "/opq/old"), None, "below an opaque directory");
        assert_eq!(read(&layers, "/opq/new").as_deref(), Some("new"));
        assert_eq!(
            read(&layers, "/abs").as_deref(),
            Some("real"),
            "a link to another layer"
        );
        assert_eq!(
            read(&layers, "/a/b/rel").as_deref(),
            Some("real"),
            "`..` stops at the root"
        );
        assert_eq!(read(&layers, "/etc/passwd/x"), None);
        assert_eq!(read(&layers, "/missing"), None);
        assert!(open_merged(&layers, "/loop").is_err());
        assert!(
            open_merged(&layers, "/etc").is_err(),
            "a directory is no file"
        );
    }
}

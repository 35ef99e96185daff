//! Reading a small file of the container's root filesystem without escaping it.
//!
//! The path is resolved with `openat2(RESOLVE_IN_ROOT)`: symlinks (absolute or with `..`) are
//! resolved as if the rootfs were `/`, so an image whose `/etc/passwd` links to
//! `/host/etc/passwd` gets `<rootfs>/host/etc/passwd`, never a host file. Magic links
//! (`/proc/self/...`) are refused, and the result must be a regular file no larger than
//! [`MAX_SIZE`], so a FIFO or device node cannot block or flood the agent.
//!
//! Requires Linux ≥ 5.6 (openat2); older kernels get a clear `ENOSYS` error.

use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

use super::SpecError;

/// Bigger `/etc/passwd` files are refused.
pub(crate) const MAX_SIZE: u64 = 8 << 20;

/// An open root filesystem directory, or the layers it will be the overlay of.
pub(crate) struct Rootfs {
    dir: OwnedFd,
    path: PathBuf,
    /// Not empty: the rootfs is mounted only inside the container (a rootless overlay) and
    /// files are read from the merged view of these snapshot trees, top first (see
    /// `image/userns_overlay.rs`).
    layers: Vec<PathBuf>,
}

impl Rootfs {
    pub(crate) fn open(path: &Path, layers: &[PathBuf]) -> Result<Self, SpecError> {
        let not_a_dir = || SpecError::RootfsNotADirectory {
            path: path.to_owned(),
        };
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|_| not_a_dir())?;
        // SAFETY: `open` returned a fresh descriptor that nothing else owns.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self {
            dir,
            path: path.to_owned(),
            layers: layers.to_vec(),
        })
    }

    /// The content of `inner` (an absolute path inside the rootfs), or `None` if it does not
    /// exist.
    pub(crate) fn read(&self, inner: &str) -> Result<Option<String>, SpecError> {
        let shown = self.path.join(inner.trim_start_matches('/'));
        let fail = |source: std::io::Error| SpecError::ReadRootfsFile {
            path: shown.clone(),
            source,
        };
        let file = if self.layers.is_empty() {
            let how = OpenHow::new()
                .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK)
                .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
            let fd =
                match nix::fcntl::openat2(std::os::fd::AsRawFd::as_raw_fd(&self.dir), inner, how) {
                    Ok(fd) => fd,
                    Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(None),
                    Err(errno) => return Err(fail(errno.into())),
                };
            // SAFETY: `openat2` returned a fresh descriptor that nothing else owns.
            unsafe { File::from_raw_fd(fd) }
        } else {
            match crate::image::userns_overlay::open_merged(&self.layers, inner) {
                Ok(Some(file)) => file,
                Ok(None) => return Ok(None),
                Err(e) => return Err(fail(e)),
            }
        };
        let meta = file.metadata().map_err(fail)?;
        if !meta.is_file() {
            return Err(fail(std::io::Error::other("not a regular file")));
        }
        if meta.len() > MAX_SIZE {
            return Err(fail(std::io::Error::other(format!(
                "larger than {MAX_SIZE} bytes"
            ))));
        }
        let mut content = String::new();
        file.take(MAX_SIZE)
            .read_to_string(&mut content)
            .map_err(fail)?;
        Ok(Some(content))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absolute_symlink_resolves_inside_the_rootfs() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("etc")).expect("mkdir");
        std::fs::create_dir_all(root.path().join("real")).expect("mkdir");
        std::fs::write(root.path().join("real/passwd"), "inside\n").expect("write");
        std::os::unix::fs::symlink("/real/passwd", root.path().join("etc/passwd"))
            .expect("symlink");
        let rootfs = Rootfs::open(root.path(), &[]).expect("open");
        assert_eq!(
            rootfs.read("/etc/passwd").expect("read").as_deref(),
            Some("inside\n")
        );
    }

    #[test]
    fn dotdot_in_a_symlink_cannot_climb_out_of_the_rootfs() {
        let outer = tempfile::tempdir().expect("tempdir");
        std::fs::write(outer.path().join("secret"), "host\n").expect("write");
        let root = outer.path().join("rootfs");
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        std::os::unix::fs::symlink("../../../secret", root.join("etc/group")).expect("symlink");
        let rootfs = Rootfs::open(&root, &[]).expect("open");
        assert_eq!(rootfs.read("/etc/group").expect("read"), None);
    }

    #[test]
    fn a_fifo_is_refused_instead_of_blocking() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("etc")).expect("mkdir");
        nix::unistd::mkfifo(&root.path().join("etc/passwd"), Mode::S_IRUSR).expect("mkfifo");
        let rootfs = Rootfs::open(root.path(), &[]).expect("open");
        assert!(matches!(
            rootfs.read("/etc/passwd"),
            Err(SpecError::ReadRootfsFile { .. })
        ));
    }

    #[test]
    fn a_missing_rootfs_is_reported_as_not_a_directory() {
        assert!(matches!(
            Rootfs::open(Path::new("/nonexistent/ironlet/rootfs"), &[]),
            Err(SpecError::RootfsNotADirectory { .. })
        ));
    }
}

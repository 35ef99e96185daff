//! `subPath` mounts, made safe the way kubelet's `PrepareSafeSubpath` does: the subpath is
//! opened beneath the volume and that open file is bind-mounted onto a target the agent
//! owns (`<pod>/volume-subpaths/<volume>/<container>/<index>`); the container mounts the
//! target. The runtime therefore never resolves a path a container could have changed.
//!
//! Guarantees:
//! * a subPath that is absolute or has a `..` component is refused before touching disk;
//! * resolution uses `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from the volume's
//!   directory: symlinks inside the volume are followed as long as they stay inside (an
//!   absolute symlink is refused, even one pointing back in — stricter than kubelet); any
//!   escape is refused by the kernel, so there is no window between check and use;
//! * missing directories of the subPath are created inside the volume with the volume
//!   directory's mode, as kubelet's `SafeMakeDir`;
//! * an existing bind of the same file is reused (container restarts); a bind of another
//!   file is replaced. Binds are removed with the pod's volumes (`teardown`).
//!
//! Requires Linux ≥ 5.6 (`openat2`).

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::mount::{mount, MsFlags};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode, SFlag};

use super::error::SubPathError;
use super::mount_table;

/// Refuses absolute subPaths and `..` components (kubelet's checks, with its messages).
pub(crate) fn validate(sub_path: &str) -> Result<(), SubPathError> {
    if sub_path.starts_with('/') {
        return Err(SubPathError::Absolute(sub_path.to_owned()));
    }
    if sub_path.split('/').any(|part| part == "..") {
        return Err(SubPathError::Backsteps(sub_path.to_owned()));
    }
    Ok(())
}

/// Opens (creating missing directories) `sub_path` beneath `volume` and bind-mounts it onto
/// `target`; returns `target`.
pub(crate) fn prepare(
    volume: &Path,
    sub_path: &str,
    target: &Path,
) -> Result<PathBuf, SubPathError> {
    validate(sub_path)?;
    let root: OwnedFd = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(volume)
        .map_err(|err| SubPathError::OpenVolume {
            path: volume.to_path_buf(),
            source: Errno::from_raw(err.raw_os_error().unwrap_or(libc::EIO)),
        })?
        .into();
    let source = open_or_create(&root, volume, sub_path)?;
    bind(&source, target)?;
    Ok(target.to_path_buf())
}

/// Opens `path` beneath `root` without leaving it.
fn open_beneath(root: &OwnedFd, path: &str, flags: OFlag) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = openat2(root.as_raw_fd(), path, how)?;
    // SAFETY: `openat2` just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Walks `sub_path` component by component beneath `root`, creating missing directories.
fn open_or_create(root: &OwnedFd, volume: &Path, sub_path: &str) -> Result<OwnedFd, SubPathError> {
    let fail = |step: &'static str, prefix: &str, source: Errno| match source {
        Errno::EXDEV | Errno::ELOOP => SubPathError::Escapes {
            sub_path: sub_path.to_owned(),
            volume: volume.to_path_buf(),
        },
        source => SubPathError::Resolve {
            step,
            sub_path: prefix.to_owned(),
            volume: volume.to_path_buf(),
            source,
        },
    };
    let mode = fstat(root.as_raw_fd())
        .map(|st| Mode::from_bits_truncate(st.st_mode & 0o7777))
        .map_err(|err| fail("opening", ".", err))?;
    let mut current =
        open_beneath(root, ".", OFlag::O_PATH).map_err(|err| fail("opening", ".", err))?;
    let mut prefix = String::new();
    for part in sub_path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        let parent = current;
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(part);
        current = match open_beneath(root, &prefix, OFlag::O_PATH) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                match mkdirat(Some(parent.as_raw_fd()), part, mode) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(err) => return Err(fail("creating", &prefix, err)),
                }
                let created = open_beneath(root, &prefix, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
                    .map_err(|err| fail("opening", &prefix, err))?;
                fchmod(created.as_raw_fd(), mode).map_err(|err| fail("creating", &prefix, err))?;
                created
            }
            Err(err) => return Err(fail("opening", &prefix, err)),
        };
    }
    Ok(current)
}

/// Bind-mounts the open file `source` onto `target`, reusing an equal existing bind.
fn bind(source: &OwnedFd, target: &Path) -> Result<(), SubPathError> {
    let target_err = |source: io::Error| SubPathError::Target {
        target: target.to_path_buf(),
        source,
    };
    let stat = fstat(source.as_raw_fd()).map_err(|err| target_err(err.into()))?;
    let is_dir = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR;
    if let Some(parent) = target.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(parent)
            .map_err(target_err)?;
    }
    let canonical_parent = target
        .parent()
        .map(fs::canonicalize)
        .transpose()
        .map_err(target_err)?;
    let canonical = match (canonical_parent, target.file_name()) {
        (Some(parent), Some(name)) => parent.join(name),
        _ => target.to_path_buf(),
    };
    if mount_table::is_mount_point(&canonical).map_err(target_err)? {
        let same =
            fs::metadata(target).is_ok_and(|m| m.dev() == stat.st_dev && m.ino() == stat.st_ino);
        if same {
            return Ok(());
        }
        mount_table::unmount(target).map_err(|err| target_err(err.into()))?;
    }
    prepare_target(target, is_dir).map_err(target_err)?;
    let proc_path = format!("/proc/self/fd/{}", source.as_raw_fd());
    mount(
        Some(proc_path.as_str()),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|source| SubPathError::Bind {
        target: target.to_path_buf(),
        source,
    })
}

/// Makes `target` an empty directory (for a directory source) or an empty file.
fn prepare_target(target: &Path, is_dir: bool) -> io::Result<()> {
    match fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() == is_dir && !m.file_type().is_symlink() => return Ok(()),
        Ok(m) if m.is_dir() => fs::remove_dir(target)?,
        Ok(_) => fs::remove_file(target)?,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    if is_dir {
        fs::DirBuilder::new().mode(0o750).create(target)
    } else {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(target)
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_and_backstepping_sub_paths_are_refused_with_kubelets_messages() {
        assert_eq!(
            validate("/etc").unwrap_err().to_string(),
            "error SubPath `/etc` must not be an absolute path"
        );
        assert_eq!(
            validate("a/../../b").unwrap_err().to_string(),
            "unable to provision SubPath `a/../../b`: must not contain '..'"
        );
        assert!(validate("a/..b/c..").is_ok());
    }

    #[test]
    fn missing_directories_are_created_inside_the_volume_with_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("vol");
        fs::create_dir(&volume).unwrap();
        fs::set_permissions(&volume, std::os::unix::fs::PermissionsExt::from_mode(0o751)).unwrap();
        let root: OwnedFd = fs::File::open(&volume).unwrap().into();
        open_or_create(&root, &volume, "a/./b//c").unwrap();
        let mode = fs::metadata(volume.join("a/b/c")).unwrap().mode();
        assert_eq!(mode & 0o777, 0o751);
    }

    #[test]
    fn symlinks_leaving_the_volume_are_refused_and_inner_ones_followed() {
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("vol");
        fs::create_dir_all(volume.join("real")).unwrap();
        std::os::unix::fs::symlink("real", volume.join("inner")).unwrap();
        std::os::unix::fs::symlink("../..", volume.join("up")).unwrap();
        std::os::unix::fs::symlink("/etc", volume.join("abs")).unwrap();
        let root: OwnedFd = fs::File::open(&volume).unwrap().into();
        open_or_create(&root, &volume, "inner/new").unwrap();
        assert!(volume.join("real/new").is_dir());
        for escape in ["up", "up/x", "abs", "abs/passwd"] {
            let err = open_or_create(&root, &volume, escape).unwrap_err();
            assert!(
                matches!(err, SubPathError::Escapes { .. }),
                "{escape}: {err}"
            );
        }
        assert!(!dir.path().join("x").exists(), "nothing is created outside");
    }
}

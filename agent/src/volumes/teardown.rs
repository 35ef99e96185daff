//! `teardown_pod_volumes`: unmount everything under the pod's `volume-subpaths` and `volumes`
//! directories (subpath binds first, they may sit on a volume's tmpfs), check that nothing is
//! mounted there any more, then delete both directories.
//!
//! Deletion uses `std::fs::remove_dir_all`, which never follows symlinks; with no mount left
//! below the directories, it cannot reach a hostPath or any other file outside the pod's
//! directory. The pod directory itself is removed only if that leaves it empty (the runtime
//! may keep its own files there).

use std::fs;
use std::io;
use std::path::Path;

use super::error::VolumeError;
use super::mount_table;

/// The pod's subdirectories this module owns, in teardown order.
const OWNED_DIRS: [&str; 2] = ["volume-subpaths", "volumes"];

/// `uid` if it can name a directory under `pods/`.
pub(super) fn checked_uid(uid: &str) -> Result<&str, VolumeError> {
    if uid.is_empty() || uid == "." || uid == ".." || uid.contains('/') || uid.contains('\0') {
        return Err(VolumeError::InvalidUid {
            uid: uid.to_owned(),
        });
    }
    Ok(uid)
}

pub(super) fn teardown(pod_dir: &Path) -> Result<(), VolumeError> {
    for name in OWNED_DIRS {
        let dir = pod_dir.join(name);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            // A symlink or file here is not ours to follow; remove the entry itself.
            Ok(_) => {
                fs::remove_file(&dir).map_err(|source| VolumeError::Remove {
                    path: dir.clone(),
                    source,
                })?;
                continue;
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(VolumeError::Remove { path: dir, source }),
        }
        let canonical = fs::canonicalize(&dir).map_err(|source| VolumeError::Remove {
            path: dir.clone(),
            source,
        })?;
        let mounts = mount_table::mounts_under(&canonical)
            .map_err(|source| VolumeError::MountTable { source })?;
        for mount in mounts {
            mount_table::unmount(&mount).map_err(|source| VolumeError::Unmount {
                path: mount.clone(),
                source,
            })?;
            tracing::debug!(path = %mount.display(), "volume unmounted");
        }
        let left = mount_table::mounts_under(&canonical)
            .map_err(|source| VolumeError::MountTable { source })?;
        if let Some(path) = left.into_iter().next() {
            return Err(VolumeError::StillMounted { path });
        }
        fs::remove_dir_all(&dir).map_err(|source| VolumeError::Remove { path: dir, source })?;
    }
    // Only succeeds when empty: the runtime may still hold files in the pod directory.
    let _ = fs::remove_dir(pod_dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_that_are_not_a_single_path_component_are_refused() {
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert!(checked_uid(bad).is_err(), "{bad:?}");
        }
        assert_eq!(checked_uid("0f3c-11").unwrap(), "0f3c-11");
    }

    #[test]
    fn teardown_removes_owned_dirs_but_not_symlink_targets() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), "x").unwrap();
        let pod = dir.path().join("pods/uid");
        let volume = pod.join("volumes/kubernetes.io~empty-dir/data");
        fs::create_dir_all(&volume).unwrap();
        std::os::unix::fs::symlink(&outside, volume.join("link")).unwrap();
        std::os::unix::fs::symlink(&outside, pod.join("volume-subpaths")).unwrap();
        teardown(&pod).unwrap();
        assert!(!pod.exists());
        assert!(outside.join("keep").exists());
        teardown(&pod).unwrap();
    }
}

//! Removing what libcontainer made for a container that has already exited, without a
//! libcontainer call: its cgroup directories and its state directory.
//!
//! libcontainer's `delete` does the same after ~700 syscalls of state loading and checks
//! (~9 ms per container on cgroup v1); for an exited container whose exit the zygote has
//! reaped, two rmdirs per controller and one directory removal are all that is left. If a
//! cgroup cannot be removed (a process is still in it), the caller falls back to
//! libcontainer's forced delete.

use std::path::Path;

/// Removes the cgroup dirs and libcontainer state of an exited container. Returns `false`
/// when something is left that needs libcontainer's forced delete.
pub fn remove_exited(
    hierarchy: Option<&ironlet_cgroups::Hierarchy>,
    cgroups_path: Option<&str>,
    libcontainer_root: &Path,
    id: &str,
) -> bool {
    if let (Some(h), Some(path)) = (hierarchy, cgroups_path) {
        let Ok(path) = ironlet_cgroups::CgroupPath::new(path) else {
            return false;
        };
        for dir in h.dirs(&path) {
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    tracing::debug!(?dir, %err, "cgroup still busy; using libcontainer's delete");
                    return false;
                }
            }
        }
    }
    match std::fs::remove_dir_all(libcontainer_root.join(id)) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

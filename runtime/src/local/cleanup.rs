//! Removing what libcontainer made for a container that has already exited, without a
//! libcontainer call: its cgroup directories and its state directory. And finding the torn
//! state an interrupted create or remove leaves ([`find_torn`]), for `recover.rs`.
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

/// Leftovers of an interrupted create or remove, found at start-up by the owner of the
/// data root (the supervised agent; never `ironlet ctr`, which may run beside it).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TornState {
    /// `containers/<id>/` directories without a readable record.
    pub container_dirs: Vec<String>,
    /// `sandboxes/<id>/` directories without a readable record.
    pub sandbox_dirs: Vec<String>,
    /// `libcontainer/<id>/` state of containers nobody has a record of.
    pub libcontainer_states: Vec<String>,
    /// `exits/<id>.json` of containers nobody has a record of.
    pub exit_records: Vec<String>,
}

/// Finds torn state under the data root. `known` holds the ids of container records.
pub fn find_torn(
    containers_dir: &Path,
    sandboxes_dir: &Path,
    libcontainer_root: &Path,
    exits_dir: &Path,
    known: &std::collections::HashSet<String>,
) -> TornState {
    let names = |dir: &Path| -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        out.sort();
        out
    };
    let without_record = |dir: &Path| -> Vec<String> {
        names(dir)
            .into_iter()
            .filter(|n| dir.join(n).is_dir() && !dir.join(n).join("record.json").is_file())
            .collect()
    };
    TornState {
        container_dirs: without_record(containers_dir),
        sandbox_dirs: without_record(sandboxes_dir),
        libcontainer_states: names(libcontainer_root)
            .into_iter()
            .filter(|n| !known.contains(n))
            .collect(),
        exit_records: names(exits_dir)
            .into_iter()
            .filter_map(|n| n.strip_suffix(".json").map(str::to_owned))
            .filter(|id| !known.contains(id))
            .collect(),
    }
}

/// Unpins a torn sandbox's namespace files (`<dir>/ns/{net,ipc,uts}`) and removes its
/// directory. Idempotent.
pub fn remove_torn_sandbox(dir: &Path) -> std::io::Result<()> {
    for kind in ["net", "ipc", "uts"] {
        let file = dir.join("ns").join(kind);
        if file.exists() {
            match nix::mount::umount2(&file, nix::mount::MntFlags::MNT_DETACH) {
                Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_without_records_and_state_of_unknown_containers_are_torn() {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = |p: &str| {
            let path = root.path().join(p);
            std::fs::create_dir_all(&path).expect("mkdir");
            path
        };
        let containers = dir("containers");
        let sandboxes = dir("sandboxes");
        let lc = dir("libcontainer");
        let exits = dir("exits");
        dir("containers/whole");
        std::fs::write(containers.join("whole/record.json"), "{}").expect("write");
        dir("containers/half");
        dir("sandboxes/s-half/ns");
        dir("libcontainer/whole");
        dir("libcontainer/ghost");
        std::fs::write(exits.join("whole.json"), "{}").expect("write");
        std::fs::write(exits.join("gone.json"), "{}").expect("write");
        std::fs::write(exits.join(".gone.json.tmp1"), "{}").expect("write");
        let known = ["whole".to_owned()].into_iter().collect();
        let torn = find_torn(&containers, &sandboxes, &lc, &exits, &known);
        assert_eq!(
            torn,
            TornState {
                container_dirs: vec!["half".into()],
                sandbox_dirs: vec!["s-half".into()],
                libcontainer_states: vec!["ghost".into()],
                exit_records: vec!["gone".into()],
            }
        );
        remove_torn_sandbox(&sandboxes.join("s-half")).expect("remove");
        assert!(!sandboxes.join("s-half").exists());
    }
}

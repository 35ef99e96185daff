//! [`Hierarchy`]: which cgroup version this machine runs and where each controller is mounted,
//! and the resolution of a [`CgroupPath`] to the directories that make up that cgroup.
//!
//! Detection reads `/proc/self/mountinfo` (never hard-coded paths):
//!
//! * any v1 `cgroup` mount carrying a real controller ⇒ [`Hierarchy::V1`]. Hybrid machines (v1
//!   controllers plus an empty `cgroup2` at `/sys/fs/cgroup/unified`) count as V1: the unified
//!   mount has no resource controllers, and container runtimes manage limits through the v1 ones.
//! * otherwise the first `cgroup2` mount ⇒ [`Hierarchy::V2`].
//!
//! Named v1 hierarchies (`name=systemd`) are not controllers and are ignored. Co-mounted
//! controllers (`cpu,cpuacct`) map to the same mount point; [`Hierarchy::dirs`] de-duplicates.
//!
//! Current behaviour: the mount's own root (4th mountinfo field, non-`/` inside some containers)
//! is ignored — paths are always relative to the mount point, which is the root we can see.
//!
//! The verbs on a hierarchy live in their own files: `create.rs`, `apply.rs`, `remove.rs`,
//! `usage.rs`, `watch/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fs;
use crate::mountinfo::{self, CgroupMount};
use crate::path::CgroupPath;

const MOUNTINFO: &str = "/proc/self/mountinfo";
const PROC_CGROUPS: &str = "/proc/cgroups";

/// The cgroup layout of this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1 (including hybrid): one mount point per controller.
    V1 {
        /// Controller name (`cpu`, `memory`, …) → its mount point. Co-mounted controllers share a
        /// mount point.
        mounts: BTreeMap<String, PathBuf>,
    },
    /// cgroup v2: a single unified hierarchy.
    V2 {
        /// The cgroup2 mount point (usually `/sys/fs/cgroup`).
        root: PathBuf,
    },
}

/// The directories of every cgroup process `pid` is in (each v1 hierarchy, `name=` ones
/// included, and the unified one), on this process's mounts: what a process joining it
/// writes its pid to, as `runc exec` does.
pub fn process_cgroup_dirs(pid: i32) -> Result<Vec<PathBuf>> {
    let membership = fs::read(Path::new(&format!("/proc/{pid}/cgroup")))?;
    // The cgroup mounts a zygote remembered, if any (see `view::remember_mount_table`).
    let table = crate::view::cgroup_mount_table()?;
    Ok(mountinfo::membership_dirs(
        &membership,
        &mountinfo::cgroup_mounts(&table),
    ))
}

impl Hierarchy {
    /// Detects the hierarchy of this machine from `/proc/self/mountinfo`.
    pub fn detect() -> Result<Self> {
        let table = fs::read(Path::new(MOUNTINFO))?;
        let known = match std::fs::read_to_string(PROC_CGROUPS) {
            Ok(text) => mountinfo::known_controllers(&text),
            Err(err) => {
                tracing::debug!(
                    path = PROC_CGROUPS,
                    ?err,
                    "using the built-in controller list"
                );
                mountinfo::FALLBACK_CONTROLLERS
                    .iter()
                    .map(|c| (*c).to_owned())
                    .collect()
            }
        };
        let hierarchy = Self::from_mounts(&mountinfo::cgroup_mounts(&table), &known).ok_or(
            Error::NoCgroupMounts {
                mountinfo: PathBuf::from(MOUNTINFO),
            },
        )?;
        tracing::debug!(?hierarchy, "detected cgroup hierarchy");
        Ok(hierarchy)
    }

    /// The detection rule over parsed mounts (see the module docs). `None` if there is no cgroup
    /// file system at all.
    pub(crate) fn from_mounts(mounts: &[CgroupMount], known: &BTreeSet<String>) -> Option<Self> {
        let mut v1 = BTreeMap::new();
        for mount in mounts.iter().filter(|m| !m.unified) {
            for option in mount.super_options.iter().filter(|o| known.contains(*o)) {
                v1.entry(option.clone())
                    .or_insert_with(|| mount.mount_point.clone());
            }
        }
        if !v1.is_empty() {
            return Some(Self::V1 { mounts: v1 });
        }
        mounts.iter().find(|m| m.unified).map(|m| Self::V2 {
            root: m.mount_point.clone(),
        })
    }

    /// Whether this is the unified (v2) hierarchy.
    #[must_use]
    pub fn is_v2(&self) -> bool {
        matches!(self, Self::V2 { .. })
    }

    /// Every distinct directory that makes up cgroup `path`: one per v1 mount point (co-mounted
    /// controllers counted once), or the single v2 directory. The directories may not exist.
    #[must_use]
    pub fn dirs(&self, path: &CgroupPath) -> Vec<PathBuf> {
        match self {
            Self::V1 { mounts } => mounts
                .values()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .map(|mount| path.under(mount))
                .collect(),
            Self::V2 { root } => vec![path.under(root)],
        }
    }

    /// The directory of `path` that holds `controller`'s files: on v1 under that controller's
    /// mount (`None` if it is not mounted), on v2 the unified directory.
    #[must_use]
    pub fn controller_dir(&self, controller: &str, path: &CgroupPath) -> Option<PathBuf> {
        match self {
            Self::V1 { mounts } => mounts.get(controller).map(|mount| path.under(mount)),
            Self::V2 { root } => Some(path.under(root)),
        }
    }

    /// Like [`Hierarchy::controller_dir`] but a missing controller is an error.
    pub(crate) fn require_dir(
        &self,
        controller: &'static str,
        path: &CgroupPath,
    ) -> Result<PathBuf> {
        self.controller_dir(controller, path)
            .ok_or_else(|| Error::ControllerMissing {
                controller,
                path: path.clone(),
            })
    }

    /// Whether cgroup `path` exists (in any controller).
    #[must_use]
    pub fn exists(&self, path: &CgroupPath) -> bool {
        self.dirs(path).iter().any(|dir| dir.is_dir())
    }

    /// Moves process `pid` into cgroup `path` in every controller (writes `cgroup.procs`).
    pub fn add_process(&self, path: &CgroupPath, pid: u32) -> Result<()> {
        for dir in self.dirs(path) {
            fs::write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// The directory used to observe membership (emptiness) of `path`: v1 prefers `pids`, then
    /// `freezer`, `memory`, `cpu`, then any mount; v2 the unified directory.
    pub(crate) fn membership_dir(&self, path: &CgroupPath) -> Option<PathBuf> {
        match self {
            Self::V1 { mounts } => ["pids", "freezer", "memory", "cpu"]
                .iter()
                .find_map(|c| mounts.get(*c))
                .or_else(|| mounts.values().next())
                .map(|mount| path.under(mount)),
            Self::V2 { root } => Some(path.under(root)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> BTreeSet<String> {
        mountinfo::FALLBACK_CONTROLLERS
            .iter()
            .map(|c| (*c).to_owned())
            .collect()
    }

    fn detect(table: &str) -> Option<Hierarchy> {
        Hierarchy::from_mounts(&mountinfo::cgroup_mounts(table), &known())
    }

    #[test]
    fn hybrid_machines_are_v1_with_named_hierarchies_ignored() {
        let table = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
";
        let Some(Hierarchy::V1 { mounts }) = detect(table) else {
            panic!("hybrid must be V1");
        };
        assert_eq!(
            mounts.keys().collect::<Vec<_>>(),
            ["cpu", "cpuacct", "memory"]
        );
        assert_eq!(mounts["memory"], Path::new("/sys/fs/cgroup/memory"));
    }

    #[test]
    fn pure_v2_machines_are_v2_at_their_mount_point() {
        let table = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            detect(table),
            Some(Hierarchy::V2 {
                root: PathBuf::from("/sys/fs/cgroup")
            })
        );
    }

    #[test]
    fn a_lone_named_v1_hierarchy_does_not_make_a_v2_machine_v1() {
        let table = "\
30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
40 31 0:37 / /run/systemd-legacy rw - cgroup cgroup rw,name=systemd
";
        assert!(detect(table).is_some_and(|h| h.is_v2()));
    }

    #[test]
    fn no_cgroup_mounts_detects_nothing() {
        assert_eq!(detect("22 1 0:21 / /proc rw - proc proc rw\n"), None);
    }

    #[test]
    fn co_mounted_controllers_resolve_to_one_directory() {
        let table = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
";
        let hierarchy = detect(table).unwrap();
        let pod = CgroupPath::new("/kubepods/pod1").unwrap();
        assert_eq!(
            hierarchy.dirs(&pod),
            [
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1"),
                PathBuf::from("/sys/fs/cgroup/memory/kubepods/pod1"),
            ]
        );
        assert_eq!(
            hierarchy.controller_dir("cpuacct", &pod),
            hierarchy.controller_dir("cpu", &pod)
        );
        assert_eq!(hierarchy.controller_dir("pids", &pod), None);
    }
}

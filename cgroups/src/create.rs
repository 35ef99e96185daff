//! `Hierarchy::create`: make a cgroup (and its missing ancestors) usable.
//!
//! Guarantees once `create` returns `Ok`:
//!
//! * v1: the directory exists in **every** mounted controller, and in `cpuset` every level from
//!   the mount down has non-empty `cpuset.cpus`/`cpuset.mems` (copied from the parent: a fresh v1
//!   cpuset is empty and refuses processes).
//! * v2: each ancestor delegates [`V2_CONTROLLERS`] that it has to its children
//!   (`cgroup.subtree_control`), so the new cgroup has them; an [`CgroupKind::Interior`] cgroup
//!   also delegates them to its own children.
//!
//! Creating an existing cgroup is not an error (every step is idempotent).

use std::io;
use std::path::Path;

use crate::error::{Error, Result};
use crate::fs;
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;

/// The v2 controllers ironlet enables down the tree, where the parent has them.
pub const V2_CONTROLLERS: &[&str] = &["cpu", "cpuset", "io", "memory", "pids"];

/// Whether a cgroup will hold processes itself or only child cgroups (matters on v2, where a
/// cgroup that delegates controllers to children may not hold processes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupKind {
    /// Holds child cgroups (the node root, QoS and pod cgroups).
    Interior,
    /// Holds processes (container cgroups).
    Leaf,
}

impl Hierarchy {
    /// Creates cgroup `path` and its missing ancestors. See the module docs for guarantees.
    pub fn create(&self, path: &CgroupPath, kind: CgroupKind) -> Result<()> {
        match self {
            Self::V1 { mounts } => {
                let cpuset_mount = mounts.get("cpuset");
                for mount in self.dirs(&CgroupPath::root()) {
                    let is_cpuset = cpuset_mount == Some(&mount);
                    let mut dir = mount;
                    for component in path.components() {
                        dir.push(component);
                        make_dir(&dir)?;
                        if is_cpuset {
                            init_cpuset(&dir)?;
                        }
                    }
                }
            }
            Self::V2 { root } => {
                let mut dir = root.clone();
                for component in path.components() {
                    enable_v2_controllers(&dir)?;
                    dir.push(component);
                    make_dir(&dir)?;
                }
                if kind == CgroupKind::Interior {
                    enable_v2_controllers(&dir)?;
                }
            }
        }
        tracing::debug!(cgroup = %path, ?kind, "cgroup created");
        Ok(())
    }
}

fn make_dir(dir: &Path) -> Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(Error::CreateDir {
            path: dir.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Copies `cpuset.cpus` and `cpuset.mems` from the parent when `dir`'s are empty.
fn init_cpuset(dir: &Path) -> Result<()> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(file);
        if fs::read(&own)?.trim().is_empty() {
            let inherited = fs::read(&parent.join(file))?;
            fs::write(&own, inherited.trim())?;
        }
    }
    Ok(())
}

/// Enables in `dir/cgroup.subtree_control` each of [`V2_CONTROLLERS`] that `dir` has and has not
/// enabled yet. One write per controller, so the error names the one the kernel refused. A file
/// this process may not write (an ancestor of a rootless agent's delegated cgroup, where
/// systemd enabled what it delegates) is left as it is: the controllers it lacks are then
/// missing below, which [`Hierarchy::apply`] reports as [`Error::ControllerMissing`].
fn enable_v2_controllers(dir: &Path) -> Result<()> {
    let available = fs::read(&dir.join("cgroup.controllers"))?;
    let control = dir.join("cgroup.subtree_control");
    let enabled = fs::read(&control)?;
    for controller in V2_CONTROLLERS {
        let has = |list: &str| list.split_whitespace().any(|c| c == *controller);
        if has(&available) && !has(&enabled) {
            let value = format!("+{controller}");
            match fs::write_raw(&control, &value) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::PermissionDenied => {
                    tracing::debug!(file = %control.display(), controller, "not ours to enable");
                }
                Err(source) => {
                    return Err(Error::Write {
                        path: control,
                        value,
                        source,
                    })
                }
            }
        }
    }
    Ok(())
}

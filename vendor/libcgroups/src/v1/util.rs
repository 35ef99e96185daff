use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::OnceLock;

use nix::sys::statfs::{CGROUP_SUPER_MAGIC, statfs};

use pathrs::flags::OpenFlags;
use pathrs::procfs::{ProcfsBase, ProcfsHandle};
use procfs::ProcError;
use procfs::process::MountInfo;

use super::ControllerType;
use super::controller_type::CONTROLLERS;

#[derive(thiserror::Error, Debug)]
pub enum V1MountPointError {
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    #[error("failed to get mountinfo: {0}")]
    MountInfo(ProcError),
    #[error("could not find mountpoint for {subsystem}")]
    NotFound { subsystem: ControllerType },
    #[error(transparent)]
    Pathrs(#[from] pathrs::error::Error),
}

/// ironlet patch: the mount points found by [`remember_subsystem_mount_points`], which a
/// long-lived process (ironlet's zygote) calls once so that the processes it forks (one
/// per container create, exec and delete, each with libcontainer's intermediate process)
/// inherit them instead of reading `/proc/self/mountinfo`. The kernel formats every mount
/// of the namespace into that file: ~6 ms with 2000 mounts (a node with 500 pods), and the
/// readers serialise on the namespace's lock with every mount and unmount of the node.
static REMEMBERED: OnceLock<Vec<PathBuf>> = OnceLock::new();

/// ironlet patch: keeps `mount_points`, the cgroup v1 mount points of this process's mount
/// table in table order (what [`list_subsystem_mount_points`] would read), for this process
/// and its future children (see [`REMEMBERED`]). The caller reads the table (once, for its
/// own use too). A later call keeps the first list.
pub fn remember_subsystem_mount_points(mount_points: Vec<PathBuf>) {
    let _ = REMEMBERED.set(mount_points);
}

/// ironlet patch: the remembered mount points while every one of them is still a cgroup
/// v1 file system (one `statfs` each); otherwise `None` and the caller reads mountinfo,
/// e.g. in a rootless worker whose private mount namespace covers the cgroup mounts.
fn remembered_mount_points() -> Option<Vec<PathBuf>> {
    let mount_points = REMEMBERED.get()?;
    mount_points
        .iter()
        .all(|mount_point| {
            statfs(mount_point.as_path())
                .is_ok_and(|stat| stat.filesystem_type() == CGROUP_SUPER_MAGIC)
        })
        .then(|| mount_points.clone())
}

/// List all cgroup v1 subsystem mount points on the system. This can include unsupported
/// subsystems, comounted controllers and named hierarchies.
pub fn list_subsystem_mount_points() -> Result<Vec<PathBuf>, V1MountPointError> {
    match remembered_mount_points() {
        Some(mount_points) => Ok(mount_points),
        None => read_subsystem_mount_points(),
    }
}

/// The cgroup v1 mount points listed in `/proc/self/mountinfo`.
fn read_subsystem_mount_points() -> Result<Vec<PathBuf>, V1MountPointError> {
    let reader = BufReader::new(ProcfsHandle::new()?.open(
        ProcfsBase::ProcSelf,
        "mountinfo",
        OpenFlags::O_RDONLY | OpenFlags::O_CLOEXEC,
    )?);

    // ironlet patch: only cgroup (v1) lines are parsed; a node has hundreds of other mounts
    // (every pod's rootfs, volumes, namespaces) and parsing each one was most of the cost.
    reader
        .lines()
        .filter(|lr| {
            lr.as_ref().map_or(true, |line| {
                line.split_once(" - ")
                    .is_none_or(|(_, fs)| fs.starts_with("cgroup "))
            })
        })
        .map(|lr| {
            lr.map_err(V1MountPointError::Io)
                .and_then(|line| MountInfo::from_line(&line).map_err(V1MountPointError::MountInfo))
        })
        .try_fold(Vec::new(), |mut mount_points, r| {
            r.map(|m| {
                if m.fs_type == "cgroup" {
                    mount_points.push(m.mount_point);
                }
                mount_points
            })
        })
}

/// List the mount points of all currently supported cgroup subsystems.
pub fn list_supported_mount_points() -> Result<HashMap<ControllerType, PathBuf>, V1MountPointError>
{
    let mut mount_paths = HashMap::with_capacity(CONTROLLERS.len());
    let mount_points = list_subsystem_mount_points()?;

    for controller in CONTROLLERS {
        if let Some(mount_point) = find_subsystem_mount_point(&mount_points, controller) {
            mount_paths.insert(controller.to_owned(), mount_point);
        }
    }

    Ok(mount_paths)
}

pub fn get_subsystem_mount_point(subsystem: &ControllerType) -> Result<PathBuf, V1MountPointError> {
    find_subsystem_mount_point(&list_subsystem_mount_points()?, subsystem).ok_or(
        V1MountPointError::NotFound {
            subsystem: *subsystem,
        },
    )
}

/// ironlet patch: the matching half of `get_subsystem_mount_point`, over mount points
/// read once (`list_subsystem_mount_points`), so that a caller looking up every
/// controller reads `/proc/self/mountinfo` once instead of once per controller.
pub fn find_subsystem_mount_point(
    mount_points: &[PathBuf],
    subsystem: &ControllerType,
) -> Option<PathBuf> {
    let subsystem_name = subsystem.to_string();
    mount_points
        .iter()
        .find(|mount_point| {
            // Some systems mount net_prio and net_cls in the same directory
            // other systems mount them in their own directories. This
            // should handle both cases.
            match subsystem_name.as_str() {
                "net_cls" => ["net_cls,net_prio", "net_prio,net_cls", "net_cls"]
                    .iter()
                    .any(|s| mount_point.ends_with(s)),
                "net_prio" => ["net_cls,net_prio", "net_prio,net_cls", "net_prio"]
                    .iter()
                    .any(|s| mount_point.ends_with(s)),
                "cpu" => ["cpu,cpuacct", "cpu"]
                    .iter()
                    .any(|s| mount_point.ends_with(s)),
                "cpuacct" => ["cpu,cpuacct", "cpuacct"]
                    .iter()
                    .any(|s| mount_point.ends_with(s)),
                _ => mount_point.ends_with(&subsystem_name),
            }
        })
        .cloned()
}

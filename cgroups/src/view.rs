//! A container's `/sys/fs/cgroup` on cgroup v1: its own cgroup of every hierarchy, bound
//! read-only into a small tmpfs that the runtime hands to the container as one recursive bind.
//!
//! Why not let the OCI runtime do it from the spec's `cgroup` mount: libcontainer 0.7 binds
//! each v1 hierarchy **read-write** whatever the spec asks, so a container's root could raise
//! its own `memory.limit_in_bytes` and `pids.max`; and it spends ~70 syscalls of safe-procfs
//! checks on each of the ten or so binds, half of a container init's work. Here the binds are
//! a dozen plain mount(2) calls, and the container gets them read-only (recursively), as
//! kubelet+containerd give them.
//!
//! The layout mirrors the host's: one directory per hierarchy mounted directly under
//! `/sys/fs/cgroup` (named like the host's: `cpu,cpuacct`, `memory`, `systemd`, …) plus the
//! host's symlinks between them (`cpu -> cpu,cpuacct`). Hierarchies whose controllers the
//! runtime places containers in show the container's cgroup; others (named ones such as
//! `name=systemd`, and controllers no runtime manages such as `rdma`) show the cgroup of the
//! calling process, which is where the container's processes stay in them. cgroup2 (the
//! hybrid's `unified`) is left out, as runc and libcontainer leave it out.
//!
//! [`plan`] is pure and unit-tested; [`mount_view`] applies a plan and must run in a private
//! mount namespace (the zygote's worker), so that neither the tmpfs nor the binds reach the
//! host's mount table. It takes the cgroup mounts from [`cgroup_mount_table`]: those the
//! zygote remembered at its start ([`remember_mount_table`]), not `/proc/self/mountinfo`
//! read anew for each container, which costs ~3 µs per mount of the node.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::mount::{MntFlags, MsFlags};

use crate::error::{Error, Result};
use crate::mountinfo;
use crate::path::CgroupPath;

/// The v1 controllers whose hierarchy an OCI runtime moves a container into (libcontainer's
/// and runc's list). A hierarchy carrying any of them shows the container's own cgroup.
pub const RUNTIME_MANAGED_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "memory",
    "pids",
    "perf_event",
    "blkio",
    "net_prio",
    "net_cls",
    "freezer",
];

/// Where the cgroup v1 hierarchies are expected, and what a container sees.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// One hierarchy as it appears in the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewEntry {
    /// Directory name under the view (the host mount point's name: `cpu,cpuacct`).
    pub name: String,
    /// The host directory bound there.
    pub source: PathBuf,
    /// Whether `source` is the container's own cgroup (and may need creating first).
    pub container_cgroup: bool,
}

/// What [`mount_view`] builds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ViewPlan {
    /// The hierarchies, in mount-table order.
    pub entries: Vec<ViewEntry>,
    /// `(link name, target)` symlinks between entries, as on the host.
    pub symlinks: Vec<(String, String)>,
}

/// Computes the view of `container`'s cgroups from the mount table, the calling process's
/// `/proc/self/cgroup`, and the symlinks found directly under `cgroup_root`.
#[must_use]
pub fn plan(
    mountinfo_text: &str,
    self_cgroup: &str,
    host_symlinks: &[(String, String)],
    cgroup_root: &Path,
    container: &CgroupPath,
) -> ViewPlan {
    let managed: BTreeSet<&str> = RUNTIME_MANAGED_CONTROLLERS.iter().copied().collect();
    let mut entries = Vec::new();
    for mount in mountinfo::cgroup_mounts(mountinfo_text)
        .into_iter()
        .filter(|m| !m.unified && m.mount_point.parent() == Some(cgroup_root))
    {
        let Some(name) = mount.mount_point.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // Co-mounts can appear twice in a table (bind mounts); the first one wins.
        if entries.iter().any(|e: &ViewEntry| e.name == name) {
            continue;
        }
        let container_cgroup = mount
            .super_options
            .iter()
            .any(|o| managed.contains(o.as_str()));
        let source = if container_cgroup {
            container.under(&mount.mount_point)
        } else {
            match own_cgroup(self_cgroup, &mount.super_options) {
                Some(own) => match own.trim_start_matches('/') {
                    "" => mount.mount_point.clone(),
                    relative => mount.mount_point.join(relative),
                },
                None => continue,
            }
        };
        entries.push(ViewEntry {
            name: name.to_owned(),
            source,
            container_cgroup,
        });
    }
    let symlinks = host_symlinks
        .iter()
        .filter(|(link, target)| {
            entries.iter().any(|e| &e.name == target) && !entries.iter().any(|e| &e.name == link)
        })
        .cloned()
        .collect();
    ViewPlan { entries, symlinks }
}

/// The calling process's path in the hierarchy with these super options, from its
/// `/proc/self/cgroup` (`id:controllers:path`; named hierarchies as `name=…`).
fn own_cgroup<'a>(self_cgroup: &'a str, super_options: &[String]) -> Option<&'a str> {
    self_cgroup.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        if controllers.is_empty() {
            return None; // the cgroup2 line
        }
        controllers
            .split(',')
            .all(|c| super_options.iter().any(|o| o == c))
            .then_some(path)
    })
}

/// Builds the view of `container`'s cgroups at `target` (an existing empty directory): a
/// small tmpfs holding one bind per hierarchy. Creates the container's cgroup directories
/// that do not exist yet, so the binds have a source; the OCI runtime then finds them in
/// place. On error, whatever was mounted or created is undone.
///
/// The binds are plain (writable, without the host mounts' `nosuid,nodev,noexec`); the
/// caller sets those attributes for the container in one step by binding `target` with
/// recursive options (`rro,rnosuid,rnodev,rnoexec`, one `mount_setattr(2)`) instead of a
/// remount per hierarchy.
///
/// Must run in a private mount namespace whose mounts do not propagate to the host (e.g.
/// after `unshare(CLONE_NEWNS)` and making `/` recursively slave).
pub fn mount_view(target: &Path, container: &CgroupPath) -> Result<ViewPlan> {
    let table = cgroup_mount_table()?;
    let self_cgroup = crate::fs::read(Path::new("/proc/self/cgroup"))?;
    let root = Path::new(CGROUP_ROOT);
    let view = plan(&table, &self_cgroup, &host_symlinks(root), root, container);
    let mut created = Vec::new();
    let result = build(target, &view, &mut created);
    if result.is_err() {
        let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
        for dir in created.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
    result.map(|()| view)
}

/// The cgroup lines of `/proc/self/mountinfo` remembered by [`remember_mount_table`].
static REMEMBERED_TABLE: OnceLock<String> = OnceLock::new();

/// Reads the cgroup mounts of `/proc/self/mountinfo` now and keeps them for
/// [`cgroup_mount_table`] in this process and the processes it forks later.
///
/// For a long-lived process that forks one short-lived process per container (the zygote):
/// the kernel formats every mount of the namespace into mountinfo, ~6 ms for each read with
/// 2000 mounts (500 pods on a node, 4 mounts each), and readers wait on the namespace's
/// lock while other processes mount and unmount. A later call keeps the first table.
/// Returns the remembered lines.
pub fn remember_mount_table() -> Result<String> {
    let table = crate::fs::read(Path::new("/proc/self/mountinfo"))?;
    Ok(REMEMBERED_TABLE
        .get_or_init(|| cgroup_lines(&table))
        .clone())
}

/// The mount points of the cgroup v1 hierarchies in a mount table, in table order.
#[must_use]
pub fn v1_mount_points(table: &str) -> Vec<PathBuf> {
    mountinfo::cgroup_mounts(table)
        .into_iter()
        .filter(|m| !m.unified)
        .map(|m| m.mount_point)
        .collect()
}

/// The cgroup (v1 and v2) lines of the mount table: the remembered ones (see
/// [`remember_mount_table`]) while each of their mount points still is a file system of
/// that type (one `statfs` each), else those of `/proc/self/mountinfo` read now, as in a
/// private mount namespace whose cgroup mounts were covered.
pub fn cgroup_mount_table() -> Result<String> {
    table_or_read(REMEMBERED_TABLE.get().map(String::as_str))
}

fn table_or_read(remembered: Option<&str>) -> Result<String> {
    if let Some(table) = remembered {
        if mountinfo::cgroup_mounts(table).iter().all(still_mounted) {
            return Ok(table.to_owned());
        }
    }
    crate::fs::read(Path::new("/proc/self/mountinfo")).map(|table| cgroup_lines(&table))
}

fn cgroup_lines(table: &str) -> String {
    let mut lines = String::new();
    for line in table
        .lines()
        .filter(|line| !mountinfo::cgroup_mounts(line).is_empty())
    {
        lines.push_str(line);
        lines.push('\n');
    }
    lines
}

fn still_mounted(mount: &mountinfo::CgroupMount) -> bool {
    let wanted = if mount.unified {
        nix::sys::statfs::CGROUP2_SUPER_MAGIC
    } else {
        nix::sys::statfs::CGROUP_SUPER_MAGIC
    };
    nix::sys::statfs::statfs(&mount.mount_point).is_ok_and(|s| s.filesystem_type() == wanted)
}

fn build(target: &Path, view: &ViewPlan, created: &mut Vec<PathBuf>) -> Result<()> {
    for entry in view.entries.iter().filter(|e| e.container_cgroup) {
        create_missing_dirs(&entry.source, created)?;
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let tmpfs = Some(Path::new("tmpfs"));
    mount(
        tmpfs,
        target,
        Some("tmpfs"),
        flags,
        Some("mode=755,size=64k"),
    )?;
    for entry in &view.entries {
        let dir = target.join(&entry.name);
        std::fs::create_dir(&dir).map_err(|source| Error::CreateDir {
            path: dir.clone(),
            source,
        })?;
        mount(Some(&entry.source), &dir, None, MsFlags::MS_BIND, None)?;
    }
    for (link, link_target) in &view.symlinks {
        let path = target.join(link);
        std::os::unix::fs::symlink(link_target, &path)
            .map_err(|source| Error::CreateDir { path, source })?;
    }
    Ok(())
}

fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    nix::mount::mount(source, target, fstype, flags, data).map_err(|errno| Error::Mount {
        source_path: source.map(Path::to_path_buf),
        target: target.to_path_buf(),
        flags: format!("{flags:?}"),
        source: errno.into(),
    })
}

/// `mkdir` each missing directory from the hierarchy's mount point down to `dir`, recording
/// the ones this call made.
fn create_missing_dirs(dir: &Path, created: &mut Vec<PathBuf>) -> Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    for d in missing.into_iter().rev() {
        match std::fs::create_dir(d) {
            Ok(()) => created.push(d.to_path_buf()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(Error::CreateDir {
                    path: d.to_path_buf(),
                    source,
                })
            }
        }
    }
    Ok(())
}

/// Symlinks directly under `root` (`cpu -> cpu,cpuacct`) with relative single-name targets.
fn host_symlinks(root: &Path) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            let target = target.to_str()?;
            let name = e.file_name().into_string().ok()?;
            (!target.contains('/')).then(|| (name, target.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This project's hybrid machine (abridged) plus a co-mount, a named and an unmanaged
    /// hierarchy, a duplicate bind, and a hierarchy mounted elsewhere.
    const HYBRID: &str = "\
67 66 254:0 / / rw,relatime - ext4 /dev/vda rw
25 67 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,xattr,name=systemd
28 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
29 25 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
30 25 0:27 / /sys/fs/cgroup/rdma rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,rdma
31 67 0:26 / /mnt/memory-again rw,relatime - cgroup cgroup rw,memory
32 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
";
    const SELF_CGROUP: &str = "\
5:rdma:/
4:memory:/system.slice/ironlet.service
3:cpu,cpuacct:/system.slice/ironlet.service
2:name=systemd:/system.slice/ironlet.service
0::/system.slice/ironlet.service
";

    fn container() -> CgroupPath {
        CgroupPath::new("/kubepods/besteffort/podu/c1").expect("valid")
    }

    #[test]
    fn managed_hierarchies_show_the_container_and_the_others_the_callers_cgroup() {
        let view = plan(
            HYBRID,
            SELF_CGROUP,
            &[],
            Path::new(CGROUP_ROOT),
            &container(),
        );
        let got: Vec<(&str, &str, bool)> = view
            .entries
            .iter()
            .map(|e| {
                (
                    e.name.as_str(),
                    e.source.to_str().unwrap_or(""),
                    e.container_cgroup,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "systemd",
                    "/sys/fs/cgroup/systemd/system.slice/ironlet.service",
                    false
                ),
                (
                    "cpu,cpuacct",
                    "/sys/fs/cgroup/cpu,cpuacct/kubepods/besteffort/podu/c1",
                    true
                ),
                (
                    "memory",
                    "/sys/fs/cgroup/memory/kubepods/besteffort/podu/c1",
                    true
                ),
                ("rdma", "/sys/fs/cgroup/rdma", false),
            ],
            "cgroup2, the duplicate and the mount outside /sys/fs/cgroup are left out"
        );
    }

    #[test]
    fn symlinks_are_kept_only_when_they_point_at_an_entry() {
        let links = vec![
            ("cpu".to_owned(), "cpu,cpuacct".to_owned()),
            ("cpuacct".to_owned(), "cpu,cpuacct".to_owned()),
            ("net_cls".to_owned(), "net_cls,net_prio".to_owned()),
            ("memory".to_owned(), "memory".to_owned()),
        ];
        let view = plan(
            HYBRID,
            SELF_CGROUP,
            &links,
            Path::new(CGROUP_ROOT),
            &container(),
        );
        assert_eq!(
            view.symlinks,
            vec![
                ("cpu".to_owned(), "cpu,cpuacct".to_owned()),
                ("cpuacct".to_owned(), "cpu,cpuacct".to_owned()),
            ]
        );
    }

    #[test]
    fn a_hierarchy_the_caller_is_not_listed_in_is_left_out() {
        let view = plan(
            HYBRID,
            "4:memory:/\n3:cpu,cpuacct:/\n",
            &[],
            Path::new(CGROUP_ROOT),
            &container(),
        );
        let names: Vec<&str> = view.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, vec!["cpu,cpuacct", "memory"]);
    }

    #[test]
    fn a_pure_v2_table_gives_an_empty_view() {
        let v2 = "25 67 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let view = plan(v2, "0::/\n", &[], Path::new(CGROUP_ROOT), &container());
        assert_eq!(view, ViewPlan::default());
    }

    #[test]
    fn only_the_cgroup_lines_of_a_table_are_kept() {
        let lines = cgroup_lines(HYBRID);
        assert!(!lines.contains(" - ext4 ") && !lines.contains(" - tmpfs "));
        assert_eq!(
            mountinfo::cgroup_mounts(&lines),
            mountinfo::cgroup_mounts(HYBRID)
        );
    }

    #[test]
    fn the_v1_mount_points_of_a_table_are_its_cgroup_hierarchies_in_order() {
        let points = v1_mount_points(HYBRID);
        let expected: Vec<PathBuf> = mountinfo::cgroup_mounts(HYBRID)
            .into_iter()
            .filter(|m| !m.unified)
            .map(|m| m.mount_point)
            .collect();
        assert_eq!(points, expected);
        assert_eq!(
            points.first(),
            Some(&PathBuf::from("/sys/fs/cgroup/systemd"))
        );
        assert!(!points.contains(&PathBuf::from("/sys/fs/cgroup/unified")));
    }

    /// The host's own cgroup lines, if this machine has any cgroup file system mounted.
    fn host_cgroup_lines() -> Option<String> {
        let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let lines = cgroup_lines(&table);
        (!lines.is_empty()).then_some(lines)
    }

    #[test]
    fn a_remembered_table_is_used_while_its_mount_points_are_cgroup_file_systems() {
        let Some(host) = host_cgroup_lines() else {
            eprintln!("skipped: no cgroup file system mounted here");
            return;
        };
        // Every line twice: a table read anew could not come back like this.
        let doubled: String = host.lines().map(|l| format!("{l}\n{l}\n")).collect();
        assert_eq!(table_or_read(Some(&doubled)).expect("table"), doubled);
    }

    #[test]
    fn a_remembered_mount_point_that_is_no_cgroup_file_system_makes_it_read_the_table_again() {
        let Some(host) = host_cgroup_lines() else {
            eprintln!("skipped: no cgroup file system mounted here");
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        // A v1 hierarchy "mounted" on a plain directory, as a covered one would look.
        let stale = format!(
            "{host}40 25 0:40 / {} rw - cgroup cgroup rw,pids\n",
            dir.path().display()
        );
        let read = table_or_read(Some(&stale)).expect("table");
        let stale_point = format!(" {} ", dir.path().display());
        assert!(!read.contains(&stale_point), "{read}");
        assert!(!mountinfo::cgroup_mounts(&read).is_empty());
        // Nothing remembered: the table is read.
        assert!(!mountinfo::cgroup_mounts(&table_or_read(None).expect("table")).is_empty());
    }
}

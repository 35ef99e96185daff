//! Parsing of `/proc/self/mountinfo` (see proc(5)) down to the cgroup file systems, and of
//! `/proc/cgroups` for the names of the kernel's controllers.
//!
//! Pure functions over text, so the detection rules are unit-tested with the mount tables of
//! hybrid, pure v1 and pure v2 machines.

use std::collections::BTreeSet;
use std::path::PathBuf;

/// A mounted cgroup file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    /// `true` for `cgroup2`, `false` for a v1 `cgroup` hierarchy.
    pub(crate) unified: bool,
    /// The directory of the hierarchy this mount shows (`/` unless bind-mounted from below;
    /// octal escapes decoded).
    pub(crate) root: String,
    /// Where it is mounted (octal escapes decoded).
    pub(crate) mount_point: PathBuf,
    /// The per-mount options (`rw`, `nosuid`, `relatime`, …), which a remount must restate.
    pub(crate) mount_options: Vec<String>,
    /// The super-block options: for v1 the controllers (`cpu`, `cpuacct`) and `name=…`.
    pub(crate) super_options: Vec<String>,
}

/// The cgroup mounts in a mountinfo table, in table order. Malformed lines are skipped.
pub(crate) fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<CgroupMount> {
    // id parent major:minor root mount-point options [optional…] - fstype source super-options
    let (head, tail) = line.split_once(" - ")?;
    let mut head = head.split(' ').skip(3);
    let root = head.next()?;
    let mount_point = head.next()?;
    let mount_options = head
        .next()
        .unwrap_or("")
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut tail = tail.split(' ');
    let fstype = tail.next()?;
    let unified = match fstype {
        "cgroup2" => true,
        "cgroup" => false,
        _ => return None,
    };
    let _source = tail.next()?;
    let super_options = tail
        .next()
        .unwrap_or("")
        .split(',')
        .map(str::to_owned)
        .collect();
    Some(CgroupMount {
        unified,
        root: String::from_utf8_lossy(&unescape(root)).into_owned(),
        mount_point: unescape_path(mount_point),
        mount_options,
        super_options,
    })
}

/// The directories of the cgroups a `/proc/<pid>/cgroup` table names, each on the first
/// mount that shows its hierarchy. Hierarchies not mounted here, paths outside a mount's
/// root and paths with `..` are skipped (nothing could join them there).
pub(crate) fn membership_dirs(membership: &str, mounts: &[CgroupMount]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in membership.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(names), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let unified = id == "0" && names.is_empty();
        let wanted: Vec<&str> = names.split(',').filter(|n| !n.is_empty()).collect();
        let Some(mount) = mounts.iter().find(|m| {
            m.unified == unified
                && (unified
                    || wanted
                        .iter()
                        .all(|w| m.super_options.iter().any(|o| o == w)))
        }) else {
            continue;
        };
        let Some(relative) = path.strip_prefix(mount.root.trim_end_matches('/')) else {
            continue;
        };
        if !relative.is_empty() && !relative.starts_with('/') {
            continue;
        }
        let relative = relative.trim_start_matches('/');
        if relative.split('/').any(|c| c == "..") {
            continue;
        }
        dirs.push(mount.mount_point.join(relative));
    }
    dirs
}

/// Decodes the `\ooo` octal escapes the kernel uses in mountinfo for space, tab, newline
/// and backslash; the bytes of the path as the kernel has it (not necessarily UTF-8).
pub fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let digits = bytes.get(i + 1..i + 4).unwrap_or_default();
            if digits.len() == 3 && digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// [`unescape`] as a path.
pub fn unescape_path(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(unescape(field)))
}

/// Controller names from `/proc/cgroups` (first column, header skipped).
pub(crate) fn known_controllers(proc_cgroups: &str) -> BTreeSet<String> {
    proc_cgroups
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Used when `/proc/cgroups` cannot be read: every v1 controller Linux has shipped.
pub(crate) const FALLBACK_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backslash_without_three_octal_digits_is_kept() {
        assert_eq!(unescape_path("a\\b"), PathBuf::from("a\\b"));
        assert_eq!(unescape_path("a\\0"), PathBuf::from("a\\0"));
        assert_eq!(unescape_path("\\134x"), PathBuf::from("\\x"));
    }

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn hybrid_table_yields_v1_mounts_and_the_unified_mount() {
        let mounts = cgroup_mounts(HYBRID);
        assert_eq!(mounts.len(), 4);
        assert_eq!(
            mounts[0].mount_point,
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(mounts[0].super_options, ["rw", "cpu", "cpuacct"]);
        assert!(!mounts[0].unified);
        assert!(mounts[3].unified);
    }

    #[test]
    fn optional_fields_and_escaped_mount_points_are_handled() {
        let line = "50 1 0:40 / /mnt/my\\040cgroups rw shared:1 master:2 - cgroup2 none rw";
        let mounts = cgroup_mounts(line);
        assert_eq!(mounts[0].mount_point, PathBuf::from("/mnt/my cgroups"));
    }

    #[test]
    fn other_file_systems_and_garbage_lines_are_ignored() {
        let text = "1 2 3\n22 1 0:21 / /proc rw - proc proc rw\nno separator here\n";
        assert!(cgroup_mounts(text).is_empty());
    }

    #[test]
    fn proc_cgroups_header_is_skipped() {
        let text =
            "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\nmemory\t4\t18\t1\n";
        let known = known_controllers(text);
        assert_eq!(known.into_iter().collect::<Vec<_>>(), ["cpuset", "memory"]);
    }

    const JOIN_MOUNTINFO: &str = "\
25 1 0:23 / / rw,relatime - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,release_agent=/x,name=systemd
35 30 0:31 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
90 25 0:31 /kubepods /var/lib/other/pids rw,nosuid - cgroup cgroup rw,pids
91 25 0:32 / /mnt/with\\040space rw - cgroup cgroup rw,memory
";

    #[test]
    fn every_hierarchy_of_a_process_is_found_on_its_first_mount() {
        let mounts = cgroup_mounts(JOIN_MOUNTINFO);
        let membership = "\
12:pids:/kubepods/pod1/c1
7:cpu,cpuacct:/kubepods/pod1/c1
1:name=systemd:/system.slice
3:memory:/kubepods/pod1/c1
5:hugetlb:/kubepods
0::/kubepods/pod1/c1
";
        assert_eq!(
            membership_dirs(membership, &mounts),
            vec![
                PathBuf::from("/sys/fs/cgroup/pids/kubepods/pod1/c1"),
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1"),
                PathBuf::from("/sys/fs/cgroup/systemd/system.slice"),
                PathBuf::from("/mnt/with space/kubepods/pod1/c1"),
                PathBuf::from("/sys/fs/cgroup/unified/kubepods/pod1/c1"),
            ]
        );
    }

    #[test]
    fn a_membership_outside_the_mounts_root_or_climbing_out_is_skipped() {
        let mounts = cgroup_mounts("31 30 0:27 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        assert_eq!(
            membership_dirs("0::/kubepods/pod1\n", &mounts),
            vec![PathBuf::from("/sys/fs/cgroup/pod1")]
        );
        assert!(membership_dirs("0::/system.slice\n", &mounts).is_empty());
        assert!(membership_dirs("0::/kubepodsX/pod1\n", &mounts).is_empty());
        assert!(membership_dirs("0::/kubepods/../etc\n", &mounts).is_empty());
    }
}

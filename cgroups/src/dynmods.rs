//! `favordynmods`: asking the kernel to make task migration between cgroups cheap.
//!
//! Every write of a pid to `cgroup.procs` takes the global `cgroup_threadgroup_rwsem` for
//! writing. By default that percpu rwsem makes its writer wait for an RCU grace period, which
//! on this project's VMs is 10–19 ms — paid by every container start on cgroup v1, where a
//! runtime must migrate the new process into each hierarchy (v2 can use `CLONE_INTO_CGROUP`).
//! The cgroup2 mount option `favordynmods` (Linux ≥ 6.0) switches that rwsem to its slow-reader
//! mode for good: migrations no longer wait, at the cost of a shared counter on every fork and
//! exit. The kernel documents it for exactly this workload ("reduce the latencies of dynamic
//! cgroup modifications such as task migrations"); a container node migrates a task for every
//! container it starts. The switch is global although it is a cgroup2 option, so it helps v1
//! hierarchies too, on hybrid machines through their (empty) cgroup2 mount.
//!
//! The remount must restate every option the mount already has: cgroup2's reconfigure applies
//! the given option set as a whole (leaving out `nsdelegate` would clear it), and a remount
//! resets per-mount flags (`nosuid`, `nodev`, `noexec`) that are not passed. So the request is
//! computed from the mount table by [`remount_request`], a pure function, and the result is
//! checked against the table afterwards.
//!
//! The setting stays until reboot or until something remounts cgroup2 without it; ironlet does
//! not undo it at exit (containers it leaves running keep benefiting, and undoing would race
//! with other users of the option).

use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::error::{Error, Result};
use crate::fs;
use crate::mountinfo::{self, CgroupMount};

const MOUNTINFO: &str = "/proc/self/mountinfo";
const OPTION: &str = "favordynmods";

/// What [`favor_dynamic_modifications`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dynmods {
    /// The cgroup2 mount at this path already carried `favordynmods`.
    AlreadyOn(PathBuf),
    /// The cgroup2 mount at this path was remounted with `favordynmods`.
    Enabled(PathBuf),
    /// Nothing to remount: the kernel lacks the option or no cgroup2 is mounted.
    Unavailable(String),
}

/// The `mount(2)` arguments that add `favordynmods` to `mount` and keep everything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemountRequest {
    pub(crate) target: PathBuf,
    pub(crate) flags: MsFlags,
    pub(crate) data: String,
}

/// `None` if the mount already has the option.
pub(crate) fn remount_request(mount: &CgroupMount) -> Option<RemountRequest> {
    if mount.super_options.iter().any(|o| o == OPTION) {
        return None;
    }
    let flags = mount
        .mount_options
        .iter()
        .fold(MsFlags::MS_REMOUNT, |flags, option| {
            flags
                | match option.as_str() {
                    "ro" => MsFlags::MS_RDONLY,
                    "nosuid" => MsFlags::MS_NOSUID,
                    "nodev" => MsFlags::MS_NODEV,
                    "noexec" => MsFlags::MS_NOEXEC,
                    "noatime" => MsFlags::MS_NOATIME,
                    "nodiratime" => MsFlags::MS_NODIRATIME,
                    "relatime" => MsFlags::MS_RELATIME,
                    "strictatime" => MsFlags::MS_STRICTATIME,
                    _ => MsFlags::empty(),
                }
        });
    // `rw`/`ro` in the super-block options are flags, not cgroup2 options.
    let data = mount
        .super_options
        .iter()
        .map(String::as_str)
        .filter(|o| !o.is_empty() && *o != "rw" && *o != "ro")
        .chain(std::iter::once(OPTION))
        .collect::<Vec<_>>()
        .join(",");
    Some(RemountRequest {
        target: mount.mount_point.clone(),
        flags,
        data,
    })
}

fn first_cgroup2_mount() -> Result<Option<CgroupMount>> {
    let table = fs::read(Path::new(MOUNTINFO))?;
    Ok(mountinfo::cgroup_mounts(&table)
        .into_iter()
        .find(|m| m.unified))
}

/// Turns `favordynmods` on through this machine's first cgroup2 mount (needs
/// `CAP_SYS_ADMIN` in the initial user and cgroup namespaces). Idempotent.
///
/// # Errors
/// [`Error::Remount`] if the remount is refused for another reason than an unknown option, and
/// [`Error::RemountChangedOptions`] if the mount's other options did not survive it (the
/// previous options are restored before returning).
pub fn favor_dynamic_modifications() -> Result<Dynmods> {
    let Some(mount) = first_cgroup2_mount()? else {
        return Ok(Dynmods::Unavailable(
            "no cgroup2 file system is mounted".into(),
        ));
    };
    let Some(request) = remount_request(&mount) else {
        return Ok(Dynmods::AlreadyOn(mount.mount_point));
    };
    match nix::mount::mount(
        None::<&str>,
        &request.target,
        None::<&str>,
        request.flags,
        Some(request.data.as_str()),
    ) {
        Ok(()) => {}
        Err(nix::errno::Errno::EINVAL) => {
            return Ok(Dynmods::Unavailable(format!(
                "the kernel refused the {OPTION} option on {} (Linux < 6.0?)",
                request.target.display()
            )));
        }
        Err(errno) => {
            return Err(Error::Remount {
                path: request.target,
                options: request.data,
                source: errno.into(),
            })
        }
    }
    let after = first_cgroup2_mount()?.filter(|m| m.mount_point == mount.mount_point);
    let kept = after.as_ref().is_some_and(|after| {
        after.mount_options == mount.mount_options
            && after
                .super_options
                .iter()
                .filter(|o| o.as_str() != OPTION)
                .eq(mount.super_options.iter())
    });
    if !kept {
        restore(&mount);
        return Err(Error::RemountChangedOptions {
            path: mount.mount_point,
            before: format!(
                "{} / {}",
                mount.mount_options.join(","),
                mount.super_options.join(",")
            ),
            after: after.map_or_else(
                || "(gone)".to_owned(),
                |a| {
                    format!(
                        "{} / {}",
                        a.mount_options.join(","),
                        a.super_options.join(",")
                    )
                },
            ),
        });
    }
    Ok(Dynmods::Enabled(mount.mount_point))
}

/// Best effort: remount with exactly the options `mount` had.
fn restore(mount: &CgroupMount) {
    let Some(request) = remount_request(mount) else {
        return;
    };
    let data = request
        .data
        .trim_end_matches(OPTION)
        .trim_end_matches(',')
        .to_owned();
    if let Err(err) = nix::mount::mount(
        None::<&str>,
        &request.target,
        None::<&str>,
        request.flags,
        Some(data.as_str()),
    ) {
        tracing::error!(path = %request.target.display(), %err, "restoring cgroup2 mount options failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(line: &str) -> CgroupMount {
        mountinfo::cgroup_mounts(line)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no cgroup mount in {line:?}"))
    }

    #[test]
    fn systemd_v2_mount_keeps_its_flags_and_options() {
        let m = mount("30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot");
        let request = remount_request(&m).unwrap_or_else(|| panic!("needs a remount"));
        assert_eq!(request.target, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(
            request.flags,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_RELATIME
        );
        assert_eq!(request.data, "nsdelegate,memory_recursiveprot,favordynmods");
    }

    #[test]
    fn hybrid_unified_mount_without_options_gets_only_the_new_one() {
        let m = mount("41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw");
        let request = remount_request(&m).unwrap_or_else(|| panic!("needs a remount"));
        assert_eq!(request.flags, MsFlags::MS_REMOUNT | MsFlags::MS_RELATIME);
        assert_eq!(request.data, "favordynmods");
    }

    #[test]
    fn read_only_mount_stays_read_only() {
        let m = mount("41 31 0:38 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 ro");
        let request = remount_request(&m).unwrap_or_else(|| panic!("needs a remount"));
        assert!(request
            .flags
            .contains(MsFlags::MS_RDONLY | MsFlags::MS_NOSUID));
    }

    #[test]
    fn mount_that_has_the_option_needs_nothing() {
        let m = mount("41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,favordynmods");
        assert_eq!(remount_request(&m), None);
    }
}

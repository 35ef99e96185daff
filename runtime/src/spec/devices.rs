//! Device access: the device cgroup rules and, for privileged containers, the host's device
//! nodes.
//!
//! Unprivileged containers get containerd's rules: deny everything, then allow `rwm` on the
//! character devices every container needs — null, zero, full, random, urandom, tty, console,
//! ptmx, the pts range (major 136) and tun. Privileged containers may use every device, and get
//! every character, block and FIFO node of the host's `/dev` (outside `pts`, `shm`, `mqueue`,
//! `fd` and the container tool directories), with its owner and mode, as containerd's
//! `WithHostDevices` does.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use oci_spec::runtime::{
    LinuxDevice, LinuxDeviceBuilder, LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType,
};

use super::SpecError;

/// `(major, minor)` of the character devices containerd allows; `None` is any minor.
const DEFAULT_ALLOWED: [(i64, Option<i64>); 10] = [
    (1, Some(3)),    // /dev/null
    (1, Some(8)),    // /dev/random
    (1, Some(7)),    // /dev/full
    (5, Some(0)),    // /dev/tty
    (1, Some(5)),    // /dev/zero
    (1, Some(9)),    // /dev/urandom
    (5, Some(1)),    // /dev/console
    (136, None),     // /dev/pts/*
    (5, Some(2)),    // /dev/ptmx
    (10, Some(200)), // /dev/net/tun
];

/// Directories of `/dev` whose nodes are not host devices to pass through.
const SKIPPED_DIRS: [&str; 7] = ["pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev"];

/// The `linux.resources.devices` rules.
pub(crate) fn cgroup_rules(privileged: bool) -> Result<Vec<LinuxDeviceCgroup>, SpecError> {
    let all = |allow: bool| {
        LinuxDeviceCgroupBuilder::default()
            .allow(allow)
            .access("rwm")
            .build()
            .map_err(SpecError::assemble("device cgroup rules"))
    };
    if privileged {
        return Ok(vec![all(true)?]);
    }
    let mut rules = vec![all(false)?];
    for (major, minor) in DEFAULT_ALLOWED {
        let mut builder = LinuxDeviceCgroupBuilder::default()
            .allow(true)
            .typ(LinuxDeviceType::C)
            .major(major)
            .access("rwm");
        if let Some(minor) = minor {
            builder = builder.minor(minor);
        }
        rules.push(
            builder
                .build()
                .map_err(SpecError::assemble("device cgroup rules"))?,
        );
    }
    Ok(rules)
}

/// Every device node under `dir` (the host's `/dev`), for a privileged container.
pub(crate) fn host_devices(dir: &Path) -> Result<Vec<LinuxDevice>, SpecError> {
    let mut devices = Vec::new();
    collect(dir, &mut devices)?;
    devices.sort_by(|a, b| a.path().cmp(b.path()));
    Ok(devices)
}

fn collect(dir: &Path, out: &mut Vec<LinuxDevice>) -> Result<(), SpecError> {
    let fail = |source| SpecError::ReadHostDevices {
        path: dir.to_owned(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(fail)? {
        let entry = entry.map_err(fail)?;
        let path = entry.path();
        // A node may vanish while we walk (udev); skip it rather than fail the container.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let file_type = meta.file_type();
        if file_type.is_dir() {
            let name = entry.file_name();
            if !SKIPPED_DIRS.iter().any(|s| name == *s) {
                collect(&path, out)?;
            }
            continue;
        }
        if entry.file_name() == "console" {
            continue;
        }
        let typ = if file_type.is_char_device() {
            LinuxDeviceType::C
        } else if file_type.is_block_device() {
            LinuxDeviceType::B
        } else if file_type.is_fifo() {
            LinuxDeviceType::P
        } else {
            continue;
        };
        let rdev = meta.rdev();
        let device = LinuxDeviceBuilder::default()
            .path(&path)
            .typ(typ)
            .major(nix::sys::stat::major(rdev) as i64)
            .minor(nix::sys::stat::minor(rdev) as i64)
            .file_mode(meta.mode() & 0o7777)
            .uid(meta.uid())
            .gid(meta.gid())
            .build()
            .map_err(SpecError::assemble("linux.devices"))?;
        out.push(device);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unprivileged_rules_deny_everything_first() {
        let rules = cgroup_rules(false).expect("rules");
        assert!(!rules[0].allow());
        assert_eq!(rules[0].major(), None);
        assert_eq!(rules.len(), 1 + DEFAULT_ALLOWED.len());
        assert!(rules[1..]
            .iter()
            .all(|r| r.allow() && r.typ() == Some(LinuxDeviceType::C)));
    }

    #[test]
    fn host_devices_include_dev_null_as_a_character_device() {
        let devices = host_devices(Path::new("/dev")).expect("devices");
        let null = devices
            .iter()
            .find(|d| d.path() == Path::new("/dev/null"))
            .expect("/dev/null");
        assert_eq!((null.major(), null.minor()), (1, 3));
        assert!(!devices.iter().any(|d| d.path().starts_with("/dev/pts")));
    }
}

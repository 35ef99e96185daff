//! `favordynmods` on the real cgroup2 mount: turning it on adds the option and keeps every
//! other per-mount and super-block option; a second call finds it on. The mount is left as
//! the test found it. Skipped without root, without a cgroup2 mount, or on kernels without
//! the option.

mod common;

use std::path::PathBuf;

use common::root_or_skip;
use ironlet_cgroups::{favor_dynamic_modifications, Dynmods};
use nix::mount::MsFlags;

/// (mount point, per-mount options, super-block options) of the first cgroup2 mount.
fn cgroup2_mount() -> Option<(PathBuf, Vec<String>, Vec<String>)> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    table.lines().find_map(|line| {
        let (head, tail) = line.split_once(" - ")?;
        let mut tail = tail.split(' ');
        if tail.next()? != "cgroup2" {
            return None;
        }
        let super_options = tail.nth(1)?.split(',').map(str::to_owned).collect();
        let mut head = head.split(' ').skip(4);
        let point = PathBuf::from(head.next()?);
        let options = head.next()?.split(',').map(str::to_owned).collect();
        Some((point, options, super_options))
    })
}

/// Remounts with the same options minus `favordynmods` (as a remount with an explicit
/// option set does), keeping the per-mount flags.
fn remount_without_option(point: &PathBuf, options: &[String], super_options: &[String]) {
    let mut flags = MsFlags::MS_REMOUNT;
    for option in options {
        flags |= match option.as_str() {
            "ro" => MsFlags::MS_RDONLY,
            "nosuid" => MsFlags::MS_NOSUID,
            "nodev" => MsFlags::MS_NODEV,
            "noexec" => MsFlags::MS_NOEXEC,
            "relatime" => MsFlags::MS_RELATIME,
            "noatime" => MsFlags::MS_NOATIME,
            _ => MsFlags::empty(),
        };
    }
    let data = super_options
        .iter()
        .filter(|o| !matches!(o.as_str(), "rw" | "ro" | "favordynmods"))
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    if let Err(err) = nix::mount::mount(
        None::<&str>,
        point,
        None::<&str>,
        flags,
        Some(data.as_str()),
    ) {
        panic!("remounting {} with {data:?}: {err}", point.display());
    }
}

#[test]
fn favordynmods_is_added_without_touching_the_mounts_other_options() {
    let test = "favordynmods_is_added_without_touching_the_mounts_other_options";
    if !root_or_skip(test) {
        return;
    }
    let Some((point, options, super_options)) = cgroup2_mount() else {
        eprintln!("skipping {test}: no cgroup2 mount");
        return;
    };
    let was_on = super_options.iter().any(|o| o == "favordynmods");
    if was_on {
        remount_without_option(&point, &options, &super_options);
    }
    let Some((_, off_options, off_super)) = cgroup2_mount() else {
        panic!("cgroup2 mount vanished");
    };
    assert!(!off_super.iter().any(|o| o == "favordynmods"));

    let outcome = favor_dynamic_modifications();
    let after = cgroup2_mount();
    let again = favor_dynamic_modifications();
    // Leave the machine as found before asserting.
    if !was_on && matches!(outcome, Ok(Dynmods::Enabled(_))) {
        remount_without_option(&point, &options, &super_options);
    }
    match outcome {
        Ok(Dynmods::Enabled(at)) => assert_eq!(at, point),
        Ok(Dynmods::Unavailable(reason)) => {
            eprintln!("skipping {test}: {reason}");
            return;
        }
        other => panic!("expected the option to be enabled, got {other:?}"),
    }
    let Some((_, on_options, on_super)) = after else {
        panic!("cgroup2 mount vanished after the remount");
    };
    assert_eq!(on_options, off_options, "per-mount options changed");
    assert!(on_super.iter().any(|o| o == "favordynmods"), "{on_super:?}");
    let others: Vec<_> = on_super.iter().filter(|o| *o != "favordynmods").collect();
    assert_eq!(
        others,
        off_super.iter().collect::<Vec<_>>(),
        "super-block options changed"
    );
    match again {
        Ok(Dynmods::AlreadyOn(at)) => assert_eq!(at, point),
        other => panic!("second call: expected AlreadyOn, got {other:?}"),
    }
}

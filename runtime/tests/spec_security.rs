//! Generated specs, security part: capability add/drop/ALL, privileged mode, masked and
//! read-only paths, the read-only rootfs, and seccomp profile selection (RuntimeDefault,
//! Unconfined, Localhost). `spec_runc.rs` proves the same settings in real containers.

mod spec_support;

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Context, Result};
use ironlet_runtime::spec::{build_spec, SandboxNamespaces, SpecError};
use ironlet_runtime::types::SeccompProfile;
use oci_spec::runtime::{Capability, LinuxSeccompAction};
use spec_support::*;

// ---- capabilities ----

#[test]
fn default_capabilities_are_containerds_and_inheritable_and_ambient_are_empty() -> Result<()> {
    let spec = build(&container("c"), &image())?;
    let caps = spec
        .process()
        .as_ref()
        .and_then(|p| p.capabilities().clone())
        .context("caps")?;
    let expected: HashSet<Capability> = CONTAINERD_DEFAULT_CAPS.into_iter().collect();
    assert_eq!(caps.bounding().clone(), Some(expected.clone()));
    assert_eq!(caps.effective().clone(), Some(expected.clone()));
    assert_eq!(caps.permitted().clone(), Some(expected));
    assert_eq!(caps.inheritable().clone(), Some(HashSet::new()));
    assert_eq!(caps.ambient().clone(), Some(HashSet::new()));
    Ok(())
}

#[test]
fn added_capabilities_accept_the_cap_prefix_and_any_case_and_drops_remove() -> Result<()> {
    let mut c = container("c");
    c.security.add_capabilities = strings(&["NET_ADMIN", "cap_sys_time"]);
    c.security.drop_capabilities = strings(&["CAP_MKNOD", "net_raw"]);
    let caps = bounding(&build(&c, &image())?);
    assert!(caps.contains(&Capability::NetAdmin) && caps.contains(&Capability::SysTime));
    assert!(!caps.contains(&Capability::Mknod) && !caps.contains(&Capability::NetRaw));
    assert_eq!(caps.len(), 14);
    Ok(())
}

#[test]
fn drop_all_with_an_add_keeps_only_the_added_capability() -> Result<()> {
    let mut c = container("c");
    c.security.drop_capabilities = strings(&["ALL"]);
    c.security.add_capabilities = strings(&["NET_BIND_SERVICE"]);
    assert_eq!(
        bounding(&build(&c, &image())?),
        HashSet::from([Capability::NetBindService])
    );
    Ok(())
}

#[test]
fn add_all_with_a_drop_gives_everything_but_the_dropped_capability() -> Result<()> {
    let mut c = container("c");
    c.security.add_capabilities = strings(&["all"]);
    c.security.drop_capabilities = strings(&["CHOWN"]);
    let caps = bounding(&build(&c, &image())?);
    assert!(caps.contains(&Capability::SysAdmin));
    assert!(!caps.contains(&Capability::Chown));
    Ok(())
}

#[test]
fn a_drop_wins_over_an_add_of_the_same_capability() -> Result<()> {
    let mut c = container("c");
    c.security.add_capabilities = strings(&["SYS_ADMIN"]);
    c.security.drop_capabilities = strings(&["SYS_ADMIN"]);
    assert!(!bounding(&build(&c, &image())?).contains(&Capability::SysAdmin));
    Ok(())
}

#[test]
fn an_unknown_capability_is_an_error_naming_the_field() {
    let mut c = container("c");
    c.security.add_capabilities = strings(&["FLY"]);
    let err = build(&c, &image()).expect_err("unknown cap");
    assert!(
        matches!(err, SpecError::UnknownCapability { field: "security.add_capabilities", ref name } if name == "FLY"),
        "{err}"
    );
}

// ---- privileged ----

/// The test process's own bounding set: what a privileged container gets.
fn agent_bounding_set() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .context("CapBnd in /proc/self/status")?;
    Ok(u64::from_str_radix(hex.trim(), 16)?)
}

#[test]
fn privileged_gets_every_kernel_capability_no_seccomp_no_masks_rw_sys_and_all_devices() -> Result<()>
{
    let mut c = container("c");
    c.security.privileged = true;
    c.security.drop_capabilities = strings(&["SYS_ADMIN"]); // ignored when privileged
    let spec = build(&c, &image())?;
    let caps = bounding(&spec);
    assert_eq!(
        caps.len() as u32,
        (agent_bounding_set()? & ((1 << 41) - 1)).count_ones()
    );
    assert!(caps.contains(&Capability::SysAdmin));
    let linux = linux(&spec);
    assert!(linux.seccomp().is_none());
    assert_eq!(linux.masked_paths().clone(), Some(vec![]));
    assert_eq!(linux.readonly_paths().clone(), Some(vec![]));
    let sys = mount_at(&spec, "/sys").context("/sys")?;
    assert!(sys.options().iter().flatten().any(|o| o == "rw"));
    let cgroup = mount_at(&spec, "/sys/fs/cgroup").context("/sys/fs/cgroup")?;
    assert!(cgroup.options().iter().flatten().any(|o| o == "rw"));
    let rules = linux
        .resources()
        .as_ref()
        .and_then(|r| r.devices().clone())
        .unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert!(rules[0].allow() && rules[0].major().is_none());
    let devices = linux.devices().clone().unwrap_or_default();
    assert!(
        devices.iter().any(|d| d.path() == Path::new("/dev/null")),
        "host devices are passed through"
    );
    Ok(())
}

#[test]
fn privileged_ignores_a_localhost_seccomp_profile_like_containerd() -> Result<()> {
    let mut c = container("c");
    c.security.privileged = true;
    c.security.seccomp = SeccompProfile::Localhost("/nonexistent/profile.json".into());
    assert!(linux(&build(&c, &image())?).seccomp().is_none());
    Ok(())
}

// ---- masked paths, readonly rootfs ----

#[test]
fn masked_and_readonly_paths_are_containerds_lists() -> Result<()> {
    let spec = build(&container("c"), &image())?;
    let linux = linux(&spec);
    assert_eq!(
        linux.masked_paths().clone().unwrap_or_default(),
        strings(&[
            "/proc/acpi",
            "/proc/asound",
            "/proc/kcore",
            "/proc/keys",
            "/proc/latency_stats",
            "/proc/timer_list",
            "/proc/timer_stats",
            "/proc/sched_debug",
            "/sys/firmware",
            "/sys/devices/virtual/powercap",
            "/proc/scsi",
        ])
    );
    assert_eq!(
        linux.readonly_paths().clone().unwrap_or_default(),
        strings(&[
            "/proc/bus",
            "/proc/fs",
            "/proc/irq",
            "/proc/sys",
            "/proc/sysrq-trigger"
        ])
    );
    Ok(())
}

#[test]
fn read_only_rootfs_sets_root_readonly_and_the_rootfs_path() -> Result<()> {
    let rootfs = Rootfs::minimal()?;
    let ns = SandboxNamespaces::default();
    let img = image();
    let mut c = container("c");
    let spec = build_spec(&inputs(&c, &img, rootfs.path(), &ns))?;
    let root = spec.root().as_ref().context("root")?;
    assert_eq!(root.path(), rootfs.path());
    assert_eq!(root.readonly(), Some(false));
    c.security.read_only_rootfs = true;
    let spec = build_spec(&inputs(&c, &img, rootfs.path(), &ns))?;
    assert_eq!(spec.root().as_ref().and_then(|r| r.readonly()), Some(true));
    Ok(())
}

#[test]
fn a_missing_rootfs_is_an_error() {
    let ns = SandboxNamespaces::default();
    let (c, img) = (container("c"), image());
    let err = build_spec(&inputs(&c, &img, Path::new("/nonexistent/rootfs"), &ns))
        .expect_err("no rootfs");
    assert!(
        matches!(err, SpecError::RootfsNotADirectory { .. }),
        "{err}"
    );
}

// ---- seccomp selection ----

#[test]
fn runtime_default_seccomp_denies_with_eperm_and_allows_no_unconditional_unshare() -> Result<()> {
    let spec = build(&container("c"), &image())?;
    let seccomp = linux(&spec).seccomp().as_ref().context("seccomp")?;
    assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActErrno);
    assert_eq!(seccomp.default_errno_ret(), Some(1));
    let rules = seccomp.syscalls().clone().unwrap_or_default();
    assert!(rules.iter().any(|r| r.names().iter().any(|n| n == "read")));
    assert!(!rules
        .iter()
        .any(|r| r.names().iter().any(|n| n == "unshare" || n == "mount")));
    Ok(())
}

#[test]
fn adding_sys_admin_unlocks_mount_and_unshare_in_the_default_profile() -> Result<()> {
    let mut c = container("c");
    c.security.add_capabilities = strings(&["SYS_ADMIN"]);
    let spec = build(&c, &image())?;
    let rules = linux(&spec)
        .seccomp()
        .as_ref()
        .and_then(|s| s.syscalls().clone())
        .unwrap_or_default();
    assert!(rules.iter().any(|r| r.names().iter().any(|n| n == "mount")));
    assert!(rules
        .iter()
        .any(|r| r.names().iter().any(|n| n == "unshare")));
    Ok(())
}

#[test]
fn unconfined_has_no_seccomp() -> Result<()> {
    let mut c = container("c");
    c.security.seccomp = SeccompProfile::Unconfined;
    assert!(linux(&build(&c, &image())?).seccomp().is_none());
    Ok(())
}

#[test]
fn a_localhost_profile_is_loaded_from_its_oci_json() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("profile.json");
    std::fs::write(
        &path,
        r#"{"defaultAction":"SCMP_ACT_LOG","syscalls":[{"names":["mkdir"],"action":"SCMP_ACT_ERRNO","errnoRet":13}]}"#,
    )?;
    let mut c = container("c");
    c.security.seccomp = SeccompProfile::Localhost(path);
    let spec = build(&c, &image())?;
    let seccomp = linux(&spec).seccomp().as_ref().context("seccomp")?;
    assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActLog);
    assert_eq!(seccomp.syscalls().as_ref().map(Vec::len), Some(1));
    Ok(())
}

#[test]
fn a_malformed_localhost_profile_is_a_clear_error_naming_the_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("broken.json");
    std::fs::write(&path, r#"{"defaultAction": "SCMP_ACT_NOPE"}"#)?;
    let mut c = container("c");
    c.security.seccomp = SeccompProfile::Localhost(path.clone());
    let err = build(&c, &image()).expect_err("malformed");
    assert!(
        matches!(err, SpecError::ParseSeccompProfile { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("broken.json"), "{err}");

    c.security.seccomp = SeccompProfile::Localhost(dir.path().join("missing.json"));
    assert!(matches!(
        build(&c, &image()),
        Err(SpecError::ReadSeccompProfile { .. })
    ));
    c.security.seccomp = SeccompProfile::Localhost("relative.json".into());
    assert!(matches!(
        build(&c, &image()),
        Err(SpecError::InvalidSeccompProfilePath { .. })
    ));
    Ok(())
}

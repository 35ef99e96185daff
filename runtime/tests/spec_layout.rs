//! Generated specs, layout part: mounts (containerd's defaults, bind mounts, validation),
//! namespaces and hostname, resources and device rules, annotations, and the rootless
//! adjustments for user-namespaced containers.

mod spec_support;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ironlet_runtime::spec::{
    build_spec, IdMapping, NamespaceMode, SandboxNamespaces, SpecError, SpecInputs, UserNamespace,
};
use ironlet_runtime::types::{LinuxResources, Mount};
use oci_spec::runtime::{LinuxNamespaceType, Spec};
use spec_support::*;

// ---- mounts ----

fn bind(container_path: &str, host_path: &str, read_only: bool) -> Mount {
    Mount {
        container_path: container_path.into(),
        host_path: host_path.into(),
        read_only,
    }
}

#[test]
fn default_mounts_are_containerds_cri_mounts_in_order() -> Result<()> {
    let spec = build(&container("c"), &image())?;
    assert_eq!(
        mount_destinations(&spec),
        [
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/shm",
            "/dev/mqueue",
            "/sys",
            "/sys/fs/cgroup"
        ]
        .map(PathBuf::from)
        .to_vec()
    );
    let dev = mount_at(&spec, "/dev").context("/dev")?;
    assert_eq!(dev.typ().as_deref(), Some("tmpfs"));
    assert_eq!(
        dev.options().clone().unwrap_or_default(),
        strings(&["nosuid", "strictatime", "mode=755", "size=65536k"])
    );
    let pts = mount_at(&spec, "/dev/pts").context("/dev/pts")?;
    assert_eq!(
        pts.options().clone().unwrap_or_default(),
        strings(&[
            "nosuid",
            "noexec",
            "newinstance",
            "ptmxmode=0666",
            "mode=0620",
            "gid=5"
        ])
    );
    let sys = mount_at(&spec, "/sys").context("/sys")?;
    assert_eq!(sys.typ().as_deref(), Some("sysfs"));
    assert!(sys.options().iter().flatten().any(|o| o == "ro"));
    Ok(())
}

#[test]
fn bind_mounts_are_sorted_parents_first_and_read_only_when_asked() -> Result<()> {
    let mut c = container("c");
    c.mounts = vec![
        bind("/data/cache/x", "/var/lib/a", false),
        bind("/data", "/var/lib/b", true),
        bind("/etc/hosts", "/var/lib/hosts", false),
    ];
    let spec = build(&c, &image())?;
    let dsts = mount_destinations(&spec);
    let pos = |p: &str| dsts.iter().position(|d| d == Path::new(p)).expect(p);
    assert!(pos("/data") < pos("/data/cache/x"));
    let data = mount_at(&spec, "/data").context("/data")?;
    assert_eq!(data.typ().as_deref(), Some("bind"));
    assert_eq!(data.source().as_deref(), Some(Path::new("/var/lib/b")));
    assert_eq!(
        data.options().clone().unwrap_or_default(),
        strings(&["rbind", "rprivate", "ro"])
    );
    let cache = mount_at(&spec, "/data/cache/x").context("cache")?;
    assert_eq!(
        cache.options().clone().unwrap_or_default(),
        strings(&["rbind", "rprivate", "rw"])
    );
    Ok(())
}

#[test]
fn a_container_mount_replaces_the_default_mount_at_the_same_path() -> Result<()> {
    let mut c = container("c");
    c.mounts = vec![bind("/dev/shm", "/run/ironlet/pods/x/shm", false)];
    let spec = build(&c, &image())?;
    let shm: Vec<_> = spec
        .mounts()
        .iter()
        .flatten()
        .filter(|m| m.destination() == Path::new("/dev/shm"))
        .collect();
    assert_eq!(shm.len(), 1);
    assert_eq!(shm[0].typ().as_deref(), Some("bind"));
    Ok(())
}

#[test]
fn a_relative_or_dotdot_container_path_is_rejected_with_the_field_named() {
    for path in ["data", "/data/../etc", "../x", "/"] {
        let mut c = container("c");
        c.mounts = vec![bind(path, "/var/lib/x", false)];
        let err = build(&c, &image()).expect_err(path);
        assert!(
            matches!(
                err,
                SpecError::InvalidMount {
                    field: "container_path",
                    ..
                }
            ),
            "{path}: {err}"
        );
        assert!(err.to_string().contains("container_path"), "{err}");
    }
}

#[test]
fn a_relative_host_path_is_rejected() {
    let mut c = container("c");
    c.mounts = vec![bind("/data", "relative/dir", false)];
    let err = build(&c, &image()).expect_err("relative host path");
    assert!(
        matches!(
            err,
            SpecError::InvalidMount {
                field: "host_path",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn the_same_container_path_mounted_twice_is_rejected() {
    let mut c = container("c");
    c.mounts = vec![bind("/data", "/a", false), bind("/data/", "/b", false)];
    assert!(matches!(
        build(&c, &image()),
        Err(SpecError::InvalidMount {
            reason: "is mounted twice",
            ..
        })
    ));
}

// ---- namespaces and hostname ----

fn namespace_paths(spec: &Spec) -> Vec<(LinuxNamespaceType, Option<PathBuf>)> {
    linux(spec)
        .namespaces()
        .iter()
        .flatten()
        .map(|n| (n.typ(), n.path().clone()))
        .collect()
}

#[test]
fn sandbox_namespaces_are_joined_by_path_and_host_ones_left_out() -> Result<()> {
    let rootfs = Rootfs::minimal()?;
    let ns = SandboxNamespaces {
        pid: NamespaceMode::New,
        ipc: NamespaceMode::Join("/run/ironlet/ns/abc/ipc".into()),
        uts: NamespaceMode::Join("/run/ironlet/ns/abc/uts".into()),
        net: NamespaceMode::Host,
    };
    let (c, img) = (container("c"), image());
    let spec = build_spec(&inputs(&c, &img, rootfs.path(), &ns))?;
    let got = namespace_paths(&spec);
    assert!(got.contains(&(LinuxNamespaceType::Pid, None)));
    assert!(got.contains(&(LinuxNamespaceType::Mount, None)));
    assert!(got.contains(&(
        LinuxNamespaceType::Ipc,
        Some("/run/ironlet/ns/abc/ipc".into())
    )));
    assert!(got.contains(&(
        LinuxNamespaceType::Uts,
        Some("/run/ironlet/ns/abc/uts".into())
    )));
    assert!(!got.iter().any(|(t, _)| *t == LinuxNamespaceType::Network));
    assert!(!got.iter().any(|(t, _)| *t == LinuxNamespaceType::User));
    assert_eq!(spec.hostname().as_deref(), Some("pod-a"));
    Ok(())
}

#[test]
fn the_hostname_is_left_unset_when_uts_is_the_hosts() -> Result<()> {
    let rootfs = Rootfs::minimal()?;
    let ns = SandboxNamespaces {
        uts: NamespaceMode::Host,
        ..Default::default()
    };
    let (c, img) = (container("c"), image());
    let spec = build_spec(&inputs(&c, &img, rootfs.path(), &ns))?;
    assert_eq!(spec.hostname(), &None);
    assert!(!namespace_paths(&spec)
        .iter()
        .any(|(t, _)| *t == LinuxNamespaceType::Uts));
    Ok(())
}

#[test]
fn a_relative_namespace_path_is_rejected() -> Result<()> {
    let rootfs = Rootfs::minimal()?;
    let ns = SandboxNamespaces {
        net: NamespaceMode::Join("netns/abc".into()),
        ..Default::default()
    };
    let (c, img) = (container("c"), image());
    let err = build_spec(&inputs(&c, &img, rootfs.path(), &ns)).expect_err("relative ns path");
    assert!(
        matches!(err, SpecError::InvalidNamespacePath { kind: "net", .. }),
        "{err}"
    );
    Ok(())
}

// ---- resources and annotations ----

#[test]
fn resources_map_to_cpu_memory_pids_and_devices_deny_all_first() -> Result<()> {
    let mut c = container("c");
    c.resources = LinuxResources {
        cpu_shares: Some(512),
        cpu_quota: Some(50_000),
        cpu_period: Some(100_000),
        memory_limit_bytes: Some(64 << 20),
        pids_limit: Some(100),
        oom_score_adj: None,
    };
    let spec = build(&c, &image())?;
    let linux = linux(&spec);
    assert_eq!(
        linux.cgroups_path().as_deref(),
        Some(Path::new("/kubepods/burstable/podabc/0123456789abcdef"))
    );
    let r = linux.resources().as_ref().context("resources")?;
    let cpu = r.cpu().as_ref().context("cpu")?;
    assert_eq!(
        (cpu.shares(), cpu.quota(), cpu.period()),
        (Some(512), Some(50_000), Some(100_000))
    );
    let memory = r.memory().as_ref().context("memory")?;
    assert_eq!(memory.limit(), Some(64 << 20));
    assert!(
        memory.swap().is_none_or(|s| s == 64 << 20),
        "swap equals the limit: no swap"
    );
    assert_eq!(r.pids().as_ref().map(|p| p.limit()), Some(100));
    let devices = r.devices().clone().unwrap_or_default();
    assert!(!devices[0].allow() && devices[0].major().is_none());
    let allowed: Vec<(Option<i64>, Option<i64>)> = devices[1..]
        .iter()
        .map(|d| (d.major(), d.minor()))
        .collect();
    for dev in [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)] {
        assert!(
            allowed.contains(&(Some(dev.0), Some(dev.1))),
            "{dev:?} allowed"
        );
    }
    assert!(allowed.contains(&(Some(136), None)), "pts allowed");
    Ok(())
}

#[test]
fn a_negative_memory_limit_is_rejected() {
    let mut c = container("c");
    c.resources.memory_limit_bytes = Some(-5);
    assert!(matches!(
        build(&c, &image()),
        Err(SpecError::InvalidValue {
            field: "resources.memory_limit_bytes",
            ..
        })
    ));
}

#[test]
fn annotations_are_copied_into_the_spec() -> Result<()> {
    let mut c = container("c");
    c.annotations
        .insert("io.kubernetes.container.hash".into(), "abc".into());
    let spec = build(&c, &image())?;
    assert_eq!(
        spec.annotations()
            .as_ref()
            .and_then(|a| a.get("io.kubernetes.container.hash"))
            .map(String::as_str),
        Some("abc")
    );
    Ok(())
}

// ---- rootless ----

fn rootless(uid_size: u32) -> UserNamespace {
    UserNamespace {
        uid_mappings: vec![IdMapping {
            container_id: 0,
            host_id: 100_000,
            size: uid_size,
        }],
        gid_mappings: vec![IdMapping {
            container_id: 0,
            host_id: 100_000,
            size: uid_size,
        }],
        path: None,
        unprivileged: true,
        made_by_worker: false,
    }
}

fn rootless_spec(
    ns: &SandboxNamespaces,
    userns: UserNamespace,
    cgroups_path: Option<String>,
) -> Result<Spec> {
    let rootfs = Rootfs::minimal()?;
    let (c, img) = (container("c"), image());
    let inputs = SpecInputs {
        user_namespace: Some(userns),
        cgroups_path,
        ..inputs(&c, &img, rootfs.path(), ns)
    };
    Ok(build_spec(&inputs)?)
}

#[test]
fn rootless_with_a_new_net_namespace_mounts_sysfs_and_maps_ids() -> Result<()> {
    let spec = rootless_spec(&SandboxNamespaces::default(), rootless(65536), None)?;
    assert_eq!(
        mount_at(&spec, "/sys")
            .and_then(|m| m.typ().clone())
            .as_deref(),
        Some("sysfs")
    );
    let linux = linux(&spec);
    assert!(namespace_paths(&spec).contains(&(LinuxNamespaceType::User, None)));
    let uid_map = linux.uid_mappings().clone().unwrap_or_default();
    assert_eq!(
        (
            uid_map[0].container_id(),
            uid_map[0].host_id(),
            uid_map[0].size()
        ),
        (0, 100_000, 65536)
    );
    assert_eq!(
        user_of(&spec).2,
        Vec::<u32>::new(),
        "no additional gids in an unprivileged userns"
    );
    Ok(())
}

#[test]
fn rootless_without_a_new_net_namespace_bind_mounts_sys_read_only() -> Result<()> {
    let ns = SandboxNamespaces {
        net: NamespaceMode::Join("/run/ironlet/netns/abc".into()),
        ..Default::default()
    };
    let spec = rootless_spec(&ns, rootless(65536), Some("/user.slice/x".into()))?;
    let sys = mount_at(&spec, "/sys").context("/sys")?;
    assert_eq!(sys.typ().as_deref(), Some("bind"));
    assert_eq!(sys.source().as_deref(), Some(Path::new("/sys")));
    let options = sys.options().clone().unwrap_or_default();
    assert!(
        options.contains(&"rbind".to_owned()) && options.contains(&"ro".to_owned()),
        "{options:?}"
    );
    assert!(
        mount_at(&spec, "/sys/fs/cgroup").is_some(),
        "cgroup mount kept when there is a cgroup"
    );
    Ok(())
}

#[test]
fn rootless_without_a_cgroup_has_no_cgroup_mount_and_no_resources() -> Result<()> {
    let spec = rootless_spec(&SandboxNamespaces::default(), rootless(65536), None)?;
    assert!(mount_at(&spec, "/sys/fs/cgroup").is_none());
    assert!(linux(&spec).resources().is_none());
    assert!(linux(&spec).cgroups_path().is_none());
    Ok(())
}

#[test]
fn rootless_with_a_single_id_mapping_drops_the_devpts_gid_and_refuses_unmapped_users() -> Result<()>
{
    let spec = rootless_spec(&SandboxNamespaces::default(), rootless(1), None)?;
    let pts = mount_at(&spec, "/dev/pts").context("/dev/pts")?;
    assert!(!pts.options().iter().flatten().any(|o| o == "gid=5"));

    let rootfs = Rootfs::minimal()?;
    let ns = SandboxNamespaces::default();
    let img = image();
    let mut c = container("c");
    c.security.run_as_user = Some(1000);
    let inputs = SpecInputs {
        user_namespace: Some(rootless(1)),
        ..inputs(&c, &img, rootfs.path(), &ns)
    };
    let err = build_spec(&inputs).expect_err("uid 1000 unmapped");
    assert!(
        matches!(
            err,
            SpecError::UnmappedId {
                field: "uid",
                id: 1000,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("maps container ids 0;"), "{err}");
    Ok(())
}

/// The subordinate-range namespace (`subids.rs`): the zygote's worker makes it, so the spec
/// lists no user namespace but hands the mappings to the worker; supplementary groups stay
/// (setgroups is allowed); an id beyond the range is refused naming the range.
#[test]
fn a_worker_made_user_namespace_keeps_mappings_and_groups_and_names_the_range() -> Result<()> {
    let userns = UserNamespace {
        uid_mappings: ironlet_runtime::spec::subids::mappings(
            1001,
            &[ironlet_runtime::spec::subids::SubordinateRange {
                start: 100_000,
                count: 65536,
            }],
        ),
        gid_mappings: ironlet_runtime::spec::subids::mappings(
            1001,
            &[ironlet_runtime::spec::subids::SubordinateRange {
                start: 100_000,
                count: 65536,
            }],
        ),
        path: None,
        unprivileged: true,
        made_by_worker: true,
    };
    let rootfs = Rootfs::minimal()?;
    let ns = SandboxNamespaces::default();
    let img = image();
    let mut c = container("c");
    c.security.run_as_user = Some(1234);
    c.security.run_as_group = Some(1234);
    c.security.supplemental_groups = vec![2000];
    let spec = build_spec(&SpecInputs {
        user_namespace: Some(userns.clone()),
        ..inputs(&c, &img, rootfs.path(), &ns)
    })?;
    let linux = spec.linux().clone().context("linux")?;
    let kinds: Vec<_> = linux
        .namespaces()
        .clone()
        .unwrap_or_default()
        .iter()
        .map(|n| n.typ())
        .collect();
    assert!(!kinds.contains(&LinuxNamespaceType::User), "{kinds:?}");
    // libcontainer refuses mappings without a user namespace: they travel as annotations.
    assert_eq!(linux.uid_mappings().clone(), None);
    let annotations = spec.annotations().clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get(ironlet_runtime::spec::subids::UID_MAP_ANNOTATION)
            .map(String::as_str),
        Some("0:1001:1,1:100000:65536")
    );
    let user = spec.process().clone().context("process")?.user().clone();
    assert_eq!((user.uid(), user.gid()), (1234, 1234));
    assert!(user
        .additional_gids()
        .clone()
        .unwrap_or_default()
        .contains(&2000));

    c.security.run_as_user = Some(70000);
    let err = build_spec(&SpecInputs {
        user_namespace: Some(userns),
        ..inputs(&c, &img, rootfs.path(), &ns)
    })
    .expect_err("uid 70000 is beyond the range");
    assert!(
        err.to_string().contains("uid 70000") && err.to_string().contains("0,1-65536"),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_spec_serializes_to_json_runc_understands() -> Result<()> {
    let spec = build(&container("c"), &image())?;
    let json = serde_json::to_value(&spec)?;
    assert_eq!(
        json["process"]["capabilities"]["inheritable"],
        serde_json::json!([])
    );
    assert_eq!(
        json["linux"]["seccomp"]["defaultErrnoRet"],
        serde_json::json!(1)
    );
    assert_eq!(json["process"]["rlimits"][0]["type"], "RLIMIT_NOFILE");
    assert!(json["linux"]["resources"]["devices"][0]["access"] == "rwm");
    Ok(())
}

#[test]
fn generated_specs_pass_libcontainers_own_validation() -> Result<()> {
    use libcontainer::validator::Validator;

    let plain = build(&container("c"), &image())?;
    Validator::validate_spec(&plain).map_err(|e| anyhow::anyhow!("plain: {e:?}"))?;

    let mut c = container("c");
    c.security.privileged = true;
    let privileged = build(&c, &image())?;
    Validator::validate_spec(&privileged).map_err(|e| anyhow::anyhow!("privileged: {e:?}"))?;

    let ns = SandboxNamespaces {
        net: NamespaceMode::Join("/run/ironlet/netns/abc".into()),
        uts: NamespaceMode::Join("/run/ironlet/ns/abc/uts".into()),
        ..Default::default()
    };
    let userns = rootless_spec(&ns, rootless(65536), None)?;
    Validator::validate_spec(&userns).map_err(|e| anyhow::anyhow!("rootless: {e:?}"))?;
    Ok(())
}

#[test]
fn rootless_binds_proc_and_mqueue_only_for_host_namespaces_never_for_joined_ones() -> Result<()> {
    let host = SandboxNamespaces {
        pid: NamespaceMode::Host,
        ipc: NamespaceMode::Host,
        ..Default::default()
    };
    let spec = rootless_spec(&host, rootless(65536), None)?;
    assert_eq!(
        mount_at(&spec, "/proc")
            .and_then(|m| m.typ().clone())
            .as_deref(),
        Some("bind")
    );
    assert_eq!(
        mount_at(&spec, "/dev/mqueue")
            .and_then(|m| m.typ().clone())
            .as_deref(),
        Some("bind")
    );

    let joined = SandboxNamespaces {
        pid: NamespaceMode::Join("/proc/42/ns/pid".into()),
        ipc: NamespaceMode::Join("/run/ironlet/ns/abc/ipc".into()),
        ..Default::default()
    };
    let spec = rootless_spec(&joined, rootless(65536), None)?;
    assert_eq!(
        mount_at(&spec, "/proc")
            .and_then(|m| m.typ().clone())
            .as_deref(),
        Some("proc")
    );
    assert_eq!(
        mount_at(&spec, "/dev/mqueue")
            .and_then(|m| m.typ().clone())
            .as_deref(),
        Some("mqueue")
    );
    Ok(())
}

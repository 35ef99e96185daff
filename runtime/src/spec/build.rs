//! [`build_spec`]: assembles the whole spec from the parts the sibling modules compute.
//!
//! oci-spec's `Default` impls carry runc-example values (a `sh` process, `youki` hostname,
//! default mounts); every field that has one is set here explicitly so that nothing of them
//! leaks into a container.

use std::collections::HashMap;

use oci_spec::runtime::{
    Linux, PosixRlimitBuilder, PosixRlimitType, Process, RootBuilder, Spec, UserBuilder,
};

use crate::types::SeccompProfile;

use super::host::HostFacts;
use super::inputs::{NamespaceMode, SpecInputs};
use super::mounts::{MountContext, MASKED_PATHS, READONLY_PATHS};
use super::rootfs_file::Rootfs;
use super::subids;
use super::{caps, devices, mounts, namespaces, process, resources, seccomp, user, SpecError};

/// containerd's (and the kubelet's systemd unit's) open-files limit.
const NOFILE_LIMIT: u64 = 1_048_576;

/// Longest hostname the kernel accepts (`HOST_NAME_MAX`).
const HOST_NAME_MAX: usize = 64;

/// Generates the OCI runtime spec of one container.
///
/// Reads the rootfs's `/etc/passwd` and `/etc/group`, a `Localhost` seccomp profile and, for a
/// privileged container, the host's `/dev`; writes nothing.
pub fn build_spec(inputs: &SpecInputs<'_>) -> Result<Spec, SpecError> {
    build_for_host(inputs, HostFacts::current())
}

/// [`build_spec`] for a host described by `host`.
pub(crate) fn build_for_host(inputs: &SpecInputs<'_>, host: &HostFacts) -> Result<Spec, SpecError> {
    let container = inputs.container;
    let security = &container.security;
    let userns = inputs.user_namespace.as_ref();
    validate_hostname(inputs.hostname)?;
    validate_cgroups_path(inputs.cgroups_path.as_deref())?;

    let rootfs = Rootfs::open(inputs.rootfs, inputs.rootfs_layers)?;
    let mut user = user::resolve(&rootfs, security, inputs.image)?;
    if let Some(userns) = userns {
        check_mapped(userns, &user)?;
        if !userns.allows_setgroups() && !user.additional_gids.is_empty() {
            tracing::debug!(gids = ?user.additional_gids, "unprivileged user namespace: leaving out additional gids");
            user.additional_gids.clear();
        }
    }
    let bounding = caps::resolve(
        security,
        host.bounding_caps,
        !host.cgroup_v2 || userns.is_some(),
    )?;

    let mut process = Process::default();
    process.set_terminal(Some(false));
    process.set_args(Some(process::args(container, inputs.image)?));
    process.set_env(Some(process::env(
        container,
        inputs.image,
        inputs.hostname,
    )?));
    process.set_cwd(process::cwd(container, inputs.image)?.into());
    process.set_user(
        UserBuilder::default()
            .uid(user.uid)
            .gid(user.gid)
            .additional_gids(user.additional_gids.clone())
            .build()
            .map_err(SpecError::assemble("process.user"))?,
    );
    process.set_capabilities(Some(caps::linux_capabilities(&bounding)?));
    process.set_rlimits(Some(vec![PosixRlimitBuilder::default()
        .typ(PosixRlimitType::RlimitNofile)
        .soft(nofile_limit(inputs, host))
        .hard(nofile_limit(inputs, host))
        .build()
        .map_err(SpecError::assemble("process.rlimits"))?]));
    // Absent rather than `false` when escalation is allowed: libcontainer installs a seccomp
    // profile before it drops the capabilities only when the field is absent; with `false` it
    // waits until after, when the process has neither CAP_SYS_ADMIN nor `no_new_privs`, and
    // the kernel refuses the filter ("failed to load seccomp context").
    process.set_no_new_privileges(security.no_new_privs.then_some(true));
    process.set_oom_score_adj(resources::oom_score_adj(&container.resources)?);

    let seccomp = match (&security.seccomp, security.privileged) {
        (_, true) | (SeccompProfile::Unconfined, _) => None,
        (SeccompProfile::RuntimeDefault, false) => {
            Some(seccomp::runtime_default(&bounding, host.kernel)?)
        }
        (SeccompProfile::Localhost(path), false) => Some(seccomp::load_localhost(path)?),
    };

    let mut linux = Linux::default();
    linux.set_namespaces(Some(namespaces::namespaces(
        inputs.namespaces,
        userns,
        host.cgroup_v2 && !security.privileged,
    )?));
    match userns {
        Some(u) if u.made_by_worker => {
            linux.set_uid_mappings(None);
            linux.set_gid_mappings(None);
        }
        Some(u) => {
            linux.set_uid_mappings(Some(namespaces::id_mappings("uid", &u.uid_mappings)?));
            linux.set_gid_mappings(Some(namespaces::id_mappings("gid", &u.gid_mappings)?));
        }
        None => {
            linux.set_uid_mappings(None);
            linux.set_gid_mappings(None);
        }
    }
    match &inputs.cgroups_path {
        Some(path) => {
            linux.set_cgroups_path(Some(path.into()));
            linux.set_resources(Some(resources::resources(
                &container.resources,
                devices::cgroup_rules(security.privileged)?,
                host.swap_accounting,
            )?));
        }
        None => {
            tracing::debug!(container = %container.name, "no cgroup: resource limits are not enforced");
            linux.set_cgroups_path(None);
            linux.set_resources(None);
        }
    }
    linux.set_devices(if security.privileged {
        Some(devices::host_devices(std::path::Path::new("/dev"))?)
    } else {
        None
    });
    let (masked, readonly) = if security.privileged {
        (Vec::new(), Vec::new())
    } else {
        (
            MASKED_PATHS.iter().map(|p| (*p).to_owned()).collect(),
            READONLY_PATHS.iter().map(|p| (*p).to_owned()).collect(),
        )
    };
    linux.set_masked_paths(Some(masked));
    linux.set_readonly_paths(Some(readonly));
    linux.set_seccomp(seccomp);
    linux.set_sysctl((!container.sysctls.is_empty()).then(|| {
        container
            .sysctls
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<HashMap<_, _>>()
    }));
    linux.set_rootfs_propagation(None);

    let mounts = mounts::mounts(
        &container.mounts,
        &MountContext {
            privileged: security.privileged,
            namespaces: inputs.namespaces,
            user_namespace: userns,
            has_cgroup: inputs.cgroups_path.is_some(),
        },
    )?;

    let mut spec = Spec::default();
    spec.set_version(oci_spec::runtime::VERSION.to_owned());
    spec.set_root(Some(
        RootBuilder::default()
            .path(inputs.rootfs)
            .readonly(security.read_only_rootfs)
            .build()
            .map_err(SpecError::assemble("root"))?,
    ));
    spec.set_mounts(Some(mounts));
    spec.set_process(Some(process));
    let set_hostname = inputs.namespaces.uts != NamespaceMode::Host && !inputs.hostname.is_empty();
    spec.set_hostname(set_hostname.then(|| inputs.hostname.to_owned()));
    let mut annotations = container
        .annotations
        .iter()
        .filter(|(k, _)| !subids::is_map_annotation(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect::<HashMap<_, _>>();
    if let Some(u) = userns.filter(|u| u.made_by_worker) {
        // Checked as libcontainer would, then handed to the worker that maps them.
        namespaces::id_mappings("uid", &u.uid_mappings)?;
        namespaces::id_mappings("gid", &u.gid_mappings)?;
        annotations.extend(subids::map_annotations(u));
    }
    spec.set_annotations(Some(annotations));
    spec.set_linux(Some(linux));
    tracing::debug!(container = %container.name, uid = user.uid, privileged = security.privileged, "built OCI spec");
    Ok(spec)
}

/// The NOFILE limit: containerd's, capped at the agent's own hard limit when the runtime cannot
/// raise it (no `CAP_SYS_RESOURCE`, or an unprivileged user namespace); setrlimit would fail
/// with EPERM otherwise.
fn nofile_limit(inputs: &SpecInputs<'_>, host: &HostFacts) -> u64 {
    let unprivileged = inputs
        .user_namespace
        .as_ref()
        .is_some_and(|u| u.unprivileged);
    if host.cap_sys_resource && !unprivileged {
        NOFILE_LIMIT
    } else {
        NOFILE_LIMIT.min(host.nofile_hard)
    }
}

fn check_mapped(userns: &super::UserNamespace, user: &user::ResolvedUser) -> Result<(), SpecError> {
    let unmapped = |field, id, mappings: &[super::IdMapping]| SpecError::UnmappedId {
        field,
        id,
        mapped: super::subids::describe(mappings),
    };
    if !userns.maps_uid(user.uid) {
        return Err(unmapped("uid", user.uid, &userns.uid_mappings));
    }
    if !userns.maps_gid(user.gid) {
        return Err(unmapped("gid", user.gid, &userns.gid_mappings));
    }
    if let Some(gid) = userns
        .allows_setgroups()
        .then(|| user.additional_gids.iter().find(|g| !userns.maps_gid(**g)))
        .flatten()
    {
        return Err(unmapped("supplementary gid", *gid, &userns.gid_mappings));
    }
    Ok(())
}

fn validate_hostname(hostname: &str) -> Result<(), SpecError> {
    if hostname.len() > HOST_NAME_MAX {
        return Err(SpecError::invalid(
            "hostname",
            hostname,
            "is longer than 64 bytes",
        ));
    }
    if hostname.contains(['\0', '/']) {
        return Err(SpecError::invalid(
            "hostname",
            hostname,
            "contains '/' or a NUL byte",
        ));
    }
    Ok(())
}

fn validate_cgroups_path(path: Option<&str>) -> Result<(), SpecError> {
    let Some(path) = path else { return Ok(()) };
    if path.is_empty() || path.contains('\0') {
        return Err(SpecError::invalid(
            "cgroups_path",
            path,
            "is empty or contains a NUL byte",
        ));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(SpecError::invalid(
            "cgroups_path",
            path,
            "must not contain '..'",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SandboxNamespaces;
    use crate::types::{ContainerConfig, ImageConfig};
    use oci_spec::runtime::LinuxNamespaceType;

    struct Fixture {
        rootfs: tempfile::TempDir,
        container: ContainerConfig,
        image: ImageConfig,
        namespaces: SandboxNamespaces,
    }

    impl Fixture {
        fn new() -> Self {
            let rootfs = tempfile::tempdir().expect("tempdir");
            std::fs::create_dir_all(rootfs.path().join("etc")).expect("mkdir etc");
            std::fs::write(
                rootfs.path().join("etc/passwd"),
                "root:x:0:0::/root:/bin/sh\n",
            )
            .expect("passwd");
            Self {
                rootfs,
                container: ContainerConfig {
                    name: "c".into(),
                    command: vec!["/bin/true".into()],
                    ..Default::default()
                },
                image: ImageConfig::default(),
                namespaces: SandboxNamespaces::default(),
            }
        }

        fn build(&self, host: &HostFacts) -> Spec {
            let inputs = SpecInputs {
                container: &self.container,
                image: &self.image,
                rootfs: self.rootfs.path(),
                rootfs_layers: &[],
                hostname: "h",
                namespaces: &self.namespaces,
                cgroups_path: Some("/c".into()),
                user_namespace: None,
            };
            build_for_host(&inputs, host).expect("build")
        }
    }

    fn bounding_caps(spec: &Spec) -> Vec<oci_spec::runtime::Capability> {
        spec.process()
            .as_ref()
            .and_then(|p| p.capabilities().as_ref())
            .and_then(|c| c.bounding().clone())
            .map(|set| set.into_iter().collect())
            .unwrap_or_default()
    }

    fn has_cgroup_namespace(spec: &Spec) -> bool {
        spec.linux()
            .as_ref()
            .and_then(|l| l.namespaces().as_ref())
            .is_some_and(|ns| ns.iter().any(|n| n.typ() == LinuxNamespaceType::Cgroup))
    }

    #[test]
    fn sysctls_go_into_linux_sysctl_and_none_leaves_it_unset() {
        let mut f = Fixture::new();
        let sysctl = |spec: &Spec| spec.linux().as_ref().and_then(|l| l.sysctl().clone());
        assert_eq!(sysctl(&f.build(&HostFacts::for_tests())), None);
        f.container
            .sysctls
            .insert("kernel.shm_rmid_forced".into(), "1".into());
        assert_eq!(
            sysctl(&f.build(&HostFacts::for_tests())),
            Some(HashMap::from([(
                "kernel.shm_rmid_forced".to_owned(),
                "1".to_owned()
            )]))
        );
    }

    #[test]
    fn a_cgroup_v2_host_gives_unprivileged_containers_a_cgroup_namespace() {
        let mut f = Fixture::new();
        let v2 = HostFacts {
            cgroup_v2: true,
            ..HostFacts::for_tests()
        };
        assert!(has_cgroup_namespace(&f.build(&v2)));
        assert!(
            !has_cgroup_namespace(&f.build(&HostFacts::for_tests())),
            "not on v1"
        );
        f.container.security.privileged = true;
        assert!(!has_cgroup_namespace(&f.build(&v2)), "not when privileged");
    }

    #[test]
    fn a_cgroup_v2_host_leaves_mknod_out_of_the_default_capabilities() {
        let f = Fixture::new();
        let bounding = |host: &HostFacts| bounding_caps(&f.build(host));
        let mknod = oci_spec::runtime::Capability::Mknod;
        assert!(
            bounding(&HostFacts::for_tests()).contains(&mknod),
            "v1 keeps it"
        );
        let v2 = HostFacts {
            cgroup_v2: true,
            ..HostFacts::for_tests()
        };
        let caps = bounding(&v2);
        assert!(!caps.contains(&mknod), "v2 without device rules: {caps:?}");
        assert!(caps.contains(&oci_spec::runtime::Capability::Chown));
    }

    #[test]
    fn swap_equals_the_memory_limit_only_where_swap_is_accounted() {
        let mut f = Fixture::new();
        f.container.resources.memory_limit_bytes = Some(1 << 30);
        let swap = |host: &HostFacts| {
            f.build(host)
                .linux()
                .as_ref()
                .and_then(|l| l.resources().as_ref())
                .and_then(|r| r.memory().as_ref())
                .and_then(|m| m.swap())
        };
        assert_eq!(swap(&HostFacts::for_tests()), Some(1 << 30));
        let no_swap = HostFacts {
            swap_accounting: false,
            ..HostFacts::for_tests()
        };
        assert_eq!(swap(&no_swap), None);
    }

    #[test]
    fn nofile_is_containerds_unless_the_agent_cannot_raise_its_own_limit() {
        let f = Fixture::new();
        let nofile = |host: &HostFacts| {
            let spec = f.build(host);
            let rlimits = spec
                .process()
                .as_ref()
                .and_then(|p| p.rlimits().clone())
                .unwrap_or_default();
            (rlimits[0].soft(), rlimits[0].hard())
        };
        assert_eq!(
            nofile(&HostFacts::for_tests()),
            (NOFILE_LIMIT, NOFILE_LIMIT)
        );
        let restricted = HostFacts {
            cap_sys_resource: false,
            nofile_hard: 20_000,
            ..HostFacts::for_tests()
        };
        assert_eq!(nofile(&restricted), (20_000, 20_000));
    }

    #[test]
    fn privileged_gets_exactly_the_agents_bounding_set() {
        let mut f = Fixture::new();
        f.container.security.privileged = true;
        let host = HostFacts {
            bounding_caps: crate::spec::host::ALL_KNOWN_CAPS & !(1 << 24),
            ..HostFacts::for_tests()
        };
        let bounding = bounding_caps(&f.build(&host));
        assert_eq!(bounding.len(), 40);
        assert!(!bounding.contains(&oci_spec::runtime::Capability::SysResource));
    }
}

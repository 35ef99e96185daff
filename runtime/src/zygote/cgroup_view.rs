//! A read-only `/sys/fs/cgroup` for containers on cgroup v1, built by the zygote's worker
//! instead of by libcontainer.
//!
//! libcontainer 0.7 turns the spec's `cgroup` mount into one **read-write** bind per v1
//! hierarchy, whatever the spec's `ro` says, so a container's root could lift its own memory
//! and pids limits; and each bind costs ~70 syscalls of safe-procfs checks, half the work of a
//! container's init. So, as with the seccomp profile, the runtime rewrites the bundle for the
//! zygote ([`stage`]): the `cgroup` mount becomes a recursive bind of `<bundle>/cgroup-view`,
//! and `<bundle>/cgroup-view.json` tells the worker what to put there. The worker
//! ([`prepare_in_worker`]) enters a private mount namespace (its children, the container's
//! init among them, copy it; the host never sees these mounts) and builds the view with
//! [`ironlet_cgroups::view::mount_view`]: the container's own cgroup of each hierarchy,
//! bound into the container recursively read-only (`rro`) unless it is privileged.
//!
//! The bundle stays a valid OCI bundle only for ironlet; peers in the benchmark get the spec
//! from before this rewrite. cgroup v2 is untouched: there libcontainer mounts a namespaced
//! cgroup2 with the spec's options, read-only included.

use std::path::Path;

use oci_spec::runtime::{LinuxNamespaceType, MountBuilder, Spec};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;

/// The directory under the bundle the worker mounts the view on.
pub const VIEW_DIR: &str = "cgroup-view";
/// The worker's instructions, beside `config.json`.
pub const PLAN_FILE: &str = "cgroup-view.json";

const CGROUP_DESTINATION: &str = "/sys/fs/cgroup";

/// What the worker builds, as written to [`PLAN_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ViewRequest {
    /// The container's `linux.cgroupsPath`.
    pub cgroups_path: String,
}

/// Rewrites `spec` for the zygote on a cgroup v1 host: see the module docs. Specs this does
/// not apply to come back unchanged (cgroup v2, rootless, no `cgroup` mount, no cgroups path,
/// user or cgroup namespaces).
pub fn stage(spec: Spec, bundle: &Path) -> Result<Spec, RuntimeError> {
    let v1_host = !crate::spec::HostFacts::current().cgroup_v2;
    stage_for_host(spec, bundle, v1_host && nix::unistd::geteuid().is_root())
}

fn stage_for_host(mut spec: Spec, bundle: &Path, applies: bool) -> Result<Spec, RuntimeError> {
    let Some((request, read_only)) = applies.then(|| view_request(&spec)).flatten() else {
        return Ok(spec);
    };
    let view = bundle.join(VIEW_DIR);
    std::fs::create_dir_all(&view).map_err(|e| RuntimeError::io("create", &view, e))?;
    let plan = bundle.join(PLAN_FILE);
    let bytes = serde_json::to_vec(&request)
        .map_err(|e| RuntimeError::InvalidConfig(format!("cgroup view request: {e}")))?;
    crate::fsutil::write_state(&plan, &bytes).map_err(|e| RuntimeError::io("write", &plan, e))?;

    // Recursive attributes (mount_setattr, one call): the binds inside the view do not take
    // the host mounts' nosuid/nodev/noexec, and read-only must reach every one of them.
    let access = if read_only { "rro" } else { "rw" };
    let bind = MountBuilder::default()
        .destination(CGROUP_DESTINATION)
        .typ("bind")
        .source(&view)
        .options(
            ["rbind", access, "rnosuid", "rnodev", "rnoexec"]
                .map(str::to_owned)
                .to_vec(),
        )
        .build()
        .map_err(|e| RuntimeError::InvalidConfig(format!("cgroup view mount: {e}")))?;
    let mounts = spec
        .mounts()
        .iter()
        .flatten()
        .map(|m| {
            if is_cgroup_mount(m) {
                bind.clone()
            } else {
                m.clone()
            }
        })
        .collect();
    spec.set_mounts(Some(mounts));
    Ok(spec)
}

fn is_cgroup_mount(m: &oci_spec::runtime::Mount) -> bool {
    m.typ().as_deref() == Some("cgroup") && m.destination() == Path::new(CGROUP_DESTINATION)
}

/// The request for `spec` and whether its `cgroup` mount is read-only, if the view applies.
fn view_request(spec: &Spec) -> Option<(ViewRequest, bool)> {
    let linux = spec.linux().as_ref()?;
    let own_namespace = linux.namespaces().iter().flatten().any(|ns| {
        matches!(
            ns.typ(),
            LinuxNamespaceType::User | LinuxNamespaceType::Cgroup
        )
    });
    if own_namespace {
        return None;
    }
    let cgroups_path = linux.cgroups_path().as_ref()?.to_str()?.to_owned();
    ironlet_cgroups::CgroupPath::new(&cgroups_path).ok()?;
    let mount = spec
        .mounts()
        .iter()
        .flatten()
        .find(|m| is_cgroup_mount(m))?;
    let read_only = mount.options().iter().flatten().any(|o| o == "ro");
    Some((ViewRequest { cgroups_path }, read_only))
}

/// In a worker, before libcontainer's create: if the bundle asks for a cgroup view, moves
/// this process into a private mount namespace and builds the view there.
pub(crate) fn prepare_in_worker(bundle: &Path, private_already: bool) -> Result<(), String> {
    let plan = bundle.join(PLAN_FILE);
    let bytes = match std::fs::read(&plan) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("read {}: {e}", plan.display())),
    };
    let request: ViewRequest =
        serde_json::from_slice(&bytes).map_err(|e| format!("parse {}: {e}", plan.display()))?;
    let path = ironlet_cgroups::CgroupPath::new(&request.cgroups_path)
        .map_err(|e| format!("cgroup view: {e}"))?;
    // Already private and rslave when the worker pruned other pods' mounts (`pod_mounts.rs`).
    if !private_already {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("cgroup view: unshare mount namespace: {e}"))?;
        // The container's init makes its copy rslave too (libcontainer's default rootfs
        // propagation), so this changes nothing it sees; it keeps the view's mounts from
        // propagating back to the host.
        super::worker::set_root_propagation(nix::mount::MsFlags::MS_SLAVE, "cgroup view")?;
    }
    ironlet_cgroups::view::mount_view(&bundle.join(VIEW_DIR), &path)
        .map(|_| ())
        .map_err(|e| format!("cgroup view: {}", error_chain(&e)))
}

/// In the zygote, before it forks any worker: reads the cgroup mounts of the mount table
/// once (one read for both), for ironlet's view ([`ironlet_cgroups::view::remember_mount_table`]) and for
/// libcgroups' v1 manager (a patch of ours, `vendor/libcgroups`), which libcontainer builds
/// in every create's and exec's intermediate process. The workers and their children
/// inherit both, so a container start does not read `/proc/self/mountinfo` for them: that
/// read costs ~3 µs per mount of the namespace (~6 ms at 500 pods, 4 mounts each) and
/// waits on the namespace's lock. Either falls back to reading the table when a
/// remembered mount point is no longer a cgroup file system. Failures only cost that.
pub(crate) fn remember_cgroup_mounts() {
    match ironlet_cgroups::view::remember_mount_table() {
        Ok(table) => libcgroups::v1::util::remember_subsystem_mount_points(
            ironlet_cgroups::view::v1_mount_points(&table),
        ),
        Err(err) => tracing::debug!(%err, "cgroup mounts not remembered"),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxBuilder, LinuxNamespaceBuilder, Mount, SpecBuilder};

    fn spec(cgroup_options: &[&str], namespaces: &[LinuxNamespaceType]) -> Spec {
        let proc_mount = MountBuilder::default()
            .destination("/proc")
            .typ("proc")
            .source("proc")
            .build()
            .expect("mount");
        let cgroup = MountBuilder::default()
            .destination(CGROUP_DESTINATION)
            .typ("cgroup")
            .source("cgroup")
            .options(
                cgroup_options
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect::<Vec<_>>(),
            )
            .build()
            .expect("mount");
        let namespaces = namespaces
            .iter()
            .map(|t| {
                LinuxNamespaceBuilder::default()
                    .typ(*t)
                    .build()
                    .expect("ns")
            })
            .collect::<Vec<_>>();
        SpecBuilder::default()
            .mounts(vec![proc_mount, cgroup])
            .linux(
                LinuxBuilder::default()
                    .cgroups_path("/kubepods/besteffort/podu/c1")
                    .namespaces(namespaces)
                    .build()
                    .expect("linux"),
            )
            .build()
            .expect("spec")
    }

    fn cgroup_mount(spec: &Spec) -> Mount {
        spec.mounts()
            .iter()
            .flatten()
            .find(|m| m.destination() == Path::new(CGROUP_DESTINATION))
            .cloned()
            .expect("a /sys/fs/cgroup mount")
    }

    #[test]
    fn the_cgroup_mount_becomes_a_read_only_bind_of_the_view_and_the_plan_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let staged = stage_for_host(
            spec(&["nosuid", "ro"], &[LinuxNamespaceType::Mount]),
            dir.path(),
            true,
        )
        .expect("stage");
        let m = cgroup_mount(&staged);
        assert_eq!(m.typ().as_deref(), Some("bind"));
        assert_eq!(
            m.source().as_deref(),
            Some(dir.path().join(VIEW_DIR).as_path())
        );
        let options = m.options().clone().unwrap_or_default();
        assert!(options.iter().any(|o| o == "rbind") && options.iter().any(|o| o == "rro"));
        assert!(dir.path().join(VIEW_DIR).is_dir());
        let request: ViewRequest =
            serde_json::from_slice(&std::fs::read(dir.path().join(PLAN_FILE)).expect("plan"))
                .expect("json");
        assert_eq!(
            request,
            ViewRequest {
                cgroups_path: "/kubepods/besteffort/podu/c1".into(),
            }
        );
        assert_eq!(
            staged.mounts().as_ref().map(Vec::len),
            Some(2),
            "/proc kept"
        );
    }

    #[test]
    fn a_privileged_rw_cgroup_mount_stays_writable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let staged = stage_for_host(spec(&["rw"], &[]), dir.path(), true).expect("stage");
        let options = cgroup_mount(&staged).options().clone().unwrap_or_default();
        assert!(options.iter().any(|o| o == "rw"));
        assert!(!options.iter().any(|o| o == "ro" || o == "rro"));
    }

    #[test]
    fn v2_hosts_and_user_or_cgroup_namespaces_keep_the_spec_as_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (namespaces, applies) in [
            (vec![], false),
            (vec![LinuxNamespaceType::User], true),
            (vec![LinuxNamespaceType::Cgroup], true),
        ] {
            let original = spec(&["ro"], &namespaces);
            let staged = stage_for_host(original.clone(), dir.path(), applies).expect("stage");
            assert_eq!(staged, original);
        }
        assert!(!dir.path().join(PLAN_FILE).exists());
    }
}

//! The container's namespaces.
//!
//! pid, ipc, uts and net follow [`SandboxNamespaces`] (new, joined by path, or the host's, which
//! means left out of the spec); mount is always new; cgroup is new on a cgroup v2 host for an
//! unprivileged container (containerd keeps the host's on v1 and for privileged containers, for
//! compatibility); user is new — or joined — when the container runs in a user namespace, with
//! its uid/gid mappings (unless the zygote's worker makes it, see `subids.rs`: then the spec
//! carries only the mappings).

use std::path::Path;

use oci_spec::runtime::{
    LinuxIdMapping, LinuxIdMappingBuilder, LinuxNamespace, LinuxNamespaceBuilder,
    LinuxNamespaceType,
};

use super::inputs::{IdMapping, NamespaceMode, SandboxNamespaces, UserNamespace};
use super::SpecError;

/// The spec's `linux.namespaces`, in containerd's order.
pub(crate) fn namespaces(
    sandbox: &SandboxNamespaces,
    user_namespace: Option<&UserNamespace>,
    new_cgroup_namespace: bool,
) -> Result<Vec<LinuxNamespace>, SpecError> {
    let mut out = Vec::new();
    let mut push = |typ: LinuxNamespaceType, path: Option<&Path>| -> Result<(), SpecError> {
        let mut builder = LinuxNamespaceBuilder::default().typ(typ);
        if let Some(path) = path {
            builder = builder.path(path);
        }
        out.push(
            builder
                .build()
                .map_err(SpecError::assemble("linux.namespaces"))?,
        );
        Ok(())
    };
    for (kind, typ, mode) in [
        ("pid", LinuxNamespaceType::Pid, &sandbox.pid),
        ("ipc", LinuxNamespaceType::Ipc, &sandbox.ipc),
        ("uts", LinuxNamespaceType::Uts, &sandbox.uts),
    ] {
        mode_namespace(kind, typ, mode, &mut push)?;
    }
    push(LinuxNamespaceType::Mount, None)?;
    mode_namespace("net", LinuxNamespaceType::Network, &sandbox.net, &mut push)?;
    if new_cgroup_namespace {
        push(LinuxNamespaceType::Cgroup, None)?;
    }
    // A namespace the zygote's worker makes is the one libcontainer already runs in.
    if let Some(userns) = user_namespace.filter(|u| !u.made_by_worker) {
        if let Some(path) = &userns.path {
            if !path.is_absolute() {
                return Err(SpecError::InvalidNamespacePath {
                    kind: "user",
                    path: path.clone(),
                });
            }
        }
        push(LinuxNamespaceType::User, userns.path.as_deref())?;
    }
    Ok(out)
}

fn mode_namespace(
    kind: &'static str,
    typ: LinuxNamespaceType,
    mode: &NamespaceMode,
    push: &mut impl FnMut(LinuxNamespaceType, Option<&Path>) -> Result<(), SpecError>,
) -> Result<(), SpecError> {
    match mode {
        NamespaceMode::Host => Ok(()),
        NamespaceMode::New => push(typ, None),
        NamespaceMode::Join(path) if path.is_absolute() => push(typ, Some(path)),
        NamespaceMode::Join(path) => Err(SpecError::InvalidNamespacePath {
            kind,
            path: path.clone(),
        }),
    }
}

/// The OCI form of a validated mapping list.
pub(crate) fn id_mappings(
    field: &'static str,
    mappings: &[IdMapping],
) -> Result<Vec<LinuxIdMapping>, SpecError> {
    if mappings.is_empty() {
        return Err(SpecError::InvalidUserNamespace {
            reason: if field == "uid" {
                "no uid mappings"
            } else {
                "no gid mappings"
            },
        });
    }
    mappings
        .iter()
        .map(|m| {
            if m.size == 0 || u64::from(m.host_id) + u64::from(m.size) > u64::from(u32::MAX) + 1 {
                return Err(SpecError::InvalidUserNamespace {
                    reason: "a mapping is empty or runs past the last id",
                });
            }
            LinuxIdMappingBuilder::default()
                .container_id(m.container_id)
                .host_id(m.host_id)
                .size(m.size)
                .build()
                .map_err(SpecError::assemble("linux id mappings"))
        })
        .collect()
}

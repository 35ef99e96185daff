//! The container's mounts and its masked and read-only paths, as containerd's CRI plugin lays
//! them out.
//!
//! Order: the kernel file systems (`/proc`, `/dev`, `/dev/pts`, `/dev/shm`, `/dev/mqueue`,
//! `/sys`, `/sys/fs/cgroup`), less any a container mount replaces (a container mount at `/dev`
//! replaces everything under it), then the container's bind mounts sorted by depth so that a
//! parent is mounted before its children.
//!
//! In a user namespace (rootless), a kernel file system that must be owned by a namespace the
//! container does not create is bind-mounted from the host instead, as rootless runc and podman
//! do: `/sys` unless the network namespace is new (read-only: it shows the host's devices), and
//! `/proc` and `/dev/mqueue` when the PID or IPC namespace is the host's. A *joined* PID or IPC
//! namespace keeps the real mount: binding the host's would show the host's processes or
//! queues instead of the sandbox's. The cgroup file system is left out when the container has
//! no cgroup, and devpts drops `gid=5` when gid 5 is not mapped.
//!
//! Container paths must be absolute, must not contain `..` and must not be `/`; host paths must
//! be absolute. Two mounts at one container path are refused.

use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{Mount, MountBuilder};

use crate::types::Mount as ContainerMount;

use super::inputs::{NamespaceMode, SandboxNamespaces, UserNamespace};
use super::SpecError;

/// containerd's masked paths: unreadable in the container.
pub(crate) const MASKED_PATHS: [&str; 11] = [
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
];

/// containerd's read-only paths.
pub(crate) const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// What shapes the kernel file system mounts besides the container's own mounts.
pub(crate) struct MountContext<'a> {
    pub privileged: bool,
    pub namespaces: &'a SandboxNamespaces,
    pub user_namespace: Option<&'a UserNamespace>,
    pub has_cgroup: bool,
}

/// All mounts of the spec, in mount order.
pub(crate) fn mounts(
    container_mounts: &[ContainerMount],
    ctx: &MountContext<'_>,
) -> Result<Vec<Mount>, SpecError> {
    let binds = validated_binds(container_mounts)?;
    let replaced = |dst: &str| {
        binds.iter().any(|b| {
            b.destination == Path::new(dst)
                || (b.destination == Path::new("/dev") && dst.starts_with("/dev/"))
        })
    };
    let mut all = Vec::new();
    for (dst, typ, source, options) in kernel_mounts(ctx) {
        if replaced(dst) {
            tracing::debug!(destination = dst, "container mount replaces default mount");
            continue;
        }
        all.push(mount(dst, typ, source, options)?);
    }
    for bind in binds {
        let mode = if bind.read_only { "ro" } else { "rw" };
        all.push(
            MountBuilder::default()
                .destination(bind.destination)
                .typ("bind")
                .source(bind.source)
                .options(vec![
                    "rbind".to_owned(),
                    "rprivate".to_owned(),
                    mode.to_owned(),
                ])
                .build()
                .map_err(SpecError::assemble("mounts"))?,
        );
    }
    Ok(all)
}

/// `(destination, type, source, options)` of the kernel file systems.
fn kernel_mounts(
    ctx: &MountContext<'_>,
) -> Vec<(&'static str, &'static str, &'static str, Vec<String>)> {
    let userns = ctx.user_namespace;
    let mountable = |mode: &NamespaceMode| userns.is_none() || *mode != NamespaceMode::Host;
    let rw = if ctx.privileged { "rw" } else { "ro" };
    let opts = |o: &[&str]| o.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();

    let mut out = Vec::new();
    if mountable(&ctx.namespaces.pid) {
        out.push((
            "/proc",
            "proc",
            "proc",
            opts(&["nosuid", "noexec", "nodev"]),
        ));
    } else {
        out.push((
            "/proc",
            "bind",
            "/proc",
            opts(&["rbind", "nosuid", "noexec", "nodev"]),
        ));
    }
    out.push((
        "/dev",
        "tmpfs",
        "tmpfs",
        opts(&["nosuid", "strictatime", "mode=755", "size=65536k"]),
    ));
    let mut devpts = opts(&[
        "nosuid",
        "noexec",
        "newinstance",
        "ptmxmode=0666",
        "mode=0620",
    ]);
    if userns.is_none_or(|u| u.maps_gid(5)) {
        devpts.push("gid=5".to_owned());
    }
    out.push(("/dev/pts", "devpts", "devpts", devpts));
    out.push((
        "/dev/shm",
        "tmpfs",
        "shm",
        opts(&["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
    ));
    if mountable(&ctx.namespaces.ipc) {
        out.push((
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            opts(&["nosuid", "noexec", "nodev"]),
        ));
    } else {
        out.push((
            "/dev/mqueue",
            "bind",
            "/dev/mqueue",
            opts(&["rbind", "nosuid", "noexec", "nodev"]),
        ));
    }
    if userns.is_none() || ctx.namespaces.net == NamespaceMode::New {
        out.push((
            "/sys",
            "sysfs",
            "sysfs",
            opts(&["nosuid", "noexec", "nodev", rw]),
        ));
    } else {
        out.push((
            "/sys",
            "bind",
            "/sys",
            opts(&["rbind", "nosuid", "noexec", "nodev", rw]),
        ));
    }
    if ctx.has_cgroup || userns.is_none() {
        out.push((
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            opts(&["nosuid", "noexec", "nodev", "relatime", rw]),
        ));
    }
    out
}

fn mount(dst: &str, typ: &str, source: &str, options: Vec<String>) -> Result<Mount, SpecError> {
    MountBuilder::default()
        .destination(dst)
        .typ(typ)
        .source(source)
        .options(options)
        .build()
        .map_err(SpecError::assemble("mounts"))
}

/// A container mount after validation.
struct Bind {
    destination: PathBuf,
    source: PathBuf,
    read_only: bool,
}

/// Validates the container's mounts and sorts them parents first (stable by depth).
fn validated_binds(container_mounts: &[ContainerMount]) -> Result<Vec<Bind>, SpecError> {
    let mut binds: Vec<Bind> = Vec::with_capacity(container_mounts.len());
    for m in container_mounts {
        let destination = clean_absolute("container_path", &m.container_path)?;
        if destination == Path::new("/") {
            return Err(SpecError::InvalidMount {
                field: "container_path",
                path: m.container_path.clone(),
                reason: "must not be the root directory",
            });
        }
        let source = clean_absolute("host_path", &m.host_path.to_string_lossy())?;
        if binds.iter().any(|b| b.destination == destination) {
            return Err(SpecError::InvalidMount {
                field: "container_path",
                path: m.container_path.clone(),
                reason: "is mounted twice",
            });
        }
        binds.push(Bind {
            destination,
            source,
            read_only: m.read_only,
        });
    }
    binds.sort_by_key(|b| b.destination.components().count());
    Ok(binds)
}

/// An absolute path without `..`, with `.` and repeated slashes removed.
fn clean_absolute(field: &'static str, raw: &str) -> Result<PathBuf, SpecError> {
    let invalid = |reason| SpecError::InvalidMount {
        field,
        path: raw.to_owned(),
        reason,
    };
    if raw.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    if !raw.starts_with('/') {
        return Err(invalid("must be an absolute path"));
    }
    let mut clean = PathBuf::from("/");
    for component in Path::new(raw).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => clean.push(part),
            Component::ParentDir => return Err(invalid("must not contain '..'")),
            Component::Prefix(_) => return Err(invalid("must be an absolute path")),
        }
    }
    Ok(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths_drop_dots_and_repeated_slashes() {
        assert_eq!(
            clean_absolute("f", "//data/./x/").expect("clean"),
            PathBuf::from("/data/x")
        );
    }

    #[test]
    fn a_path_with_dotdot_is_refused_even_when_it_stays_inside() {
        assert!(clean_absolute("f", "/data/../etc").is_err());
    }
}

//! What [`build_spec`](super::build_spec) needs besides the container's own config: where the
//! rootfs is, which sandbox namespaces to join, the cgroup, and the user namespace of rootless
//! mode.

use std::path::{Path, PathBuf};

use crate::types::{ContainerConfig, ImageConfig};

/// Everything one container's spec is generated from.
#[derive(Debug, Clone)]
pub struct SpecInputs<'a> {
    pub container: &'a ContainerConfig,
    pub image: &'a ImageConfig,
    /// The prepared root filesystem directory; its `/etc/passwd` and `/etc/group` resolve users.
    pub rootfs: &'a Path,
    /// Not empty when `rootfs` is only mounted inside the container (a rootless overlay,
    /// [`PreparedRootfs::layers`](crate::image::PreparedRootfs::layers)): the snapshot trees,
    /// top first, whose merged view the user files are read from.
    pub rootfs_layers: &'a [PathBuf],
    /// Set as the UTS hostname (unless the UTS namespace is the host's) and as `$HOSTNAME`.
    pub hostname: &'a str,
    pub namespaces: &'a SandboxNamespaces,
    /// The container's cgroup relative to the hierarchy root, e.g.
    /// `/kubepods/burstable/pod<uid>/<container-id>`. `None` means no cgroup at all (rootless on
    /// cgroup v1): the spec then carries no `linux.resources`, so limits are unenforced.
    pub cgroups_path: Option<String>,
    /// Rootless mode: run in a user namespace with these mappings.
    pub user_namespace: Option<UserNamespace>,
}

/// How a container gets one kind of namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NamespaceMode {
    /// A fresh namespace for this container.
    #[default]
    New,
    /// The host's namespace (`hostNetwork`, `hostIPC`, `hostPID`).
    Host,
    /// Join an existing namespace through a namespace file, e.g. the sandbox's bind-mounted
    /// `/run/ironlet/netns/<id>` or `/proc/<pid>/ns/net`.
    Join(PathBuf),
}

/// The namespaces a container shares with its pod sandbox (or the host).
///
/// The mount namespace is always new; the cgroup namespace is new on cgroup v2 hosts for
/// unprivileged containers, as containerd does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxNamespaces {
    pub pid: NamespaceMode,
    pub ipc: NamespaceMode,
    pub uts: NamespaceMode,
    pub net: NamespaceMode,
}

/// One contiguous range of a uid or gid mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

impl IdMapping {
    /// Whether container id `id` falls in this range.
    pub fn maps(&self, id: u32) -> bool {
        id >= self.container_id
            && u64::from(id) < u64::from(self.container_id) + u64::from(self.size)
    }
}

/// The user namespace of a rootless container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserNamespace {
    /// e.g. `[{0, <host uid>, 1}]`, or `[{0, <subuid start>, 65536}]`.
    pub uid_mappings: Vec<IdMapping>,
    pub gid_mappings: Vec<IdMapping>,
    /// Join this user namespace (e.g. the sandbox's) instead of creating one.
    pub path: Option<PathBuf>,
    /// The agent itself has no root on the host. Supplementary groups can then not be set
    /// (setgroups is denied in an unprivileged user namespace, CVE-2014-8989), so the spec
    /// carries none.
    pub unprivileged: bool,
    /// The zygote's worker creates this namespace (with `newuidmap`/`newgidmap`, see
    /// `subids.rs`) and runs libcontainer inside it as its root: the spec then lists no user
    /// namespace, its mappings are the worker's, and supplementary groups can be set.
    pub made_by_worker: bool,
}

impl UserNamespace {
    /// The simplest rootless namespace: container root is the agent's own uid and gid, and
    /// nothing else is mapped.
    pub fn current_user() -> Self {
        let uid = nix::unistd::geteuid();
        let gid = nix::unistd::getegid();
        let single = |host_id: u32| {
            vec![IdMapping {
                container_id: 0,
                host_id,
                size: 1,
            }]
        };
        Self {
            uid_mappings: single(uid.as_raw()),
            gid_mappings: single(gid.as_raw()),
            path: None,
            unprivileged: !uid.is_root(),
            made_by_worker: false,
        }
    }

    /// Whether container uid `id` is mapped.
    pub fn maps_uid(&self, id: u32) -> bool {
        self.uid_mappings.iter().any(|m| m.maps(id))
    }

    /// Whether container gid `id` is mapped.
    pub fn maps_gid(&self, id: u32) -> bool {
        self.gid_mappings.iter().any(|m| m.maps(id))
    }

    /// Supplementary groups can be set: root created the namespace, or a privileged helper
    /// wrote its gid map (an unprivileged writer must deny setgroups, CVE-2014-8989) with a
    /// subordinate range in it (`newgidmap` denies setgroups for a map of the own gid only).
    pub fn allows_setgroups(&self) -> bool {
        !self.unprivileged || (self.made_by_worker && !self.own_gid_only())
    }

    /// The gid map is one id (the user's own gid, as container root).
    fn own_gid_only(&self) -> bool {
        matches!(self.gid_mappings.as_slice(), [m] if m.size == 1)
    }
}

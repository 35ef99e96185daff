//! Facts about the host that shape a spec: cgroup version, swap accounting, the capabilities
//! the agent can hand out, the kernel version, the NOFILE hard limit.
//!
//! They are detected once per process ([`HostFacts::current`]) and passed to the builder as a
//! value, so that tests can build specs for a host other than the one they run on.

use std::sync::OnceLock;

/// Every capability of this crate's table (0 ..= `CAP_CHECKPOINT_RESTORE`, 40).
pub(crate) const ALL_KNOWN_CAPS: u64 = (1 << 41) - 1;

const CAP_SYS_RESOURCE: u32 = 24;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostFacts {
    /// `/sys/fs/cgroup` is a cgroup2 mount (unified hierarchy).
    pub cgroup_v2: bool,
    /// The memory controller accounts swap (`memory.memsw.*` on v1, `memory.swap.max` on v2).
    pub swap_accounting: bool,
    /// The capabilities a container can get: the agent's own bounding set, which on an ordinary
    /// root host is every capability the kernel knows (containerd uses its own set likewise).
    pub bounding_caps: u64,
    /// The agent has `CAP_SYS_RESOURCE`, so it may raise a container's rlimits above its own.
    pub cap_sys_resource: bool,
    /// Kernel `(major, minor)`; `None` when `uname` cannot be parsed.
    pub kernel: Option<(u32, u32)>,
    /// The agent's own RLIMIT_NOFILE hard limit: the most an unprivileged user namespace can
    /// give a container.
    pub nofile_hard: u64,
}

impl HostFacts {
    /// The facts of this host, detected on first use.
    pub(crate) fn current() -> &'static HostFacts {
        static FACTS: OnceLock<HostFacts> = OnceLock::new();
        FACTS.get_or_init(Self::detect)
    }

    fn detect() -> HostFacts {
        let cgroup_v2 = nix::sys::statfs::statfs("/sys/fs/cgroup")
            .map(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
            .unwrap_or(false);
        let swap_accounting = if cgroup_v2 {
            own_cgroup_v2_dir()
                .map(|dir| dir.join("memory.swap.max").exists())
                .unwrap_or(false)
        } else {
            std::path::Path::new("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()
        };
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let bounding_caps = status_mask(&status, "CapBnd:").unwrap_or(ALL_KNOWN_CAPS);
        let cap_sys_resource =
            status_mask(&status, "CapEff:").is_some_and(|eff| eff & (1 << CAP_SYS_RESOURCE) != 0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .and_then(|release| parse_kernel_version(release.trim()));
        let nofile_hard =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map(|(_, hard)| hard)
                .unwrap_or(1024);
        let facts = HostFacts {
            cgroup_v2,
            swap_accounting,
            bounding_caps,
            cap_sys_resource,
            kernel,
            nofile_hard,
        };
        tracing::debug!(?facts, "detected host facts for spec generation");
        facts
    }
}

/// This process's cgroup directory on a cgroup v2 host (`0::/path` in `/proc/self/cgroup`).
fn own_cgroup_v2_dir() -> Option<std::path::PathBuf> {
    let content = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = content.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')))
}

/// A hex capability mask of `/proc/self/status`, e.g. `CapBnd:\t000001ffffffffff`.
fn status_mask(status: &str, key: &str) -> Option<u64> {
    let value = status.lines().find_map(|l| l.strip_prefix(key))?;
    u64::from_str_radix(value.trim(), 16).ok()
}

/// `"6.1.0-18-amd64"` → `(6, 1)`.
pub(crate) fn parse_kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
impl HostFacts {
    /// A cgroup v1 host with kernel 6.1 and every capability, for unit tests.
    pub(crate) fn for_tests() -> HostFacts {
        HostFacts {
            cgroup_v2: false,
            swap_accounting: true,
            bounding_caps: ALL_KNOWN_CAPS,
            cap_sys_resource: true,
            kernel: Some((6, 1)),
            nofile_hard: 1_048_576,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_release_strings_parse_to_major_and_minor() {
        assert_eq!(parse_kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(parse_kernel_version("6.18.44-fc-v445"), Some((6, 18)));
        assert_eq!(parse_kernel_version("4.8"), Some((4, 8)));
        assert_eq!(parse_kernel_version("garbage"), None);
    }

    #[test]
    fn capability_masks_are_read_from_proc_status() {
        let status = "Name:\tx\nCapEff:\t000001fffeffffff\nCapBnd:\t000001ffffffffff\n";
        assert_eq!(status_mask(status, "CapBnd:"), Some(ALL_KNOWN_CAPS));
        assert_eq!(
            status_mask(status, "CapEff:").map(|m| m & (1 << 24)),
            Some(0)
        );
        assert_eq!(status_mask(status, "CapAmb:"), None);
    }
}

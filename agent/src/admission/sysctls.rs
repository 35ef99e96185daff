//! Which sysctls a pod may set (kubelet's `pkg/kubelet/sysctl` allowlist admit handler).
//!
//! A pod's `securityContext.sysctls` must each be a safe sysctl or match
//! `--allowed-unsafe-sysctls` (exact names, or prefixes ending in `*`); a network sysctl is
//! refused to a `hostNetwork` pod and an IPC one to a `hostIPC` pod, whose namespaces are the
//! node's. The first sysctl refused rejects the pod with reason `SysctlForbidden` and
//! kubelet's message, e.g. `forbidden sysctl: "kernel.msgmax" not allowlisted`.
//!
//! Names may use `/` as separator (`net/ipv4/ip_forward`); they are compared with dots.

use std::collections::BTreeMap;

/// kubelet's `SafeSysctlAllowlist` at 1.37 (every entry is namespaced).
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// The namespace a sysctl lives in (kubelet's `NamespacedBy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysctlNamespace {
    Ipc,
    Net,
}

impl SysctlNamespace {
    /// The namespace of `name` (dotted), `None` for a sysctl that is node-wide.
    #[must_use]
    pub fn of(name: &str) -> Option<Self> {
        let ipc = name == "kernel.sem"
            || ["kernel.shm", "kernel.msg", "fs.mqueue."]
                .iter()
                .any(|p| name.starts_with(p));
        if ipc {
            Some(Self::Ipc)
        } else if name.starts_with("net.") {
            Some(Self::Net)
        } else {
            None
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Ipc => "IPC",
            Self::Net => "net",
        }
    }
}

/// A bad `--allowed-unsafe-sysctls` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysctlPatternError {
    #[error("sysctl pattern {0:?} is not valid")]
    Invalid(String),
    #[error("the sysctls {0:?} are not known to be namespaced")]
    NotNamespaced(String),
}

/// The sysctls pods may set on this node: the safe ones plus the allowed unsafe ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlAllowlist {
    names: BTreeMap<String, SysctlNamespace>,
    prefixes: BTreeMap<String, SysctlNamespace>,
}

impl Default for SysctlAllowlist {
    /// The safe sysctls only (kubelet without `--allowed-unsafe-sysctls`).
    fn default() -> Self {
        let names = SAFE_SYSCTLS
            .iter()
            .filter_map(|n| SysctlNamespace::of(n).map(|ns| ((*n).to_owned(), ns)))
            .collect();
        Self {
            names,
            prefixes: BTreeMap::new(),
        }
    }
}

impl SysctlAllowlist {
    /// The safe sysctls plus `unsafe_patterns` (`--allowed-unsafe-sysctls`), each a
    /// namespaced name or a prefix ending in `*`.
    pub fn new<S: AsRef<str>>(unsafe_patterns: &[S]) -> Result<Self, SysctlPatternError> {
        let mut list = Self::default();
        for pattern in unsafe_patterns {
            let pattern = normalize(pattern.as_ref());
            let valid = !pattern.is_empty()
                && pattern
                    .trim_end_matches('*')
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                && pattern.matches('*').count() <= 1;
            if !valid {
                return Err(SysctlPatternError::Invalid(pattern));
            }
            let stem = pattern.trim_end_matches('*');
            let ns = SysctlNamespace::of(stem)
                .ok_or_else(|| SysctlPatternError::NotNamespaced(pattern.clone()))?;
            if pattern.ends_with('*') {
                list.prefixes.insert(stem.to_owned(), ns);
            } else {
                list.names.insert(pattern, ns);
            }
        }
        Ok(list)
    }

    /// kubelet's `validateSysctl`: `Err` with the reason `name` may not be set by a pod
    /// with the given host namespaces.
    pub fn validate(&self, name: &str, host_network: bool, host_ipc: bool) -> Result<(), String> {
        let name = normalize(name);
        let ns = self.names.get(&name).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(prefix, _)| name.starts_with(prefix.as_str()))
                .map(|(_, ns)| *ns)
        });
        match ns {
            None => Err(format!("{name:?} not allowlisted")),
            Some(ns @ SysctlNamespace::Ipc) if host_ipc => Err(host_error(&name, ns)),
            Some(ns @ SysctlNamespace::Net) if host_network => Err(host_error(&name, ns)),
            Some(_) => Ok(()),
        }
    }
}

fn host_error(name: &str, ns: SysctlNamespace) -> String {
    format!("{name:?} not allowed with host {} enabled", ns.as_str())
}

/// kubelet's `ConvertSysctlVariableToDotsSeparator`: a name whose first separator is `/`
/// has its `/` and `.` swapped (`net/ipv4/conf/eno2.100/rp_filter` →
/// `net.ipv4.conf.eno2/100.rp_filter`); a dot-separated name is kept as it is.
pub fn normalize(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes().get(i) == Some(&b'/') => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slash_separated_names_become_dot_separated_as_kubelet_converts_them() {
        assert_eq!(normalize("net/ipv4/ip_forward"), "net.ipv4.ip_forward");
        assert_eq!(
            normalize("net/ipv4/conf/eno2.100/rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
        assert_eq!(
            normalize("net.ipv4.conf.eno2/100.rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
        assert_eq!(
            normalize("kernel.shm_rmid_forced"),
            "kernel.shm_rmid_forced"
        );
    }

    #[test]
    fn safe_sysctls_pass_and_unsafe_ones_are_not_allowlisted() {
        let list = SysctlAllowlist::default();
        assert_eq!(
            list.validate("kernel.shm_rmid_forced", false, false),
            Ok(())
        );
        assert_eq!(
            list.validate("net/ipv4/tcp_syncookies", false, false),
            Ok(())
        );
        assert_eq!(
            list.validate("kernel.msgmax", false, false),
            Err("\"kernel.msgmax\" not allowlisted".into())
        );
    }

    #[test]
    fn allowed_unsafe_patterns_add_names_and_prefixes() {
        let list = SysctlAllowlist::new(&["kernel.msg*", "net.core.somaxconn"]).expect("valid");
        assert_eq!(list.validate("kernel.msgmax", false, false), Ok(()));
        assert_eq!(list.validate("net.core.somaxconn", false, false), Ok(()));
        assert!(list.validate("net.core.rmem_max", false, false).is_err());
    }

    #[test]
    fn host_namespaces_refuse_their_sysctls() {
        let list = SysctlAllowlist::new(&["kernel.msg*"]).expect("valid");
        assert_eq!(
            list.validate("net.ipv4.tcp_syncookies", true, false),
            Err("\"net.ipv4.tcp_syncookies\" not allowed with host net enabled".into())
        );
        assert_eq!(
            list.validate("kernel.msgmax", false, true),
            Err("\"kernel.msgmax\" not allowed with host IPC enabled".into())
        );
    }

    #[test]
    fn node_wide_or_malformed_patterns_are_refused() {
        assert_eq!(
            SysctlAllowlist::new(&["vm.swappiness"]),
            Err(SysctlPatternError::NotNamespaced("vm.swappiness".into()))
        );
        assert_eq!(
            SysctlAllowlist::new(&["net.*.x*"]),
            Err(SysctlPatternError::Invalid("net.*.x*".into()))
        );
    }
}

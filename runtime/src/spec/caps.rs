//! Capabilities, as containerd's CRI plugin computes them.
//!
//! * Unprivileged: containerd's default set (below) in bounding, effective and permitted;
//!   inheritable and ambient empty (containerd ≥ 1.6, after CVE-2022-24769). Then, in this order:
//!   `add: [ALL]` gives every capability, `drop: [ALL]` removes every one, individual adds are
//!   added, individual drops removed (so a drop wins over an add of the same name).
//! * Privileged: every capability the agent can give (its own bounding set: on an ordinary root
//!   host, every capability the kernel knows, as containerd's `cap.Current()`); add/drop are
//!   ignored.
//!
//! Names are accepted with or without `CAP_`, in any case. An unknown name is an error; a known
//! capability outside the agent's bounding set (an older kernel, a restricted agent) is left out
//! with a warning, since no runtime could grant it.

use oci_spec::runtime::{Capabilities, Capability, LinuxCapabilities};

use crate::types::SecurityConfig;

use super::SpecError;

/// Every capability ironlet knows, by kernel number.
const TABLE: [(u8, Capability, &str); 41] = [
    (0, Capability::Chown, "CHOWN"),
    (1, Capability::DacOverride, "DAC_OVERRIDE"),
    (2, Capability::DacReadSearch, "DAC_READ_SEARCH"),
    (3, Capability::Fowner, "FOWNER"),
    (4, Capability::Fsetid, "FSETID"),
    (5, Capability::Kill, "KILL"),
    (6, Capability::Setgid, "SETGID"),
    (7, Capability::Setuid, "SETUID"),
    (8, Capability::Setpcap, "SETPCAP"),
    (9, Capability::LinuxImmutable, "LINUX_IMMUTABLE"),
    (10, Capability::NetBindService, "NET_BIND_SERVICE"),
    (11, Capability::NetBroadcast, "NET_BROADCAST"),
    (12, Capability::NetAdmin, "NET_ADMIN"),
    (13, Capability::NetRaw, "NET_RAW"),
    (14, Capability::IpcLock, "IPC_LOCK"),
    (15, Capability::IpcOwner, "IPC_OWNER"),
    (16, Capability::SysModule, "SYS_MODULE"),
    (17, Capability::SysRawio, "SYS_RAWIO"),
    (18, Capability::SysChroot, "SYS_CHROOT"),
    (19, Capability::SysPtrace, "SYS_PTRACE"),
    (20, Capability::SysPacct, "SYS_PACCT"),
    (21, Capability::SysAdmin, "SYS_ADMIN"),
    (22, Capability::SysBoot, "SYS_BOOT"),
    (23, Capability::SysNice, "SYS_NICE"),
    (24, Capability::SysResource, "SYS_RESOURCE"),
    (25, Capability::SysTime, "SYS_TIME"),
    (26, Capability::SysTtyConfig, "SYS_TTY_CONFIG"),
    (27, Capability::Mknod, "MKNOD"),
    (28, Capability::Lease, "LEASE"),
    (29, Capability::AuditWrite, "AUDIT_WRITE"),
    (30, Capability::AuditControl, "AUDIT_CONTROL"),
    (31, Capability::Setfcap, "SETFCAP"),
    (32, Capability::MacOverride, "MAC_OVERRIDE"),
    (33, Capability::MacAdmin, "MAC_ADMIN"),
    (34, Capability::Syslog, "SYSLOG"),
    (35, Capability::WakeAlarm, "WAKE_ALARM"),
    (36, Capability::BlockSuspend, "BLOCK_SUSPEND"),
    (37, Capability::AuditRead, "AUDIT_READ"),
    (38, Capability::Perfmon, "PERFMON"),
    (39, Capability::Bpf, "BPF"),
    (40, Capability::CheckpointRestore, "CHECKPOINT_RESTORE"),
];

/// containerd's default capabilities for CRI containers, in its order.
pub(crate) const DEFAULT: [Capability; 14] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

/// The kernel number of a capability.
pub(crate) fn number(cap: Capability) -> u8 {
    TABLE
        .iter()
        .find(|(_, c, _)| *c == cap)
        .map_or(u8::MAX, |(n, _, _)| *n)
}

/// `CAP_NET_ADMIN`, `net_admin` or `NET_ADMIN` → `Capability::NetAdmin`.
fn parse(field: &'static str, name: &str) -> Result<Capability, SpecError> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    TABLE
        .iter()
        .find(|(_, _, n)| *n == bare)
        .map(|(_, c, _)| *c)
        .ok_or_else(|| SpecError::UnknownCapability {
            field,
            name: name.to_owned(),
        })
}

fn is_all(name: &str) -> bool {
    name.trim().eq_ignore_ascii_case("ALL")
}

/// The bounding set (= effective = permitted) of a container, in a stable order.
///
/// `device_rules_enforced` is false on a cgroup v2 host outside a user namespace: this
/// build cannot enforce a spec's device rules there (libcgroups' eBPF device controller is
/// not compiled in), so `CAP_MKNOD` would let a container's root create and open any device
/// node, the host's disks included. It is then left out of the default set, as Podman's
/// defaults leave it out; a container that asks for it by name (or `ALL`) still gets it,
/// with a warning. (In a user namespace the kernel refuses device nodes anyway, and a
/// privileged container has the host's devices by design.)
pub(crate) fn resolve(
    security: &SecurityConfig,
    available: u64,
    device_rules_enforced: bool,
) -> Result<Vec<Capability>, SpecError> {
    static TRIMMED_WARNING: std::sync::Once = std::sync::Once::new();
    let every: Vec<Capability> = TABLE.iter().map(|(_, c, _)| *c).collect();
    // Validate every name even when privileged ignores them.
    let adds = names(&security.add_capabilities, "security.add_capabilities")?;
    let drops = names(&security.drop_capabilities, "security.drop_capabilities")?;

    let mut caps: Vec<Capability> = if security.privileged {
        every
    } else {
        let mut caps = DEFAULT.to_vec();
        if !device_rules_enforced {
            caps.retain(|c| *c != Capability::Mknod);
            TRIMMED_WARNING.call_once(|| {
                tracing::warn!(
                    "cgroup v2: device rules are not enforced by this build, so CAP_MKNOD is \
                     left out of containers' default capabilities (add it by name to get it)"
                );
            });
        }
        if security.add_capabilities.iter().any(|n| is_all(n)) {
            caps = every;
        }
        if security.drop_capabilities.iter().any(|n| is_all(n)) {
            caps.clear();
        }
        for cap in adds {
            if !caps.contains(&cap) {
                caps.push(cap);
            }
        }
        caps.retain(|c| !drops.contains(c));
        if !device_rules_enforced && caps.contains(&Capability::Mknod) {
            tracing::warn!(
                "CAP_MKNOD granted on cgroup v2, where this build does not enforce device \
                 rules: the container's root can create and open any device node"
            );
        }
        caps
    };
    caps.retain(|c| {
        let supported = 1u64
            .checked_shl(u32::from(number(*c)))
            .is_some_and(|bit| available & bit != 0);
        if !supported && !security.privileged {
            tracing::warn!(capability = %c, "capability is outside the agent's bounding set; leaving it out");
        }
        supported
    });
    Ok(caps)
}

fn names(list: &[String], field: &'static str) -> Result<Vec<Capability>, SpecError> {
    list.iter()
        .filter(|n| !is_all(n))
        .map(|n| parse(field, n))
        .collect()
}

/// The OCI capability sets for a resolved bounding set.
pub(crate) fn linux_capabilities(bounding: &[Capability]) -> Result<LinuxCapabilities, SpecError> {
    let set: Capabilities = bounding.iter().copied().collect();
    oci_spec::runtime::LinuxCapabilitiesBuilder::default()
        .bounding(set.clone())
        .effective(set.clone())
        .permitted(set)
        .inheritable(Capabilities::new())
        .ambient(Capabilities::new())
        .build()
        .map_err(SpecError::assemble("process.capabilities"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mknod_is_left_out_by_default_only_where_device_rules_are_not_enforced() {
        let default = |enforced| resolve(&SecurityConfig::default(), u64::MAX, enforced);
        assert!(default(true).expect("resolve").contains(&Capability::Mknod));
        let v2 = default(false).expect("resolve");
        assert!(!v2.contains(&Capability::Mknod));
        assert_eq!(v2.len(), DEFAULT.len() - 1, "only MKNOD goes: {v2:?}");
        for add in ["MKNOD", "cap_mknod", "ALL"] {
            let asked = SecurityConfig {
                add_capabilities: vec![add.into()],
                ..SecurityConfig::default()
            };
            let caps = resolve(&asked, u64::MAX, false).expect("resolve");
            assert!(caps.contains(&Capability::Mknod), "asked by {add}");
        }
        let privileged = SecurityConfig {
            privileged: true,
            ..SecurityConfig::default()
        };
        let caps = resolve(&privileged, u64::MAX, false).expect("resolve");
        assert!(caps.contains(&Capability::Mknod));
    }

    #[test]
    fn the_table_is_ordered_by_kernel_number() {
        for (i, (n, _, _)) in TABLE.iter().enumerate() {
            assert_eq!(usize::from(*n), i);
        }
    }

    #[test]
    fn table_names_match_the_oci_serialization() {
        for (_, cap, name) in TABLE {
            assert_eq!(cap.to_string(), name);
            let json = serde_json::to_string(&cap).expect("serialize");
            assert_eq!(json, format!("\"CAP_{name}\""));
        }
    }

    #[test]
    fn names_parse_with_or_without_prefix_in_any_case() {
        for name in ["NET_ADMIN", "CAP_NET_ADMIN", "net_admin", "cap_net_admin"] {
            assert_eq!(parse("f", name).expect(name), Capability::NetAdmin);
        }
        assert!(matches!(
            parse("f", "NET_WIZARD"),
            Err(SpecError::UnknownCapability { .. })
        ));
    }

    #[test]
    fn capabilities_outside_the_agents_bounding_set_are_left_out() {
        let security = SecurityConfig {
            add_capabilities: vec!["BPF".into(), "CHECKPOINT_RESTORE".into()],
            ..Default::default()
        };
        let caps = resolve(&security, (1 << 39) - 1, true).expect("resolve");
        assert!(!caps.contains(&Capability::Bpf));
        assert!(!caps.contains(&Capability::CheckpointRestore));
        assert!(caps.contains(&Capability::Chown));
    }
}

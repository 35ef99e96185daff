//! `linux.resources` from the container's [`LinuxResources`], as containerd's `WithResources`:
//! a zero value means "not set"; the memory limit also caps memory+swap (no swap, as the kubelet
//! expects) where the host accounts swap; device rules come from [`devices`](super::devices).

use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxDeviceCgroup, LinuxMemoryBuilder, LinuxPidsBuilder,
    LinuxResources as OciResources, LinuxResourcesBuilder,
};

use crate::types::LinuxResources;

use super::SpecError;

/// The spec's `linux.resources`.
pub(crate) fn resources(
    r: &LinuxResources,
    devices: Vec<LinuxDeviceCgroup>,
    swap_accounting: bool,
) -> Result<OciResources, SpecError> {
    let mut builder = LinuxResourcesBuilder::default().devices(devices);

    let shares = r.cpu_shares.filter(|s| *s != 0);
    let quota = r.cpu_quota.filter(|q| *q != 0);
    let period = r.cpu_period.filter(|p| *p != 0);
    if shares.is_some() || quota.is_some() || period.is_some() {
        let mut cpu = LinuxCpuBuilder::default();
        if let Some(shares) = shares {
            cpu = cpu.shares(shares);
        }
        if let Some(quota) = quota {
            if quota < -1 {
                return Err(SpecError::invalid(
                    "resources.cpu_quota",
                    quota.to_string(),
                    "must be -1 or positive",
                ));
            }
            cpu = cpu.quota(quota);
        }
        if let Some(period) = period {
            cpu = cpu.period(period);
        }
        builder = builder.cpu(
            cpu.build()
                .map_err(SpecError::assemble("linux.resources.cpu"))?,
        );
    }

    if let Some(limit) = r.memory_limit_bytes.filter(|l| *l != 0) {
        if limit < 0 {
            return Err(SpecError::invalid(
                "resources.memory_limit_bytes",
                limit.to_string(),
                "must be positive",
            ));
        }
        let mut memory = LinuxMemoryBuilder::default().limit(limit);
        if swap_accounting {
            memory = memory.swap(limit);
        }
        builder = builder.memory(
            memory
                .build()
                .map_err(SpecError::assemble("linux.resources.memory"))?,
        );
    }

    if let Some(limit) = r.pids_limit.filter(|l| *l != 0) {
        if limit < -1 {
            return Err(SpecError::invalid(
                "resources.pids_limit",
                limit.to_string(),
                "must be -1 (unlimited) or positive",
            ));
        }
        builder = builder.pids(
            LinuxPidsBuilder::default()
                .limit(limit)
                .build()
                .map_err(SpecError::assemble("linux.resources.pids"))?,
        );
    }
    builder
        .build()
        .map_err(SpecError::assemble("linux.resources"))
}

/// `process.oomScoreAdj`, validated to the kernel's range.
pub(crate) fn oom_score_adj(r: &LinuxResources) -> Result<Option<i32>, SpecError> {
    match r.oom_score_adj {
        Some(adj) if !(-1000..=1000).contains(&adj) => Err(SpecError::invalid(
            "resources.oom_score_adj",
            adj.to_string(),
            "must be between -1000 and 1000",
        )),
        other => Ok(other.map(restrict_oom_score_adj)),
    }
}

/// A runtime without `CAP_SYS_RESOURCE` may not lower a process's `oom_score_adj` below its
/// own: rootless, or root in a sandbox that drops the capability (a node in a container).
/// Such a container gets the requested value or this process's, whichever is higher, as
/// containerd's `RestrictOOMScoreAdj` does; otherwise every Guaranteed or Burstable pod
/// (kubelet's -997 and 2..999) would fail to start with EACCES.
fn restrict_oom_score_adj(adj: i32) -> i32 {
    if nix::unistd::geteuid().is_root() && super::host::HostFacts::current().cap_sys_resource {
        return adj;
    }
    let own = std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
        .unwrap_or(0);
    adj.max(own)
}

//! Requests and limits → cgroup settings, identical to kubelet's
//! `pkg/kubelet/cm/helpers_linux.go` (pod level, `ResourceConfigForPod`) and
//! `pkg/kubelet/kuberuntime/kuberuntime_container_linux.go` (container level).
//!
//! Everything here is pure. The conversions, as kubelet does them:
//!
//! * CPU shares = `milli * 1024 / 1000`, clamped to `[2, 262144]`; zero/unset → 2.
//! * CFS quota = `limit_milli * period / 1000` µs, at least 1000 µs; period 100000 µs.
//! * cgroup v2 `cpu.weight` = `1 + ((shares - 2) * 9999) / 262142`.
//! * A request left unset defaults to the limit (the API server's defaulting, repeated here).
//!
//! Current behaviour: sidecar (restartable init) containers, pod overhead, hugepages and
//! MemoryQoS (`memory.min`/`memory.high`) are not modelled.

use crate::qos::QosClass;

/// Smallest CPU shares value the kernel accepts (kubelet `MinShares`).
pub const MIN_SHARES: u64 = 2;
/// Largest CPU shares value the kernel accepts (kubelet `MaxShares`).
pub const MAX_SHARES: u64 = 262_144;
/// Default CFS period in µs (kubelet `QuotaPeriod`).
pub const QUOTA_PERIOD_US: u64 = 100_000;
/// Smallest CFS quota in µs (kubelet `MinQuotaPeriod`).
pub const MIN_QUOTA_US: i64 = 1_000;
const SHARES_PER_CPU: u64 = 1024;
const MILLI_PER_CPU: u64 = 1000;

/// One container's compute resources. `None` means "not specified"; zero counts as unset for
/// limits, as in kubelet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceRequirements {
    /// `requests.cpu` in millicores.
    pub cpu_request_milli: Option<u64>,
    /// `limits.cpu` in millicores.
    pub cpu_limit_milli: Option<u64>,
    /// `requests.memory` in bytes.
    pub memory_request_bytes: Option<u64>,
    /// `limits.memory` in bytes.
    pub memory_limit_bytes: Option<u64>,
}

/// Values to write into a cgroup. `None` leaves a file untouched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupSettings {
    /// v1 `cpu.shares`; on v2 converted to `cpu.weight` (see [`shares_to_weight`]).
    pub cpu_shares: Option<u64>,
    /// CFS quota in µs; `-1` means unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period in µs.
    pub cpu_period: Option<u64>,
    /// Memory limit in bytes; `-1` means unlimited.
    pub memory_limit: Option<i64>,
    /// Maximum number of processes; negative means unlimited.
    pub pids_limit: Option<i64>,
}

/// Node-wide knobs that shape the mapping, mirroring kubelet's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupOptions {
    /// Enforce CPU limits with CFS quota (kubelet `cpuCFSQuota`, default `true`).
    pub enforce_cpu_limits: bool,
    /// CFS period in µs (kubelet `cpuCFSQuotaPeriod`, default 100ms).
    pub cpu_cfs_period_us: u64,
    /// Per-pod process limit (kubelet `podPidsLimit`, default `-1`: unlimited, so `None`).
    pub pod_pids_limit: Option<i64>,
}

impl Default for CgroupOptions {
    fn default() -> Self {
        Self {
            // kubelet: cpuCFSQuota defaults to true.
            enforce_cpu_limits: true,
            // kubelet: cpuCFSQuotaPeriod defaults to 100ms.
            cpu_cfs_period_us: QUOTA_PERIOD_US,
            // kubelet: podPidsLimit defaults to -1 (no limit written).
            pod_pids_limit: None,
        }
    }
}

/// A pod's containers, as far as cgroup sizing is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodResources {
    /// The app containers.
    pub containers: Vec<ResourceRequirements>,
    /// The (non-restartable) init containers; they run one at a time, so they count by maximum.
    pub init_containers: Vec<ResourceRequirements>,
}

/// kubelet `MilliCPUToShares`.
#[must_use]
pub fn milli_cpu_to_shares(milli_cpu: u64) -> u64 {
    if milli_cpu == 0 {
        return MIN_SHARES;
    }
    (milli_cpu.saturating_mul(SHARES_PER_CPU) / MILLI_PER_CPU).clamp(MIN_SHARES, MAX_SHARES)
}

/// kubelet `MilliCPUToQuota`: 0 for no limit, else at least [`MIN_QUOTA_US`].
#[must_use]
pub fn milli_cpu_to_quota(milli_cpu: u64, period_us: u64) -> i64 {
    if milli_cpu == 0 {
        return 0;
    }
    let quota = milli_cpu.saturating_mul(period_us) / MILLI_PER_CPU;
    i64::try_from(quota).unwrap_or(i64::MAX).max(MIN_QUOTA_US)
}

/// cgroup v2 `cpu.weight` for v1 shares (runc's `ConvertCPUSharesToCgroupV2Value`, shares
/// clamped to the valid range first). Always in `[1, 10000]`.
#[must_use]
pub fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + ((shares - 2) * 9999) / 262_142
}

fn positive(value: Option<u64>) -> Option<u64> {
    value.filter(|v| *v > 0)
}

impl ResourceRequirements {
    /// The CPU request after defaulting: the request if specified, else the limit.
    #[must_use]
    pub fn effective_cpu_request_milli(&self) -> Option<u64> {
        self.cpu_request_milli.or(self.cpu_limit_milli)
    }

    /// The memory request after defaulting: the request if specified, else the limit.
    #[must_use]
    pub fn effective_memory_request_bytes(&self) -> Option<u64> {
        self.memory_request_bytes.or(self.memory_limit_bytes)
    }

    /// The container cgroup's settings (kubelet `calculateLinuxResources`). Process limits are
    /// pod-level only, so `pids_limit` is `None`.
    #[must_use]
    pub fn container_settings(&self, options: &CgroupOptions) -> CgroupSettings {
        let cpu_limit = positive(self.cpu_limit_milli);
        let quota = cpu_limit
            .filter(|_| options.enforce_cpu_limits)
            .map(|milli| milli_cpu_to_quota(milli, options.cpu_cfs_period_us));
        CgroupSettings {
            cpu_shares: Some(milli_cpu_to_shares(
                self.effective_cpu_request_milli().unwrap_or(0),
            )),
            cpu_quota: quota,
            cpu_period: quota.map(|_| options.cpu_cfs_period_us),
            memory_limit: positive(self.memory_limit_bytes).map(saturating_i64),
            pids_limit: None,
        }
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Per-resource pod totals: sum over app containers, then the maximum with each init container.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Totals {
    cpu_milli: u64,
    memory_bytes: u64,
}

impl Totals {
    fn of(pod: &PodResources, pick: impl Fn(&ResourceRequirements) -> (u64, u64)) -> Self {
        let mut totals = pod.containers.iter().fold(Self::default(), |acc, c| {
            let (cpu, memory) = pick(c);
            Self {
                cpu_milli: acc.cpu_milli.saturating_add(cpu),
                memory_bytes: acc.memory_bytes.saturating_add(memory),
            }
        });
        for init in &pod.init_containers {
            let (cpu, memory) = pick(init);
            totals.cpu_milli = totals.cpu_milli.max(cpu);
            totals.memory_bytes = totals.memory_bytes.max(memory);
        }
        totals
    }
}

impl PodResources {
    fn all(&self) -> impl Iterator<Item = &ResourceRequirements> {
        self.containers.iter().chain(&self.init_containers)
    }

    /// The pod's QoS class (kubelet `GetPodQOS`), over app and init containers.
    #[must_use]
    pub fn qos(&self) -> QosClass {
        QosClass::from_requirements(&self.all().copied().collect::<Vec<_>>())
    }

    /// The pod cgroup's settings (kubelet `ResourceConfigForPod`).
    #[must_use]
    pub fn cgroup_settings(&self, options: &CgroupOptions) -> CgroupSettings {
        let requests = Totals::of(self, |c| {
            (
                c.effective_cpu_request_milli().unwrap_or(0),
                c.effective_memory_request_bytes().unwrap_or(0),
            )
        });
        let limits = Totals::of(self, |c| {
            (
                c.cpu_limit_milli.unwrap_or(0),
                c.memory_limit_bytes.unwrap_or(0),
            )
        });
        let cpu_limits_declared = self.all().all(|c| positive(c.cpu_limit_milli).is_some());
        let memory_limits_declared = self.all().all(|c| positive(c.memory_limit_bytes).is_some());

        let shares = milli_cpu_to_shares(requests.cpu_milli);
        let quota = if options.enforce_cpu_limits {
            milli_cpu_to_quota(limits.cpu_milli, options.cpu_cfs_period_us)
        } else {
            -1
        };
        let memory = saturating_i64(limits.memory_bytes);
        let period = options.cpu_cfs_period_us;
        let pids_limit = options.pod_pids_limit;

        match self.qos() {
            QosClass::Guaranteed => CgroupSettings {
                cpu_shares: Some(shares),
                cpu_quota: Some(quota),
                cpu_period: Some(period),
                memory_limit: Some(memory),
                pids_limit,
            },
            QosClass::Burstable => CgroupSettings {
                cpu_shares: Some(shares),
                cpu_quota: cpu_limits_declared.then_some(quota),
                cpu_period: cpu_limits_declared.then_some(period),
                memory_limit: memory_limits_declared.then_some(memory),
                pids_limit,
            },
            QosClass::BestEffort => CgroupSettings {
                cpu_shares: Some(MIN_SHARES),
                pids_limit,
                ..CgroupSettings::default()
            },
        }
    }
}

#[cfg(test)]
#[path = "resources_tests.rs"]
mod tests;

//! Unit tests for `resources.rs`, using the cases of kubelet's `helpers_linux_test.go`
//! (`TestResourceConfigForPod`, `TestMilliCPUToQuota`, `TestMilliCPUToShares`) and
//! `kuberuntime_container_linux_test.go`.

use super::*;

const MI: u64 = 1 << 20;

/// kubelet's `getResourceRequirements(getResourceList(cpu, mem), getResourceList(cpu, mem))`.
fn req(
    requests: (Option<u64>, Option<u64>),
    limits: (Option<u64>, Option<u64>),
) -> ResourceRequirements {
    ResourceRequirements {
        cpu_request_milli: requests.0,
        memory_request_bytes: requests.1,
        cpu_limit_milli: limits.0,
        memory_limit_bytes: limits.1,
    }
}

fn pod(containers: Vec<ResourceRequirements>) -> PodResources {
    PodResources {
        containers,
        init_containers: Vec::new(),
    }
}

const NONE: (Option<u64>, Option<u64>) = (None, None);
const R100: (Option<u64>, Option<u64>) = (Some(100), Some(100 * MI));
const R200: (Option<u64>, Option<u64>) = (Some(200), Some(200 * MI));

fn no_cpu_enforcement() -> CgroupOptions {
    CgroupOptions {
        enforce_cpu_limits: false,
        ..CgroupOptions::default()
    }
}

#[test]
fn milli_cpu_to_shares_matches_kubelet() {
    for (milli, shares) in [
        (0, 2),
        (1, 2),
        (2, 2),
        (100, 102),
        (500, 512),
        (1000, 1024),
        (2000, 2048),
        (256_000, MAX_SHARES),
        (1_000_000, MAX_SHARES),
    ] {
        assert_eq!(milli_cpu_to_shares(milli), shares, "{milli}m");
    }
}

#[test]
fn milli_cpu_to_quota_matches_kubelet() {
    for (milli, quota) in [
        (0, 0),
        (5, 1000),
        (9, 1000),
        (10, 1000),
        (200, 20_000),
        (500, 50_000),
        (1000, 100_000),
        (1500, 150_000),
    ] {
        assert_eq!(
            milli_cpu_to_quota(milli, QUOTA_PERIOD_US),
            quota,
            "{milli}m"
        );
    }
}

#[test]
fn shares_map_to_the_full_v2_weight_range() {
    assert_eq!(shares_to_weight(2), 1);
    assert_eq!(shares_to_weight(1024), 39);
    assert_eq!(shares_to_weight(262_144), 10_000);
    assert_eq!(
        shares_to_weight(0),
        1,
        "below the minimum clamps to 2 shares"
    );
}

#[test]
fn best_effort_pod_gets_minimum_shares_only() {
    let settings = pod(vec![req(NONE, NONE)]).cgroup_settings(&CgroupOptions::default());
    assert_eq!(
        settings,
        CgroupSettings {
            cpu_shares: Some(2),
            ..CgroupSettings::default()
        }
    );
}

#[test]
fn burstable_pod_without_limits_gets_shares_only() {
    let settings = pod(vec![req(R100, NONE)]).cgroup_settings(&CgroupOptions::default());
    assert_eq!(
        settings,
        CgroupSettings {
            cpu_shares: Some(102),
            ..CgroupSettings::default()
        }
    );
}

#[test]
fn burstable_pod_with_limits_gets_quota_and_memory() {
    let settings = pod(vec![req(R100, R200)]).cgroup_settings(&CgroupOptions::default());
    assert_eq!(
        settings,
        CgroupSettings {
            cpu_shares: Some(102),
            cpu_quota: Some(20_000),
            cpu_period: Some(100_000),
            memory_limit: Some(200 * MI as i64),
            pids_limit: None,
        }
    );
}

#[test]
fn burstable_pod_without_cpu_enforcement_gets_unlimited_quota() {
    let settings = pod(vec![req(R100, R200)]).cgroup_settings(&no_cpu_enforcement());
    assert_eq!(settings.cpu_quota, Some(-1));
    assert_eq!(settings.cpu_period, Some(100_000));
    assert_eq!(settings.memory_limit, Some(200 * MI as i64));
}

#[test]
fn burstable_pod_with_partial_limits_gets_summed_shares_only() {
    let settings =
        pod(vec![req(R100, R200), req(R100, NONE)]).cgroup_settings(&CgroupOptions::default());
    assert_eq!(
        settings,
        CgroupSettings {
            cpu_shares: Some(milli_cpu_to_shares(200)),
            ..CgroupSettings::default()
        }
    );
}

#[test]
fn burstable_pod_with_partial_limits_and_init_containers_gets_summed_shares_only() {
    // kubelet's "burstable-partial-limits-with-init-containers" (requests "100m","100m").
    let limited = req((Some(100), Some(1)), (Some(100), Some(100 * MI)));
    let unlimited = req((Some(100), Some(1)), NONE);
    let resources = PodResources {
        containers: vec![limited, unlimited],
        init_containers: vec![limited, unlimited],
    };
    let settings = resources.cgroup_settings(&CgroupOptions::default());
    assert_eq!(
        settings,
        CgroupSettings {
            cpu_shares: Some(milli_cpu_to_shares(200)),
            ..CgroupSettings::default()
        }
    );
}

#[test]
fn guaranteed_pod_gets_shares_quota_period_and_memory() {
    let settings = pod(vec![req(R100, R100)]).cgroup_settings(&CgroupOptions::default());
    assert_eq!(
        settings,
        CgroupSettings {
            cpu_shares: Some(102),
            cpu_quota: Some(10_000),
            cpu_period: Some(100_000),
            memory_limit: Some(100 * MI as i64),
            pids_limit: None,
        }
    );
}

#[test]
fn guaranteed_pod_without_cpu_enforcement_gets_unlimited_quota() {
    let settings = pod(vec![req(R100, R100)]).cgroup_settings(&no_cpu_enforcement());
    assert_eq!(settings.cpu_quota, Some(-1));
    assert_eq!(settings.memory_limit, Some(100 * MI as i64));
}

#[test]
fn a_tuned_period_scales_the_quota_and_is_written_as_period() {
    let options = CgroupOptions {
        cpu_cfs_period_us: 5_000,
        ..CgroupOptions::default()
    };
    let settings = pod(vec![req(R100, R200)]).cgroup_settings(&options);
    assert_eq!(settings.cpu_period, Some(5_000));
    // 200m of a 5ms period is 1ms, exactly the minimum quota.
    assert_eq!(settings.cpu_quota, Some(1_000));
}

#[test]
fn init_containers_count_by_maximum_not_sum() {
    let resources = PodResources {
        containers: vec![req(R100, R100)],
        init_containers: vec![req(R200, R200), req(R100, R100)],
    };
    let settings = resources.cgroup_settings(&CgroupOptions::default());
    assert_eq!(settings.cpu_shares, Some(milli_cpu_to_shares(200)));
    assert_eq!(settings.memory_limit, Some(200 * MI as i64));
    assert_eq!(settings.cpu_quota, Some(20_000));
}

#[test]
fn pod_pids_limit_applies_to_every_qos_class() {
    let options = CgroupOptions {
        pod_pids_limit: Some(1024),
        ..CgroupOptions::default()
    };
    for p in [
        pod(vec![req(NONE, NONE)]),
        pod(vec![req(R100, NONE)]),
        pod(vec![req(R100, R100)]),
    ] {
        assert_eq!(p.cgroup_settings(&options).pids_limit, Some(1024));
    }
}

#[test]
fn container_request_defaults_to_limit_for_shares() {
    let settings =
        req((None, None), (Some(500), Some(64 * MI))).container_settings(&CgroupOptions::default());
    assert_eq!(
        settings,
        CgroupSettings {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 * MI as i64),
            pids_limit: None,
        }
    );
}

#[test]
fn container_without_resources_gets_minimum_shares_and_no_limits() {
    let settings = ResourceRequirements::default().container_settings(&CgroupOptions::default());
    assert_eq!(
        settings,
        CgroupSettings {
            cpu_shares: Some(2),
            ..CgroupSettings::default()
        }
    );
}

#[test]
fn container_quota_is_skipped_when_cpu_limits_are_not_enforced() {
    let settings = req(R100, R200).container_settings(&no_cpu_enforcement());
    assert_eq!(settings.cpu_quota, None);
    assert_eq!(settings.cpu_period, None);
    assert_eq!(settings.cpu_shares, Some(102));
}

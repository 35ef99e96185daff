//! The agent's metrics, under kubelet's names, buckets and help texts (from
//! `pkg/kubelet/metrics`), plus the process metrics Prometheus clients export
//! (`process_resident_memory_bytes`, …).
//!
//! Components update the fields directly:
//!
//! ```
//! # use ironlet::server::Metrics;
//! let metrics = Metrics::new();
//! metrics.running_pods.set(3.0);
//! metrics.running_containers.with(["running"]).set(5.0);
//! metrics.pod_start_sli.observe(0.042);
//! metrics.started_containers_total.with(["container"]).inc();
//! assert!(metrics.render().contains("kubelet_running_pods 3\n"));
//! ```

use super::registry::{
    header, Collect, Counter, Family, Gauge, Histogram, Single, DEFAULT_BUCKETS,
};

/// kubelet's `podStartupDurationBuckets`, seconds.
pub const POD_STARTUP_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// Every metric the agent exports. Cheap to share (`Arc<Metrics>`); all updates are atomic.
pub struct Metrics {
    /// `kubelet_running_pods`: pods with a running sandbox.
    pub running_pods: Single<Gauge>,
    /// `kubelet_running_containers{container_state}`: `created`, `running`, `exited`, `unknown`.
    pub running_containers: Family<Gauge, 1>,
    /// `kubelet_desired_pods{static}`: `"true"` for pods not from the API server.
    pub desired_pods: Family<Gauge, 1>,
    /// `kubelet_pod_start_sli_duration_seconds`: creation to all containers started,
    /// excluding image pulls.
    pub pod_start_sli: Single<Histogram>,
    /// `kubelet_pod_start_duration_seconds`: first seen by the agent to running.
    pub pod_start_duration: Single<Histogram>,
    /// `kubelet_pod_worker_duration_seconds{operation_type}`: `create`, `update`, `sync`.
    pub pod_worker_duration: Family<Histogram, 1>,
    /// `kubelet_pleg_relist_duration_seconds`.
    pub pleg_relist_duration: Single<Histogram>,
    /// `kubelet_pleg_relist_interval_seconds`.
    pub pleg_relist_interval: Single<Histogram>,
    /// `kubelet_pleg_last_seen_seconds`: Unix time PLEG was last active.
    pub pleg_last_seen: Single<Gauge>,
    /// `kubelet_started_pods_total`.
    pub started_pods_total: Single<Counter>,
    /// `kubelet_started_pods_errors_total`.
    pub started_pods_errors_total: Single<Counter>,
    /// `kubelet_started_containers_total{container_type}`: `container`, `init_container`.
    pub started_containers_total: Family<Counter, 1>,
    /// `kubelet_started_containers_errors_total{container_type,code}`.
    pub started_containers_errors_total: Family<Counter, 2>,
    /// `kubelet_restarted_pods_total{static}`: deleted and recreated with the same UID.
    pub restarted_pods_total: Family<Counter, 1>,
    /// `kubelet_evictions{eviction_signal}`: pods evicted, by signal (`memory.available`,
    /// …, `emptydirfs.limit`).
    pub evictions: Family<Counter, 1>,
    /// `ironlet_object_watches{kind}`: running watches of ConfigMaps (`configmap`) and
    /// Secrets (`secret`) referenced by pods (kubelet has no such metric).
    pub object_watches: Family<Gauge, 1>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            running_pods: Single::new(
                "kubelet_running_pods",
                "[ALPHA] Number of pods that have a running pod sandbox",
                (),
            ),
            running_containers: Family::new(
                "kubelet_running_containers",
                "[ALPHA] Number of containers currently running",
                ["container_state"],
                (),
            ),
            desired_pods: Family::new(
                "kubelet_desired_pods",
                "[ALPHA] The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver.",
                ["static"],
                (),
            ),
            pod_start_sli: Single::new(
                "kubelet_pod_start_sli_duration_seconds",
                "[ALPHA] Duration in seconds to start a pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
                POD_STARTUP_BUCKETS,
            ),
            pod_start_duration: Single::new(
                "kubelet_pod_start_duration_seconds",
                "[ALPHA] Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
                POD_STARTUP_BUCKETS,
            ),
            pod_worker_duration: Family::new(
                "kubelet_pod_worker_duration_seconds",
                "[ALPHA] Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
                ["operation_type"],
                DEFAULT_BUCKETS,
            ),
            pleg_relist_duration: Single::new(
                "kubelet_pleg_relist_duration_seconds",
                "[ALPHA] Duration in seconds for relisting pods in PLEG.",
                DEFAULT_BUCKETS,
            ),
            pleg_relist_interval: Single::new(
                "kubelet_pleg_relist_interval_seconds",
                "[ALPHA] Interval in seconds between relisting in PLEG.",
                DEFAULT_BUCKETS,
            ),
            pleg_last_seen: Single::new(
                "kubelet_pleg_last_seen_seconds",
                "[ALPHA] Timestamp in seconds when PLEG was last seen active.",
                (),
            ),
            started_pods_total: Single::new(
                "kubelet_started_pods_total",
                "[ALPHA] Cumulative number of pods started",
                (),
            ),
            started_pods_errors_total: Single::new(
                "kubelet_started_pods_errors_total",
                "[ALPHA] Cumulative number of errors when starting pods",
                (),
            ),
            started_containers_total: Family::new(
                "kubelet_started_containers_total",
                "[ALPHA] Cumulative number of containers started",
                ["container_type"],
                (),
            ),
            started_containers_errors_total: Family::new(
                "kubelet_started_containers_errors_total",
                "[ALPHA] Cumulative number of errors when starting containers",
                ["container_type", "code"],
                (),
            ),
            restarted_pods_total: Family::new(
                "kubelet_restarted_pods_total",
                "[ALPHA] Number of pods that have been restarted because they were deleted and recreated with the same UID while the kubelet was watching them (common for static pods, extremely uncommon for API pods)",
                ["static"],
                (),
            ),
            evictions: Family::new(
                "kubelet_evictions",
                "[ALPHA] Cumulative number of pod evictions by eviction signal",
                ["eviction_signal"],
                (),
            ),
            object_watches: Family::new(
                "ironlet_object_watches",
                "Number of running watches of ConfigMaps and Secrets referenced by pods, by kind",
                ["kind"],
                (),
            ),
        }
    }

    /// The Prometheus text exposition of every metric, process metrics last.
    pub fn render(&self) -> String {
        let collectors: [&dyn Collect; 16] = [
            &self.running_pods,
            &self.running_containers,
            &self.desired_pods,
            &self.pod_start_sli,
            &self.pod_start_duration,
            &self.pod_worker_duration,
            &self.pleg_relist_duration,
            &self.pleg_relist_interval,
            &self.pleg_last_seen,
            &self.started_pods_total,
            &self.started_pods_errors_total,
            &self.started_containers_total,
            &self.started_containers_errors_total,
            &self.restarted_pods_total,
            &self.evictions,
            &self.object_watches,
        ];
        let mut out = String::with_capacity(8 * 1024);
        for c in collectors {
            c.collect(&mut out);
        }
        process_metrics(&mut out);
        out
    }
}

/// `process_*` gauges read from `/proc/self` at scrape time; a value that cannot be read
/// is left out rather than reported as zero.
fn process_metrics(out: &mut String) {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
        let mut fields = statm.split_whitespace().map(|f| f.parse::<u64>().ok());
        if let (Some(Some(size)), Some(Some(resident))) = (fields.next(), fields.next()) {
            gauge_line(
                out,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                size * page,
            );
            gauge_line(
                out,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                resident * page,
            );
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        gauge_line(
            out,
            "process_open_fds",
            "Number of open file descriptors.",
            fds.count() as u64,
        );
    }
}

fn gauge_line(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "gauge");
    out.push_str(name);
    out.push(' ');
    out.push_str(&value.to_string());
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_registry_exports_unlabelled_kubelet_metrics_at_zero() {
        let text = Metrics::new().render();
        assert!(text.contains("# TYPE kubelet_running_pods gauge\nkubelet_running_pods 0\n"));
        assert!(text.contains("kubelet_pod_start_sli_duration_seconds_bucket{le=\"0.5\"} 0\n"));
        assert!(text.contains("kubelet_pod_start_sli_duration_seconds_bucket{le=\"3600\"} 0\n"));
        assert!(text.contains("kubelet_pleg_relist_duration_seconds_count 0\n"));
        assert!(text.contains("kubelet_started_pods_total 0\n"));
        assert!(
            !text.contains("kubelet_running_containers"),
            "labelled families appear once used"
        );
    }

    #[test]
    fn updates_by_the_agent_show_in_the_exposition() {
        let m = Metrics::new();
        m.running_pods.set(2.0);
        m.running_containers.with(["running"]).set(3.0);
        m.running_containers.with(["exited"]).set(1.0);
        m.pod_start_sli.observe(0.8);
        m.started_containers_errors_total
            .with(["container", "CreateContainerError"])
            .inc();
        let text = m.render();
        assert!(text.contains("kubelet_running_pods 2\n"));
        assert!(text.contains(
            "kubelet_running_containers{container_state=\"exited\"} 1\n\
             kubelet_running_containers{container_state=\"running\"} 3\n"
        ));
        assert!(text.contains("kubelet_pod_start_sli_duration_seconds_bucket{le=\"1\"} 1\n"));
        assert!(text.contains("kubelet_pod_start_sli_duration_seconds_sum 0.8\n"));
        assert!(text.contains(
            "kubelet_started_containers_errors_total{container_type=\"container\",code=\"CreateContainerError\"} 1\n"
        ));
    }

    #[test]
    fn every_family_is_typed_once_and_every_sample_belongs_to_a_typed_family() {
        let m = Metrics::new();
        m.pod_worker_duration.with(["sync"]).observe(0.01);
        m.restarted_pods_total.with(["true"]).inc();
        let text = m.render();
        let mut typed = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap().to_owned();
                assert!(!typed.contains(&name), "{name} typed twice");
                typed.push(name);
            } else if !line.starts_with('#') {
                let metric = line.split(['{', ' ']).next().unwrap();
                assert!(
                    typed.iter().any(|t| metric == t
                        || ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|s| metric == format!("{t}{s}"))),
                    "{line} has no TYPE"
                );
            }
        }
        assert!(typed.contains(&"process_resident_memory_bytes".to_owned()));
    }
}

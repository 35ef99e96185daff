//! The kubelet's resource endpoints: `/stats/summary` (the `stats/v1alpha1` Summary JSON that
//! `kubectl get --raw …/proxy/stats/summary` and older metrics-servers read) and
//! `/metrics/resource` (the Prometheus text metrics-server ≥ 0.6 scrapes for `kubectl top`).
//!
//! The figures come from a [`StatsProvider`] (the agent's cgroups, see `kubelet::stats`); this
//! module only holds the wire types and renders them. `/metrics/resource` is rendered from the
//! same Summary, as kubelet's `ResourceMetricsCollector` does (v1.37
//! `pkg/kubelet/metrics/collectors/resource_metrics.go`): the same names, help texts,
//! stability prefixes, label names, and a sample timestamp (milliseconds) taken from the
//! `time` of the CPU or memory figures; families sorted by name and values formatted like Go's
//! `strconv.FormatFloat(v, 'g', -1, 64)`, as the Go exposition writer does.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Where the agent's figures come from. Both read files (the full one walks the containers'
/// writable layers and the pods' volumes): call them off the async executor.
pub trait StatsProvider: Send + Sync + 'static {
    /// A fresh Summary of the node and its running pods.
    fn summary(&self) -> Result<Summary, String>;
    /// The CPU and memory figures only (kubelet's `GetCPUAndMemoryStats`: `/metrics/resource`
    /// and `/stats/summary?only_cpu_and_memory=true`), without walking any file system.
    fn cpu_and_memory(&self) -> Result<Summary, String> {
        self.summary()
    }
}

/// `stats/v1alpha1.Summary`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

/// `stats/v1alpha1.NodeStats`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(serialize_with = "meta_time")]
    pub start_time: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// `stats/v1alpha1.RuntimeStats`: the file systems holding images and container layers.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// `stats/v1alpha1.PodStats`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    #[serde(serialize_with = "meta_time")]
    pub start_time: DateTime<Utc>,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The pod's volumes that report usage (emptyDir, configMap, secret, downwardAPI,
    /// projected; not hostPath).
    #[serde(rename = "volume", skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeStats>,
    /// Its writable layers, logs and local ephemeral volumes together, on the node's fs.
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

/// `stats/v1alpha1.PodReference`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

/// `stats/v1alpha1.ContainerStats`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    #[serde(serialize_with = "meta_time")]
    pub start_time: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

/// `stats/v1alpha1.CPUStats`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    #[serde(serialize_with = "meta_time")]
    pub time: DateTime<Utc>,
    /// The rate since the previous readout of the same cgroup (absent on the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    pub usage_core_nano_seconds: u64,
}

/// `stats/v1alpha1.MemoryStats`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    #[serde(serialize_with = "meta_time")]
    pub time: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    pub usage_bytes: u64,
    pub working_set_bytes: u64,
    pub rss_bytes: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
}

/// `stats/v1alpha1.FsStats`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    #[serde(serialize_with = "meta_time")]
    pub time: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// `stats/v1alpha1.VolumeStats`: the figures of the file system holding the volume, with
/// the volume's own `usedBytes` and `inodesUsed`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct VolumeStats {
    #[serde(flatten)]
    pub fs: FsStats,
    /// The volume's name in the pod's spec.
    pub name: String,
}

/// `stats/v1alpha1.NetworkStats`: the default interface inline, and every interface.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStats {
    #[serde(serialize_with = "meta_time")]
    pub time: DateTime<Utc>,
    #[serde(flatten)]
    pub default: InterfaceStats,
    pub interfaces: Vec<InterfaceStats>,
}

/// `stats/v1alpha1.InterfaceStats`.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// `stats/v1alpha1.RlimitStats`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct RlimitStats {
    #[serde(serialize_with = "meta_time")]
    pub time: DateTime<Utc>,
    pub maxpid: u64,
    pub curproc: u64,
}

/// `stats/v1alpha1.ProcessStats`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct ProcessStats {
    pub process_count: u64,
}

/// A time as `metav1.Time` marshals it: RFC 3339, whole seconds, UTC.
fn meta_time<S: serde::Serializer>(time: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// One metric family of `/metrics/resource`.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(String, f64, Option<i64>)>,
}

impl Family {
    fn new(name: &'static str, help: &'static str, kind: &'static str) -> Self {
        Self {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }
}

/// `/metrics/resource` from a Summary, or with `scrape_error 1` when there is none.
pub fn resource_metrics(summary: Result<&Summary, &str>) -> String {
    let mut all = FAMILIES.map(|(name, help, kind)| Family::new(name, help, kind));
    let [container_cpu, container_memory, container_start, node_cpu, node_memory, pod_cpu, pod_memory, resource_scrape_error, scrape_error] =
        &mut all;
    let error = match summary {
        Err(err) => {
            tracing::error!(%err, "Error getting summary for resourceMetric prometheus endpoint");
            1.0
        }
        Ok(summary) => {
            let node = &summary.node;
            if let Some(cpu) = &node.cpu {
                node_cpu.samples.push(cpu_sample(String::new(), cpu));
            }
            if let Some(memory) = &node.memory {
                node_memory
                    .samples
                    .push(memory_sample(String::new(), memory));
            }
            for pod in &summary.pods {
                let (name, namespace) = (&pod.pod_ref.name, &pod.pod_ref.namespace);
                for c in &pod.containers {
                    let labels = format!(
                        "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
                        escape(&c.name),
                        escape(namespace),
                        escape(name)
                    );
                    let start = c.start_time.timestamp_nanos_opt().unwrap_or(0);
                    if c.start_time.timestamp() > 0 {
                        let seconds = start as f64 / 1e9;
                        container_start
                            .samples
                            .push((labels.clone(), seconds, None));
                    }
                    if let Some(cpu) = &c.cpu {
                        container_cpu.samples.push(cpu_sample(labels.clone(), cpu));
                    }
                    if let Some(memory) = &c.memory {
                        container_memory.samples.push(memory_sample(labels, memory));
                    }
                }
                let labels = format!(
                    "{{namespace=\"{}\",pod=\"{}\"}}",
                    escape(namespace),
                    escape(name)
                );
                if let Some(cpu) = &pod.cpu {
                    pod_cpu.samples.push(cpu_sample(labels.clone(), cpu));
                }
                if let Some(memory) = &pod.memory {
                    pod_memory.samples.push(memory_sample(labels, memory));
                }
            }
            0.0
        }
    };
    resource_scrape_error
        .samples
        .push((String::new(), error, None));
    scrape_error.samples.push((String::new(), error, None));

    let mut out = String::new();
    for family in &mut all {
        if family.samples.is_empty() {
            continue;
        }
        family.samples.sort_by(|a, b| a.0.cmp(&b.0));
        let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind);
        for (labels, value, at) in &family.samples {
            let _ = write!(out, "{}{labels} {}", family.name, go_float(*value));
            if let Some(at) = at {
                let _ = write!(out, " {at}");
            }
            out.push('\n');
        }
    }
    out
}

/// kubelet's resource metrics (v1.37): name, help text with its stability prefix, and type;
/// in the Go exposition's order (by name).
const FAMILIES: [(&str, &str, &str); 9] = [
    (
        "container_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        "counter",
    ),
    (
        "container_memory_working_set_bytes",
        "[STABLE] Current working set of the container in bytes",
        "gauge",
    ),
    (
        "container_start_time_seconds",
        "[STABLE] Start time of the container since unix epoch in seconds",
        "gauge",
    ),
    (
        "node_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        "counter",
    ),
    (
        "node_memory_working_set_bytes",
        "[STABLE] Current working set of the node in bytes",
        "gauge",
    ),
    (
        "pod_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
    ),
    (
        "pod_memory_working_set_bytes",
        "[STABLE] Current working set of the pod in bytes",
        "gauge",
    ),
    (
        "resource_scrape_error",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
    ),
    (
        "scrape_error",
        "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
    ),
];

fn cpu_sample(labels: String, cpu: &CpuStats) -> (String, f64, Option<i64>) {
    (
        labels,
        cpu.usage_core_nano_seconds as f64 / 1e9,
        Some(cpu.time.timestamp_millis()),
    )
}

fn memory_sample(labels: String, memory: &MemoryStats) -> (String, f64, Option<i64>) {
    (
        labels,
        memory.working_set_bytes as f64,
        Some(memory.time.timestamp_millis()),
    )
}

/// A label value escaped as the text format requires.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `value` as Go's `strconv.FormatFloat(value, 'g', -1, 64)` writes it (the Prometheus Go
/// client's format): the shortest digits that round-trip, in exponent form when the decimal
/// exponent is below -4 or at least 6 (Go's rule for the shortest form).
fn go_float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if value == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` gives the shortest round-tripping digits: "4.194304e7".
    let sci = format!("{value:e}");
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return sci;
    };
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        return format!("{value}");
    }
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(millis).unwrap()
    }

    #[test]
    fn floats_are_written_as_go_writes_them() {
        assert_eq!(go_float(10.0), "10");
        assert_eq!(go_float(1000.0), "1000");
        assert_eq!(go_float(0.0), "0");
        assert_eq!(go_float(1.0), "1");
        assert_eq!(go_float(123456.0), "123456");
        assert_eq!(go_float(1_000_000.0), "1e+06");
        assert_eq!(go_float(41_943_040.0), "4.194304e+07");
        assert_eq!(go_float(1_624_396_248.302_091_6), "1.6243962483020916e+09");
        assert_eq!(go_float(0.5), "0.5");
        assert_eq!(go_float(0.0001), "0.0001");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(12.345678), "12.345678");
    }

    fn summary() -> Summary {
        let cpu = |nanos| CpuStats {
            time: at(1_624_396_278_302),
            usage_nano_cores: None,
            usage_core_nano_seconds: nanos,
        };
        let memory = |ws| MemoryStats {
            time: at(1_624_396_278_302),
            working_set_bytes: ws,
            ..MemoryStats::default()
        };
        let container = |name: &str| ContainerStats {
            name: name.into(),
            start_time: DateTime::from_timestamp_nanos(1_624_396_248_302_091_597),
            cpu: Some(cpu(10_000_000_000)),
            memory: Some(memory(1000)),
            ..ContainerStats::default()
        };
        Summary {
            node: NodeStats {
                node_name: "n".into(),
                cpu: Some(cpu(10_000_000_000)),
                memory: Some(memory(1000)),
                ..NodeStats::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "pod_a".into(),
                    namespace: "namespace_a".into(),
                    uid: "u".into(),
                },
                containers: vec![container("container_b"), container("container_a")],
                cpu: Some(cpu(20_000_000_000)),
                memory: Some(memory(2000)),
                ..PodStats::default()
            }],
        }
    }

    /// The lines kubelet's own collector test expects for the same figures
    /// (`resource_metrics_test.go`), in the Go exposition's order.
    #[test]
    fn resource_metrics_match_kubelets_exposition() {
        let text = resource_metrics(Ok(&summary()));
        let expected = "\
# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 10 1624396278302
container_cpu_usage_seconds_total{container=\"container_b\",namespace=\"namespace_a\",pod=\"pod_a\"} 10 1624396278302
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 1000 1624396278302
container_memory_working_set_bytes{container=\"container_b\",namespace=\"namespace_a\",pod=\"pod_a\"} 1000 1624396278302
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container=\"container_a\",namespace=\"namespace_a\",pod=\"pod_a\"} 1.6243962483020916e+09
container_start_time_seconds{container=\"container_b\",namespace=\"namespace_a\",pod=\"pod_a\"} 1.6243962483020916e+09
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 10 1624396278302
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 1000 1624396278302
# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds
# TYPE pod_cpu_usage_seconds_total counter
pod_cpu_usage_seconds_total{namespace=\"namespace_a\",pod=\"pod_a\"} 20 1624396278302
# HELP pod_memory_working_set_bytes [STABLE] Current working set of the pod in bytes
# TYPE pod_memory_working_set_bytes gauge
pod_memory_working_set_bytes{namespace=\"namespace_a\",pod=\"pod_a\"} 2000 1624396278302
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE scrape_error gauge
scrape_error 0
";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_failed_readout_is_a_scrape_error_and_nothing_else() {
        let text = resource_metrics(Err("no cgroups"));
        assert!(text.contains("\nscrape_error 1\n"), "{text}");
        assert!(text.contains("\nresource_scrape_error 1\n"), "{text}");
        assert!(!text.contains("node_cpu"), "{text}");
    }

    #[test]
    fn summary_json_has_kubelets_field_names() {
        let mut s = summary();
        s.pods[0].ephemeral_storage = Some(FsStats::default());
        s.pods[0].network = Some(NetworkStats {
            default: InterfaceStats {
                name: "eth0".into(),
                rx_bytes: 5,
                ..InterfaceStats::default()
            },
            ..NetworkStats::default()
        });
        let json = serde_json::to_value(&s).unwrap();
        let pod = &json["pods"][0];
        assert_eq!(pod["podRef"]["namespace"], "namespace_a");
        assert_eq!(pod["network"]["name"], "eth0");
        assert_eq!(pod["network"]["rxBytes"], 5);
        assert!(pod.get("ephemeral-storage").is_some());
        let container = &pod["containers"][0];
        assert_eq!(container["cpu"]["usageCoreNanoSeconds"], 10_000_000_000u64);
        assert_eq!(container["memory"]["workingSetBytes"], 1000);
        assert_eq!(container["startTime"], "2021-06-22T21:10:48Z");
        assert_eq!(json["node"]["nodeName"], "n");
        assert!(container.get("rootfs").is_none());
        assert!(pod.get("volume").is_none(), "omitted when empty: {pod}");

        s.pods[0].volumes.push(VolumeStats {
            fs: FsStats {
                time: at(1_624_396_278_302),
                capacity_bytes: Some(100),
                used_bytes: Some(40),
                inodes_used: Some(3),
                ..FsStats::default()
            },
            name: "data".into(),
        });
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["pods"][0]["volume"],
            serde_json::json!([{
                "time": "2021-06-22T21:11:18Z",
                "capacityBytes": 100,
                "usedBytes": 40,
                "inodesUsed": 3,
                "name": "data",
            }])
        );
    }
}

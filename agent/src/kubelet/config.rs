//! [`KubeletConfig`]: the settings of `ironlet run`, each field named and defaulted after
//! the kubelet flag or `KubeletConfiguration` field it mirrors.

use std::path::PathBuf;
use std::time::Duration;

use ironlet_cgroups::CgroupOptions;

/// Settings of the node agent.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// `--node-name` / `--hostname-override`; default: the host name.
    pub node_name: String,
    /// `--root-dir`: the data root (images, pods, state).
    pub root_dir: PathBuf,
    /// Where pod logs go (kubelet: `/var/log/pods`).
    pub pod_log_dir: PathBuf,
    /// `--pod-manifest-path` (alias `--manifests`): static pods.
    pub manifest_path: Option<PathBuf>,
    /// `--manifest-url`: static pods from a URL.
    pub manifest_url: Option<String>,
    /// `--file-check-frequency` (kubelet default 20 s); inotify makes changes immediate.
    pub file_check_frequency: Duration,
    /// `--http-check-frequency` (kubelet default 20 s).
    pub http_check_frequency: Duration,
    /// `--sync-frequency` (kubelet default 1 min).
    pub sync_frequency: Duration,
    /// PLEG relist period (ironlet's safety net; events are the primary path).
    pub pleg_relist_period: Duration,
    /// `--max-pods` (kubelet default 110).
    pub max_pods: u64,
    /// `--system-reserved` + `--kube-reserved` CPU, millicores (kubelet default none).
    pub reserved_cpu_milli: u64,
    /// `--system-reserved` + `--kube-reserved` memory, bytes (kubelet default none).
    pub reserved_memory_bytes: u64,
    /// `--cgroup-root`-relative name of the pods' tree (kubelet: `kubepods`).
    pub cgroup_root: String,
    /// CFS quota, period and pod pids limit (kubelet `cpuCFSQuota`, `podPidsLimit`).
    pub cgroup_options: CgroupOptions,
    /// `--cgroup-favor-dynmods`: remount cgroup2 with `favordynmods` at start (root only).
    pub cgroup_favor_dynmods: bool,
    /// `--seccomp-default`: RuntimeDefault for containers that name no profile
    /// (kubelet default false: Unconfined).
    pub seccomp_default: bool,
    /// Container garbage collection (kubelet `--minimum-container-ttl-duration`,
    /// `--maximum-dead-containers-per-container`, `--maximum-dead-containers`).
    pub gc_policy: super::container_gc::GcPolicy,
    /// Cap of the crash-loop back-off (KubeletConfiguration
    /// `crashLoopBackOff.maxContainerRestartPeriod`, default 300 s); the first back-off is
    /// 10 s or this cap if smaller.
    pub max_container_restart_period: Duration,
    /// How often housekeeping runs (kubelet: every 2 s).
    pub housekeeping_period: Duration,
    /// How often emptyDir usage and the node-pressure signals are checked (kubelet's
    /// `evictionMonitoringPeriod` is 10 s; ironlet checks faster).
    pub eviction_monitoring_period: Duration,
    /// Node-pressure eviction: `--eviction-hard`, `--eviction-soft`, … (kubelet defaults).
    pub eviction: super::eviction::thresholds::EvictionSettings,
    /// Node labels admission matches nodeSelector against (besides the well-known ones).
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// `--cluster-dns`: the cluster DNS server IPs for `ClusterFirst` pods (none: pods
    /// fall back to `Default`, as kubelet's do).
    pub cluster_dns: Vec<String>,
    /// `--cluster-domain`: the cluster's DNS domain (kubelet default: none).
    pub cluster_domain: String,
    /// `--resolv-conf`: the resolver file `Default` pods get (kubelet default
    /// `/etc/resolv.conf`; empty: none).
    pub resolv_conf: PathBuf,
    /// The sysctls pods may set: kubelet's safe ones plus `--allowed-unsafe-sysctls`
    /// (kubelet default: none unsafe).
    pub allowed_sysctls: crate::admission::SysctlAllowlist,
    /// Image garbage collection (kubelet `--image-gc-high-threshold`,
    /// `--image-gc-low-threshold`, `--image-minimum-gc-age`, `--image-maximum-gc-age`).
    pub image_gc_policy: super::image_gc::ImageGcPolicy,
    /// How often image GC runs (kubelet: every 5 min).
    pub image_gc_period: Duration,
    /// Image pulls at once node-wide: `None`, no limit (kubelet `serializeImagePulls=false`
    /// without `maxParallelImagePulls`); `Some(1)`, serialized.
    pub max_parallel_image_pulls: Option<usize>,
    /// Graceful node shutdown's grace periods (`--shutdown-grace-period`, …); off by default.
    pub shutdown: super::node_shutdown::ShutdownSettings,
}

impl KubeletConfig {
    /// Defaults for a node named `node_name` with data under `root_dir`.
    pub fn new(node_name: impl Into<String>, root_dir: impl Into<PathBuf>) -> Self {
        Self {
            node_name: node_name.into(),
            root_dir: root_dir.into(),
            pod_log_dir: PathBuf::from("/var/log/pods"),
            manifest_path: None,
            manifest_url: None,
            file_check_frequency: Duration::from_secs(20),
            http_check_frequency: Duration::from_secs(20),
            sync_frequency: Duration::from_secs(60),
            pleg_relist_period: Duration::from_secs(60),
            max_pods: 110,
            reserved_cpu_milli: 0,
            reserved_memory_bytes: 0,
            cgroup_root: "kubepods".into(),
            cgroup_options: CgroupOptions::default(),
            seccomp_default: false,
            cgroup_favor_dynmods: true,
            gc_policy: super::container_gc::GcPolicy::default(),
            max_container_restart_period: Duration::from_secs(300),
            housekeeping_period: Duration::from_secs(2),
            eviction_monitoring_period: Duration::from_secs(2),
            eviction: Default::default(),
            node_labels: Default::default(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            allowed_sysctls: crate::admission::SysctlAllowlist::default(),
            image_gc_policy: super::image_gc::ImageGcPolicy::default(),
            image_gc_period: super::image_gc::IMAGE_GC_PERIOD,
            max_parallel_image_pulls: None,
            shutdown: Default::default(),
        }
    }

    /// `<root>/pods`: per-pod volumes and termination-message files.
    pub fn pods_dir(&self) -> PathBuf {
        self.root_dir.join("pods")
    }

    /// `<root>/images`: the image store, whose file system is the image file system.
    pub fn images_dir(&self) -> PathBuf {
        self.root_dir.join("images")
    }

    /// `<root>/ironlet.sock`: the local inspection socket.
    pub fn socket_path(&self) -> PathBuf {
        self.root_dir.join("ironlet.sock")
    }

    /// The log directory of one pod: `<pod_log_dir>/<ns>_<name>_<uid>` (kubelet's layout).
    pub fn pod_log_directory(&self, namespace: &str, name: &str, uid: &str) -> PathBuf {
        self.pod_log_dir.join(format!("{namespace}_{name}_{uid}"))
    }
}

pub use ironlet_runtime::duration::parse_duration;

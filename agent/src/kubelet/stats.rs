//! The agent's [`StatsProvider`]: the Summary behind `/stats/summary` and `/metrics/resource`,
//! read when asked (no background housekeeping), from:
//!
//! | Summary field                          | source                                                    |
//! |----------------------------------------|-----------------------------------------------------------|
//! | node `cpu`, `memory`                   | `ironlet_cgroups::MachineUsage` (`/proc/stat`, `/proc/meminfo`, `/proc/vmstat`) |
//! | node `fs`, `runtime.imageFs`           | `statvfs` of `--root-dir` (images live under it)          |
//! | node `network`                         | `/proc/net/dev` of the agent (the host's namespace)       |
//! | node `rlimit`                          | `/proc/sys/kernel/pid_max`, `sysinfo(2)` procs            |
//! | pod `cpu`, `memory`, `process_stats`   | the pod cgroup (`Hierarchy::usage`, `processes`)          |
//! | pod `network`                          | `/proc/<pid>/net/dev` of a process of the pod             |
//! | container `cpu`, `memory`              | the container cgroup `<pod cgroup>/<container id>`        |
//! | container `logs`                       | sizes of `<pod-log-dir>/<ns>_<pod>_<uid>/<container>/*`   |
//! | container `rootfs`                     | the runtime's writable layer (`du`), on the imageFs       |
//! | pod `volume`                           | `du` of `<root-dir>/pods/<uid>/volumes/<plugin>/<name>` (emptyDir, configMap, secret, downwardAPI, projected), `statvfs` of it |
//! | pod `ephemeral-storage`                | Σ rootfs + logs + local ephemeral volumes (disk emptyDir, configMap), on the node's fs |
//!
//! Pods are those with a running container; containers those running. `usageNanoCores` is the
//! rate since the previous readout of the same cgroup (kept here for 5 minutes, absent on the
//! first one). [`StatsProvider::cpu_and_memory`] leaves out everything but the CPU and
//! memory figures, and so walks no file system.
//! Without cgroups (rootless) the pods have no cpu/memory figures.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use ironlet_cgroups::{CgroupPath, CgroupUsage, MachineUsage, NodeCgroups};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus, Volume};

use ironlet_runtime::fsutil::DiskUsage;
use ironlet_runtime::types::ContainerId;
use ironlet_runtime::Runtime;

use super::status_store::StatusStore;
use crate::server::kubelet_api::stats::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, NodeStats,
    PodReference, PodStats, ProcessStats, RlimitStats, RuntimeStats, StatsProvider, Summary,
    VolumeStats,
};
use crate::volumes::VolumePlugin;

/// Reads the Summary for the kubelet API.
pub struct KubeletStats {
    pub(super) node_name: String,
    pub(super) root_dir: PathBuf,
    pub(super) pod_log_dir: PathBuf,
    /// `<root-dir>/pods`, where the pods' volumes are.
    pub(super) pods_dir: PathBuf,
    /// The containers' writable layers.
    pub(super) runtime: Arc<dyn Runtime>,
    pub(super) cgroups: Option<NodeCgroups>,
    pub(super) statuses: Arc<StatusStore>,
    /// The previous CPU readout per cgroup: (time, cumulative nanoseconds).
    pub(super) previous_cpu: Mutex<HashMap<String, (DateTime<Utc>, u64)>>,
}

impl StatsProvider for KubeletStats {
    fn summary(&self) -> Result<Summary, String> {
        self.read(true)
    }

    fn cpu_and_memory(&self) -> Result<Summary, String> {
        self.read(false)
    }
}

impl KubeletStats {
    /// The Summary; without its file systems, network and process figures unless `full`.
    fn read(&self, full: bool) -> Result<Summary, String> {
        let now = Utc::now();
        let machine = MachineUsage::read().map_err(|e| format!("reading the node's usage: {e}"))?;
        let root_fs = full.then(|| fs_stats(&self.root_dir, now, None)).flatten();
        let mut node = NodeStats {
            node_name: self.node_name.clone(),
            start_time: boot_time().unwrap_or(now),
            cpu: Some(self.cpu("/", machine.cpu_usage_nanos, now)),
            memory: Some(MemoryStats {
                time: now,
                available_bytes: Some(machine.memory_available_bytes),
                usage_bytes: machine.memory_usage_bytes,
                working_set_bytes: machine.memory_working_set_bytes,
                rss_bytes: machine.memory_rss_bytes,
                page_faults: machine.page_faults,
                major_page_faults: machine.major_page_faults,
            }),
            network: std::fs::read_to_string("/proc/net/dev")
                .ok()
                .and_then(|text| network_stats(&text, now)),
            fs: root_fs,
            runtime: Some(RuntimeStats {
                image_fs: root_fs,
                container_fs: root_fs,
            }),
            rlimit: Some(rlimit(now)),
        };
        if !full {
            (node.network, node.runtime, node.rlimit) = (None, None, None);
        }
        // Shared pods, not copies (`pods()` would copy every pod at each eviction check).
        let pods = self
            .statuses
            .statuses()
            .iter()
            .filter_map(|(pod, status)| self.pod_stats(pod, status, now, full, root_fs))
            .collect();
        // Forget the cgroups of pods gone for a while (the map would grow with every pod).
        let stale = now - chrono::Duration::minutes(5);
        self.previous_cpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, (at, _)| *at >= stale);
        Ok(Summary { node, pods })
    }

    fn cpu(&self, key: &str, nanos: u64, now: DateTime<Utc>) -> CpuStats {
        let mut previous = self.previous_cpu.lock().unwrap_or_else(|p| p.into_inner());
        let rate = previous.get(key).and_then(|(at, before)| {
            let elapsed = (now - *at).num_nanoseconds().filter(|n| *n > 0)?;
            let used = nanos.checked_sub(*before)?;
            Some((used as u128 * 1_000_000_000 / elapsed as u128) as u64)
        });
        previous.insert(key.to_owned(), (now, nanos));
        CpuStats {
            time: now,
            usage_nano_cores: rate,
            usage_core_nano_seconds: nanos,
        }
    }

    fn usage(&self, path: &CgroupPath, now: DateTime<Utc>) -> Option<(CpuStats, MemoryStats)> {
        let usage: CgroupUsage = self.cgroups.as_ref()?.hierarchy().usage(path).ok()?;
        let memory = MemoryStats {
            time: now,
            available_bytes: None,
            usage_bytes: usage.memory_usage_bytes,
            working_set_bytes: usage.memory_working_set_bytes,
            rss_bytes: usage.memory_rss_bytes,
            page_faults: usage.page_faults,
            major_page_faults: usage.major_page_faults,
        };
        Some((self.cpu(path.as_str(), usage.cpu_usage_nanos, now), memory))
    }

    /// A pod's figures, with its file systems (on `root_fs`, the node's), network and
    /// processes if `full`.
    fn pod_stats(
        &self,
        pod: &Pod,
        status: &PodStatus,
        now: DateTime<Utc>,
        full: bool,
        root_fs: Option<FsStats>,
    ) -> Option<PodStats> {
        let running: Vec<&ContainerStatus> = status
            .container_statuses
            .iter()
            .flatten()
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .collect();
        if running.is_empty() {
            return None;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let uid = crate::config::pod_uid(pod).to_owned();
        let pod_cgroup = self.cgroups.as_ref().and_then(|cgroups| {
            let qos = crate::qos::pod_resources(pod).ok()?.qos();
            cgroups.pod_path(qos, &uid).ok()
        });
        let log_dir = self.pod_log_dir.join(format!("{namespace}_{name}_{uid}"));
        let log_fs = full
            .then(|| fs_stats(&self.pod_log_dir, now, Some(0)))
            .flatten();
        let mut containers = Vec::new();
        for c in &running {
            let started = c
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.as_ref())
                .and_then(|t| to_chrono(&t.0))
                .unwrap_or(now);
            let id = c
                .container_id
                .as_deref()
                .and_then(|id| id.split_once("://"))
                .and_then(|(_, id)| ContainerId::parse(id));
            let usage = pod_cgroup.as_ref().and_then(|pod_path| {
                let path = self
                    .cgroups
                    .as_ref()?
                    .container_path(pod_path, id.as_ref()?.as_str())
                    .ok()?;
                self.usage(&path, now)
            });
            let logs = log_fs.map(|fs| FsStats {
                used_bytes: Some(dir_size(&log_dir.join(&c.name))),
                ..fs
            });
            let rootfs = id
                .as_ref()
                .filter(|_| full)
                .and_then(|id| self.runtime.writable_layer_usage(id))
                .map(|layer| used_on(root_fs, layer, now));
            containers.push(ContainerStats {
                name: c.name.clone(),
                start_time: started,
                cpu: usage.map(|u| u.0),
                memory: usage.map(|u| u.1),
                rootfs,
                logs,
            });
        }
        containers.sort_by(|a, b| a.name.cmp(&b.name));
        let volumes = if full {
            self.volume_stats(pod, &uid, now)
        } else {
            Vec::new()
        };
        let ephemeral_storage =
            full.then(|| ephemeral_storage(pod, &containers, &volumes, root_fs, now));
        let pod_usage = pod_cgroup.as_ref().and_then(|p| self.usage(p, now));
        let processes = pod_cgroup
            .as_ref()
            .filter(|_| full)
            .and_then(|p| self.cgroups.as_ref()?.hierarchy().processes(p).ok())
            .unwrap_or_default();
        let network = processes.iter().find_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
            network_stats(&text, now)
        });
        Some(PodStats {
            pod_ref: PodReference {
                name,
                namespace,
                uid,
            },
            start_time: status
                .start_time
                .as_ref()
                .and_then(|t| to_chrono(&t.0))
                .unwrap_or(now),
            containers,
            cpu: pod_usage.map(|u| u.0),
            memory: pod_usage.map(|u| u.1),
            network,
            volumes,
            ephemeral_storage,
            process_stats: (full && pod_cgroup.is_some()).then_some(ProcessStats {
                process_count: processes.len() as u64,
            }),
        })
    }

    /// The pod's volumes that report usage (kubelet's `MetricsDu` ones: not hostPath), as
    /// set up under `<root-dir>/pods/<uid>/volumes`; those not (yet) there are left out.
    fn volume_stats(&self, pod: &Pod, uid: &str, now: DateTime<Utc>) -> Vec<VolumeStats> {
        let volumes_dir = self.pods_dir.join(uid).join("volumes");
        let mut stats: Vec<VolumeStats> = pod
            .spec
            .iter()
            .flat_map(|spec| spec.volumes.iter().flatten())
            .filter_map(|volume| {
                let plugin = measured_plugin(volume)?;
                let path = volumes_dir.join(plugin.dir_name()).join(&volume.name);
                if !path.is_dir() {
                    return None;
                }
                let usage = ironlet_runtime::fsutil::disk_usage_and_inodes(&path);
                Some(VolumeStats {
                    fs: used_on(fs_stats(&path, now, None), usage, now),
                    name: volume.name.clone(),
                })
            })
            .collect();
        stats.sort_by(|a, b| a.name.cmp(&b.name));
        stats
    }
}

/// The plugin of a volume whose usage is measured, kubelet's `MetricsDu` volumes.
fn measured_plugin(volume: &Volume) -> Option<VolumePlugin> {
    if volume.empty_dir.is_some() {
        Some(VolumePlugin::EmptyDir)
    } else if volume.config_map.is_some() {
        Some(VolumePlugin::ConfigMap)
    } else if volume.secret.is_some() {
        Some(VolumePlugin::Secret)
    } else if volume.downward_api.is_some() {
        Some(VolumePlugin::DownwardApi)
    } else if volume.projected.is_some() {
        Some(VolumePlugin::Projected)
    } else {
        None
    }
}

/// kubelet's `IsLocalEphemeralVolume`: an emptyDir on the node's disk, or a configMap (the
/// others are on tmpfs, counted as memory).
fn is_local_ephemeral(volume: &Volume) -> bool {
    volume
        .empty_dir
        .as_ref()
        .is_some_and(|e| e.medium.as_deref().unwrap_or("").is_empty())
        || volume.config_map.is_some()
}

/// `usage` with the figures of the file system it is on (`fs`).
fn used_on(fs: Option<FsStats>, usage: DiskUsage, now: DateTime<Utc>) -> FsStats {
    FsStats {
        used_bytes: Some(usage.used_bytes),
        inodes_used: Some(usage.inodes_used),
        ..fs.unwrap_or(FsStats {
            time: now,
            ..FsStats::default()
        })
    }
}

/// kubelet's `calcEphemeralStorage`: the node fs's figures, with the pod's use of it: its
/// containers' writable layers and logs, and its local ephemeral volumes.
fn ephemeral_storage(
    pod: &Pod,
    containers: &[ContainerStats],
    volumes: &[VolumeStats],
    root_fs: Option<FsStats>,
    now: DateTime<Utc>,
) -> FsStats {
    let local: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .filter(|v| is_local_ephemeral(v))
        .map(|v| v.name.as_str())
        .collect();
    let mut total = DiskUsage::default();
    let parts = containers
        .iter()
        .flat_map(|c| [c.rootfs, c.logs])
        .chain(
            volumes
                .iter()
                .filter(|v| local.contains(&v.name.as_str()))
                .map(|v| Some(v.fs)),
        )
        .flatten();
    for part in parts {
        total.used_bytes += part.used_bytes.unwrap_or(0);
        total.inodes_used += part.inodes_used.unwrap_or(0);
    }
    used_on(root_fs, total, now)
}

/// `statvfs` of the file system holding `dir`; `used` overrides the file system's used bytes
/// (a directory's share of it).
fn fs_stats(dir: &Path, now: DateTime<Utc>, used: Option<u64>) -> Option<FsStats> {
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    let fragment = stat.fragment_size() as u64;
    let capacity = (stat.blocks() as u64).saturating_mul(fragment);
    let free = (stat.blocks_free() as u64).saturating_mul(fragment);
    let inodes = stat.files() as u64;
    let inodes_free = stat.files_free() as u64;
    Some(FsStats {
        time: now,
        available_bytes: Some((stat.blocks_available() as u64).saturating_mul(fragment)),
        capacity_bytes: Some(capacity),
        used_bytes: Some(used.unwrap_or(capacity.saturating_sub(free))),
        inodes_free: Some(inodes_free),
        inodes: Some(inodes),
        inodes_used: Some(inodes.saturating_sub(inodes_free)),
    })
}

/// The bytes of the regular files directly in `dir` (a container's log files).
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// `/proc/net/dev` as NetworkStats: every interface but `lo`; the default one is `eth0` when
/// present (kubelet's default interface name), else the first.
pub(crate) fn network_stats(text: &str, now: DateTime<Utc>) -> Option<NetworkStats> {
    let interfaces: Vec<InterfaceStats> = text
        .lines()
        .skip(2)
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let name = name.trim();
            let fields: Vec<u64> = counters
                .split_whitespace()
                .map(|f| f.parse().ok())
                .collect::<Option<_>>()?;
            // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes packets errs …
            (name != "lo" && fields.len() >= 11).then(|| InterfaceStats {
                name: name.to_owned(),
                rx_bytes: fields[0],
                rx_errors: fields[2],
                tx_bytes: fields[8],
                tx_errors: fields[10],
            })
        })
        .collect();
    let default = interfaces
        .iter()
        .find(|i| i.name == "eth0")
        .or(interfaces.first())?
        .clone();
    Some(NetworkStats {
        time: now,
        default,
        interfaces,
    })
}

fn rlimit(now: DateTime<Utc>) -> RlimitStats {
    let maxpid = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    let curproc = nix::sys::sysinfo::sysinfo()
        .map(|info| u64::from(info.process_count()))
        .unwrap_or(0);
    RlimitStats {
        time: now,
        maxpid,
        curproc,
    }
}

/// A `metav1.Time` (jiff) as chrono's.
fn to_chrono(time: &k8s_openapi::jiff::Timestamp) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(
        time.as_second(),
        u32::try_from(time.subsec_nanosecond()).ok()?,
    )
}

/// The machine's boot time (`btime` of `/proc/stat`): the node's `startTime`.
fn boot_time() -> Option<DateTime<Utc>> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let seconds = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    DateTime::from_timestamp(seconds, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  123456     100    0    0    0     0          0         0   123456     100    0    0    0     0       0          0
  eth0: 9876543    2000    3    0    0     0          0         0  1234567    1500    4    0    0     0       0          0
  veth1:     10       1    0    0    0     0          0         0       20       2    0    0    0     0       0          0
";

    #[test]
    fn net_dev_skips_lo_and_defaults_to_eth0() {
        let stats = network_stats(NET_DEV, Utc::now()).unwrap();
        assert_eq!(
            stats.default,
            InterfaceStats {
                name: "eth0".into(),
                rx_bytes: 9_876_543,
                rx_errors: 3,
                tx_bytes: 1_234_567,
                tx_errors: 4,
            }
        );
        let names: Vec<_> = stats.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["eth0", "veth1"]);
        assert!(network_stats(
            "header\nheader\n    lo: 1 2 3 4 5 6 7 8 9 10 11\n",
            Utc::now()
        )
        .is_none());
        assert!(network_stats("h\nh\n eth0: garbage\n", Utc::now()).is_none());
    }

    fn without_pods() -> KubeletStats {
        KubeletStats {
            node_name: "n".into(),
            root_dir: "/".into(),
            pod_log_dir: "/".into(),
            pods_dir: "/nonexistent-ironlet-stats".into(),
            runtime: Arc::new(crate::testing::StaticRuntime),
            cgroups: None,
            statuses: Arc::new(StatusStore::load(Path::new("/nonexistent-ironlet-stats"))),
            previous_cpu: Mutex::default(),
        }
    }

    #[test]
    fn a_summary_has_the_node_figures_and_forgets_stale_cgroups() {
        let stats = without_pods();
        let long_ago = Utc::now() - chrono::Duration::minutes(10);
        stats
            .previous_cpu
            .lock()
            .unwrap()
            .insert("/kubepods/podgone".into(), (long_ago, 1));
        let summary = stats.summary().unwrap();
        let node = &summary.node;
        assert_eq!(node.node_name, "n");
        assert!(node.cpu.unwrap().usage_core_nano_seconds > 0);
        let memory = node.memory.unwrap();
        assert!(memory.working_set_bytes > 0 && memory.working_set_bytes <= memory.usage_bytes);
        assert!(node.fs.unwrap().capacity_bytes.unwrap() > 0);
        assert!(node.rlimit.unwrap().maxpid > 0);
        assert!(node.start_time < Utc::now());
        assert!(summary.pods.is_empty());
        let previous = stats.previous_cpu.lock().unwrap();
        assert!(previous.contains_key("/") && !previous.contains_key("/kubepods/podgone"));
    }

    #[test]
    fn the_cpu_rate_comes_from_the_previous_readout() {
        let stats = without_pods();
        let t0 = Utc::now();
        assert_eq!(stats.cpu("/", 1_000, t0).usage_nano_cores, None);
        let t1 = t0 + chrono::Duration::seconds(2);
        // One core-second in two seconds: half a core.
        let later = stats.cpu("/", 1_000 + 1_000_000_000, t1);
        assert_eq!(later.usage_nano_cores, Some(500_000_000));
        assert_eq!(later.usage_core_nano_seconds, 1_000_001_000);
    }

    #[test]
    fn volumes_are_measured_and_local_ephemeral_ones_count_for_the_pod() {
        let tmp = tempfile::tempdir().unwrap();
        let mut stats = without_pods();
        stats.pods_dir = tmp.path().into();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory"}},
                {"name": "cfg", "configMap": {"name": "c"}},
                {"name": "sec", "secret": {"secretName": "s"}},
                {"name": "host", "hostPath": {"path": "/"}},
            ]},
        }))
        .unwrap();
        let volumes = tmp.path().join("u/volumes");
        for (dir, file, size) in [
            ("kubernetes.io~empty-dir/data", "f", 64 * 1024),
            ("kubernetes.io~empty-dir/mem", "f", 8 * 1024),
            ("kubernetes.io~configmap/cfg", "key", 4 * 1024),
        ] {
            std::fs::create_dir_all(volumes.join(dir)).unwrap();
            std::fs::write(volumes.join(dir).join(file), vec![1u8; size]).unwrap();
        }
        let now = Utc::now();
        let measured = stats.volume_stats(&pod, "u", now);
        // The secret was not set up and the hostPath is not measured.
        let names: Vec<_> = measured.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["cfg", "data", "mem"]);
        let data = &measured[1].fs;
        assert!(data.used_bytes.unwrap() >= 64 * 1024, "{data:?}");
        assert_eq!(data.inodes_used, Some(2));
        assert!(data.capacity_bytes.unwrap() > 0, "{data:?}");

        let containers = [ContainerStats {
            rootfs: Some(FsStats {
                used_bytes: Some(1000),
                inodes_used: Some(10),
                ..FsStats::default()
            }),
            logs: Some(FsStats {
                used_bytes: Some(20),
                ..FsStats::default()
            }),
            ..ContainerStats::default()
        }];
        let total = ephemeral_storage(&pod, &containers, &measured, None, now);
        let cfg = measured[0].fs;
        // The Memory emptyDir is not the node's disk.
        assert_eq!(
            total.used_bytes,
            Some(1020 + data.used_bytes.unwrap() + cfg.used_bytes.unwrap())
        );
        assert_eq!(total.inodes_used, Some(10 + 2 + 2));
    }
}

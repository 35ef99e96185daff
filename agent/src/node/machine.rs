//! [`MachineStatus`]: the [`NodeStatusProvider`] that reads this machine.
//!
//! | field                           | source                                                   |
//! |---------------------------------|----------------------------------------------------------|
//! | capacity `cpu`, `memory`        | `ironlet_cgroups::NodeCapacity` (root cpuset, MemTotal)  |
//! | capacity `pods`                 | [`MachineConfig::max_pods`] (kubelet `maxPods`, 110)     |
//! | capacity `ephemeral-storage`    | `statvfs` of the data root: blocks × fragment size       |
//! | allocatable                     | capacity − reserved − hard eviction thresholds           |
//! | `InternalIP`                    | [`MachineConfig::node_ip`], else the source address of   |
//! |                                 | the default route (no packet is sent)                    |
//! | `Hostname`                      | the node name                                            |
//! | nodeInfo                        | uname, `/etc/os-release`, machine-id, boot_id, DMI uuid  |
//! | MemoryPressure / DiskPressure / PIDPressure | the eviction manager's conditions ([`MachineStatus::with_pressure`]; none without it) |
//! | images                          | [`MachineStatus::with_images`]: the agent's image list   |
//! | Ready                           | False ("node is shutting down") during a graceful node shutdown ([`MachineStatus::with_shutdown`]) |
//!
//! Allocatable follows kubelet's node allocatable: `memory` − reserved − `memory.available`
//! threshold (100Mi), `ephemeral-storage` − reserved − `nodefs.available` threshold (10 %),
//! `cpu` − reserved.
//!
//! Current behaviour: no hugepages resources.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};

use ironlet_cgroups::{Hierarchy, NodeCapacity};
use k8s_openapi::api::core::v1::{ContainerImage, NodeAddress, NodeSystemInfo};

use super::config::hostname;
use super::object::{cpu_quantity, go_arch, integer_quantity, memory_quantity};
use super::provider::{NodeResources, NodeStatusProvider, Pressure, ProviderError, Readiness};

/// Resources kept away from pods (kubelet's `kubeReserved` + `systemReserved`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Millicores.
    pub cpu_milli: u64,
    /// Bytes.
    pub memory_bytes: u64,
    /// Bytes of the data root's filesystem.
    pub ephemeral_storage_bytes: u64,
}

/// What [`MachineStatus`] cannot read from the machine. Defaults are kubelet's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineConfig {
    /// The `Hostname` address. kubelet: the node name (the lower-cased hostname).
    pub node_name: String,
    /// The `InternalIP`. kubelet `--node-ip`; none: the default route's source address.
    pub node_ip: Option<IpAddr>,
    /// Where `ephemeral-storage` is measured. kubelet `--root-dir` (`/var/lib/kubelet`);
    /// ironlet's data root, `/var/lib/ironlet`.
    pub root_dir: PathBuf,
    /// Capacity `pods`. kubelet `maxPods`: 110.
    pub max_pods: u64,
    /// kubelet `kubeReserved` + `systemReserved`: none.
    pub reserved: Reserved,
    /// kubelet `evictionHard` `memory.available`: 100Mi.
    pub eviction_hard_memory_bytes: u64,
    /// kubelet `evictionHard` `nodefs.available`: 10 (percent).
    pub eviction_hard_nodefs_percent: u64,
    /// `nodeInfo.kubeletVersion`: `ironlet/<version>` (kubelet writes its `v1.X.Y`). The
    /// apiserver does not validate it and no control-plane component of v1.37 parses it
    /// (only `kubectl get nodes` shows it, and kubeadm upgrade reads it), so it need not
    /// look like a Kubernetes version.
    pub kubelet_version: String,
    /// `nodeInfo.containerRuntimeVersion`: `ironlet://<version>` (CRI's `<runtime>://<version>`).
    pub container_runtime_version: String,
    /// `daemonEndpoints.kubeletEndpoint.Port`: where the kubelet API listens (kubelet
    /// `--port`, 10250); none when it is not served.
    pub kubelet_port: Option<u16>,
}

impl Default for MachineConfig {
    fn default() -> Self {
        let version = env!("CARGO_PKG_VERSION");
        Self {
            node_name: hostname(),
            node_ip: None,
            kubelet_port: None,
            root_dir: PathBuf::from("/var/lib/ironlet"),
            max_pods: 110,
            reserved: Reserved::default(),
            eviction_hard_memory_bytes: 100 << 20,
            eviction_hard_nodefs_percent: 10,
            kubelet_version: format!("ironlet/{version}"),
            container_runtime_version: format!("ironlet://{version}"),
        }
    }
}

/// The node's images for `status.images`, as the agent's image manager lists them.
pub type ImageList = std::sync::Arc<dyn Fn() -> Vec<ContainerImage> + Send + Sync>;

/// Reads capacity, addresses, system info and pressure from this machine.
pub struct MachineStatus {
    config: MachineConfig,
    hierarchy: Hierarchy,
    system_info: NodeSystemInfo,
    images: Option<ImageList>,
    pressure: Option<tokio::sync::watch::Receiver<Pressure>>,
    shutting_down: Option<tokio::sync::watch::Receiver<bool>>,
}

impl std::fmt::Debug for MachineStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineStatus")
            .field("config", &self.config)
            .field("system_info", &self.system_info)
            .finish_non_exhaustive()
    }
}

impl MachineStatus {
    /// Finds the cgroup hierarchy and reads the static system info once.
    pub fn new(config: MachineConfig) -> Result<Self, ProviderError> {
        let hierarchy = Hierarchy::detect().map_err(ProviderError::Capacity)?;
        let system_info = system_info(&config);
        Ok(Self {
            config,
            hierarchy,
            system_info,
            images: None,
            pressure: None,
            shutting_down: None,
        })
    }

    /// Reports `status.images` from `images` (kubelet's image cache, largest first).
    pub fn with_images(mut self, images: ImageList) -> Self {
        self.images = Some(images);
        self
    }

    /// Reports the pressure conditions the eviction manager decides
    /// (`ironlet::kubelet::Kubelet::pressure`).
    #[must_use]
    pub fn with_pressure(mut self, pressure: tokio::sync::watch::Receiver<Pressure>) -> Self {
        self.pressure = Some(pressure);
        self
    }

    /// Reports `Ready=False` ("node is shutting down") while `shutting_down` reads true
    /// (graceful node shutdown: `ironlet::kubelet::Kubelet::node_shutdown`).
    #[must_use]
    pub fn with_shutdown(mut self, shutting_down: tokio::sync::watch::Receiver<bool>) -> Self {
        self.shutting_down = Some(shutting_down);
        self
    }

    fn filesystem(&self) -> Result<Filesystem, ProviderError> {
        Filesystem::of(&self.config.root_dir)
    }
}

impl NodeStatusProvider for MachineStatus {
    fn resources(&self) -> Result<NodeResources, ProviderError> {
        let capacity = NodeCapacity::read(&self.hierarchy).map_err(ProviderError::Capacity)?;
        let fs = self.filesystem()?;
        let config = &self.config;
        let reserved = config.reserved;
        let nodefs_threshold = fs.total_bytes / 100 * config.eviction_hard_nodefs_percent;
        let mut resources = NodeResources::default();
        for (map, cpu, memory, storage) in [
            (
                &mut resources.capacity,
                capacity.cpu_milli,
                capacity.memory_bytes,
                fs.total_bytes,
            ),
            (
                &mut resources.allocatable,
                capacity.cpu_milli.saturating_sub(reserved.cpu_milli),
                capacity
                    .memory_bytes
                    .saturating_sub(reserved.memory_bytes)
                    .saturating_sub(config.eviction_hard_memory_bytes),
                fs.total_bytes
                    .saturating_sub(reserved.ephemeral_storage_bytes)
                    .saturating_sub(nodefs_threshold),
            ),
        ] {
            map.insert("cpu".to_owned(), cpu_quantity(cpu));
            map.insert("memory".to_owned(), memory_quantity(memory));
            map.insert("ephemeral-storage".to_owned(), memory_quantity(storage));
            map.insert("pods".to_owned(), integer_quantity(config.max_pods));
        }
        Ok(resources)
    }

    fn addresses(&self) -> Vec<NodeAddress> {
        let mut addresses = Vec::with_capacity(2);
        if let Some(ip) = self.config.node_ip.or_else(default_route_ip) {
            addresses.push(NodeAddress {
                type_: "InternalIP".to_owned(),
                address: ip.to_string(),
            });
        }
        addresses.push(NodeAddress {
            type_: "Hostname".to_owned(),
            address: self.config.node_name.clone(),
        });
        addresses
    }

    fn kubelet_port(&self) -> Option<u16> {
        self.config.kubelet_port
    }

    fn system_info(&self) -> NodeSystemInfo {
        self.system_info.clone()
    }

    fn images(&self) -> Option<Vec<ContainerImage>> {
        self.images.as_ref().map(|list| list())
    }

    fn pressure(&self) -> Pressure {
        self.pressure
            .as_ref()
            .map(|p| *p.borrow())
            .unwrap_or_default()
    }

    fn readiness(&self) -> Readiness {
        if self.shutting_down.as_ref().is_some_and(|s| *s.borrow()) {
            Readiness::NotReady(vec![
                crate::kubelet::node_shutdown::NOT_READY_MESSAGE.to_owned()
            ])
        } else {
            Readiness::Ready
        }
    }
}

/// Size of the filesystem holding a directory.
#[derive(Debug, Clone, Copy)]
struct Filesystem {
    total_bytes: u64,
}

impl Filesystem {
    /// `statvfs` of `dir`, or of its closest existing ancestor when it does not exist yet.
    fn of(dir: &Path) -> Result<Self, ProviderError> {
        let existing = dir
            .ancestors()
            .find(|candidate| candidate.exists())
            .unwrap_or(Path::new("/"));
        let stat =
            nix::sys::statvfs::statvfs(existing).map_err(|source| ProviderError::Statvfs {
                path: existing.to_path_buf(),
                source,
            })?;
        let fragment = stat.fragment_size() as u64;
        Ok(Self {
            total_bytes: (stat.blocks() as u64).saturating_mul(fragment),
        })
    }
}

/// The source address the kernel would use to reach the Internet: the address of the
/// default route's interface. `connect` on a UDP socket only picks a route; nothing is sent.
pub fn default_route_ip() -> Option<IpAddr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    // TEST-NET-1 (RFC 5737): routed like any public address, never actually contacted.
    socket.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

fn system_info(config: &MachineConfig) -> NodeSystemInfo {
    let kernel_version = nix::sys::utsname::uname()
        .ok()
        .and_then(|uts| uts.release().to_str().map(str::to_owned))
        .unwrap_or_default();
    let os_image = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| os_release_pretty_name(&text))
        .unwrap_or_else(|| "Linux".to_owned());
    NodeSystemInfo {
        architecture: go_arch().to_owned(),
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
        container_runtime_version: config.container_runtime_version.clone(),
        kernel_version,
        kube_proxy_version: String::new(),
        kubelet_version: config.kubelet_version.clone(),
        machine_id: read_trimmed("/etc/machine-id"),
        operating_system: std::env::consts::OS.to_owned(),
        os_image,
        system_uuid: read_trimmed("/sys/class/dmi/id/product_uuid").to_lowercase(),
        ..NodeSystemInfo::default()
    }
}

/// An identifier file's content, or "" when it is missing (containers often lack DMI data).
fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|text| text.trim().to_owned())
        .unwrap_or_default()
}

/// `PRETTY_NAME` of an os-release file, unquoted (kubelet's `osImage`).
fn os_release_pretty_name(text: &str) -> Option<String> {
    let value = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("PRETTY_NAME="))?;
    let unquoted = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
        .unwrap_or(value);
    Some(unquoted.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_name_is_read_unquoted_from_os_release() {
        let text = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n";
        assert_eq!(
            os_release_pretty_name(text).as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(
            os_release_pretty_name("PRETTY_NAME=Alpine\n").as_deref(),
            Some("Alpine")
        );
        assert_eq!(os_release_pretty_name("NAME=x\n"), None);
    }

    #[test]
    fn filesystem_of_a_missing_directory_is_its_existing_ancestor() {
        let fs = Filesystem::of(Path::new("/tmp/does/not/exist/yet")).unwrap();
        assert!(fs.total_bytes > 0);
    }

    #[test]
    fn allocatable_subtracts_reservations_and_eviction_thresholds() {
        let config = MachineConfig {
            reserved: Reserved {
                cpu_milli: 500,
                memory_bytes: 1 << 30,
                ephemeral_storage_bytes: 0,
            },
            ..MachineConfig::default()
        };
        let machine = MachineStatus::new(config).unwrap();
        let resources = machine.resources().unwrap();
        let cpu = |map: &std::collections::BTreeMap<String, _>| {
            crate::qos::Quantity::parse(&quantity(map, "cpu"))
                .unwrap()
                .milli_amount()
                .unwrap()
        };
        let bytes = |map: &std::collections::BTreeMap<String, _>, name| {
            crate::qos::Quantity::parse(&quantity(map, name))
                .unwrap()
                .amount()
                .unwrap()
        };
        assert_eq!(cpu(&resources.capacity), num_cpus() * 1000);
        assert_eq!(cpu(&resources.allocatable), num_cpus() * 1000 - 500);
        assert_eq!(
            bytes(&resources.capacity, "memory") - bytes(&resources.allocatable, "memory"),
            (1 << 30) + (100 << 20)
        );
        let storage = bytes(&resources.capacity, "ephemeral-storage");
        assert_eq!(
            storage - bytes(&resources.allocatable, "ephemeral-storage"),
            storage / 100 * 10
        );
        assert_eq!(quantity(&resources.capacity, "pods"), "110");
    }

    #[test]
    fn system_info_names_ironlet_and_this_machine() {
        let info = system_info(&MachineConfig::default());
        assert_eq!(info.operating_system, "linux");
        assert_eq!(info.architecture, go_arch());
        assert!(info.kubelet_version.starts_with("ironlet/"));
        assert!(info.container_runtime_version.starts_with("ironlet://"));
        assert!(!info.kernel_version.is_empty());
        assert!(!info.os_image.is_empty());
        assert_eq!(info.boot_id.len(), 36, "{info:?}");
    }

    #[test]
    fn the_configured_node_ip_comes_first_then_the_hostname() {
        let config = MachineConfig {
            node_name: "n1".to_owned(),
            node_ip: Some(IpAddr::from([10, 1, 2, 3])),
            ..MachineConfig::default()
        };
        let addresses = MachineStatus::new(config).unwrap().addresses();
        let pairs: Vec<_> = addresses
            .iter()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect();
        assert_eq!(pairs, [("InternalIP", "10.1.2.3"), ("Hostname", "n1")]);
    }

    fn quantity(
        map: &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
        name: &str,
    ) -> String {
        map.get(name).map(|q| q.0.clone()).unwrap_or_default()
    }

    fn num_cpus() -> u64 {
        std::thread::available_parallelism().unwrap().get() as u64
    }
}

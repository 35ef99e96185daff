//! The pod's managed `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf` for a container
//! being started: content from the pod, its IP and the node's DNS settings, written in the
//! pod directory and mounted (see [`crate::kubelet::etc_files`]).

use ironlet_runtime::types::{Mount, PodSandboxStatus};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::NodeSyncer;
use crate::config::pod_uid;
use crate::kubelet::dns::{pod_dns, resolv_conf_content, DnsSettings, DnsWarning};
use crate::kubelet::etc_files::{
    managed_hosts_content, node_hosts_content, pod_hostname_and_domain, rewrite_hosts_in_place,
    EtcFiles, NODE_HOSTS_PATH,
};
use crate::kubelet::events::EventType;
use crate::pod_workers::SyncError;

impl NodeSyncer {
    /// The UTS hostname of a pod's sandbox (kubelet's `GetNodenameForKernel`): the
    /// truncated hostname, or its FQDN with `setHostnameAsFQDN`.
    pub(super) fn pod_hostname(&self, pod: &Pod) -> String {
        let fallback = || pod.metadata.name.clone().unwrap_or_default();
        match pod_hostname_and_domain(pod, &self.config.cluster_domain) {
            Ok((hostname, Some(domain)))
                if pod.spec.as_ref().and_then(|s| s.set_hostname_as_fqdn) == Some(true) =>
            {
                format!("{hostname}.{domain}")
            }
            Ok((hostname, _)) => hostname,
            Err(_) => fallback(),
        }
    }

    pub(super) fn mount_etc_files(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox_status: &PodSandboxStatus,
        mounts: &mut Vec<Mount>,
    ) -> Result<(), SyncError> {
        let (files, warnings) = self.etc_files(pod, sandbox_status)?;
        let read_only_rootfs = container
            .security_context
            .as_ref()
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false);
        let pod_dir = self.config.pods_dir().join(pod_uid(pod));
        let new_dns = files
            .write_and_mount(&pod_dir, read_only_rootfs, mounts)
            .map_err(|e| self.config_error(pod, e.to_string()))?;
        // kubelet reports these when it forms a sandbox's DNS: once, not per container.
        if new_dns {
            for warning in warnings {
                self.event(pod, EventType::Warning, warning.reason, warning.message);
            }
        }
        Ok(())
    }

    /// Rewrites the pod's managed `/etc/hosts` in place with the sandbox's (now known)
    /// IP, for a container created before it was (see [`crate::kubelet::etc_files::rewrite_hosts_in_place`]).
    pub(super) fn rewrite_hosts(
        &self,
        pod: &Pod,
        sandbox_status: &PodSandboxStatus,
    ) -> Result<(), SyncError> {
        let (files, _) = self.etc_files(pod, sandbox_status)?;
        let pod_dir = self.config.pods_dir().join(pod_uid(pod));
        rewrite_hosts_in_place(&pod_dir, &files.hosts)
            .map(drop)
            .map_err(|e| self.config_error(pod, format!("rewriting the pod's hosts file: {e}")))
    }

    fn etc_files(
        &self,
        pod: &Pod,
        sandbox_status: &PodSandboxStatus,
    ) -> Result<(EtcFiles, Vec<DnsWarning>), SyncError> {
        let spec = pod.spec.as_ref();
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let aliases = spec
            .and_then(|s| s.host_aliases.as_deref())
            .unwrap_or_default();
        let (hosts, hostname) = if host_network {
            let node_hosts = std::fs::read_to_string(NODE_HOSTS_PATH).map_err(|e| {
                self.config_error(
                    pod,
                    format!("reading the node's hosts file {NODE_HOSTS_PATH}: {e}"),
                )
            })?;
            let node_name = nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| self.config.node_name.clone());
            (node_hosts_content(&node_hosts, aliases), node_name)
        } else {
            let (hostname, domain) = pod_hostname_and_domain(pod, &self.config.cluster_domain)
                .map_err(|e| self.config_error(pod, e.to_string()))?;
            let ips: Vec<String> = sandbox_status.ip.iter().cloned().collect();
            let hosts = managed_hosts_content(&ips, &hostname, domain.as_deref(), aliases);
            (hosts, self.pod_hostname(pod))
        };
        let settings = self.dns_settings(pod)?;
        let (dns, warnings) = pod_dns(&settings, pod);
        let files = EtcFiles {
            hosts,
            hostname: format!("{hostname}\n"),
            resolv_conf: resolv_conf_content(&dns),
        };
        Ok((files, warnings))
    }

    fn dns_settings(&self, pod: &Pod) -> Result<DnsSettings, SyncError> {
        let path = &self.config.resolv_conf;
        let host_resolv_conf = if path.as_os_str().is_empty() {
            None
        } else {
            Some(std::fs::read_to_string(path).map_err(|e| {
                self.config_error(
                    pod,
                    format!("reading the resolver file {}: {e}", path.display()),
                )
            })?)
        };
        Ok(DnsSettings {
            cluster_dns: self.config.cluster_dns.clone(),
            cluster_domain: self.config.cluster_domain.clone(),
            host_resolv_conf,
            node_ips: self.node.host_ip.iter().cloned().collect(),
        })
    }
}

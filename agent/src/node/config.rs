//! [`NodeConfig`]: the node controller's identity and timing, defaulting to kubelet's.

use std::collections::BTreeMap;
use std::time::Duration;

/// How the node controller registers and heartbeats. Every default is kubelet's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// The Node's name. kubelet: `--hostname-override`, else the lower-cased hostname.
    pub node_name: String,
    /// Labels set at registration on top of [`default_labels`](super::default_labels).
    /// kubelet: `--node-labels`, empty.
    pub labels: BTreeMap<String, String>,
    /// How often the status is computed and, when it changed, patched.
    /// kubelet: `nodeStatusUpdateFrequency`, 10 s.
    pub node_status_update_frequency: Duration,
    /// The longest time between two status patches when nothing changed.
    /// kubelet: `nodeStatusReportFrequency`, 5 min.
    pub node_status_report_frequency: Duration,
    /// The Lease's `leaseDurationSeconds`. kubelet: `nodeLeaseDurationSeconds`, 40 s.
    pub lease_duration: Duration,
    /// How often the Lease is renewed. kubelet: a quarter of the lease duration, 10 s.
    pub lease_renew_interval: Duration,
    /// First retry delay after a failed lease renewal or registration. kubelet: 100 ms.
    pub retry_initial: Duration,
    /// Longest retry delay (doubling from `retry_initial`). kubelet's lease controller: 7 s.
    pub retry_max: Duration,
    /// Timeout of each lease renewal and status patch. kubelet's heartbeat client: the
    /// smaller of `nodeStatusUpdateFrequency` and the lease duration, 10 s.
    pub heartbeat_timeout: Duration,
    /// How long the final Ready=False patch may take at shutdown before giving up.
    pub shutdown_timeout: Duration,
}

impl NodeConfig {
    /// The defaults for the node `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            ..Self::default()
        }
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            node_name: hostname(),
            labels: BTreeMap::new(),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(5 * 60),
            lease_duration: Duration::from_secs(40),
            lease_renew_interval: Duration::from_secs(10),
            retry_initial: Duration::from_millis(100),
            retry_max: Duration::from_secs(7),
            heartbeat_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(5),
        }
    }
}

/// kubelet's default node name: the hostname, lower-cased (empty if it cannot be read).
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_default()
        .to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kubelets_intervals() {
        let config = NodeConfig::new("n1");
        assert_eq!(config.node_name, "n1");
        assert_eq!(config.lease_renew_interval, Duration::from_secs(10));
        assert_eq!(config.lease_duration, Duration::from_secs(40));
        assert_eq!(config.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(
            config.node_status_report_frequency,
            Duration::from_secs(300)
        );
        assert_eq!(config.retry_initial, Duration::from_millis(100));
        assert_eq!(config.retry_max, Duration::from_secs(7));
    }

    #[test]
    fn default_node_name_is_the_lower_cased_hostname() {
        let name = NodeConfig::default().node_name;
        assert!(!name.is_empty());
        assert_eq!(name, name.to_lowercase());
    }
}

//! Host port conflicts — the scheduler's `NodePorts` filter, as kubelet re-checks it.
//!
//! A pod wants every `hostPort > 0` of its app containers and sidecar init containers. Two
//! wanted ports conflict when protocol (default `TCP`) and port are equal and the host IPs are
//! equal or either is the wildcard (`0.0.0.0`, the default).

use k8s_openapi::api::core::v1::Pod;

use crate::qos::is_restartable_init_container;

const WILDCARD: &str = "0.0.0.0";

/// One host port a pod binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// The host IP (`0.0.0.0` when unset).
    pub ip: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The port.
    pub port: i32,
}

impl HostPort {
    /// Whether both cannot be bound at once.
    #[must_use]
    pub fn conflicts_with(&self, other: &Self) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == WILDCARD || other.ip == WILDCARD)
    }
}

/// The host ports `pod` binds.
#[must_use]
pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_restartable_init_container(c));
    sidecars
        .chain(&spec.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|port| *port > 0)?;
            Some(HostPort {
                ip: p
                    .host_ip
                    .clone()
                    .filter(|ip| !ip.is_empty())
                    .unwrap_or_else(|| WILDCARD.to_owned()),
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                port,
            })
        })
        .collect()
}

/// Whether any port `pod` wants is already taken in `used`.
#[must_use]
pub fn conflicts(pod: &Pod, used: &[HostPort]) -> bool {
    host_ports(pod)
        .iter()
        .any(|wanted| used.iter().any(|u| wanted.conflicts_with(u)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(ip: &str, protocol: &str, port: i32) -> HostPort {
        HostPort {
            ip: ip.into(),
            protocol: protocol.into(),
            port,
        }
    }

    #[test]
    fn the_wildcard_conflicts_with_every_ip_of_the_same_port_and_protocol() {
        let any = port("0.0.0.0", "TCP", 80);
        assert!(any.conflicts_with(&port("10.0.0.1", "TCP", 80)));
        assert!(port("10.0.0.1", "TCP", 80).conflicts_with(&any));
        assert!(!any.conflicts_with(&port("0.0.0.0", "UDP", 80)));
        assert!(!any.conflicts_with(&port("0.0.0.0", "TCP", 81)));
        assert!(!port("10.0.0.1", "TCP", 80).conflicts_with(&port("10.0.0.2", "TCP", 80)));
    }

    #[test]
    fn host_ports_come_from_app_and_sidecar_containers_with_defaults() {
        let pod: Pod = serde_yaml::from_str(
            "spec:\n  initContainers:\n  - {name: side, image: i, restartPolicy: Always, ports: [{containerPort: 9, hostPort: 9}]}\n  - {name: once, image: i, ports: [{containerPort: 8, hostPort: 8}]}\n  containers:\n  - {name: c, image: i, ports: [{containerPort: 80, hostPort: 8080, hostIP: 127.0.0.1, protocol: UDP}, {containerPort: 81}]}\n",
        )
        .unwrap();
        assert_eq!(
            host_ports(&pod),
            [port("0.0.0.0", "TCP", 9), port("127.0.0.1", "UDP", 8080)]
        );
    }
}

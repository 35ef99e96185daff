//! The part of a CNI result (spec 0.3.0 to 1.0.0) ironlet reads: interfaces and IP
//! addresses, to find the pod's IP. The full result stays a JSON value, kept for DEL and
//! CHECK as their `prevResult`.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Default, Deserialize)]
pub struct CniResult {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
}

#[derive(Debug, Deserialize)]
pub struct Interface {
    pub name: String,
    /// The netns path for interfaces inside the pod; empty for host-side ones.
    #[serde(default)]
    pub sandbox: String,
}

#[derive(Debug, Deserialize)]
pub struct IpConfig {
    /// CIDR notation: `10.85.0.7/16`.
    pub address: String,
    /// Index into `interfaces`.
    #[serde(default)]
    pub interface: Option<usize>,
}

impl CniResult {
    pub fn parse(value: &Value) -> Result<Self, serde_json::Error> {
        Self::deserialize(value)
    }

    /// The pod's address: IPv4 before IPv6, among addresses of interfaces inside the pod
    /// (`sandbox` set) or without an interface index; `None` if there is none.
    pub fn pod_ip(&self) -> Option<IpAddr> {
        let in_pod = |ip: &&IpConfig| match ip.interface.and_then(|i| self.interfaces.get(i)) {
            Some(iface) => !iface.sandbox.is_empty(),
            None => true,
        };
        let addrs: Vec<IpAddr> = self
            .ips
            .iter()
            .filter(in_pod)
            .filter_map(|ip| ip.address.split('/').next()?.parse().ok())
            .collect();
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or_else(|| addrs.first())
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_pod_ip_is_the_address_of_the_interface_inside_the_pod() {
        let result = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "ironlet0", "mac": "aa:bb:cc:dd:ee:ff"},
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:00"},
                {"name": "eth0", "mac": "aa:bb:cc:dd:ee:01", "sandbox": "/run/ns/net"}
            ],
            "ips": [
                {"address": "10.85.0.1/16", "interface": 0},
                {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 2},
                {"address": "10.85.0.5/16", "gateway": "10.85.0.1", "interface": 2}
            ]
        });
        let parsed = CniResult::parse(&result).unwrap();
        assert_eq!(parsed.pod_ip(), Some("10.85.0.5".parse().unwrap()));
    }

    #[test]
    fn an_ipv6_only_result_gives_the_ipv6_address() {
        let result = json!({"ips": [{"address": "fd00::5/64"}]});
        let parsed = CniResult::parse(&result).unwrap();
        assert_eq!(parsed.pod_ip(), Some("fd00::5".parse().unwrap()));
    }

    #[test]
    fn a_result_without_addresses_gives_no_ip() {
        let parsed = CniResult::parse(&json!({"cniVersion": "1.0.0"})).unwrap();
        assert_eq!(parsed.pod_ip(), None);
    }
}

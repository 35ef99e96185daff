//! The pod address ironlet asks host-local for (CNI's `ips` capability), in a network whose
//! first plugin declares that capability and allocates from one IPv4 host-local range, as
//! ironlet's default network does.
//!
//! Why: host-local, asked for any free address, first reads every allocation file of the
//! network (one per pod) to refuse a second address for the same container id, so a pod's
//! ADD grew with the pods already on the node (host-local alone: ~5 ms on an empty node,
//! ~11 ms with 500 pods). Asked for one address, it only creates that address's file
//! (`O_EXCL`). The names in the network's directory tell which addresses are taken (one
//! `readdir`, no file read); the reservation file still settles every race, so a taken
//! address fails the ADD with host-local's error and the sandbox is retried, never shared.
//!
//! Addresses go round-robin from the last one handed out, as host-local's own allocator
//! does (an address is not reused at once), skipping the gateway and those in flight.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Map, Value};

use super::config::NetworkList;

/// host-local's `dataDir` when the config names none.
const HOST_LOCAL_DATA_DIR: &str = "/var/lib/cni/networks";

/// Hands out addresses to ask for; one per runtime.
#[derive(Debug, Default)]
pub(crate) struct AddressHints {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The last address handed out, per network directory.
    last: HashMap<PathBuf, Ipv4Addr>,
    /// Handed out, ADD not finished yet (no file until host-local made it).
    in_flight: HashSet<Ipv4Addr>,
}

/// An address being asked for; it stops counting as in flight when dropped (after ADD).
#[derive(Debug)]
pub(crate) struct Hint<'a> {
    hints: &'a AddressHints,
    ip: Ipv4Addr,
    prefix: u8,
}

impl Hint<'_> {
    /// The `ips` capability's value: the address with its subnet's prefix.
    pub fn ips(&self) -> Value {
        Value::Array(vec![Value::String(format!("{}/{}", self.ip, self.prefix))])
    }

    #[cfg(test)]
    fn ip(&self) -> Ipv4Addr {
        self.ip
    }
}

impl Drop for Hint<'_> {
    fn drop(&mut self) {
        self.hints.lock().in_flight.remove(&self.ip);
    }
}

impl AddressHints {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The address to ask for in `list`; `None` when the network is not of that kind (then
    /// host-local picks, as without ironlet) or its range has no free address left.
    pub fn pick(&self, list: &NetworkList) -> Option<Hint<'_>> {
        let range = HostLocalRange::of(list)?;
        let taken: HashSet<Ipv4Addr> = std::fs::read_dir(&range.dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let mut state = self.lock();
        let (first, last) = (u32::from(range.first), u32::from(range.last));
        // After a restart, host-local's own record of the last address goes on the round.
        let previous = match state.last.get(&range.dir) {
            Some(ip) => Some(*ip),
            None => std::fs::read_to_string(range.dir.join("last_reserved_ip.0"))
                .ok()
                .and_then(|text| text.trim().parse().ok()),
        };
        let after = previous
            .map(u32::from)
            .filter(|ip| (first..=last).contains(ip))
            .unwrap_or(last);
        let size = last - first + 1;
        let ip = (1..=size)
            .map(|step| Ipv4Addr::from(first + (after - first + step) % size))
            .find(|ip| {
                *ip != range.gateway && !taken.contains(ip) && !state.in_flight.contains(ip)
            })?;
        state.in_flight.insert(ip);
        state.last.insert(range.dir, ip);
        Some(Hint {
            hints: self,
            ip,
            prefix: range.prefix,
        })
    }
}

/// A network's single host-local IPv4 range, as host-local reads it.
#[derive(Debug, PartialEq)]
struct HostLocalRange {
    /// `<dataDir>/<network name>`, one file per allocated address.
    dir: PathBuf,
    first: Ipv4Addr,
    last: Ipv4Addr,
    gateway: Ipv4Addr,
    prefix: u8,
}

impl HostLocalRange {
    fn of(list: &NetworkList) -> Option<Self> {
        let plugin = list.plugins.first()?;
        let declares_ips = plugin
            .get("capabilities")
            .and_then(|c| c.get("ips"))
            .and_then(Value::as_bool)
            == Some(true);
        let ipam = plugin.get("ipam")?.as_object()?;
        if !declares_ips || ipam.get("type")?.as_str()? != "host-local" {
            return None;
        }
        let [set] = ipam.get("ranges")?.as_array()?.as_slice() else {
            return None;
        };
        let [range] = set.as_array()?.as_slice() else {
            return None;
        };
        let data_dir = ipam
            .get("dataDir")
            .and_then(Value::as_str)
            .unwrap_or(HOST_LOCAL_DATA_DIR);
        Self::parse(range.as_object()?, &Path::new(data_dir).join(&list.name))
    }

    /// host-local's defaults: from the address after the network's to the one before its
    /// broadcast address, the gateway the first of the subnet.
    fn parse(range: &Map<String, Value>, dir: &Path) -> Option<Self> {
        let (network, prefix) = range.get("subnet")?.as_str()?.split_once('/')?;
        let network: Ipv4Addr = network.parse().ok()?;
        let prefix: u8 = prefix.parse().ok()?;
        // /31 and /32 have no room for pods besides the gateway.
        if !(1..=30).contains(&prefix) {
            return None;
        }
        let mask = u32::MAX << (32 - prefix);
        let base = u32::from(network) & mask;
        let address = |key: &str, default: u32| -> Option<u32> {
            match range.get(key) {
                None => Some(default),
                Some(v) => v
                    .as_str()?
                    .parse::<Ipv4Addr>()
                    .ok()
                    .map(u32::from)
                    .filter(|ip| ip & mask == base),
            }
        };
        let first = address("rangeStart", base + 1)?;
        let last = address("rangeEnd", (base | !mask) - 1)?;
        let gateway = address("gateway", base + 1)?;
        (first <= last).then(|| Self {
            dir: dir.to_owned(),
            first: first.into(),
            last: last.into(),
            gateway: gateway.into(),
            prefix,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list(dir: &Path, ipam_extra: Value, capabilities: Value) -> NetworkList {
        let mut ipam = json!({
            "type": "host-local",
            "ranges": [[{ "subnet": "10.85.0.0/29" }]],
            "dataDir": dir,
        });
        if let (Some(ipam), Value::Object(extra)) = (ipam.as_object_mut(), ipam_extra) {
            ipam.extend(extra);
        }
        serde_json::from_value(json!({
            "name": "net",
            "cniVersion": "1.0.0",
            "plugins": [
                { "type": "bridge", "capabilities": capabilities, "ipam": ipam },
                { "type": "portmap" },
            ],
        }))
        .expect("network list")
    }

    #[test]
    fn addresses_go_round_robin_past_the_gateway_taken_and_in_flight_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let net = dir.path().join("net");
        std::fs::create_dir(&net).expect("mkdir");
        // host-local's files: allocations and its own bookkeeping.
        std::fs::write(net.join("10.85.0.3"), "c\r\neth0").expect("write");
        std::fs::write(net.join("lock"), "").expect("write");
        let list = list(dir.path(), json!({}), json!({ "ips": true }));
        let hints = AddressHints::default();
        // /29: .1 is the gateway, .7 the broadcast address: .2 to .6, the round going on
        // after host-local's last one (.6 here, from a previous agent).
        std::fs::write(net.join("last_reserved_ip.0"), "10.85.0.6").expect("write");
        let a = hints.pick(&list).expect("a hint");
        assert_eq!(a.ip(), Ipv4Addr::new(10, 85, 0, 2));
        assert_eq!(a.ips(), json!(["10.85.0.2/29"]));
        let b = hints.pick(&list).expect("a hint");
        assert_eq!(
            b.ip(),
            Ipv4Addr::new(10, 85, 0, 4),
            ".2 in flight, .3 taken"
        );
        // ADD done: .4's file exists; .2's ADD failed and left none.
        std::fs::write(net.join("10.85.0.4"), "c\r\neth0").expect("write");
        drop((a, b));
        let next: Vec<Ipv4Addr> = (0..3)
            .map(|_| hints.pick(&list).map(|h| h.ip()))
            .collect::<Option<_>>()
            .expect("hints");
        // Round robin: after .4 come .5, .6, then .2 again (not .1, the gateway).
        assert_eq!(
            next,
            [5, 6, 2].map(|d| Ipv4Addr::new(10, 85, 0, d)),
            "each hint was dropped at once, so only files count"
        );
        let held: Vec<Hint<'_>> = std::iter::from_fn(|| hints.pick(&list)).collect();
        assert_eq!(held.len(), 3, ".2, .5, .6 free; .3 and .4 taken");
        assert!(hints.pick(&list).is_none(), "the range is full");
    }

    #[test]
    fn only_a_declared_single_host_local_range_gets_hints() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hints = AddressHints::default();
        assert!(hints
            .pick(&list(
                dir.path(),
                json!({}),
                json!({ "portMappings": true })
            ))
            .is_none());
        let two_ranges =
            json!({ "ranges": [[{ "subnet": "10.1.0.0/24" }], [{ "subnet": "10.2.0.0/24" }]] });
        assert!(hints
            .pick(&list(dir.path(), two_ranges, json!({ "ips": true })))
            .is_none());
        let v6 = json!({ "ranges": [[{ "subnet": "fd00::/64" }]] });
        assert!(hints
            .pick(&list(dir.path(), v6, json!({ "ips": true })))
            .is_none());
        // rangeStart/rangeEnd/gateway as host-local reads them.
        let bounded = json!({ "ranges": [[{ "subnet": "10.9.0.0/24", "rangeStart": "10.9.0.100",
            "rangeEnd": "10.9.0.101", "gateway": "10.9.0.100" }]] });
        let list = list(dir.path(), bounded, json!({ "ips": true }));
        let hint = hints.pick(&list).expect("a hint");
        assert_eq!(hint.ip(), Ipv4Addr::new(10, 9, 0, 101));
        assert!(
            hints.pick(&list).is_none(),
            "the gateway is never handed out"
        );
    }
}

//! CNI configuration: where ironlet looks for network configs and plugins
//! ([`CniConfig`]), the network list it uses ([`NetworkList`], a `.conflist` or a single
//! `.conf`), and the default network it writes when the directory holds none.
//!
//! Choice of network, as containerd does it: the first file of the conf dir in
//! lexicographic order with the extension `.conflist`, `.conf` or `.json`. The default
//! file is named `99-ironlet.conflist` so that any cluster CNI installed later (calico,
//! flannel, cilium write `05-`/`10-` files) takes precedence for new pods.
//!
//! The default network (`ironlet`): a `bridge` (`ironlet0`, gateway, hairpin; masquerade by
//! one node-wide rule, see `masquerade.rs`)
//! with `host-local` addresses from `10.85.0.0/16` (not used by Docker's 172.17/16,
//! podman's and containerd's 10.88/16, flannel's 10.244/16 or calico's 192.168/16), a default
//! route, then `portmap` for hostPort mappings. The bridge declares the `ips` capability:
//! ironlet names the address host-local reserves (`address_hint.rs`), which spares host-local
//! a read of every allocation per ADD. host-local's allocations live under the
//! ironlet root (`<root>/cni/networks`), not the shared `/var/lib/cni/networks`, so that
//! instances with different roots (tests) neither collide nor leak into each other.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::error::{NetworkError, Result};

/// File name of the default network written into an empty conf dir.
pub const DEFAULT_CONFLIST: &str = "99-ironlet.conflist";

/// Where CNI configs and plugins are, and the default network. `None` in
/// [`LocalRuntimeConfig::cni`](crate::LocalRuntimeConfig::cni) disables CNI networking.
#[derive(Debug, Clone, PartialEq)]
pub struct CniConfig {
    /// Network configurations; kubelet's old `--cni-conf-dir` and containerd's default.
    pub conf_dir: PathBuf,
    /// Plugin binaries, searched in order: Debian's `containernetworking-plugins`
    /// installs to `/usr/lib/cni`, upstream tarballs to `/opt/cni/bin` (`--cni-bin-dir`).
    pub bin_dirs: Vec<PathBuf>,
    /// host-local's `dataDir` in the default network; `None`: `<root-dir>/cni/networks`.
    pub ipam_data_dir: Option<PathBuf>,
    /// What the default conflist (written when `conf_dir` has none) contains.
    pub default_network: DefaultNetwork,
    /// Longest one plugin invocation may take before it is killed.
    pub plugin_timeout: Duration,
    /// Which network of the conf dir is used.
    pub choice: NetworkChoice,
}

/// Which network configuration of the conf dir is used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NetworkChoice {
    /// The first file by name, as containerd picks it (the node agent: a cluster CNI
    /// installed later takes precedence).
    #[default]
    FirstInConfDir,
    /// Always ironlet's own `99-ironlet.conflist`, written when missing, whatever else the
    /// directory holds (`ctr run -p`: as podman always uses its own `podman` network, a
    /// local container does not land on another tool's bridge).
    IronletDefault,
}

impl Default for CniConfig {
    fn default() -> Self {
        Self {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/usr/lib/cni"), PathBuf::from("/opt/cni/bin")],
            ipam_data_dir: None,
            default_network: DefaultNetwork::default(),
            // containerd bounds the whole sandbox setup by the CRI call's deadline
            // (kubelet's --runtime-request-timeout, 2 min); one plugin gets a quarter.
            plugin_timeout: Duration::from_secs(30),
            choice: NetworkChoice::default(),
        }
    }
}

/// The bridge network ironlet writes when no CNI configuration exists.
#[derive(Debug, Clone, PartialEq)]
pub struct DefaultNetwork {
    /// CNI network name (also in iptables comments and host-local's data dir).
    pub name: String,
    /// Linux bridge device, at most 15 bytes.
    pub bridge: String,
    /// Pod addresses, in CIDR notation.
    pub subnet: String,
    /// Masquerade traffic leaving the subnet: one node-wide iptables rule that ironlet keeps
    /// (`ironletMasquerade` in the conflist), not the bridge plugin's per-pod `ipMasq`.
    pub ip_masq: bool,
}

impl Default for DefaultNetwork {
    fn default() -> Self {
        Self {
            name: "ironlet".into(),
            bridge: "ironlet0".into(),
            subnet: "10.85.0.0/16".into(),
            ip_masq: true,
        }
    }
}

impl DefaultNetwork {
    /// The conflist JSON of this network, with host-local keeping state in `data_dir`.
    pub fn conflist(&self, data_dir: &Path) -> Value {
        let mut list = json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    // ironlet asks for each pod's address (`address_hint.rs`).
                    "capabilities": { "ips": true },
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": self.subnet }]],
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": data_dir,
                    }
                },
                { "type": "portmap", "capabilities": { "portMappings": true } }
            ]
        });
        if self.ip_masq {
            list["ironletMasquerade"] = json!(self.subnet);
        }
        list
    }
}

/// A network configuration list: what ADD/DEL/CHECK run, plugin by plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkList {
    pub name: String,
    pub cni_version: String,
    #[serde(default)]
    pub disable_check: bool,
    /// ironlet's own key (CNI ignores unknown top-level keys): the subnet whose node-wide
    /// masquerade rule ironlet keeps (see `masquerade.rs`), set in the default network.
    #[serde(
        default,
        rename = "ironletMasquerade",
        skip_serializing_if = "Option::is_none"
    )]
    pub masquerade: Option<String>,
    /// Each plugin's configuration object as written (`type`, its own keys).
    pub plugins: Vec<Map<String, Value>>,
}

impl NetworkList {
    /// Parses a `.conflist`, or a single-plugin `.conf` which becomes a list of one.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|source| NetworkError::ParseConfig {
                path: path.to_owned(),
                source,
            })?;
        let invalid = |reason: &str| NetworkError::InvalidConfig {
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        let Value::Object(mut obj) = value else {
            return Err(invalid("not a JSON object"));
        };
        let list = if obj.contains_key("plugins") {
            serde_json::from_value::<NetworkList>(Value::Object(obj)).map_err(|source| {
                NetworkError::ParseConfig {
                    path: path.to_owned(),
                    source,
                }
            })?
        } else {
            let name = take_string(&mut obj, "name").ok_or_else(|| invalid("no name"))?;
            let cni_version =
                take_string(&mut obj, "cniVersion").ok_or_else(|| invalid("no cniVersion"))?;
            NetworkList {
                name,
                cni_version,
                disable_check: false,
                masquerade: None,
                plugins: vec![obj],
            }
        };
        list.validate().map_err(|reason| invalid(&reason))?;
        Ok(list)
    }

    fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("empty network name".into());
        }
        if self.plugins.is_empty() {
            return Err("no plugins".into());
        }
        for plugin in &self.plugins {
            let ty = plugin_type(plugin).ok_or("a plugin has no \"type\"")?;
            // The type names a file in a bin dir; it must not reach outside it.
            if ty.is_empty() || ty.contains('/') || ty == "." || ty == ".." {
                return Err(format!("plugin type {ty:?} is not a file name"));
            }
        }
        Ok(())
    }

    /// Whether the first plugin's IPAM hands out IPv4 addresses only: every subnet of
    /// host-local's `ranges` (or its older `subnet`) and every address of `static` is IPv4.
    /// Any other IPAM (dhcp, a delegating plugin's own) may give IPv6: `false`.
    pub fn ipv4_only(&self) -> bool {
        let Some(ipam) = self
            .plugins
            .first()
            .and_then(|p| p.get("ipam"))
            .and_then(Value::as_object)
        else {
            return false;
        };
        let is_v4 = |cidr: Option<&Value>| {
            cidr.and_then(Value::as_str)
                .and_then(|c| c.split('/').next())
                .is_some_and(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
        };
        let all_v4 = |items: Vec<&Value>, key: &str| {
            !items.is_empty() && items.iter().all(|item| is_v4(item.get(key)))
        };
        match ipam.get("type").and_then(Value::as_str) {
            Some("host-local") => match ipam.get("ranges").and_then(Value::as_array) {
                Some(sets) => all_v4(
                    sets.iter().filter_map(Value::as_array).flatten().collect(),
                    "subnet",
                ),
                None => is_v4(ipam.get("subnet")),
            },
            Some("static") => all_v4(
                ipam.get("addresses")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().collect())
                    .unwrap_or_default(),
                "address",
            ),
            _ => false,
        }
    }

    /// Whether CHECK exists for this version (CNI 0.4.0 and later) and is not disabled.
    pub fn supports_check(&self) -> bool {
        let mut parts = self.cni_version.split('.').map(|p| p.parse::<u32>().ok());
        let major = parts.next().flatten().unwrap_or(0);
        let minor = parts.next().flatten().unwrap_or(0);
        !self.disable_check && (major, minor) >= (0, 4)
    }
}

/// A plugin configuration's `type`: the binary to run.
pub fn plugin_type(plugin: &Map<String, Value>) -> Option<&str> {
    plugin.get("type").and_then(Value::as_str)
}

fn take_string(obj: &mut Map<String, Value>, key: &str) -> Option<String> {
    match obj.remove(key) {
        Some(Value::String(s)) if !s.is_empty() => Some(s),
        _ => None,
    }
}

/// The file containerd would pick: the first `.conflist`/`.conf`/`.json` by name.
pub fn first_config_file(conf_dir: &Path) -> Result<Option<PathBuf>> {
    let entries = match std::fs::read_dir(conf_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(NetworkError::ReadConfig {
                path: conf_dir.to_owned(),
                source,
            })
        }
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "conflist" | "conf" | "json"))
        })
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files.into_iter().next())
}

/// Loads the network to use (see [`NetworkChoice`]), writing the default network first if
/// the conf dir has none.
pub fn load_or_write_default(
    config: &CniConfig,
    root_dir: &Path,
) -> Result<(PathBuf, NetworkList)> {
    let found = match config.choice {
        NetworkChoice::FirstInConfDir => first_config_file(&config.conf_dir)?,
        NetworkChoice::IronletDefault => {
            Some(config.conf_dir.join(DEFAULT_CONFLIST)).filter(|own| own.is_file())
        }
    };
    let path = match found {
        Some(path) => path,
        None => write_default(config, root_dir)?,
    };
    let bytes = std::fs::read(&path).map_err(|source| NetworkError::ReadConfig {
        path: path.clone(),
        source,
    })?;
    Ok((path.clone(), NetworkList::parse(&path, &bytes)?))
}

fn write_default(config: &CniConfig, root_dir: &Path) -> Result<PathBuf> {
    let path = config.conf_dir.join(DEFAULT_CONFLIST);
    let data_dir = config
        .ipam_data_dir
        .clone()
        .unwrap_or_else(|| root_dir.join("cni/networks"));
    let bytes =
        serde_json::to_vec_pretty(&config.default_network.conflist(&data_dir)).map_err(|e| {
            NetworkError::WriteDefault {
                path: path.clone(),
                source: std::io::Error::other(e),
            }
        })?;
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&config.conf_dir)?;
        // Network configuration, not state: readable like the distribution's own files.
        crate::fsutil::write_atomic_mode(&path, &bytes, 0o644)
    };
    write().map_err(|source| NetworkError::WriteDefault {
        path: path.clone(),
        source,
    })?;
    tracing::info!(?path, network = %config.default_network.name,
        subnet = %config.default_network.subnet, "wrote the default CNI network");
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_plugin(plugin: Value) -> NetworkList {
        let list = serde_json::json!({"cniVersion": "1.0.0", "name": "n", "plugins": [plugin]});
        NetworkList::parse(Path::new("n.conflist"), list.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn only_ipam_that_names_ipv4_subnets_alone_makes_a_network_ipv4_only() {
        let host_local = |ranges: Value| {
            first_plugin(serde_json::json!({"type": "bridge",
                "ipam": {"type": "host-local", "ranges": ranges}}))
        };
        assert!(host_local(serde_json::json!([[{"subnet": "10.88.0.0/16"}]])).ipv4_only());
        assert!(host_local(
            serde_json::json!([[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.2.0.0/24"}]])
        )
        .ipv4_only());
        // Dual stack, IPv6 alone, nothing named.
        assert!(!host_local(
            serde_json::json!([[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd00::/64"}]])
        )
        .ipv4_only());
        assert!(!host_local(serde_json::json!([[{"subnet": "fd00::/64"}]])).ipv4_only());
        assert!(!host_local(serde_json::json!([])).ipv4_only());
        let old = first_plugin(serde_json::json!({"type": "bridge",
            "ipam": {"type": "host-local", "subnet": "10.9.0.0/24"}}));
        assert!(old.ipv4_only());
        let fixed = |address: &str| {
            first_plugin(serde_json::json!({"type": "bridge",
                "ipam": {"type": "static", "addresses": [{"address": address}]}}))
        };
        assert!(fixed("10.0.0.5/24").ipv4_only());
        assert!(!fixed("fd00::5/64").ipv4_only());
        // IPAM that decides at run time, or none at all.
        assert!(
            !first_plugin(serde_json::json!({"type": "macvlan", "ipam": {"type": "dhcp"}}))
                .ipv4_only()
        );
        assert!(!first_plugin(serde_json::json!({"type": "calico"})).ipv4_only());
    }

    #[test]
    fn another_tools_network_is_first_for_the_agent_but_not_for_ironlets_own_choice() {
        let dir = tempfile::tempdir().unwrap();
        let conf_dir = dir.path().join("net.d");
        std::fs::create_dir_all(&conf_dir).unwrap();
        let podman = r#"{"cniVersion": "0.4.0", "name": "podman",
            "plugins": [{"type": "bridge", "bridge": "cni-podman0"}]}"#;
        std::fs::write(conf_dir.join("87-podman-bridge.conflist"), podman).unwrap();
        let first = CniConfig {
            conf_dir: conf_dir.clone(),
            ..CniConfig::default()
        };
        let (_, list) = load_or_write_default(&first, Path::new("/root-x")).unwrap();
        assert_eq!(list.name, "podman");
        assert!(!conf_dir.join(DEFAULT_CONFLIST).exists());
        let own = CniConfig {
            choice: NetworkChoice::IronletDefault,
            ..first
        };
        let (path, list) = load_or_write_default(&own, Path::new("/root-x")).unwrap();
        assert_eq!(path, conf_dir.join(DEFAULT_CONFLIST));
        assert_eq!(list.name, "ironlet");
        // Written once, then read back.
        let (_, again) = load_or_write_default(&own, Path::new("/root-x")).unwrap();
        assert_eq!(again.name, "ironlet");
    }

    #[test]
    fn the_default_network_is_written_into_an_empty_conf_dir_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let config = CniConfig {
            conf_dir: dir.path().join("net.d"),
            ..CniConfig::default()
        };
        let (path, list) = load_or_write_default(&config, Path::new("/root-x")).unwrap();
        assert_eq!(path, dir.path().join("net.d").join(DEFAULT_CONFLIST));
        assert_eq!(list.name, "ironlet");
        assert_eq!(list.cni_version, "1.0.0");
        let types: Vec<_> = list.plugins.iter().filter_map(plugin_type).collect();
        assert_eq!(types, ["bridge", "portmap"]);
        let bridge = &list.plugins[0];
        assert_eq!(bridge["bridge"], "ironlet0");
        assert_eq!(bridge["ipam"]["dataDir"], "/root-x/cni/networks");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.85.0.0/16");
        // Masquerade by ironlet's node-wide rule, not per pod by the bridge plugin.
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(list.masquerade.as_deref(), Some("10.85.0.0/16"));
    }

    #[test]
    fn a_default_network_without_masquerade_names_no_subnet_to_masquerade() {
        let network = DefaultNetwork {
            ip_masq: false,
            ..DefaultNetwork::default()
        };
        let list = network.conflist(Path::new("/d"));
        assert!(list.get("ironletMasquerade").is_none());
        assert_eq!(list["plugins"][0]["ipMasq"], false);
    }

    #[test]
    fn an_existing_config_is_used_and_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let own = br#"{"cniVersion":"0.3.1","name":"other","type":"ptp","ipam":{}}"#;
        std::fs::write(dir.path().join("10-other.conf"), own).unwrap();
        std::fs::write(dir.path().join("20-later.conflist"), b"not json").unwrap();
        let config = CniConfig {
            conf_dir: dir.path().to_owned(),
            ..CniConfig::default()
        };
        let (path, list) = load_or_write_default(&config, Path::new("/r")).unwrap();
        assert!(path.ends_with("10-other.conf"));
        assert_eq!(list.name, "other");
        assert_eq!(list.plugins.len(), 1);
        assert_eq!(plugin_type(&list.plugins[0]), Some("ptp"));
        assert!(
            !list.plugins[0].contains_key("name"),
            "name moved to the list"
        );
        assert!(!dir.path().join(DEFAULT_CONFLIST).exists());
        assert!(!list.supports_check(), "0.3.1 has no CHECK");
    }

    #[test]
    fn a_plugin_type_with_a_slash_is_rejected() {
        let bytes = br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"../../bin/sh"}]}"#;
        let err = NetworkList::parse(Path::new("x.conflist"), bytes).unwrap_err();
        assert!(matches!(err, NetworkError::InvalidConfig { .. }), "{err:?}");
    }

    #[test]
    fn a_list_without_plugins_is_rejected() {
        let bytes = br#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#;
        assert!(NetworkList::parse(Path::new("x"), bytes).is_err());
    }

    #[test]
    fn check_is_supported_from_cni_0_4_0_unless_disabled() {
        let mut list = NetworkList {
            name: "n".into(),
            cni_version: "0.4.0".into(),
            disable_check: false,
            masquerade: None,
            plugins: vec![],
        };
        assert!(list.supports_check());
        list.cni_version = "1.0.0".into();
        assert!(list.supports_check());
        list.disable_check = true;
        assert!(!list.supports_check());
    }
}

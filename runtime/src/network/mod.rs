//! Pod networking through standard CNI plugins (DESIGN.md decision 4), run directly —
//! no libcni, no Go.
//!
//! ```text
//!  run_pod_sandbox ─► zygote pins netns (lo up) ─► Network::attach ─► ADD bridge ─► ADD portmap
//!                                                        │  (host-local IPAM)
//!                                                        ▼
//!                        SandboxRecord { ip, network: NetworkAttachment (list + result) }
//!  stop/remove_pod_sandbox ─► Network::detach ─► DEL portmap, DEL bridge ─► unpin netns
//! ```
//!
//! Guarantees:
//! - [`Network::attach`] either returns an attachment with the pod's IP or leaves nothing
//!   behind: after a failed ADD it runs DEL, and reports both errors if that fails too.
//! - DEL runs with the network list and result recorded at ADD, not whatever the conf dir
//!   holds by then, so a config change never strands an address.
//! - When networking is unavailable (no config can be read or written, a plugin binary is
//!   missing), `attach` returns `Ok(None)`: the pod keeps a loopback-only namespace (the
//!   zygote brings `lo` up when it creates the namespace), and one warning says why.
//!
//! - The default network masquerades through one node-wide rule installed before the first
//!   ADD (`masquerade.rs`), not per pod.
//!
//! Files: `config.rs` (where configs and plugins are, the default network), `cni.rs`
//! (running plugins), `masquerade.rs`, `result.rs` (reading results), `error.rs`.

mod address_hint;
mod cni;
mod config;
mod error;
mod masquerade;
mod result;
pub mod rootless;

/// Spawning a plugin binary that was just written (ETXTBSY retried); credential
/// provider plugins are spawned the same way.
pub(crate) use cni::spawn_retrying_busy;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use cni::{Attachment, Command, Invoker};
pub use config::{CniConfig, DefaultNetwork, NetworkChoice, NetworkList, DEFAULT_CONFLIST};
pub use error::NetworkError;
pub use masquerade::Masquerade;
pub use result::CniResult;

/// The interface name inside the pod, as kubelet and containerd use.
pub const POD_IFNAME: &str = "eth0";

/// Who the pod is: its sandbox id is the CNI container id; the rest goes to `CNI_ARGS`.
#[derive(Debug, Clone, Copy)]
pub struct PodRef<'a> {
    pub sandbox_id: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    /// Published ports: the `portMappings` capability (the `portmap` plugin's).
    pub ports: &'a [crate::types::PortMapping],
}

impl PodRef<'_> {
    /// `CNI_ARGS` as containerd sends them.
    fn cni_args(&self) -> Vec<(String, String)> {
        [
            ("K8S_POD_NAMESPACE", self.namespace),
            ("K8S_POD_NAME", self.name),
            ("K8S_POD_INFRA_CONTAINER_ID", self.sandbox_id),
            ("K8S_POD_UID", self.uid),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// The capability arguments (`runtimeConfig`) as containerd sends them: `portMappings`
    /// when the pod publishes ports.
    fn capabilities(&self) -> Map<String, Value> {
        let mut out = Map::new();
        if !self.ports.is_empty() {
            let mappings = self
                .ports
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "hostPort": p.host_port,
                        "containerPort": p.container_port,
                        "protocol": p.protocol.as_str(),
                        "hostIP": p.host_ip,
                    })
                })
                .collect();
            out.insert("portMappings".into(), Value::Array(mappings));
        }
        out
    }
}

/// A pod's membership in a network: what DEL and CHECK need later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkAttachment {
    /// The network list ADD ran.
    pub network: NetworkList,
    pub ifname: String,
    /// ADD's result, the `prevResult` of DEL and CHECK.
    pub result: Value,
    pub ip: IpAddr,
}

/// Attaches pods to the node's CNI network.
#[derive(Debug)]
pub struct Network {
    config: CniConfig,
    root_dir: PathBuf,
    invoker: Invoker,
    /// Whether the "networking unavailable" warning was logged since it last worked.
    warned: AtomicBool,
    /// Serializes reading (and maybe writing) the conf dir between concurrent sandboxes.
    resolving: Mutex<()>,
    /// The masquerade rule set last installed (`ironletMasquerade` of the list in use).
    masquerading: tokio::sync::Mutex<Option<Masquerade>>,
    /// Addresses asked of host-local where the network declares `ips`.
    hints: address_hint::AddressHints,
}

impl Network {
    /// `root_dir` is the runtime's data root: the default network's IPAM state goes there.
    pub fn new(config: CniConfig, root_dir: &Path) -> Self {
        let invoker = Invoker {
            bin_dirs: config.bin_dirs.clone(),
            timeout: config.plugin_timeout,
        };
        Self {
            config,
            root_dir: root_dir.to_owned(),
            invoker,
            warned: AtomicBool::new(false),
            resolving: Mutex::new(()),
            masquerading: tokio::sync::Mutex::new(None),
            hints: address_hint::AddressHints::default(),
        }
    }

    pub fn config(&self) -> &CniConfig {
        &self.config
    }

    /// The network list to use, with every plugin present; `None` (and a warning, once)
    /// when networking is unavailable. Read once per sandbox, for [`Network::attach`].
    pub fn resolve(&self) -> Option<NetworkList> {
        let resolved = {
            // Held only for a directory read and maybe one small write; never across an await.
            let _guard = self.resolving.lock().unwrap_or_else(|p| p.into_inner());
            config::load_or_write_default(&self.config, &self.root_dir)
        }
        .and_then(|(path, list)| self.invoker.find_all(&list).map(|()| (path, list)));
        match resolved {
            Ok((path, list)) => {
                if self.warned.swap(false, Ordering::Relaxed) {
                    tracing::info!(?path, network = %list.name, "CNI networking is available");
                }
                Some(list)
            }
            Err(err) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%err, conf_dir = ?self.config.conf_dir,
                        bin_dirs = ?self.config.bin_dirs,
                        "CNI networking unavailable: pods get a loopback-only network \
                         (install containernetworking-plugins)");
                }
                None
            }
        }
    }

    /// Runs ADD of `list` ([`Network::resolve`]) for the pod whose network namespace is
    /// pinned at `netns`. `Ok(None)`: networking is unavailable (no list), the pod stays
    /// loopback-only.
    pub async fn attach(
        &self,
        list: Option<NetworkList>,
        pod: &PodRef<'_>,
        netns: &Path,
    ) -> Result<Option<NetworkAttachment>, NetworkError> {
        let Some(list) = list else {
            return Ok(None);
        };
        self.ensure_masquerade(&list).await?;
        let args = pod.cni_args();
        let mut capabilities = pod.capabilities();
        // Held until ADD is done: no other pod is offered the address meanwhile.
        let hint = self.hints.pick(&list);
        if let Some(hint) = &hint {
            capabilities.insert("ips".into(), hint.ips());
        }
        let at = Attachment {
            container_id: pod.sandbox_id,
            netns: Some(netns),
            ifname: POD_IFNAME,
            args: &args,
            capabilities: &capabilities,
        };
        let started = Instant::now();
        let added = self.invoker.add(&list, &at).await.and_then(|result| {
            let ip = CniResult::parse(&result)
                .ok()
                .and_then(|r| r.pod_ip())
                .ok_or_else(|| NetworkError::NoAddress {
                    network: list.name.clone(),
                })?;
            Ok((result, ip))
        });
        match added {
            Ok((result, ip)) => {
                tracing::debug!(sandbox_id = pod.sandbox_id, %ip, network = %list.name,
                    elapsed_ms = started.elapsed().as_millis() as u64, "CNI ADD done");
                Ok(Some(NetworkAttachment {
                    network: list,
                    ifname: POD_IFNAME.to_owned(),
                    result,
                    ip,
                }))
            }
            Err(original) => {
                tracing::warn!(sandbox_id = pod.sandbox_id, err = %original,
                    "CNI ADD failed; removing the pod from the network");
                match self.invoker.del(&list, &at, None).await {
                    Ok(()) => Err(original),
                    Err(cleanup) => Err(NetworkError::Rollback {
                        original: Box::new(original),
                        cleanup: Box::new(cleanup),
                    }),
                }
            }
        }
    }

    /// Runs CHECK (CNI ≥ 0.4.0): whether the pod's networking is still as ADD made it.
    pub async fn check(
        &self,
        pod: &PodRef<'_>,
        netns: &Path,
        attachment: &NetworkAttachment,
    ) -> Result<(), NetworkError> {
        let args = pod.cni_args();
        let capabilities = pod.capabilities();
        let at = Attachment {
            container_id: pod.sandbox_id,
            netns: Some(netns),
            ifname: &attachment.ifname,
            args: &args,
            capabilities: &capabilities,
        };
        self.invoker
            .check(&attachment.network, &at, &attachment.result)
            .await
    }

    /// Runs DEL with what ADD recorded. Idempotent. A namespace that is no longer
    /// mounted is passed as empty `CNI_NETNS`, so plugins still release addresses.
    pub async fn detach(
        &self,
        pod: &PodRef<'_>,
        netns: &Path,
        attachment: &NetworkAttachment,
    ) -> Result<(), NetworkError> {
        let args = pod.cni_args();
        let capabilities = pod.capabilities();
        let at = Attachment {
            container_id: pod.sandbox_id,
            netns: is_netns(netns).then_some(netns),
            ifname: &attachment.ifname,
            args: &args,
            capabilities: &capabilities,
        };
        self.invoker
            .del(&attachment.network, &at, Some(&attachment.result))
            .await
    }
}

impl Network {
    /// Installs the list's node-wide masquerade rule once per agent (and again if the list
    /// names another subnet); every later ADD finds it done.
    async fn ensure_masquerade(&self, list: &NetworkList) -> Result<(), NetworkError> {
        let Some(subnet) = &list.masquerade else {
            return Ok(());
        };
        let wanted = Masquerade::new(&list.name, subnet);
        let mut installed = self.masquerading.lock().await;
        if installed.as_ref() != Some(&wanted) {
            masquerade::ensure(&wanted).await?;
            *installed = Some(wanted);
        }
        Ok(())
    }

    /// DEL for a sandbox whose ADD result was never recorded (the agent died between ADD
    /// and the sandbox record): with the current network list and no `prevResult`, so the
    /// plugins release the address and rules they keep by container id. Idempotent; a
    /// no-op when networking is unavailable.
    pub async fn detach_unrecorded(
        &self,
        sandbox_id: &str,
        netns: &Path,
    ) -> Result<(), NetworkError> {
        let Some(list) = self.resolve() else {
            return Ok(());
        };
        let args = Vec::new();
        let capabilities = Map::new();
        let at = Attachment {
            container_id: sandbox_id,
            netns: is_netns(netns).then_some(netns),
            ifname: POD_IFNAME,
            args: &args,
            capabilities: &capabilities,
        };
        self.invoker.del(&list, &at, None).await
    }
}

/// Removes the node-wide masquerade rule of a default network (uninstall, tests).
/// Succeeds when it is already gone.
pub async fn remove_masquerade(network: &DefaultNetwork) -> Result<(), NetworkError> {
    masquerade::remove(&Masquerade::new(&network.name, &network.subnet)).await
}

/// Whether `path` is a mounted network namespace (nsfs), not a leftover plain file.
fn is_netns(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_args_name_the_pod_as_containerd_does() {
        let pod = PodRef {
            sandbox_id: "sb1",
            namespace: "default",
            name: "web",
            uid: "u-1",
            ports: &[],
        };
        let args = pod.cni_args();
        let keys: Vec<_> = args.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            keys,
            [
                "K8S_POD_NAMESPACE=default",
                "K8S_POD_NAME=web",
                "K8S_POD_INFRA_CONTAINER_ID=sb1",
                "K8S_POD_UID=u-1"
            ]
        );
    }

    #[tokio::test]
    async fn missing_plugins_make_attach_return_none_instead_of_failing() {
        let dir = tempfile::tempdir().unwrap();
        let network = Network::new(
            CniConfig {
                conf_dir: dir.path().join("net.d"),
                bin_dirs: vec![dir.path().join("no-bin")],
                ..CniConfig::default()
            },
            dir.path(),
        );
        let pod = PodRef {
            sandbox_id: "sb",
            namespace: "ns",
            name: "n",
            uid: "u",
            ports: &[],
        };
        let got = network
            .attach(network.resolve(), &pod, Path::new("/nonexistent"))
            .await
            .unwrap();
        assert!(got.is_none());
        assert!(
            network.warned.load(Ordering::Relaxed),
            "no warning recorded"
        );
    }

    #[test]
    fn a_plain_file_is_not_a_network_namespace() {
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(!is_netns(file.path()));
        assert!(is_netns(Path::new("/proc/self/ns/net")));
    }
}

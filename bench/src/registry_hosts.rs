//! A containerd hosts directory (`DIR/<host>/hosts.toml`) that trusts a loopback test
//! registry's CA: what `ctr image pull --hosts-dir` and the peer's CRI
//! (`IRONLET_PEER_REGISTRY_HOSTS_DIR`) pull through.

use std::path::{Path, PathBuf};

use anyhow::Result;
use ironlet_runtime::testkit::registry::TestRegistry;

/// Writes `work/certs.d/<host>/hosts.toml` for `registry` and returns `work/certs.d`.
pub fn write_hosts_dir(work: &Path, registry: &TestRegistry) -> Result<PathBuf> {
    let dir = work.join("certs.d");
    let host = registry.host();
    std::fs::create_dir_all(dir.join(&host))?;
    let toml = format!(
        "server = \"https://{host}\"\n\n[host.\"https://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{}\"\n",
        registry.ca_file().display()
    );
    std::fs::write(dir.join(&host).join("hosts.toml"), toml)?;
    Ok(dir)
}

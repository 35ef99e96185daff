//! [`PeerNode`]: the upstream kubelet + containerd node of the API pod-start benchmark,
//! `scripts/peer-kubelet up` in a fresh directory and `down` when dropped (also after a failed
//! `up`), which stops both and removes every pod, mount, bridge, cgroup and the directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use ironlet_e2e::{describe, script_down, ControlPlane};

/// The upstream kubelet + containerd node, `scripts/peer-kubelet up` / `down` on drop.
pub struct PeerNode {
    script: PathBuf,
    dir: PathBuf,
    pub node: String,
    /// The directory of its binaries (kubelet, containerd, the shim); kubelet-api reads it.
    #[allow(dead_code)]
    pub bin: PathBuf,
}

impl PeerNode {
    pub fn up(plane: &ControlPlane, node: &str) -> Result<Self> {
        Self::up_with(plane, node, &[])
    }

    /// [`Self::up`] with `scripts/peer-kubelet` settings from the environment, e.g.
    /// `IRONLET_PEER_MAX_PODS` and `IRONLET_PEER_SUBNET`.
    pub fn up_with(plane: &ControlPlane, node: &str, env: &[(&str, String)]) -> Result<Self> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/peer-kubelet");
        let build = Command::new(&script)
            .arg("build")
            .output()
            .context("running scripts/peer-kubelet build")?;
        if !build.status.success() {
            bail!("scripts/peer-kubelet build failed:\n{}", describe(&build));
        }
        let bin = PathBuf::from(String::from_utf8_lossy(&build.stdout).trim());
        let kubeconfig = plane.node_kubeconfig(node)?;
        let peer = Self {
            script,
            dir: std::env::temp_dir().join(format!("ironlet-peer-{}", std::process::id())),
            node: node.to_owned(),
            bin,
        };
        // `peer` exists before `up` runs: a half-done `up` is torn down by the drop.
        let output = Command::new(&peer.script)
            .arg("up")
            .arg(&peer.dir)
            .arg(&kubeconfig)
            .arg(node)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .context("running scripts/peer-kubelet up")?;
        if !output.status.success() {
            bail!("scripts/peer-kubelet up failed:\n{}", describe(&output));
        }
        Ok(peer)
    }

    /// The node's state directory (static pod manifests in `manifests/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn log_tails(&self, lines: usize) -> String {
        let mut report = String::new();
        for name in ["containerd", "kubelet"] {
            let path = self.dir.join(format!("{name}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            report.push_str(&format!("== {} (tail)\n", path.display()));
            for line in &all[all.len().saturating_sub(lines)..] {
                report.push_str(line);
                report.push('\n');
            }
        }
        report
    }
}

impl Drop for PeerNode {
    fn drop(&mut self) {
        script_down(&self.script, &self.dir);
    }
}

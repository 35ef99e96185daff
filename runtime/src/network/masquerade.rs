//! One node-wide masquerade rule for ironlet's default network, instead of the `bridge`
//! plugin's `ipMasq`.
//!
//! `ipMasq: true` makes the bridge plugin create a NAT chain per pod at ADD and remove it
//! at DEL: about a dozen `iptables` runs per pod life, each taking the xtables lock, so a
//! burst of pod starts queues on that lock (measured: half of a 25–45 ms ADD). The rule is
//! the same for every pod of the subnet, so ironlet installs it once per node:
//!
//! ```text
//! -t nat -A POSTROUTING -s <subnet> -m comment --comment "ironlet network <name>" -j <chain>
//! <chain>: -d <subnet> RETURN; -d 224.0.0.0/4 RETURN; MASQUERADE
//! ```
//!
//! which is what the bridge plugin's per-pod chain does for each pod address. The default
//! conflist then says `ipMasq: false` and carries `"ironletMasquerade": "<subnet>"`, a
//! top-level key CNI ignores; [`ensure`] runs for such a list before the first ADD. The rule
//! outlives the agent on purpose: running pods keep their egress while it is down or
//! restarting. [`remove`] takes it out (tests, uninstall).

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::error::{NetworkError, Result};

/// The rule set for one network: a chain name derived from the network name and subnet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masquerade {
    network: String,
    subnet: String,
    chain: String,
}

impl Masquerade {
    pub fn new(network: &str, subnet: &str) -> Self {
        let digest = Sha256::digest(format!("{network}\0{subnet}").as_bytes());
        let mut chain = String::from("IRONLET-MASQ-");
        for byte in &digest[..6] {
            let _ = write!(chain, "{byte:02X}");
        }
        Self {
            network: network.to_owned(),
            subnet: subnet.to_owned(),
            chain,
        }
    }

    pub fn chain(&self) -> &str {
        &self.chain
    }

    fn comment(&self) -> String {
        format!("ironlet network {}", self.network)
    }

    /// The POSTROUTING jump, as `iptables` arguments after `-A`/`-C`/`-D POSTROUTING`.
    fn jump(&self) -> Vec<String> {
        [
            "-s",
            &self.subnet,
            "-m",
            "comment",
            "--comment",
            &self.comment(),
            "-j",
            &self.chain,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    }

    /// The chain's contents in `iptables-restore --noflush` form; declaring the chain
    /// flushes it, so rewriting is idempotent.
    fn chain_rules(&self) -> String {
        let Self { subnet, chain, .. } = self;
        format!(
            "*nat\n:{chain} - [0:0]\n\
             -A {chain} -d {subnet} -j RETURN\n\
             -A {chain} -d 224.0.0.0/4 -j RETURN\n\
             -A {chain} -j MASQUERADE\n\
             COMMIT\n"
        )
    }
}

/// Installs the rule set if it is not complete. Idempotent.
pub async fn ensure(masq: &Masquerade) -> Result<()> {
    restore(&masq.chain_rules()).await?;
    let mut check = vec!["-C".to_owned(), "POSTROUTING".to_owned()];
    check.extend(masq.jump());
    if iptables(&check).await.is_ok() {
        return Ok(());
    }
    let mut append = vec!["-A".to_owned(), "POSTROUTING".to_owned()];
    append.extend(masq.jump());
    iptables(&append).await?;
    tracing::info!(chain = %masq.chain, subnet = %masq.subnet, network = %masq.network,
        "installed the pod network's masquerade rule");
    Ok(())
}

/// Removes the rule set; succeeds when it is already gone.
pub async fn remove(masq: &Masquerade) -> Result<()> {
    let mut delete = vec!["-D".to_owned(), "POSTROUTING".to_owned()];
    delete.extend(masq.jump());
    // Deleted one match at a time; stop when none is left.
    for _ in 0..16 {
        if iptables(&delete).await.is_err() {
            break;
        }
    }
    for op in ["-F", "-X"] {
        if let Err(err) = iptables(&[op.to_owned(), masq.chain.clone()]).await {
            // A chain that does not exist is what we want.
            if !err.to_string().contains("No chain") && !err.to_string().contains("does not exist")
            {
                return Err(err);
            }
        }
    }
    Ok(())
}

async fn iptables(args: &[String]) -> Result<()> {
    let out = tokio::process::Command::new("iptables")
        .args(["-w", "5", "-t", "nat"])
        .args(args)
        .output()
        .await
        .map_err(|source| NetworkError::Masquerade {
            command: format!("iptables {}", args.join(" ")),
            reason: source.to_string(),
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(NetworkError::Masquerade {
        command: format!("iptables {}", args.join(" ")),
        reason: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

async fn restore(rules: &str) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let failed = |reason: String| NetworkError::Masquerade {
        command: "iptables-restore --noflush".into(),
        reason,
    };
    let mut child = tokio::process::Command::new("iptables-restore")
        .args(["--noflush", "-w", "5"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .await
            .map_err(|e| failed(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_name_fits_iptables_and_differs_per_network() {
        let a = Masquerade::new("ironlet", "10.85.0.0/16");
        let b = Masquerade::new("ironlet", "10.86.0.0/16");
        assert!(a.chain().len() <= 28, "{}", a.chain());
        assert_ne!(a.chain(), b.chain());
        assert_eq!(a, Masquerade::new("ironlet", "10.85.0.0/16"));
    }

    #[test]
    fn rules_skip_the_subnet_and_multicast_then_masquerade() {
        let m = Masquerade::new("ironlet", "10.85.0.0/16");
        let rules = m.chain_rules();
        let chain = m.chain();
        assert!(rules.contains(&format!("-A {chain} -d 10.85.0.0/16 -j RETURN")));
        assert!(rules.contains(&format!("-A {chain} -d 224.0.0.0/4 -j RETURN")));
        assert!(rules.ends_with(&format!("-A {chain} -j MASQUERADE\nCOMMIT\n")));
        assert_eq!(m.jump()[..2], ["-s".to_owned(), "10.85.0.0/16".to_owned()]);
    }
}

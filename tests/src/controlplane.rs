//! [`ControlPlane`]: `scripts/controlplane up` in a fresh state directory, `down` on drop.
//!
//! Guarantees: `up` either returns a control plane whose apiserver answered `/readyz` or an
//! error carrying the script's output (with the tail of the failing component's log); every
//! process it started is stopped and the state directory removed when the value is dropped,
//! including while a test panics.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

/// A running control plane; see the module docs.
#[derive(Debug)]
pub struct ControlPlane {
    script: PathBuf,
    dir: PathBuf,
    env: BTreeMap<String, String>,
}

impl ControlPlane {
    /// Builds the binaries if needed and starts a control plane in a new directory under the
    /// temp dir. Takes a few seconds (about 10 minutes the first time on a machine).
    pub fn up() -> Result<Self> {
        Self::up_with(&[])
    }

    /// [`Self::up`] with environment variables for `scripts/controlplane up`, e.g.
    /// `IRONLET_CP_SIGNING_DURATION` (see the script's header).
    pub fn up_with(env: &[(&str, &str)]) -> Result<Self> {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/controlplane");
        let dir = std::env::temp_dir().join(format!(
            "ironlet-cp-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        // The build (minutes, once per machine) reports its progress on our stderr.
        let build = Command::new(&script)
            .arg("build")
            .stdout(std::process::Stdio::null())
            .status()
            .with_context(|| format!("running {} build", script.display()))?;
        if !build.success() {
            bail!("scripts/controlplane build failed ({build}); its output is above");
        }
        let output = Command::new(&script)
            .arg("up")
            .arg(&dir)
            .envs(env.iter().copied())
            .output()
            .with_context(|| format!("running {}", script.display()))?;
        // From here on `down` must run, also when `up` failed half-way.
        let mut plane = Self {
            script,
            dir,
            env: BTreeMap::new(),
        };
        if !output.status.success() {
            bail!("scripts/controlplane up failed:\n{}", describe(&output));
        }
        plane.env = parse_env(&String::from_utf8_lossy(&output.stdout));
        for key in [
            "IRONLET_CP_SERVER",
            "IRONLET_CP_ADMIN_KUBECONFIG",
            "IRONLET_CP_BIN",
        ] {
            if !plane.env.contains_key(key) {
                bail!(
                    "scripts/controlplane up printed no {key}:\n{}",
                    describe(&output)
                );
            }
        }
        Ok(plane)
    }

    /// The state directory (certificates, kubeconfigs, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The apiserver URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.env["IRONLET_CP_SERVER"]
    }

    /// The kubeconfig of `system:masters` admin.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        PathBuf::from(&self.env["IRONLET_CP_ADMIN_KUBECONFIG"])
    }

    /// A kubeconfig for node `name` (`system:node:<name>` in `system:nodes`).
    pub fn node_kubeconfig(&self, name: &str) -> Result<PathBuf> {
        let output = Command::new(&self.script)
            .args(["node", name])
            .arg(&self.dir)
            .output()
            .with_context(|| format!("running {}", self.script.display()))?;
        if !output.status.success() {
            bail!(
                "scripts/controlplane node {name} failed:\n{}",
                describe(&output)
            );
        }
        Ok(PathBuf::from(
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        ))
    }

    /// A client with admin rights.
    pub async fn admin_client(&self) -> Result<Client> {
        client_from_kubeconfig(&self.admin_kubeconfig()).await
    }

    /// A client authenticated as node `name`.
    pub async fn node_client(&self, name: &str) -> Result<Client> {
        client_from_kubeconfig(&self.node_kubeconfig(name)?).await
    }

    /// The last `lines` lines of each component's log, for failure reports.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut report = String::new();
        for component in [
            "etcd",
            "kube-apiserver",
            "kube-scheduler",
            "kube-controller-manager",
        ] {
            let path = self.dir.join(format!("{component}.log"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            report.push_str(&format!(
                "== {} (last {} lines)\n",
                path.display(),
                tail.len()
            ));
            for line in tail {
                report.push_str(line);
                report.push('\n');
            }
        }
        report
    }

    /// The control plane's `kubectl` as admin, to run as the caller likes (in the
    /// background, with its own stdio).
    pub fn kubectl_command(&self) -> Command {
        let mut command = Command::new(Path::new(&self.env["IRONLET_CP_BIN"]).join("kubectl"));
        command.arg("--kubeconfig").arg(self.admin_kubeconfig());
        command
    }

    /// Runs the control plane's `kubectl` as admin; its stdout, or an error with stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let output = self
            .kubectl_command()
            .args(args)
            .output()
            .context("running kubectl")?;
        if !output.status.success() {
            bail!("kubectl {} failed:\n{}", args.join(" "), describe(&output));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        script_down(&self.script, &self.dir);
    }
}

/// The local port a `kubectl port-forward … :REMOTE` reports on `stdout` ("Forwarding from
/// 127.0.0.1:40123 -> 80"), sent once; a thread reads and drops the later lines so that
/// kubectl never blocks on a full pipe.
pub fn forwarded_port(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<u16> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
        {
            let port = line
                .strip_prefix("Forwarding from 127.0.0.1:")
                .and_then(|rest| rest.split(' ').next())
                .and_then(|p| p.parse::<u16>().ok());
            if let (Some(port), Some(tx)) = (port, tx.take()) {
                let _ = tx.send(port);
            }
        }
    });
    rx
}

/// Runs `<script> down <dir>` (the teardown of `scripts/controlplane` and
/// `scripts/peer-kubelet`), for a `Drop`: a failure is reported on stderr, not returned.
pub fn script_down(script: &Path, dir: &Path) {
    match Command::new(script).arg("down").arg(dir).output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => eprintln!(
            "{} down {} failed:\n{}",
            script.display(),
            dir.display(),
            describe(&output)
        ),
        Err(err) => eprintln!("cannot run {}: {err}", script.display()),
    }
}

/// A client from a kubeconfig file (certificate paths in it are read as usual).
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    ironlet::apiserver::client::client(config).context("building the client")
}

/// Polls `check` every 100 ms until it returns `Some`, for at most `timeout`; the error
/// names `what` and the last error `check` returned.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(err) => last_error = Some(err),
        }
        if tokio::time::Instant::now() >= deadline {
            match last_error {
                Some(err) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {err:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A finished command's status, stdout and stderr, for an error message.
pub fn describe(output: &Output) -> String {
    format!(
        "{}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

//! [`ClusterAgent`]: a real `ironlet run --kubeconfig` child process joined to a
//! [`ControlPlane`](crate::ControlPlane), on its own temp data root, manifest directory, log
//! directory, cgroup root and CNI bridge, with busybox imported.
//!
//! Guarantees: dropping it removes every manifest and waits (up to 40 s) for the agent to
//! remove its pods' sandboxes, then sends SIGTERM (SIGKILL after 10 s) and removes what is
//! left: mounts under the data root, its bridge, its cgroup tree and the data root. Tests
//! delete the API pods they create.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A running agent.
pub struct ClusterAgent {
    pub root: PathBuf,
    pub manifests: PathBuf,
    pub node_name: String,
    pub log_file: PathBuf,
    bridge: String,
    cgroup_root: String,
    child: Option<Child>,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `ironlet` binary beside this test executable (built on demand with cargo).
pub fn ironlet_binary() -> Result<PathBuf> {
    if let Ok(path) = std::env::var("IRONLET_BIN") {
        return Ok(PathBuf::from(path));
    }
    let status = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "ironlet", "--bin", "ironlet"])
        .current_dir(repo_root())
        .status()
        .context("running cargo build for the ironlet binary")?;
    if !status.success() {
        bail!("cargo build -p ironlet failed");
    }
    let exe = std::env::current_exe().context("locating the test executable")?;
    let debug = exe
        .parent()
        .and_then(Path::parent)
        .context("test executable has no target dir")?;
    Ok(debug.join("ironlet"))
}

/// The test images, built once.
pub fn images_out() -> Result<PathBuf> {
    let out = repo_root().join("images/out");
    if !out.join("busybox/index.json").exists() {
        let status = Command::new(repo_root().join("images/build"))
            .arg(&out)
            .status()
            .context("running images/build")?;
        if !status.success() {
            bail!("images/build failed");
        }
    }
    Ok(out)
}

impl ClusterAgent {
    /// Imports busybox and starts `ironlet run --kubeconfig <kubeconfig>` as `node_name`.
    pub fn start(kubeconfig: &Path, node_name: &str, slot: u32) -> Result<Self> {
        Self::start_with_args(kubeconfig, node_name, slot, &[])
    }

    /// [`Self::start`] with more `ironlet run` flags (`--registry-config FILE`).
    pub fn start_with_args(
        kubeconfig: &Path,
        node_name: &str,
        slot: u32,
        extra: &[&std::ffi::OsStr],
    ) -> Result<Self> {
        Self::start_on(kubeconfig, node_name, slot, extra, LOOPBACK)
    }

    /// [`Self::start_with_args`] with `--node-ip node_ip` (the API server's node proxy,
    /// `/api/v1/nodes/NAME/proxy/…`, refuses a loopback node: see [`routable_host_ip`]).
    pub fn start_on(
        kubeconfig: &Path,
        node_name: &str,
        slot: u32,
        extra: &[&std::ffi::OsStr],
        node_ip: IpAddr,
    ) -> Result<Self> {
        Self::start_full(kubeconfig, node_name, slot, extra, node_ip, None)
    }

    /// [`Self::start_with_args`] with the pod network on `subnet` (CIDR) instead of
    /// `10.88.<slot>.0/24`: a /24 holds 253 pods, a density run needs more.
    pub fn start_on_subnet(
        kubeconfig: &Path,
        node_name: &str,
        slot: u32,
        extra: &[&std::ffi::OsStr],
        subnet: &str,
    ) -> Result<Self> {
        Self::start_full(kubeconfig, node_name, slot, extra, LOOPBACK, Some(subnet))
    }

    fn start_full(
        kubeconfig: &Path,
        node_name: &str,
        slot: u32,
        extra: &[&std::ffi::OsStr],
        node_ip: IpAddr,
        subnet: Option<&str>,
    ) -> Result<Self> {
        let built = ironlet_binary()?;
        let root = std::env::temp_dir().join(format!("ironlet-e2e-{node_name}"));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).context("creating the data root")?;
        // A private copy: the shared target directory may be rebuilt by others meanwhile.
        let binary = root.join("ironlet");
        std::fs::copy(&built, &binary).with_context(|| format!("copying {}", built.display()))?;
        let manifests = root.join("manifests");
        std::fs::create_dir_all(&manifests).context("creating the manifest dir")?;
        let import = Command::new(&binary)
            .arg("--root-dir")
            .arg(&root)
            .args(["images", "import"])
            .arg(images_out()?.join("busybox"))
            .output()
            .context("running ironlet images import")?;
        if !import.status.success() {
            bail!(
                "image import failed: {}",
                String::from_utf8_lossy(&import.stderr)
            );
        }
        let bridge = format!("irlc{slot}");
        let cgroup_root = format!("/ironlet-e2e-{node_name}");
        let cni = root.join("cni");
        std::fs::create_dir_all(&cni).context("creating the CNI dir")?;
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": format!("e2ec{slot}"),
            "plugins": [{
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                // As ironlet's default network: ironlet names each pod's address.
                "capabilities": {"ips": true},
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet.map_or_else(|| format!("10.88.{slot}.0/24"), str::to_owned)}]],
                    "dataDir": root.join("cni/networks"),
                },
            }],
        });
        std::fs::write(cni.join("10-e2e.conflist"), conflist.to_string())
            .context("writing the CNI config")?;
        let kubelet_api = kubelet_api_flags(kubeconfig, node_name, node_ip);
        let log_file = root.join("agent.log");
        let log = std::fs::File::create(&log_file).context("creating the agent log")?;
        let child = Command::new(&binary)
            .arg("--root-dir")
            .arg(&root)
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--node-name")
            .arg(node_name)
            .arg("--pod-manifest-path")
            .arg(&manifests)
            .arg("--pod-logs-dir")
            .arg(root.join("logs"))
            .arg("--cgroup-root")
            .arg(&cgroup_root)
            .arg("--cni-conf-dir")
            .arg(&cni)
            .args(extra)
            .args(
                // kubelet's disk thresholds (nodefs 10 %, imagefs 15 %) hold on a shared CI
                // disk that others fill: DiskPressure would reject and evict the tests' pods.
                (!extra
                    .iter()
                    .any(|a| a.to_string_lossy().starts_with("--eviction-hard")))
                .then_some("--eviction-hard=memory.available<100Mi"),
            )
            .args(kubelet_api)
            // IRONLET_E2E_LOG: another filter for a debug run (e.g. exec timings).
            .env(
                "IRONLET_LOG",
                std::env::var("IRONLET_E2E_LOG")
                    .unwrap_or_else(|_| "info,libcontainer=off,libcgroups=off".to_owned()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("log fd")?)
            .stderr(log)
            .spawn()
            .context("starting ironlet run")?;
        Ok(Self {
            root,
            manifests,
            node_name: node_name.to_owned(),
            log_file,
            bridge,
            cgroup_root,
            child: Some(child),
        })
    }

    /// The supervisor's pid (`ironlet run`, the process this harness started), while it runs.
    pub fn supervisor_pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok())
    }

    /// The node's cgroup root (`--cgroup-root`), e.g. `/ironlet-e2e-NODE`.
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    /// The agent's log so far without terminal colour sequences (tracing colours it).
    pub fn plain_log(&self) -> String {
        let log = self.log();
        let mut out = String::with_capacity(log.len());
        let mut chars = log.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // A CSI sequence ends with a letter.
                chars.by_ref().find(char::is_ascii_alphabetic);
            } else {
                out.push(c);
            }
        }
        out
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Writes a static pod manifest (write, then rename).
    pub fn write_manifest(&self, file: &str, yaml: &str) -> Result<()> {
        let tmp = self.root.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).context("writing manifest")?;
        std::fs::rename(&tmp, self.manifests.join(file)).context("renaming manifest")
    }

    pub fn remove_manifest(&self, file: &str) -> Result<()> {
        std::fs::remove_file(self.manifests.join(file)).context("removing manifest")
    }

    /// Sends `signal` to the supervisor (the process this harness started): SIGHUP
    /// upgrades the agent to the binary on disk.
    pub fn signal_supervisor(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        let supervisor = self.supervisor_pid().context("no supervisor")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(supervisor), signal)
            .context("signalling the supervisor")
    }

    /// SIGTERM, then SIGKILL after 10 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for ClusterAgent {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.manifests) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let sandboxes = self.root.join("sandboxes");
        let deadline = Instant::now() + Duration::from_secs(40);
        while Instant::now() < deadline
            && std::fs::read_dir(&sandboxes).is_ok_and(|mut d| d.next().is_some())
        {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.stop();
        // Containers of pods the agent did not get to remove (a failed test's pods).
        let tree = Path::new("/sys/fs/cgroup/pids").join(self.cgroup_root.trim_start_matches('/'));
        for pid in pids_in_tree(&tree) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let root = self.root.to_string_lossy().into_owned();
        let under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| m.starts_with(&root))
            .collect();
        for m in under.iter().rev() {
            let _ = nix::mount::umount2(*m, nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(Stdio::null())
            .status();
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for controller in controllers.flatten() {
                remove_cgroup_tree(
                    &controller
                        .path()
                        .join(self.cgroup_root.trim_start_matches('/')),
                );
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// The host's address on its default route (no packet is sent), which `scripts/controlplane`
/// also puts in node serving certificates; `None` on a machine without a route.
pub fn routable_host_ip() -> Option<IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("1.1.1.1:53").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// The kubelet API on `node_ip` (loopback by default) with a free port (agents run side by side), the serving
/// certificate `scripts/controlplane node` issued beside the kubeconfig
/// (`DIR/nodes/NAME.kubeconfig` → `DIR/pki/node-NAME-serving.*`) and the control plane's CA
/// for client certificates; without that certificate, the self-signed default.
fn kubelet_api_flags(
    kubeconfig: &Path,
    node_name: &str,
    node_ip: IpAddr,
) -> Vec<std::ffi::OsString> {
    let mut flags: Vec<std::ffi::OsString> = vec!["--node-ip".into(), node_ip.to_string().into()];
    flags.extend(
        ["--port", "0", "--healthz-port", "0"]
            .into_iter()
            .map(Into::into),
    );
    let Some(pki) = kubeconfig
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("pki"))
    else {
        return flags;
    };
    let (cert, key) = (
        pki.join(format!("node-{node_name}-serving.crt")),
        pki.join(format!("node-{node_name}-serving.key")),
    );
    if cert.exists() && key.exists() {
        flags.extend(["--tls-cert-file".into(), cert.into_os_string()]);
        flags.extend(["--tls-private-key-file".into(), key.into_os_string()]);
        flags.extend([
            "--client-ca-file".into(),
            pki.join("ca.crt").into_os_string(),
        ]);
    }
    flags
}

/// The processes in cgroup directory `dir` and below (`cgroup.procs` of each level).
pub fn pids_in_tree(dir: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                pids.extend(pids_in_tree(&e.path()));
            }
        }
    }
    pids
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

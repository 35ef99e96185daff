//! End-to-end harness: a real `ironlet run` on a temp data root, a manifest directory, its
//! own cgroup tree and log directory, with busybox imported; pods read back over the
//! agent's local socket. Dropping an [`Agent`] removes every manifest, waits for the pods
//! to go, stops the agent and checks nothing is left.
//!
//! The process started is the supervisor; the agent is its child (see
//! docs/CRASH_SAFETY.md). [`Agent::kill_agent`] SIGKILLs the agent alone.

#![allow(dead_code)]

pub mod crash;
pub mod rootless;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The host's own address: the source of its default route (where pasta copies it into a
/// rootless pod, and where portmap's DNAT answers a local connection).
pub fn host_address() -> String {
    let out = Command::new("ip")
        .args(["-4", "route", "get", "198.51.100.1"])
        .output()
        .expect("ip route get");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = out.split_whitespace();
    words
        .by_ref()
        .find(|w| *w == "src")
        .and_then(|_| words.next())
        .unwrap_or_default()
        .to_owned()
}

/// Connects to `address:port` until it answers with something, or `timeout` passes.
pub fn answer_at(address: &str, port: u16, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(mut conn) = std::net::TcpStream::connect((address, port)) {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut got = String::new();
            let _ = conn.read_to_string(&mut got);
            if !got.is_empty() {
                return Some(got);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// A free TCP port on the host's loopback.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A server on the host's loopback that answers one connection with `answer` within 60 s;
/// its port, and the thread that tells whether it was reached.
pub fn serve_once_on_loopback(answer: &'static str) -> (u16, std::thread::JoinHandle<bool>) {
    let server = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = server.local_addr().expect("addr").port();
    server.set_nonblocking(true).expect("nonblocking");
    let serving = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            match server.accept() {
                Ok((mut conn, _)) => {
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.write_all(answer.as_bytes());
                    return true;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        false
    });
    (port, serving)
}

/// The test images, built once.
pub fn images_out() -> PathBuf {
    ironlet_runtime::testkit::test_images().expect("images/build produces the test images")
}

/// A running agent.
pub struct Agent {
    pub root: tempfile::TempDir,
    pub manifests: PathBuf,
    pub logs: PathBuf,
    pub cgroup_root: String,
    pub node_name: String,
    /// This agent's own CNI bridge (a conflist in its data root names it).
    pub bridge: String,
    child: Option<Child>,
    log_file: PathBuf,
    options: AgentOptions,
}

/// Distinct bridge names and subnets for the agents of one test process.
static NETWORKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Writes a bridge conflist of its own under `root/cni` so that concurrent test agents do
/// not share a bridge, subnet or IPAM state. Returns the bridge name.
fn write_test_network(root: &Path) -> String {
    let n = NETWORKS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let slot = (std::process::id() * 7 + n) % 250;
    let bridge = format!("irle{slot}");
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": format!("e2e{slot}"),
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": format!("10.87.{slot}.0/24")}]],
                "dataDir": root.join("cni/networks"),
            },
        }],
    });
    std::fs::create_dir_all(root.join("cni")).expect("cni dir");
    std::fs::write(root.join("cni/10-e2e.conflist"), conflist.to_string()).expect("conflist");
    bridge
}

/// The `--eviction-hard` of test agents (unless a test sets its own): kubelet's memory
/// threshold only.
pub const TEST_EVICTION_HARD: &str = "memory.available<100Mi";

/// Options of [`Agent::start_with`].
#[derive(Default, Clone)]
pub struct AgentOptions {
    pub extra_args: Vec<String>,
    /// `--system-reserved`, e.g. "memory=1Gi".
    pub system_reserved: Option<String>,
    /// Run this binary instead of the one cargo built (e.g. a copy to replace later).
    pub binary: Option<PathBuf>,
    /// Start with `--config <root>/config.yaml`, a KubeletConfiguration whose
    /// `staticPodPath` is the manifest directory (no `--pod-manifest-path` flag), followed
    /// by these YAML lines.
    pub config: Option<String>,
    /// Mount a tmpfs of this size (e.g. "256m") as the data root: a small node filesystem
    /// for disk pressure (unmounted when the agent is dropped).
    pub root_tmpfs_size: Option<String>,
}

/// What the agent's `/version` says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    pub version: String,
    pub pid: i32,
    pub supervisor_pid: i32,
    pub binary: String,
    pub binary_device: u64,
    pub binary_inode: u64,
    pub start_ticks: u64,
}

impl Agent {
    pub fn start() -> Self {
        Self::start_with(AgentOptions::default())
    }

    pub fn start_with(options: AgentOptions) -> Self {
        let root = tempfile::Builder::new()
            .prefix("ironlet-e2e")
            .tempdir()
            .expect("temp dir");
        if let Some(size) = &options.root_tmpfs_size {
            nix::mount::mount(
                Some("tmpfs"),
                root.path(),
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                Some(format!("size={size},mode=0700").as_str()),
            )
            .expect("mounting a tmpfs as the data root");
        }
        let manifests = root.path().join("manifests");
        let logs = root.path().join("logs");
        std::fs::create_dir_all(&manifests).expect("manifest dir");
        let suffix = root
            .path()
            .file_name()
            .map(|n| {
                n.to_string_lossy()
                    .replace(|c: char| !c.is_ascii_alphanumeric(), "")
            })
            .unwrap_or_default();
        let cgroup_root = format!("/ironlet-e2e-{suffix}");
        let node_name = "e2e-node".to_owned();
        let import = Command::new(env!("CARGO_BIN_EXE_ironlet"))
            .arg("--root-dir")
            .arg(root.path())
            .args(["images", "import"])
            .arg(images_out().join("busybox"))
            .output()
            .expect("ironlet images import runs");
        assert!(
            import.status.success(),
            "import failed: {}",
            String::from_utf8_lossy(&import.stderr)
        );
        let log_file = root.path().join("agent.log");
        let bridge = write_test_network(root.path());
        let mut agent = Self {
            bridge,
            root,
            manifests,
            logs,
            cgroup_root,
            node_name,
            child: None,
            log_file,
            options,
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let options = self.options.clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_file)
            .expect("agent log file");
        let binary = options
            .binary
            .clone()
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ironlet")));
        let mut cmd = Command::new(binary);
        cmd.arg("--root-dir")
            .arg(self.root.path())
            .arg("-v")
            .arg("run");
        match &options.config {
            Some(lines) => {
                let file = self.root.path().join("config.yaml");
                let text = format!(
                    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                     staticPodPath: {}\n{lines}",
                    self.manifests.display()
                );
                std::fs::write(&file, text).expect("config file");
                cmd.arg("--config").arg(file);
            }
            None => {
                cmd.arg("--pod-manifest-path").arg(&self.manifests);
            }
        }
        cmd.arg("--pod-logs-dir")
            .arg(&self.logs)
            .arg("--node-name")
            .arg(&self.node_name)
            .arg("--cgroup-root")
            .arg(&self.cgroup_root)
            .arg("--file-check-frequency")
            .arg("5s")
            .arg("--cni-conf-dir")
            .arg(self.root.path().join("cni"));
        if let Some(r) = &options.system_reserved {
            cmd.arg("--system-reserved").arg(r);
        }
        let sets_eviction = options
            .extra_args
            .iter()
            .any(|a| a.starts_with("--eviction-hard"))
            || options
                .config
                .as_deref()
                .is_some_and(|c| c.contains("evictionHard"));
        if !sets_eviction {
            // kubelet's disk thresholds (nodefs 10 %, imagefs 15 %) hold on a shared CI disk
            // that others fill: DiskPressure would reject and evict the tests' pods.
            cmd.arg(format!("--eviction-hard={TEST_EVICTION_HARD}"));
        }
        cmd.args(&options.extra_args)
            .env("IRONLET_LOG", "info,libcontainer=off,libcgroups=off")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        self.child = Some(cmd.spawn().expect("ironlet run starts"));
        self.wait_until(
            "the agent serves its socket",
            Duration::from_secs(20),
            |a| a.try_get("/healthz").is_some(),
        );
    }

    /// Kills the agent with SIGKILL (pods keep running); the supervisor starts it again.
    /// Waits until the new agent answers.
    pub fn restart(&mut self) {
        let before = self.version().map(|v| v.pid);
        self.kill_agent();
        self.wait_until("a new agent answers", Duration::from_secs(20), |a| {
            a.version().is_some_and(|v| Some(v.pid) != before)
        });
    }

    /// SIGKILLs the supervisor (the agent follows it: parent-death signal), waits until the
    /// agent is gone, and starts `ironlet run` again on the same data root.
    pub fn restart_supervisor(&mut self) {
        let agent = self.version().map(|v| v.pid);
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(pid) = agent {
            let start = Instant::now();
            while Path::new(&format!("/proc/{pid}")).exists()
                && start.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.spawn();
    }

    /// SIGKILLs the agent process (not the supervisor); returns when the signal was sent.
    pub fn kill_agent(&self) -> Instant {
        let mut version = None;
        self.wait_until("the agent answers /version", Duration::from_secs(20), |a| {
            version = a.version();
            version.is_some()
        });
        let version = version.expect("checked above");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(version.pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill -9 the agent");
        Instant::now()
    }

    /// Sends `signal` to the supervisor.
    pub fn signal_supervisor(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.supervisor_pid()), signal)
            .expect("signal the supervisor");
    }

    /// The supervisor's pid (the process this harness started).
    pub fn supervisor_pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// The running agent's `/version`, if it answers.
    pub fn version(&self) -> Option<Version> {
        serde_json::from_str(&self.try_get("/version")?).ok()
    }

    pub fn socket(&self) -> PathBuf {
        self.root.path().join("ironlet.sock")
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    pub fn write_manifest(&self, file: &str, yaml: &str) {
        // Write then rename, as editors and config management do.
        let tmp = self.root.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.join(file)).expect("rename manifest");
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).expect("remove manifest");
    }

    /// GET over the local socket; `None` if the agent does not answer 200.
    pub fn try_get(&self, path: &str) -> Option<String> {
        let mut stream = UnixStream::connect(self.socket()).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
    }

    /// Every pod the agent knows, with status.
    pub fn pods(&self) -> Vec<Pod> {
        let Some(body) = self.try_get("/pods") else {
            return Vec::new();
        };
        serde_json::from_str::<k8s_openapi::List<Pod>>(&body)
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// The pod named `name` (static pods are `<name>-<node>`).
    pub fn pod(&self, name: &str) -> Option<Pod> {
        let full = format!("{name}-{}", self.node_name);
        self.pods()
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(full.as_str()))
    }

    /// Polls `check` every 50 ms until it returns true; panics with the agent log after
    /// `timeout`.
    pub fn wait_until(&self, what: &str, timeout: Duration, mut check: impl FnMut(&Self) -> bool) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if check(self) {
                return;
            }
            if let Some(child) = &self.child {
                let _ = child;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "timed out after {timeout:?} waiting for {what}\n--- pods ---\n{}\n--- agent log (tail) ---\n{}",
            serde_json::to_string_pretty(&self.pods()).unwrap_or_default(),
            tail(&self.log(), 60)
        );
    }

    /// Waits for the pod and returns it once `check` holds.
    pub fn wait_pod(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Pod) -> bool,
    ) -> Pod {
        let mut found = None;
        self.wait_until(&format!("pod {name}: {what}"), timeout, |a| {
            found = a.pod(name).filter(|p| check(p));
            found.is_some()
        });
        found.expect("checked above")
    }

    /// Processes whose cgroup lies under this agent's tree.
    pub fn processes_in_tree(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return pids;
        };
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if cgroup.contains(&format!("{}/", self.cgroup_root)) {
                pids.push(pid);
            }
        }
        pids
    }

    /// Processes in this agent's cgroup tree by container id (the last component of their
    /// cgroup path), each with its pid namespace pid (1 for the container's init).
    pub fn container_processes(&self) -> std::collections::HashMap<String, Vec<(i32, i32)>> {
        let mut out: std::collections::HashMap<String, Vec<(i32, i32)>> = Default::default();
        let marker = format!("{}/", self.cgroup_root);
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let Some(path) = cgroup
                .lines()
                .filter_map(|l| l.splitn(3, ':').nth(2))
                .find(|p| p.contains(&marker))
            else {
                continue;
            };
            let Some(id) = path.rsplit('/').next() else {
                continue;
            };
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let ns_pid = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|l| l.split_whitespace().last())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            out.entry(id.to_owned()).or_default().push((pid, ns_pid));
        }
        out
    }

    /// The stdout lines of a pod's container, from its CRI log (attempt 0). A last record
    /// without its newline is still being written and not counted.
    pub fn log_lines(&self, pod: &Pod, container: &str) -> Vec<String> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let path = self
            .logs
            .join(format!("default_{name}_{uid}"))
            .join(format!("{container}/0.log"));
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .filter_map(|l| {
                let (stream, partial, content) = ironlet_runtime::local::logs::parse_record(l)?;
                (stream == "stdout" && !partial).then(|| content.to_owned())
            })
            .collect()
    }

    /// Mounts under this agent's data root.
    pub fn mounts_under_root(&self) -> Vec<String> {
        let root = self.root.path().to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&root))
            .map(str::to_owned)
            .collect()
    }

    /// Pod cgroup directories (`pod<uid>`) under this agent's tree, in any v1 controller.
    pub fn pod_cgroups(&self) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for controller in cgroup_controllers() {
            let base = controller.join(self.cgroup_root.trim_start_matches('/'));
            walk_pod_dirs(&base, &mut found);
        }
        found
    }
}

fn walk_pod_dirs(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if entry.file_name().to_string_lossy().starts_with("pod") {
                found.push(path.clone());
            }
            walk_pod_dirs(&path, found);
        }
    }
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Remove every pod through the agent, so the test leaves no container behind.
        if let Ok(entries) = std::fs::read_dir(&self.manifests) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if self.pods().is_empty() && self.processes_in_tree().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
        for pid in self.processes_in_tree() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(Stdio::null())
            .status();
        for m in self.mounts_under_root().iter().rev() {
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        // The node tree itself (kubepods, burstable, besteffort) in every controller.
        for base in cgroup_controllers() {
            remove_cgroup_tree(&base.join(self.cgroup_root.trim_start_matches('/')));
        }
    }
}

/// The directories under /sys/fs/cgroup that are cgroup mounts (v1 controllers, `unified`,
/// or the v2 root itself), whatever this host co-mounts.
fn cgroup_controllers() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let point = left.split_whitespace().nth(4)?;
            (matches!(fstype, "cgroup" | "cgroup2") && point.starts_with("/sys/fs/cgroup"))
                .then(|| PathBuf::from(point))
        })
        .collect();
    out.sort();
    out.dedup();
    out
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

/// Container status by name.
pub fn container_status<'a>(
    pod: &'a Pod,
    name: &str,
) -> Option<&'a k8s_openapi::api::core::v1::ContainerStatus> {
    let status = pod.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

pub fn condition(pod: &Pod, kind: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
}

pub fn restart_count(pod: &Pod, name: &str) -> i32 {
    container_status(pod, name).map_or(-1, |c| c.restart_count)
}

pub fn running_pid_of(pod: &Pod, name: &str) -> Option<bool> {
    container_status(pod, name).map(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some())
}

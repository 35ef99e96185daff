//! Plain data exchanged across the [`Runtime`](crate::Runtime) and
//! [`ImageService`](crate::ImageService) seams.
//!
//! These mirror the kubelet's `kubecontainer` and CRI types (`PodSandboxConfig`,
//! `ContainerConfig`, `ContainerStatus`, `Image`) but carry only what ironlet uses. They
//! know nothing of the Kubernetes API objects: the agent translates a `v1.Pod` into these.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// Identifies one container (or sandbox) of this runtime: 32 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ContainerId(String);

impl ContainerId {
    /// A fresh random id.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        // getrandom never fails on Linux >= 3.17 for 16 bytes; fall back to time+pid if it does.
        if nix_getrandom(&mut bytes).is_err() {
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            bytes[..16].copy_from_slice(&(nanos ^ u128::from(std::process::id())).to_le_bytes());
        }
        Self(hex::encode(bytes))
    }

    /// Parses an id given by a user or read from disk; only `[0-9a-z-]{1,64}` is accepted
    /// so that an id can never name a path outside the state directory.
    pub fn parse(s: &str) -> Option<Self> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase() || b == b'-');
        ok.then(|| Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 characters, as `crictl ps` shows them.
    pub fn short(&self) -> &str {
        &self.0[..self.0.len().min(12)]
    }
}

fn nix_getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    // SAFETY: buf is a valid writable slice of buf.len() bytes.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 || n as usize != buf.len() {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A pod sandbox is identified like a container.
pub type SandboxId = ContainerId;

/// What a pod sandbox needs: identity, namespaces to share, where logs go.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodSandboxConfig {
    pub pod_uid: String,
    pub name: String,
    pub namespace: String,
    /// Incremented each time the sandbox of the same pod is recreated.
    pub attempt: u32,
    pub hostname: String,
    pub host_network: bool,
    pub host_ipc: bool,
    pub host_pid: bool,
    /// `/var/log/pods/<ns>_<name>_<uid>` unless overridden.
    pub log_directory: PathBuf,
    /// The pod's cgroup, relative to the hierarchy root, e.g. `/kubepods/burstable/pod<uid>`.
    pub cgroup_parent: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Host ports published to the pod (`hostPort`, `ctr run -p`): CNI's `portMappings`
    /// as root, pasta's forwards rootless.
    #[serde(default)]
    pub port_mappings: Vec<PortMapping>,
}

/// Transport of a published port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

/// One published port: `host_ip:host_port` on the host reaches `container_port` in the pod
/// (CRI's `PortMapping`). An empty `host_ip` means every host address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortMapping {
    pub protocol: Protocol,
    pub container_port: u16,
    pub host_port: u16,
    #[serde(default)]
    pub host_ip: String,
}

/// A bind mount into a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub container_path: String,
    pub host_path: PathBuf,
    pub read_only: bool,
}

/// Linux resources of one container, already converted to cgroup units.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinuxResources {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit_bytes: Option<i64>,
    pub pids_limit: Option<i64>,
    pub oom_score_adj: Option<i32>,
}

/// Which seccomp profile a container runs under.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SeccompProfile {
    /// containerd's default profile (Kubernetes `RuntimeDefault`).
    #[default]
    RuntimeDefault,
    Unconfined,
    /// A JSON profile in the OCI `linux.seccomp` format.
    Localhost(PathBuf),
}

/// The security context of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityConfig {
    pub privileged: bool,
    pub read_only_rootfs: bool,
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub supplemental_groups: Vec<u32>,
    /// Capability names as Kubernetes spells them (`NET_ADMIN`, with or without `CAP_`).
    pub add_capabilities: Vec<String>,
    pub drop_capabilities: Vec<String>,
    /// The process's `no_new_privs`. The agent sets it as kubelet does, for
    /// `allowPrivilegeEscalation: false` only; `ironlet ctr run` (the default here) always.
    pub no_new_privs: bool,
    pub seccomp: SeccompProfile,
}

impl Default for SecurityConfig {
    fn default() -> Self {
        Self {
            privileged: false,
            read_only_rootfs: false,
            run_as_user: None,
            run_as_group: None,
            supplemental_groups: Vec::new(),
            add_capabilities: Vec::new(),
            drop_capabilities: Vec::new(),
            no_new_privs: true,
            seccomp: SeccompProfile::RuntimeDefault,
        }
    }
}

/// Everything needed to create one container in a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerConfig {
    pub name: String,
    /// Restart count of this container within its pod (CRI `attempt`); names the log file.
    pub attempt: u32,
    /// A reference as the user wrote it; the image service resolves it.
    pub image: String,
    /// Overrides the image's entrypoint when non-empty (Kubernetes `command`).
    pub command: Vec<String>,
    /// Overrides the image's cmd when non-empty (Kubernetes `args`).
    pub args: Vec<String>,
    pub working_dir: Option<String>,
    /// Appended to the image's environment; later entries win.
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub resources: LinuxResources,
    pub security: SecurityConfig,
    /// Log file relative to the sandbox's log directory: `<name>/<attempt>.log`.
    pub log_path: PathBuf,
    pub labels: BTreeMap<String, String>,
    /// Free-form; the agent stores its container spec hash here (`io.kubernetes.container.hash`).
    pub annotations: BTreeMap<String, String>,
    /// Namespaced sysctls (dot-separated names) written into the container's namespaces as it
    /// starts: the pod's `securityContext.sysctls`, which containerd copies from CRI's
    /// `LinuxPodSandboxConfig.sysctls` into every container's `linux.sysctl`.
    #[serde(default)]
    pub sysctls: BTreeMap<String, String>,
    /// Run in the PID namespace of this running container of the same sandbox instead of a
    /// new one (an ephemeral container's `targetContainerName`: CRI `NamespaceMode_TARGET`).
    /// Ignored when the sandbox uses the host's PID namespace.
    #[serde(default)]
    pub pid_namespace_target: Option<ContainerId>,
    /// Keep the container's stdin open for attach (Kubernetes `stdin`); else it reads
    /// `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// Close stdin when the first attach session ends (Kubernetes `stdinOnce`).
    #[serde(default)]
    pub stdin_once: bool,
    /// Run on a terminal (Kubernetes `tty`): output is one stream, logged as stdout.
    #[serde(default)]
    pub tty: bool,
}

/// The life-cycle state of a container, as kubecontainer's `State`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

impl ContainerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Unknown => "unknown",
        }
    }
}

/// Why a container exited, as the kubelet reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitReason {
    Completed,
    Error,
    OOMKilled,
    ContainerCannotRun,
}

impl ExitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "Completed",
            Self::Error => "Error",
            Self::OOMKilled => "OOMKilled",
            Self::ContainerCannotRun => "ContainerCannotRun",
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    /// The exit code a shell (and the kubelet) reports: 128+signal for a signal death.
    pub fn code(self) -> i32 {
        match self {
            Self::Code(c) => c,
            Self::Signal(s) => 128 + s,
        }
    }
}

/// The status of one container, as kubecontainer's `Status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerStatus {
    pub id: ContainerId,
    pub sandbox_id: SandboxId,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: SystemTime,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
    pub exit_code: Option<i32>,
    pub reason: Option<ExitReason>,
    pub message: Option<String>,
    /// The image as referenced and its resolved id (`sha256:<config digest>`).
    pub image: String,
    pub image_id: String,
    pub pid: Option<i32>,
    pub log_path: PathBuf,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// The status of one pod sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodSandboxStatus {
    pub id: SandboxId,
    pub config: PodSandboxConfig,
    pub state: SandboxState,
    pub created_at: SystemTime,
    /// The pod's IPv4 address on the CNI network; `None` for host-network pods and where
    /// no network was set up (rootless).
    pub ip: Option<String>,
    /// The pinned network namespace file (`<sandbox>/ns/net`), `None` when the pod uses the
    /// host's network. Probes and hooks connect from inside it when the pod has no IP.
    pub netns_path: Option<PathBuf>,
}

/// A pod as the runtime sees it: its sandboxes and all containers, including exited ones
/// (kubecontainer's `PodStatus`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodStatus {
    pub pod_uid: String,
    pub name: String,
    pub namespace: String,
    pub sandboxes: Vec<PodSandboxStatus>,
    pub containers: Vec<ContainerStatus>,
}

/// Filters for listing containers.
#[derive(Debug, Clone, Default)]
pub struct ContainerFilter {
    pub sandbox_id: Option<SandboxId>,
    pub state: Option<ContainerState>,
    pub pod_uid: Option<String>,
}

/// The result of running a command in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i32,
}

/// A process to run in a running container with its stdio streamed (CRI `Exec`), or, with
/// an empty `cmd`, an attach to the container's own stdio (CRI `Attach`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecRequest {
    pub cmd: Vec<String>,
    /// Give the process a stdin the caller writes ([`ExecSession::stdin`]); else it reads
    /// `/dev/null`.
    pub stdin: bool,
    /// Run the process on a new terminal: its output arrives on `stdout` alone, and
    /// [`ExecSession::resize`] sets the window size.
    pub tty: bool,
}

/// Sets a session's terminal window size: `(width, height)` in characters.
pub type Resize = Box<dyn Fn(u16, u16) -> std::io::Result<()> + Send + Sync>;

/// A byte stream from an exec'd process.
pub type ExecReader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
/// A byte stream to an exec'd process; dropping (or shutting down) it closes its stdin.
pub type ExecWriter = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// A running exec process ([`Runtime::exec`](crate::Runtime::exec)): its stdio and its
/// exit. Dropping the session before the exit was seen kills the process and whatever it
/// started, so a caller that goes away leaves nothing running.
pub struct ExecSession {
    pub stdin: Option<ExecWriter>,
    pub stdout: ExecReader,
    pub stderr: ExecReader,
    pub exit: ExecExit,
    /// With a terminal: changes its window size.
    pub resize: Option<Resize>,
}

impl fmt::Debug for ExecSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecSession")
            .field("stdin", &self.stdin.is_some())
            .finish_non_exhaustive()
    }
}

/// The exit of an exec process; kills the process when dropped before [`ExecExit::wait`]
/// returned its code.
pub struct ExecExit {
    code: tokio::sync::oneshot::Receiver<i32>,
    kill: Option<Box<dyn FnOnce() + Send>>,
}

impl ExecExit {
    /// `code` delivers the exit code; `kill` ends the process (and its children).
    pub fn new(
        code: tokio::sync::oneshot::Receiver<i32>,
        kill: impl FnOnce() + Send + 'static,
    ) -> Self {
        Self {
            code,
            kill: Some(Box::new(kill)),
        }
    }

    /// The exit code (128 + signal for a signalled process); `None` when the runtime lost
    /// track of the process. Cancel-safe.
    pub async fn wait(&mut self) -> Option<i32> {
        let code = (&mut self.code).await.ok();
        if code.is_some() {
            self.kill = None;
        }
        code
    }

    /// Kills the process now (a no-op once it exited).
    pub fn kill(&mut self) {
        if let Some(kill) = self.kill.take() {
            kill();
        }
    }
}

impl Drop for ExecExit {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The parts of an OCI image config that shape a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// An image in the local store (kubecontainer `Image`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// `sha256:<hex>` of the image config.
    pub id: String,
    /// Normalised references, e.g. `docker.io/library/busybox:latest`.
    pub repo_tags: Vec<String>,
    /// `name@sha256:<manifest digest>`.
    pub repo_digests: Vec<String>,
    /// Sum of the (compressed) layer sizes plus config.
    pub size: u64,
    pub config: ImageConfig,
    /// Never removed by image garbage collection (CRI `Image.pinned`): set with
    /// `ironlet images pin`.
    #[serde(default)]
    pub pinned: bool,
}

/// Totals of the image store (kubecontainer `ImageStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImageStats {
    pub total_storage_bytes: u64,
}

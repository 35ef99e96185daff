//! [`LocalRuntime`]: the in-process implementation of [`Runtime`](crate::Runtime).
//!
//! ```text
//!  caller ──► LocalRuntime ──► ImageStore (rootfs) ─► spec (config.json) ─► zygote (create)
//!                 ▲                                                            │
//!                 └──── exit events (pidfd reaps) ◄────────────────────────────┘
//!                 └──── log pumps: pipes ─► /var/log/pods/<ns>_<name>_<uid>/<ctr>/<n>.log
//! ```
//!
//! State lives in memory (one `std::sync::Mutex`, never held across an await) and in
//! records under `<root-dir>` (`sandboxes/<id>/`, `containers/<id>/`, `exits/`), so other
//! processes can read it. Files here: `mod.rs` (type, construction, events), `sandbox.rs`,
//! `container.rs` (create/start/stop/remove), `exec.rs`, `record.rs`, `logs.rs`,
//! `recover.rs` (re-adoption after an agent restart), `cleanup.rs`.
//!
//! Two ways to start: connected to the supervisor (`ironlet run`), the runtime owns the data
//! root and [re-adopts](recover) its containers before [`LocalRuntime::new`] returns;
//! with a private zygote (`ironlet ctr`, tests) it only reads the records, since an agent
//! may own the root meanwhile.

mod attach;
pub mod cleanup;
mod container;
mod exec;
pub mod logs;
pub mod record;
mod recover;
mod sandbox;

pub use attach::PtyMaster;
pub use recover::Recovery;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::error::RuntimeError;
use crate::image::ImageStore;
use crate::traits::{Runtime, RuntimeEvent, RuntimeVersion};
use crate::types::{
    ContainerConfig, ContainerFilter, ContainerId, ContainerStatus, ExecOutput, ExecRequest,
    ExecSession, ExitReason, PodSandboxConfig, PodSandboxStatus, PodStatus, SandboxId,
};
use crate::zygote::{Event, WireExit, ZygoteClient, ZygoteHandle};
use logs::OutputChunk;
use record::{ContainerPhase, ContainerRecord, SandboxRecord};

/// How the runtime is set up.
#[derive(Debug, Clone)]
pub struct LocalRuntimeConfig {
    /// The data root (kubelet `--root-dir`).
    pub root_dir: PathBuf,
    /// Run containers in user namespaces mapped to the invoking user.
    pub rootless: bool,
    /// Cgroup parent for containers whose sandbox names none; `None`: `/ironlet` as root
    /// (rootless on cgroup v1: no cgroup at all).
    pub default_cgroup_parent: Option<String>,
    /// Pod networking: CNI as root, pasta rootless (`network/rootless.rs`; the CNI settings
    /// are then unused); `None`: pods get loopback only.
    pub cni: Option<crate::network::CniConfig>,
    /// Container log rotation (`--container-log-max-size`, `--container-log-max-files`).
    pub log_rotation: logs::LogRotation,
}

impl LocalRuntimeConfig {
    /// kubelet's default `--root-dir` is `/var/lib/kubelet`; ours is `/var/lib/ironlet` as
    /// root and `$XDG_DATA_HOME/ironlet` (or `~/.local/share/ironlet`) rootless.
    pub fn default_root_dir(rootless: bool) -> PathBuf {
        if !rootless {
            return PathBuf::from("/var/lib/ironlet");
        }
        if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
            return PathBuf::from(xdg).join("ironlet");
        }
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
        PathBuf::from(home).join(".local/share/ironlet")
    }

    pub fn containers_dir(&self) -> PathBuf {
        self.root_dir.join("containers")
    }
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.root_dir.join("sandboxes")
    }
    pub fn exits_dir(&self) -> PathBuf {
        self.root_dir.join("exits")
    }
    /// libcontainer's own state root.
    pub fn libcontainer_root(&self) -> PathBuf {
        self.root_dir.join("libcontainer")
    }
    pub fn images_dir(&self) -> PathBuf {
        self.root_dir.join("images")
    }
}

/// One container in memory: its record plus who waits for it.
struct Entry {
    record: ContainerRecord,
    /// Flips to true once the exit is recorded.
    exited: watch::Sender<bool>,
    /// False while a log pump copies the container's output: the exit can be recorded
    /// before the last lines reach the file, and a status read for the termination
    /// message (`FallbackToLogsOnError`) waits for them (see [`Inner::settle_logs`]).
    logs_written: watch::Sender<bool>,
    /// Raw output subscribers, registered before start.
    tap: Option<mpsc::UnboundedSender<OutputChunk>>,
    /// Its stdio for attach, while a log pump runs.
    io: Option<Arc<attach::ContainerIo>>,
    /// Our zygote runs it (created or re-adopted here), so its exit arrives as an event;
    /// otherwise another process's zygote does and the exit is read from its record.
    owned: bool,
}

impl Entry {
    fn new(record: ContainerRecord, exited: watch::Sender<bool>, owned: bool) -> Self {
        Self {
            record,
            exited,
            logs_written: watch::Sender::new(true),
            tap: None,
            io: None,
            owned,
        }
    }
}

/// [`LocalRuntime::wait`] waits in rounds of this (a bound tokio's timer can represent).
const WAIT_ROUND: Duration = Duration::from_secs(24 * 3600);

/// How long an exit of a container not registered (yet) is kept for its create.
const EARLY_EXIT_KEEP: Duration = Duration::from_secs(60);

/// How long after an exit a status read may wait for the container's log pump to finish.
const LOG_SETTLE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Default)]
struct State {
    sandboxes: HashMap<SandboxId, SandboxRecord>,
    containers: HashMap<ContainerId, Entry>,
    /// Exits that arrived before their container's create reply was processed.
    early_exits: HashMap<String, (WireExit, SystemTime)>,
    /// Exec processes waiting for their exit code, by exec id.
    exec_waiters: HashMap<String, oneshot::Sender<i32>>,
}

pub(crate) struct Inner {
    this: std::sync::Weak<Inner>,
    config: LocalRuntimeConfig,
    zygote: ZygoteClient,
    images: Arc<ImageStore>,
    state: Mutex<State>,
    events: broadcast::Sender<RuntimeEvent>,
    cgroups: Option<ironlet_cgroups::Hierarchy>,
    /// Rootless: the cgroup v2 subtree delegated to this user (see
    /// [`ironlet_cgroups::Delegation::prepare`]), under which containers get their cgroups;
    /// `None` as root and without delegation.
    rootless_cgroup_root: Option<ironlet_cgroups::CgroupPath>,
    /// CNI networking for sandboxes with their own network namespace.
    network: Option<crate::network::Network>,
    /// What start-up re-adopted, when connected to a supervisor.
    recovery: std::sync::OnceLock<Recovery>,
    /// Held while a container record is saved (see [`Inner::persist`]).
    persisting: Mutex<()>,
    /// Rootless pod networks: sandboxes are made once their namespaces exist, and a
    /// container's start waits for pasta (see [`LocalRuntime::network_ready_at_start`]).
    network_at_start: std::sync::atomic::AtomicBool,
    /// As root: the (resolved) root, which a create's worker detaches other pods' mounts
    /// under (`zygote/pod_mounts.rs`).
    pod_mounts_root: Option<PathBuf>,
    /// Held (read) from before a sandbox or container mounts anything under the root until its
    /// record is in the state; (write) while the root's bind is removed.
    pod_mounts: tokio::sync::RwLock<()>,
    /// Whether the root's bind is on top, as last found (read from the mount table once,
    /// then kept until the bind is removed).
    pod_mounts_bind: Mutex<RootBind>,
}

/// The root's bind onto itself (`zygote/pod_mounts.rs`), as the runtime last found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RootBind {
    Unknown,
    /// The top mount at the root is the bind: workers may detach it.
    OnTop,
    /// Something was mounted under the root before the bind could be made.
    Unavailable,
}

/// The in-process runtime. Cheap to clone.
#[derive(Clone)]
pub struct LocalRuntime {
    inner: Arc<Inner>,
}

impl LocalRuntime {
    /// Opens the data root and connects to a zygote spawned earlier with
    /// [`crate::zygote::spawn`]. Must run inside a tokio runtime.
    pub async fn new(
        config: LocalRuntimeConfig,
        zygote: ZygoteHandle,
        images: Arc<ImageStore>,
    ) -> Result<Self, RuntimeError> {
        // The root first: other users get nothing from it (records hold environment
        // variables, bundles the containers' configs); existing installs are narrowed.
        for dir in [
            config.root_dir.clone(),
            config.containers_dir(),
            config.sandboxes_dir(),
            config.exits_dir(),
            config.libcontainer_root(),
        ] {
            crate::fsutil::private_dir(&dir).map_err(|e| RuntimeError::io("create", &dir, e))?;
        }
        let (event_tx, event_rx) = mpsc::unbounded_channel();
        let zygote = ZygoteClient::new(zygote, event_tx)?;
        let hello = zygote.hello().await?;
        if hello.protocol != crate::zygote::PROTOCOL_VERSION {
            return Err(crate::zygote::ZygoteError::Protocol {
                theirs: hello.protocol,
                ours: crate::zygote::PROTOCOL_VERSION,
            }
            .into());
        }
        zygote.set_exit_dir(config.exits_dir()).await?;
        let cgroups = match ironlet_cgroups::Hierarchy::detect() {
            Ok(h) => Some(h),
            Err(err) => {
                tracing::warn!(%err, "no cgroup hierarchy; OOM kills cannot be told apart");
                None
            }
        };
        let rootless_cgroup_root = match (&cgroups, config.rootless) {
            (Some(hierarchy), true) => match ironlet_cgroups::Delegation::prepare(hierarchy) {
                ironlet_cgroups::Delegation::Full { root } => Some(root),
                ironlet_cgroups::Delegation::None { reason } => {
                    tracing::debug!(%reason, "rootless containers get no cgroups");
                    None
                }
            },
            _ => None,
        };
        let state = State {
            sandboxes: record::load_all::<SandboxRecord>(&config.sandboxes_dir())
                .into_iter()
                .map(|r| (r.id.clone(), r))
                .collect(),
            ..State::default()
        };
        let (events, _) = broadcast::channel(4096);
        let network = match (&config.cni, config.rootless) {
            (Some(cni), false) => Some(crate::network::Network::new(cni.clone(), &config.root_dir)),
            // Rootless pods are connected by pasta (see `sandbox.rs`).
            (Some(_), true) | (None, _) => None,
        };
        let pod_mounts_root = if config.rootless {
            None
        } else {
            Some(
                std::fs::canonicalize(&config.root_dir)
                    .map_err(|e| RuntimeError::io("resolve", &config.root_dir, e))?,
            )
        };
        let inner = Arc::new_cyclic(|this| Inner {
            this: this.clone(),
            config,
            zygote,
            images,
            state: Mutex::new(state),
            events,
            cgroups,
            rootless_cgroup_root,
            network,
            recovery: std::sync::OnceLock::new(),
            persisting: Mutex::new(()),
            network_at_start: std::sync::atomic::AtomicBool::new(false),
            pod_mounts_root,
            pod_mounts: tokio::sync::RwLock::new(()),
            pod_mounts_bind: Mutex::new(RootBind::Unknown),
        });
        tokio::spawn(event_loop(Arc::downgrade(&inner), event_rx));
        if inner.config.rootless && inner.config.cni.is_some() {
            tokio::spawn(report_pasta_restarts(Arc::downgrade(&inner)));
        }
        if hello.supervised {
            let report = inner.recover(&hello).await;
            let _ = inner.recovery.set(report);
        } else {
            inner.load_containers();
        }
        // A bind left by a runtime that stopped (or was killed) once its last pod was gone.
        inner.release_pod_mounts_if_idle().await;
        Ok(Self { inner })
    }

    pub fn config(&self) -> &LocalRuntimeConfig {
        &self.inner.config
    }

    /// From now on a rootless sandbox with a network is made as soon as its namespaces
    /// exist, while pasta still connects them (no IP in its status yet), and the start of
    /// each of its containers waits until pasta has (failing if pasta failed, which turns
    /// the sandbox NotReady). For a one-shot `ctr run` and the agent (`run`, `play`), which
    /// create the pod's first container meanwhile: the agent waits for the network
    /// ([`Runtime::await_pod_network`]) before it starts a container or computes anything
    /// from the pod's IP.
    pub fn network_ready_at_start(&self) {
        self.inner
            .network_at_start
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// What start-up re-adopted (`None` with a private zygote).
    pub fn recovery(&self) -> Option<&Recovery> {
        self.inner.recovery.get()
    }

    /// Subscribes to a container's raw output. Call between create and start to see all of
    /// it; the channel closes when the container's output ends.
    pub fn tap_output(
        &self,
        id: &ContainerId,
    ) -> Result<mpsc::UnboundedReceiver<OutputChunk>, RuntimeError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.inner.lock();
        let entry = state
            .containers
            .get_mut(id)
            .ok_or_else(|| not_found("container", id.as_str()))?;
        entry.tap = Some(tx);
        Ok(rx)
    }

    /// Waits until the container has exited; returns its status. Works for a container
    /// another process runs too (another `ironlet ctr`): its process is watched through a
    /// pidfd and its exit read from the record that process's zygote wrote.
    pub async fn wait(&self, id: &ContainerId) -> Result<ContainerStatus, RuntimeError> {
        let owned = {
            let state = self.inner.lock();
            let entry = state
                .containers
                .get(id)
                .ok_or_else(|| not_found("container", id.as_str()))?;
            entry.owned.then(|| entry.exited.subscribe())
        };
        match owned {
            // Our zygote reports the exit once it has reaped and recorded it, however long
            // its worker lingers; the sender lives as long as the entry.
            Some(mut rx) => {
                let _ = rx.wait_for(|exited| *exited).await;
            }
            // Returns at once if the entry is removed meanwhile.
            None => while !self.inner.wait_exited(id, WAIT_ROUND).await {},
        }
        self.inner.settle_logs(|e| e.record.id == *id).await;
        self.inner.status_of(id)
    }
}

pub(crate) fn not_found(kind: &'static str, id: &str) -> RuntimeError {
    RuntimeError::NotFound {
        kind,
        id: id.to_owned(),
    }
}

impl Inner {
    /// Waits until the log pumps of the exited containers `which` selects have written
    /// everything, so a status read right after an exit sees the whole log. Bounded: at
    /// most until [`LOG_SETTLE_TIMEOUT`] after each exit (a process outside the container's
    /// pid namespace may hold its output pipe open for good), and never later than that.
    /// The exit itself is recorded without waiting (the PLEG's latency).
    async fn settle_logs(&self, which: impl Fn(&Entry) -> bool) {
        let now = SystemTime::now();
        let pending: Vec<(watch::Receiver<bool>, Duration)> = {
            let state = self.lock();
            state
                .containers
                .values()
                .filter(|e| which(e) && !*e.logs_written.borrow())
                .filter_map(|e| match e.record.phase {
                    ContainerPhase::Exited { finished_at, .. } => {
                        let left = (finished_at + LOG_SETTLE_TIMEOUT)
                            .duration_since(now)
                            .ok()?;
                        Some((e.logs_written.subscribe(), left))
                    }
                    _ => None,
                })
                .collect()
        };
        for (mut rx, left) in pending {
            let _ = tokio::time::timeout(left, rx.wait_for(|done| *done)).await;
        }
    }

    /// Before a sandbox or container mounts anything under the root: makes the root's bind
    /// (`zygote/pod_mounts.rs`) and keeps it until the guard goes, which the caller drops
    /// once its record is in the state.
    async fn pod_mounts_guard(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        let guard = self.pod_mounts.read().await;
        if let Some(root) = &self.pod_mounts_root {
            let mut bind = self
                .pod_mounts_bind
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if *bind == RootBind::Unknown {
                *bind = match crate::zygote::pod_mounts::ensure_root_mount(root) {
                    Ok(true) => RootBind::OnTop,
                    Ok(false) => {
                        tracing::info!(root = %root.display(),
                            "mounts under the root from before its bind: containers copy \
                             every pod's mounts until no pod is left");
                        RootBind::Unavailable
                    }
                    Err(err) => {
                        tracing::warn!(root = %root.display(), %err,
                            "cannot bind the root onto itself; containers copy every pod's mounts");
                        RootBind::Unavailable
                    }
                };
            }
        }
        guard
    }

    /// After a removal or a failed create: once no sandbox or container is left, removes the
    /// root's bind, so an idle root holds no mount.
    async fn release_pod_mounts_if_idle(&self) {
        let Some(root) = &self.pod_mounts_root else {
            return;
        };
        let idle = || {
            let state = self.lock();
            state.sandboxes.is_empty() && state.containers.is_empty()
        };
        if !idle() {
            return;
        }
        // Never waits for a create in flight (a removal must not): that create either lands
        // in the state or, failing, comes here itself once its guard is gone.
        let Ok(_exclusive) = self.pod_mounts.try_write() else {
            return;
        };
        if idle() {
            if let Err(err) = crate::zygote::pod_mounts::release_root_mount(root) {
                tracing::warn!(root = %root.display(), %err, "cannot remove the root's bind");
            }
            // Looked at again by the next sandbox or container.
            *self
                .pod_mounts_bind
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = RootBind::Unknown;
        }
    }

    /// The root a create's worker detaches other pods' mounts under: only while the root's
    /// bind is on top (`None` rootless, or without the bind).
    pub(crate) fn pod_mounts_root(&self) -> Option<PathBuf> {
        let bind = *self
            .pod_mounts_bind
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.pod_mounts_root
            .clone()
            .filter(|_| bind == RootBind::OnTop)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves data that is still consistent record by
        // record; keep serving rather than poisoning every later call.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn status_of(&self, id: &ContainerId) -> Result<ContainerStatus, RuntimeError> {
        let state = self.lock();
        state
            .containers
            .get(id)
            .map(|e| e.record.status())
            .ok_or_else(|| not_found("container", id.as_str()))
    }

    fn container_dir(&self, id: &ContainerId) -> PathBuf {
        self.config.containers_dir().join(id.as_str())
    }

    /// Loads container records at start-up. Containers whose exit was recorded while
    /// nobody listened get that exit; the rest are marked unknown-exited unless their
    /// process is still alive (re-adoption proper is the supervisor's job).
    fn load_containers(&self) {
        let records = record::load_all::<ContainerRecord>(&self.config.containers_dir());
        let mut state = self.lock();
        for mut rec in records {
            if let Some((pid, start_time)) = rec.phase.process() {
                if let Some(Event::Exited {
                    status,
                    at_unix_nanos,
                    ..
                }) = crate::zygote::exits::read(&self.config.exits_dir(), rec.id.as_str())
                {
                    let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(at_unix_nanos as u64);
                    self.apply_exit(&mut rec, status, at);
                } else if crate::zygote::process_start_time(pid).ok() != Some(start_time) {
                    // Gone without a trace: kubelet reports such containers as 137/Error.
                    rec.phase = rec.phase.exited(SystemTime::now(), 137, ExitReason::Error);
                }
            }
            let exited = rec.phase.process().is_none();
            let (tx, _) = watch::channel(exited);
            state
                .containers
                .insert(rec.id.clone(), Entry::new(rec, tx, false));
        }
    }

    /// Moves a record to Exited with `status` (no-op if it already is).
    fn apply_exit(&self, rec: &mut ContainerRecord, status: WireExit, at: SystemTime) {
        let reason = self.exit_reason(rec, status);
        rec.phase = rec.phase.exited(at, exit_code(status), reason);
        if status == WireExit::Unknown {
            if let ContainerPhase::Exited { message, .. } = &mut rec.phase {
                message.get_or_insert_with(|| UNKNOWN_EXIT_MESSAGE.to_owned());
            }
        }
    }

    fn exit_reason(&self, rec: &ContainerRecord, status: WireExit) -> ExitReason {
        let oom = match (&self.cgroups, &rec.cgroups_path) {
            (Some(h), Some(path)) => {
                ironlet_cgroups::CgroupPath::new(path)
                    .and_then(|p| h.oom_kill_count(&p))
                    .unwrap_or(0)
                    > 0
            }
            _ => false,
        };
        if oom {
            ExitReason::OOMKilled
        } else if exit_code(status) == 0 {
            ExitReason::Completed
        } else {
            ExitReason::Error
        }
    }

    /// Saves a container's record. Saves are serialized and write the entry's record as it
    /// is when the save runs (`rec` only for a container not registered), so two saves racing
    /// (an exit recorded while the start's update is being written) cannot leave the older
    /// state on disk; a container removed meanwhile is not written again.
    fn persist(&self, rec: &ContainerRecord) {
        let _one_at_a_time = self.persisting.lock().unwrap_or_else(|p| p.into_inner());
        let current = self
            .lock()
            .containers
            .get(&rec.id)
            .map(|e| e.record.clone());
        let dir = self.container_dir(&rec.id);
        let rec = match current {
            Some(current) => current,
            None if !dir.exists() => return,
            None => rec.clone(),
        };
        if let Err(err) = record::save(&dir, &rec) {
            tracing::error!(container_id = %rec.id, %err, "saving container record failed");
        }
    }

    /// Applies one event from the zygote.
    fn on_event(&self, event: Event) {
        let Event::Exited {
            id,
            exec_id,
            status,
            at_unix_nanos,
            ..
        } = event;
        let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(at_unix_nanos as u64);
        let mut state = self.lock();
        if let Some(exec_id) = exec_id {
            if let Some(tx) = state.exec_waiters.remove(&exec_id) {
                let _ = tx.send(exit_code(status));
            }
            return;
        }
        drop(state);
        let Some(cid) = ContainerId::parse(&id) else {
            return;
        };
        self.record_exit(&cid, status, at);
    }

    /// Moves a container to Exited (once), persists it, wakes waiters and tells the PLEG.
    /// An exit for a container not registered yet is kept until its create completes.
    fn record_exit(&self, id: &ContainerId, status: WireExit, at: SystemTime) {
        let mut state = self.lock();
        let Some(entry) = state.containers.get_mut(id) else {
            // Kept for a create whose reply is on its way; the exit of a container whose
            // create was undone never finds its entry, so old ones go.
            let cutoff = SystemTime::now() - EARLY_EXIT_KEEP;
            state.early_exits.retain(|_, (_, at)| *at >= cutoff);
            state.early_exits.insert(id.to_string(), (status, at));
            return;
        };
        if matches!(entry.record.phase, ContainerPhase::Exited { .. }) {
            return;
        }
        self.apply_exit(&mut entry.record, status, at);
        let rec = entry.record.clone();
        entry.exited.send_replace(true);
        drop(state);
        self.persist(&rec);
        let code = exit_code(status);
        tracing::debug!(container_id = %id, code, "container exited");
        let _ = self.events.send(RuntimeEvent::ContainerExited {
            id: id.clone(),
            pod_uid: rec.pod_uid,
            exit_code: code,
            observed_at: std::time::Instant::now(),
        });
    }
}

/// The message of a container whose exit status nobody could observe.
const UNKNOWN_EXIT_MESSAGE: &str =
    "the container ended while no ironlet supervisor was its parent; its exit status is unknown";

/// The exit code kubelet shows: the code, 128 + the signal, or 137 when unknown (as kubelet
/// reports a container that disappeared).
pub(crate) fn exit_code(status: WireExit) -> i32 {
    match status {
        WireExit::Code(c) => c,
        WireExit::Signal(s) => 128 + s,
        WireExit::Unknown => 128 + libc::SIGKILL,
    }
}

async fn event_loop(inner: std::sync::Weak<Inner>, mut rx: mpsc::UnboundedReceiver<Event>) {
    while let Some(event) = rx.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        inner.on_event(event);
    }
}

/// How often rootless sandboxes are checked for pasta restarts to report.
const PASTA_RESTARTS_POLL: Duration = Duration::from_secs(1);

/// Reports the pasta restarts the keepers record (`zygote/holder.rs`) as
/// [`RuntimeEvent::PodNetworkRestarted`], each once, while someone subscribes: a runtime
/// nobody listens to (`ctr`'s) leaves them for the agent's.
async fn report_pasta_restarts(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(PASTA_RESTARTS_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.events.receiver_count() == 0 {
            continue;
        }
        let networked: Vec<(SandboxId, String)> = inner
            .lock()
            .sandboxes
            .values()
            .filter(|r| r.holder.is_some())
            .map(|r| (r.id.clone(), r.config.pod_uid.clone()))
            .collect();
        for (sandbox_id, pod_uid) in networked {
            let dir = inner.config.sandboxes_dir().join(sandbox_id.as_str());
            for what in crate::network::rootless::take_new_restarts(&dir) {
                let _ = inner.events.send(RuntimeEvent::PodNetworkRestarted {
                    sandbox_id: sandbox_id.clone(),
                    pod_uid: pod_uid.clone(),
                    message: format!(
                        "{what}: the pod's published ports were unreachable and connections \
                         through it were lost meanwhile"
                    ),
                });
            }
        }
    }
}

#[async_trait]
impl Runtime for LocalRuntime {
    fn version(&self) -> RuntimeVersion {
        RuntimeVersion {
            runtime_name: "ironlet",
            runtime_version: env!("CARGO_PKG_VERSION"),
        }
    }

    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<SandboxId, RuntimeError> {
        self.inner.run_pod_sandbox(config).await
    }

    fn writable_layer_usage(&self, id: &ContainerId) -> Option<crate::fsutil::DiskUsage> {
        if !self.inner.lock().containers.contains_key(id) {
            return None;
        }
        self.inner
            .images
            .writable_layer_usage(&self.inner.container_dir(id))
    }

    async fn stop_pod_sandbox(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.inner.stop_pod_sandbox(id).await
    }

    async fn remove_pod_sandbox(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.inner.remove_pod_sandbox(id).await
    }

    async fn pod_sandbox_status(&self, id: &SandboxId) -> Result<PodSandboxStatus, RuntimeError> {
        let state = self.inner.lock();
        state
            .sandboxes
            .get(id)
            .map(SandboxRecord::status)
            .ok_or_else(|| not_found("sandbox", id.as_str()))
    }

    async fn await_pod_network(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.inner.await_pod_network(id).await
    }

    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandboxStatus>, RuntimeError> {
        let state = self.inner.lock();
        Ok(state
            .sandboxes
            .values()
            .map(SandboxRecord::status)
            .collect())
    }

    async fn create_container(
        &self,
        sandbox: &SandboxId,
        config: &ContainerConfig,
    ) -> Result<ContainerId, RuntimeError> {
        self.inner.create_container(sandbox, config).await
    }

    async fn start_container(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        self.inner.start_container(id).await
    }

    async fn stop_container(&self, id: &ContainerId, grace: Duration) -> Result<(), RuntimeError> {
        self.inner.stop_container(id, grace).await
    }

    async fn remove_container(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        self.inner.remove_container(id).await
    }

    async fn container_status(&self, id: &ContainerId) -> Result<ContainerStatus, RuntimeError> {
        self.inner.settle_logs(|e| e.record.id == *id).await;
        self.inner.status_of(id)
    }

    async fn list_containers(
        &self,
        filter: &ContainerFilter,
    ) -> Result<Vec<ContainerStatus>, RuntimeError> {
        let state = self.inner.lock();
        let mut out: Vec<_> = state
            .containers
            .values()
            .map(|e| &e.record)
            .filter(|r| {
                filter
                    .sandbox_id
                    .as_ref()
                    .is_none_or(|s| *s == r.sandbox_id)
            })
            .filter(|r| filter.pod_uid.as_ref().is_none_or(|u| *u == r.pod_uid))
            .filter(|r| filter.state.is_none_or(|s| s == r.phase.state()))
            .map(ContainerRecord::status)
            .collect();
        out.sort_by_key(|s| s.created_at);
        Ok(out)
    }

    async fn pod_status(&self, pod_uid: &str) -> Result<PodStatus, RuntimeError> {
        self.inner
            .settle_logs(|e| e.record.pod_uid == pod_uid)
            .await;
        let state = self.inner.lock();
        let sandboxes: Vec<_> = state
            .sandboxes
            .values()
            .filter(|s| s.config.pod_uid == pod_uid)
            .map(SandboxRecord::status)
            .collect();
        let mut containers: Vec<_> = state
            .containers
            .values()
            .filter(|e| e.record.pod_uid == pod_uid)
            .map(|e| e.record.status())
            .collect();
        containers.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let (name, namespace) = sandboxes
            .first()
            .map(|s| (s.config.name.clone(), s.config.namespace.clone()))
            .unwrap_or_default();
        Ok(PodStatus {
            pod_uid: pod_uid.to_owned(),
            name,
            namespace,
            sandboxes,
            containers,
        })
    }

    async fn exec_sync(
        &self,
        id: &ContainerId,
        cmd: &[String],
        timeout: Option<Duration>,
    ) -> Result<ExecOutput, RuntimeError> {
        self.inner.exec_sync(id, cmd, timeout).await
    }

    async fn exec(
        &self,
        id: &ContainerId,
        request: &ExecRequest,
    ) -> Result<ExecSession, RuntimeError> {
        self.inner.exec(id, request).await
    }

    async fn attach(
        &self,
        id: &ContainerId,
        request: &ExecRequest,
    ) -> Result<ExecSession, RuntimeError> {
        self.inner.attach(id, request).await
    }

    fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.inner.events.subscribe()
    }
}

/// Removes a directory tree, treating "already gone" as success.
pub(crate) fn remove_dir_all_if_exists(path: &Path) -> Result<(), RuntimeError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RuntimeError::io("remove", path, e)),
    }
}

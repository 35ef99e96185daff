//! Container verbs of [`LocalRuntime`](super::LocalRuntime): create, start, stop, remove
//! and garbage collection. Each verb starts with its status guard.
//!
//! Create is all-or-nothing: the rootfs, bundle and libcontainer state it made are undone
//! on any later failure, and a failed undo is reported together with the original error.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::record::{self, ContainerPhase, ContainerRecord};
use super::{logs, not_found, remove_dir_all_if_exists, Entry, Inner};
use crate::error::RuntimeError;
use crate::image::RootfsMode;
use crate::spec::{NamespaceMode, SandboxNamespaces, SpecInputs};
use crate::types::{ContainerConfig, ContainerId, ContainerState, SandboxId, SandboxState};

/// How long a container's exit may take to be recorded by the zygote that reaps it, after
/// its process is gone; past that it is reported as killed.
const EXIT_RECORD_WAIT: Duration = Duration::from_secs(2);

/// How long to wait for a SIGKILLed container to be reaped before reporting an error.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

impl Inner {
    pub(crate) async fn create_container(
        &self,
        sandbox_id: &SandboxId,
        config: &ContainerConfig,
    ) -> Result<ContainerId, RuntimeError> {
        let pod_mounts = self.pod_mounts_guard().await;
        let created = self.create_container_guarded(sandbox_id, config).await;
        drop(pod_mounts);
        if created.is_err() {
            // Its sandbox may have gone meanwhile, the last pod of the node.
            self.release_pod_mounts_if_idle().await;
        }
        created
    }

    async fn create_container_guarded(
        &self,
        sandbox_id: &SandboxId,
        config: &ContainerConfig,
    ) -> Result<ContainerId, RuntimeError> {
        if config.name.is_empty() {
            return Err(RuntimeError::InvalidConfig("container needs a name".into()));
        }
        let sandbox = {
            let state = self.lock();
            state
                .sandboxes
                .get(sandbox_id)
                .cloned()
                .ok_or_else(|| not_found("sandbox", sandbox_id.as_str()))?
        };
        if sandbox.state != SandboxState::Ready {
            return Err(RuntimeError::InvalidConfig(format!(
                "sandbox {sandbox_id} is not ready"
            )));
        }
        let images = self.images.clone();
        let reference = config.image.clone();
        let image = tokio::task::spawn_blocking(move || images.get_image(&reference))
            .await
            .map_err(|e| RuntimeError::InvalidConfig(format!("image lookup task: {e}")))??
            .ok_or_else(|| crate::image::ImageError::NotFound(config.image.clone()))?;

        let id = ContainerId::random();
        let dir = self.container_dir(&id);
        crate::fsutil::private_dir(&dir).map_err(|e| RuntimeError::io("create", &dir, e))?;
        let cgroups_path = self.cgroups_path_for(&sandbox.config.cgroup_parent, &id);
        let log_path = sandbox.config.log_directory.join(&config.log_path);
        let mut rec = ContainerRecord {
            id: id.clone(),
            sandbox_id: sandbox_id.clone(),
            pod_uid: sandbox.config.pod_uid.clone(),
            config: config.clone(),
            image_id: image.id.clone(),
            log_path,
            cgroups_path,
            created_at: SystemTime::now(),
            phase: ContainerPhase::Created {
                pid: 0,
                start_time: 0,
            },
        };

        let made = self
            .make_container(&mut rec, &sandbox, &image, &dir)
            .await
            .and_then(|stdio| self.register_created(&rec, stdio));
        match made {
            Ok((stdio, early)) => {
                self.persist(&rec);
                let log = logs::LogFile {
                    path: rec.log_path.clone(),
                    relative: config.log_path.clone(),
                    open: logs::LogOpen::New,
                    rotation: None,
                };
                self.spawn_log_pump(&id, log, stdio);
                if let Some((status, at)) = early {
                    self.record_exit(&id, status, at);
                }
                tracing::debug!(container_id = %id, name = %config.name, "container created");
                Ok(id)
            }
            Err(original) => match self
                .undo_create(&id, &dir, rec.cgroups_path.as_deref())
                .await
            {
                Ok(()) => Err(original),
                Err(cleanup) => Err(RuntimeError::Rollback {
                    original: Box::new(original),
                    cleanup: Box::new(cleanup),
                }),
            },
        }
    }

    /// Registers a created container, unless its sandbox stopped or went while it was made
    /// (a pod killed during the create): it would then run outside any pod, and nothing
    /// would ever stop it. The check and the insert share one lock with
    /// [`Inner::stop_pod_sandbox`]'s and [`Inner::remove_pod_sandbox`]'s turn to NotReady and
    /// listing of the sandbox's containers, so the container is either listed by them or
    /// refused here. Returns the stdio and an exit that arrived before the registration.
    #[allow(clippy::type_complexity)]
    fn register_created(
        &self,
        rec: &ContainerRecord,
        stdio: crate::zygote::ContainerStdio,
    ) -> Result<
        (
            crate::zygote::ContainerStdio,
            Option<(crate::zygote::WireExit, SystemTime)>,
        ),
        RuntimeError,
    > {
        let mut state = self.lock();
        let ready = state
            .sandboxes
            .get(&rec.sandbox_id)
            .is_some_and(|s| s.state == SandboxState::Ready);
        if !ready {
            return Err(RuntimeError::InvalidConfig(format!(
                "sandbox {} was stopped or removed while container {} was created",
                rec.sandbox_id, rec.id
            )));
        }
        let (tx, _) = watch::channel(false);
        state
            .containers
            .insert(rec.id.clone(), Entry::new(rec.clone(), tx, true));
        Ok((stdio, state.early_exits.remove(rec.id.as_str())))
    }

    /// Prepares the rootfs and bundle and asks the zygote to create the container; on
    /// success the record holds the init's pid and the log pipes are returned.
    async fn make_container(
        &self,
        rec: &mut ContainerRecord,
        sandbox: &super::record::SandboxRecord,
        image: &crate::types::Image,
        dir: &Path,
    ) -> Result<crate::zygote::ContainerStdio, RuntimeError> {
        // The record goes to disk first, so a crash from here on leaves a directory that
        // start-up recognises and cleans.
        record::save(dir, rec).map_err(|e| RuntimeError::io("save container record", dir, e))?;
        let images = self.images.clone();
        let (img, target) = (image.clone(), dir.to_owned());
        // Rootless: an overlay mounted in the container's user namespace where the kernel
        // allows it and the snapshots have its whiteouts, else a copy (the store decides).
        let mode = RootfsMode::Auto;
        let prepared =
            tokio::task::spawn_blocking(move || images.prepare_rootfs(&img, &target, mode))
                .await
                .map_err(|e| RuntimeError::InvalidConfig(format!("rootfs task: {e}")))??;

        let mut namespaces = sandbox_namespaces(sandbox);
        if let Some(target) = &rec.config.pid_namespace_target {
            if namespaces.pid == NamespaceMode::New {
                namespaces.pid = self.target_pid_namespace(target, &rec.sandbox_id)?;
            }
        }
        let user_namespace = self.config.rootless.then(|| {
            let mut userns = crate::spec::subids::rootless_user_namespace();
            // A pod with a network: its holder's user namespace, which owns the network's.
            if let Some(holder) = sandbox.holder.filter(|_| userns.made_by_worker) {
                userns.path = Some(holder.ns_path("user"));
            }
            userns
        });
        if let Some(holder) = &sandbox.holder {
            if !holder.alive() {
                return Err(RuntimeError::InvalidConfig(format!(
                    "the pod's network namespace is gone (its holder, pid {}, ended)",
                    holder.pid
                )));
            }
        }
        let hostname = if sandbox.config.hostname.is_empty() {
            sandbox.config.name.clone()
        } else {
            sandbox.config.hostname.clone()
        };
        let spec = crate::spec::build_spec(&SpecInputs {
            container: &rec.config,
            image: &image.config,
            rootfs: &prepared.rootfs,
            rootfs_layers: &prepared.layers,
            hostname: &hostname,
            namespaces: &namespaces,
            cgroups_path: rec.cgroups_path.clone(),
            user_namespace,
        })?;
        let spec = crate::zygote::seccomp::precompile_profile(spec, dir)?;
        let spec = crate::zygote::cgroup_view::stage(spec, dir)?;
        crate::spec::write_bundle_config(dir, &spec)?;

        let stdio = crate::zygote::CreateStdio {
            stdin: rec.config.stdin,
            tty: rec.config.tty,
        };
        let (pid, start_time, stdio) = self
            .zygote
            .create(
                rec.id.as_str(),
                dir.to_owned(),
                self.config.libcontainer_root(),
                stdio,
                self.pod_mounts_root(),
            )
            .await
            .map_err(|e| RuntimeError::Create {
                id: rec.id.clone(),
                message: e.to_string(),
            })?;
        rec.phase = ContainerPhase::Created { pid, start_time };
        Ok(stdio)
    }

    /// The PID namespace of running container `target` of sandbox `sandbox`, to join.
    fn target_pid_namespace(
        &self,
        target: &ContainerId,
        sandbox: &SandboxId,
    ) -> Result<NamespaceMode, RuntimeError> {
        let state = self.lock();
        let entry = state
            .containers
            .get(target)
            .filter(|e| &e.record.sandbox_id == sandbox)
            .ok_or_else(|| not_found("target container", target.as_str()))?;
        match entry.record.phase {
            ContainerPhase::Running { pid, .. } => Ok(NamespaceMode::Join(PathBuf::from(format!(
                "/proc/{pid}/ns/pid"
            )))),
            _ => Err(RuntimeError::InvalidConfig(format!(
                "target container {target} is not running"
            ))),
        }
    }

    /// Removes what a create made: libcontainer's state (a forced delete), the container's
    /// cgroup when its path is known, its rootfs and directory.
    pub(super) async fn undo_create(
        &self,
        id: &ContainerId,
        dir: &Path,
        cgroups_path: Option<&str>,
    ) -> Result<(), RuntimeError> {
        let delete = self
            .zygote
            .delete(id.as_str(), self.config.libcontainer_root(), true)
            .await;
        // libcontainer's delete finds no state when its worker died before writing it
        // (e.g. by SIGPIPE, logging into a closed stderr), but the cgroup was made already.
        let cgroup = self.remove_cgroup(cgroups_path).await;
        self.release_and_remove(dir).await?;
        delete.map_err(RuntimeError::from)?;
        cgroup
    }

    /// Kills what is left in cgroup `cgroups_path` and removes it (missing: fine).
    async fn remove_cgroup(&self, cgroups_path: Option<&str>) -> Result<(), RuntimeError> {
        let (Some(hierarchy), Some(path)) = (self.cgroups.clone(), cgroups_path) else {
            return Ok(());
        };
        let path = ironlet_cgroups::CgroupPath::new(path)?;
        tokio::task::spawn_blocking(move || hierarchy.remove(&path))
            .await
            .map_err(|e| RuntimeError::InvalidConfig(format!("cgroup removal task: {e}")))??;
        Ok(())
    }

    async fn release_and_remove(&self, dir: &Path) -> Result<(), RuntimeError> {
        let images = self.images.clone();
        let target = dir.to_owned();
        tokio::task::spawn_blocking(move || images.release_rootfs(&target))
            .await
            .map_err(|e| RuntimeError::InvalidConfig(format!("rootfs task: {e}")))??;
        remove_dir_all_if_exists(dir)
    }

    fn cgroups_path_for(&self, parent: &Option<String>, id: &ContainerId) -> Option<String> {
        let parent = parent
            .as_deref()
            .or(self.config.default_cgroup_parent.as_deref());
        if !self.config.rootless {
            return Some(container_cgroups_path(parent, id));
        }
        // Rootless containers get cgroups only where cgroup v2 delegates a subtree to us,
        // and only below it.
        let root = self.rootless_cgroup_root.as_ref()?;
        Some(container_cgroups_path(
            Some(&under_delegated_root(root, parent)),
            id,
        ))
    }

    /// Copies the container's output into its log file until end of stream, then lets the
    /// zygote close its copies of the pipes (it keeps them until then, see `zygote::server`).
    /// Attached sessions get the output live meanwhile.
    pub(super) fn spawn_log_pump(
        &self,
        id: &ContainerId,
        log: logs::LogFile,
        stdio: crate::zygote::ContainerStdio,
    ) {
        let crate::zygote::ContainerStdio {
            stdout,
            stderr,
            input,
        } = stdio;
        let mut log = log;
        log.rotation = Some(self.config.log_rotation);
        // The tap is looked up when the first output arrives, so `tap_output` between
        // create and start sees everything; taking it closes the subscriber's channel when
        // the pump ends.
        let tap_id = id.clone();
        let inner = self.this.clone();
        let tap: logs::TapSource = Box::new(move || {
            let inner = inner.upgrade()?;
            let mut state = inner.lock();
            state.containers.get_mut(&tap_id)?.tap.take()
        });
        let id = id.clone();
        let inner = self.this.clone();
        let mut live = None;
        if let Some(entry) = self.lock().containers.get_mut(&id) {
            entry.logs_written.send_replace(false);
            let io = std::sync::Arc::new(super::attach::ContainerIo::new(
                input,
                entry.record.config.stdin_once,
            ));
            live = Some(io.live_output());
            entry.io = Some(io);
        }
        let taps = logs::Taps {
            source: Some(tap),
            live,
        };
        tokio::spawn(async move {
            logs::pump(log, stdout, stderr, taps).await;
            if let Some(inner) = inner.upgrade() {
                if let Some(entry) = inner.lock().containers.get_mut(&id) {
                    entry.logs_written.send_replace(true);
                    if let Some(io) = entry.io.take() {
                        io.output_ended();
                    }
                }
                if let Err(err) = inner.zygote.release_logs(id.as_str()).await {
                    tracing::debug!(container_id = %id, %err, "releasing log pipes failed");
                }
            }
        });
    }

    pub(crate) async fn start_container(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        {
            let state = self.lock();
            let entry = state
                .containers
                .get(id)
                .ok_or_else(|| not_found("container", id.as_str()))?;
            if !entry.record.phase.can_start() {
                return Err(RuntimeError::IncorrectState {
                    id: id.clone(),
                    state: entry.record.phase.state(),
                    action: "start",
                });
            }
        }
        let sandbox_id = self
            .lock()
            .containers
            .get(id)
            .map(|e| e.record.sandbox_id.clone());
        if let Some(sandbox_id) = sandbox_id {
            self.await_pod_network(&sandbox_id).await?;
        }
        self.zygote
            .start(id.as_str(), self.config.libcontainer_root())
            .await
            .map_err(|e| RuntimeError::Start {
                id: id.clone(),
                message: e.to_string(),
            })?;
        let rec = {
            let mut state = self.lock();
            let Some(entry) = state.containers.get_mut(id) else {
                return Ok(());
            };
            // The exit may already have been recorded: then the phase stays Exited.
            if let ContainerPhase::Created { pid, start_time } = entry.record.phase {
                entry.record.phase = ContainerPhase::Running {
                    pid,
                    start_time,
                    started_at: SystemTime::now(),
                };
            } else if let ContainerPhase::Exited { started_at, .. } = &mut entry.record.phase {
                started_at.get_or_insert_with(SystemTime::now);
            }
            entry.record.clone()
        };
        self.persist(&rec);
        Ok(())
    }

    /// Sends `signal` to the container's init, guarded against pid reuse by its start time.
    fn signal(&self, id: &ContainerId, signal: i32) -> Result<bool, RuntimeError> {
        let process = {
            let state = self.lock();
            let entry = state
                .containers
                .get(id)
                .ok_or_else(|| not_found("container", id.as_str()))?;
            entry.record.phase.process()
        };
        let Some((pid, start_time)) = process else {
            return Ok(false);
        };
        let Ok(pidfd) = crate::zygote::sys::pidfd_open(pid) else {
            return Ok(false);
        };
        // Checked after opening the pidfd: from here the pid cannot be reused under us.
        if crate::zygote::process_start_time(pid).ok() != Some(start_time) {
            return Ok(false);
        }
        match crate::zygote::sys::pidfd_send_signal(&pidfd, signal) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
            Err(e) => Err(RuntimeError::Kill {
                id: id.clone(),
                message: e.to_string(),
            }),
        }
    }

    /// Waits up to `limit` for the container to exit. The exit normally arrives from our
    /// zygote; a container run by another process (another `ironlet ctr`) is watched
    /// through a pidfd and its exit read from the record that process's zygote wrote.
    pub(super) async fn wait_exited(&self, id: &ContainerId, limit: Duration) -> bool {
        let (mut rx, process) = {
            let state = self.lock();
            match state.containers.get(id) {
                Some(e) => (e.exited.subscribe(), e.record.phase.process()),
                None => return true,
            }
        };
        let ours = async {
            let _ = rx.wait_for(|exited| *exited).await;
        };
        let theirs = async {
            if let Some((pid, start_time)) = process {
                wait_process_gone(pid, start_time).await;
            } else {
                std::future::pending::<()>().await;
            }
            // Let the owning zygote (ours or another process's) reap and record the exit
            // first: a loaded machine can delay that well past the exit itself, and without
            // the record the exit is reported as a SIGKILL.
            let recorded =
                || crate::zygote::exits::read(&self.config.exits_dir(), id.as_str()).is_some();
            let deadline = tokio::time::Instant::now() + EXIT_RECORD_WAIT;
            while !recorded() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let outcome = tokio::time::timeout(limit, async {
            tokio::select! {
                () = ours => true,
                () = theirs => false,
            }
        })
        .await;
        match outcome {
            Ok(true) => true,
            Ok(false) => {
                self.record_external_exit(id);
                true
            }
            Err(_) => false,
        }
    }

    /// Records the exit of a container whose process another process reaped.
    fn record_external_exit(&self, id: &ContainerId) {
        let recorded = crate::zygote::exits::read(&self.config.exits_dir(), id.as_str());
        let (status, at) = match recorded {
            Some(crate::zygote::Event::Exited {
                status,
                at_unix_nanos,
                ..
            }) => (
                status,
                SystemTime::UNIX_EPOCH + Duration::from_nanos(at_unix_nanos as u64),
            ),
            None => (
                crate::zygote::WireExit::Signal(libc::SIGKILL),
                SystemTime::now(),
            ),
        };
        self.record_exit(id, status, at);
    }

    pub(crate) async fn stop_container(
        &self,
        id: &ContainerId,
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        let state = {
            let state = self.lock();
            let entry = state
                .containers
                .get(id)
                .ok_or_else(|| not_found("container", id.as_str()))?;
            entry.record.phase.state()
        };
        if state == ContainerState::Exited {
            return Ok(());
        }
        if !grace.is_zero() && self.signal(id, libc::SIGTERM)? && self.wait_exited(id, grace).await
        {
            return Ok(());
        }
        self.signal(id, libc::SIGKILL)?;
        if self.wait_exited(id, KILL_TIMEOUT).await {
            Ok(())
        } else {
            Err(RuntimeError::Kill {
                id: id.clone(),
                message: format!("still running {}s after SIGKILL", KILL_TIMEOUT.as_secs()),
            })
        }
    }

    pub(crate) async fn remove_container(&self, id: &ContainerId) -> Result<(), RuntimeError> {
        let exists = self.lock().containers.contains_key(id);
        if !exists {
            // Possibly a leftover directory from a crash: clean what is there.
            let dir = self.container_dir(id);
            if dir.exists() {
                self.undo_create(id, &dir, None).await?;
            }
            return Ok(());
        }
        self.stop_container(id, Duration::ZERO).await?;
        let cgroups_path = {
            let state = self.lock();
            state
                .containers
                .get(id)
                .and_then(|e| e.record.cgroups_path.clone())
        };
        // A rootfs given the image's owners inside the subordinate ranges (image/owners.rs)
        // is handed back to the user by libcontainer's delete worker, not by the fast path.
        let hand_back =
            self.config.rootless && crate::image::owners::needs_hand_back(&self.container_dir(id));
        let cleaned = !hand_back
            && super::cleanup::remove_exited(
                self.cgroups.as_ref(),
                cgroups_path.as_deref(),
                &self.config.libcontainer_root(),
                id.as_str(),
            );
        if !cleaned {
            self.zygote
                .delete(id.as_str(), self.config.libcontainer_root(), true)
                .await?;
        }
        self.release_and_remove(&self.container_dir(id)).await?;
        crate::zygote::exits::remove(&self.config.exits_dir(), id.as_str());
        // The pump releases the pipes at end of stream; a removed container's are not needed.
        let _ = self.zygote.release_logs(id.as_str()).await;
        self.lock().containers.remove(id);
        tracing::debug!(container_id = %id, "container removed");
        self.release_pod_mounts_if_idle().await;
        Ok(())
    }
}

/// Resolves when the process (pid, start time) no longer runs.
pub(super) async fn wait_process_gone(pid: i32, start_time: u64) {
    let Ok(pidfd) = crate::zygote::sys::pidfd_open(pid) else {
        return;
    };
    if crate::zygote::process_start_time(pid).ok() != Some(start_time) {
        return;
    }
    // SAFETY: the AsyncFd owns the pidfd for its whole life.
    match unsafe { tokio::io::unix::AsyncFd::register(pidfd) } {
        // A pidfd turns readable when its process exits.
        Ok(fd) => {
            let _ = fd.readable().await;
        }
        Err(_) => loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if crate::zygote::process_start_time(pid).ok() != Some(start_time) {
                return;
            }
        },
    }
}

fn sandbox_namespaces(sandbox: &super::record::SandboxRecord) -> SandboxNamespaces {
    if let Some(holder) = &sandbox.holder {
        return SandboxNamespaces {
            net: NamespaceMode::Join(holder.ns_path("net")),
            uts: NamespaceMode::Join(holder.ns_path("uts")),
            ipc: if sandbox.config.host_ipc {
                NamespaceMode::Host
            } else {
                NamespaceMode::Join(holder.ns_path("ipc"))
            },
            pid: if sandbox.config.host_pid {
                NamespaceMode::Host
            } else {
                NamespaceMode::New
            },
        };
    }
    let pick = |shared: bool, host: bool, kind: &str| match (&sandbox.namespace_dir, shared, host) {
        (Some(dir), true, _) => NamespaceMode::Join(dir.join(kind)),
        (_, _, true) => NamespaceMode::Host,
        _ => NamespaceMode::New,
    };
    SandboxNamespaces {
        net: pick(sandbox.net, sandbox.config.host_network, "net"),
        ipc: pick(sandbox.ipc, sandbox.config.host_ipc, "ipc"),
        uts: pick(sandbox.uts, sandbox.config.host_network, "uts"),
        pid: if sandbox.config.host_pid {
            NamespaceMode::Host
        } else {
            NamespaceMode::New
        },
    }
}

/// Where a container's cgroup goes: under `parent`, else under [`FALLBACK_CGROUP_PARENT`].
/// A container with cgroups always gets a path (rootless without delegation gets none, see
/// `cgroups_path_for`): without one libcontainer invents `:youki:<id>` in every hierarchy, which nothing removes.
fn container_cgroups_path(parent: Option<&str>, id: &ContainerId) -> String {
    let parent = parent.unwrap_or(FALLBACK_CGROUP_PARENT);
    format!("{}/{}", parent.trim_end_matches('/'), id)
}

/// A rootless container's cgroup parent: `parent` as it is when it already lies below the
/// delegated cgroup `root` (the agent's pod cgroups), else `parent` (or the fallback) below it.
fn under_delegated_root(root: &ironlet_cgroups::CgroupPath, parent: Option<&str>) -> String {
    let parent = parent
        .unwrap_or(FALLBACK_CGROUP_PARENT)
        .trim_end_matches('/');
    if ironlet_cgroups::CgroupPath::new(parent).is_ok_and(|p| p.starts_with(root)) {
        return parent.to_owned();
    }
    format!(
        "{}/{}",
        root.as_str().trim_end_matches('/'),
        parent.trim_start_matches('/')
    )
}

/// The cgroup parent of containers whose sandbox and runtime config name none.
const FALLBACK_CGROUP_PARENT: &str = "/ironlet";

#[cfg(test)]
mod cgroup_path_tests {
    use super::*;

    #[test]
    fn a_container_gets_a_cgroup_path_below_its_parent_or_the_fallback() {
        let id = ContainerId::parse("0123456789abcdef0123456789abcdef").expect("id");
        assert_eq!(
            container_cgroups_path(Some("/kubepods/pod1/"), &id),
            "/kubepods/pod1/0123456789abcdef0123456789abcdef"
        );
        assert_eq!(
            container_cgroups_path(None, &id),
            "/ironlet/0123456789abcdef0123456789abcdef",
            "without a parent libcontainer would invent :youki:<id>"
        );
    }

    #[test]
    fn a_rootless_parent_lies_below_the_delegated_cgroup() {
        let root =
            ironlet_cgroups::CgroupPath::new("/user.slice/user-1000.slice/x.scope").expect("path");
        assert_eq!(
            under_delegated_root(
                &root,
                Some("/user.slice/user-1000.slice/x.scope/kubepods/p")
            ),
            "/user.slice/user-1000.slice/x.scope/kubepods/p",
            "the agent's pod cgroups are already there"
        );
        assert_eq!(
            under_delegated_root(&root, Some("/ironlet-ctr/")),
            "/user.slice/user-1000.slice/x.scope/ironlet-ctr"
        );
        assert_eq!(
            under_delegated_root(&root, None),
            "/user.slice/user-1000.slice/x.scope/ironlet"
        );
    }
}

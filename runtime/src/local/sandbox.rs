//! Pod sandboxes without a pause process: a directory, a record and, unless the pod uses
//! the host's, network/IPC/UTS namespaces pinned by bind mounts (`<dir>/ns/{net,ipc,uts}`).
//! Rootless sandboxes share nothing: each container gets its own namespaces, because an
//! unprivileged user cannot pin namespace files on the host.
//!
//! With CNI networking configured, a sandbox with its own network namespace joins the
//! node's network right after the namespace is pinned (ADD; its IP goes into the record)
//! and leaves it before the namespace is unpinned (DEL at stop, again at remove). A
//! sandbox whose ADD fails is rolled back completely: DEL, unpin, directory removed.

use std::time::{Duration, SystemTime};

use std::os::unix::fs::DirBuilderExt;

use nix::mount::MntFlags;

use super::record::{self, SandboxRecord};
use super::{not_found, remove_dir_all_if_exists, Inner};
use crate::error::RuntimeError;
use crate::network::PodRef;
use crate::types::{ContainerId, PodSandboxConfig, SandboxId, SandboxState};

impl Inner {
    pub(crate) async fn run_pod_sandbox(
        &self,
        config: &PodSandboxConfig,
    ) -> Result<SandboxId, RuntimeError> {
        if config.pod_uid.is_empty() || config.name.is_empty() {
            return Err(RuntimeError::InvalidConfig(
                "sandbox needs a pod uid and a name".into(),
            ));
        }
        let pod_mounts = self.pod_mounts_guard().await;
        let id = SandboxId::random();
        let dir = self.config.sandboxes_dir().join(id.as_str());
        crate::fsutil::private_dir(&dir).map_err(|e| RuntimeError::io("create", &dir, e))?;
        let share = !self.config.rootless;
        let (net, ipc, uts) = (
            share && !config.host_network,
            share && !config.host_ipc,
            share && !config.host_network,
        );
        let mut rec = SandboxRecord {
            id: id.clone(),
            config: config.clone(),
            created_at: SystemTime::now(),
            state: SandboxState::Ready,
            namespace_dir: None,
            net,
            ipc,
            uts,
            ip: None,
            network: None,
            holder: None,
        };
        let log_dir = &config.log_directory;
        let log_dir_existed = log_dir.as_os_str().is_empty() || log_dir.exists();
        let result = self.make_sandbox(&mut rec).await;
        if let Err(original) = result {
            self.stop_holder(&rec).await;
            let cleanup = match self.detach_network(&rec).await {
                Ok(()) => self.destroy_sandbox_files(&rec),
                Err(e) => self.destroy_sandbox_files(&rec).and(Err(e)),
            };
            drop(pod_mounts);
            self.release_pod_mounts_if_idle().await;
            // The pod log directory this attempt created, still empty (no container ran).
            if !log_dir_existed {
                if let Err(e) = std::fs::remove_dir(log_dir) {
                    tracing::debug!(dir = %log_dir.display(), error = %e, "pod log directory kept");
                }
            }
            if let Err(cleanup) = cleanup {
                return Err(RuntimeError::Rollback {
                    original: Box::new(original),
                    cleanup: Box::new(cleanup),
                });
            }
            return Err(original);
        }
        self.lock().sandboxes.insert(id.clone(), rec);
        drop(pod_mounts);
        Ok(id)
    }

    async fn make_sandbox(&self, rec: &mut SandboxRecord) -> Result<(), RuntimeError> {
        let dir = self.config.sandboxes_dir().join(rec.id.as_str());
        if !rec.config.log_directory.as_os_str().is_empty() {
            // kubelet's mode for pod log directories; the files are 0640 (see logs::open).
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(super::logs::LOG_DIR_MODE)
                .create(&rec.config.log_directory)
                .map_err(|e| {
                    RuntimeError::io("create log directory", &rec.config.log_directory, e)
                })?;
        }
        if rec.net || rec.ipc || rec.uts {
            let ns_dir = dir.join("ns");
            std::fs::create_dir_all(&ns_dir).map_err(|e| RuntimeError::io("create", &ns_dir, e))?;
            rec.namespace_dir = Some(ns_dir.clone());
            let hostname = if rec.config.hostname.is_empty() {
                rec.config.name.clone()
            } else {
                rec.config.hostname.clone()
            };
            // Read once: whether eth0 gets IPv6 depends on the network ADD then joins.
            let list = self
                .network
                .as_ref()
                .filter(|_| rec.net)
                .and_then(|n| n.resolve());
            let ipv4_only = list.as_ref().is_some_and(|l| l.ipv4_only());
            self.zygote
                .create_namespaces(
                    ns_dir.clone(),
                    hostname,
                    rec.net,
                    rec.ipc,
                    rec.uts,
                    ipv4_only,
                )
                .await?;
            if let (true, Some(network)) = (rec.net, &self.network) {
                let attached = network
                    .attach(list, &pod_ref(rec), &ns_dir.join("net"))
                    .await
                    .map_err(|source| RuntimeError::Network {
                        sandbox_id: rec.id.clone(),
                        source: Box::new(source),
                    })?;
                rec.ip = attached.as_ref().map(|a| a.ip.to_string());
                rec.network = attached;
            }
        }
        if self.config.rootless && !rec.config.host_network && self.config.cni.is_some() {
            self.start_rootless_network(rec, &dir).await?;
        }
        record::save(&dir, rec).map_err(|e| RuntimeError::io("save sandbox record", &dir, e))
    }

    /// Rootless: starts the holder of the pod's namespaces with pasta (`zygote/holder.rs`,
    /// `network/rootless.rs`). Without pasta, `/dev/net/tun` or an id range the pod keeps
    /// a loopback-only network (one warning per process says why).
    async fn start_rootless_network(
        &self,
        rec: &mut SandboxRecord,
        dir: &std::path::Path,
    ) -> Result<(), RuntimeError> {
        use crate::network::rootless;
        let userns = crate::spec::subids::rootless_user_namespace();
        let Some(pasta) = rootless::usable(userns.made_by_worker) else {
            return Ok(());
        };
        let hostname = if rec.config.hostname.is_empty() {
            rec.config.name.clone()
        } else {
            rec.config.hostname.clone()
        };
        let request = rootless::HolderRequest {
            id: crate::zygote::holder_id(rec.id.as_str()),
            dir: dir.to_owned(),
            hostname,
            uids: userns.uid_mappings.clone(),
            gids: userns.gid_mappings.clone(),
            ipc: !rec.config.host_ipc,
            pasta: rootless::pasta_args(&pasta, dir, &rec.config.port_mappings),
        };
        let started = std::time::Instant::now();
        let (pid, start_time) =
            self.zygote
                .create_pod_network(request)
                .await
                .map_err(|e| RuntimeError::Network {
                    sandbox_id: rec.id.clone(),
                    source: Box::new(crate::network::NetworkError::Rootless(e.to_string())),
                })?;
        let holder = record::NamespaceHolder { pid, start_time };
        rec.holder = Some(holder);
        if self
            .network_at_start
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            tracing::debug!(sandbox_id = %rec.id, pid,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "rootless pod namespaces made; pasta connects them meanwhile");
            return Ok(());
        }
        rec.ip = wait_rootless_network(dir, holder)
            .await
            .map_err(|message| RuntimeError::Network {
                sandbox_id: rec.id.clone(),
                source: Box::new(crate::network::NetworkError::Rootless(message)),
            })?;
        tracing::debug!(sandbox_id = %rec.id, pid, ip = ?rec.ip,
            elapsed_ms = started.elapsed().as_millis() as u64, "rootless pod network up (pasta)");
        Ok(())
    }

    /// Before a container of `sandbox_id` starts, when sandboxes do not wait for their
    /// rootless network ([`super::LocalRuntime::network_ready_at_start`]): waits until pasta
    /// has configured it, and records the pod's address. A no-op otherwise, and once done.
    pub(super) async fn await_pod_network(
        &self,
        sandbox_id: &SandboxId,
    ) -> Result<(), RuntimeError> {
        if !self
            .network_at_start
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(());
        }
        let Some(holder) = self
            .lock()
            .sandboxes
            .get(sandbox_id)
            .filter(|rec| rec.ip.is_none())
            .and_then(|rec| rec.holder)
        else {
            return Ok(());
        };
        let dir = self.config.sandboxes_dir().join(sandbox_id.as_str());
        let started = std::time::Instant::now();
        let ip = match wait_rootless_network(&dir, holder).await {
            Ok(ip) => ip,
            Err(message) => {
                // A pod without its network is not ready: the agent recreates the sandbox.
                if let Some(rec) = self.lock().sandboxes.get_mut(sandbox_id) {
                    rec.state = SandboxState::NotReady;
                }
                return Err(RuntimeError::Network {
                    sandbox_id: sandbox_id.clone(),
                    source: Box::new(crate::network::NetworkError::Rootless(message)),
                });
            }
        };
        tracing::debug!(%sandbox_id, ip = ?ip, waited_ms = started.elapsed().as_millis() as u64,
            "rootless pod network up (pasta)");
        let rec = {
            let mut state = self.lock();
            let Some(rec) = state.sandboxes.get_mut(sandbox_id) else {
                return Ok(());
            };
            rec.ip = ip;
            rec.clone()
        };
        record::save(&dir, &rec).map_err(|e| RuntimeError::io("save sandbox record", &dir, e))
    }

    /// Stops a rootless pod's namespace holder, if it has one.
    pub(super) async fn stop_holder(&self, rec: &SandboxRecord) {
        if let Some(holder) = rec.holder {
            stop_holder(rec.id.as_str(), holder).await;
        }
    }

    /// Turns the sandbox NotReady (in memory; `None` if unknown) and lists its containers, in
    /// one lock: a create running meanwhile either registered its container before, and it
    /// is listed, or registers it after and is refused (see `register_created`), so no
    /// container outlives its sandbox's stop or removal.
    fn close_sandbox(&self, id: &SandboxId) -> Option<Vec<ContainerId>> {
        let mut state = self.lock();
        state.sandboxes.get_mut(id)?.state = SandboxState::NotReady;
        Some(
            state
                .containers
                .values()
                .filter(|e| e.record.sandbox_id == *id)
                .map(|e| e.record.id.clone())
                .collect(),
        )
    }

    pub(crate) async fn stop_pod_sandbox(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let containers = self
            .close_sandbox(id)
            .ok_or_else(|| not_found("sandbox", id.as_str()))?;
        for cid in containers {
            self.stop_container(&cid, Duration::ZERO).await?;
        }
        let rec = {
            let mut state = self.lock();
            let Some(rec) = state.sandboxes.get_mut(id) else {
                return Ok(());
            };
            rec.state = SandboxState::NotReady;
            rec.clone()
        };
        let dir = self.config.sandboxes_dir().join(id.as_str());
        record::save(&dir, &rec).map_err(|e| RuntimeError::io("save sandbox record", &dir, e))?;
        // A rootless pod's network goes with its containers (pasta stops with the holder).
        self.stop_holder(&rec).await;
        if rec.network.is_none() {
            return Ok(());
        }
        // The pod leaves the network now (containerd does the same at stop); a failure
        // is reported, and remove tries again.
        self.detach_network(&rec).await?;
        let rec = {
            let mut state = self.lock();
            let Some(rec) = state.sandboxes.get_mut(id) else {
                return Ok(());
            };
            rec.network = None;
            rec.ip = None;
            rec.clone()
        };
        record::save(&dir, &rec).map_err(|e| RuntimeError::io("save sandbox record", &dir, e))
    }

    pub(crate) async fn remove_pod_sandbox(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let containers = self.close_sandbox(id).unwrap_or_default();
        // A rootless pod's holder (and pasta) is stopped while its containers are removed,
        // not after: nothing of the pod runs any more (removal kills what still does), and
        // pasta's end (its tap device goes with it) takes as long as a container's removal.
        let holder = self.lock().sandboxes.get(id).and_then(|rec| rec.holder);
        let stop = async {
            if let Some(holder) = holder {
                stop_holder(id.as_str(), holder).await;
            }
        };
        let remove = async {
            for cid in containers {
                self.remove_container(&cid).await?;
            }
            Ok::<(), RuntimeError>(())
        };
        let ((), removed) = tokio::join!(stop, remove);
        removed?;
        let rec = self.lock().sandboxes.remove(id);
        if let Some(rec) = rec {
            // DEL must not keep a sandbox forever: a plugin that cannot clean up now (its
            // binary gone, the namespace lost at a reboot) is logged, and removal goes on.
            if let Err(err) = self.detach_network(&rec).await {
                tracing::warn!(sandbox_id = %id, %err, "CNI DEL failed; removing the sandbox anyway");
            }
            // Stopped above unless the holder was recorded meanwhile; idempotent.
            self.stop_holder(&rec).await;
            self.destroy_sandbox_files(&rec)?;
        }
        self.release_pod_mounts_if_idle().await;
        Ok(())
    }

    /// Runs CNI DEL for a sandbox attached to the network; a no-op otherwise.
    async fn detach_network(&self, rec: &SandboxRecord) -> Result<(), RuntimeError> {
        let (Some(attachment), Some(ns_dir)) = (&rec.network, &rec.namespace_dir) else {
            return Ok(());
        };
        let Some(network) = &self.network else {
            tracing::warn!(sandbox_id = %rec.id, ip = ?rec.ip,
                "sandbox joined a CNI network but networking is now disabled; its address is not released");
            return Ok(());
        };
        network
            .detach(&pod_ref(rec), &ns_dir.join("net"), attachment)
            .await
            .map_err(|source| RuntimeError::Network {
                sandbox_id: rec.id.clone(),
                source: Box::new(source),
            })
    }

    /// Unpins the namespaces and removes the sandbox directory; idempotent.
    fn destroy_sandbox_files(&self, rec: &SandboxRecord) -> Result<(), RuntimeError> {
        if let Some(ns_dir) = &rec.namespace_dir {
            for kind in ["net", "ipc", "uts"] {
                let file = ns_dir.join(kind);
                if file.exists() {
                    match nix::mount::umount2(&file, MntFlags::MNT_DETACH) {
                        Ok(())
                        | Err(nix::errno::Errno::EINVAL)
                        | Err(nix::errno::Errno::ENOENT) => {}
                        Err(e) => {
                            return Err(RuntimeError::io("unmount namespace", &file, e.into()))
                        }
                    }
                }
            }
        }
        remove_dir_all_if_exists(&self.config.sandboxes_dir().join(rec.id.as_str()))
    }
}

fn pod_ref(rec: &SandboxRecord) -> PodRef<'_> {
    PodRef {
        sandbox_id: rec.id.as_str(),
        namespace: &rec.config.namespace,
        name: &rec.config.name,
        uid: &rec.config.pod_uid,
        ports: &rec.config.port_mappings,
    }
}

/// How long a rootless pod's network may take to come up once its namespaces exist (the
/// holder gives pasta 10 s, then reports why it failed).
const ROOTLESS_NETWORK_TIMEOUT: Duration = Duration::from_secs(15);

/// Waits until the holder of the sandbox in `dir` reports its network up
/// ([`crate::zygote::NETWORK_READY`]); returns the pod's address, or why pasta failed.
async fn wait_rootless_network(
    dir: &std::path::Path,
    holder: record::NamespaceHolder,
) -> Result<Option<String>, String> {
    use crate::network::rootless::read_pod_ip;
    use crate::zygote::{NETWORK_FAILED, NETWORK_READY};
    let deadline = tokio::time::Instant::now() + ROOTLESS_NETWORK_TIMEOUT;
    loop {
        if dir.join(NETWORK_READY).exists() {
            return Ok(read_pod_ip(dir));
        }
        if let Ok(message) = std::fs::read_to_string(dir.join(NETWORK_FAILED)) {
            return Err(message);
        }
        if !holder.alive() {
            // It writes its verdict before it ends.
            return match std::fs::read_to_string(dir.join(NETWORK_FAILED)) {
                Ok(message) => Err(message),
                Err(_) if dir.join(NETWORK_READY).exists() => Ok(read_pod_ip(dir)),
                Err(_) => Err(format!(
                    "the pod's namespace holder (pid {}) ended before pasta had configured \
                     the network",
                    holder.pid
                )),
            };
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "pasta did not configure the pod's network within {}s",
                ROOTLESS_NETWORK_TIMEOUT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Stops a rootless pod's namespace holder (it stops and reaps pasta) and waits until it has
/// ended: SIGTERM, SIGKILL after 10 s. Idempotent.
pub(super) async fn stop_holder(what: &str, holder: record::NamespaceHolder) {
    let Ok(pidfd) = crate::zygote::sys::pidfd_open(holder.pid) else {
        return;
    };
    // Checked after opening the pidfd: the pid cannot be reused under us from here on.
    if !holder.alive() {
        return;
    }
    for (signal, wait) in [(libc::SIGTERM, 10), (libc::SIGKILL, 5)] {
        let _ = crate::zygote::sys::pidfd_send_signal(&pidfd, signal);
        let gone = super::container::wait_process_gone(holder.pid, holder.start_time);
        if tokio::time::timeout(Duration::from_secs(wait), gone)
            .await
            .is_ok()
        {
            return;
        }
        tracing::warn!(
            sandbox = what,
            pid = holder.pid,
            signal,
            "the pod's namespace holder did not end in time"
        );
    }
}

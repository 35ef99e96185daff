//! Re-adoption at start-up under a supervisor: the runtime rebuilds its containers from
//! their records, the supervisor's [`Hello`] (what it watches and which log pipes it holds)
//! and the exit records, finishes or rolls back what a crash interrupted, and resumes the
//! log pumps, before the agent's first pod sync reads any status.
//!
//! | record phase | supervisor / system                     | outcome                          |
//! |--------------|-----------------------------------------|----------------------------------|
//! | `Running`    | watched, same pid and start time        | running; nothing restarts        |
//! | `Running`    | not watched, exit recorded              | exited with the recorded status  |
//! | `Running`    | not watched, process alive (same start) | adopted: running, exit unknown   |
//! | `Running`    | not watched, process gone, no record    | exited 137 `Error` (unknown)     |
//! | `Created`    | any                                     | rolled back: killed and removed  |
//! | `Exited`     | —                                       | as recorded                      |
//!
//! A `Created` container never ran user code (or only for the instant between `start` and
//! the lost record update), so rolling it back is safe and leaves no trace: the pod worker
//! creates it again with the same attempt number. Directories without a record (a create
//! interrupted before its first record, a remove interrupted half-way), libcontainer state
//! and exit records of unknown containers are removed. Only the supervised agent does this:
//! it owns the data root (`ironlet ctr` may run beside it and only reads).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::record::{self, ContainerPhase, ContainerRecord};
use super::{logs, Entry, Inner};
use crate::types::ContainerId;
use crate::zygote::{Event, Hello, WireExit};

/// What start-up found and did; logged, and returned for tests and benchmarks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Containers still running, watched by the supervisor.
    pub running: usize,
    /// Containers that exited while no agent ran, with their recorded status.
    pub exited_while_down: usize,
    /// Running containers the supervisor did not know (it restarted): watched again, their
    /// exit status will be unknown.
    pub adopted: usize,
    /// Containers that ended without a recorded status (reported as 137, `Error`).
    pub lost: usize,
    /// Created-but-not-running containers rolled back.
    pub rolled_back: usize,
    /// Torn directories and states removed.
    pub torn_removed: usize,
    /// Log pumps resumed from pipes the supervisor held.
    pub log_pumps: usize,
}

/// What to do with one loaded record.
enum Verdict {
    Keep,
    Exit(WireExit, SystemTime),
    Adopt(i32, u64),
    RollBack,
}

impl Inner {
    pub(crate) async fn recover(&self, hello: &Hello) -> Recovery {
        let started = std::time::Instant::now();
        let mut report = Recovery::default();
        let live: HashMap<&str, (i32, u64)> = hello
            .live
            .iter()
            .map(|p| (p.id.as_str(), (p.pid, p.start_time)))
            .collect();
        let mut rollback = Vec::new();
        for mut rec in record::load_all::<ContainerRecord>(&self.config.containers_dir()) {
            let verdict = self.judge(&rec, &live);
            match verdict {
                Verdict::Keep => {
                    if rec.phase.process().is_some() {
                        report.running += 1;
                    }
                }
                Verdict::Exit(status, at) => {
                    if status == WireExit::Unknown {
                        report.lost += 1;
                    } else {
                        report.exited_while_down += 1;
                    }
                    self.apply_exit(&mut rec, status, at);
                    self.persist(&rec);
                }
                Verdict::Adopt(pid, start_time) => {
                    match self.zygote.adopt(rec.id.as_str(), pid, start_time).await {
                        Ok(()) => report.adopted += 1,
                        Err(err) => {
                            tracing::debug!(container_id = %rec.id, %err, "adoption failed; the container ended");
                            let (status, at) = self
                                .recorded_exit(&rec.id)
                                .unwrap_or((WireExit::Unknown, SystemTime::now()));
                            self.apply_exit(&mut rec, status, at);
                            self.persist(&rec);
                            report.lost += 1;
                        }
                    }
                }
                Verdict::RollBack => {
                    rollback.push(rec);
                    continue;
                }
            }
            let (tx, _) = watch::channel(rec.phase.process().is_none());
            self.lock()
                .containers
                .insert(rec.id.clone(), Entry::new(rec, tx, true));
        }
        report.log_pumps = self.resume_log_pumps(hello).await;
        for rec in rollback {
            match self.roll_back(&rec).await {
                Ok(()) => report.rolled_back += 1,
                Err(err) => {
                    tracing::error!(container_id = %rec.id, %err, "rolling back a half-created container failed")
                }
            }
        }
        report.torn_removed = self.remove_torn().await;
        self.recover_holders(hello).await;
        tracing::info!(
            running = report.running,
            exited_while_down = report.exited_while_down,
            adopted = report.adopted,
            lost = report.lost,
            rolled_back = report.rolled_back,
            torn_removed = report.torn_removed,
            log_pumps = report.log_pumps,
            took_ms = started.elapsed().as_millis() as u64,
            "containers re-adopted"
        );
        report
    }

    fn judge(&self, rec: &ContainerRecord, live: &HashMap<&str, (i32, u64)>) -> Verdict {
        let (pid, start_time) = match rec.phase {
            ContainerPhase::Exited { .. } => return Verdict::Keep,
            ContainerPhase::Created { .. } => return Verdict::RollBack,
            ContainerPhase::Running {
                pid, start_time, ..
            } => (pid, start_time),
        };
        if live.get(rec.id.as_str()) == Some(&(pid, start_time)) {
            return Verdict::Keep;
        }
        if let Some((status, at)) = self.recorded_exit(&rec.id) {
            return Verdict::Exit(status, at);
        }
        if crate::zygote::process_start_time(pid).ok() == Some(start_time) {
            return Verdict::Adopt(pid, start_time);
        }
        Verdict::Exit(WireExit::Unknown, SystemTime::now())
    }

    /// The exit the supervisor recorded for container `id`, if any.
    pub(crate) fn recorded_exit(&self, id: &ContainerId) -> Option<(WireExit, SystemTime)> {
        match crate::zygote::exits::read(&self.config.exits_dir(), id.as_str())? {
            Event::Exited {
                status,
                at_unix_nanos,
                ..
            } => Some((
                status,
                SystemTime::UNIX_EPOCH + Duration::from_nanos(at_unix_nanos as u64),
            )),
        }
    }

    /// Rootless pod networks (`zygote/holder.rs`): a holder the supervisor still watches
    /// goes on; one that outlived a supervisor restart is adopted; a sandbox whose holder is
    /// gone is NotReady (the pod worker makes a new one, as after a lost network namespace);
    /// a holder whose sandbox is unknown (a creation torn before its record) is stopped.
    async fn recover_holders(&self, hello: &Hello) {
        let sandboxes: Vec<_> = self
            .lock()
            .sandboxes
            .values()
            .filter(|s| s.holder.is_some())
            .cloned()
            .collect();
        let mut known = HashSet::new();
        for mut rec in sandboxes {
            let Some(holder) = rec.holder else { continue };
            let id = crate::zygote::holder_id(rec.id.as_str());
            known.insert(id.clone());
            let watched = hello
                .live
                .iter()
                .any(|p| p.id == id && p.pid == holder.pid && p.start_time == holder.start_time);
            if watched {
                continue;
            }
            if holder.alive() {
                match self.zygote.adopt(&id, holder.pid, holder.start_time).await {
                    Ok(()) => {
                        tracing::info!(sandbox_id = %rec.id, pid = holder.pid, "adopted the pod's network holder");
                        continue;
                    }
                    Err(err) => {
                        tracing::debug!(sandbox_id = %rec.id, %err, "adopting the pod's network holder failed")
                    }
                }
            }
            if rec.state == crate::types::SandboxState::Ready {
                tracing::warn!(sandbox_id = %rec.id, pid = holder.pid,
                    "the pod's network namespace holder is gone; the sandbox is NotReady");
                rec.state = crate::types::SandboxState::NotReady;
                let dir = self.config.sandboxes_dir().join(rec.id.as_str());
                if let Err(err) = record::save(&dir, &rec) {
                    tracing::warn!(sandbox_id = %rec.id, %err, "saving the sandbox record failed");
                }
                self.lock().sandboxes.insert(rec.id.clone(), rec);
            }
        }
        for orphan in hello
            .live
            .iter()
            .filter(|p| p.id.ends_with(crate::zygote::holder_id("").as_str()))
            .filter(|p| !known.contains(&p.id))
        {
            tracing::info!(pid = orphan.pid, id = %orphan.id, "stopping the network holder of an unknown sandbox");
            let holder = record::NamespaceHolder {
                pid: orphan.pid,
                start_time: orphan.start_time,
            };
            super::sandbox::stop_holder(&orphan.id, holder).await;
        }
    }

    /// Takes the log pipes the supervisor held for every known container and restarts
    /// their pumps; pipes of containers nobody knows any more are released.
    async fn resume_log_pumps(&self, hello: &Hello) -> usize {
        let mut resumed = 0;
        for id in &hello.held_logs {
            let known = ContainerId::parse(id).and_then(|cid| {
                let state = self.lock();
                state.containers.get(&cid).map(|e| {
                    let log = logs::LogFile {
                        path: e.record.log_path.clone(),
                        relative: e.record.config.log_path.clone(),
                        open: logs::LogOpen::Continue,
                        rotation: None,
                    };
                    (cid.clone(), log)
                })
            });
            let Some((cid, log)) = known else {
                let _ = self.zygote.release_logs(id).await;
                continue;
            };
            match self.zygote.take_logs(id).await {
                Ok(stdio) => {
                    self.spawn_log_pump(&cid, log, stdio);
                    resumed += 1;
                }
                Err(err) => {
                    tracing::warn!(container_id = %cid, %err, "cannot take the container's log pipes")
                }
            }
        }
        resumed
    }

    /// Kills a container that was created but not (known to be) started and removes all of
    /// it, as if the create had failed.
    async fn roll_back(&self, rec: &ContainerRecord) -> Result<(), crate::RuntimeError> {
        tracing::info!(container_id = %rec.id, name = %rec.config.name, "rolling back a container whose create or start was interrupted");
        if let Some((pid, start_time)) = rec.phase.process().filter(|(pid, _)| *pid > 0) {
            if let Ok(pidfd) = crate::zygote::sys::pidfd_open(pid) {
                if crate::zygote::process_start_time(pid).ok() == Some(start_time) {
                    let _ = crate::zygote::sys::pidfd_send_signal(&pidfd, libc::SIGKILL);
                    let gone = super::container::wait_process_gone(pid, start_time);
                    let _ = tokio::time::timeout(Duration::from_secs(10), gone).await;
                }
            }
        }
        let dir = self.container_dir(&rec.id);
        self.undo_create(&rec.id, &dir, rec.cgroups_path.as_deref())
            .await?;
        crate::zygote::exits::remove(&self.config.exits_dir(), rec.id.as_str());
        let _ = self.zygote.release_logs(rec.id.as_str()).await;
        self.lock().early_exits.remove(rec.id.as_str());
        Ok(())
    }

    /// CNI DEL for a sandbox torn between ADD and its record, so its address and rules
    /// are released; the namespace must still be pinned for plugins to find the interface.
    async fn detach_torn_sandbox(&self, id: &str, netns: &std::path::Path) {
        let Some(network) = &self.network else {
            return;
        };
        // Never hand the host's own namespace to DEL (it would delete the host's eth0).
        let same_as_host = |path: &std::path::Path| {
            use std::os::unix::fs::MetadataExt;
            let host = std::fs::metadata("/proc/self/ns/net").ok();
            let pinned = std::fs::metadata(path).ok();
            matches!((host, pinned), (Some(h), Some(p)) if h.dev() == p.dev() && h.ino() == p.ino())
        };
        if !netns.exists() || same_as_host(netns) {
            return;
        }
        if let Err(err) = network.detach_unrecorded(id, netns).await {
            tracing::warn!(sandbox_id = %id, %err, "CNI DEL of a torn sandbox failed");
        }
    }

    /// Removes torn directories and states (see [`super::cleanup::find_torn`]).
    async fn remove_torn(&self) -> usize {
        let known: HashSet<String> = self
            .lock()
            .containers
            .keys()
            .map(|id| id.to_string())
            .collect();
        let torn = super::cleanup::find_torn(
            &self.config.containers_dir(),
            &self.config.sandboxes_dir(),
            &self.config.libcontainer_root(),
            &self.config.exits_dir(),
            &known,
        );
        let mut removed = 0;
        for id in &torn.container_dirs {
            let dir = self.config.containers_dir().join(id);
            let result = match ContainerId::parse(id) {
                Some(cid) => self.undo_create(&cid, &dir, None).await,
                None => super::remove_dir_all_if_exists(&dir),
            };
            match result {
                Ok(()) => removed += 1,
                Err(err) => {
                    tracing::warn!(?dir, %err, "removing a torn container directory failed")
                }
            }
        }
        for id in &torn.sandbox_dirs {
            let dir = self.config.sandboxes_dir().join(id);
            self.detach_torn_sandbox(id, &dir.join("ns").join("net"))
                .await;
            match super::cleanup::remove_torn_sandbox(&dir) {
                Ok(()) => removed += 1,
                Err(err) => tracing::warn!(?dir, %err, "removing a torn sandbox directory failed"),
            }
        }
        for id in &torn.libcontainer_states {
            if torn.container_dirs.contains(id) {
                continue; // undo_create deleted it
            }
            match self
                .zygote
                .delete(id, self.config.libcontainer_root(), true)
                .await
            {
                Ok(()) => removed += 1,
                Err(err) => {
                    tracing::warn!(container_id = %id, %err, "deleting torn libcontainer state failed")
                }
            }
        }
        for id in &torn.exit_records {
            crate::zygote::exits::remove(&self.config.exits_dir(), id);
            removed += 1;
        }
        if removed > 0 {
            tracing::info!(?torn, "removed torn state");
        }
        removed
    }
}

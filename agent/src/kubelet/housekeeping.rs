//! Housekeeping (kubelet's `HandlePodCleanups`), every 2 s once all sources are ready:
//! tell the workers which pods are desired, kill runtime pods nobody wants (left by a
//! deleted pod or a previous agent run), and remove what finished pods leave behind —
//! sandboxes, containers, pod directories and logs — so a removed pod leaves nothing.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use ironlet_cgroups::QosClass;
use ironlet_runtime::types::{
    ContainerFilter, ContainerState, ContainerStatus, PodSandboxStatus, SandboxId, SandboxState,
};
use ironlet_runtime::RuntimeError;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::Kubelet;
use crate::apiserver::ApiCommand;
use crate::config::{is_static_pod, pod_full_name, pod_uid};
use crate::pod_manager::is_mirror_pod_of;
use crate::pod_workers::{KillPodOptions, PodLifecycle, UpdatePodOptions, UpdateType};

/// Grace period for runtime pods whose spec is unknown (kubelet kills them with the
/// default grace of the runtime; a short one keeps start-up clean-up quick).
const ORPHAN_GRACE_SECONDS: i64 = 2;

/// kubelet's `housekeepingWarningDuration`.
const HOUSEKEEPING_WARNING: std::time::Duration = std::time::Duration::from_secs(1);

impl Kubelet {
    pub(super) async fn housekeeping(&mut self) {
        let started = std::time::Instant::now();
        self.housekeep().await;
        let took = started.elapsed();
        // kubelet's warning, at its threshold: the sync loop handles nothing meanwhile.
        if took > HOUSEKEEPING_WARNING {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                expected_ms = HOUSEKEEPING_WARNING.as_millis() as u64,
                "housekeeping took longer than expected"
            );
        } else {
            tracing::debug!(took_us = took.as_micros() as u64, "housekeeping done");
        }
    }

    async fn housekeep(&mut self) {
        let desired: HashSet<String> = self
            .lock_manager()
            .pods()
            .iter()
            .map(|p| pod_uid(p).to_owned())
            .filter(|uid| !self.rejected.contains_key(uid))
            .collect();
        let states = self.workers.sync_known_pods(&desired);
        self.syncer.lock_backoff().gc(std::time::SystemTime::now());
        self.syncer
            .pull_backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain_pods(|uid| desired.contains(uid));

        let all = ContainerFilter::default();
        let (sandboxes, containers) = match tokio::try_join!(
            self.runtime.list_pod_sandboxes(),
            self.runtime.list_containers(&all)
        ) {
            Ok(listed) => listed,
            Err(err) => {
                tracing::warn!(%err, "housekeeping: listing the runtime failed");
                return;
            }
        };
        let sandbox_ids: HashSet<SandboxId> = sandboxes.iter().map(|s| s.id.clone()).collect();
        self.remove_sandboxless_containers(&containers, &sandbox_ids)
            .await;
        let mut by_uid: HashMap<String, Vec<PodSandboxStatus>> = HashMap::new();
        for sandbox in sandboxes {
            by_uid
                .entry(sandbox.config.pod_uid.clone())
                .or_default()
                .push(sandbox);
        }
        let with_sandbox: HashSet<String> = by_uid.keys().cloned().collect();
        self.remove_orphaned_pod_resources(|uid| {
            desired.contains(uid)
                || with_sandbox.contains(uid)
                || states
                    .get(uid)
                    .is_some_and(|s| *s != PodLifecycle::Finished)
        })
        .await;
        // What the syncer remembers per pod and per container goes with them (kubelet's
        // pod cache entries go with the worker): a churning node would grow without bound.
        self.syncer.cache.retain(|uid| {
            desired.contains(uid) || with_sandbox.contains(uid) || states.contains_key(uid)
        });
        let container_ids: HashSet<String> = containers.iter().map(|c| c.id.to_string()).collect();
        self.syncer
            .forget_termination_messages(|id| container_ids.contains(id));
        for (uid, sandboxes) in by_uid {
            if desired.contains(&uid) {
                continue;
            }
            match states.get(&uid) {
                Some(PodLifecycle::Finished) => self.remove_pod_leftovers(&uid, &sandboxes).await,
                Some(_) => {}
                None => {
                    let ids: HashSet<_> = sandboxes.iter().map(|s| s.id.clone()).collect();
                    let running = sandboxes.iter().any(|s| s.state == SandboxState::Ready)
                        || containers.iter().any(|c| {
                            ids.contains(&c.sandbox_id) && c.state == ContainerState::Running
                        });
                    if running {
                        tracing::info!(pod_uid = %uid, "killing runtime pod that is not desired");
                        self.workers.update_pod(UpdatePodOptions {
                            update_type: UpdateType::Kill,
                            pod: orphan_pod(&uid, &sandboxes),
                            kill: Some(KillPodOptions {
                                grace_period_override: Some(ORPHAN_GRACE_SECONDS),
                                completed: None,
                            }),
                        });
                    } else {
                        self.remove_pod_leftovers(&uid, &sandboxes).await;
                    }
                }
            }
        }
        // Finished pods whose sandboxes are already gone: drop their status and files.
        for (uid, state) in &states {
            if *state == PodLifecycle::Finished && !desired.contains(uid) {
                self.statuses.remove(uid);
                self.syncer.forget_eviction(uid);
                self.remove_pod_dir(uid);
            }
        }
        self.api_housekeeping();
    }

    /// With an API server: finalize deleted API pods whose containers stopped, create the
    /// mirror pods static pods lack (or whose hash is outdated), delete orphaned mirrors.
    fn api_housekeeping(&self) {
        let Some(commands) = &self.api_commands else {
            return;
        };
        let (pods, mirrors) = self.lock_manager().pods_and_mirror_pods();
        let orphans: HashSet<String> = self
            .lock_manager()
            .orphaned_mirror_pod_names()
            .into_iter()
            .collect();
        for pod in pods {
            let uid = pod_uid(&pod);
            if is_static_pod(&pod) {
                if self.workers.is_pod_termination_requested(uid) {
                    continue;
                }
                let mirror = self.lock_manager().mirror_pod_by_pod(&pod);
                let current = mirror.as_ref().is_some_and(|m| {
                    is_mirror_pod_of(m, &pod) && m.metadata.deletion_timestamp.is_none()
                });
                if !current {
                    let _ = commands.send(ApiCommand::EnsureMirror {
                        static_pod: pod.clone(),
                        outdated: mirror,
                    });
                }
            } else if pod.metadata.deletion_timestamp.is_some()
                && (self.workers.is_pod_terminated(uid) || self.rejected.contains_key(uid))
            {
                let _ = commands.send(ApiCommand::Finalize(pod.clone()));
            }
        }
        for mirror in mirrors {
            if orphans.contains(&pod_full_name(&mirror)) {
                let _ = commands.send(ApiCommand::DeleteMirror(mirror));
            }
        }
    }

    /// Containers whose sandbox is gone belong to no pod: nothing else would ever stop
    /// them (every other clean-up goes pod by pod, sandbox by sandbox). The runtime refuses
    /// such a container at its create; this removes any that a previous version or an
    /// interrupted removal left. The sandbox is asked for again first: the two listings are
    /// not one snapshot.
    async fn remove_sandboxless_containers(
        &self,
        containers: &[ContainerStatus],
        sandboxes: &HashSet<SandboxId>,
    ) {
        for c in containers
            .iter()
            .filter(|c| !sandboxes.contains(&c.sandbox_id))
        {
            match self.runtime.pod_sandbox_status(&c.sandbox_id).await {
                Err(RuntimeError::NotFound { .. }) => {}
                Ok(_) | Err(_) => continue,
            }
            tracing::info!(container_id = %c.id, sandbox = %c.sandbox_id, name = %c.name,
                "removing a container whose sandbox is gone");
            if let Err(err) = self.runtime.remove_container(&c.id).await {
                tracing::warn!(container_id = %c.id, %err, "removing a container whose sandbox is gone failed");
            }
        }
    }

    /// Removes a dead pod's sandboxes (with their containers), its directory and its logs.
    async fn remove_pod_leftovers(&self, uid: &str, sandboxes: &[PodSandboxStatus]) {
        for sandbox in sandboxes {
            if let Err(err) = self.runtime.remove_pod_sandbox(&sandbox.id).await {
                tracing::warn!(pod_uid = %uid, sandbox = %sandbox.id, %err, "removing sandbox failed");
                return;
            }
            remove_dir(&sandbox.config.log_directory);
        }
        self.statuses.remove(uid);
        self.remove_pod_dir(uid);
        tracing::info!(pod_uid = %uid, "pod removed");
    }

    /// kubelet's `cleanupOrphanedPodCgroups`, `cleanupOrphanedPodDirs` and the container
    /// GC's `evictPodLogsDirectories`: a pod nobody wants, without sandbox or active worker,
    /// may still have a cgroup, a directory or a log directory (the agent was killed
    /// between creating them and the sandbox, or between removing the sandbox and them, and
    /// the pod was deleted meanwhile). `keep` says which UIDs to leave alone.
    async fn remove_orphaned_pod_resources(&self, keep: impl Fn(&str) -> bool) {
        let pod_dirs = std::fs::read_dir(self.config.pods_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned());
        for uid in pod_dirs.filter(|uid| !keep(uid)).collect::<Vec<_>>() {
            match self.syncer.volumes.teardown_pod_volumes(&uid).await {
                Ok(()) => {
                    tracing::info!(pod_uid = %uid, "removing the directory of an orphaned pod");
                    self.remove_pod_dir(&uid);
                }
                Err(err) => {
                    tracing::warn!(pod_uid = %uid, %err, "tearing down an orphaned pod's volumes failed")
                }
            }
        }
        for dir in orphaned_pod_log_dirs(&self.config.pod_log_dir, &keep) {
            tracing::info!(dir = %dir.display(), "removing the log directory of an orphaned pod");
            remove_dir(&dir);
        }
        let Some(cgroups) = &self.syncer.cgroups else {
            return;
        };
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            // Every controller: a torn create may have reached only some of them.
            let uids: HashSet<String> = cgroups
                .hierarchy()
                .dirs(&cgroups.qos_path(qos))
                .into_iter()
                .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_prefix("pod").map(str::to_owned)
                })
                .filter(|uid| !keep(uid))
                .collect();
            for uid in uids {
                let Ok(path) = cgroups.pod_path(qos, &uid) else {
                    continue;
                };
                tracing::info!(pod_uid = %uid, cgroup = %path, "removing the cgroup of an orphaned pod");
                if let Err(err) = cgroups.remove(&path) {
                    tracing::warn!(pod_uid = %uid, %err, "removing an orphaned pod cgroup failed");
                }
            }
        }
    }

    fn remove_pod_dir(&self, uid: &str) {
        // UIDs come from our own records; refuse anything that is not a plain name.
        if uid.is_empty() || uid.contains('/') || uid == "." || uid == ".." {
            return;
        }
        remove_dir(&self.config.pods_dir().join(uid));
    }
}

fn remove_dir(path: &PathBuf) {
    match std::fs::remove_dir_all(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => tracing::warn!(path = %path.display(), %err, "removing directory failed"),
    }
}

/// Pod log directories (`<ns>_<name>_<uid>`) under `pod_log_dir` whose UID `keep` does not
/// claim. `ironlet ctr run`'s containers (namespace `ironlet-ctr`) are not the agent's and
/// are left alone, as are names not in kubelet's layout.
fn orphaned_pod_log_dirs(
    pod_log_dir: &std::path::Path,
    keep: impl Fn(&str) -> bool,
) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(pod_log_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let (rest, uid) = name.rsplit_once('_')?;
            let (namespace, _pod) = rest.split_once('_')?;
            let ours = namespace != crate::kubelet::CTR_NAMESPACE && !uid.is_empty();
            (ours && !keep(uid)).then(|| e.path())
        })
        .collect()
}

/// A stand-in pod for a runtime pod whose spec is gone: enough to kill it.
fn orphan_pod(uid: &str, sandboxes: &[PodSandboxStatus]) -> Arc<Pod> {
    let config = sandboxes.first().map(|s| &s.config);
    Arc::new(Pod {
        metadata: ObjectMeta {
            uid: Some(uid.to_owned()),
            name: config.map(|c| c.name.clone()),
            namespace: config.map(|c| c.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            termination_grace_period_seconds: Some(ORPHAN_GRACE_SECONDS),
            ..PodSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_log_directories_of_unclaimed_agent_pods_are_orphans() {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in [
            "default_web_uid-kept",
            "default_gone_uid-gone",
            "kube-system_dns-1_uid-gone2",
            "ironlet-ctr_busybox_uid-ctr",
            "not-kubelet-layout",
        ] {
            std::fs::create_dir(dir.path().join(name)).expect("mkdir");
        }
        std::fs::write(dir.path().join("default_file_uid-file"), b"").expect("file");
        let mut found = orphaned_pod_log_dirs(dir.path(), |uid| uid == "uid-kept");
        found.sort();
        assert_eq!(
            found,
            vec![
                dir.path().join("default_gone_uid-gone"),
                dir.path().join("kube-system_dns-1_uid-gone2"),
            ]
        );
        assert!(orphaned_pod_log_dirs(&dir.path().join("missing"), |_| false).is_empty());
    }
}

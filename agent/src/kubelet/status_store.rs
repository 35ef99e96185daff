//! [`StatusStore`]: the latest API status of every pod this node runs or rejected — what
//! `ironlet pods` shows and what the API status manager patches.
//!
//! Writers replace a pod's entry whole; readers get copies. Every change bumps a version
//! number that watchers can wait on.
//!
//! # Persistence across agent restarts
//! A pod whose containers outlive the agent (kill -9, a SIGHUP upgrade, a killed
//! supervisor) must come back with the status it had: readiness, `started`, `startTime`,
//! the conditions' `lastTransitionTime`, and — for static pods — the age. Only the agent
//! knew those (the runtime keeps pids, start times and attempts, not readiness or
//! transition times), so each status change of a pod that has a directory
//! (`<root>/pods/<uid>/`, made before its first container) is written to
//! `<root>/pods/<uid>/status.json`, with the pod's `config.seen`, before the change is
//! visible to readers (temp file + fsync + rename + fsync of the directory, as the runtime's
//! records; mode 0600). The next agent loads these records ([`StatusStore::load`]) and hands a pod's
//! record to the status computation as its previous status
//! ([`StatusStore::previous`]); the probe manager seeds a re-adopted container's readiness
//! and startup from it. The file goes with the pod directory.
//!
//! Why a local record rather than the API server's copy of the status: static pods have
//! none until their mirror exists (and a mirror's status may lag), the agent may restart
//! while the API server is unreachable, and the API copy is rounded to seconds and
//! written asynchronously; the local record is exactly what the agent last computed, the
//! same for both kinds of pod. Only changes are written, so a steady node writes nothing.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::{annotation, pod_uid, CONFIG_SEEN};
use crate::server::pod_is_named;

/// The file, inside a pod's directory, that holds its last status.
pub const STATUS_FILE: &str = "status.json";

/// What is written per pod.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    /// `kubernetes.io/config.seen` of the first sighting, kept across restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seen: Option<String>,
    status: PodStatus,
}

/// Pods and their computed statuses, by UID.
#[derive(Debug)]
pub struct StatusStore {
    entries: Mutex<HashMap<String, (Arc<Pod>, PodStatus)>>,
    version: watch::Sender<u64>,
    /// `<root>/pods`, where records are written; `None`: nothing is persisted.
    pods_dir: Option<PathBuf>,
    /// Records of the previous agent, by UID, until the pod's status is set again.
    recovered: Mutex<HashMap<String, Record>>,
    /// Serialises record writes so that the file holds the newest status.
    writes: Mutex<()>,
    /// UIDs set to a different status or removed since [`Self::take_changed`] last ran: a
    /// watcher handles the pods that changed, not every pod of the node.
    changed: Mutex<HashSet<String>>,
}

impl Default for StatusStore {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            version: watch::channel(0).0,
            pods_dir: None,
            recovered: Mutex::default(),
            writes: Mutex::new(()),
            changed: Mutex::default(),
        }
    }
}

impl StatusStore {
    /// A store persisting into `<pods_dir>/<uid>/status.json`, loaded with the records
    /// already there. Unreadable records are logged and ignored (the pod then starts from
    /// what the runtime shows, as before persistence existed).
    pub fn load(pods_dir: &Path) -> Self {
        let mut recovered = HashMap::new();
        for entry in std::fs::read_dir(pods_dir).into_iter().flatten().flatten() {
            let uid = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path().join(STATUS_FILE);
            match std::fs::read(&path) {
                Ok(bytes) => match serde_json::from_slice::<Record>(&bytes) {
                    Ok(record) => {
                        recovered.insert(uid, record);
                    }
                    Err(err) => {
                        tracing::warn!(path = %path.display(), %err, "ignoring an unreadable pod status record")
                    }
                },
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    tracing::warn!(path = %path.display(), %err, "ignoring an unreadable pod status record")
                }
            }
        }
        if !recovered.is_empty() {
            tracing::info!(pods = recovered.len(), "pod statuses recovered");
        }
        Self {
            pods_dir: Some(pods_dir.to_owned()),
            recovered: Mutex::new(recovered),
            ..Self::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<Pod>, PodStatus)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_recovered(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.recovered.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the pod's status (and remembers the pod spec it belongs to). A changed status
    /// is persisted before readers see it.
    pub fn set(&self, pod: Arc<Pod>, status: PodStatus) {
        let uid = pod_uid(&pod).to_owned();
        let _write = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        let recovered = self.lock_recovered().remove(&uid);
        let (first_seen, changed) = match self.lock().get(&uid) {
            Some((old, old_status)) => (
                annotation(old, CONFIG_SEEN).map(str::to_owned),
                *old_status != status,
            ),
            None => match recovered {
                Some(record) => (record.seen, record.status != status),
                None => (None, true),
            },
        };
        let pod = keep_seen(pod, first_seen.as_deref());
        if changed {
            self.persist(&uid, &pod, &status);
        }
        self.lock().insert(uid.clone(), (pod, status));
        if changed {
            self.mark_changed(uid);
        }
    }

    /// Writes the pod's record if its directory exists (a pod without one has no container
    /// that could outlive the agent).
    fn persist(&self, uid: &str, pod: &Pod, status: &PodStatus) {
        let Some(dir) = self.pods_dir.as_ref().map(|d| d.join(uid)) else {
            return;
        };
        if uid.is_empty() || uid.contains('/') || uid == "." || uid == ".." || !dir.is_dir() {
            return;
        }
        let record = Record {
            seen: annotation(pod, CONFIG_SEEN).map(str::to_owned),
            status: status.clone(),
        };
        let written = serde_json::to_vec(&record)
            .map_err(std::io::Error::other)
            .and_then(|bytes| write_private(&dir, &bytes));
        if let Err(err) = written {
            tracing::warn!(pod_uid = %uid, %err, "persisting the pod status failed");
        }
    }

    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        self.lock().get(uid).map(|(_, s)| s.clone())
    }

    /// The status the next one is computed from: the current one, or, before the first
    /// status of this agent, the one the previous agent recorded.
    pub fn previous(&self, uid: &str) -> Option<PodStatus> {
        self.status(uid)
            .or_else(|| self.lock_recovered().get(uid).map(|r| r.status.clone()))
    }

    pub fn remove(&self, uid: &str) {
        let _write = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        self.lock_recovered().remove(uid);
        if let Some(dir) = self.pods_dir.as_ref().map(|d| d.join(uid)) {
            match std::fs::remove_file(dir.join(STATUS_FILE)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    tracing::warn!(pod_uid = %uid, %err, "removing the pod status record failed")
                }
            }
        }
        if self.lock().remove(uid).is_some() {
            self.mark_changed(uid.to_owned());
        }
    }

    fn mark_changed(&self, uid: String) {
        self.changed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid);
        self.version.send_modify(|v| *v += 1);
    }

    /// The UIDs whose status was set to a different one, or removed, since the last call
    /// (the first call: since the store was made), in no order.
    pub fn take_changed(&self) -> Vec<String> {
        let mut changed = self.changed.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *changed).into_iter().collect()
    }

    /// The pod `uid` (shared, as the store has it) with its status.
    pub fn entry(&self, uid: &str) -> Option<(Arc<Pod>, PodStatus)> {
        self.lock()
            .get(uid)
            .map(|(pod, status)| (Arc::clone(pod), status.clone()))
    }

    /// Every pod with its status filled in, sorted by namespace and name.
    pub fn pods(&self) -> Vec<Pod> {
        let mut pods: Vec<Pod> = self
            .lock()
            .values()
            .map(|(pod, status)| {
                let mut pod = (**pod).clone();
                pod.status = Some(status.clone());
                pod
            })
            .collect();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        pods
    }

    /// Every pod (shared, as the store has it) with its status, sorted as [`Self::pods`]:
    /// what a reader that needs only the pods' metadata and statuses takes instead of
    /// [`Self::pods`], which copies each pod.
    pub fn statuses(&self) -> Vec<(Arc<Pod>, PodStatus)> {
        let mut entries: Vec<(Arc<Pod>, PodStatus)> = self
            .lock()
            .values()
            .map(|(pod, status)| (Arc::clone(pod), status.clone()))
            .collect();
        entries.sort_by(|(a, _), (b, _)| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        entries
    }

    /// One pod with its status.
    pub fn pod(&self, uid: &str) -> Option<Pod> {
        self.lock().get(uid).map(|(pod, status)| {
            let mut pod = (**pod).clone();
            pod.status = Some(status.clone());
            pod
        })
    }

    /// The pod `namespace`/`name` with its status, copying that pod only (of two pods of
    /// one name, e.g. one still terminating, either; as [`Self::pods`] has them, unordered).
    pub fn pod_named(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.find_named(namespace, name, |pod, status| {
            let mut pod = pod.clone();
            pod.status = Some(status.clone());
            pod
        })
    }

    /// The status of the pod `namespace`/`name` (see [`Self::pod_named`]), copying nothing
    /// else.
    pub fn status_named(&self, namespace: &str, name: &str) -> Option<PodStatus> {
        self.find_named(namespace, name, |_, status| status.clone())
    }

    /// `take` applied to the pod `namespace`/`name` and its status, under the lock.
    fn find_named<T>(
        &self,
        namespace: &str,
        name: &str,
        take: impl FnOnce(&Pod, &PodStatus) -> T,
    ) -> Option<T> {
        self.lock()
            .values()
            .find(|(pod, _)| pod_is_named(pod, namespace, name))
            .map(|(pod, status)| take(pod, status))
    }

    /// Bumps on every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

/// Replaces `<dir>/status.json` crash-safely (temp file, fsync, rename, fsync of the
/// directory; without the fsyncs when the state is throwaway), readable by its owner only: a status holds termination messages, which may
/// hold secrets.
fn write_private(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = dir.join(format!(".{STATUS_FILE}.{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    file.write_all(bytes)?;
    // A play removes its pods' records before it exits (see `fsutil::set_state_throwaway`).
    let durable = !ironlet_runtime::fsutil::state_is_throwaway();
    if durable {
        file.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(STATUS_FILE))?;
    if durable {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The pod with `seen` as its `config.seen`, if known: the pod was first seen then, by
/// this agent or the previous one, not when this agent re-read its manifest (`ironlet
/// pods` ages static pods from it).
fn keep_seen(pod: Arc<Pod>, seen: Option<&str>) -> Arc<Pod> {
    let Some(seen) = seen else {
        return pod;
    };
    if annotation(&pod, CONFIG_SEEN) == Some(seen) {
        return pod;
    }
    let mut pod = (*pod).clone();
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(CONFIG_SEEN.to_owned(), seen.to_owned());
    Arc::new(pod)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(uid: &str, seen: &str) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                name: Some("web".into()),
                annotations: Some([(CONFIG_SEEN.to_owned(), seen.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        })
    }

    fn status(phase: &str) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        }
    }

    #[test]
    fn only_pods_whose_status_changed_or_that_went_are_taken_as_changed() {
        let store = StatusStore::default();
        for uid in ["a", "b", "c"] {
            store.set(pod(uid, "t0"), status("Pending"));
        }
        let mut first = store.take_changed();
        first.sort();
        assert_eq!(first, ["a", "b", "c"]);
        assert!(store.take_changed().is_empty(), "taken once");
        // The same status again is no change; a new one and a removal are.
        store.set(pod("a", "t0"), status("Pending"));
        store.set(pod("b", "t0"), status("Running"));
        store.remove("c");
        store.remove("never-there");
        let mut next = store.take_changed();
        next.sort();
        assert_eq!(next, ["b", "c"]);
        assert_eq!(
            store.entry("b").map(|(_, s)| s.phase),
            Some(Some("Running".to_owned()))
        );
        assert!(store.entry("c").is_none());
    }

    #[test]
    fn a_new_store_recovers_statuses_and_first_sightings_of_pods_with_a_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("with-dir")).expect("pod dir");
        let store = StatusStore::load(dir.path());
        store.set(pod("with-dir", "t0"), status("Pending"));
        store.set(pod("with-dir", "t0"), status("Running"));
        store.set(pod("no-dir", "t0"), status("Running"));
        assert!(!dir.path().join("no-dir").exists(), "no directory is made");
        let mode = std::fs::metadata(dir.path().join("with-dir").join(STATUS_FILE))
            .expect("record")
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600,
            "the owner's only"
        );

        let next = StatusStore::load(dir.path());
        assert_eq!(next.previous("with-dir"), Some(status("Running")));
        assert_eq!(next.status("with-dir"), None, "not shown before it is set");
        assert_eq!(next.previous("no-dir"), None);
        // The re-read manifest is stamped anew; the first sighting wins.
        next.set(pod("with-dir", "t1"), status("Running"));
        let shown = next.pod("with-dir").expect("pod");
        assert_eq!(annotation(&shown, CONFIG_SEEN), Some("t0"));
        next.set(pod("with-dir", "t2"), status("Running"));
        assert_eq!(
            annotation(&next.pod("with-dir").expect("pod"), CONFIG_SEEN),
            Some("t0")
        );

        next.remove("with-dir");
        assert!(!dir.path().join("with-dir").join(STATUS_FILE).exists());
        assert_eq!(StatusStore::load(dir.path()).previous("with-dir"), None);
    }

    #[test]
    fn one_pod_is_found_by_namespace_and_name() {
        let store = StatusStore::default();
        let named = |uid: &str, namespace: Option<&str>, name: &str| {
            Arc::new(Pod {
                metadata: ObjectMeta {
                    uid: Some(uid.into()),
                    namespace: namespace.map(Into::into),
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                ..Pod::default()
            })
        };
        store.set(named("u1", Some("a"), "web"), status("Running"));
        store.set(named("u2", Some("b"), "web"), status("Pending"));
        store.set(named("u3", None, "db"), status("Failed"));
        let found = store.pod_named("b", "web").expect("b/web");
        assert_eq!(found.metadata.uid.as_deref(), Some("u2"));
        assert_eq!(found.status, Some(status("Pending")));
        assert_eq!(store.status_named("a", "web"), Some(status("Running")));
        // No namespace is `default`.
        assert_eq!(store.status_named("default", "db"), Some(status("Failed")));
        assert_eq!(store.status_named("a", "db"), None);
        assert!(store.pod_named("c", "web").is_none());
        store.remove("u1");
        assert_eq!(store.status_named("a", "web"), None);
    }

    #[test]
    fn a_torn_record_is_ignored() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("uid")).expect("pod dir");
        std::fs::write(dir.path().join("uid").join(STATUS_FILE), b"{\"status\":").expect("write");
        assert_eq!(StatusStore::load(dir.path()).previous("uid"), None);
    }
}

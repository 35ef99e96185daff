//! [`StatusStore`]: the latest API status of every pod this node runs or rejected — what
//! `ironlet pods` shows and what the API status manager (issue 4) will patch.
//!
//! Writers replace a pod's entry whole; readers get copies. Every change bumps a version
//! number that watchers can wait on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::watch;

use crate::config::pod_uid;

/// Pods and their computed statuses, by UID.
#[derive(Debug)]
pub struct StatusStore {
    entries: Mutex<HashMap<String, (Arc<Pod>, PodStatus)>>,
    version: watch::Sender<u64>,
}

impl Default for StatusStore {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            version: watch::channel(0).0,
        }
    }
}

impl StatusStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<Pod>, PodStatus)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the pod's status (and remembers the pod spec it belongs to).
    pub fn set(&self, pod: Arc<Pod>, status: PodStatus) {
        let uid = pod_uid(&pod).to_owned();
        let changed = {
            let mut entries = self.lock();
            let changed = entries.get(&uid).is_none_or(|(_, s)| *s != status);
            entries.insert(uid, (pod, status));
            changed
        };
        if changed {
            self.version.send_modify(|v| *v += 1);
        }
    }

    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        self.lock().get(uid).map(|(_, s)| s.clone())
    }

    pub fn remove(&self, uid: &str) {
        if self.lock().remove(uid).is_some() {
            self.version.send_modify(|v| *v += 1);
        }
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

    /// One pod with its status.
    pub fn pod(&self, uid: &str) -> Option<Pod> {
        self.lock().get(uid).map(|(pod, status)| {
            let mut pod = (**pod).clone();
            pod.status = Some(status.clone());
            pod
        })
    }

    /// Bumps on every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

//! Cgroup event sources of the PLEG: for each pod cgroup, an emptiness watcher and an OOM
//! watcher from the `cgroups` crate. An event makes the PLEG re-read the pod's status and
//! sync it — the safety net for what container exits alone do not tell (a process killed by
//! the OOM killer that was not a container's init, a pod whose last process vanished).

use std::collections::HashMap;
use std::sync::Arc;

use ironlet_cgroups::{CgroupPath, Hierarchy};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// What happened in a pod's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupEventKind {
    /// No process is left in the pod's cgroup.
    Empty,
    /// The OOM killer killed `kills` processes in it.
    Oom { kills: u64 },
}

/// A cgroup event of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupEvent {
    pub pod_uid: String,
    pub kind: CgroupEventKind,
}

/// Asks the PLEG to start or stop watching a pod's cgroup. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CgroupWatches {
    requests: mpsc::UnboundedSender<WatchRequest>,
}

#[derive(Debug)]
pub(super) enum WatchRequest {
    Watch { pod_uid: String, path: CgroupPath },
    Unwatch { pod_uid: String },
}

impl CgroupWatches {
    pub(super) fn new() -> (Self, mpsc::UnboundedReceiver<WatchRequest>) {
        let (requests, rx) = mpsc::unbounded_channel();
        (Self { requests }, rx)
    }

    /// Watches `path` for the pod (idempotent: a second call for the same path is a no-op).
    pub fn watch(&self, pod_uid: &str, path: &CgroupPath) {
        let _ = self.requests.send(WatchRequest::Watch {
            pod_uid: pod_uid.to_owned(),
            path: path.clone(),
        });
    }

    /// Stops watching the pod's cgroup.
    pub fn unwatch(&self, pod_uid: &str) {
        let _ = self.requests.send(WatchRequest::Unwatch {
            pod_uid: pod_uid.to_owned(),
        });
    }
}

/// The running watchers, by pod UID: the cgroup, the task, and how to tell it to rescan
/// the cgroup's children (a repeated watch request: the pod's sync may have created a
/// container cgroup since).
pub(super) struct Watchers {
    hierarchy: Option<Hierarchy>,
    events: mpsc::UnboundedSender<CgroupEvent>,
    tasks: HashMap<String, (CgroupPath, JoinHandle<()>, Arc<Notify>)>,
}

impl Watchers {
    pub(super) fn new(
        hierarchy: Option<Hierarchy>,
    ) -> (Self, mpsc::UnboundedReceiver<CgroupEvent>) {
        let (events, rx) = mpsc::unbounded_channel();
        let watchers = Self {
            hierarchy,
            events,
            tasks: HashMap::new(),
        };
        (watchers, rx)
    }

    pub(super) fn apply(&mut self, request: WatchRequest) {
        match request {
            WatchRequest::Watch { pod_uid, path } => {
                if let Some((_, _, rescan)) =
                    self.tasks.get(&pod_uid).filter(|(p, _, _)| *p == path)
                {
                    rescan.notify_one();
                    return;
                }
                let Some(hierarchy) = &self.hierarchy else {
                    return;
                };
                let rescan = Arc::new(Notify::new());
                let task = tokio::spawn(watch_pod(
                    hierarchy.clone(),
                    pod_uid.clone(),
                    path.clone(),
                    self.events.clone(),
                    rescan.clone(),
                ));
                if let Some((_, old, _)) = self.tasks.insert(pod_uid, (path, task, rescan)) {
                    old.abort();
                }
            }
            WatchRequest::Unwatch { pod_uid } => {
                if let Some((_, task, _)) = self.tasks.remove(&pod_uid) {
                    task.abort();
                }
            }
        }
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for (_, (_, task, _)) in self.tasks.drain() {
            task.abort();
        }
    }
}

async fn watch_pod(
    hierarchy: Hierarchy,
    pod_uid: String,
    path: CgroupPath,
    events: mpsc::UnboundedSender<CgroupEvent>,
    rescan: Arc<Notify>,
) {
    let (mut empty, mut oom) = match (hierarchy.watch_empty(&path), hierarchy.watch_oom(&path)) {
        (Ok(e), Ok(o)) => (e, o),
        (Err(err), _) | (_, Err(err)) => {
            tracing::warn!(%pod_uid, cgroup = %path, %err, "cannot watch the pod cgroup; exits still come from pidfds");
            return;
        }
    };
    // The first emptiness event may only report the state at watch time (a new pod cgroup
    // is empty until its first container starts): it costs one extra sync, never a miss.
    loop {
        let kind = tokio::select! {
            () = rescan.notified() => {
                // A container cgroup may be new: on v1 it needs its own OOM eventfd.
                if let Err(err) = oom.rescan() {
                    tracing::debug!(%pod_uid, %err, "rescanning the pod cgroup failed");
                }
                continue;
            }
            event = empty.next() => match event {
                Ok(Some(_)) => CgroupEventKind::Empty,
                Ok(None) => return,
                Err(err) => {
                    tracing::debug!(%pod_uid, %err, "pod cgroup emptiness watch ended");
                    return;
                }
            },
            event = oom.next() => match event {
                Ok(Some(e)) => CgroupEventKind::Oom { kills: e.new_kills },
                Ok(None) => return,
                Err(err) => {
                    tracing::debug!(%pod_uid, %err, "pod cgroup OOM watch ended");
                    return;
                }
            },
        };
        let event = CgroupEvent {
            pod_uid: pod_uid.clone(),
            kind,
        };
        if events.send(event).is_err() {
            return;
        }
    }
}

//! Pod events from the runtime's pod network: a rootless pod's pasta that ended and was
//! restarted ([`RuntimeEvent::PodNetworkRestarted`]) becomes a `Warning`
//! `PodNetworkRestarted` event on the pod (the log without an API server, `kubectl describe
//! pod` with one), so the user learns why its published ports stopped answering for a while.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ironlet_runtime::RuntimeEvent;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::broadcast;
use tokio::task::JoinSet;

use super::events::{reason, EventRecorder, EventType};
use crate::config::SourcesReady;
use crate::pod_manager::PodManager;

/// How long an event about a pod not (yet) known waits for the pod to be delivered: right
/// after an agent restart, the runtime reports on re-adopted pods before the pod sources
/// have handed them to the pod manager again.
const UNKNOWN_POD_GRACE: Duration = Duration::from_secs(10);

/// Records an event for each pod network restart the runtime reports, until the runtime's
/// event stream closes.
pub(super) async fn report_restarts(
    mut events: broadcast::Receiver<RuntimeEvent>,
    pods: Arc<Mutex<PodManager>>,
    sources: SourcesReady,
    recorder: Arc<dyn EventRecorder>,
) {
    // Events waiting for their pod; dropped (aborted) with this task.
    let mut waiting = JoinSet::new();
    loop {
        let (pod_uid, sandbox_id, message) = tokio::select! {
            event = events.recv() => match event {
                Ok(RuntimeEvent::PodNetworkRestarted {
                    pod_uid,
                    sandbox_id,
                    message,
                }) => (pod_uid, sandbox_id, message),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        missed,
                        "pod network events missed (see the log for pasta restarts)"
                    );
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            Some(_) = waiting.join_next(), if !waiting.is_empty() => continue,
        };
        if let Some(pod) = pod_by_uid(&pods, &pod_uid) {
            record(recorder.as_ref(), &pod, message);
            continue;
        }
        let (pods, sources, recorder) = (pods.clone(), sources.clone(), recorder.clone());
        waiting.spawn(async move {
            match wait_for_pod(&pods, &sources, &pod_uid).await {
                Some(pod) => record(recorder.as_ref(), &pod, message),
                None => tracing::warn!(%pod_uid, %sandbox_id, %message,
                    "the network of a pod no longer known was restarted"),
            }
        });
    }
}

fn pod_by_uid(pods: &Mutex<PodManager>, uid: &str) -> Option<Arc<Pod>> {
    pods.lock()
        .unwrap_or_else(|p| p.into_inner())
        .pod_by_uid(uid)
}

/// The pod once its sources delivered it, or `None` when it has not come within
/// [`UNKNOWN_POD_GRACE`] (it was deleted).
async fn wait_for_pod(
    pods: &Mutex<PodManager>,
    sources: &SourcesReady,
    uid: &str,
) -> Option<Arc<Pod>> {
    let deadline = tokio::time::Instant::now() + UNKNOWN_POD_GRACE;
    // Not ready yet: the sources have not delivered every pod since the agent started.
    let _ = tokio::time::timeout_at(deadline, sources.wait_all_ready()).await;
    // Ready, yet the sync loop may not have passed the pods to the pod manager.
    loop {
        if let Some(pod) = pod_by_uid(pods, uid) {
            return Some(pod);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn record(recorder: &dyn EventRecorder, pod: &Pod, message: String) {
    recorder.event(
        pod,
        EventType::Warning,
        reason::POD_NETWORK_RESTARTED,
        message,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PodConfig, PodConfigOptions};

    #[derive(Default)]
    struct Recorded(Mutex<Vec<(String, &'static str, String)>>);

    impl EventRecorder for Recorded {
        fn event(&self, pod: &Pod, _: EventType, reason: &'static str, message: String) {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((uid, reason, message));
        }
    }

    fn pod(uid: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("web".into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some(uid.into());
        pod
    }

    fn restarted(uid: &str) -> RuntimeEvent {
        RuntimeEvent::PodNetworkRestarted {
            pod_uid: uid.into(),
            sandbox_id: ironlet_runtime::types::ContainerId::random(),
            message: format!("pasta of {uid} restarted"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_for_a_pod_delivered_after_it_is_recorded_on_the_pod() {
        let (config, _updates) = PodConfig::new(&PodConfigOptions::default());
        let pods = Arc::new(Mutex::new(PodManager::new()));
        let recorded = Arc::new(Recorded::default());
        let (tx, rx) = broadcast::channel(8);
        let task = tokio::spawn(report_restarts(
            rx,
            pods.clone(),
            config.sources_ready(),
            recorded.clone(),
        ));
        // Known at once; then one reported before its pod comes back (an agent restart);
        // then one of a pod that never comes (deleted meanwhile).
        pods.lock()
            .unwrap_or_else(|p| p.into_inner())
            .add_pod(pod("a"));
        tx.send(restarted("a")).ok();
        tx.send(restarted("b")).ok();
        tx.send(restarted("gone")).ok();
        tokio::time::sleep(Duration::from_secs(2)).await;
        pods.lock()
            .unwrap_or_else(|p| p.into_inner())
            .add_pod(pod("b"));
        tokio::time::sleep(UNKNOWN_POD_GRACE + Duration::from_secs(1)).await;
        drop(tx);
        task.await.ok();
        let recorded = recorded.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(
            recorded,
            vec![
                (
                    "a".into(),
                    reason::POD_NETWORK_RESTARTED,
                    "pasta of a restarted".into()
                ),
                (
                    "b".into(),
                    reason::POD_NETWORK_RESTARTED,
                    "pasta of b restarted".into()
                ),
            ]
        );
    }
}

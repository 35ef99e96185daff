//! Pod events from the runtime's pod network: a rootless pod's pasta that ended and was
//! restarted ([`RuntimeEvent::PodNetworkRestarted`]) becomes a `Warning`
//! `PodNetworkRestarted` event on the pod (the log without an API server, `kubectl describe
//! pod` with one), so the user learns why its published ports stopped answering for a while.

use std::sync::{Arc, Mutex};

use ironlet_runtime::RuntimeEvent;
use tokio::sync::broadcast;

use super::events::{reason, EventRecorder, EventType};
use crate::pod_manager::PodManager;

/// Records an event for each pod network restart the runtime reports, until the runtime's
/// event stream closes.
pub(super) async fn report_restarts(
    mut events: broadcast::Receiver<RuntimeEvent>,
    pods: Arc<Mutex<PodManager>>,
    recorder: Arc<dyn EventRecorder>,
) {
    loop {
        let (pod_uid, sandbox_id, message) = match events.recv().await {
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
        };
        let pod = pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pod_by_uid(&pod_uid);
        match pod {
            Some(pod) => recorder.event(
                &pod,
                EventType::Warning,
                reason::POD_NETWORK_RESTARTED,
                message,
            ),
            None => tracing::warn!(%pod_uid, %sandbox_id, %message,
                "the network of a pod no longer known was restarted"),
        }
    }
}

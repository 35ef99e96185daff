//! What the local server shows of the agent: pods with their statuses from the
//! [`StatusStore`], and health from the PLEG (kubelet's `/healthz` fails when the PLEG has
//! not relisted within its threshold).

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use super::status_store::StatusStore;
use crate::pleg::{PlegConfig, PlegHealth};
use crate::server::PodsView;

/// The agent's [`PodsView`].
pub struct KubeletView {
    pub(super) statuses: Arc<StatusStore>,
    pub(super) pleg: Arc<PlegHealth>,
    pub(super) pleg_config: PlegConfig,
    pub(super) started: Instant,
}

impl PodsView for KubeletView {
    fn pods(&self) -> Vec<Pod> {
        self.statuses.pods()
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.statuses.pod_named(namespace, name)
    }

    fn pod_status(&self, namespace: &str, name: &str) -> Option<PodStatus> {
        self.statuses.status_named(namespace, name)
    }

    fn health(&self) -> Result<(), String> {
        let threshold = self.pleg_config.relist_threshold + self.pleg_config.relist_period;
        let last = self
            .pleg
            .last_relist()
            .map(|(at, _)| at)
            .unwrap_or(self.started);
        let since = last.elapsed();
        if since > threshold {
            return Err(format!(
                "PLEG is not healthy: pleg was last seen active {since:?} ago; threshold is {:?}",
                self.pleg_config.relist_threshold
            ));
        }
        Ok(())
    }
}

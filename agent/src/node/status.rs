//! When and what to report in `nodes/<name>/status`.
//!
//! Every `node_status_update_frequency` the controller reads a [`Snapshot`] (everything we
//! report, without times). [`StatusReporter::due`] says whether to patch: when the snapshot
//! differs from the last one reported, when `node_status_report_frequency` has passed since
//! then, or when nothing was reported yet (or the last patch failed). The patch
//! ([`status_patch`]) is a strategic-merge patch in which `conditions` hold only our types
//! (merged by `type`, so others' conditions stay) and `addresses` carry `$patch: replace`
//! (merging them by `type` would keep addresses we no longer have).

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, NodeAddress, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use tokio::time::{Duration, Instant};

use super::conditions::{conditions, Condition, Transitions};
use super::provider::{NodeResources, NodeStatusProvider, ProviderError};

/// Everything the status reports, without times.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    pub resources: NodeResources,
    pub addresses: Vec<NodeAddress>,
    pub system_info: NodeSystemInfo,
    pub conditions: Vec<Condition>,
    pub kubelet_port: Option<u16>,
    pub images: Option<Vec<ContainerImage>>,
}

impl Snapshot {
    /// Asks the provider for the current values.
    pub fn read(provider: &dyn NodeStatusProvider) -> Result<Self, ProviderError> {
        Ok(Self {
            resources: provider.resources()?,
            addresses: provider.addresses(),
            system_info: provider.system_info(),
            conditions: conditions(provider.pressure(), &provider.readiness()),
            kubelet_port: provider.kubelet_port(),
            images: provider.images(),
        })
    }
}

/// What the apiserver last accepted from us.
#[derive(Debug, Clone)]
enum Reported {
    /// Nothing yet, or the last attempt failed: the next tick patches.
    Never,
    /// `snapshot` was accepted at `at`.
    At {
        snapshot: Box<Snapshot>,
        at: Instant,
    },
}

/// Decides when to patch and stamps condition times.
#[derive(Debug)]
pub(crate) struct StatusReporter {
    reported: Reported,
    transitions: Transitions,
    report_frequency: Duration,
}

/// `status.declaredFeatures` of a node serving the kubelet API, sorted as kubelet sorts
/// them. `ExtendWebSocketsToKubelet`: the API server proxies `kubectl exec`'s WebSocket
/// (`v5.channel.k8s.io`) to the node as it is, rather than translating it to SPDY, which
/// the node does not serve (`pkg/registry/core/pod/rest/subresources.go`).
pub const DECLARED_FEATURES: &[&str] = &["ExtendWebSocketsToKubelet"];

impl StatusReporter {
    /// A reporter that has reported nothing, continuing `transitions`.
    pub fn new(transitions: Transitions, report_frequency: Duration) -> Self {
        Self {
            reported: Reported::Never,
            transitions,
            report_frequency,
        }
    }

    /// Whether `snapshot`, read at `now`, must be patched.
    pub fn due(&self, snapshot: &Snapshot, now: Instant) -> bool {
        match &self.reported {
            Reported::Never => true,
            Reported::At { snapshot: last, at } => {
                **last != *snapshot || now.saturating_duration_since(*at) >= self.report_frequency
            }
        }
    }

    /// The full status for `snapshot` with conditions stamped at `wall` (heartbeat), keeping
    /// transition times of unchanged conditions.
    pub fn status(&mut self, snapshot: &Snapshot, wall: Timestamp) -> NodeStatus {
        NodeStatus {
            capacity: Some(snapshot.resources.capacity.clone()),
            allocatable: Some(snapshot.resources.allocatable.clone()),
            addresses: Some(snapshot.addresses.clone()),
            node_info: Some(snapshot.system_info.clone()),
            conditions: Some(self.transitions.stamp(&snapshot.conditions, wall)),
            daemon_endpoints: snapshot.kubelet_port.map(|port| NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(port),
                }),
            }),
            declared_features: snapshot
                .kubelet_port
                .map(|_| DECLARED_FEATURES.iter().map(|f| (*f).to_owned()).collect()),
            images: snapshot.images.clone(),
            ..NodeStatus::default()
        }
    }

    /// Only conditions, e.g. Ready=False at shutdown.
    pub fn conditions_only(&mut self, conditions: &[Condition], wall: Timestamp) -> NodeStatus {
        NodeStatus {
            conditions: Some(self.transitions.stamp(conditions, wall)),
            ..NodeStatus::default()
        }
    }

    /// The apiserver accepted `snapshot` at `at`.
    pub fn accepted(&mut self, snapshot: Snapshot, at: Instant) {
        self.reported = Reported::At {
            snapshot: Box::new(snapshot),
            at,
        };
    }

    /// The last patch failed: report again at the next tick whatever the snapshot.
    pub fn failed(&mut self) {
        self.reported = Reported::Never;
    }
}

/// The strategic-merge patch of `nodes/<name>/status` for `status`.
pub(crate) fn status_patch(status: &NodeStatus) -> Value {
    let mut status = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Some(Value::Array(addresses)) = status.get_mut("addresses") {
        addresses.push(json!({ "$patch": "replace" }));
    }
    json!({ "status": status })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::conditions::{shutting_down, READY};
    use crate::node::provider::{Pressure, Readiness};

    fn snapshot(ready: bool) -> Snapshot {
        let readiness = if ready {
            Readiness::Ready
        } else {
            Readiness::NotReady(vec!["runtime down".into()])
        };
        Snapshot {
            resources: NodeResources::default(),
            addresses: vec![NodeAddress {
                type_: "Hostname".into(),
                address: "n1".into(),
            }],
            system_info: NodeSystemInfo::default(),
            conditions: conditions(Pressure::default(), &readiness),
            kubelet_port: Some(10250),
            images: None,
        }
    }

    #[test]
    fn the_status_reports_the_kubelet_port() {
        let status = reporter().status(&snapshot(true), Timestamp::UNIX_EPOCH);
        let port = status
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port);
        assert_eq!(port, Some(10250));
    }

    #[test]
    fn a_node_serving_the_kubelet_api_declares_websockets_to_the_kubelet() {
        let status = reporter().status(&snapshot(true), Timestamp::UNIX_EPOCH);
        assert_eq!(
            status.declared_features,
            Some(vec!["ExtendWebSocketsToKubelet".to_owned()])
        );
        let mut without_api = snapshot(true);
        without_api.kubelet_port = None;
        let status = reporter().status(&without_api, Timestamp::UNIX_EPOCH);
        assert_eq!(status.declared_features, None);
    }

    fn reporter() -> StatusReporter {
        StatusReporter::new(Transitions::default(), Duration::from_secs(300))
    }

    #[test]
    fn images_are_reported_and_a_new_image_makes_the_status_due() {
        let mut with_image = snapshot(true);
        with_image.images = Some(vec![ContainerImage {
            names: Some(vec!["reg/app@sha256:ab".into(), "reg/app:1".into()]),
            size_bytes: Some(42),
        }]);
        let status = reporter().status(&with_image, Timestamp::UNIX_EPOCH);
        assert_eq!(status.images, with_image.images);
        let patch = status_patch(&status);
        assert_eq!(patch["status"]["images"][0]["sizeBytes"], 42);
        let mut reporter = reporter();
        let start = Instant::now();
        reporter.accepted(snapshot(true), start);
        assert!(reporter.due(&with_image, start + Duration::from_secs(10)));
    }

    #[test]
    fn the_first_status_is_always_due() {
        assert!(reporter().due(&snapshot(true), Instant::now()));
    }

    #[test]
    fn an_unchanged_status_waits_for_the_report_frequency() {
        let mut reporter = reporter();
        let start = Instant::now();
        reporter.accepted(snapshot(true), start);
        assert!(!reporter.due(&snapshot(true), start + Duration::from_secs(10)));
        assert!(!reporter.due(&snapshot(true), start + Duration::from_secs(299)));
        assert!(reporter.due(&snapshot(true), start + Duration::from_secs(300)));
    }

    #[test]
    fn a_changed_status_is_due_at_once() {
        let mut reporter = reporter();
        let start = Instant::now();
        reporter.accepted(snapshot(true), start);
        assert!(reporter.due(&snapshot(false), start + Duration::from_secs(10)));
    }

    #[test]
    fn a_failed_patch_is_retried_at_the_next_tick() {
        let mut reporter = reporter();
        let start = Instant::now();
        reporter.accepted(snapshot(true), start);
        reporter.failed();
        assert!(reporter.due(&snapshot(true), start + Duration::from_secs(10)));
    }

    #[test]
    fn the_patch_replaces_addresses_and_carries_only_our_conditions() {
        let status = reporter().status(&snapshot(true), Timestamp::UNIX_EPOCH);
        let patch = status_patch(&status);
        let addresses = patch["status"]["addresses"].as_array().unwrap();
        assert_eq!(addresses.last().unwrap(), &json!({ "$patch": "replace" }));
        let types: Vec<_> = patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, crate::node::OUR_CONDITION_TYPES);
    }

    #[test]
    fn the_shutdown_patch_holds_only_ready_false() {
        let status = reporter().conditions_only(&[shutting_down()], Timestamp::UNIX_EPOCH);
        let patch = status_patch(&status);
        assert_eq!(
            patch["status"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["conditions"]
        );
        assert_eq!(patch["status"]["conditions"][0]["type"], READY);
        assert_eq!(patch["status"]["conditions"][0]["status"], "False");
        assert_eq!(
            patch["status"]["conditions"][0]["message"],
            "ironlet is shutting down"
        );
    }
}

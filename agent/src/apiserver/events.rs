//! [`ApiRecorder`]: pod events written to the API (`v1.Event`, source component `kubelet`,
//! host = the node), rate-limited.
//!
//! Guarantees: recording never blocks the caller (a bounded queue; events beyond it are
//! dropped with a log line); at most [`BURST`] events go out at once and then [`PER_SECOND`]
//! per second (kubelet's `eventRecordQPS`/`eventBurst` spirit); an identical event (same pod,
//! reason and message) within [`DEDUPE_WINDOW`] is not written again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::mpsc;

use crate::config::{pod_full_name, pod_uid};
use crate::kubelet::events::{EventRecorder, EventType};

/// Events sent without waiting.
pub const BURST: u32 = 25;
/// Sustained events per second.
pub const PER_SECOND: u32 = 5;
/// How long an identical event is suppressed.
pub const DEDUPE_WINDOW: Duration = Duration::from_secs(60);
const QUEUE: usize = 1000;

/// Records pod events through the API.
#[derive(Debug, Clone)]
pub struct ApiRecorder {
    tx: mpsc::Sender<Event>,
    node_name: String,
}

impl ApiRecorder {
    /// Starts the writer task on the current tokio runtime.
    pub fn start(client: Client, node_name: String) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write_events(client, rx));
        Self { tx, node_name }
    }
}

impl EventRecorder for ApiRecorder {
    fn event(&self, pod: &Pod, kind: EventType, reason: &'static str, message: String) {
        crate::kubelet::events::TracingRecorder.event(pod, kind, reason, message.clone());
        let event = pod_event(pod, kind, reason, message, &self.node_name);
        if self.tx.try_send(event).is_err() {
            tracing::warn!(pod = %pod_full_name(pod), reason, "event queue full; event dropped");
        }
    }

    fn node_event(&self, node: &str, kind: EventType, reason: &'static str, message: String) {
        crate::kubelet::events::TracingRecorder.node_event(node, kind, reason, message.clone());
        let event = node_event(node, kind, reason, message);
        if self.tx.try_send(event).is_err() {
            tracing::warn!(node, reason, "event queue full; event dropped");
        }
    }
}

/// A `v1.Event` about the Node `node`, as kubelet writes it (namespace `default`, the node's
/// name as its UID, kubelet's `nodeRef`).
pub fn node_event(node: &str, kind: EventType, reason: &str, message: String) -> Event {
    let mut event = pod_event(&Pod::default(), kind, reason, message, node);
    let now = k8s_openapi::jiff::Timestamp::now();
    event.metadata.name = Some(format!("{node}.{:x}", now.as_nanosecond()));
    event.metadata.namespace = Some("default".into());
    event.involved_object = ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        uid: Some(node.to_owned()),
        ..ObjectReference::default()
    };
    event
}

/// A `v1.Event` about `pod`, as kubelet writes it.
pub fn pod_event(
    pod: &Pod,
    kind: EventType,
    reason: &str,
    message: String,
    node_name: &str,
) -> Event {
    let now = k8s_openapi::jiff::Timestamp::now();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name),
            namespace: Some(namespace),
            uid: Some(pod_uid(pod).to_owned()),
            resource_version: pod.metadata.resource_version.clone(),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_owned()),
        message: Some(message),
        type_: Some(kind.as_str().to_owned()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node_name.to_owned()),
        }),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node_name.to_owned()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: None::<MicroTime>,
        count: Some(1),
        ..Event::default()
    }
}

/// A token bucket plus duplicate suppression.
#[derive(Debug)]
struct Limiter {
    tokens: f64,
    last: Instant,
    seen: HashMap<(String, String, String), Instant>,
}

impl Limiter {
    fn new(now: Instant) -> Self {
        Self {
            tokens: f64::from(BURST),
            last: now,
            seen: HashMap::new(),
        }
    }

    /// Whether `event` may go out at `now`; `Err(wait)` when the bucket is empty.
    fn admit(&mut self, event: &Event, now: Instant) -> Result<bool, Duration> {
        let refill = now.duration_since(self.last).as_secs_f64() * f64::from(PER_SECOND);
        self.tokens = (self.tokens + refill).min(f64::from(BURST));
        self.last = now;
        self.seen
            .retain(|_, at| now.duration_since(*at) < DEDUPE_WINDOW);
        let key = (
            event.involved_object.uid.clone().unwrap_or_default(),
            event.reason.clone().unwrap_or_default(),
            event.message.clone().unwrap_or_default(),
        );
        if self.seen.contains_key(&key) {
            return Ok(false);
        }
        if self.tokens < 1.0 {
            let missing = (1.0 - self.tokens) / f64::from(PER_SECOND);
            return Err(Duration::from_secs_f64(missing));
        }
        self.tokens -= 1.0;
        self.seen.insert(key, now);
        Ok(true)
    }
}

async fn write_events(client: Client, mut rx: mpsc::Receiver<Event>) {
    let mut limiter = Limiter::new(Instant::now());
    while let Some(event) = rx.recv().await {
        let admitted = loop {
            match limiter.admit(&event, Instant::now()) {
                Ok(admitted) => break admitted,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        };
        if !admitted {
            continue;
        }
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        if let Err(err) = api.create(&PostParams::default(), &event).await {
            tracing::debug!(%err, reason = ?event.reason, "writing event failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(message: &str) -> Event {
        pod_event(
            &Pod::default(),
            EventType::Normal,
            "Started",
            message.into(),
            "n1",
        )
    }

    #[test]
    fn events_name_the_kubelet_and_the_node_as_their_source() {
        let e = event("hi");
        let source = e.source.unwrap_or_default();
        assert_eq!(source.component.as_deref(), Some("kubelet"));
        assert_eq!(source.host.as_deref(), Some("n1"));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Pod"));
    }

    #[test]
    fn the_limiter_passes_a_burst_then_makes_callers_wait() {
        let now = Instant::now();
        let mut limiter = Limiter::new(now);
        for i in 0..BURST {
            assert_eq!(limiter.admit(&event(&i.to_string()), now), Ok(true));
        }
        assert!(limiter.admit(&event("one more"), now).is_err());
        let later = now + Duration::from_secs(1);
        assert_eq!(limiter.admit(&event("one more"), later), Ok(true));
    }

    #[test]
    fn identical_events_are_written_once() {
        let now = Instant::now();
        let mut limiter = Limiter::new(now);
        assert_eq!(limiter.admit(&event("same"), now), Ok(true));
        assert_eq!(limiter.admit(&event("same"), now), Ok(false));
    }
}

//! The pod lifecycle event generator: turns runtime events into per-pod sync triggers and
//! keeps the [`PodCache`] fresh.
//!
//! ```text
//!  runtime exits (pidfd reaps) ──► refresh cache(uid) ──► ContainerDied ──┐
//!  pod cgroup empty / OOM kill ──► refresh cache(uid) ──► PodSync ────────┤
//!  relist every `relist_period` ─► diff container states ─► refresh ──────┼─► sync loop
//!                                   (Started / Died / Removed)            │   (one pod sync
//!                                                                         ┘    per event)
//! ```
//!
//! The event path is the fast one: an exit reaches the cache a few microseconds after the
//! zygote's pidfd fires, and the event is sent only after the cache holds a status read
//! after the exit, so the worker it wakes never sees the container still running. The relist
//! (kubelet's GenericPLEG, here slow: default 60 s) is the safety net for anything the events
//! missed, e.g. a lagging broadcast receiver.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ironlet_runtime::types::{ContainerFilter, ContainerId, ContainerState};
use ironlet_runtime::{Runtime, RuntimeEvent};
use tokio::sync::{broadcast, mpsc};

use crate::pod_cache::PodCache;

mod cgroup_events;

pub use cgroup_events::{CgroupEvent, CgroupEventKind, CgroupWatches};
use cgroup_events::{WatchRequest, Watchers};

/// What changed in a pod (kubelet's `PodLifeCycleEventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodLifecycleEventType {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    /// A change not captured by one container event (e.g. after a lagging receiver).
    PodSync,
}

/// One event for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    pub pod_uid: String,
    pub kind: PodLifecycleEventType,
    pub container_id: Option<ContainerId>,
    /// When the runtime observed the change (exits only).
    pub observed_at: Option<Instant>,
    /// When the cache was updated for it.
    pub cached_at: Instant,
}

/// PLEG settings.
#[derive(Debug, Clone, Copy)]
pub struct PlegConfig {
    /// Period of the safety relist. kubelet's GenericPLEG relists every 1 s; with events as
    /// the primary path ironlet relists rarely (Evented PLEG's relist period is 300 s).
    pub relist_period: Duration,
    /// A relist older than this makes the PLEG unhealthy (kubelet's `relistThreshold`, 3 min).
    pub relist_threshold: Duration,
}

impl Default for PlegConfig {
    fn default() -> Self {
        Self {
            relist_period: Duration::from_secs(60),
            relist_threshold: Duration::from_secs(180),
        }
    }
}

/// Health of the PLEG: when it last completed a relist and how long that took.
#[derive(Debug, Default)]
pub struct PlegHealth {
    inner: Mutex<Option<(Instant, Duration)>>,
}

impl PlegHealth {
    fn record(&self, at: Instant, took: Duration) {
        if let Ok(mut guard) = self.inner.lock() {
            *guard = Some((at, took));
        }
    }

    /// The last relist's start and duration.
    pub fn last_relist(&self) -> Option<(Instant, Duration)> {
        self.inner.lock().ok().and_then(|g| *g)
    }
}

/// What [`start`] hands back.
pub struct PlegHandles {
    /// Events for the sync loop.
    pub events: mpsc::UnboundedReceiver<PodLifecycleEvent>,
    pub health: Arc<PlegHealth>,
    /// Registers pod cgroups for emptiness and OOM events.
    pub watches: CgroupWatches,
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts the PLEG task. `hierarchy` enables the cgroup event sources.
pub fn start(
    runtime: Arc<dyn Runtime>,
    cache: Arc<PodCache>,
    config: PlegConfig,
    hierarchy: Option<ironlet_cgroups::Hierarchy>,
) -> PlegHandles {
    let (tx, events) = mpsc::unbounded_channel();
    let health = Arc::new(PlegHealth::default());
    let runtime_events = runtime.subscribe();
    let (watches, requests) = CgroupWatches::new();
    let (watchers, cgroup_events) = Watchers::new(hierarchy);
    let pleg = Pleg {
        runtime,
        cache,
        tx,
        health: health.clone(),
        last_states: HashMap::new(),
        watchers,
    };
    let task = tokio::spawn(pleg.run(runtime_events, requests, cgroup_events, config));
    PlegHandles {
        events,
        health,
        watches,
        task,
    }
}

struct Pleg {
    runtime: Arc<dyn Runtime>,
    cache: Arc<PodCache>,
    tx: mpsc::UnboundedSender<PodLifecycleEvent>,
    health: Arc<PlegHealth>,
    /// Container states at the last relist, by container id.
    last_states: HashMap<ContainerId, (String, ContainerState)>,
    watchers: Watchers,
}

impl Pleg {
    async fn run(
        mut self,
        mut events: broadcast::Receiver<RuntimeEvent>,
        mut requests: mpsc::UnboundedReceiver<WatchRequest>,
        mut cgroup_events: mpsc::UnboundedReceiver<CgroupEvent>,
        config: PlegConfig,
    ) {
        let mut relist = tokio::time::interval(config.relist_period);
        relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Ok(event) => self.on_runtime_event(event).await,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "PLEG missed runtime events; relisting");
                        self.relist().await;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = relist.tick() => self.relist().await,
                Some(request) = requests.recv() => self.watchers.apply(request),
                Some(event) = cgroup_events.recv() => self.on_cgroup_event(event).await,
            }
            if self.tx.is_closed() {
                return;
            }
        }
    }

    async fn on_runtime_event(&mut self, event: RuntimeEvent) {
        let (pod_uid, id, observed_at) = match event {
            RuntimeEvent::ContainerExited {
                id,
                pod_uid,
                observed_at,
                ..
            } => (pod_uid, id, Some(observed_at)),
            RuntimeEvent::ContainerOom { id, pod_uid } => (pod_uid, id, None),
            // No container changed: the kubelet reports it as the pod's event.
            RuntimeEvent::PodNetworkRestarted { .. } => return,
        };
        if let Err(err) = self.cache.refresh(&pod_uid).await {
            tracing::warn!(%pod_uid, %err, "reading pod status after a container exit failed");
        }
        self.last_states
            .insert(id.clone(), (pod_uid.clone(), ContainerState::Exited));
        self.send(PodLifecycleEvent {
            pod_uid,
            kind: PodLifecycleEventType::ContainerDied,
            container_id: Some(id),
            observed_at,
            cached_at: Instant::now(),
        });
    }

    async fn on_cgroup_event(&mut self, event: CgroupEvent) {
        tracing::debug!(pod_uid = %event.pod_uid, kind = ?event.kind, "pod cgroup event");
        if let Err(err) = self.cache.refresh(&event.pod_uid).await {
            tracing::warn!(pod_uid = %event.pod_uid, %err, "reading pod status after a cgroup event failed");
        }
        self.send(PodLifecycleEvent {
            pod_uid: event.pod_uid,
            kind: PodLifecycleEventType::PodSync,
            container_id: None,
            observed_at: None,
            cached_at: Instant::now(),
        });
    }

    fn send(&self, event: PodLifecycleEvent) {
        // A closed receiver means the agent is stopping; `run` notices and returns.
        let _ = self.tx.send(event);
    }

    /// Lists every container, emits an event per change since the last relist and
    /// refreshes the cache of every pod that changed.
    async fn relist(&mut self) {
        let started = Instant::now();
        let all = ContainerFilter::default();
        let listed = tokio::try_join!(
            self.runtime.list_pod_sandboxes(),
            self.runtime.list_containers(&all)
        );
        let (sandboxes, containers) = match listed {
            Ok(listed) => listed,
            Err(err) => {
                tracing::warn!(%err, "PLEG relist failed");
                return;
            }
        };
        let pod_of: HashMap<_, _> = sandboxes
            .into_iter()
            .map(|s| (s.id, s.config.pod_uid))
            .collect();
        let mut now: HashMap<ContainerId, (String, ContainerState)> = HashMap::new();
        for c in containers {
            let uid = pod_of.get(&c.sandbox_id).cloned().unwrap_or_default();
            now.insert(c.id, (uid, c.state));
        }
        let mut changes: BTreeMap<String, Vec<(ContainerId, PodLifecycleEventType)>> =
            BTreeMap::new();
        for (id, (uid, state)) in &now {
            let before = self.last_states.get(id).map(|(_, s)| *s);
            let kind = match (before, state) {
                (b, ContainerState::Running) if b != Some(ContainerState::Running) => {
                    Some(PodLifecycleEventType::ContainerStarted)
                }
                (b, ContainerState::Exited) if b != Some(ContainerState::Exited) => {
                    Some(PodLifecycleEventType::ContainerDied)
                }
                _ => None,
            };
            if let Some(kind) = kind {
                changes
                    .entry(uid.clone())
                    .or_default()
                    .push((id.clone(), kind));
            }
        }
        for (id, (uid, _)) in &self.last_states {
            if !now.contains_key(id) {
                changes
                    .entry(uid.clone())
                    .or_default()
                    .push((id.clone(), PodLifecycleEventType::ContainerRemoved));
            }
        }
        self.last_states = now;
        for (uid, events) in changes {
            if uid.is_empty() {
                continue;
            }
            if let Err(err) = self.cache.refresh(&uid).await {
                tracing::warn!(pod_uid = %uid, %err, "reading pod status during relist failed");
            }
            let cached_at = Instant::now();
            for (id, kind) in events {
                self.send(PodLifecycleEvent {
                    pod_uid: uid.clone(),
                    kind,
                    container_id: Some(id),
                    observed_at: None,
                    cached_at,
                });
            }
        }
        self.health.record(started, started.elapsed());
    }
}

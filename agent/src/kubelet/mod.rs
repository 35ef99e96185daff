//! The node agent proper: wires pod sources, the pod manager, admission, pod workers, the
//! PLEG and probes together and runs kubelet's sync loop.
//!
//! ```text
//!  PodConfig ──ADD/UPDATE/REMOVE──┐   (file, URL and — with a client — API pods)
//!  PLEG events ───────────────────┤   sync loop (select!)  ──► PodWorkers ──► NodeSyncer
//!  probe results ─────────────────┤   admission on ADD         (one task per UID)
//!  housekeeping tick (2 s) ───────┘   orphans, GC, known pods
//! ```
//!
//! Where to start: [`Kubelet::start`] builds everything from a [`KubeletConfig`] and a
//! runtime ([`Kubelet::start_with_api`] also joins a cluster: see [`crate::apiserver`]);
//! [`Kubelet::run`] is the loop and returns when the shutdown future completes.

pub mod active_deadline;
pub mod config;
pub mod container_config;
pub mod container_gc;
pub mod dns;
pub mod etc_files;
pub mod events;
pub mod eviction;
mod housekeeping;
pub mod image_gc;
mod network_events;
pub mod node_shutdown;
pub mod security;
pub mod stats;
pub mod status_store;
pub mod syncer;
mod view;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ironlet_cgroups::{Hierarchy, NodeCapacity, NodeCgroups};
use ironlet_runtime::{ImageService, Runtime};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use crate::admission::{NodeAllocatable, NodeInfo};
use crate::config::{
    is_mirror_pod, pod_full_name, pod_uid, FileSource, FileSourceConfig, HttpSource,
    HttpSourceConfig, PodConfig, PodConfigOptions, PodOp, PodUpdate,
};
use crate::pleg::{PlegConfig, PlegHealth, PodLifecycleEvent};
use crate::pod_cache::PodCache;
use crate::pod_manager::PodManager;
use crate::pod_workers::{PodWorkers, PodWorkersConfig, UpdatePodOptions, UpdateType};
use crate::server::{Metrics, PodsView};
pub use config::KubeletConfig;

/// The namespace of the pseudo pods `ironlet ctr run` makes; the agent leaves their
/// sandboxes' files alone.
pub const CTR_NAMESPACE: &str = "ironlet-ctr";
use events::{EventRecorder, TracingRecorder};
use status_store::StatusStore;
use syncer::{NodeResources, NodeSyncer};

/// kubelet's first crash-loop back-off.
const INITIAL_RESTART_BACKOFF: Duration = Duration::from_secs(10);

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("creating the node cgroup tree {root:?}")]
    Cgroups {
        root: String,
        #[source]
        source: ironlet_cgroups::Error,
    },
    #[error("creating {path}")]
    CreateDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the manifest URL source")]
    HttpSource(#[source] crate::config::HttpSourceError),
    #[error(transparent)]
    DuplicateSource(#[from] crate::config::DuplicateSource),
}

/// A running node agent.
pub struct Kubelet {
    config: KubeletConfig,
    runtime: Arc<dyn Runtime>,
    pod_manager: Arc<Mutex<PodManager>>,
    workers: PodWorkers,
    syncer: Arc<NodeSyncer>,
    statuses: Arc<StatusStore>,
    node: NodeInfo,
    pod_config: PodConfig,
    updates: mpsc::Receiver<PodUpdate>,
    pleg_events: mpsc::UnboundedReceiver<PodLifecycleEvent>,
    pleg_health: Arc<PlegHealth>,
    pleg_config: PlegConfig,
    metrics: Arc<Metrics>,
    started: std::time::Instant,
    probe_updates: mpsc::UnboundedReceiver<crate::probes::ProbeUpdate>,
    /// Pods admission rejected, by UID (kept out of the workers).
    rejected: HashMap<String, Arc<Pod>>,
    /// Requests to the API status manager; `None` without an API server.
    api_commands: Option<mpsc::UnboundedSender<crate::apiserver::ApiCommand>>,
    /// Watches of the ConfigMaps and Secrets API pods reference; `None` without an API server.
    object_watches: Option<Arc<crate::apiserver::ObjectWatches>>,
    /// UIDs of pods whose watched ConfigMaps/Secrets changed (to resync now).
    object_changes: mpsc::UnboundedReceiver<Vec<String>>,
    /// Image garbage collection and the node's image list; node-level disk reclaim of the
    /// eviction manager removes unused images through it.
    image_gc: Arc<image_gc::ImageGc>,
    /// The node's pressure conditions, as the eviction manager decides them.
    pressure: tokio::sync::watch::Sender<crate::node::Pressure>,
    /// Node-level disk reclaim asked by the eviction manager.
    reclaim_requests: mpsc::Receiver<eviction::pressure::ReclaimRequest>,
    reclaim_sender: mpsc::Sender<eviction::pressure::ReclaimRequest>,
    /// Graceful node shutdown: its events, state and the pods' kill task.
    node_shutdown: node_shutdown::ShutdownManager,
    /// The runtime's events, subscribed at start, for the pod network restarts
    /// ([`network_events`]); taken by [`Kubelet::run`].
    network_events: Option<tokio::sync::broadcast::Receiver<ironlet_runtime::RuntimeEvent>>,
}

impl Kubelet {
    /// Builds the agent: cgroup tree, caches, workers, PLEG, probes and pod sources.
    pub async fn start(
        config: KubeletConfig,
        runtime: Arc<dyn Runtime>,
        images: Arc<dyn ImageService>,
    ) -> Result<Self, StartError> {
        Self::start_with_api(config, runtime, images, None).await
    }

    /// [`start`](Self::start), plus — with a client — the API pod source, the status
    /// manager, mirror pods, API events and ConfigMaps/Secrets from the API.
    pub async fn start_with_api(
        config: KubeletConfig,
        runtime: Arc<dyn Runtime>,
        images: Arc<dyn ImageService>,
        api: Option<kube::Client>,
    ) -> Result<Self, StartError> {
        // Other users get nothing from the root (0700); the pods directory has kubelet's
        // 0750. Older installs are narrowed.
        let pods_dir = config.pods_dir();
        ironlet_runtime::fsutil::private_dir(&config.root_dir)
            .and_then(|()| ironlet_runtime::fsutil::narrowed_dir(&pods_dir, 0o750))
            .map_err(|source| StartError::CreateDir {
                path: config.root_dir.clone(),
                source,
            })?;
        let (cgroups, capacity) = node_cgroups(&config)?;
        let allocatable = NodeAllocatable {
            cpu_milli: capacity.cpu_milli.saturating_sub(config.reserved_cpu_milli),
            memory_bytes: capacity
                .memory_bytes
                .saturating_sub(config.reserved_memory_bytes),
            pods: config.max_pods,
        };
        let mut labels = config.node_labels.clone();
        labels.insert("kubernetes.io/hostname".into(), config.node_name.clone());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        labels.insert("kubernetes.io/arch".into(), go_arch().into());
        let node = NodeInfo {
            name: config.node_name.clone(),
            labels,
            allocatable,
            sysctls: config.allowed_sysctls.clone(),
        };

        let cache = Arc::new(PodCache::new(runtime.clone()));
        let network_events = Some(runtime.subscribe());
        let pleg_config = PlegConfig {
            relist_period: config.pleg_relist_period,
            ..PlegConfig::default()
        };
        let pleg = crate::pleg::start(
            runtime.clone(),
            cache.clone(),
            pleg_config,
            cgroups.as_ref().map(|c| c.hierarchy().clone()),
        );

        let metrics = Arc::new(Metrics::new());
        let (object_changes_tx, object_changes) = mpsc::unbounded_channel();
        let object_watches = api.as_ref().map(|client| {
            Arc::new(crate::apiserver::ObjectWatches::new(
                client.clone(),
                object_changes_tx,
                metrics.clone(),
            ))
        });
        let mut objects: Arc<dyn crate::objects::ObjectSource> = match &config.manifest_path {
            Some(dir) => Arc::new(crate::objects::FileObjectSource::new(dir.clone())),
            None => Arc::new(crate::objects::NoObjects),
        };
        if let Some(client) = &api {
            objects = Arc::new(crate::apiserver::LayeredObjects(vec![
                objects,
                Arc::new(crate::apiserver::ApiObjectSource::new(
                    client.clone(),
                    object_watches.clone(),
                )),
            ]));
        }
        let (probes, probe_updates) = crate::probes::ProbeManager::new(runtime.clone());
        let statuses = Arc::new(StatusStore::load(&config.pods_dir()));
        let events: Arc<dyn EventRecorder> = match &api {
            Some(client) => Arc::new(crate::apiserver::ApiRecorder::start(
                client.clone(),
                config.node_name.clone(),
            )),
            None => Arc::new(TracingRecorder),
        };
        let image_gc = Arc::new(image_gc::ImageGc::new(
            runtime.clone(),
            images.clone(),
            config.image_gc_policy,
            config.images_dir(),
            config.root_dir.join("image-gc-state.json"),
            events.clone(),
        ));
        let syncer = Arc::new(NodeSyncer {
            volumes: crate::volumes::VolumeManager::new(config.root_dir.clone(), objects.clone()),
            config: config.clone(),
            runtime: runtime.clone(),
            images,
            cache: cache.clone(),
            cgroups,
            cgroup_watches: pleg.watches,
            objects,
            services: api.as_ref().map(|client| {
                Arc::new(crate::apiserver::ApiServices::start(client.clone()))
                    as Arc<dyn crate::env::ServiceLister>
            }),
            probes,
            backoff: Mutex::new(crate::sync::backoff::Backoff::new(
                INITIAL_RESTART_BACKOFF.min(config.max_container_restart_period),
                config.max_container_restart_period,
            )),
            statuses: statuses.clone(),
            metrics: metrics.clone(),
            events,
            node: NodeResources {
                cpu_milli: allocatable.cpu_milli,
                memory_bytes: allocatable.memory_bytes,
                host_ip: Some(host_ip()),
            },
            termination_messages: Mutex::new(HashMap::new()),
            image_refs: Mutex::new(Default::default()),
            pull_backoff: Mutex::new(Default::default()),
            waiting: Mutex::new(HashMap::new()),
            evictions: Mutex::new(HashMap::new()),
            pull_slots: config
                .max_parallel_image_pulls
                .map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1)))),
            images_changed: Arc::new(tokio::sync::Notify::new()),
            terminating: Mutex::new(HashMap::new()),
        });
        let workers = PodWorkers::new(
            syncer.clone(),
            PodWorkersConfig {
                resync_interval: config.sync_frequency,
                ..PodWorkersConfig::default()
            },
        );
        let (pod_config, updates) = PodConfig::new(&PodConfigOptions::default());
        if let Some(path) = &config.manifest_path {
            let source = FileSource::new(
                FileSourceConfig::new(path.clone(), config.node_name.clone())
                    .resync_period(config.file_check_frequency),
            );
            pod_config.spawn(source)?;
        }
        if let Some(url) = &config.manifest_url {
            let source = HttpSource::new(
                HttpSourceConfig::new(url.clone(), config.node_name.clone())
                    .period(config.http_check_frequency),
            )
            .map_err(StartError::HttpSource)?;
            pod_config.spawn(source)?;
        }
        let pod_manager = Arc::new(Mutex::new(PodManager::new()));
        let (reclaim_sender, reclaim_requests) = mpsc::channel(1);
        let api_commands = match api {
            Some(client) => {
                let sender = pod_config.channel(crate::config::ConfigSource::Api)?;
                tokio::spawn(crate::apiserver::run_pod_source(
                    client.clone(),
                    config.node_name.clone(),
                    sender,
                ));
                let (tx, rx) = mpsc::unbounded_channel();
                let manager = crate::apiserver::StatusManager::new(
                    client,
                    config.node_name.clone(),
                    statuses.clone(),
                    pod_manager.clone(),
                );
                tokio::spawn(manager.run(rx));
                Some(tx)
            }
            None => None,
        };

        let config_shutdown = config.shutdown.clone();
        Ok(Self {
            config,
            runtime,
            pod_manager,
            workers,
            syncer,
            statuses,
            node,
            pod_config,
            updates,
            pleg_events: pleg.events,
            pleg_health: pleg.health,
            pleg_config,
            metrics,
            started: std::time::Instant::now(),
            probe_updates,
            rejected: HashMap::new(),
            api_commands,
            object_watches,
            object_changes,
            image_gc,
            pressure: tokio::sync::watch::channel(crate::node::Pressure::default()).0,
            reclaim_requests,
            reclaim_sender,
            node_shutdown: node_shutdown::ShutdownManager::new(config_shutdown),
            network_events,
        })
    }

    /// Image garbage collection: [`image_gc::ImageGc::free_space`] for the node-pressure
    /// eviction, [`image_gc::ImageGc::node_images`] for the node status.
    pub fn image_gc(&self) -> Arc<image_gc::ImageGc> {
        self.image_gc.clone()
    }

    /// The status store (for the local server and the API status manager).
    pub fn statuses(&self) -> Arc<StatusStore> {
        self.statuses.clone()
    }

    /// What the local server shows: pods, statuses and health.
    pub fn view(&self) -> Arc<dyn PodsView> {
        Arc::new(view::KubeletView {
            statuses: self.statuses.clone(),
            pleg: self.pleg_health.clone(),
            pleg_config: self.pleg_config,
            started: self.started,
        })
    }

    /// The Summary behind the kubelet API's `/stats/summary` and `/metrics/resource`.
    pub fn stats(&self) -> Arc<dyn crate::server::kubelet_api::stats::StatsProvider> {
        Arc::new(self.stats_reader())
    }

    /// The node's pressure conditions (for the node controller's `MemoryPressure`,
    /// `DiskPressure` and `PIDPressure`).
    pub fn pressure(&self) -> tokio::sync::watch::Receiver<crate::node::Pressure> {
        self.pressure.subscribe()
    }

    /// Graceful node shutdown: where shutdown events go (SIGPWR, logind) and whether the
    /// node is shutting down (for its `Ready` condition).
    pub fn node_shutdown(&self) -> node_shutdown::NodeShutdown {
        self.node_shutdown.handle()
    }

    /// Node-level disk reclaim before evicting pods (kubelet's `reclaimNodeLevelResources`
    /// for nodefs/imagefs): dead containers, then unused images (`DeleteUnusedImages`).
    async fn reclaim_node_disk(&self) {
        self.garbage_collect().await;
        match self.image_gc.delete_unused_images().await {
            Ok(freed) => tracing::info!(freed, "unused images removed for disk pressure"),
            Err(err) => tracing::warn!(%err, "removing unused images for disk pressure failed"),
        }
    }

    fn stats_reader(&self) -> stats::KubeletStats {
        stats::KubeletStats {
            node_name: self.config.node_name.clone(),
            root_dir: self.config.root_dir.clone(),
            pod_log_dir: self.config.pod_log_dir.clone(),
            pods_dir: self.config.pods_dir(),
            runtime: self.runtime.clone(),
            cgroups: self.syncer.cgroups.clone(),
            statuses: self.statuses.clone(),
            previous_cpu: Mutex::default(),
        }
    }

    /// The probe workers' counters behind the kubelet API's `/metrics/probes`.
    pub fn probe_counts(&self) -> Arc<crate::probes::ProbeCounts> {
        self.syncer.probes.counts()
    }

    /// The agent's metrics (kubelet names), rendered at `/metrics`.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The sync loop; returns when `shutdown` completes. Running pods keep running.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut housekeeping = tokio::time::interval(self.config.housekeeping_period);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut gc = tokio::time::interval(Duration::from_secs(60));
        gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let _eviction = AbortOnDrop(tokio::spawn(eviction::run(
            self.workers.clone(),
            self.syncer.clone(),
            self.config.pods_dir(),
            self.config.eviction_monitoring_period,
            eviction::pressure::NodePressure {
                settings: self.config.eviction.clone(),
                root_dir: self.config.root_dir.clone(),
                image_dir: self.config.root_dir.join("images"),
                allocatable_memory_bytes: self.syncer.node.memory_bytes,
                stats: Arc::new(self.stats_reader()),
                published: self.pressure.clone(),
                reclaim: self.reclaim_sender.clone(),
                tracker: Default::default(),
                notifiers: Default::default(),
                last_announced: None,
            },
        )));
        let _network_events = self.network_events.take().map(|events| {
            AbortOnDrop(tokio::spawn(network_events::report_restarts(
                events,
                self.pod_manager.clone(),
                self.pod_config.sources_ready(),
                self.syncer.events.clone(),
            )))
        });
        let _image_gc = AbortOnDrop(tokio::spawn(self.image_gc.clone().run(
            self.config.image_gc_period,
            self.syncer.images_changed.clone(),
        )));
        loop {
            tokio::select! {
                () = &mut shutdown => {
                    tracing::info!("shutting down; pods keep running");
                    return;
                }
                update = self.updates.recv() => match update {
                    Some(update) => self.handle_update(update),
                    None => {
                        tracing::error!("pod config stream ended");
                        return;
                    }
                },
                Some(event) = self.pleg_events.recv() => self.handle_pleg_event(event),
                Some(update) = self.probe_updates.recv() => self.on_probe_update(&update),
                Some(uids) = self.object_changes.recv() => {
                    for uid in uids {
                        self.sync_uid(&uid);
                    }
                }
                _ = housekeeping.tick() => {
                    if self.pod_config.all_sources_ready() {
                        // A source is marked ready once its first set is *queued*: take the
                        // queued updates first, or housekeeping would see no desired pods
                        // and kill every running one (e.g. right after an agent restart).
                        while let Ok(update) = self.updates.try_recv() {
                            self.handle_update(update);
                        }
                        self.housekeeping().await;
                    }
                }
                _ = gc.tick() => self.garbage_collect().await,
                Some(done) = self.reclaim_requests.recv() => {
                    self.reclaim_node_disk().await;
                    let _ = done.send(());
                }
                // Once every source delivered its pods, so that none is missed (as for
                // housekeeping: the queued updates first).
                Some(event) = self.node_shutdown.events.recv(), if self.pod_config.all_sources_ready() => {
                    while let Ok(update) = self.updates.try_recv() {
                        self.handle_update(update);
                    }
                    self.node_shutdown.on_event(event, &self.workers, &self.syncer);
                }
            }
        }
    }

    fn lock_manager(&self) -> std::sync::MutexGuard<'_, PodManager> {
        self.pod_manager.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn handle_update(&mut self, update: PodUpdate) {
        tracing::debug!(op = %update.op, source = %update.source, pods = update.pods.len(), "pod update");
        match update.op {
            PodOp::Add => {
                let mut pods = update.pods;
                // kubelet admits in creation order so that older pods win resources.
                pods.sort_by(|a, b| {
                    a.metadata
                        .creation_timestamp
                        .cmp(&b.metadata.creation_timestamp)
                });
                for pod in pods {
                    if is_mirror_pod(&pod) {
                        // kubelet's handleMirrorPod: only the pod manager tracks it.
                        self.lock_manager().add_pod(pod);
                        continue;
                    }
                    self.watch_objects_of(&pod);
                    self.handle_add(Arc::new(pod));
                }
            }
            PodOp::Update | PodOp::Delete => {
                for pod in update.pods {
                    if is_mirror_pod(&pod) {
                        self.lock_manager().update_pod(pod);
                        continue;
                    }
                    self.watch_objects_of(&pod);
                    let pod = Arc::new(pod);
                    if self.rejected.contains_key(pod_uid(&pod)) {
                        continue;
                    }
                    self.lock_manager().update_pod(Arc::clone(&pod));
                    self.workers
                        .update_pod(UpdatePodOptions::new(UpdateType::Update, pod));
                }
            }
            PodOp::Remove => {
                for pod in update.pods {
                    let uid = pod_uid(&pod).to_owned();
                    self.lock_manager().remove_pod(&pod);
                    if let Some(watches) = &self.object_watches {
                        watches.unregister_pod(&uid);
                    }
                    if is_mirror_pod(&pod) {
                        continue;
                    }
                    if self.rejected.remove(&uid).is_some() {
                        self.statuses.remove(&uid);
                        continue;
                    }
                    self.workers
                        .update_pod(UpdatePodOptions::new(UpdateType::Kill, Arc::new(pod)));
                }
            }
            PodOp::Reconcile => {
                for pod in update.pods {
                    let pod = Arc::new(pod);
                    self.lock_manager().update_pod(Arc::clone(&pod));
                    // kubelet's HandlePodReconcile: a client changed a readiness gate's
                    // condition; the worker recomputes Ready from this very status (an
                    // `Update` hands it the new object, a `Sync` keeps the old one).
                    let uid = pod_uid(&pod);
                    if is_mirror_pod(&pod)
                        || self.rejected.contains_key(uid)
                        || !crate::status::needs_readiness_reconcile(&pod)
                    {
                        continue;
                    }
                    tracing::debug!(pod = %pod_full_name(&pod), "readiness gates changed; syncing");
                    self.workers
                        .update_pod(UpdatePodOptions::new(UpdateType::Update, pod));
                }
            }
        }
    }

    /// kubelet's secret/configMap manager `RegisterPod` (from the pod manager): an API
    /// pod's ConfigMaps and Secrets are watched while it exists.
    fn watch_objects_of(&self, pod: &Pod) {
        let from_api = crate::config::pod_source(pod) == Some(crate::config::ConfigSource::Api);
        if let (Some(watches), true) = (&self.object_watches, from_api) {
            watches.register_pod(pod);
        }
    }

    /// kubelet's `HandlePodAdditions`: admit against the pods already admitted, then hand
    /// to a worker; a rejected pod is Failed with the admission reason and never started.
    fn handle_add(&mut self, pod: Arc<Pod>) {
        let uid = pod_uid(&pod).to_owned();
        let admitted: Vec<Arc<Pod>> = self
            .lock_manager()
            .pods()
            .into_iter()
            .filter(|p| {
                let uid = pod_uid(p);
                !self.rejected.contains_key(uid) && !self.workers.is_pod_terminated(uid)
            })
            .collect();
        self.lock_manager().add_pod(Arc::clone(&pod));
        let verdict = crate::admission::admit(&self.node, &pod, &admitted);
        let rejection = match verdict.reason() {
            Some(reason) => Some((reason, verdict.message())),
            None => self
                .pressure_admission(&pod)
                .or_else(|| self.shutdown_admission()),
        };
        if let Some((reason, message)) = rejection {
            tracing::warn!(pod = %pod_full_name(&pod), reason, %message, "pod rejected");
            let status = crate::status::generate_pod_status(&crate::status::StatusInputs {
                pod: &pod,
                runtime: &ironlet_runtime::types::PodStatus {
                    pod_uid: uid.clone(),
                    name: String::new(),
                    namespace: String::new(),
                    sandboxes: Vec::new(),
                    containers: Vec::new(),
                },
                probes: &crate::status::NoProbes,
                waiting: &Default::default(),
                previous: None,
                host_ips: &[],
                image_refs: &Default::default(),
                lifecycle: &crate::status::PodLifecycle::Rejected {
                    reason: reason.to_owned(),
                    message: message.clone(),
                },
                now: std::time::SystemTime::now(),
            });
            self.statuses.set(pod.clone(), status);
            self.rejected.insert(uid, pod);
            return;
        }
        self.workers
            .update_pod(UpdatePodOptions::new(UpdateType::Create, pod));
    }

    /// The eviction manager's admission (kubelet's `managerImpl.Admit`): under node
    /// pressure, reason `Evicted` and `The node had condition: [MemoryPressure]. `.
    fn pressure_admission(&self, pod: &Pod) -> Option<(&'static str, String)> {
        let conditions = eviction::pressure::from_pressure(*self.pressure.borrow());
        eviction::manager::admission_message(pod, &conditions, eviction::is_critical(pod))
            .map(|message| (events::reason::EVICTED, message))
    }

    /// The shutdown manager's admission (kubelet's `managerImpl.Admit`): no new pod while
    /// the node is shutting down.
    fn shutdown_admission(&self) -> Option<(&'static str, String)> {
        self.node_shutdown.is_shutting_down().then(|| {
            (
                node_shutdown::NOT_ADMITTED_REASON,
                node_shutdown::NOT_ADMITTED_MESSAGE.to_owned(),
            )
        })
    }

    fn handle_pleg_event(&self, event: PodLifecycleEvent) {
        self.sync_uid(&event.pod_uid);
    }

    /// Asks the worker of a known pod to sync.
    /// A probe result changed (sync the pod) or a probe run asks for an event (kubelet's
    /// `Unhealthy`: `Readiness probe failed: …`; `ProbeWarning`: `Liveness probe warning:
    /// Probe terminated redirects, …`).
    fn on_probe_update(&self, update: &crate::probes::ProbeUpdate) {
        if let Some(event) = &update.event {
            if let Some(pod) = self.lock_manager().pod_by_uid(&update.pod_uid) {
                self.syncer.events.event(
                    &pod,
                    events::EventType::Warning,
                    event.reason(),
                    event.message(update.kind),
                );
            }
            return;
        }
        self.sync_uid(&update.pod_uid);
    }

    fn sync_uid(&self, uid: &str) {
        self.syncer.pod_changed(uid);
        let pod = self.lock_manager().pod_by_uid(uid);
        if let Some(pod) = pod {
            self.workers
                .update_pod(UpdatePodOptions::new(UpdateType::Sync, pod));
        }
    }
}

/// Aborts a background task when dropped (the sync loop's, when the loop returns).
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The node's cgroup tree (as root, or rootless in a delegated cgroup v2 subtree) and capacity.
fn node_cgroups(config: &KubeletConfig) -> Result<(Option<NodeCgroups>, NodeCapacity), StartError> {
    let rootless = !nix::unistd::geteuid().is_root();
    let hierarchy = match Hierarchy::detect() {
        Ok(h) => h,
        Err(err) => {
            tracing::warn!(%err, "no cgroup hierarchy; running without pod cgroups");
            return Ok((None, fallback_capacity()));
        }
    };
    let capacity = NodeCapacity::read(&hierarchy).unwrap_or_else(|err| {
        tracing::warn!(%err, "reading node capacity from cgroups failed; using /proc");
        fallback_capacity()
    });
    let root = if rootless {
        // Only inside a delegated cgroup v2 subtree (systemd's Delegate=yes), and below it.
        match ironlet_cgroups::Delegation::prepare(&hierarchy) {
            ironlet_cgroups::Delegation::Full { root } => format!(
                "{}/{}",
                root.as_str().trim_end_matches('/'),
                config.cgroup_root.trim_start_matches('/')
            ),
            ironlet_cgroups::Delegation::None { reason } => {
                tracing::warn!(%reason, "rootless: no pod cgroups; resource limits are not enforced");
                return Ok((None, capacity));
            }
        }
    } else {
        if config.cgroup_favor_dynmods {
            favor_dynamic_cgroup_mods();
        }
        config.cgroup_root.clone()
    };
    let node = NodeCgroups::ensure(hierarchy, &root)
        .map_err(|source| StartError::Cgroups { root, source })?;
    Ok((Some(node), capacity))
}

/// `--cgroup-favor-dynmods`: a failure costs start latency only, so it is logged, not fatal.
fn favor_dynamic_cgroup_mods() {
    match ironlet_cgroups::favor_dynamic_modifications() {
        Ok(ironlet_cgroups::Dynmods::Enabled(mount)) => tracing::info!(
            mount = %mount.display(),
            "remounted cgroup2 with favordynmods: container starts skip an RCU grace period \
             (--cgroup-favor-dynmods=false to leave it)"
        ),
        Ok(ironlet_cgroups::Dynmods::AlreadyOn(mount)) => {
            tracing::debug!(mount = %mount.display(), "cgroup2 already has favordynmods");
        }
        Ok(ironlet_cgroups::Dynmods::Unavailable(reason)) => {
            tracing::info!(%reason, "cgroup favordynmods unavailable");
        }
        Err(err) => tracing::warn!(%err, "enabling cgroup favordynmods failed"),
    }
}

fn fallback_capacity() -> NodeCapacity {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024;
    NodeCapacity {
        cpu_milli: cpus * 1000,
        memory_bytes: memory,
        pids: 0,
    }
}

/// `GOARCH` spelling of this machine's architecture, as node labels use it.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

/// The address of the interface holding the default route (kubelet's default node IP);
/// 127.0.0.1 without one. A connected UDP socket picks the route; no packet is sent.
pub fn host_ip() -> String {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|()| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into())
}

//! [`NodeController`]: registration, the heartbeat loop and the shutdown report (see the
//! module docs of `node` for the timeline).

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tracing::{info, warn};

use super::backoff::Backoff;
use super::conditions::{shutting_down, Transitions};
use super::config::NodeConfig;
use super::error::{Error, Result};
use super::lease::{LeaseParams, LeaseRenewer, NODE_LEASE_NAMESPACE};
use super::object::{default_labels, initial_node};
use super::provider::NodeStatusProvider;
use super::status::{status_patch, Snapshot, StatusReporter};

/// Registers this node and keeps its Lease and status fresh until shutdown.
pub struct NodeController {
    nodes: Api<Node>,
    leases: Api<Lease>,
    config: NodeConfig,
    provider: Arc<dyn NodeStatusProvider>,
    health: watch::Receiver<bool>,
    registered: watch::Sender<bool>,
    /// A change makes the status go out at once (graceful node shutdown's `Ready=False`).
    refresh: Option<watch::Receiver<bool>>,
}

/// The outcome of registration.
struct Registered {
    uid: String,
    reporter: StatusReporter,
}

impl NodeController {
    /// A controller talking to the apiserver through `client` (it needs the node's rights:
    /// create/patch its Node and status, its Lease). Nothing happens until [`run`](Self::run).
    pub fn new(client: Client, config: NodeConfig, provider: impl NodeStatusProvider) -> Self {
        let (healthy, health) = watch::channel(true);
        // A closed channel keeps its last value: healthy, unless `with_health` replaces it.
        drop(healthy);
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client, NODE_LEASE_NAMESPACE),
            config,
            provider: Arc::new(provider),
            health,
            registered: watch::channel(false).0,
            refresh: None,
        }
    }

    /// The agent's health: while it reads `false` the Lease is not renewed, so the cluster
    /// sees the node stop heartbeating (kubelet stops renewing when its sync loop is stuck).
    #[must_use]
    pub fn with_health(mut self, health: watch::Receiver<bool>) -> Self {
        self.health = health;
        self
    }

    /// Reports the status at once whenever `refresh` changes (kubelet syncs the node status
    /// as soon as a shutdown starts), besides the periodic reports.
    #[must_use]
    pub fn with_status_refresh(mut self, refresh: watch::Receiver<bool>) -> Self {
        self.refresh = Some(refresh);
        self
    }

    /// Turns `true` once the Node exists in the apiserver (created or adopted).
    pub fn registered(&self) -> watch::Receiver<bool> {
        self.registered.subscribe()
    }

    /// Registers the Node (retrying with back-off), then renews the Lease and reports the
    /// status until `shutdown` completes, then patches Ready=False. Errors while running are
    /// logged and retried; the result is the outcome of the final Ready=False patch.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let mut shutdown = std::pin::pin!(shutdown);
        let Registered { uid, mut reporter } = tokio::select! {
            () = &mut shutdown => return Ok(()),
            registered = self.register_until_done() => registered,
        };
        let _ = self.registered.send(true);
        let config = &self.config;
        let mut lease = LeaseRenewer::new(
            self.leases.clone(),
            LeaseParams {
                node: config.node_name.clone(),
                node_uid: uid,
                duration_seconds: i32::try_from(config.lease_duration.as_secs())
                    .unwrap_or(i32::MAX),
            },
            Backoff::new(config.retry_initial, config.retry_max),
            config.lease_renew_interval,
        );
        let mut next_lease = Instant::now();
        let mut next_status = Instant::now();
        let mut health_open = true;
        let mut was_healthy = true;
        let mut lost_contact = false;
        let mut refresh = self.refresh.take();
        loop {
            let healthy = *self.health.borrow_and_update();
            if healthy != was_healthy {
                info!(node = %config.node_name, healthy, "agent health changed; lease renewal {}", if healthy { "resumes" } else { "paused" });
                was_healthy = healthy;
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = sleep_until(next_lease), if healthy => {
                    let renewal = lease.renew(Timestamp::now(), config.heartbeat_timeout);
                    tokio::select! {
                        () = &mut shutdown => break,
                        delay = renewal => {
                            if delay != config.lease_renew_interval {
                                // Contact lost: meanwhile others (the node lifecycle
                                // controller) may have rewritten our conditions, so the
                                // full status goes out again as soon as a renewal succeeds.
                                reporter.failed();
                                lost_contact = true;
                            } else if lost_contact {
                                lost_contact = false;
                                next_status = Instant::now();
                            }
                            next_lease = Instant::now() + delay;
                        }
                    }
                }
                () = sleep_until(next_status) => {
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = self.report_status(&mut reporter) => {}
                    }
                    // The period counts from the end of the update (kubelet's sliding
                    // `wait.Until`), so a slow apiserver does not cause a burst.
                    next_status = Instant::now() + config.node_status_update_frequency;
                }
                changed = async { refresh.as_mut()?.changed().await.ok() }, if refresh.is_some() => {
                    match changed {
                        Some(()) => next_status = Instant::now(),
                        None => refresh = None,
                    }
                }
                changed = self.health.changed(), if health_open => {
                    // A dropped sender leaves the last value in place.
                    health_open = changed.is_ok();
                }
            }
        }
        self.mark_not_ready(&mut reporter).await
    }

    async fn register_until_done(&self) -> Registered {
        let mut backoff = Backoff::new(self.config.retry_initial, self.config.retry_max);
        loop {
            match self.register().await {
                Ok(registered) => return registered,
                Err(err) => {
                    let delay = backoff.next_delay();
                    warn!(node = %self.config.node_name, ?delay, error = %err, source = ?std::error::Error::source(&err), "node registration failed; retrying");
                    sleep(delay).await;
                }
            }
        }
    }

    /// One registration attempt: POST the Node with its full status; when it already exists,
    /// adopt it (patch our labels, continue its condition transition times).
    async fn register(&self) -> Result<Registered> {
        let name = &self.config.node_name;
        let snapshot = Snapshot::read(&*self.provider)?;
        let mut reporter = StatusReporter::new(
            Transitions::default(),
            self.config.node_status_report_frequency,
        );
        let node = initial_node(
            name,
            &self.config.labels,
            reporter.status(&snapshot, Timestamp::now()),
        );
        match self.nodes.create(&PostParams::default(), &node).await {
            Ok(created) => {
                info!(node = %name, "registered the node");
                reporter.accepted(snapshot, Instant::now());
                Ok(Registered {
                    uid: uid_of(&created, name)?,
                    reporter,
                })
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() => {
                let existing = self
                    .nodes
                    .get(name)
                    .await
                    .map_err(|source| Error::GetNode {
                        node: name.clone(),
                        source,
                    })?;
                let mut labels = default_labels(name);
                labels.extend(self.config.labels.clone());
                let patch = json!({ "metadata": { "labels": labels } });
                self.nodes
                    .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .map_err(|source| Error::PatchLabels {
                        node: name.clone(),
                        source,
                    })?;
                info!(node = %name, "adopted the existing node");
                let conditions = existing
                    .status
                    .as_ref()
                    .and_then(|status| status.conditions.as_deref())
                    .unwrap_or_default();
                Ok(Registered {
                    uid: uid_of(&existing, name)?,
                    // Nothing reported yet: the first status tick patches the full status.
                    reporter: StatusReporter::new(
                        Transitions::from_existing(conditions),
                        self.config.node_status_report_frequency,
                    ),
                })
            }
            Err(source) => Err(Error::CreateNode {
                node: name.clone(),
                source,
            }),
        }
    }

    /// Reads the status and patches it when due; a failure makes the next tick patch again.
    async fn report_status(&self, reporter: &mut StatusReporter) {
        let name = &self.config.node_name;
        let snapshot = match Snapshot::read(&*self.provider) {
            Ok(snapshot) => snapshot,
            Err(err) => {
                warn!(node = %name, error = %err, source = ?std::error::Error::source(&err), "cannot read the node status; skipping this update");
                return;
            }
        };
        let now = Instant::now();
        if !reporter.due(&snapshot, now) {
            return;
        }
        let status = reporter.status(&snapshot, Timestamp::now());
        match self.patch_status(status_patch(&status)).await {
            Ok(()) => reporter.accepted(snapshot, now),
            Err(err) => {
                warn!(node = %name, error = %err, source = ?std::error::Error::source(&err), "node status update failed; retrying at the next tick");
                reporter.failed();
            }
        }
    }

    async fn mark_not_ready(&self, reporter: &mut StatusReporter) -> Result<()> {
        let name = &self.config.node_name;
        let status = reporter.conditions_only(&[shutting_down()], Timestamp::now());
        let limit = self.config.shutdown_timeout;
        let result = timeout(limit, self.patch_status(status_patch(&status))).await;
        match result {
            Ok(Ok(())) => {
                info!(node = %name, "marked the node not ready for shutdown");
                Ok(())
            }
            Ok(Err(err)) => Err(err),
            Err(_) => Err(Error::ShutdownTimeout {
                node: name.clone(),
                timeout: limit,
            }),
        }
    }

    async fn patch_status(&self, patch: serde_json::Value) -> Result<()> {
        let name = &self.config.node_name;
        let params = PatchParams::default();
        let patch = Patch::Strategic(patch);
        let call = self.nodes.patch_status(name, &params, &patch);
        match timeout(self.config.heartbeat_timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) => Err(Error::PatchStatus {
                node: name.clone(),
                source,
            }),
            Err(_) => Err(Error::RequestTimeout {
                node: name.clone(),
                timeout: self.config.heartbeat_timeout,
            }),
        }
    }
}

fn uid_of(node: &Node, name: &str) -> Result<String> {
    node.metadata.uid.clone().ok_or_else(|| Error::MissingUid {
        node: name.to_owned(),
    })
}

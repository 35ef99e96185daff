//! The status manager (kubelet's `status_manager`), mirror pods (the seed's `MirrorClient`)
//! and deletion finalization: one task that writes what the agent knows back to the API.
//!
//! Guarantees:
//! * Statuses from the [`StatusStore`] are patched (`pods/<name>/status`, a strategic merge
//!   patch carrying `metadata.uid` as precondition) only when they differ from the last status
//!   this manager wrote for that pod object; a failed patch is retried every
//!   [`RETRY_PERIOD`]. Changes that arrive together go out together (one pass per wake-up).
//!   A pass looks at the pods whose status changed ([`StatusStore::take_changed`]), not at
//!   every pod of the node: with 500 pods, comparing every status on each change was the
//!   largest part of the agent's work during a pod start. Every [`RESYNC_PERIOD`] all are
//!   compared (kubelet's `syncBatch`), which also catches a target replaced under an
//!   unchanged status.
//! * Only the conditions the kubelet writes are in a patch, merged by type: a condition a
//!   client set (a readiness gate's) is never overwritten or removed, even when the agent's
//!   copy of the pod is older than the client's write ([`status_patch`]).
//! * A static pod's status goes to its mirror pod; until the mirror exists it waits.
//! * [`ApiCommand::Finalize`]: the pod's final status is flushed, then the pod is deleted
//!   with grace 0 and a UID precondition (a re-created pod of the same name is untouched).
//! * [`ApiCommand::EnsureMirror`] creates the mirror pod (annotation `config.mirror` = the
//!   static pod's `config.hash`, owner reference to the Node as controller), deleting an
//!   outdated one — or one being deleted — first, with grace 0 (kubelet's `DeleteMirrorPod`); [`ApiCommand::DeleteMirror`] deletes an orphan. Repeated requests for the same
//!   mirror within [`MIRROR_DEBOUNCE`] are ignored (the watch has not caught up yet).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use tokio::sync::mpsc;

use crate::config::{
    annotation, is_static_pod, pod_full_name, pod_source, pod_uid, ConfigSource, CONFIG_HASH,
    CONFIG_MIRROR,
};
use crate::kubelet::status_store::StatusStore;
use crate::pod_manager::PodManager;

/// How often failed or waiting status patches are retried.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// How often every status is compared with what was last written.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(10);
/// How long a mirror pod request is not repeated.
pub const MIRROR_DEBOUNCE: Duration = Duration::from_secs(5);

/// What the sync loop asks of the API side.
#[derive(Debug, Clone)]
pub enum ApiCommand {
    /// This API pod has a deletionTimestamp and its containers are all stopped.
    Finalize(Arc<Pod>),
    /// Create the mirror of this static pod, replacing `outdated` (a mirror of another
    /// version, or one with a deletionTimestamp), if any.
    EnsureMirror {
        static_pod: Arc<Pod>,
        outdated: Option<Arc<Pod>>,
    },
    /// Delete this mirror pod: its static pod is gone.
    DeleteMirror(Arc<Pod>),
}

/// The object a status is written to: namespace, name, UID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Target {
    namespace: String,
    name: String,
    uid: String,
}

impl Target {
    fn of(pod: &Pod) -> Self {
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod_uid(pod).to_owned(),
        }
    }
}

/// The task's state.
pub struct StatusManager {
    client: Client,
    node_name: String,
    statuses: Arc<StatusStore>,
    pod_manager: Arc<Mutex<PodManager>>,
    /// Last status written per target, with the number of writes (the version).
    sent: HashMap<Target, (PodStatus, u64)>,
    mirror_requests: HashMap<String, Instant>,
    finalized: HashSet<String>,
    node_uid: Option<String>,
    /// Pods (by UID) whose patch failed or whose target does not exist yet (a static pod
    /// before its mirror): retried every [`RETRY_PERIOD`].
    pending: HashSet<String>,
}

impl StatusManager {
    pub fn new(
        client: Client,
        node_name: String,
        statuses: Arc<StatusStore>,
        pod_manager: Arc<Mutex<PodManager>>,
    ) -> Self {
        Self {
            client,
            node_name,
            statuses,
            pod_manager,
            sent: HashMap::new(),
            mirror_requests: HashMap::new(),
            finalized: HashSet::new(),
            node_uid: None,
            pending: HashSet::new(),
        }
    }

    /// Runs until the command channel closes (the agent stopped).
    pub async fn run(mut self, mut commands: mpsc::UnboundedReceiver<ApiCommand>) {
        let mut changes = self.statuses.subscribe();
        let mut retry = tokio::time::interval(RETRY_PERIOD);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut resync = tokio::time::interval(RESYNC_PERIOD);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    changes.borrow_and_update();
                    for uid in self.statuses.take_changed() {
                        self.sync_uid(uid).await;
                    }
                }
                command = commands.recv() => match command {
                    Some(command) => self.handle(command).await,
                    None => return,
                },
                _ = retry.tick() => {
                    for uid in std::mem::take(&mut self.pending) {
                        self.sync_uid(uid).await;
                    }
                }
                _ = resync.tick() => self.sync_all().await,
            }
        }
    }

    fn manager(&self) -> std::sync::MutexGuard<'_, PodManager> {
        self.pod_manager.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where `pod`'s status belongs: itself for API pods, its mirror for static pods.
    fn target_of(&self, pod: &Pod) -> Option<Target> {
        if is_static_pod(pod) {
            let mirror = self.manager().mirror_pod_by_pod(pod)?;
            return Some(Target::of(&mirror));
        }
        (pod_source(pod) == Some(ConfigSource::Api)).then(|| Target::of(pod))
    }

    /// Patches every status that differs from what was last written.
    async fn sync_all(&mut self) {
        let mut live = HashSet::new();
        for (pod, status) in self.statuses.statuses() {
            if let Some(target) = self.sync_pod(&pod, status).await {
                live.insert(target);
            }
        }
        self.sent.retain(|t, _| live.contains(t));
    }

    /// Patches the status of pod `uid` if it differs from what was last written (a pod
    /// removed from the store has nothing left to write).
    async fn sync_uid(&mut self, uid: String) {
        if let Some((pod, status)) = self.statuses.entry(&uid) {
            let _ = self.sync_pod(&pod, status).await;
        }
    }

    /// [`Self::sync_one`] for `pod`'s target, remembering the pod for a retry when the patch
    /// failed or its target does not exist yet; the target, if it has one.
    async fn sync_pod(&mut self, pod: &Pod, status: PodStatus) -> Option<Target> {
        let target = self.target_of(pod);
        let written = match &target {
            Some(target) => self.sync_one(target.clone(), status).await,
            // Only a static pod gets a target later (its mirror).
            None => !is_static_pod(pod),
        };
        if !written {
            self.pending.insert(pod_uid(pod).to_owned());
        }
        target
    }

    /// Patches `status` onto `target` unless it is what was last written there; false when
    /// the patch failed (it is to be retried).
    async fn sync_one(&mut self, target: Target, status: PodStatus) -> bool {
        if self.sent.get(&target).is_some_and(|(s, _)| *s == status) {
            return true;
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
        let patch = status_patch(&target.uid, &status);
        match api
            .patch_status(
                &target.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => {
                let version = self.sent.get(&target).map_or(0, |(_, v)| v + 1);
                tracing::debug!(pod = %target.name, namespace = %target.namespace, version, "pod status patched");
                self.sent.insert(target, (status, version));
                true
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                tracing::debug!(pod = %target.name, code = e.code, "status target gone or replaced");
                self.sent.insert(target, (status, 0));
                true
            }
            Err(err) => {
                tracing::warn!(pod = %target.name, namespace = %target.namespace, %err, "patching pod status failed; will retry");
                false
            }
        }
    }

    async fn handle(&mut self, command: ApiCommand) {
        match command {
            ApiCommand::Finalize(pod) => self.finalize(&pod).await,
            ApiCommand::EnsureMirror {
                static_pod,
                outdated,
            } => self.ensure_mirror(&static_pod, outdated.as_deref()).await,
            ApiCommand::DeleteMirror(mirror) => {
                let key = format!("delete/{}", pod_uid(&mirror));
                if self.debounced(&key) {
                    return;
                }
                tracing::info!(pod = %pod_full_name(&mirror), "deleting orphaned mirror pod");
                self.delete(&mirror, Some(0)).await;
            }
        }
    }

    fn debounced(&mut self, key: &str) -> bool {
        let now = Instant::now();
        self.mirror_requests
            .retain(|_, at| now.duration_since(*at) < MIRROR_DEBOUNCE);
        if self.mirror_requests.contains_key(key) {
            return true;
        }
        self.mirror_requests.insert(key.to_owned(), now);
        false
    }

    async fn finalize(&mut self, pod: &Pod) {
        let uid = pod_uid(pod).to_owned();
        if self.finalized.contains(&uid) {
            return;
        }
        if let Some(status) = self.statuses.status(&uid) {
            if !self.sync_one(Target::of(pod), status).await {
                self.pending.insert(uid.clone());
            }
        }
        tracing::info!(pod = %pod_full_name(pod), "pod terminated; deleting it from the API");
        if self.delete(pod, Some(0)).await {
            self.finalized.insert(uid);
        }
    }

    /// Deletes `pod` with a UID precondition; true when it is gone.
    async fn delete(&self, pod: &Pod, grace: Option<u32>) -> bool {
        let target = Target::of(pod);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &target.namespace);
        let params = DeleteParams {
            grace_period_seconds: grace,
            preconditions: Some(Preconditions {
                uid: Some(target.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&target.name, &params).await {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => true,
            Err(err) => {
                tracing::warn!(pod = %target.name, namespace = %target.namespace, %err, "deleting pod failed");
                false
            }
        }
    }

    async fn ensure_mirror(&mut self, static_pod: &Pod, outdated: Option<&Pod>) {
        let Some(hash) = annotation(static_pod, CONFIG_HASH).map(str::to_owned) else {
            return;
        };
        let key = format!(
            "create/{}/{hash}/{}",
            pod_full_name(static_pod),
            outdated.map(pod_uid).unwrap_or_default()
        );
        if self.debounced(&key) {
            return;
        }
        if let Some(old) = outdated {
            // Outdated or being deleted (kubelet's syncPod): remove it at once, then recreate.
            tracing::info!(pod = %pod_full_name(old), "deleting outdated mirror pod");
            if !self.delete(old, Some(0)).await {
                self.mirror_requests.remove(&key);
                return;
            }
        }
        let Some(node_uid) = self.node_uid().await else {
            self.mirror_requests.remove(&key);
            return;
        };
        let mirror = mirror_pod(static_pod, &hash, &self.node_name, &node_uid);
        let namespace = mirror.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &mirror).await {
            Ok(_) => {
                tracing::info!(pod = %pod_full_name(static_pod), "mirror pod created");
                // Its status goes to the new mirror once the watch has brought it.
                self.pending.insert(pod_uid(static_pod).to_owned());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(err) => {
                tracing::warn!(pod = %pod_full_name(static_pod), %err, "creating mirror pod failed");
                self.mirror_requests.remove(&key);
            }
        }
    }

    async fn node_uid(&mut self) -> Option<String> {
        if self.node_uid.is_none() {
            let nodes: Api<Node> = Api::all(self.client.clone());
            match nodes.get(&self.node_name).await {
                Ok(node) => self.node_uid = node.metadata.uid,
                Err(err) => tracing::debug!(%err, "node not readable yet; mirror pods wait"),
            }
        }
        self.node_uid.clone()
    }
}

/// The strategic merge patch writing `status` to the pod with UID `uid`: `conditions` (merged
/// by `type`) holds only the conditions the kubelet writes, each with `reason`, `message` and
/// `lastProbeTime` it lacks set to null (so that a stale one is removed); the other
/// conditions are left as the API has them.
fn status_patch(uid: &str, status: &PodStatus) -> serde_json::Value {
    let mut status = status.clone();
    let conditions = status.conditions.take().unwrap_or_default();
    let mut value = serde_json::to_value(&status).unwrap_or_default();
    let conditions: Vec<serde_json::Value> = conditions
        .into_iter()
        .filter(|c| crate::status::written_by_kubelet(&c.type_))
        .map(|c| {
            let mut c = serde_json::to_value(c).unwrap_or_default();
            if let Some(fields) = c.as_object_mut() {
                for field in ["reason", "message", "lastProbeTime"] {
                    fields.entry(field).or_insert(serde_json::Value::Null);
                }
            }
            c
        })
        .collect();
    if let Some(fields) = value.as_object_mut() {
        fields.insert("conditions".into(), conditions.into());
    }
    serde_json::json!({
        "metadata": { "uid": uid },
        "status": value,
    })
}

/// kubelet's mirror pod of `static_pod`: same name, namespace, labels, annotations and spec;
/// `config.mirror` = the static pod's hash; owned by the Node.
pub fn mirror_pod(static_pod: &Pod, hash: &str, node_name: &str, node_uid: &str) -> Pod {
    let mut annotations: BTreeMap<String, String> =
        static_pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(CONFIG_MIRROR.to_owned(), hash.to_owned());
    let mut spec = static_pod.spec.clone();
    if let Some(spec) = spec.as_mut() {
        spec.node_name = Some(node_name.to_owned());
    }
    Pod {
        metadata: ObjectMeta {
            name: static_pod.metadata.name.clone(),
            namespace: static_pod.metadata.namespace.clone(),
            labels: static_pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.to_owned(),
                uid: node_uid.to_owned(),
                // NodeRestriction admits a mirror pod only with its Node as controller.
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodCondition;

    #[test]
    fn a_status_patch_carries_only_kubelet_conditions_and_clears_their_stale_fields() {
        let status = PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![
                PodCondition {
                    type_: "example.com/gate".into(),
                    status: "False".into(),
                    ..PodCondition::default()
                },
                PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..PodCondition::default()
                },
            ]),
            ..PodStatus::default()
        };
        let patch = status_patch("u1", &status);
        assert_eq!(patch["metadata"]["uid"], "u1");
        assert_eq!(patch["status"]["phase"], "Running");
        let conditions = patch["status"]["conditions"].as_array().cloned();
        assert_eq!(
            conditions,
            Some(vec![serde_json::json!({
                "type": "Ready",
                "status": "True",
                "reason": null,
                "message": null,
                "lastProbeTime": null,
            })])
        );
    }

    #[test]
    fn a_mirror_pod_carries_the_hash_and_is_owned_by_the_node() {
        let static_pod = Pod {
            metadata: ObjectMeta {
                name: Some("web-n1".into()),
                namespace: Some("default".into()),
                uid: Some("static-uid".into()),
                annotations: Some([(CONFIG_HASH.to_owned(), "abc".to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(Default::default()),
            status: None,
        };
        let mirror = mirror_pod(&static_pod, "abc", "n1", "node-uid");
        assert_eq!(annotation(&mirror, CONFIG_MIRROR), Some("abc"));
        assert_eq!(mirror.metadata.uid, None);
        assert_eq!(mirror.metadata.name.as_deref(), Some("web-n1"));
        let owner = &mirror.metadata.owner_references.unwrap_or_default()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", "node-uid")
        );
        assert_eq!(mirror.spec.and_then(|s| s.node_name).as_deref(), Some("n1"));
    }
}

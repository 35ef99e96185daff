//! [`ObjectWatches`]: kubelet's "Watch" ConfigMap/Secret manager
//! (`pkg/kubelet/util/manager/watch_based_manager.go`).
//!
//! One watch per referenced object — `GET …/configmaps?fieldSelector=metadata.name=X&watch=1`
//! in the pod's namespace, which is what the node authorizer lets a node do for the objects
//! its pods reference — started when the first pod referencing it is registered and stopped
//! when the last one is unregistered. Lookups read the watched copy once the watch has
//! listed; before that (or for an object no pod registered) the caller reads the API itself.
//!
//! Guarantees:
//! * a watch exists exactly while at least one registered pod references its object
//!   (`ironlet_object_watches{kind}` counts them);
//! * when a watched object appears, changes (new `resourceVersion`) or disappears, the UIDs of
//!   the pods referencing it are sent on the change channel at once, so the sync loop resyncs
//!   them (a pod waiting for a missing ConfigMap starts, a mounted volume gets the new
//!   content) without waiting for the periodic sync;
//! * a watch error (the API server going away) keeps the last known copy and is retried with
//!   kube's default back-off; the watch never ends on its own.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodSpec, Secret};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use tokio::sync::mpsc;

use crate::server::Metrics;

/// The kind of a watched object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
}

impl ObjectKind {
    /// The kind as the API spells it.
    fn name(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
        }
    }

    /// The `kind` label of `ironlet_object_watches`.
    fn label(self) -> &'static str {
        match self {
            Self::ConfigMap => "configmap",
            Self::Secret => "secret",
        }
    }
}

/// One watched object: kind, namespace, name.
pub type ObjectKey = (ObjectKind, String, String);

/// The watched copy of an object.
#[derive(Debug, Clone)]
pub enum Watched {
    /// A ConfigMap.
    ConfigMap(ConfigMap),
    /// A Secret (as the API returns it).
    Secret(Secret),
}

impl Watched {
    fn resource_version(&self) -> Option<&str> {
        match self {
            Self::ConfigMap(o) => o.metadata.resource_version.as_deref(),
            Self::Secret(o) => o.metadata.resource_version.as_deref(),
        }
    }
}

struct Watch {
    /// UIDs of the registered pods referencing the object.
    pods: BTreeSet<String>,
    /// `None` until the watch listed; then `Some(None)` for "does not exist".
    value: Option<Option<Watched>>,
    task: tokio::task::AbortHandle,
}

#[derive(Default)]
struct State {
    watches: HashMap<ObjectKey, Watch>,
    /// Pod UID → the objects it references.
    pods: HashMap<String, BTreeSet<ObjectKey>>,
}

/// The per-object watches of the pods' ConfigMaps and Secrets.
pub struct ObjectWatches {
    client: Client,
    state: Arc<Mutex<State>>,
    changes: mpsc::UnboundedSender<Vec<String>>,
    metrics: Arc<Metrics>,
}

impl ObjectWatches {
    /// Watches through `client`; the UIDs of pods whose objects changed are sent on `changes`.
    pub fn new(
        client: Client,
        changes: mpsc::UnboundedSender<Vec<String>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            client,
            state: Arc::default(),
            changes,
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// kubelet's `RegisterPod`: watches every object `pod` references (and stops watching
    /// those an earlier version referenced and this one does not).
    pub fn register_pod(&self, pod: &Pod) {
        let uid = crate::config::pod_uid(pod).to_owned();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let wanted = pod
            .spec
            .as_ref()
            .map(|spec| referenced_objects(spec, namespace))
            .unwrap_or_default();
        let mut state = self.lock();
        let previous = state.pods.remove(&uid).unwrap_or_default();
        for key in previous.difference(&wanted) {
            self.release(&mut state, key, &uid);
        }
        for key in &wanted {
            match state.watches.get_mut(key) {
                Some(watch) => {
                    watch.pods.insert(uid.clone());
                }
                None => {
                    let task = self.spawn(key.clone());
                    state.watches.insert(
                        key.clone(),
                        Watch {
                            pods: BTreeSet::from([uid.clone()]),
                            value: None,
                            task,
                        },
                    );
                    self.metrics.object_watches.with([key.0.label()]).inc();
                    tracing::info!("watching {} {}/{}", key.0.name(), key.1, key.2);
                }
            }
        }
        if !wanted.is_empty() {
            state.pods.insert(uid, wanted);
        }
    }

    /// kubelet's `UnregisterPod`: stops the watches no other pod needs.
    pub fn unregister_pod(&self, uid: &str) {
        let mut state = self.lock();
        for key in state.pods.remove(uid).unwrap_or_default() {
            self.release(&mut state, &key, uid);
        }
    }

    fn release(&self, state: &mut State, key: &ObjectKey, uid: &str) {
        let Some(watch) = state.watches.get_mut(key) else {
            return;
        };
        watch.pods.remove(uid);
        if watch.pods.is_empty() {
            if let Some(watch) = state.watches.remove(key) {
                watch.task.abort();
                self.metrics.object_watches.with([key.0.label()]).dec();
                tracing::info!("stopped watching {} {}/{}", key.0.name(), key.1, key.2);
            }
        }
    }

    /// The watched copy: `None` when the object is not watched or its watch has not listed
    /// yet (read the API instead); `Some(None)` when it does not exist.
    #[must_use]
    pub fn get(&self, key: &ObjectKey) -> Option<Option<Watched>> {
        self.lock().watches.get(key).and_then(|w| w.value.clone())
    }

    /// How many watches run (for tests and metrics).
    #[must_use]
    pub fn count(&self) -> usize {
        self.lock().watches.len()
    }

    fn spawn(&self, key: ObjectKey) -> tokio::task::AbortHandle {
        let state = Arc::clone(&self.state);
        let changes = self.changes.clone();
        let client = self.client.clone();
        let task = match key.0 {
            ObjectKind::ConfigMap => tokio::spawn(run_watch::<ConfigMap>(
                client,
                key,
                state,
                changes,
                Watched::ConfigMap,
            )),
            ObjectKind::Secret => tokio::spawn(run_watch::<Secret>(
                client,
                key,
                state,
                changes,
                Watched::Secret,
            )),
        };
        task.abort_handle()
    }
}

/// The watch of one object until aborted.
async fn run_watch<T>(
    client: Client,
    key: ObjectKey,
    state: Arc<Mutex<State>>,
    changes: mpsc::UnboundedSender<Vec<String>>,
    wrap: fn(T) -> Watched,
) where
    T: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
    T::DynamicType: Default,
{
    let (kind, namespace, name) = &key;
    let api: Api<T> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher::watcher(api, config).default_backoff();
    futures_util::pin_mut!(stream);
    let mut listed: Option<Watched> = None;
    while let Some(event) = stream.next().await {
        let value = match event {
            Ok(Event::Init) => {
                listed = None;
                continue;
            }
            Ok(Event::InitApply(object)) => {
                listed = Some(wrap(object));
                continue;
            }
            Ok(Event::InitDone) => listed.take(),
            Ok(Event::Apply(object)) => Some(wrap(object)),
            Ok(Event::Delete(_)) => None,
            Err(err) => {
                tracing::warn!(?kind, %namespace, %name, %err, "object watch failed; retrying");
                continue;
            }
        };
        let pods = {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            let Some(watch) = state.watches.get_mut(&key) else {
                return;
            };
            let before = watch.value.as_ref().map(|v| {
                v.as_ref()
                    .map(|o| o.resource_version().unwrap_or_default().to_owned())
            });
            let after = value
                .as_ref()
                .map(|o| o.resource_version().unwrap_or_default().to_owned());
            watch.value = Some(value);
            // The first listing of a missing object changes nothing a pod has seen.
            let changed = match before {
                None => after.is_some(),
                Some(before) => before != after,
            };
            changed.then(|| watch.pods.iter().cloned().collect::<Vec<_>>())
        };
        if let Some(pods) = pods {
            tracing::debug!(?kind, %namespace, %name, pods = pods.len(), "watched object changed; resyncing its pods");
            if changes.send(pods).is_err() {
                return;
            }
        }
    }
}

/// The ConfigMaps and Secrets `spec` references in `namespace` (kubelet's
/// `VisitPodConfigmapNames` / `VisitPodSecretNames` for the sources ironlet supports):
/// configMap, secret and projected volumes, `env[].valueFrom`, `envFrom` of every container,
/// init and ephemeral container, and `imagePullSecrets`.
#[must_use]
pub fn referenced_objects(spec: &PodSpec, namespace: &str) -> BTreeSet<ObjectKey> {
    let mut keys = BTreeSet::new();
    let mut add = |kind: ObjectKind, name: &str| {
        if !name.is_empty() {
            keys.insert((kind, namespace.to_owned(), name.to_owned()));
        }
    };
    for volume in spec.volumes.iter().flatten() {
        if let Some(map) = &volume.config_map {
            add(ObjectKind::ConfigMap, &map.name);
        }
        if let Some(name) = volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref())
        {
            add(ObjectKind::Secret, name);
        }
        let sources = volume.projected.as_ref().and_then(|p| p.sources.as_ref());
        for source in sources.into_iter().flatten() {
            if let Some(map) = &source.config_map {
                add(ObjectKind::ConfigMap, &map.name);
            }
            if let Some(secret) = &source.secret {
                add(ObjectKind::Secret, &secret.name);
            }
        }
    }
    let containers = spec.containers.iter().map(|c| (&c.env, &c.env_from));
    let init = spec.init_containers.iter().flatten();
    let ephemeral = spec.ephemeral_containers.iter().flatten();
    let all = containers
        .chain(init.map(|c| (&c.env, &c.env_from)))
        .chain(ephemeral.map(|c| (&c.env, &c.env_from)));
    for (env, env_from) in all {
        for from in env.iter().flatten().filter_map(|e| e.value_from.as_ref()) {
            if let Some(r) = &from.config_map_key_ref {
                add(ObjectKind::ConfigMap, &r.name);
            }
            if let Some(r) = &from.secret_key_ref {
                add(ObjectKind::Secret, &r.name);
            }
        }
        for from in env_from.iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                add(ObjectKind::ConfigMap, &r.name);
            }
            if let Some(r) = &from.secret_ref {
                add(ObjectKind::Secret, &r.name);
            }
        }
    }
    for secret in spec.image_pull_secrets.iter().flatten() {
        add(ObjectKind::Secret, &secret.name);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_reference_is_found_once_in_the_pods_namespace() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "volumes": [
                { "name": "a", "configMap": { "name": "cm-vol" } },
                { "name": "b", "secret": { "secretName": "s-vol" } },
                { "name": "c", "projected": { "sources": [
                    { "configMap": { "name": "cm-proj" } },
                    { "secret": { "name": "s-proj" } },
                    { "serviceAccountToken": { "path": "t" } },
                ] } },
                { "name": "d", "emptyDir": {} },
            ],
            "initContainers": [{ "name": "i", "envFrom": [{ "secretRef": { "name": "s-from" } }] }],
            "containers": [{
                "name": "m",
                "env": [
                    { "name": "X", "valueFrom": { "configMapKeyRef": { "name": "cm-vol", "key": "k" } } },
                    { "name": "Y", "valueFrom": { "secretKeyRef": { "name": "s-env", "key": "k" } } },
                ],
                "envFrom": [{ "configMapRef": { "name": "cm-from" } }],
            }],
            "imagePullSecrets": [{ "name": "pull" }],
        }))
        .unwrap_or_default();
        let found: Vec<(ObjectKind, String)> = referenced_objects(&spec, "ns")
            .into_iter()
            .filter(|(_, ns, _)| ns == "ns")
            .map(|(kind, _, name)| (kind, name))
            .collect();
        use ObjectKind::{ConfigMap as C, Secret as S};
        assert_eq!(
            found,
            [
                (C, "cm-from"),
                (C, "cm-proj"),
                (C, "cm-vol"),
                (S, "pull"),
                (S, "s-env"),
                (S, "s-from"),
                (S, "s-proj"),
                (S, "s-vol"),
            ]
            .map(|(k, n)| (k, n.to_owned()))
        );
    }
}

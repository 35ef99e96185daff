//! Defaulting of pods read from static manifests, in two layers:
//!
//! 1. [`apply_api_defaults`]: what the API server's defaulting would have set and the agent
//!    needs to run the pod — `restartPolicy: Always`, `terminationGracePeriodSeconds: 30`,
//!    `dnsPolicy: ClusterFirst`, `schedulerName`, `enableServiceLinks`; per container
//!    `terminationMessagePath: /dev/termination-log`, `terminationMessagePolicy: File`,
//!    `imagePullPolicy` (`Always` for `:latest` or no tag, else `IfNotPresent`), port
//!    `protocol: TCP`, `hostPort = containerPort` under `hostNetwork`, and unset requests
//!    copied from limits.
//! 2. [`apply_static_defaults`]: kubelet's `applyDefaults` (`pkg/kubelet/config/common.go`) —
//!    a content-derived UID when the manifest has none, the name suffixed `-<node name>`,
//!    namespace `default`, `spec.nodeName`, the `config.hash` annotation, a toleration of every
//!    `NoExecute` taint for file pods, and phase `Pending`.
//!
//! ## Static pod UIDs
//!
//! [`static_pod_uid`] hashes (SHA-256, first 128 bits as 32 hex digits, the length of kubelet's
//! MD5) the decoded manifest's canonical JSON together with the node name and the origin (file
//! path or URL). The same pod text, however formatted, on the same node from the same file
//! always gets the same UID; any change to the pod's content gives a new UID, which the merger
//! reports as REMOVE of the old pod and ADD of the new one — an edited static pod is replaced,
//! not updated in place, exactly as with kubelet.
//!
//! Current behaviour: unlike kubelet, the hash is taken *before* API defaulting, so a new
//! default in a later agent version does not change every static pod's UID (and restart it).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, Toleration};
use sha2::{Digest, Sha256};

use super::annotations::CONFIG_HASH;
use super::error::ManifestOrigin;

/// kubelet's default grace period (`DefaultTerminationGracePeriodSeconds`).
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;
/// Where a container's termination message is read from by default.
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// Fills the API server defaults listed in the module docs; fields already set are kept.
pub fn apply_api_defaults(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds
        .get_or_insert(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.enable_service_links.get_or_insert(true);
    let host_network = spec.host_network == Some(true);
    for container in containers_mut(spec) {
        default_container(container, host_network);
    }
}

fn containers_mut(spec: &mut PodSpec) -> impl Iterator<Item = &mut Container> {
    spec.init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
}

fn default_container(container: &mut Container, host_network: bool) {
    container
        .termination_message_path
        .get_or_insert_with(|| DEFAULT_TERMINATION_MESSAGE_PATH.into());
    container
        .termination_message_policy
        .get_or_insert_with(|| "File".into());
    if container.image_pull_policy.is_none() {
        let image = container.image.as_deref().unwrap_or_default();
        container.image_pull_policy = Some(default_pull_policy(image).into());
    }
    for port in container.ports.iter_mut().flatten() {
        port.protocol.get_or_insert_with(|| "TCP".into());
        if host_network && port.host_port.unwrap_or(0) == 0 {
            port.host_port = Some(port.container_port);
        }
    }
    if let Some(resources) = container.resources.as_mut() {
        if let Some(limits) = resources.limits.as_ref() {
            let requests = resources.requests.get_or_insert_with(BTreeMap::new);
            for (name, limit) in limits {
                requests
                    .entry(name.clone())
                    .or_insert_with(|| limit.clone());
            }
        }
    }
}

/// The API server's image pull policy default: `Always` when the tag is `latest` or absent
/// (and no digest pins the image), `IfNotPresent` otherwise.
#[must_use]
pub fn default_pull_policy(image: &str) -> &'static str {
    let (name, pinned) = match image.split_once('@') {
        Some((name, _digest)) => (name, true),
        None => (image, false),
    };
    let last_component = name.rsplit('/').next().unwrap_or(name);
    match last_component.split_once(':').map(|(_, tag)| tag) {
        Some("latest") => "Always",
        Some(_) => "IfNotPresent",
        None if pinned => "IfNotPresent",
        None => "Always",
    }
}

/// kubelet `generatePodName`: `<name>-<lower-cased node name>`.
#[must_use]
pub fn static_pod_name(name: &str, node_name: &str) -> String {
    format!("{name}-{}", node_name.to_lowercase())
}

/// The UID of a static pod without one; see the module docs.
#[must_use]
pub fn static_pod_uid(decoded: &Pod, origin: &ManifestOrigin, node_name: &str) -> String {
    let mut hasher = Sha256::new();
    // Serializing a Pod cannot fail (every map has string keys); Debug is a stable fallback.
    match serde_json::to_vec(decoded) {
        Ok(json) => hasher.update(json),
        Err(_) => hasher.update(format!("{decoded:?}")),
    }
    hasher.update(format!("host:{node_name}"));
    match origin {
        ManifestOrigin::File(path) => hasher.update(format!("file:{}", path.display())),
        ManifestOrigin::Url(url) => hasher.update(format!("url:{url}")),
    }
    hex::encode(&hasher.finalize()[..16])
}

/// kubelet `applyDefaults` for a pod decoded from `origin`; see the module docs. Call
/// [`apply_api_defaults`] after taking the UID, before this.
pub fn apply_static_defaults(pod: &mut Pod, uid: String, origin: &ManifestOrigin, node_name: &str) {
    let meta = &mut pod.metadata;
    let uid = meta.uid.get_or_insert(uid).clone();
    // An unnamed pod stays unnamed so that validation reports the missing name.
    if let Some(name) = meta.name.as_deref().filter(|n| !n.is_empty()) {
        meta.name = Some(static_pod_name(name, node_name));
    }
    if meta.namespace.as_deref().unwrap_or_default().is_empty() {
        meta.namespace = Some("default".into());
    }
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_HASH.into(), uid);
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    spec.node_name = Some(node_name.to_owned());
    if matches!(origin, ManifestOrigin::File(_)) {
        // Static pods must survive node problems: tolerate every NoExecute taint.
        let tolerate_all = Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Toleration::default()
        };
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        if !tolerations.contains(&tolerate_all) {
            tolerations.push(tolerate_all);
        }
    }
    pod.status.get_or_insert_with(PodStatus::default).phase = Some("Pending".into());
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn file(path: &str) -> ManifestOrigin {
        ManifestOrigin::File(PathBuf::from(path))
    }

    #[test]
    fn pull_policy_defaults_follow_the_tag() {
        assert_eq!(default_pull_policy("nginx"), "Always");
        assert_eq!(default_pull_policy("nginx:latest"), "Always");
        assert_eq!(default_pull_policy("localhost:5000/nginx"), "Always");
        assert_eq!(default_pull_policy("nginx:1.27"), "IfNotPresent");
        assert_eq!(
            default_pull_policy("localhost:5000/nginx:1.27"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("nginx@sha256:abcd"), "IfNotPresent");
        assert_eq!(default_pull_policy("nginx:latest@sha256:abcd"), "Always");
    }

    #[test]
    fn api_defaults_fill_what_running_a_pod_needs_and_keep_what_is_set() {
        let mut p = pod(r#"
spec:
  hostNetwork: true
  dnsPolicy: Default
  initContainers: [{name: i, image: busybox:1.36}]
  containers:
  - name: c
    image: busybox
    ports: [{containerPort: 53, protocol: UDP}, {containerPort: 80}]
    resources: {limits: {cpu: 1}, requests: {memory: 1Mi}}
"#);
        apply_api_defaults(&mut p);
        let spec = p.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.dns_policy.as_deref(), Some("Default"));
        let init = &spec.init_containers.unwrap()[0];
        assert_eq!(init.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            init.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        let c = &spec.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
        let ports = c.ports.as_ref().unwrap();
        assert_eq!(
            (ports[0].protocol.as_deref(), ports[0].host_port),
            (Some("UDP"), Some(53))
        );
        assert_eq!(
            (ports[1].protocol.as_deref(), ports[1].host_port),
            (Some("TCP"), Some(80))
        );
        let requests = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
        assert_eq!(requests["cpu"].0, "1");
        assert_eq!(requests["memory"].0, "1Mi");
    }

    #[test]
    fn static_defaults_name_place_and_annotate_the_pod() {
        let mut p = pod("metadata: {name: etcd}\nspec: {containers: [{name: c, image: i}]}\n");
        let origin = file("/etc/kubernetes/manifests/etcd.yaml");
        let uid = static_pod_uid(&p, &origin, "Node-1");
        apply_static_defaults(&mut p, uid.clone(), &origin, "Node-1");
        assert_eq!(p.metadata.name.as_deref(), Some("etcd-node-1"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(p.metadata.uid.as_deref(), Some(uid.as_str()));
        assert_eq!(p.metadata.annotations.as_ref().unwrap()[CONFIG_HASH], uid);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        let tolerations = spec.tolerations.as_ref().unwrap();
        assert_eq!(tolerations.len(), 1);
        assert_eq!(tolerations[0].effect.as_deref(), Some("NoExecute"));
        assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn an_explicit_uid_and_namespace_are_kept_and_the_toleration_is_not_duplicated() {
        let mut p = pod("metadata: {name: a, namespace: kube-system, uid: fixed}\nspec:\n  tolerations: [{operator: Exists, effect: NoExecute}]\n  containers: [{name: c, image: i}]\n");
        let origin = file("/m/a.yaml");
        apply_static_defaults(&mut p, "ignored".into(), &origin, "n");
        assert_eq!(p.metadata.uid.as_deref(), Some("fixed"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("kube-system"));
        assert_eq!(p.spec.unwrap().tolerations.unwrap().len(), 1);
    }

    #[test]
    fn http_pods_get_no_toleration_like_kubelet() {
        let mut p = pod("metadata: {name: a}\nspec: {containers: [{name: c, image: i}]}\n");
        apply_static_defaults(
            &mut p,
            "u".into(),
            &ManifestOrigin::Url("http://x/".into()),
            "n",
        );
        assert_eq!(p.spec.unwrap().tolerations, None);
    }

    #[test]
    fn the_static_uid_depends_on_content_node_and_origin_but_not_formatting() {
        let a = pod("metadata: {name: a}\nspec: {containers: [{name: c, image: 'i:1'}]}\n");
        let reformatted = pod("# a comment\nspec:\n  containers:\n    - image: \"i:1\"\n      name: c\nmetadata:\n  name: a\n");
        let origin = file("/m/a.yaml");
        let uid = static_pod_uid(&a, &origin, "n1");
        assert_eq!(uid.len(), 32);
        assert_eq!(uid, static_pod_uid(&reformatted, &origin, "n1"));
        assert_eq!(uid, static_pod_uid(&a.clone(), &origin, "n1"));
        assert_ne!(uid, static_pod_uid(&a, &origin, "n2"));
        assert_ne!(uid, static_pod_uid(&a, &file("/m/b.yaml"), "n1"));
        assert_ne!(
            uid,
            static_pod_uid(&a, &ManifestOrigin::Url("/m/a.yaml".into()), "n1")
        );
        let edited = pod("metadata: {name: a}\nspec: {containers: [{name: c, image: 'i:2'}]}\n");
        assert_ne!(uid, static_pod_uid(&edited, &origin, "n1"));
    }
}

//! [`PodManager`]: the desired pods of this node, indexed for the sync loop and the HTTP
//! server, with the mapping between static pods and their mirror pods — kubelet's
//! `basicManager` (`pkg/kubelet/pod/pod_manager.go`).
//!
//! Pods come from config updates (file, HTTP, API). A *static* pod comes from a file or URL;
//! the API server does not know it, so the agent creates a *mirror* pod there (same full name
//! `name_namespace`, its own UID, annotation `kubernetes.io/config.mirror` = the static pod's
//! `config.hash`) to publish its status. This manager keeps:
//!
//! ```text
//!   regular pods: by UID, by full name        mirror pods: by UID, by full name
//!                    ▲                                         │
//!                    └──── mirror UID → static UID (same full name) ◄─┘
//! ```
//!
//! Guarantees: every lookup by UID accepts a mirror pod's UID too once translated with
//! [`PodManager::translate_pod_uid`]; removing a pod removes it from every index and
//! translation; a stale full-name entry never removes a newer pod of the same name.
//!
//! The manager is a plain value: the owner (the sync loop) mutates it; share it behind a lock
//! if other tasks read it. Pods are held as `Arc<Pod>` so lookups are cheap to hand out.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::config::{
    annotation, is_mirror_pod, pod_full_name, pod_uid, CONFIG_HASH, CONFIG_MIRROR,
};

pub use crate::config::is_static_pod;

/// The node's desired pods and the static ↔ mirror mapping.
#[derive(Debug, Default, Clone)]
pub struct PodManager {
    pod_by_uid: HashMap<String, Arc<Pod>>,
    pod_by_full_name: HashMap<String, Arc<Pod>>,
    mirror_by_uid: HashMap<String, Arc<Pod>>,
    mirror_by_full_name: HashMap<String, Arc<Pod>>,
    /// Mirror pod UID → static pod UID.
    translation: HashMap<String, String>,
}

impl PodManager {
    /// An empty manager.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces every pod (regular and mirror) with `pods`.
    pub fn set_pods(&mut self, pods: impl IntoIterator<Item = Pod>) {
        *self = Self::default();
        for pod in pods {
            self.add_pod(pod);
        }
    }

    /// Adds or replaces `pod` (a regular pod or a mirror pod).
    pub fn add_pod(&mut self, pod: impl Into<Arc<Pod>>) {
        let pod = pod.into();
        let uid = pod_uid(&pod).to_owned();
        let full_name = pod_full_name(&pod);
        if is_mirror_pod(&pod) {
            if let Some(static_pod) = self.pod_by_full_name.get(&full_name) {
                self.translation
                    .insert(uid.clone(), pod_uid(static_pod).to_owned());
            }
            self.mirror_by_full_name.insert(full_name, Arc::clone(&pod));
            self.mirror_by_uid.insert(uid, pod);
        } else {
            if let Some(mirror) = self.mirror_by_full_name.get(&full_name) {
                self.translation
                    .insert(pod_uid(mirror).to_owned(), uid.clone());
            }
            if let Some(previous) = self.pod_by_full_name.insert(full_name, Arc::clone(&pod)) {
                let previous_uid = pod_uid(&previous);
                if previous_uid != uid {
                    // The name moved to a new UID (an edited static pod): the old UID's entry is
                    // stale.
                    self.pod_by_uid.remove(previous_uid);
                }
            }
            self.pod_by_uid.insert(uid, pod);
        }
    }

    /// Same as [`Self::add_pod`]: the indexes are keyed by UID and full name, so an update
    /// replaces.
    pub fn update_pod(&mut self, pod: impl Into<Arc<Pod>>) {
        self.add_pod(pod);
    }

    /// Removes `pod` from every index. For a mirror pod this drops the mirror mapping; for a
    /// regular pod, the pod and any translation to it.
    pub fn remove_pod(&mut self, pod: &Pod) {
        let uid = pod_uid(pod);
        let full_name = pod_full_name(pod);
        if is_mirror_pod(pod) {
            self.mirror_by_uid.remove(uid);
            remove_if_uid(&mut self.mirror_by_full_name, &full_name, uid);
            self.translation.remove(uid);
        } else {
            self.pod_by_uid.remove(uid);
            remove_if_uid(&mut self.pod_by_full_name, &full_name, uid);
            self.translation.retain(|_, static_uid| static_uid != uid);
        }
    }

    /// The regular (non-mirror) pods.
    #[must_use]
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pod_by_uid.values().cloned().collect()
    }

    /// The regular pods and the mirror pods.
    #[must_use]
    pub fn pods_and_mirror_pods(&self) -> (Vec<Arc<Pod>>, Vec<Arc<Pod>>) {
        (self.pods(), self.mirror_by_uid.values().cloned().collect())
    }

    /// The regular pod with this UID.
    #[must_use]
    pub fn pod_by_uid(&self, uid: &str) -> Option<Arc<Pod>> {
        self.pod_by_uid.get(uid).cloned()
    }

    /// The regular pod with this full name (`name_namespace`).
    #[must_use]
    pub fn pod_by_full_name(&self, full_name: &str) -> Option<Arc<Pod>> {
        self.pod_by_full_name.get(full_name).cloned()
    }

    /// The regular pod named `name` in `namespace`.
    #[must_use]
    pub fn pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pod_by_full_name(&format!("{name}_{namespace}"))
    }

    /// The static pod a mirror pod stands for.
    #[must_use]
    pub fn pod_by_mirror_pod(&self, mirror: &Pod) -> Option<Arc<Pod>> {
        self.pod_by_full_name(&pod_full_name(mirror))
    }

    /// The mirror pod of a static pod.
    #[must_use]
    pub fn mirror_pod_by_pod(&self, pod: &Pod) -> Option<Arc<Pod>> {
        self.mirror_by_full_name.get(&pod_full_name(pod)).cloned()
    }

    /// kubelet `GetPodAndMirrorPod`: for a mirror pod, its static pod and itself (`was_mirror`
    /// true); for any other pod, itself and its mirror pod if one is known.
    #[must_use]
    pub fn pod_and_mirror_pod(&self, pod: &Pod) -> PodAndMirror {
        let full_name = pod_full_name(pod);
        if is_mirror_pod(pod) {
            PodAndMirror {
                pod: self.pod_by_full_name.get(&full_name).cloned(),
                mirror: Some(Arc::new(pod.clone())),
                was_mirror: true,
            }
        } else {
            PodAndMirror {
                pod: Some(Arc::new(pod.clone())),
                mirror: self.mirror_by_full_name.get(&full_name).cloned(),
                was_mirror: false,
            }
        }
    }

    /// kubelet `TranslatePodUID`: a mirror pod's UID becomes its static pod's; any other UID
    /// is returned as is.
    #[must_use]
    pub fn translate_pod_uid<'a>(&'a self, uid: &'a str) -> &'a str {
        self.translation.get(uid).map_or(uid, String::as_str)
    }

    /// `(static → mirror, mirror → static)` UID maps.
    #[must_use]
    pub fn uid_translations(&self) -> (HashMap<String, String>, HashMap<String, String>) {
        let pod_to_mirror = self
            .translation
            .iter()
            .map(|(mirror, static_uid)| (static_uid.clone(), mirror.clone()))
            .collect();
        (pod_to_mirror, self.translation.clone())
    }

    /// kubelet `GetOrphanedMirrorPodNames`: full names of mirror pods whose static pod is gone.
    #[must_use]
    pub fn orphaned_mirror_pod_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .mirror_by_full_name
            .keys()
            .filter(|name| !self.pod_by_full_name.contains_key(*name))
            .cloned()
            .collect();
        names.sort();
        names
    }
}

/// A pod and its mirror, as [`PodManager::pod_and_mirror_pod`] finds them.
#[derive(Debug, Clone, PartialEq)]
pub struct PodAndMirror {
    /// The regular (static or API) pod, if known.
    pub pod: Option<Arc<Pod>>,
    /// The mirror pod, if known.
    pub mirror: Option<Arc<Pod>>,
    /// Whether the pod asked about was the mirror.
    pub was_mirror: bool,
}

fn remove_if_uid(index: &mut HashMap<String, Arc<Pod>>, full_name: &str, uid: &str) {
    if index.get(full_name).is_some_and(|p| pod_uid(p) == uid) {
        index.remove(full_name);
    }
}

/// kubelet `IsMirrorPodOf`: `mirror` has `pod`'s name and namespace, and its
/// `config.mirror` annotation equals `pod`'s `config.hash` — i.e. it mirrors this very version
/// of the static pod.
#[must_use]
pub fn is_mirror_pod_of(mirror: &Pod, pod: &Pod) -> bool {
    if mirror.metadata.name != pod.metadata.name
        || mirror.metadata.namespace != pod.metadata.namespace
    {
        return false;
    }
    match (
        annotation(mirror, CONFIG_MIRROR),
        annotation(pod, CONFIG_HASH),
    ) {
        (Some(mirror_hash), Some(hash)) => mirror_hash == hash,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::config::CONFIG_SOURCE;

    fn pod(name: &str, uid: &str, annotations: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("kube-system".into()),
                uid: Some(uid.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn static_pod(uid: &str) -> Pod {
        pod(
            "etcd-n1",
            uid,
            &[(CONFIG_SOURCE, "file"), (CONFIG_HASH, uid)],
        )
    }

    fn mirror_pod(uid: &str, of: &str) -> Pod {
        pod(
            "etcd-n1",
            uid,
            &[(CONFIG_SOURCE, "api"), (CONFIG_MIRROR, of)],
        )
    }

    #[test]
    fn pods_are_found_by_uid_full_name_and_name() {
        let mut m = PodManager::new();
        m.add_pod(static_pod("s1"));
        assert!(m.pod_by_uid("s1").is_some());
        assert!(m.pod_by_full_name("etcd-n1_kube-system").is_some());
        assert!(m.pod_by_name("kube-system", "etcd-n1").is_some());
        assert_eq!(m.pods().len(), 1);
        assert!(is_static_pod(&m.pods()[0]));
    }

    #[test]
    fn a_mirror_pod_uid_translates_to_its_static_pod_in_either_arrival_order() {
        for mirror_first in [false, true] {
            let mut m = PodManager::new();
            if mirror_first {
                m.add_pod(mirror_pod("m1", "s1"));
                m.add_pod(static_pod("s1"));
            } else {
                m.add_pod(static_pod("s1"));
                m.add_pod(mirror_pod("m1", "s1"));
            }
            assert_eq!(m.translate_pod_uid("m1"), "s1");
            assert_eq!(m.translate_pod_uid("s1"), "s1");
            assert_eq!(m.translate_pod_uid("other"), "other");
            let (to_mirror, to_static) = m.uid_translations();
            assert_eq!(to_mirror["s1"], "m1");
            assert_eq!(to_static["m1"], "s1");
            assert_eq!(m.pods().len(), 1, "mirror pods are not regular pods");
        }
    }

    #[test]
    fn pod_and_mirror_pod_resolves_from_either_side() {
        let mut m = PodManager::new();
        let s = static_pod("s1");
        let mirror = mirror_pod("m1", "s1");
        m.add_pod(s.clone());
        m.add_pod(mirror.clone());
        let from_static = m.pod_and_mirror_pod(&s);
        assert!(!from_static.was_mirror);
        assert_eq!(from_static.mirror.as_deref(), Some(&mirror));
        let from_mirror = m.pod_and_mirror_pod(&mirror);
        assert!(from_mirror.was_mirror);
        assert_eq!(from_mirror.pod.as_deref(), Some(&s));
        assert_eq!(m.pod_by_mirror_pod(&mirror).as_deref(), Some(&s));
        assert_eq!(m.mirror_pod_by_pod(&s).as_deref(), Some(&mirror));
    }

    #[test]
    fn a_mirror_pod_without_its_static_pod_is_orphaned() {
        let mut m = PodManager::new();
        m.add_pod(static_pod("s1"));
        m.add_pod(mirror_pod("m1", "s1"));
        assert!(m.orphaned_mirror_pod_names().is_empty());
        m.remove_pod(&static_pod("s1"));
        assert_eq!(m.orphaned_mirror_pod_names(), ["etcd-n1_kube-system"]);
        assert_eq!(
            m.translate_pod_uid("m1"),
            "m1",
            "no translation to a removed pod"
        );
        m.remove_pod(&mirror_pod("m1", "s1"));
        assert!(m.orphaned_mirror_pod_names().is_empty());
        assert_eq!(m.pods_and_mirror_pods(), (vec![], vec![]));
    }

    #[test]
    fn is_mirror_pod_of_compares_the_mirror_annotation_with_the_config_hash() {
        let s = static_pod("s1");
        assert!(is_mirror_pod_of(&mirror_pod("m1", "s1"), &s));
        assert!(
            !is_mirror_pod_of(&mirror_pod("m1", "s0"), &s),
            "mirror of an older version"
        );
        let mut renamed = mirror_pod("m1", "s1");
        renamed.metadata.name = Some("other".into());
        assert!(!is_mirror_pod_of(&renamed, &s));
        assert!(!is_mirror_pod_of(&pod("etcd-n1", "m1", &[]), &s));
    }

    #[test]
    fn a_static_pod_replaced_under_a_new_uid_leaves_no_stale_entries() {
        let mut m = PodManager::new();
        m.add_pod(static_pod("old"));
        m.add_pod(mirror_pod("m1", "old"));
        m.add_pod(static_pod("new"));
        assert!(m.pod_by_uid("old").is_none());
        assert_eq!(m.translate_pod_uid("m1"), "new");
        // A late REMOVE of the old version must not drop the new one.
        m.remove_pod(&static_pod("old"));
        assert_eq!(
            m.pod_by_full_name("etcd-n1_kube-system")
                .map(|p| pod_uid(&p).to_owned()),
            Some("new".into())
        );
        assert_eq!(m.pods().len(), 1);
    }

    #[test]
    fn set_pods_replaces_everything() {
        let mut m = PodManager::new();
        m.add_pod(static_pod("s1"));
        m.set_pods([pod("web", "w1", &[(CONFIG_SOURCE, "api")])]);
        assert!(m.pod_by_uid("s1").is_none());
        assert!(m.pod_by_uid("w1").is_some());
        assert!(!is_static_pod(&m.pods()[0]));
    }
}

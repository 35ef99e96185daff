//! The merger's state and its one pure operation, [`PodStorage::merge`]: a source's change in,
//! per-pod operations out — kubelet's `podStorage.merge` (`pkg/kubelet/config/config.go`).
//!
//! For each source the storage keeps the pods it last accepted, by UID. Given a change:
//!
//! | incoming pod vs stored pod (same UID)                  | result                     |
//! |--------------------------------------------------------|----------------------------|
//! | not stored                                             | `ADD` (stamped `config.seen`) |
//! | spec, labels, non-local annotations or deletion fields differ, no `deletionTimestamp` | `UPDATE` |
//! | the same, but now with a `deletionTimestamp`           | `DELETE`                   |
//! | only `status` differs                                  | `RECONCILE`                |
//! | identical up to status-less metadata and local annotations | nothing (deduplicated) |
//! | stored, missing from a `Set` or named by a `Remove`    | `REMOVE`                   |
//!
//! Local annotations (`config.source`, `config.seen`, `config.mirror`) never cause an update;
//! `config.seen` keeps the value of the first sighting.
//!
//! Invalid pods (see `validate`) are skipped with a warning. Two pods with the same full name
//! (`name_namespace`) are never both accepted, within or across sources: the one accepted first
//! wins, the other is logged and *shadowed* — kept aside and added as soon as the name is free
//! again. Mirror pods are exempt: they share their static pod's full name by design.
//!
//! Updates come out in kubelet's order — REMOVE, ADD, UPDATE, DELETE, then RECONCILE — so a
//! static pod replaced under a new UID is removed before its successor is added. A source's
//! first `Set` that adds, updates and deletes nothing produces an empty ADD, which tells the
//! sync loop that the source has been seen.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

use super::annotations::{
    is_mirror_pod, pod_full_name, pod_uid, CONFIG_SEEN, CONFIG_SOURCE, LOCAL_ANNOTATIONS,
};
use super::update::{ConfigSource, PodOp, PodUpdate, SourceChange};
use super::validate::{validate_api_pod, validate_pod};

/// Pods by UID.
type PodMap = BTreeMap<String, Pod>;

/// Per-source accepted pods, shadowed duplicates, and which sources sent a complete set.
#[derive(Debug, Default)]
pub(crate) struct PodStorage {
    pods: BTreeMap<ConfigSource, PodMap>,
    shadowed: BTreeMap<ConfigSource, PodMap>,
    seen: BTreeSet<ConfigSource>,
}

/// What one merge produced.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct MergeOutcome {
    /// Non-empty updates in delivery order (plus the readiness ADD, which may be empty).
    pub updates: Vec<PodUpdate>,
    /// Whether this change was the source's first complete set.
    pub first_set: bool,
}

/// Pods per operation for one source, in kubelet's delivery order.
#[derive(Debug, Default)]
struct Ops {
    remove: Vec<Pod>,
    add: Vec<Pod>,
    update: Vec<Pod>,
    delete: Vec<Pod>,
    reconcile: Vec<Pod>,
}

impl Ops {
    fn push(&mut self, op: PodOp, pod: Pod) {
        match op {
            PodOp::Remove => self.remove.push(pod),
            PodOp::Add => self.add.push(pod),
            PodOp::Update => self.update.push(pod),
            PodOp::Delete => self.delete.push(pod),
            PodOp::Reconcile => self.reconcile.push(pod),
        }
    }

    fn into_updates(self, source: ConfigSource, first_set: bool) -> Vec<PodUpdate> {
        let signal_ready =
            first_set && self.add.is_empty() && self.update.is_empty() && self.delete.is_empty();
        let mut out = Vec::new();
        let mut emit = |op, pods: Vec<Pod>, always: bool| {
            if always || !pods.is_empty() {
                out.push(PodUpdate { op, pods, source });
            }
        };
        emit(PodOp::Remove, self.remove, false);
        emit(PodOp::Add, self.add, signal_ready);
        emit(PodOp::Update, self.update, false);
        emit(PodOp::Delete, self.delete, false);
        emit(PodOp::Reconcile, self.reconcile, false);
        out
    }
}

impl PodStorage {
    /// Applies `change` from `source`; `now` is the `config.seen` stamp for pods added now.
    pub(crate) fn merge(
        &mut self,
        source: ConfigSource,
        change: SourceChange,
        now: &str,
    ) -> MergeOutcome {
        let mut ops = Ops::default();
        let mut first_set = false;
        match change {
            SourceChange::Set(pods) => {
                first_set = self.seen.insert(source);
                tracing::debug!(%source, pods = pods.len(), "setting pods for source");
                let previous = self.pods.remove(&source).unwrap_or_default();
                self.shadowed.remove(&source);
                self.pods.insert(source, PodMap::new());
                for pod in pods {
                    let old = previous.get(pod_uid(&pod));
                    self.upsert(source, pod, old, &mut ops, now);
                }
                let current = self.pods.get(&source);
                for (uid, pod) in previous {
                    if current.is_none_or(|c| !c.contains_key(&uid)) {
                        ops.remove.push(pod);
                    }
                }
            }
            SourceChange::Upsert(pods) => {
                for pod in pods {
                    let old = self
                        .pods
                        .get(&source)
                        .and_then(|m| m.get(pod_uid(&pod)))
                        .cloned();
                    self.upsert(source, pod, old.as_ref(), &mut ops, now);
                }
            }
            SourceChange::Remove(pods) => {
                for pod in pods {
                    let uid = pod_uid(&pod);
                    if let Some(shadow) = self.shadowed.get_mut(&source) {
                        shadow.remove(uid);
                    }
                    if let Some(old) = self.pods.get_mut(&source).and_then(|m| m.remove(uid)) {
                        ops.remove.push(old);
                    }
                }
            }
        }
        let freed_names = !ops.remove.is_empty();
        let mut updates = ops.into_updates(source, first_set);
        if freed_names {
            updates.extend(self.promote_shadowed(now));
        }
        MergeOutcome { updates, first_set }
    }

    /// Accepts one incoming pod of `source`, comparing it with `old`, the source's pod of the
    /// same UID before this change.
    fn upsert(
        &mut self,
        source: ConfigSource,
        mut pod: Pod,
        old: Option<&Pod>,
        ops: &mut Ops,
        now: &str,
    ) {
        // The API server validated an API pod when it admitted it; the agent's own rules are
        // for static pods (kubelet runs ValidatePodCreate on those only) and must never drop a
        // pod the cluster considers valid.
        let checked = match source {
            ConfigSource::Api => validate_api_pod(&pod),
            ConfigSource::File | ConfigSource::Http => validate_pod(&pod),
        };
        if let Err(errors) = checked {
            tracing::warn!(
                %source,
                pod = %pod_full_name(&pod),
                reason = %errors,
                "skipping invalid pod",
            );
            return;
        }
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(CONFIG_SOURCE.into(), source.as_str().into());
        let uid = pod_uid(&pod).to_owned();
        if let Some(owner) = self.name_owner(&pod) {
            tracing::warn!(
                %source,
                pod = %pod_full_name(&pod),
                pod_uid = %uid,
                owner_source = %owner.0,
                owner_uid = %owner.1,
                "skipping pod: another pod already has this name"
            );
            self.shadowed.entry(source).or_default().insert(uid, pod);
            return;
        }
        if let Some(shadow) = self.shadowed.get_mut(&source) {
            shadow.remove(&uid);
        }
        let op = match old {
            None => {
                stamp_seen(&mut pod, now);
                Some(PodOp::Add)
            }
            Some(old) => {
                keep_seen(old, &mut pod);
                compare(old, &pod)
            }
        };
        if let Some(op) = op {
            ops.push(op, pod.clone());
        }
        self.pods.entry(source).or_default().insert(uid, pod);
    }

    /// The `(source, uid)` of an accepted pod other than `pod` holding `pod`'s full name.
    fn name_owner(&self, pod: &Pod) -> Option<(ConfigSource, String)> {
        if is_mirror_pod(pod) {
            return None;
        }
        let uid = pod_uid(pod);
        // Compared field by field: formatting every pod's full name cost an allocation per
        // pod on each update (every status echo of every pod).
        fn name_of(p: &Pod) -> (&str, &str) {
            (
                p.metadata.name.as_deref().unwrap_or_default(),
                p.metadata.namespace.as_deref().unwrap_or_default(),
            )
        }
        let name = name_of(pod);
        self.pods.iter().find_map(|(source, pods)| {
            pods.values()
                .find(|p| name_of(p) == name && pod_uid(p) != uid && !is_mirror_pod(p))
                .map(|p| (*source, pod_uid(p).to_owned()))
        })
    }

    /// Adds shadowed pods whose name has become free.
    fn promote_shadowed(&mut self, now: &str) -> Vec<PodUpdate> {
        let candidates: Vec<(ConfigSource, Pod)> = self
            .shadowed
            .iter()
            .flat_map(|(source, pods)| pods.values().map(|p| (*source, p.clone())))
            .collect();
        let mut added: BTreeMap<ConfigSource, Vec<Pod>> = BTreeMap::new();
        for (source, mut pod) in candidates {
            if self.name_owner(&pod).is_some() {
                continue;
            }
            let uid = pod_uid(&pod).to_owned();
            if let Some(shadow) = self.shadowed.get_mut(&source) {
                shadow.remove(&uid);
            }
            tracing::info!(%source, pod = %pod_full_name(&pod), "name freed: adding shadowed pod");
            stamp_seen(&mut pod, now);
            self.pods
                .entry(source)
                .or_default()
                .insert(uid, pod.clone());
            added.entry(source).or_default().push(pod);
        }
        added
            .into_iter()
            .map(|(source, pods)| PodUpdate {
                op: PodOp::Add,
                pods,
                source,
            })
            .collect()
    }

    /// Whether every source in `expected` has sent a complete set.
    #[cfg(test)]
    pub(crate) fn seen_all(&self, expected: &BTreeSet<ConfigSource>) -> bool {
        expected.is_subset(&self.seen)
    }
}

fn stamp_seen(pod: &mut Pod, now: &str) {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_SEEN.into(), now.into());
}

fn keep_seen(old: &Pod, new: &mut Pod) {
    let seen = old
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SEEN));
    let annotations = new.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match seen {
        Some(seen) => annotations.insert(CONFIG_SEEN.into(), seen.clone()),
        None => annotations.remove(CONFIG_SEEN),
    };
}

/// kubelet `checkAndUpdatePod`: the operation a changed pod needs, if any.
fn compare(old: &Pod, new: &Pod) -> Option<PodOp> {
    if differs_semantically(old, new) {
        if new.metadata.deletion_timestamp.is_some() {
            Some(PodOp::Delete)
        } else {
            Some(PodOp::Update)
        }
    } else if old.status != new.status {
        Some(PodOp::Reconcile)
    } else {
        None
    }
}

/// kubelet `podsDifferSemantically`.
fn differs_semantically(old: &Pod, new: &Pod) -> bool {
    let (a, b) = (&old.metadata, &new.metadata);
    old.spec != new.spec
        || non_empty(a.labels.as_ref()) != non_empty(b.labels.as_ref())
        || a.deletion_timestamp != b.deletion_timestamp
        || a.deletion_grace_period_seconds != b.deletion_grace_period_seconds
        || shared_annotations(old) != shared_annotations(new)
}

fn non_empty(map: Option<&BTreeMap<String, String>>) -> Option<&BTreeMap<String, String>> {
    map.filter(|m| !m.is_empty())
}

/// Annotations other than the agent's local ones.
fn shared_annotations(pod: &Pod) -> BTreeMap<&str, &str> {
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !LOCAL_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::config::annotations::{annotation, CONFIG_MIRROR};

    const T0: &str = "2025-01-01T00:00:00Z";
    const T1: &str = "2025-01-01T00:00:01Z";

    fn pod(name: &str, uid: &str, image: &str) -> Pod {
        let mut pod: Pod = serde_yaml::from_str(&format!(
            "metadata: {{name: {name}, namespace: default, uid: {uid}}}\nspec: {{containers: [{{name: c, image: '{image}'}}]}}\n"
        ))
        .unwrap();
        pod.status = Some(PodStatus::default());
        pod
    }

    fn summary(outcome: &MergeOutcome) -> Vec<(PodOp, ConfigSource, Vec<String>)> {
        outcome
            .updates
            .iter()
            .map(|u| {
                let uids = u.pods.iter().map(|p| pod_uid(p).to_owned()).collect();
                (u.op, u.source, uids)
            })
            .collect()
    }

    use ConfigSource::{Api, File, Http};
    use PodOp::{Add, Delete, Reconcile, Remove, Update};

    fn ids(uids: &[&str]) -> Vec<String> {
        uids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_pod_goes_through_add_update_reconcile_and_remove() {
        let mut s = PodStorage::default();
        let v1 = pod("web", "u1", "nginx:1");
        let out = s.merge(Api, SourceChange::Set(vec![v1.clone()]), T0);
        assert_eq!(summary(&out), [(Add, Api, ids(&["u1"]))]);
        assert!(out.first_set);
        let added = &out.updates[0].pods[0];
        assert_eq!(annotation(added, CONFIG_SOURCE), Some("api"));
        assert_eq!(annotation(added, CONFIG_SEEN), Some(T0));

        let v2 = pod("web", "u1", "nginx:2");
        let out = s.merge(Api, SourceChange::Upsert(vec![v2.clone()]), T1);
        assert_eq!(summary(&out), [(Update, Api, ids(&["u1"]))]);
        assert_eq!(annotation(&out.updates[0].pods[0], CONFIG_SEEN), Some(T0));
        assert!(!out.first_set);

        let mut v3 = v2.clone();
        v3.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..PodStatus::default()
        });
        let out = s.merge(Api, SourceChange::Set(vec![v3.clone()]), T1);
        assert_eq!(summary(&out), [(Reconcile, Api, ids(&["u1"]))]);

        let out = s.merge(Api, SourceChange::Set(vec![]), T1);
        assert_eq!(summary(&out), [(Remove, Api, ids(&["u1"]))]);
    }

    #[test]
    fn identical_resends_produce_nothing() {
        let mut s = PodStorage::default();
        let p = pod("web", "u1", "nginx:1");
        s.merge(File, SourceChange::Set(vec![p.clone()]), T0);
        assert_eq!(
            s.merge(File, SourceChange::Set(vec![p.clone()]), T1),
            MergeOutcome::default()
        );
        assert_eq!(
            s.merge(File, SourceChange::Upsert(vec![p]), T1),
            MergeOutcome::default()
        );
    }

    #[test]
    fn local_annotations_and_resource_version_do_not_cause_updates() {
        let mut s = PodStorage::default();
        let p = pod("web", "u1", "nginx:1");
        s.merge(Api, SourceChange::Set(vec![p.clone()]), T0);
        let mut q = p.clone();
        q.metadata.resource_version = Some("42".into());
        q.metadata.annotations = Some(
            [(CONFIG_SEEN.to_owned(), "yesterday".to_owned())]
                .into_iter()
                .collect(),
        );
        assert_eq!(s.merge(Api, SourceChange::Upsert(vec![q]), T1).updates, []);
    }

    #[test]
    fn label_and_annotation_changes_are_updates() {
        let mut s = PodStorage::default();
        let p = pod("web", "u1", "nginx:1");
        s.merge(Api, SourceChange::Set(vec![p.clone()]), T0);
        let mut labelled = p.clone();
        labelled.metadata.labels =
            Some([("app".to_owned(), "web".to_owned())].into_iter().collect());
        let out = s.merge(Api, SourceChange::Upsert(vec![labelled.clone()]), T1);
        assert_eq!(summary(&out), [(Update, Api, ids(&["u1"]))]);
        let mut annotated = labelled;
        annotated.metadata.annotations =
            Some([("team".to_owned(), "a".to_owned())].into_iter().collect());
        let out = s.merge(Api, SourceChange::Upsert(vec![annotated]), T1);
        assert_eq!(summary(&out), [(Update, Api, ids(&["u1"]))]);
    }

    #[test]
    fn a_deletion_timestamp_is_a_graceful_delete() {
        let mut s = PodStorage::default();
        let p = pod("web", "u1", "nginx:1");
        s.merge(Api, SourceChange::Set(vec![p.clone()]), T0);
        let mut deleting = p;
        deleting.metadata.deletion_timestamp = Some(Time("2025-01-01T00:00:05Z".parse().unwrap()));
        deleting.metadata.deletion_grace_period_seconds = Some(30);
        let out = s.merge(Api, SourceChange::Upsert(vec![deleting]), T1);
        assert_eq!(summary(&out), [(Delete, Api, ids(&["u1"]))]);
    }

    #[test]
    fn a_new_uid_under_the_same_name_is_removed_then_added() {
        let mut s = PodStorage::default();
        s.merge(
            File,
            SourceChange::Set(vec![pod("etcd", "old", "etcd:1")]),
            T0,
        );
        let out = s.merge(
            File,
            SourceChange::Set(vec![pod("etcd", "new", "etcd:2")]),
            T1,
        );
        assert_eq!(
            summary(&out),
            [(Remove, File, ids(&["old"])), (Add, File, ids(&["new"]))]
        );
    }

    #[test]
    fn the_first_empty_set_of_a_source_signals_it_with_an_empty_add() {
        let mut s = PodStorage::default();
        let out = s.merge(Http, SourceChange::Set(vec![]), T0);
        assert_eq!(summary(&out), [(Add, Http, vec![])]);
        assert!(out.first_set);
        assert!(s.seen_all(&[Http].into_iter().collect()));
        assert!(!s.seen_all(&[Http, File].into_iter().collect()));
        assert_eq!(
            s.merge(Http, SourceChange::Set(vec![]), T0),
            MergeOutcome::default()
        );
    }

    #[test]
    fn upserts_do_not_mark_a_source_seen() {
        let mut s = PodStorage::default();
        let out = s.merge(Api, SourceChange::Upsert(vec![pod("a", "u1", "i")]), T0);
        assert!(!out.first_set);
        assert!(!s.seen_all(&[Api].into_iter().collect()));
    }

    #[test]
    fn remove_drops_only_known_pods() {
        let mut s = PodStorage::default();
        s.merge(
            Api,
            SourceChange::Set(vec![pod("a", "u1", "i"), pod("b", "u2", "i")]),
            T0,
        );
        let out = s.merge(
            Api,
            SourceChange::Remove(vec![pod("b", "u2", "i"), pod("z", "u9", "i")]),
            T1,
        );
        assert_eq!(summary(&out), [(Remove, Api, ids(&["u2"]))]);
    }

    #[test]
    fn an_api_pod_is_not_dropped_by_static_pod_rules() {
        let mut s = PodStorage::default();
        // 69 characters: a valid DNS-1123 subdomain the API server admits.
        let name = format!(
            "pod-update-activedeadlineseconds-{}",
            "0123456789ab".repeat(3)
        );
        let out = s.merge(Api, SourceChange::Set(vec![pod(&name, "u1", "i")]), T0);
        assert_eq!(summary(&out), [(Add, Api, ids(&["u1"]))]);
        let out = s.merge(
            File,
            SourceChange::Set(vec![pod(&"a".repeat(254), "f1", "i")]),
            T0,
        );
        assert_eq!(
            summary(&out),
            [(Add, File, vec![])],
            "static pods stay checked"
        );
    }

    #[test]
    fn invalid_pods_are_skipped() {
        let mut s = PodStorage::default();
        let mut bad = pod("a", "u1", "i");
        bad.metadata.uid = None;
        let out = s.merge(Api, SourceChange::Set(vec![bad, pod("b", "u2", "i")]), T0);
        assert_eq!(summary(&out), [(Add, Api, ids(&["u2"]))]);
    }

    #[test]
    fn a_duplicate_full_name_from_another_source_loses_until_the_name_is_free() {
        let mut s = PodStorage::default();
        s.merge(File, SourceChange::Set(vec![pod("web", "f1", "i")]), T0);
        let out = s.merge(Http, SourceChange::Set(vec![pod("web", "h1", "i")]), T0);
        assert_eq!(
            summary(&out),
            [(Add, Http, vec![])],
            "the duplicate is not added"
        );
        let out = s.merge(File, SourceChange::Set(vec![]), T1);
        assert_eq!(
            summary(&out),
            [(Remove, File, ids(&["f1"])), (Add, Http, ids(&["h1"]))],
            "the shadowed pod takes over the freed name"
        );
        assert_eq!(annotation(&out.updates[1].pods[0], CONFIG_SEEN), Some(T1));
    }

    #[test]
    fn a_duplicate_within_one_set_keeps_the_first() {
        let mut s = PodStorage::default();
        let out = s.merge(
            File,
            SourceChange::Set(vec![pod("web", "a", "i"), pod("web", "b", "i")]),
            T0,
        );
        assert_eq!(summary(&out), [(Add, File, ids(&["a"]))]);
    }

    #[test]
    fn a_shadowed_pod_dropped_by_its_source_is_forgotten() {
        let mut s = PodStorage::default();
        s.merge(File, SourceChange::Set(vec![pod("web", "f1", "i")]), T0);
        s.merge(Http, SourceChange::Set(vec![pod("web", "h1", "i")]), T0);
        s.merge(Http, SourceChange::Set(vec![]), T0);
        let out = s.merge(File, SourceChange::Set(vec![]), T1);
        assert_eq!(summary(&out), [(Remove, File, ids(&["f1"]))]);
    }

    #[test]
    fn mirror_pods_share_their_static_pods_full_name() {
        let mut s = PodStorage::default();
        s.merge(
            File,
            SourceChange::Set(vec![pod("etcd-n1", "static", "i")]),
            T0,
        );
        let mut mirror = pod("etcd-n1", "mirror", "i");
        mirror.metadata.annotations = Some(
            [(CONFIG_MIRROR.to_owned(), "static".to_owned())]
                .into_iter()
                .collect(),
        );
        let out = s.merge(Api, SourceChange::Set(vec![mirror]), T0);
        assert_eq!(summary(&out), [(Add, Api, ids(&["mirror"]))]);
    }
}

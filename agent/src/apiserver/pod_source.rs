//! The API pod source: a watch of the pods bound to this node (`spec.nodeName=<node>`)
//! feeding the pod config merger as [`ConfigSource::Api`](crate::config::ConfigSource).
//!
//! Guarantees: every (re)list ends in one `SourceChange::Set` with exactly the listed pods
//! (so pods deleted while the watch was down are removed); watch events become `Upsert` /
//! `Remove` of one pod. Mirror pods come through here too; the pod manager tells them apart.
//! Watch errors (the apiserver going away) are retried with kube's default back-off and never
//! end the source.
//!
//! Each pod's `metadata.managedFields` is dropped on receipt (kubelet's informers have no use
//! for them either): the field-manager records of the pod's writers, the status writes
//! included, are kilobytes of JSON per pod that every copy of the pod would carry.

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

use crate::config::{SourceChange, SourceSender};

/// Watches this node's pods until the merger goes away.
pub async fn run_pod_source(client: Client, node_name: String, sender: SourceSender) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let stream = watcher::watcher(api, config).default_backoff();
    futures_util::pin_mut!(stream);
    let mut listing: Vec<Pod> = Vec::new();
    loop {
        let next = tokio::select! {
            () = sender.closed() => return,
            next = stream.next() => next,
        };
        let change = match next {
            None => return,
            Some(Err(err)) => {
                tracing::warn!(%err, node = %node_name, "pod watch failed; retrying");
                continue;
            }
            Some(Ok(event)) => match to_change(event, &mut listing) {
                Some(change) => change,
                None => continue,
            },
        };
        if sender.send(change).await.is_err() {
            return;
        }
    }
}

/// Turns a watcher event into a merger change; list pages accumulate in `listing`.
fn to_change(event: Event<Pod>, listing: &mut Vec<Pod>) -> Option<SourceChange> {
    match event {
        Event::Init => {
            listing.clear();
            None
        }
        Event::InitApply(pod) => {
            listing.push(received(pod));
            None
        }
        Event::InitDone => {
            let mut pods = std::mem::take(listing);
            pods.shrink_to_fit();
            Some(SourceChange::Set(pods))
        }
        Event::Apply(pod) => Some(SourceChange::Upsert(vec![received(pod)])),
        Event::Delete(pod) => Some(SourceChange::Remove(vec![received(pod)])),
    }
}

/// `pod` as the agent keeps it: without `metadata.managedFields`.
fn received(mut pod: Pod) -> Pod {
    pod.metadata.managed_fields = None;
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn names(change: &SourceChange) -> (&'static str, Vec<String>) {
        let (kind, pods) = match change {
            SourceChange::Set(p) => ("set", p),
            SourceChange::Upsert(p) => ("upsert", p),
            SourceChange::Remove(p) => ("remove", p),
        };
        let names = pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        (kind, names)
    }

    #[test]
    fn a_relist_becomes_one_set_of_exactly_the_listed_pods() {
        let mut listing = vec![pod("stale")];
        assert!(to_change(Event::Init, &mut listing).is_none());
        assert!(to_change(Event::InitApply(pod("a")), &mut listing).is_none());
        assert!(to_change(Event::InitApply(pod("b")), &mut listing).is_none());
        let change = to_change(Event::InitDone, &mut listing).map(|c| names(&c));
        assert_eq!(change, Some(("set", vec!["a".into(), "b".into()])));
        assert!(listing.is_empty());
    }

    #[test]
    fn watch_events_become_upserts_and_removes() {
        let mut listing = Vec::new();
        let up = to_change(Event::Apply(pod("a")), &mut listing).map(|c| names(&c));
        assert_eq!(up, Some(("upsert", vec!["a".into()])));
        let gone = to_change(Event::Delete(pod("a")), &mut listing).map(|c| names(&c));
        assert_eq!(gone, Some(("remove", vec!["a".into()])));
    }

    #[test]
    fn managed_fields_are_dropped_on_receipt() {
        let managed = || {
            let mut p = pod("a");
            p.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some("kubectl".into()),
                ..ManagedFieldsEntry::default()
            }]);
            p
        };
        let mut listing = Vec::new();
        let changes = [
            to_change(Event::Apply(managed()), &mut listing),
            to_change(Event::Delete(managed()), &mut listing),
            {
                to_change(Event::Init, &mut listing);
                to_change(Event::InitApply(managed()), &mut listing);
                to_change(Event::InitDone, &mut listing)
            },
        ];
        for change in changes {
            let pods = match change {
                Some(SourceChange::Set(p) | SourceChange::Upsert(p) | SourceChange::Remove(p)) => p,
                None => panic!("every event above yields a change"),
            };
            assert_eq!(pods.len(), 1);
            assert_eq!(pods[0].metadata.managed_fields, None);
            assert_eq!(pods[0].metadata.name.as_deref(), Some("a"));
        }
    }
}

//! The node Lease (`kube-node-lease/<node>`): kubelet's heartbeat
//! (`k8s.io/component-helpers/apimachinery/lease`).
//!
//! The renewer remembers the Lease it last wrote ([`LeaseState::Known`]) and PUTs a renewed
//! copy of it, so a healthy renewal is one request guarded by `resourceVersion`. Any failure
//! (a conflict because someone else wrote the Lease, the apiserver away) forgets it
//! ([`LeaseState::Unknown`]): the next attempt GETs the Lease, creating it when missing.
//! Attempts after a failure follow the back-off (100 ms doubling to 7 s); after a success the
//! next one is `lease_renew_interval` away.
//!
//! The Lease holds `holderIdentity` = node name, `leaseDurationSeconds`, `renewTime` and an
//! owner reference to the Node (so it goes when the Node is deleted).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::time::Duration;
use tracing::{debug, warn};

use super::backoff::Backoff;
use super::error::{Error, Result};

/// The namespace of node leases.
pub(crate) const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// What the renewer knows about the Lease.
#[derive(Debug, Clone)]
enum LeaseState {
    /// Nothing trustworthy: the next attempt reads the Lease (or creates it).
    Unknown,
    /// The Lease as the apiserver last returned it; the next attempt updates this copy.
    Known(Box<Lease>),
}

/// The fields we own in the Lease.
#[derive(Debug, Clone)]
pub(crate) struct LeaseParams {
    pub node: String,
    pub node_uid: String,
    pub duration_seconds: i32,
}

/// Renews the node's Lease; see the module docs.
pub(crate) struct LeaseRenewer {
    api: Api<Lease>,
    params: LeaseParams,
    state: LeaseState,
    backoff: Backoff,
    renew_interval: Duration,
}

impl LeaseRenewer {
    pub fn new(
        api: Api<Lease>,
        params: LeaseParams,
        backoff: Backoff,
        renew_interval: Duration,
    ) -> Self {
        Self {
            api,
            params,
            state: LeaseState::Unknown,
            backoff,
            renew_interval,
        }
    }

    /// One renewal attempt stamped `now`; returns how long to wait before the next one.
    pub async fn renew(&mut self, now: Timestamp, timeout: Duration) -> Duration {
        let state = std::mem::replace(&mut self.state, LeaseState::Unknown);
        let attempt = tokio::time::timeout(timeout, step(&self.api, &self.params, state, now));
        match attempt.await {
            Ok(Ok(lease)) => {
                debug!(node = %self.params.node, "renewed the node lease");
                self.state = LeaseState::Known(Box::new(lease));
                self.backoff.reset();
                self.renew_interval
            }
            Ok(Err(err)) => {
                let delay = self.backoff.next_delay();
                warn!(node = %self.params.node, ?delay, error = %err, source = ?std::error::Error::source(&err), "lease renewal failed; reading it again after the delay");
                delay
            }
            Err(_) => {
                let delay = self.backoff.next_delay();
                warn!(node = %self.params.node, ?timeout, ?delay, "lease renewal timed out; reading it again after the delay");
                delay
            }
        }
    }
}

/// One attempt from `state`: the Lease the apiserver returned, or the failed call.
/// Unknown ⇒ GET, then PUT the renewed Lease (or POST a new one when missing);
/// Known ⇒ PUT the renewed copy (a stale `resourceVersion` fails with a conflict).
async fn step(
    api: &Api<Lease>,
    params: &LeaseParams,
    state: LeaseState,
    now: Timestamp,
) -> Result<Lease> {
    let node = &params.node;
    let current = match state {
        LeaseState::Known(lease) => *lease,
        LeaseState::Unknown => match api.get_opt(node).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                return api
                    .create(&PostParams::default(), &new_lease(params, now))
                    .await
                    .map_err(|source| Error::CreateLease {
                        node: node.clone(),
                        source,
                    });
            }
            Err(source) => {
                return Err(Error::GetLease {
                    node: node.clone(),
                    source,
                })
            }
        },
    };
    api.replace(node, &PostParams::default(), &renewed(current, params, now))
        .await
        .map_err(|source| Error::RenewLease {
            node: node.clone(),
            source,
        })
}

/// A new Lease for the node, renewed `now`.
fn new_lease(params: &LeaseParams, now: Timestamp) -> Lease {
    renewed(
        Lease {
            metadata: ObjectMeta {
                name: Some(params.node.clone()),
                namespace: Some(NODE_LEASE_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            spec: None,
        },
        params,
        now,
    )
}

/// `lease` with our holder, duration and `renewTime = now`, and the Node as owner when it
/// has no owner yet (kubelet's `setNodeOwnerFunc`).
fn renewed(mut lease: Lease, params: &LeaseParams, now: Timestamp) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(params.node.clone());
    spec.lease_duration_seconds = Some(params.duration_seconds);
    spec.renew_time = Some(MicroTime(now));
    let owners = lease.metadata.owner_references.get_or_insert_with(Vec::new);
    if owners.is_empty() {
        owners.push(OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: params.node.clone(),
            uid: params.node_uid.clone(),
            ..OwnerReference::default()
        });
    }
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> LeaseParams {
        LeaseParams {
            node: "n1".to_owned(),
            node_uid: "uid-1".to_owned(),
            duration_seconds: 40,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    #[test]
    fn a_new_lease_is_held_by_the_node_and_owned_by_it() {
        let lease = new_lease(&params(), at(100));
        assert_eq!(lease.metadata.name.as_deref(), Some("n1"));
        assert_eq!(
            lease.metadata.namespace.as_deref(),
            Some(NODE_LEASE_NAMESPACE)
        );
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(MicroTime(at(100))));
        let owners = lease.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (
                owners[0].kind.as_str(),
                owners[0].name.as_str(),
                owners[0].uid.as_str()
            ),
            ("Node", "n1", "uid-1")
        );
    }

    #[test]
    fn renewal_moves_renew_time_and_keeps_an_existing_owner_and_version() {
        let mut lease = new_lease(&params(), at(100));
        lease.metadata.resource_version = Some("42".to_owned());
        lease.metadata.owner_references.as_mut().unwrap()[0].uid = "older".to_owned();
        let renewed = renewed(lease, &params(), at(110));
        assert_eq!(renewed.spec.unwrap().renew_time, Some(MicroTime(at(110))));
        assert_eq!(renewed.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(renewed.metadata.owner_references.unwrap()[0].uid, "older");
    }

    #[test]
    fn renewal_takes_the_lease_back_from_another_holder() {
        let mut lease = new_lease(&params(), at(100));
        lease.spec.as_mut().unwrap().holder_identity = Some("intruder".to_owned());
        lease.spec.as_mut().unwrap().lease_duration_seconds = Some(5);
        let spec = renewed(lease, &params(), at(110)).spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
    }
}

//! [`ApiServices`]: the cluster's Services in a watch-backed cache (kube's reflector; kubelet's
//! service informer), for the service link environment variables
//! ([`crate::env::services`]).
//!
//! Guarantees: after the first complete list the cache follows every namespace's Services
//! through the watch (re-listing after watch errors, with kube's default back-off) and is read
//! without any request; container starts never fetch Services. The watch task stops when the
//! value is dropped.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use crate::env::ServiceLister;

/// Every Service of the cluster, cached.
pub struct ApiServices {
    store: Store<Service>,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServices {
    /// Starts the watch (all namespaces).
    pub fn start(client: Client) -> Self {
        let (store, writer) = reflector::store();
        let api: Api<Service> = Api::all(client);
        let stream = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|service| service.metadata.managed_fields = None);
        let task = tokio::spawn(async move {
            let events = reflector::reflector(writer, stream);
            futures_util::pin_mut!(events);
            while let Some(event) = events.next().await {
                if let Err(err) = event {
                    tracing::warn!(%err, "service watch failed; retrying");
                }
            }
        });
        Self { store, task }
    }
}

impl Drop for ApiServices {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl ServiceLister for ApiServices {
    fn list(&self) -> Vec<Arc<Service>> {
        self.store.state()
    }

    async fn wait_synced(&self, timeout: Duration) -> bool {
        matches!(
            tokio::time::timeout(timeout, self.store.wait_until_ready()).await,
            Ok(Ok(()))
        )
    }
}

//! Where the agent reads the ConfigMaps and Secrets that pods reference (env, envFrom,
//! configMap/secret/projected volumes): the [`ObjectSource`] trait and its implementations.
//!
//! * [`FileObjectSource`]: for static pods, objects written as YAML/JSON files beside the
//!   manifests (`kind: ConfigMap|Secret`, possibly in the same multi-document file as the
//!   pods), read on demand.
//! * [`crate::apiserver::ApiObjectSource`]: from the API server, with a short-lived cache.
//!
//! Contract for every implementation: `Ok(None)` means "does not exist" (kubelet's NotFound,
//! which `optional: true` references tolerate); an `Err` means "could not tell" and must fail
//! the caller — an optional reference is never silently dropped because of a read failure.
//! Secrets are returned with `stringData` already merged over `data` (as the API server stores
//! them), so consumers read `data` only. Service-account tokens come from the API only.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};

mod file;
mod refs;

pub use file::FileObjectSource;
pub use refs::{pod_object_refs, ObjectKind, ObjectRef};

/// Why an object could not be looked up (as opposed to: it does not exist).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    /// The directory the objects live in could not be listed.
    #[error("listing objects in {}: {source}", path.display())]
    ListDirectory {
        /// The directory.
        path: PathBuf,
        /// The listing error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The blocking lookup task did not complete (panicked or was cancelled).
    #[error("object lookup task failed: {reason}")]
    Task {
        /// What the task runtime reported.
        reason: String,
    },
}

/// Read access to ConfigMaps and Secrets by namespace and name.
#[async_trait]
pub trait ObjectSource: Send + Sync {
    /// The ConfigMap `namespace/name`, `None` when it does not exist.
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, ObjectError>;

    /// The Secret `namespace/name` with `stringData` merged into `data`, `None` when it does
    /// not exist.
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, ObjectError>;

    /// The ServiceAccount `namespace/name` (for credential provider plugins with
    /// `tokenAttributes`). `Ok(None)`: it does not exist, or this source has no service
    /// accounts (no API server).
    async fn service_account(
        &self,
        _namespace: &str,
        _name: &str,
    ) -> Result<Option<ServiceAccount>, ObjectError> {
        Ok(None)
    }

    /// A token of ServiceAccount `request.service_account`, bound to `request`'s pod, for a
    /// projected `serviceAccountToken` source. `Ok(None)`: this source cannot issue tokens
    /// (no API server).
    async fn service_account_token(
        &self,
        _request: &TokenRequestFor<'_>,
    ) -> Result<Option<String>, ObjectError> {
        Ok(None)
    }
}

/// What a projected `serviceAccountToken` source asks for.
#[derive(Debug, Clone, Copy)]
pub struct TokenRequestFor<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's `serviceAccountName` (`default` when unset).
    pub service_account: &'a str,
    /// The pod the token is bound to (deleted pod ⇒ invalid token).
    pub pod_name: &'a str,
    /// Its UID.
    pub pod_uid: &'a str,
    /// `audience`; `None`: the API server's.
    pub audience: Option<&'a str>,
    /// `expirationSeconds` (API default 3600).
    pub expiration_seconds: i64,
    /// The ServiceAccount's UID as the TokenRequest's `metadata.uid` (the API server then
    /// refuses a token for a re-created account of the same name); kubelet sets it for
    /// credential provider tokens.
    pub service_account_uid: Option<&'a str>,
}

/// A source with no objects: every lookup is "not found". For an agent without a
/// manifest directory (and, until the API source exists, pods from a URL).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObjects;

#[async_trait]
impl ObjectSource for NoObjects {
    async fn config_map(&self, _: &str, _: &str) -> Result<Option<ConfigMap>, ObjectError> {
        Ok(None)
    }

    async fn secret(&self, _: &str, _: &str) -> Result<Option<Secret>, ObjectError> {
        Ok(None)
    }
}

//! [`ApiObjectSource`]: ConfigMaps and Secrets read from their watches
//! ([`ObjectWatches`], kubelet's watch-based manager) or, when not watched (yet), from the API
//! with a short-lived cache,
//! service-account tokens requested through TokenRequest (bound to the pod, reused until 80 %
//! of their lifetime as kubelet's token manager does, at most 24 h), and [`LayeredObjects`],
//! which consults the static pods' files first and the API second.
//!
//! Guarantees: a watched object is answered from its watch (as fresh as the watch); an
//! unwatched one from a read at most [`CACHE_TTL`] old (including "not found"); a failed read
//! is an error (never "not found"). Secrets come back with `stringData` merged into `data`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::ByteString;
use kube::{Api, Client};

use super::object_watch::{ObjectKind, ObjectWatches, Watched};
use crate::objects::{ObjectError, ObjectSource, TokenRequestFor};

/// How long a read is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(1);

type Cache<T> = Mutex<HashMap<(String, String), (Instant, Option<T>)>>;

/// (namespace, service account, pod uid, audience, expiration, service account uid) →
/// (refresh after, token).
type TokenCache = Mutex<HashMap<(String, String, String, String, i64, String), (Instant, String)>>;

/// kubelet refreshes a token after 80 % of its lifetime or 24 h, whichever comes first.
fn token_reuse_period(expiration_seconds: i64) -> Duration {
    let lifetime = Duration::from_secs(u64::try_from(expiration_seconds).unwrap_or(0));
    (lifetime * 4 / 5).min(Duration::from_secs(24 * 3600))
}

/// Reads objects from the API.
pub struct ApiObjectSource {
    client: Client,
    watches: Option<Arc<ObjectWatches>>,
    config_maps: Cache<ConfigMap>,
    secrets: Cache<Secret>,
    service_accounts: Cache<ServiceAccount>,
    tokens: TokenCache,
}

impl ApiObjectSource {
    /// Reads through `client`, answering from `watches` what they watch.
    pub fn new(client: Client, watches: Option<Arc<ObjectWatches>>) -> Self {
        Self {
            client,
            watches,
            config_maps: Mutex::new(HashMap::new()),
            secrets: Mutex::new(HashMap::new()),
            service_accounts: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
        }
    }
}

fn cached<T: Clone>(cache: &Cache<T>, key: &(String, String)) -> Option<Option<T>> {
    let cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .get(key)
        .filter(|(at, _)| at.elapsed() < CACHE_TTL)
        .map(|(_, v)| v.clone())
}

fn remember<T>(cache: &Cache<T>, key: (String, String), value: Option<T>) {
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    cache.retain(|_, (at, _)| at.elapsed() < CACHE_TTL);
    cache.insert(key, (Instant::now(), value));
}

async fn read<T>(
    client: &Client,
    cache: &Cache<T>,
    namespace: &str,
    name: &str,
) -> Result<Option<T>, ObjectError>
where
    T: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    T::DynamicType: Default,
{
    let key = (namespace.to_owned(), name.to_owned());
    if let Some(hit) = cached(cache, &key) {
        return Ok(hit);
    }
    let api: Api<T> = Api::namespaced(client.clone(), namespace);
    let value = api.get_opt(name).await.map_err(|err| ObjectError::Task {
        reason: format!("reading {namespace}/{name} from the API: {err}"),
    })?;
    remember(cache, key, value.clone());
    Ok(value)
}

#[async_trait]
impl ObjectSource for ApiObjectSource {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, ObjectError> {
        match self.watched(ObjectKind::ConfigMap, namespace, name) {
            Some(Some(Watched::ConfigMap(map))) => Ok(Some(map)),
            Some(_) => Ok(None),
            None => read(&self.client, &self.config_maps, namespace, name).await,
        }
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, ObjectError> {
        let secret = match self.watched(ObjectKind::Secret, namespace, name) {
            Some(Some(Watched::Secret(secret))) => Some(secret),
            Some(_) => None,
            None => read(&self.client, &self.secrets, namespace, name).await?,
        };
        Ok(secret.map(merge_string_data))
    }

    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ServiceAccount>, ObjectError> {
        read(&self.client, &self.service_accounts, namespace, name).await
    }

    async fn service_account_token(
        &self,
        request: &TokenRequestFor<'_>,
    ) -> Result<Option<String>, ObjectError> {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

        let key = (
            request.namespace.to_owned(),
            request.service_account.to_owned(),
            request.pod_uid.to_owned(),
            request.audience.unwrap_or_default().to_owned(),
            request.expiration_seconds,
            request.service_account_uid.unwrap_or_default().to_owned(),
        );
        {
            let tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((until, token)) = tokens.get(&key) {
                if Instant::now() < *until {
                    return Ok(Some(token.clone()));
                }
            }
        }
        let body = TokenRequest {
            metadata: ObjectMeta {
                uid: request.service_account_uid.map(str::to_owned),
                ..ObjectMeta::default()
            },
            spec: Some(TokenRequestSpec {
                audiences: request.audience.map(|a| vec![a.to_owned()]),
                expiration_seconds: Some(request.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(request.pod_name.to_owned()),
                    uid: Some(request.pod_uid.to_owned()),
                }),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), request.namespace);
        let issued = api
            .create_token_request(request.service_account, &Default::default(), &body)
            .await
            .map_err(|err| ObjectError::Task {
                reason: format!(
                    "requesting a token of service account {}/{}: {err}",
                    request.namespace, request.service_account
                ),
            })?;
        let token = issued.status.and_then(|s| s.token).unwrap_or_default();
        if token.is_empty() {
            return Err(ObjectError::Task {
                reason: format!(
                    "the API issued an empty token for service account {}/{}",
                    request.namespace, request.service_account
                ),
            });
        }
        let until = Instant::now() + token_reuse_period(request.expiration_seconds);
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        tokens.retain(|_, (at, _)| Instant::now() < *at);
        tokens.insert(key, (until, token.clone()));
        Ok(Some(token))
    }
}

impl ApiObjectSource {
    fn watched(&self, kind: ObjectKind, namespace: &str, name: &str) -> Option<Option<Watched>> {
        let key = (kind, namespace.to_owned(), name.to_owned());
        self.watches.as_ref().and_then(|w| w.get(&key))
    }
}

fn merge_string_data(mut secret: Secret) -> Secret {
    if let Some(strings) = secret.string_data.take() {
        let data = secret.data.get_or_insert_with(Default::default);
        for (k, v) in strings {
            data.insert(k, ByteString(v.into_bytes()));
        }
    }
    secret
}

/// The first source that knows an object answers.
pub struct LayeredObjects(pub Vec<Arc<dyn ObjectSource>>);

#[async_trait]
impl ObjectSource for LayeredObjects {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, ObjectError> {
        for source in &self.0 {
            if let Some(found) = source.config_map(namespace, name).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, ObjectError> {
        for source in &self.0 {
            if let Some(found) = source.secret(namespace, name).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ServiceAccount>, ObjectError> {
        for source in &self.0 {
            if let Some(found) = source.service_account(namespace, name).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    async fn service_account_token(
        &self,
        request: &TokenRequestFor<'_>,
    ) -> Result<Option<String>, ObjectError> {
        for source in &self.0 {
            if let Some(token) = source.service_account_token(request).await? {
                return Ok(Some(token));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::NoObjects;

    #[test]
    fn string_data_is_merged_over_data() {
        let secret = Secret {
            data: Some([("a".to_owned(), ByteString(b"old".to_vec()))].into()),
            string_data: Some([("a".to_owned(), "new".to_owned())].into()),
            ..Secret::default()
        };
        let merged = merge_string_data(secret);
        assert_eq!(merged.data.unwrap_or_default()["a"].0, b"new");
    }

    #[tokio::test]
    async fn layered_sources_fall_through_to_not_found() {
        let layered = LayeredObjects(vec![Arc::new(NoObjects), Arc::new(NoObjects)]);
        assert!(matches!(layered.config_map("ns", "x").await, Ok(None)));
    }

    #[test]
    fn tokens_are_reused_for_80_percent_of_their_lifetime_and_at_most_a_day() {
        assert_eq!(token_reuse_period(3600), Duration::from_secs(2880));
        assert_eq!(
            token_reuse_period(7 * 24 * 3600),
            Duration::from_secs(24 * 3600)
        );
        assert_eq!(token_reuse_period(-5), Duration::ZERO);
    }
}

//! Authentication and authorization of kubelet API requests, as kubelet's secure defaults
//! (`--anonymous-auth=false`, `--authentication-token-webhook`, `--authorization-mode=Webhook`):
//!
//! - a client certificate verified against `--client-ca-file` names the user (`CN`) and its
//!   groups (`O`s) — see [`super::x509`];
//! - otherwise a bearer token is sent to the API server as a `TokenReview` (answers cached
//!   for kubelet's 2 min);
//! - the user is then authorized with `SubjectAccessReview`s for the `nodes` subresources the
//!   path maps to ([`attributes`], kubelet's `GetRequestAttributes`); any one allowed is
//!   enough. Answers cached as kubelet does: allowed 5 min, denied 30 s.
//!
//! No credentials → 401; credentials the API server rejects → 401; not allowed → 403.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::Api;
use sha2::{Digest, Sha256};

/// kubelet's `authentication.webhook.cacheTTL`.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(120);
/// kubelet's `authorization.webhook.cacheAuthorizedTTL` / `cacheUnauthorizedTTL`.
pub const ALLOWED_CACHE_TTL: Duration = Duration::from_secs(300);
pub const DENIED_CACHE_TTL: Duration = Duration::from_secs(30);
/// Entries a cache holds before it is emptied (bounds memory under a flood of tokens).
const CACHE_CAPACITY: usize = 4096;

/// An authenticated requester.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    pub fn named(name: impl Into<String>, groups: Vec<String>) -> Self {
        Self {
            name: name.into(),
            uid: String::new(),
            groups,
            extra: BTreeMap::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("asking the API server")]
    Api(#[from] kube::Error),
}

/// What a request asks for: the API verb and the `nodes` subresources, any of which allows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: &'static str,
    pub subresources: Vec<&'static str>,
}

/// kubelet's `isSubpath`.
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// kubelet's `GetRequestAttributes` (v1.37, KubeletFineGrainedAuthz on).
pub fn attributes(method: &str, path: &str) -> Attributes {
    let verb = match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    };
    let specific: &[&'static str] = if is_subpath(path, "/stats") {
        &["stats"]
    } else if is_subpath(path, "/metrics") {
        &["metrics"]
    } else if is_subpath(path, "/logs") {
        &["log"]
    } else if is_subpath(path, "/checkpoint") {
        &["checkpoint"]
    } else if is_subpath(path, "/pods") || is_subpath(path, "/runningpods/") {
        &["pods", "proxy"]
    } else if is_subpath(path, "/healthz") {
        &["healthz", "proxy"]
    } else if is_subpath(path, "/configz") {
        &["configz", "proxy"]
    } else if is_subpath(path, "/statusz") {
        &["statusz", "proxy"]
    } else {
        &["proxy"]
    };
    Attributes {
        verb,
        subresources: specific.to_vec(),
    }
}

/// Validates bearer tokens.
#[async_trait::async_trait]
pub trait TokenAuthenticator: Send + Sync {
    /// `Ok(None)`: the token is not valid.
    async fn authenticate(&self, token: &str) -> Result<Option<User>, AuthError>;
}

/// Decides whether a user may do `verb` on `nodes/<node>/<subresource>`.
#[async_trait::async_trait]
pub trait Authorizer: Send + Sync {
    async fn allowed(
        &self,
        user: &User,
        verb: &str,
        subresource: &str,
        path: &str,
    ) -> Result<bool, AuthError>;
}

/// A small TTL map, emptied when full.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: std::hash::Hash + Eq, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(expires, _)| *expires > Instant::now())
            .map(|(_, v)| v.clone())
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= CACHE_CAPACITY {
            let now = Instant::now();
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= CACHE_CAPACITY {
                entries.clear();
            }
        }
        entries.insert(key, (Instant::now() + ttl, value));
    }
}

/// `TokenReview` against the API server, answers cached by the token's SHA-256.
pub struct ApiTokenAuthenticator {
    client: kube::Client,
    cache: TtlCache<[u8; 32], Option<User>>,
}

impl ApiTokenAuthenticator {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: TtlCache::new(),
        }
    }
}

#[async_trait::async_trait]
impl TokenAuthenticator for ApiTokenAuthenticator {
    async fn authenticate(&self, token: &str) -> Result<Option<User>, AuthError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(user) = self.cache.get(&key) {
            return Ok(user);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api.create(&PostParams::default(), &review).await?;
        let user = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
            .and_then(|u| {
                Some(User {
                    name: u.username.filter(|n| !n.is_empty())?,
                    uid: u.uid.unwrap_or_default(),
                    groups: u.groups.unwrap_or_default(),
                    extra: u.extra.unwrap_or_default().into_iter().collect(),
                })
            });
        self.cache.put(key, user.clone(), TOKEN_CACHE_TTL);
        Ok(user)
    }
}

/// `SubjectAccessReview` against the API server for `nodes/<node>/<subresource>`.
pub struct ApiAuthorizer {
    client: kube::Client,
    node_name: String,
    cache: TtlCache<(User, String, String), bool>,
}

impl ApiAuthorizer {
    pub fn new(client: kube::Client, node_name: String) -> Self {
        Self {
            client,
            node_name,
            cache: TtlCache::new(),
        }
    }
}

#[async_trait::async_trait]
impl Authorizer for ApiAuthorizer {
    async fn allowed(
        &self,
        user: &User,
        verb: &str,
        subresource: &str,
        _path: &str,
    ) -> Result<bool, AuthError> {
        let key = (user.clone(), verb.to_owned(), subresource.to_owned());
        if let Some(allowed) = self.cache.get(&key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    version: Some("v1".to_owned()),
                    resource: Some("nodes".to_owned()),
                    subresource: Some(subresource.to_owned()),
                    name: Some(self.node_name.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api.create(&PostParams::default(), &review).await?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed {
            ALLOWED_CACHE_TTL
        } else {
            DENIED_CACHE_TTL
        };
        self.cache.put(key, allowed, ttl);
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subs(method: &str, path: &str) -> (&'static str, Vec<&'static str>) {
        let a = attributes(method, path);
        (a.verb, a.subresources)
    }

    #[test]
    fn paths_map_to_kubelets_node_subresources() {
        assert_eq!(subs("GET", "/stats/summary"), ("get", vec!["stats"]));
        assert_eq!(subs("GET", "/metrics"), ("get", vec!["metrics"]));
        assert_eq!(subs("GET", "/metrics/cadvisor"), ("get", vec!["metrics"]));
        assert_eq!(subs("GET", "/logs/syslog"), ("get", vec!["log"]));
        assert_eq!(subs("GET", "/pods"), ("get", vec!["pods", "proxy"]));
        assert_eq!(subs("GET", "/runningpods/"), ("get", vec!["pods", "proxy"]));
        assert_eq!(subs("GET", "/healthz"), ("get", vec!["healthz", "proxy"]));
        assert_eq!(subs("GET", "/configz"), ("get", vec!["configz", "proxy"]));
        assert_eq!(
            subs("GET", "/containerLogs/ns/pod/c"),
            ("get", vec!["proxy"])
        );
        assert_eq!(subs("POST", "/exec/ns/pod/c"), ("create", vec!["proxy"]));
        // A prefix that is not a whole segment does not count.
        assert_eq!(subs("GET", "/statsx"), ("get", vec!["proxy"]));
        assert_eq!(subs("GET", "/podsx"), ("get", vec!["proxy"]));
    }

    #[test]
    fn the_cache_expires_entries() {
        let cache = TtlCache::new();
        cache.put(1, true, Duration::from_secs(60));
        cache.put(2, true, Duration::ZERO);
        assert_eq!(cache.get(&1), Some(true));
        assert_eq!(cache.get(&2), None);
    }
}

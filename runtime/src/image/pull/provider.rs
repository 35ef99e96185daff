//! [`CredentialProviders`]: kubelet's credential provider plugins
//! (`--image-credential-provider-config` / `--image-credential-provider-bin-dir`).
//!
//! ```text
//!  CredentialProviderConfig (kubelet.config.k8s.io/v1)      <bin-dir>/<name>
//!   providers: [{name, matchImages, defaultCacheDuration,   (checked at load: a missing
//!                apiVersion, args, env}]                      binary fails the start)
//!
//!  provide(image) ─► for each provider whose matchImages match the image
//!                    ─► tokenAttributes? ─► the pod's service account (none: skipped if
//!                       requireServiceAccount) ─► its annotations (a required one missing:
//!                       skipped) ─► a token for the audience, bound to the pod (TokenRequest)
//!                    ─► cache: image key, then registry key, then global key, each joined
//!                       with the service-account key ─► hit: its auth
//!                    └► miss: one exec per (provider, image, token, annotations) at a time
//!                       ─► stdin CredentialProviderRequest {image, serviceAccountToken?,
//!                       serviceAccountAnnotations?} ─► stdout CredentialProviderResponse
//!                       {cacheKeyType, cacheDuration?, auth: {glob: {username, password}}}
//!                       ─► cached for cacheDuration (absent: defaultCacheDuration; 0: not cached)
//! ```
//!
//! Service-account tokens (kubelet v1.33+, KEP-4412): the service-account key is the
//! namespace, name, UID and the selected annotations (`cacheType: ServiceAccount`), plus
//! the token's hash (`cacheType: Token`), so pods of one service account share credentials
//! and pods of another never see them. With `cacheType: ServiceAccount` a plugin that
//! answers with the token itself as the password is refused (kubelet's rule: such
//! credentials live only as long as the token).
//!
//! As in kubelet, a plugin that fails, times out (1 minute) or answers badly gives no
//! credentials (the pull goes on with the others); its error is logged and returned, so a
//! pull that then fails says why. The plugin runs in its own process group, killed whole
//! on timeout. Its environment is the node's plus the provider's `env`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::credentials::{urls_match, Credentials, Keyring};
use crate::image::error::ImageError;

/// kubelet's `CredentialProviderConfig` versions.
const CONFIG_API_VERSIONS: [&str; 3] = [
    "kubelet.config.k8s.io/v1",
    "kubelet.config.k8s.io/v1beta1",
    "kubelet.config.k8s.io/v1alpha1",
];
/// `CredentialProviderRequest`/`Response` versions (one schema).
const PLUGIN_API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];
/// kubelet's exec timeout for a plugin.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// A plugin's stderr kept in an error message.
const STDERR_LIMIT: usize = 1024;
const GLOBAL_CACHE_KEY: &str = "global";

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConfigFile {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    providers: Vec<ProviderSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProviderSpec {
    #[serde(default)]
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    #[serde(default)]
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    token_attributes: Option<TokenAttributesSpec>,
}

/// kubelet's `ServiceAccountTokenAttributes`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TokenAttributesSpec {
    #[serde(default)]
    service_account_token_audience: String,
    #[serde(default)]
    cache_type: String,
    #[serde(default)]
    require_service_account: Option<bool>,
    #[serde(default)]
    required_service_account_annotation_keys: Vec<String>,
    #[serde(default)]
    optional_service_account_annotation_keys: Vec<String>,
}

/// `tokenAttributes.cacheType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenCacheType {
    /// Credentials cached per service account (namespace, name, UID, annotations).
    ServiceAccount,
    /// Credentials cached per token as well.
    Token,
}

/// A provider's validated `tokenAttributes`.
#[derive(Debug, Clone)]
struct TokenAttributes {
    audience: String,
    cache_type: TokenCacheType,
    require_service_account: bool,
    required_annotation_keys: Vec<String>,
    optional_annotation_keys: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvVar {
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    kind: &'static str,
    api_version: &'a str,
    image: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    service_account_token: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    service_account_annotations: &'a BTreeMap<String, String>,
}

/// A pod's service account as a credential provider needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceAccountInfo {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
}

/// Where service accounts and their tokens come from (the agent's API client): kubelet's
/// `getServiceAccount` and `getServiceAccountToken`.
#[async_trait::async_trait]
pub trait ServiceAccountTokens: Send + Sync {
    /// ServiceAccount `namespace/name`; `Ok(None)` when it does not exist.
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ServiceAccountInfo>, String>;

    /// A token of `request.service_account` for `request.audience`, bound to the pod
    /// (TokenRequest, default expiration).
    async fn token(&self, request: &TokenFor<'_>) -> Result<String, String>;
}

/// One token a credential provider asks for.
#[derive(Debug, Clone, Copy)]
pub struct TokenFor<'a> {
    pub namespace: &'a str,
    pub service_account: &'a str,
    /// The service account's UID (the TokenRequest's `metadata.uid`, as kubelet sets it).
    pub service_account_uid: &'a str,
    pub pod_name: &'a str,
    pub pod_uid: &'a str,
    pub audience: &'a str,
}

/// The pod an image is pulled for, for the providers with `tokenAttributes`.
#[derive(Clone)]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.serviceAccountName`; empty: none (static pods).
    pub service_account: String,
    pub tokens: Arc<dyn ServiceAccountTokens>,
}

impl std::fmt::Debug for PodIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodIdentity")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("service_account", &self.service_account)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    cache_key_type: String,
    #[serde(default)]
    cache_duration: Option<String>,
    #[serde(default)]
    auth: HashMap<String, ResponseAuth>,
}

#[derive(Deserialize)]
struct ResponseAuth {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// The plugins of one `CredentialProviderConfig`, with their caches.
#[derive(Debug)]
pub struct CredentialProviders {
    providers: Vec<Provider>,
    exec_timeout: Duration,
}

#[derive(Debug)]
struct Provider {
    name: String,
    binary: PathBuf,
    match_images: Vec<String>,
    default_cache_duration: Duration,
    api_version: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    token_attributes: Option<TokenAttributes>,
    /// (image | registry | global, service-account key) → credentials.
    cache: Mutex<HashMap<(String, String), CacheEntry>>,
    /// One exec per image at a time (kubelet's singleflight); the waiters find the cache.
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

#[derive(Debug, Clone)]
struct CacheEntry {
    keyring: Keyring,
    expires: Instant,
}

impl CredentialProviders {
    /// Reads `config` (YAML or JSON) and checks every provider's binary in `bin_dir`.
    pub fn load(config: &Path, bin_dir: &Path) -> Result<Self, ImageError> {
        let text =
            std::fs::read_to_string(config).map_err(|e| ImageError::io("reading", config, e))?;
        Self::parse(&text, config, bin_dir)
    }

    /// Validates as kubelet does (`validateCredentialProviderConfig`), with its messages.
    pub fn parse(text: &str, config: &Path, bin_dir: &Path) -> Result<Self, ImageError> {
        let bad = |message: String| ImageError::CredentialProviderConfig {
            path: config.to_path_buf(),
            message,
        };
        let file: ConfigFile = serde_yaml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if file.kind != "CredentialProviderConfig" {
            return Err(bad(format!(
                "kind is {:?}, expected \"CredentialProviderConfig\"",
                file.kind
            )));
        }
        if !CONFIG_API_VERSIONS.contains(&file.api_version.as_str()) {
            return Err(bad(format!(
                "apiVersion {:?} is not supported: {}",
                file.api_version,
                CONFIG_API_VERSIONS.join(", ")
            )));
        }
        if file.providers.is_empty() {
            return Err(bad(
                "providers: Required value: at least 1 item in plugins is required".into(),
            ));
        }
        let mut providers: Vec<Provider> = Vec::new();
        for (i, p) in file.providers.into_iter().enumerate() {
            let field = |f: &str| format!("providers[{i}].{f}");
            let name = p.name;
            let invalid = match name.as_str() {
                "" => Some("Required value".to_owned()),
                "." | ".." => Some(format!(
                    "Invalid value: {name:?}: provider name cannot be {name:?}"
                )),
                n if n.contains('/') => Some(format!(
                    "Invalid value: {name:?}: provider name cannot contain '/'"
                )),
                n if n.contains(' ') => Some(format!(
                    "Invalid value: {name:?}: provider name cannot contain spaces"
                )),
                n if providers.iter().any(|q| q.name == n) => {
                    Some(format!("Duplicate value: {name:?}"))
                }
                _ => None,
            };
            if let Some(why) = invalid {
                return Err(bad(format!("{}: {why}", field("name"))));
            }
            if !PLUGIN_API_VERSIONS.contains(&p.api_version.as_str()) {
                return Err(bad(format!(
                    "{}: Unsupported value: {:?}: supported values: {}",
                    field("apiVersion"),
                    p.api_version,
                    PLUGIN_API_VERSIONS.join(", ")
                )));
            }
            if p.match_images.is_empty() {
                return Err(bad(format!(
                    "{}: Required value: at least 1 item in matchImages is required",
                    field("matchImages")
                )));
            }
            for m in &p.match_images {
                if let Err(why) = check_match_image(m) {
                    return Err(bad(format!(
                        "{}: Invalid value: {m:?}: match image is invalid: {why}",
                        field("matchImages")
                    )));
                }
            }
            let default_cache_duration = match p.default_cache_duration.as_deref() {
                None => {
                    return Err(bad(format!(
                        "{}: Required value",
                        field("defaultCacheDuration")
                    )))
                }
                Some(d) => parse_duration(d).map_err(|e| {
                    bad(format!(
                        "{}: Invalid value: {e}",
                        field("defaultCacheDuration")
                    ))
                })?,
            };
            let token_attributes = match p.token_attributes {
                None => None,
                Some(t) => Some(
                    check_token_attributes(t, &p.api_version)
                        .map_err(|why| bad(format!("{}{why}", field("tokenAttributes"))))?,
                ),
            };
            let binary = bin_dir.join(&name);
            check_binary(&binary).map_err(|why| {
                bad(format!(
                    "provider {name:?}: error inspecting binary executable {}: {why}",
                    binary.display()
                ))
            })?;
            providers.push(Provider {
                name,
                binary,
                match_images: p.match_images,
                default_cache_duration,
                api_version: p.api_version,
                args: p.args,
                env: p.env.into_iter().map(|e| (e.name, e.value)).collect(),
                token_attributes,
                cache: Mutex::new(HashMap::new()),
                flights: Mutex::new(HashMap::new()),
            });
        }
        Ok(Self {
            providers,
            exec_timeout: DEFAULT_EXEC_TIMEOUT,
        })
    }

    /// Another exec timeout than kubelet's minute (tests).
    pub fn with_exec_timeout(mut self, timeout: Duration) -> Self {
        self.exec_timeout = timeout;
        self
    }

    /// The credentials every matching provider gives for `image` (`host/repository`, no
    /// tag) pulled for `pod` (none: not for a pod, e.g. `ironlet images pull`), in
    /// provider-name order as kubelet registers them, and the errors of the providers that
    /// failed.
    pub(crate) async fn provide(
        &self,
        image: &str,
        pod: Option<&PodIdentity>,
    ) -> (Keyring, Vec<String>) {
        let mut order: Vec<&Provider> = self
            .providers
            .iter()
            .filter(|p| p.match_images.iter().any(|m| urls_match(m, image)))
            .collect();
        order.sort_by(|a, b| a.name.cmp(&b.name));
        let mut ring = Keyring::default();
        let mut errors = Vec::new();
        for p in order {
            match p.provide(image, pod, self.exec_timeout).await {
                Ok(r) => ring.extend(r),
                Err(e) => {
                    tracing::warn!(provider = %p.name, %image, err = %e, "Failed getting credential from external registry credential provider");
                    errors.push(e);
                }
            }
        }
        (ring, errors)
    }

    /// Whether the credentials of a provider that matches `image` may depend on the pod's
    /// service account (a provider with `tokenAttributes`): pulls for different service
    /// accounts are then not shared.
    pub(crate) fn depends_on_service_account(&self, image: &str) -> bool {
        self.providers.iter().any(|p| {
            p.token_attributes.is_some() && p.match_images.iter().any(|m| urls_match(m, image))
        })
    }
}

/// What a provider with `tokenAttributes` sends for one pod, and its cache keys.
#[derive(Debug, Default)]
struct ServiceAccountContext {
    token: String,
    annotations: BTreeMap<String, String>,
    /// Joined to every cache key (kubelet's `generateServiceAccountCacheKey`).
    cache_key: String,
    /// Concurrent execs for the same image, token and annotations are one.
    flight_key: Option<String>,
}

/// kubelet's sha256 of a token, as it appears in cache keys.
fn token_hash(token: &str) -> String {
    use sha2::{Digest as _, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(token.as_bytes())))
}

impl Provider {
    async fn provide(
        &self,
        image: &str,
        pod: Option<&PodIdentity>,
        timeout: Duration,
    ) -> Result<Keyring, String> {
        let context = match &self.token_attributes {
            None => ServiceAccountContext::default(),
            Some(attrs) => match self.service_account_context(attrs, image, pod).await? {
                Some(c) => c,
                // kubelet: no credentials, and no error worth more than a debug line.
                None => return Ok(Keyring::default()),
            },
        };
        if let Some(hit) = self.cached(image, &context.cache_key) {
            return Ok(hit);
        }
        let flight_key = context
            .flight_key
            .clone()
            .unwrap_or_else(|| image.to_owned());
        let flight = {
            let mut f = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(f.entry(flight_key.clone()).or_default())
        };
        let guard = flight.lock().await;
        // A concurrent exec for the same image may have filled the cache meanwhile.
        let result = match self.cached(image, &context.cache_key) {
            Some(hit) => Ok(hit),
            None => self.exec_and_cache(image, &context, timeout).await,
        };
        drop(guard);
        let mut f = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&flight) <= 2 {
            f.remove(&flight_key);
        }
        result
    }

    /// The pod's service account, its selected annotations and a token for the audience;
    /// `None` when kubelet would not run the plugin (no service account and one is required,
    /// or a required annotation is missing).
    async fn service_account_context(
        &self,
        attrs: &TokenAttributes,
        image: &str,
        pod: Option<&PodIdentity>,
    ) -> Result<Option<ServiceAccountContext>, String> {
        let Some(pod) = pod.filter(|p| !p.service_account.is_empty()) else {
            if attrs.require_service_account {
                tracing::debug!(provider = %self.name, %image, "no service account for the pull; the provider requires one");
                return Ok(None);
            }
            return Ok(Some(ServiceAccountContext::default()));
        };
        let (namespace, name) = (pod.namespace.as_str(), pod.service_account.as_str());
        let account = match pod.tokens.service_account(namespace, name).await {
            Ok(Some(a)) => a,
            Ok(None) => {
                return Err(format!(
                    "Failed to get service account {namespace}/{name}: not found"
                ))
            }
            Err(e) => {
                return Err(format!(
                    "Failed to get service account {namespace}/{name}: {e}"
                ))
            }
        };
        let mut annotations = BTreeMap::new();
        for k in &attrs.required_annotation_keys {
            match account.annotations.get(k) {
                Some(v) => {
                    annotations.insert(k.clone(), v.clone());
                }
                None => {
                    tracing::debug!(provider = %self.name, %image, service_account = %format!("{namespace}/{name}"),
                        "required annotation {k} not found; the provider is not run");
                    return Ok(None);
                }
            }
        }
        for k in &attrs.optional_annotation_keys {
            if let Some(v) = account.annotations.get(k) {
                annotations.insert(k.clone(), v.clone());
            }
        }
        let token = pod
            .tokens
            .token(&TokenFor {
                namespace,
                service_account: name,
                service_account_uid: &account.uid,
                pod_name: &pod.name,
                pod_uid: &pod.uid,
                audience: &attrs.audience,
            })
            .await
            .map_err(|e| format!("Error getting service account token {namespace}/{name}: {e}"))?;
        let hash = token_hash(&token);
        let mut key = serde_json::json!([namespace, name, account.uid, annotations]);
        if attrs.cache_type == TokenCacheType::Token {
            if let Some(parts) = key.as_array_mut() {
                parts.push("token".into());
                parts.push(hash.clone().into());
            }
        }
        let flight_key = serde_json::json!([image, hash, annotations]).to_string();
        Ok(Some(ServiceAccountContext {
            token,
            annotations,
            cache_key: key.to_string(),
            flight_key: Some(flight_key),
        }))
    }

    /// kubelet's lookup order: the image, its registry, then the global entry, each with
    /// the service-account key.
    fn cached(&self, image: &str, sa_key: &str) -> Option<Keyring> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        cache.retain(|_, e| e.expires > now);
        [image, registry_of(image), GLOBAL_CACHE_KEY]
            .iter()
            .find_map(|k| cache.get(&((*k).to_owned(), sa_key.to_owned())))
            .map(|e| e.keyring.clone())
    }

    async fn exec_and_cache(
        &self,
        image: &str,
        context: &ServiceAccountContext,
        timeout: Duration,
    ) -> Result<Keyring, String> {
        let response = self.exec(image, context, timeout).await?;
        let token_cache = self
            .token_attributes
            .as_ref()
            .is_some_and(|a| a.cache_type == TokenCacheType::Token);
        if !context.token.is_empty()
            && !token_cache
            && response.auth.values().any(|a| a.password == context.token)
        {
            return Err(format!(
                "Credential provider plugin returned the service account token as the password for image {image:?}, which is not allowed when service account cache type is not set to 'Token'"
            ));
        }
        let cache_key = match response.cache_key_type.as_str() {
            "Image" => image.to_owned(),
            "Registry" => registry_of(image).to_owned(),
            "Global" => GLOBAL_CACHE_KEY.to_owned(),
            other => {
                return Err(format!(
                    "credential provider plugin {} did not return a valid cacheKeyType: {other:?}",
                    self.name
                ))
            }
        };
        let duration = match response.cache_duration.as_deref() {
            Some(d) => parse_duration(d).map_err(|e| {
                format!(
                    "credential provider plugin {} returned an invalid cacheDuration: {e}",
                    self.name
                )
            })?,
            None => self.default_cache_duration,
        };
        let mut ring = Keyring::default();
        for (pattern, auth) in response.auth {
            ring.add(
                &pattern,
                Credentials {
                    username: auth.username,
                    password: auth.password,
                },
            );
        }
        tracing::debug!(provider = %self.name, %image, %cache_key, ?duration, "credential provider plugin answered");
        if !duration.is_zero() {
            self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
                (cache_key, context.cache_key.clone()),
                CacheEntry {
                    keyring: ring.clone(),
                    expires: Instant::now() + duration,
                },
            );
        }
        Ok(ring)
    }

    async fn exec(
        &self,
        image: &str,
        context: &ServiceAccountContext,
        timeout: Duration,
    ) -> Result<Response, String> {
        let failed = |why: String| {
            format!(
                "error execing credential provider plugin {} for image {image}: {why}",
                self.name
            )
        };
        let request = serde_json::to_vec(&Request {
            kind: "CredentialProviderRequest",
            api_version: &self.api_version,
            image,
            service_account_token: &context.token,
            service_account_annotations: &context.annotations,
        })
        .map_err(|e| failed(e.to_string()))?;
        let mut cmd = tokio::process::Command::new(&self.binary);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = crate::network::spawn_retrying_busy(&mut cmd)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let pgid = child.id();
        let stdin = child.stdin.take();
        let write = async move {
            if let Some(mut pipe) = stdin {
                // A plugin that does not read its request: its exit tells what happened.
                let _ = pipe.write_all(&request).await;
            }
        };
        let run = async { tokio::join!(write, child.wait_with_output()).1 };
        let output = match tokio::time::timeout(timeout, run).await {
            Ok(out) => out.map_err(|e| failed(e.to_string()))?,
            Err(_) => {
                // The whole group: a shell script's children too.
                if let Some(pid) = pgid.and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                return Err(failed(format!(
                    "timed out after {}",
                    humantime_secs(timeout)
                )));
            }
        };
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let mut stderr = stderr.trim().to_owned();
            if stderr.len() > STDERR_LIMIT {
                let mut end = STDERR_LIMIT;
                while !stderr.is_char_boundary(end) {
                    end -= 1;
                }
                stderr.truncate(end);
                stderr.push('…');
            }
            return Err(failed(format!("{}, stderr: {stderr}", output.status)));
        }
        let response: Response = serde_json::from_slice(&output.stdout).map_err(|e| {
            format!(
                "error decoding the response of credential provider plugin {}: {e}",
                self.name
            )
        })?;
        if response.kind != "CredentialProviderResponse" {
            return Err(format!(
                "credential provider plugin {} returned kind {:?}, expected \"CredentialProviderResponse\"",
                self.name, response.kind
            ));
        }
        if response.api_version != self.api_version {
            return Err(format!(
                "apiVersion from credential plugin response did not match expected apiVersion:{}, actual apiVersion:{}",
                self.api_version, response.api_version
            ));
        }
        Ok(response)
    }
}

/// `host[:port]` of `host[:port]/repository` (kubelet's `parseRegistry`).
fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::duration::parse_duration(text)
}

fn humantime_secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// What Go's `url.Parse("https://" + m)` refuses, roughly: blanks and control characters,
/// an empty host, a port that is not a number.
fn check_match_image(m: &str) -> Result<(), String> {
    if m.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains a blank or control character".into());
    }
    let host = m.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err("no host".into());
    }
    if let Some((_, port)) = host.rsplit_once(':') {
        if !port.chars().all(|c| c.is_ascii_digit()) {
            return Err(format!("invalid port {port:?} after host"));
        }
    }
    Ok(())
}

/// kubelet's `validateCredentialProviderConfig` for `tokenAttributes`; the error starts
/// with the rest of the field path (`.cacheType: …`, or `: …` for the whole).
fn check_token_attributes(
    t: TokenAttributesSpec,
    api_version: &str,
) -> Result<TokenAttributes, String> {
    const V1: &str = "credentialprovider.kubelet.k8s.io/v1";
    if t.service_account_token_audience.is_empty() {
        return Err(".serviceAccountTokenAudience: Required value".into());
    }
    let Some(require_service_account) = t.require_service_account else {
        return Err(".requireServiceAccount: Required value".into());
    };
    if api_version != V1 {
        return Err(format!(
            ": Forbidden: tokenAttributes is only supported for {V1} API version"
        ));
    }
    if !require_service_account && !t.required_service_account_annotation_keys.is_empty() {
        return Err(
            ".requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount \
                    cannot be false when requiredServiceAccountAnnotationKeys is set"
                .into(),
        );
    }
    for (list, keys) in [
        (
            "requiredServiceAccountAnnotationKeys",
            &t.required_service_account_annotation_keys,
        ),
        (
            "optionalServiceAccountAnnotationKeys",
            &t.optional_service_account_annotation_keys,
        ),
    ] {
        for (i, k) in keys.iter().enumerate() {
            // As for annotation keys: a qualified name, whatever the case.
            if let Err(why) = qualified_name(&k.to_ascii_lowercase()) {
                return Err(format!(".{list}: Invalid value: {k:?}: {why}"));
            }
            if keys[..i].contains(k) {
                return Err(format!(".{list}: Duplicate value: {k:?}"));
            }
        }
    }
    let both: Vec<&String> = t
        .required_service_account_annotation_keys
        .iter()
        .filter(|k| t.optional_service_account_annotation_keys.contains(k))
        .collect();
    if !both.is_empty() {
        return Err(format!(
            ": Invalid value: {both:?}: annotation keys cannot be both required and optional"
        ));
    }
    let cache_type = match t.cache_type.as_str() {
        "ServiceAccount" => TokenCacheType::ServiceAccount,
        "Token" => TokenCacheType::Token,
        "" => {
            return Err(".cacheType: Required value: cacheType is required to be set when \
                        tokenAttributes is specified. Supported values are: ServiceAccount, Token"
                .into())
        }
        other => {
            return Err(format!(
                ".cacheType: Unsupported value: {other:?}: supported values: \"ServiceAccount\", \"Token\""
            ))
        }
    };
    Ok(TokenAttributes {
        audience: t.service_account_token_audience,
        cache_type,
        require_service_account,
        required_annotation_keys: t.required_service_account_annotation_keys,
        optional_annotation_keys: t.optional_service_account_annotation_keys,
    })
}

/// apimachinery's `IsQualifiedName`: `[prefix/]name`, the prefix a DNS-1123 subdomain,
/// the name 1 to 63 of `[A-Za-z0-9_.-]` with alphanumeric ends.
fn qualified_name(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let alnum_ends = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    if let Some(p) = prefix {
        let part_ok = |part: &str| {
            alnum_ends(part)
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if p.is_empty() {
            return Err("prefix part must be non-empty");
        }
        if p.len() > 253 || !p.split('.').all(part_ok) {
            return Err(
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case \
                        alphanumeric characters, '-' or '.', and must start and end with an \
                        alphanumeric character",
            );
        }
    }
    if name.is_empty() {
        return Err("name part must be non-empty");
    }
    if name.len() > 63 {
        return Err("name part must be no more than 63 characters");
    }
    let chars_ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !chars_ok || !alnum_ends(name) {
        return Err(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and \
                    must start and end with an alphanumeric character",
        );
    }
    Ok(())
}

fn check_binary(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err("not executable".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin_dir() -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ecr");
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn parse(yaml: &str, bins: &Path) -> Result<CredentialProviders, String> {
        CredentialProviders::parse(yaml, Path::new("/etc/cp.yaml"), bins).map_err(|e| e.to_string())
    }

    const GOOD: &str = "apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: ecr
  matchImages: [\"*.dkr.ecr.*.amazonaws.com\", \"127.0.0.1:5000\"]
  defaultCacheDuration: 12h
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  args: [get-credentials]
  env: [{name: AWS_PROFILE, value: temp}]
";

    #[test]
    fn a_kubelet_config_loads_and_every_mistake_is_named() {
        let bins = bin_dir();
        let cp = parse(GOOD, bins.path()).unwrap();
        assert_eq!(
            cp.providers[0].default_cache_duration,
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(cp.providers[0].env, [("AWS_PROFILE".into(), "temp".into())]);
        let cases = [
            (
                GOOD.replace("kubelet.config.k8s.io/v1\n", "v1\n"),
                "apiVersion \"v1\" is not supported",
            ),
            (
                GOOD.replace("kind: CredentialProviderConfig", "kind: Config"),
                "kind is \"Config\"",
            ),
            (
                GOOD.replace("name: ecr", "name: a/b"),
                "providers[0].name: Invalid value: \"a/b\": provider name cannot contain '/'",
            ),
            (
                GOOD.replace(
                    "  matchImages: [\"*.dkr.ecr.*.amazonaws.com\", \"127.0.0.1:5000\"]\n",
                    "",
                ),
                "providers[0].matchImages: Required value",
            ),
            (
                GOOD.replace("127.0.0.1:5000", "host:port"),
                "match image is invalid: invalid port \"port\"",
            ),
            (
                GOOD.replace("  defaultCacheDuration: 12h\n", ""),
                "providers[0].defaultCacheDuration: Required value",
            ),
            (
                GOOD.replace("12h", "soon"),
                "defaultCacheDuration: Invalid value",
            ),
            (
                GOOD.replace("credentialprovider.kubelet.k8s.io/v1", "v9"),
                "providers[0].apiVersion: Unsupported value: \"v9\"",
            ),
            (
                GOOD.replace("name: ecr", "name: gcr"),
                "provider \"gcr\": error inspecting binary executable",
            ),
            (
                GOOD.replace("  args:", "  tokenAttribute: {}\n  args:"),
                "unknown field `tokenAttribute`",
            ),
            (
                format!("{GOOD}{}", &GOOD[GOOD.find("- name").unwrap()..]),
                "providers[1].name: Duplicate value: \"ecr\"",
            ),
            (
                "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n".to_owned(),
                "at least 1 item in plugins is required",
            ),
        ];
        for (yaml, want) in cases {
            let err = parse(&yaml, bins.path()).map(drop).unwrap_err();
            assert!(err.contains("/etc/cp.yaml: "), "{err}");
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
    }

    const TOKENED: &str = "apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: ecr
  matchImages: [\"reg.example:5000\"]
  defaultCacheDuration: 1h
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  tokenAttributes:
    serviceAccountTokenAudience: reg-audience
    cacheType: ServiceAccount
    requireServiceAccount: true
    requiredServiceAccountAnnotationKeys: [example.com/role]
    optionalServiceAccountAnnotationKeys: [example.com/extra]
";

    #[test]
    fn token_attributes_load_and_every_mistake_is_named_as_kubelet_names_it() {
        let bins = bin_dir();
        let cp = parse(TOKENED, bins.path()).unwrap();
        let t = cp.providers[0].token_attributes.clone().unwrap();
        assert_eq!(t.audience, "reg-audience");
        assert_eq!(t.cache_type, TokenCacheType::ServiceAccount);
        assert!(t.require_service_account);
        assert_eq!(t.required_annotation_keys, ["example.com/role"]);
        let cases = [
            (
                TOKENED.replace("    serviceAccountTokenAudience: reg-audience\n", ""),
                "providers[0].tokenAttributes.serviceAccountTokenAudience: Required value",
            ),
            (
                TOKENED.replace("    requireServiceAccount: true\n", ""),
                "providers[0].tokenAttributes.requireServiceAccount: Required value",
            ),
            (
                TOKENED.replace("    cacheType: ServiceAccount\n", ""),
                "providers[0].tokenAttributes.cacheType: Required value: cacheType is required \
                 to be set when tokenAttributes is specified. Supported values are: \
                 ServiceAccount, Token",
            ),
            (
                TOKENED.replace("cacheType: ServiceAccount", "cacheType: Pod"),
                "providers[0].tokenAttributes.cacheType: Unsupported value: \"Pod\": supported \
                 values: \"ServiceAccount\", \"Token\"",
            ),
            (
                TOKENED.replace(
                    "apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
                    "apiVersion: credentialprovider.kubelet.k8s.io/v1beta1\n",
                ),
                "providers[0].tokenAttributes: Forbidden: tokenAttributes is only supported for \
                 credentialprovider.kubelet.k8s.io/v1 API version",
            ),
            (
                TOKENED.replace(
                    "requireServiceAccount: true",
                    "requireServiceAccount: false",
                ),
                "providers[0].tokenAttributes.requiredServiceAccountAnnotationKeys: Forbidden: \
                 requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys \
                 is set",
            ),
            (
                TOKENED.replace("[example.com/extra]", "[example.com/role]"),
                "providers[0].tokenAttributes: Invalid value: [\"example.com/role\"]: annotation \
                 keys cannot be both required and optional",
            ),
            (
                TOKENED.replace("[example.com/extra]", "[a, a]"),
                "providers[0].tokenAttributes.optionalServiceAccountAnnotationKeys: Duplicate \
                 value: \"a\"",
            ),
            (
                TOKENED.replace("[example.com/extra]", "[\"Example_.com/x\"]"),
                "optionalServiceAccountAnnotationKeys: Invalid value: \"Example_.com/x\": \
                 prefix part a lowercase RFC 1123 subdomain",
            ),
            (
                TOKENED.replace("[example.com/extra]", "[\"example.com/-x\"]"),
                "name part must consist of alphanumeric characters",
            ),
            (
                TOKENED.replace("    cacheType: ServiceAccount\n", "    cachetype: Token\n"),
                "unknown field `cachetype`",
            ),
        ];
        for (yaml, want) in cases {
            let err = parse(&yaml, bins.path()).map(drop).unwrap_err();
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
        // Upper case is fine in a key (checked lower-cased, as kubelet does).
        let upper = TOKENED.replace("[example.com/extra]", "[example.com/Extra]");
        assert!(parse(&upper, bins.path()).is_ok());
    }

    /// Service accounts `ns/<name>` with UID `uid-<name>`; `annotated` carries the required
    /// annotation. Tokens are `token-<sa>-<pod>-<audience>-<n>` (n counts requests).
    struct FakeTokens {
        issued: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl ServiceAccountTokens for FakeTokens {
        async fn service_account(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<ServiceAccountInfo>, String> {
            let mut annotations = BTreeMap::new();
            if name == "annotated" {
                annotations.insert("example.com/role".to_owned(), "puller".to_owned());
                annotations.insert("example.com/extra".to_owned(), "x".to_owned());
                annotations.insert("example.com/other".to_owned(), "not sent".to_owned());
            }
            Ok(
                (namespace == "ns" && name != "missing").then(|| ServiceAccountInfo {
                    uid: format!("uid-{name}"),
                    annotations,
                }),
            )
        }

        async fn token(&self, r: &TokenFor<'_>) -> Result<String, String> {
            let mut issued = self.issued.lock().unwrap();
            assert_eq!(r.service_account_uid, format!("uid-{}", r.service_account));
            let t = format!(
                "token-{}-{}-{}-{}",
                r.service_account,
                r.pod_name,
                r.audience,
                issued.len()
            );
            issued.push(t.clone());
            Ok(t)
        }
    }

    /// A plugin that appends each request to `<dir>/calls` and answers `user`/`pass`
    /// (`pass` = `ECHO`: the token it was sent).
    fn plugin(config: &str, pass: &str) -> (tempfile::TempDir, CredentialProviders) {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let calls = dir.path().join("calls");
        let script = format!(
            r#"#!/bin/sh
req=$(cat)
printf '%s\n' "$req" >> {calls}
pass={pass}
case "$pass$req" in
ECHO*serviceAccountToken*) pass=$(printf '%s' "$req" | sed 's/.*"serviceAccountToken":"\([^"]*\)".*/\1/') ;;
ECHO*) pass=no-token ;;
esac
printf '{{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Registry","auth":{{"reg.example:5000":{{"username":"user","password":"%s"}}}}}}' "$pass"
"#,
            calls = calls.display()
        );
        let bin = dir.path().join("ecr");
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cp = parse(config, dir.path()).unwrap();
        (dir, cp)
    }

    fn calls(dir: &tempfile::TempDir) -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn pod(name: &str, sa: &str, tokens: &Arc<FakeTokens>) -> PodIdentity {
        PodIdentity {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            service_account: sa.into(),
            tokens: Arc::clone(tokens) as Arc<dyn ServiceAccountTokens>,
        }
    }

    fn password(ring: &Keyring) -> Option<String> {
        ring.lookup("reg.example:5000/app")
            .first()
            .map(|c| c.password.clone())
    }

    #[tokio::test]
    async fn a_token_provider_gets_the_pods_token_and_annotations_and_caches_per_service_account() {
        let tokens = Arc::new(FakeTokens {
            issued: Mutex::new(Vec::new()),
        });
        let (dir, cp) = plugin(TOKENED, "secret");
        let image = "reg.example:5000/app";
        assert!(cp.depends_on_service_account(image));
        assert!(!cp.depends_on_service_account("other.example/app"));
        let (ring, errors) = cp
            .provide(image, Some(&pod("web-1", "annotated", &tokens)))
            .await;
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(password(&ring).as_deref(), Some("secret"));
        let sent = calls(&dir);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["image"], image);
        assert_eq!(
            sent[0]["serviceAccountToken"],
            "token-annotated-web-1-reg-audience-0"
        );
        // The required and optional keys only.
        assert_eq!(
            sent[0]["serviceAccountAnnotations"],
            serde_json::json!({"example.com/role": "puller", "example.com/extra": "x"})
        );
        // Another pod of the same service account: the cache (a token is still requested,
        // as kubelet does, but the plugin is not run).
        let (ring, _) = cp
            .provide(image, Some(&pod("web-2", "annotated", &tokens)))
            .await;
        assert_eq!(password(&ring).as_deref(), Some("secret"));
        assert_eq!(calls(&dir).len(), 1);
        // A service account without the required annotation: the plugin is not run, and
        // the cached credentials of the other account are not given.
        let (ring, errors) = cp.provide(image, Some(&pod("db", "plain", &tokens))).await;
        assert!(password(&ring).is_none() && errors.is_empty(), "{errors:?}");
        assert_eq!(calls(&dir).len(), 1);
        // No pod, or no service account: required, so nothing.
        assert!(password(&cp.provide(image, None).await.0).is_none());
        assert!(password(&cp.provide(image, Some(&pod("s", "", &tokens))).await.0).is_none());
        assert_eq!(calls(&dir).len(), 1);
        // A service account that does not exist: an error saying so.
        let (_, errors) = cp.provide(image, Some(&pod("m", "missing", &tokens))).await;
        assert!(
            errors[0].contains("Failed to get service account ns/missing"),
            "{errors:?}"
        );
    }

    #[tokio::test]
    async fn token_cache_type_keys_by_token_and_only_it_may_echo_the_token() {
        let tokens = Arc::new(FakeTokens {
            issued: Mutex::new(Vec::new()),
        });
        let image = "reg.example:5000/app";
        // ServiceAccount cache type: the token echoed back as the password is refused.
        let (dir, cp) = plugin(TOKENED, "ECHO");
        let (ring, errors) = cp
            .provide(image, Some(&pod("web", "annotated", &tokens)))
            .await;
        assert!(password(&ring).is_none());
        assert!(
            errors[0].contains("returned the service account token as the password"),
            "{errors:?}"
        );
        assert_eq!(calls(&dir).len(), 1);
        // Token cache type, no required annotation, service account optional: echoing is
        // allowed, each new token runs the plugin again, and a pod without a service
        // account is served without a token.
        let config = TOKENED
            .replace("cacheType: ServiceAccount", "cacheType: Token")
            .replace(
                "requireServiceAccount: true",
                "requireServiceAccount: false",
            )
            .replace(
                "    requiredServiceAccountAnnotationKeys: [example.com/role]\n",
                "",
            );
        let (dir, cp) = plugin(&config, "ECHO");
        for (n, p) in ["a", "b"].iter().enumerate() {
            let (ring, errors) = cp.provide(image, Some(&pod(p, "plain", &tokens))).await;
            assert!(errors.is_empty(), "{errors:?}");
            let token = password(&ring).unwrap();
            assert!(token.starts_with(&format!("token-plain-{p}-")), "{token}");
            assert_eq!(calls(&dir).len(), n + 1);
        }
        let (_, errors) = cp.provide(image, None).await;
        assert!(errors.is_empty(), "{errors:?}");
        let sent = calls(&dir);
        assert_eq!(sent.len(), 3);
        assert!(sent[2].get("serviceAccountToken").is_none(), "{}", sent[2]);
        assert!(sent[2].get("serviceAccountAnnotations").is_none());
    }

    #[test]
    fn a_binary_that_is_not_executable_is_refused_at_load() {
        use std::os::unix::fs::PermissionsExt as _;
        let bins = bin_dir();
        std::fs::set_permissions(
            bins.path().join("ecr"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let err = parse(GOOD, bins.path()).map(drop).unwrap_err();
        assert!(err.contains("not executable"), "{err}");
    }
}

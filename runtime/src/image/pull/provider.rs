//! [`CredentialProviders`]: kubelet's credential provider plugins
//! (`--image-credential-provider-config` / `--image-credential-provider-bin-dir`).
//!
//! ```text
//!  CredentialProviderConfig (kubelet.config.k8s.io/v1)      <bin-dir>/<name>
//!   providers: [{name, matchImages, defaultCacheDuration,   (checked at load: a missing
//!                apiVersion, args, env}]                      binary fails the start)
//!
//!  provide(image) ─► for each provider whose matchImages match the image
//!                    ─► cache: image key, then registry key, then global key ─► hit: its auth
//!                    └► miss: one exec per (provider, image) at a time ─► stdin
//!                       CredentialProviderRequest {image} ─► stdout CredentialProviderResponse
//!                       {cacheKeyType, cacheDuration?, auth: {glob: {username, password}}}
//!                       ─► cached for cacheDuration (absent: defaultCacheDuration; 0: not cached)
//! ```
//!
//! As in kubelet, a plugin that fails, times out (1 minute) or answers badly gives no
//! credentials (the pull goes on with the others); its error is logged and returned, so a
//! pull that then fails says why. The plugin runs in its own process group, killed whole
//! on timeout. Its environment is the node's plus the provider's `env`.

use std::collections::HashMap;
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
    cache: Mutex<HashMap<String, CacheEntry>>,
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
    /// tag), in provider-name order as kubelet registers them, and the errors of the
    /// providers that failed.
    pub(crate) async fn provide(&self, image: &str) -> (Keyring, Vec<String>) {
        let mut order: Vec<&Provider> = self
            .providers
            .iter()
            .filter(|p| p.match_images.iter().any(|m| urls_match(m, image)))
            .collect();
        order.sort_by(|a, b| a.name.cmp(&b.name));
        let mut ring = Keyring::default();
        let mut errors = Vec::new();
        for p in order {
            match p.provide(image, self.exec_timeout).await {
                Ok(r) => ring.extend(r),
                Err(e) => {
                    tracing::warn!(provider = %p.name, %image, err = %e, "Failed getting credential from external registry credential provider");
                    errors.push(e);
                }
            }
        }
        (ring, errors)
    }
}

impl Provider {
    async fn provide(&self, image: &str, timeout: Duration) -> Result<Keyring, String> {
        if let Some(hit) = self.cached(image) {
            return Ok(hit);
        }
        let flight = {
            let mut f = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(f.entry(image.to_owned()).or_default())
        };
        let guard = flight.lock().await;
        // A concurrent exec for the same image may have filled the cache meanwhile.
        let result = match self.cached(image) {
            Some(hit) => Ok(hit),
            None => self.exec_and_cache(image, timeout).await,
        };
        drop(guard);
        let mut f = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&flight) <= 2 {
            f.remove(image);
        }
        result
    }

    /// kubelet's lookup order: the image, its registry, then the global entry.
    fn cached(&self, image: &str) -> Option<Keyring> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        cache.retain(|_, e| e.expires > now);
        [image, registry_of(image), GLOBAL_CACHE_KEY]
            .iter()
            .find_map(|k| cache.get(*k))
            .map(|e| e.keyring.clone())
    }

    async fn exec_and_cache(&self, image: &str, timeout: Duration) -> Result<Keyring, String> {
        let response = self.exec(image, timeout).await?;
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
                cache_key,
                CacheEntry {
                    keyring: ring.clone(),
                    expires: Instant::now() + duration,
                },
            );
        }
        Ok(ring)
    }

    async fn exec(&self, image: &str, timeout: Duration) -> Result<Response, String> {
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
                GOOD.replace("  args:", "  tokenAttributes: {}\n  args:"),
                "unknown field `tokenAttributes`",
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

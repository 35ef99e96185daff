//! [`Puller`]: one image pull, end to end, and the sharing of concurrent pulls.
//!
//! ```text
//!  pull(ref) ─► in flight for (ref, platform, credentials)? ─► yes: wait for its result
//!            └► no: spawn ─► endpoints (mirrors…, registry) ─► first that serves the manifest
//!                        ─► index? pick the platform's manifest ─► config (verified)
//!                        ─► gc lock shared ─► layers not yet unpacked, N at a time, each
//!                           streamed into its snapshot (layer.rs) ─► config + manifest blobs
//!                        ─► one index update: record + tags ─► (after) one syncfs for the
//!                           layers, which marks them durable (snapshot.rs)
//! ```
//!
//! Guarantees: the index names the image only after every blob matched its digest and every
//! layer its diff_id; a failed or interrupted pull leaves only `ingest/*` and
//! `snapshots/tmp-*` (removed by gc, which the runtime runs at start-up) and verified
//! snapshots that a re-pull reuses. The spawned pull runs to its end even when every caller
//! gave up, so a re-pull after a timeout finds the layers done.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use futures_util::StreamExt;

use super::credentials::{Credentials, Keyring};
use super::layer::fetch_layer;
use super::platform::PlatformSpec;
use super::provider::{CredentialProviders, PodIdentity};
use super::registries::RegistriesConfig;
use super::remote::{ClientCache, Remote};
use crate::image::digest::Digest;
use crate::image::error::ImageError;
use crate::image::fsx::LockKind;
use crate::image::import::record_of;
use crate::image::oci::{self, Index, Manifest};
use crate::image::reference::Reference;
use crate::image::store::{image_of, ImageStore};
use crate::types::Image;

/// Node-wide pull settings.
#[derive(Debug, Clone)]
pub struct PullConfig {
    /// Mirrors, rewrites, per-registry TLS and auth (`--registry-config`).
    pub registries: RegistriesConfig,
    /// The node's docker config files (`<root-dir>/config.json`, `~/.docker/config.json`).
    pub node_keyring: Keyring,
    /// Layers of one image downloaded at once (containerd's default is 3).
    pub max_concurrent_layers: usize,
    /// The platform taken from image indexes (the node's own).
    pub platform: PlatformSpec,
    /// kubelet's credential provider plugins (`--image-credential-provider-config`), with
    /// their caches (shared by every pull).
    pub credential_providers: Option<Arc<CredentialProviders>>,
}

impl Default for PullConfig {
    fn default() -> Self {
        Self {
            registries: RegistriesConfig::default(),
            node_keyring: Keyring::default(),
            max_concurrent_layers: 3,
            platform: PlatformSpec::host(),
            credential_providers: None,
        }
    }
}

/// One pull as a caller asks for it.
#[derive(Debug, Clone, Default)]
pub struct PullRequest {
    /// Credentials tried before the node's (pod `imagePullSecrets`, `--creds`).
    pub keyring: Keyring,
    /// Another platform than the node's (`ironlet images pull --platform`).
    pub platform: Option<PlatformSpec>,
    /// Receives progress as the pull goes (the CLI prints it); only the caller that
    /// starts a pull gets its progress.
    pub progress: Option<tokio::sync::mpsc::UnboundedSender<PullProgress>>,
    /// The pod the image is for: credential provider plugins with `tokenAttributes` get a
    /// token of its service account.
    pub pod: Option<PodIdentity>,
}

/// A step of a pull, for progress displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullProgress {
    /// The manifest was found at `endpoint`.
    Resolved {
        manifest: String,
        endpoint: String,
        layers: usize,
    },
    /// A layer is already unpacked in the store.
    LayerReused { digest: String },
    /// A layer was downloaded, verified and unpacked.
    LayerDone { digest: String, bytes: u64 },
}

/// What a pull did.
#[derive(Debug, Clone)]
pub struct PullReport {
    pub image: Image,
    /// The manifest digest pulled.
    pub manifest: String,
    pub layers_fetched: usize,
    pub layers_reused: usize,
    pub bytes_fetched: u64,
    /// How long the pull itself took (not the wait to join it).
    pub duration: std::time::Duration,
    /// `false` when this call joined a pull already in flight.
    pub led: bool,
}

type SharedPull = Shared<BoxFuture<'static, Result<PullReport, Arc<ImageError>>>>;

/// Runs pulls against one store and shares concurrent pulls of the same image.
pub struct Puller {
    store: Arc<ImageStore>,
    config: PullConfig,
    in_flight: Arc<Mutex<HashMap<String, SharedPull>>>,
    clients: Arc<ClientCache>,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Puller {
    pub fn new(store: Arc<ImageStore>, config: PullConfig) -> Self {
        Self {
            store,
            config,
            in_flight: Arc::new(Mutex::new(HashMap::new())),
            clients: Arc::new(ClientCache::default()),
        }
    }

    pub fn config(&self) -> &PullConfig {
        &self.config
    }

    /// Pulls `reference`; a pull of the same reference and platform with the same
    /// credentials already in flight is joined instead of started again.
    pub async fn pull(
        &self,
        reference: &str,
        request: PullRequest,
    ) -> Result<PullReport, ImageError> {
        let parsed = Reference::parse(reference)?;
        let platform = request
            .platform
            .clone()
            .unwrap_or_else(|| self.config.platform.clone());
        let mut key = format!("{parsed} {platform} {}", request.keyring.fingerprint());
        // Credentials from a service-account token differ by service account: pods of
        // different accounts never share a pull.
        let by_account = self
            .config
            .credential_providers
            .as_ref()
            .is_some_and(|p| p.depends_on_service_account(&parsed.name()));
        if let Some(pod) = request.pod.as_ref().filter(|_| by_account) {
            key.push_str(&format!(" sa={}/{}", pod.namespace, pod.service_account));
        }
        let (shared, led) = {
            let mut map = self
                .in_flight
                .lock()
                .map_err(|_| ImageError::Task("pull table poisoned".into()))?;
            match map.get(&key) {
                Some(s) => (s.clone(), false),
                None => {
                    let job = Job {
                        store: Arc::clone(&self.store),
                        config: self.config.clone(),
                        reference: parsed,
                        platform,
                        keyring: request.keyring,
                        progress: request.progress,
                        pod: request.pod,
                        clients: Arc::clone(&self.clients),
                    };
                    // The task, not the caller, leaves the table: a caller may be dropped.
                    let table = Arc::clone(&self.in_flight);
                    let done_key = key.clone();
                    let handle = tokio::spawn(async move {
                        let result = job.run().await;
                        if let Ok(mut map) = table.lock() {
                            map.remove(&done_key);
                        }
                        result
                    });
                    let fut: BoxFuture<'static, _> = async move {
                        handle
                            .await
                            .map_err(|e| Arc::new(ImageError::Task(e.to_string())))?
                            .map_err(Arc::new)
                    }
                    .boxed();
                    let s = fut.shared();
                    map.insert(key, s.clone());
                    (s, true)
                }
            }
        };
        match shared.await {
            Ok(mut report) => {
                report.led = led;
                Ok(report)
            }
            // The leader gets its own error back; followers a shared one.
            Err(e) if led => Err(Arc::try_unwrap(e).unwrap_or_else(ImageError::Shared)),
            Err(e) => Err(ImageError::Shared(e)),
        }
    }
}

/// One pull's inputs.
struct Job {
    store: Arc<ImageStore>,
    config: PullConfig,
    reference: Reference,
    platform: PlatformSpec,
    keyring: Keyring,
    progress: Option<tokio::sync::mpsc::UnboundedSender<PullProgress>>,
    pod: Option<PodIdentity>,
    clients: Arc<ClientCache>,
}

/// A manifest found at an endpoint.
struct Resolved {
    remote: Arc<Remote>,
    manifest_bytes: Vec<u8>,
    manifest_digest: Digest,
    manifest: Manifest,
    config_bytes: Vec<u8>,
}

impl Job {
    async fn run(self) -> Result<PullReport, ImageError> {
        let started = Instant::now();
        let resolved = self.resolve_any().await?;
        let Resolved {
            remote,
            manifest_bytes,
            manifest_digest,
            manifest,
            config_bytes,
        } = resolved;
        let location = remote.location(&manifest_digest);
        for layer in &manifest.layers {
            let foreign = layer.media_type.contains("foreign")
                || layer.media_type.contains("nondistributable");
            if foreign {
                return Err(ImageError::ForeignLayer {
                    reference: self.reference.to_string(),
                    digest: layer.digest.to_string(),
                    media_type: layer.media_type.clone(),
                });
            }
            if !oci::is_supported_layer(&layer.media_type) {
                return Err(ImageError::UnsupportedMediaType {
                    location: location.clone(),
                    media_type: layer.media_type.clone(),
                    digest: layer.digest.to_string(),
                });
            }
        }
        let record = record_of(&manifest, &config_bytes, &location)?;
        let store = Arc::clone(&self.store);
        let gc_guard = tokio::task::spawn_blocking(move || store.gc_lock(LockKind::Shared))
            .await
            .map_err(|e| ImageError::Task(e.to_string()))??;
        let (todo, reused): (Vec<_>, Vec<_>) = record
            .layers
            .iter()
            .cloned()
            .partition(|l| self.store.snapshot(&l.chain_id).is_none());
        self.report(PullProgress::Resolved {
            manifest: manifest_digest.to_string(),
            endpoint: remote.endpoint.host.clone(),
            layers: record.layers.len(),
        });
        for l in &reused {
            self.report(PullProgress::LayerReused {
                digest: l.digest.to_string(),
            });
        }
        // After a failure no further layer starts, and the pull ends only when the layers
        // in flight have (their staging removed, or their snapshot verified and kept): a
        // caller that sees the error never races a layer still writing.
        let failed = AtomicBool::new(false);
        let results: Vec<Result<u64, ImageError>> =
            futures_util::stream::iter(todo.iter().cloned())
                .map(|layer| async {
                    if failed.load(Ordering::SeqCst) {
                        return Ok(0);
                    }
                    let digest = layer.digest.to_string();
                    let fetched =
                        fetch_layer(Arc::clone(&self.store), Arc::clone(&remote), layer).await;
                    match fetched {
                        Ok(bytes) => {
                            self.report(PullProgress::LayerDone { digest, bytes });
                            Ok(bytes)
                        }
                        Err(e) => {
                            failed.store(true, Ordering::SeqCst);
                            Err(e)
                        }
                    }
                })
                .buffer_unordered(self.config.max_concurrent_layers.max(1))
                .collect()
                .await;
        let mut bytes_fetched = 0u64;
        for r in results {
            bytes_fetched += r?;
        }
        let store = Arc::clone(&self.store);
        let reference = self.reference.clone();
        let manifest_key = manifest_digest.clone();
        let image = tokio::task::spawn_blocking(move || {
            let _gc = gc_guard;
            store.blobs.write(
                &mut config_bytes.as_slice(),
                Some(crate::image::blobs::Expected {
                    digest: &record.config_digest,
                    size: None,
                }),
                &location,
            )?;
            store.blobs.write_bytes(&manifest_bytes, &location)?;
            store.index.update(|file| {
                file.images.insert(manifest_key.clone(), record.clone());
                for r in [reference.to_string(), reference.repo_digest(&manifest_key)] {
                    file.tag(r.clone(), manifest_key.clone());
                    file.pulled.insert(r);
                }
                Ok(image_of(file, &record.config_digest))
            })
        })
        .await
        .map_err(|e| ImageError::Task(e.to_string()))??
        .ok_or_else(|| ImageError::NotFound(self.reference.to_string()))?;
        // One sync for every layer of the pull, after it (see `snapshot.rs`): the image is
        // usable now (the page cache holds it); only a reboot before the sync ends costs
        // its layers, which are then unpacked again from their (fsynced) blobs.
        let fetched: Vec<_> = todo.iter().map(|l| l.chain_id.clone()).collect();
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || {
            let snapshots: Vec<_> = fetched.iter().filter_map(|c| store.snapshot(c)).collect();
            if let Err(e) = store.make_durable(&snapshots) {
                tracing::warn!(err = %e, "syncing pulled snapshots; they are unpacked again after a reboot");
            }
        });
        tracing::info!(reference = %self.reference, manifest = %manifest_digest, id = %image.id,
            endpoint = %remote.endpoint.host, layers_fetched = todo.len(), layers_reused = reused.len(),
            bytes_fetched, elapsed_ms = started.elapsed().as_millis() as u64, "image pulled");
        Ok(PullReport {
            image,
            manifest: manifest_digest.to_string(),
            layers_fetched: todo.len(),
            layers_reused: reused.len(),
            bytes_fetched,
            duration: started.elapsed(),
            led: true,
        })
    }

    fn report(&self, p: PullProgress) {
        if let Some(tx) = &self.progress {
            // A caller that stopped listening does not stop the pull.
            let _ = tx.send(p);
        }
    }

    /// Tries each endpoint in turn and, at each, every credential that matches it in
    /// kubelet's order (the pod's secrets, then `registries.yaml`, then the node's docker
    /// config files merged with the credential provider plugins' answers), or none when
    /// none match; the error reported is the registry's own (the last), with the failures
    /// of credential provider plugins added.
    async fn resolve_any(&self) -> Result<Resolved, ImageError> {
        let endpoints = self.config.registries.endpoints(&self.reference)?;
        let registries_ring = self.config.registries.keyring()?;
        let mut node_ring = self.config.node_keyring.clone();
        let mut provider_errors = Vec::new();
        if let Some(providers) = &self.config.credential_providers {
            let (ring, errors) = providers
                .provide(&self.reference.name(), self.pod.as_ref())
                .await;
            node_ring.extend(ring);
            provider_errors = errors;
        }
        let mut last = None;
        let count = endpoints.len();
        for (n, endpoint) in endpoints.into_iter().enumerate() {
            // A connection failure moves on to the next endpoint at once; at the last one
            // (the registry itself, usually) the first request is retried.
            let retry = n + 1 == count;
            let target = format!("{}/{}", endpoint.host, endpoint.repository);
            let mut candidates: Vec<Option<&Credentials>> = Vec::new();
            for c in [&self.keyring, &registries_ring, &node_ring]
                .into_iter()
                .flat_map(|ring| ring.lookup(&target))
            {
                if !candidates.contains(&Some(c)) {
                    candidates.push(Some(c));
                }
            }
            if candidates.is_empty() {
                candidates.push(None);
            }
            for creds in candidates {
                let remote = Remote::new(
                    endpoint.clone(),
                    creds,
                    self.reference.to_string(),
                    &self.clients,
                )?;
                match self.resolve(Arc::new(remote), retry).await {
                    Ok(r) => return Ok(r),
                    Err(e) => {
                        tracing::warn!(reference = %self.reference, endpoint = %endpoint.host,
                            user = creds.map(|c| c.username.as_str()), err = %e,
                            "pull attempt failed; trying the next credentials or endpoint");
                        // Only the registry's refusal or failure can differ with other
                        // credentials; bad content would be the same.
                        let next = matches!(
                            e,
                            ImageError::Unauthorized { .. } | ImageError::Registry { .. }
                        );
                        last = Some(e);
                        if !next {
                            break;
                        }
                    }
                }
            }
        }
        let err = last.unwrap_or_else(|| ImageError::NotFound(self.reference.to_string()));
        Err(with_provider_errors(err, &provider_errors))
    }

    async fn resolve(&self, remote: Arc<Remote>, retry: bool) -> Result<Resolved, ImageError> {
        let wanted = self
            .reference
            .digest()
            .map(str::to_owned)
            .unwrap_or_else(|| self.reference.tag().unwrap_or("latest").to_owned());
        remote.authenticate(&wanted, retry).await?;
        let (mut bytes, mut digest) = remote.manifest(&wanted).await?;
        let location = remote.location(&digest);
        if is_index_document(&bytes) {
            let index: Index = oci::parse_json(&bytes, "image index", &location)?;
            let chosen = self.platform.select(&index.manifests).ok_or_else(|| {
                ImageError::NoMatchingPlatform {
                    location: location.clone(),
                    platform: self.platform.to_string(),
                }
            })?;
            (bytes, digest) = remote.manifest(&chosen.digest.to_string()).await?;
        }
        let location = remote.location(&digest);
        let manifest = oci::parse_manifest(&bytes, &location)?;
        let config_bytes = remote.small_blob(&manifest.config).await?;
        Ok(Resolved {
            remote,
            manifest_bytes: bytes,
            manifest_digest: digest,
            manifest,
            config_bytes,
        })
    }
}

/// A registry refusal says why the plugins gave no credentials, when they failed.
fn with_provider_errors(err: ImageError, errors: &[String]) -> ImageError {
    if errors.is_empty() {
        return err;
    }
    let note = format!(" (credential provider: {})", errors.join("; "));
    match err {
        ImageError::Unauthorized {
            reference,
            endpoint,
            message,
        } => ImageError::Unauthorized {
            reference,
            endpoint,
            message: message + &note,
        },
        ImageError::Registry {
            reference,
            endpoint,
            message,
        } => ImageError::Registry {
            reference,
            endpoint,
            message: message + &note,
        },
        other => other,
    }
}

/// An OCI index or Docker manifest list (by `mediaType`, or a `manifests` array when an
/// OCI index omits it).
fn is_index_document(bytes: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Probe>(bytes) {
        Ok(p) => match p.media_type {
            Some(mt) => oci::is_index(&mt),
            None => p.manifests.is_some(),
        },
        Err(_) => false,
    }
}

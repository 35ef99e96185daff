//! The image step of starting a container (kubelet's `imageManager.EnsureImageExists`):
//! the pull policy with kubelet's defaulting, the pod's pull secrets, the per-(pod, image)
//! back-off, and the `Pulling` / `Pulled` / `Failed` / `BackOff` events.
//!
//! ```text
//!  policy (Always | IfNotPresent | Never; unset: Always for :latest or no tag, else IfNotPresent)
//!   ├─ present and not Always, or Always
//!   │  and imported (not pulled) ──────────► Pulled "already present on machine"
//!   ├─ absent and Never ───────────────────► ErrImageNeverPull
//!   └─ pull: in back-off? ─ yes ──────────► BackOff event, ImagePullBackOff (last error kept)
//!            └ no: Pulling ─► pull_image ─► ok: Pulled "Successfully pulled …", back-off reset
//!                                         └► err: Failed, ErrImagePull, back-off doubled
//! ```
//!
//! Credential provider plugins with `tokenAttributes` get the pod's identity
//! ([`PodIdentity`]): its service account is read, and a token for the plugin's audience
//! bound to the pod requested, through the node's API client ([`ObjectTokens`]).
//!
//! The back-off mirrors kubelet's image puller: 10 s, doubling, at most 300 s, per pod UID
//! and image. Pulls wait for a node-wide slot when pulls are serialized or limited
//! (`--serialize-image-pulls`, `--max-parallel-image-pulls`): the `Pulled` event's first
//! time is the pull's own, the second ("including waiting") counts from `Pulling`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ironlet_runtime::image::{
    Keyring, PodIdentity, PullRequest, ServiceAccountInfo, ServiceAccountTokens, TokenFor,
};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::NodeSyncer;
use crate::config::pod_uid;
use crate::kubelet::events::{reason, EventType};
use crate::objects::{ObjectSource, TokenRequestFor};
use crate::pod_workers::SyncError;

/// kubelet leaves a credential provider token's `expirationSeconds` to the API default.
const PROVIDER_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

/// kubelet's image pull back-off: `flowcontrol.NewBackOff(10s, 300s)`.
const PULL_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const PULL_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The effective pull policy of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The container's policy, defaulted as the API server does (`:latest` or no tag →
    /// Always; pods from files and URLs are defaulted the same way in `config::defaults`).
    pub(crate) fn of(container: &Container, image: &str) -> Self {
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or_else(|| crate::config::default_pull_policy(image));
        match policy {
            "Always" => Self::Always,
            "Never" => Self::Never,
            _ => Self::IfNotPresent,
        }
    }
}

/// Failed pulls by `uid/image`: when the next attempt may run, the current window and the
/// last error (kept for the `ImagePullBackOff` message).
#[derive(Debug, Default)]
pub(crate) struct PullBackoff {
    entries: HashMap<String, BackoffEntry>,
}

#[derive(Debug, Clone)]
struct BackoffEntry {
    until: Instant,
    window: Duration,
    last_error: String,
}

impl PullBackoff {
    /// The last error when `key` may not be pulled yet.
    fn held(&self, key: &str, now: Instant) -> Option<&str> {
        self.entries
            .get(key)
            .filter(|e| now < e.until)
            .map(|e| e.last_error.as_str())
    }

    fn failed(&mut self, key: &str, now: Instant, error: String) {
        let window = self.entries.get(key).map_or(PULL_BACKOFF_INITIAL, |e| {
            (e.window * 2).min(PULL_BACKOFF_MAX)
        });
        self.entries.insert(
            key.to_owned(),
            BackoffEntry {
                until: now + window,
                window,
                last_error: error,
            },
        );
    }

    fn succeeded(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Drops the entries of pods that are gone.
    pub(crate) fn retain_pods(&mut self, live: impl Fn(&str) -> bool) {
        self.entries
            .retain(|k, _| k.split_once('/').is_some_and(|(uid, _)| live(uid)));
    }
}

impl NodeSyncer {
    /// Makes sure `image` is present as `container`'s pull policy wants.
    pub(super) async fn ensure_image(
        &self,
        pod: &Pod,
        container: &Container,
        image: &str,
    ) -> Result<(), SyncError> {
        let policy = PullPolicy::of(container, image);
        let present = match self.images.get_image(image).await {
            Ok(found) => found,
            Err(err) => {
                return Err(SyncError::new(
                    err.kubelet_reason(),
                    format!("Failed to inspect image \"{image}\": {err}"),
                ))
            }
        };
        // An imported image is the node's own copy (air-gapped nodes): `Always` re-pulls
        // only what a registry pull put there.
        let keep = match (&present, policy) {
            (Some(_), PullPolicy::Always) => !self.images.is_pulled(image).await.unwrap_or(true),
            (Some(_), _) => true,
            (None, _) => false,
        };
        match (policy, present) {
            (_, Some(found)) if keep => {
                self.remember_image(&found);
                self.event(
                    pod,
                    EventType::Normal,
                    reason::PULLED,
                    format!("Container image \"{image}\" already present on machine"),
                );
                Ok(())
            }
            (PullPolicy::Never, None) => {
                let message =
                    format!("Container image \"{image}\" is not present with pull policy of Never");
                self.event(pod, EventType::Warning, reason::FAILED, message.clone());
                Err(SyncError::new(reason::ERR_IMAGE_NEVER_PULL, message))
            }
            _ => self.pull(pod, image).await,
        }
    }

    async fn pull(&self, pod: &Pod, image: &str) -> Result<(), SyncError> {
        let key = format!("{}/{image}", pod_uid(pod));
        let held = self
            .lock_pull_backoff()
            .held(&key, Instant::now())
            .map(str::to_owned);
        if let Some(last) = held {
            let message = format!("Back-off pulling image \"{image}\": ErrImagePull: {last}");
            self.event(
                pod,
                EventType::Normal,
                reason::BACK_OFF,
                format!("Back-off pulling image \"{image}\""),
            );
            return Err(SyncError::new(reason::IMAGE_PULL_BACK_OFF, message));
        }
        self.event(
            pod,
            EventType::Normal,
            reason::PULLING,
            format!("Pulling image \"{image}\""),
        );
        let started = Instant::now();
        let request = PullRequest {
            keyring: self.pull_secrets(pod).await,
            pod: Some(self.pod_identity(pod)),
            ..PullRequest::default()
        };
        // kubelet's serial / parallel image puller: wait for a slot (FIFO); the wait
        // counts in "including waiting", not in the pull's own time.
        let slot = match &self.pull_slots {
            Some(slots) => slots.clone().acquire_owned().await.ok(),
            None => None,
        };
        let pull_started = Instant::now();
        let pod_name = crate::config::pod_full_name(pod);
        tracing::info!(pod = %pod_name, %image, waited = ?started.elapsed(), "image pull started");
        let result = self.images.pull_image(image, request).await;
        drop(slot);
        tracing::info!(pod = %pod_name, %image, ok = result.is_ok(), "image pull finished");
        match result {
            Ok(report) => {
                // A joined pull started before this call: report at most our own part.
                let waited = started.elapsed();
                let pulled_in = report.duration.min(pull_started.elapsed());
                self.lock_pull_backoff().succeeded(&key);
                self.remember_image(&report.image);
                self.images_changed.notify_one();
                self.event(
                    pod,
                    EventType::Normal,
                    reason::PULLED,
                    format!(
                        "Successfully pulled image \"{image}\" in {:.3}s ({:.3}s including waiting). Image size: {} bytes.",
                        pulled_in.as_secs_f64(),
                        waited.as_secs_f64(),
                        report.image.size
                    ),
                );
                Ok(())
            }
            Err(err) => {
                let text = err.to_string();
                tracing::warn!(pod = %crate::config::pod_full_name(pod), %image, err = %text, "image pull failed");
                self.lock_pull_backoff()
                    .failed(&key, Instant::now(), text.clone());
                self.event(
                    pod,
                    EventType::Warning,
                    reason::FAILED,
                    format!("Failed to pull image \"{image}\": {text}"),
                );
                let kubelet_reason = err.kubelet_reason();
                self.event(
                    pod,
                    EventType::Warning,
                    reason::FAILED,
                    format!("Error: {kubelet_reason}"),
                );
                Err(SyncError::new(
                    kubelet_reason,
                    format!("Failed to pull image \"{image}\": {text}"),
                ))
            }
        }
    }

    fn remember_image(&self, found: &ironlet_runtime::types::Image) {
        if let Some(digest) = found.repo_digests.first() {
            self.image_refs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(found.id.clone(), digest.clone());
        }
    }

    /// The pod's `imagePullSecrets` as a keyring; a secret that is missing or unreadable is
    /// skipped with a warning, as kubelet does ("Unable to retrieve some image pull secrets").
    /// (The service account's `imagePullSecrets` reach the pod spec through the API
    /// server's ServiceAccount admission.)
    async fn pull_secrets(&self, pod: &Pod) -> Keyring {
        let mut ring = Keyring::default();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let names = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.clone());
        for name in names {
            let secret = match self.objects.secret(namespace, &name).await {
                Ok(Some(s)) => s,
                Ok(None) => {
                    tracing::warn!(%namespace, secret = %name, "image pull secret not found; pulling without it");
                    continue;
                }
                Err(err) => {
                    tracing::warn!(%namespace, secret = %name, %err, "image pull secret unreadable; pulling without it");
                    continue;
                }
            };
            let data = secret.data.unwrap_or_default();
            let origin = format!("secret {namespace}/{name}");
            let parsed = match secret.type_.as_deref() {
                Some("kubernetes.io/dockerconfigjson") => data
                    .get(".dockerconfigjson")
                    .map(|b| Keyring::from_config_json(&b.0, &origin)),
                Some("kubernetes.io/dockercfg") => data
                    .get(".dockercfg")
                    .map(|b| Keyring::from_dockercfg(&b.0, &origin)),
                _ => None,
            };
            match parsed {
                Some(Ok(r)) => ring.extend(r),
                Some(Err(err)) => {
                    tracing::warn!(%origin, %err, "image pull secret is invalid; pulling without it")
                }
                None => {
                    tracing::warn!(%origin, "image pull secret has no docker config; pulling without it")
                }
            }
        }
        ring
    }

    /// The pod as credential provider plugins with `tokenAttributes` see it.
    fn pod_identity(&self, pod: &Pod) -> PodIdentity {
        PodIdentity {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
            tokens: Arc::new(ObjectTokens(Arc::clone(&self.objects))),
        }
    }

    fn lock_pull_backoff(&self) -> std::sync::MutexGuard<'_, PullBackoff> {
        self.pull_backoff.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Service accounts and their tokens from the agent's object source (the API server).
struct ObjectTokens(Arc<dyn ObjectSource>);

#[async_trait::async_trait]
impl ServiceAccountTokens for ObjectTokens {
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ServiceAccountInfo>, String> {
        let account = self
            .0
            .service_account(namespace, name)
            .await
            .map_err(|e| e.to_string())?;
        Ok(account.map(|a| ServiceAccountInfo {
            uid: a.metadata.uid.unwrap_or_default(),
            annotations: a.metadata.annotations.unwrap_or_default(),
        }))
    }

    async fn token(&self, r: &TokenFor<'_>) -> Result<String, String> {
        let request = TokenRequestFor {
            namespace: r.namespace,
            service_account: r.service_account,
            pod_name: r.pod_name,
            pod_uid: r.pod_uid,
            audience: Some(r.audience),
            expiration_seconds: PROVIDER_TOKEN_EXPIRATION_SECONDS,
            service_account_uid: Some(r.service_account_uid).filter(|u| !u.is_empty()),
        };
        match self.0.service_account_token(&request).await {
            Ok(Some(token)) => Ok(token),
            Ok(None) => Err("no API server to request a service account token from".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(policy: Option<&str>) -> Container {
        Container {
            image_pull_policy: policy.map(Into::into),
            ..Container::default()
        }
    }

    #[test]
    fn unset_policy_defaults_to_always_for_latest_or_no_tag_only() {
        let c = container(None);
        assert_eq!(PullPolicy::of(&c, "busybox"), PullPolicy::Always);
        assert_eq!(PullPolicy::of(&c, "busybox:latest"), PullPolicy::Always);
        assert_eq!(PullPolicy::of(&c, "reg:5000/busybox"), PullPolicy::Always);
        assert_eq!(
            PullPolicy::of(&c, "reg:5000/busybox:1"),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            PullPolicy::of(&c, &format!("busybox@sha256:{}", "a".repeat(64))),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            PullPolicy::of(&container(Some("Never")), "busybox"),
            PullPolicy::Never
        );
    }

    #[test]
    fn pull_backoff_starts_at_10s_doubles_and_stops_at_300s() {
        let mut b = PullBackoff::default();
        let t0 = Instant::now();
        let mut windows = Vec::new();
        for _ in 0..7 {
            b.failed("uid/img", t0, "boom".into());
            windows.push(b.entries["uid/img"].window.as_secs());
        }
        assert_eq!(windows, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(
            b.held("uid/img", t0 + Duration::from_secs(299)),
            Some("boom")
        );
        assert_eq!(b.held("uid/img", t0 + Duration::from_secs(300)), None);
        b.succeeded("uid/img");
        assert_eq!(b.held("uid/img", t0), None);
        b.failed("gone/img", t0, "x".into());
        b.retain_pods(|uid| uid != "gone");
        assert!(b.held("gone/img", t0).is_none());
    }
}

//! [`HttpSource`]: static pods from a URL polled periodically (kubelet `--manifest-url`).
//!
//! Every [`HttpSourceConfig::period`] the body is fetched (with the configured headers,
//! kubelet `--manifest-url-header`) and decoded exactly like a manifest file — one pod, a
//! `PodList`/`List`, or a YAML stream; an empty body means no pods. A `Set` is sent when the
//! pods changed, so the first good fetch marks the source ready.
//!
//! Guarantees: a failed fetch (unreachable, timeout, non-200 status, oversized body) or an
//! undecodable body changes nothing — the last good set stays — and is reported through
//! [`HttpSource::problems`] and the log. Until the first good fetch the source is not ready,
//! as with kubelet.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::watch;

use super::error::{FetchFailure, ManifestError, ManifestOrigin};
use super::manifest::{read_manifest, MAX_MANIFEST_BYTES};
use super::source::{PodSource, ProblemReporter, SetDeduper, SourceSender};
use super::update::{ConfigSource, SourceChange};

/// Settings of the HTTP source.
#[derive(Debug, Clone)]
pub struct HttpSourceConfig {
    /// The manifest URL.
    pub url: String,
    /// This node's name: static pods are named `<name>-<node>` and bound to it.
    pub node_name: String,
    /// Poll period (kubelet `httpCheckFrequency`, default 20 s).
    pub period: Duration,
    /// Timeout of one fetch (kubelet's HTTP source client uses 10 s).
    pub timeout: Duration,
    /// Extra request headers (kubelet `--manifest-url-header`).
    pub headers: Vec<(String, String)>,
    /// Largest body accepted.
    pub max_body_bytes: usize,
}

impl HttpSourceConfig {
    /// Defaults for `url` on node `node_name`.
    #[must_use]
    pub fn new(url: impl Into<String>, node_name: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            node_name: node_name.into(),
            // kubelet: httpCheckFrequency defaults to 20s.
            period: Duration::from_secs(20),
            // kubelet: the manifest URL client has a 10s timeout.
            timeout: Duration::from_secs(10),
            headers: Vec::new(),
            // Bounds memory if the URL serves something else; the same limit as a file's.
            max_body_bytes: MAX_MANIFEST_BYTES,
        }
    }

    /// Sets the poll period.
    #[must_use]
    pub fn period(mut self, period: Duration) -> Self {
        self.period = period.max(Duration::from_millis(1));
        self
    }

    /// Sets the fetch timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Adds a request header.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// Why an [`HttpSource`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpSourceError {
    /// A configured header is not a valid HTTP header.
    #[error("manifest URL header {name:?} is invalid: {reason}")]
    InvalidHeader {
        /// The header name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The HTTP client could not be created (TLS setup).
    #[error("building the HTTP client for {url}: {source}")]
    Client {
        /// The URL.
        url: String,
        /// The error.
        #[source]
        source: reqwest::Error,
    },
}

/// Static pods from the manifest URL.
#[derive(Debug)]
pub struct HttpSource {
    config: HttpSourceConfig,
    client: reqwest::Client,
    problems: ProblemReporter,
}

impl HttpSource {
    /// A source for `config`.
    pub fn new(config: HttpSourceConfig) -> Result<Self, HttpSourceError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let invalid = |reason: String| HttpSourceError::InvalidHeader {
                name: name.clone(),
                reason,
            };
            let header =
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| invalid(e.to_string()))?;
            let value = HeaderValue::from_str(value).map_err(|e| invalid(e.to_string()))?;
            headers.append(header, value);
        }
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .default_headers(headers)
            .build()
            .map_err(|source| HttpSourceError::Client {
                url: config.url.clone(),
                source,
            })?;
        Ok(Self {
            config,
            client,
            problems: ProblemReporter::new(ConfigSource::Http),
        })
    }

    /// The current problems (failed fetch, undecodable body, invalid pods).
    #[must_use]
    pub fn problems(&self) -> watch::Receiver<Vec<ManifestError>> {
        self.problems.subscribe()
    }

    async fn fetch(&self) -> Result<Vec<u8>, FetchFailure> {
        let transport = |e| FetchFailure::Transport(Arc::new(e));
        let mut response = self
            .client
            .get(&self.config.url)
            .send()
            .await
            .map_err(transport)?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(FetchFailure::Status(response.status()));
        }
        let limit = self.config.max_body_bytes;
        let too_large = FetchFailure::TooLarge { limit };
        if response
            .content_length()
            .is_some_and(|len| usize::try_from(len).map_or(true, |len| len > limit))
        {
            return Err(too_large);
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > limit {
                return Err(too_large);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// One poll: fetch, decode, and what to send and report.
    async fn poll(&self, deduper: &mut SetDeduper) -> (Option<SourceChange>, Vec<ManifestError>) {
        let origin = ManifestOrigin::Url(self.config.url.clone());
        let body = match self.fetch().await {
            Ok(body) => body,
            Err(source) => return (None, vec![ManifestError::Fetch { origin, source }]),
        };
        match read_manifest(&body, &origin, &self.config.node_name) {
            Ok(manifest) => (deduper.offer(manifest.pods), manifest.invalid),
            Err(err) => (None, vec![err]),
        }
    }
}

impl PodSource for HttpSource {
    fn source(&self) -> ConfigSource {
        ConfigSource::Http
    }

    async fn run(self, updates: SourceSender) {
        let mut deduper = SetDeduper::default();
        let mut ticks = tokio::time::interval(self.config.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(url = %self.config.url, "static pod HTTP source started");
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = updates.closed() => {
                    tracing::debug!("pod config merger stopped; HTTP source ends");
                    return;
                }
            }
            let (change, problems) = tokio::select! {
                polled = self.poll(&mut deduper) => polled,
                () = updates.closed() => return,
            };
            self.problems.publish(problems);
            if let Some(change) = change {
                if updates.send(change).await.is_err() {
                    return;
                }
            }
        }
    }
}

//! [`Remote`]: one repository at one endpoint, spoken to with oci-client (auth challenges,
//! Bearer tokens, manifests, blob streams). Only this file knows oci-client's types; its
//! errors become [`ImageError::Registry`] / [`ImageError::Unauthorized`] carrying the
//! registry's own message, which is what the pod's waiting message shows.

use futures_util::stream::BoxStream;
use oci_client::client::{
    BlobResponse, Certificate, CertificateEncoding, ClientConfig, ClientProtocol,
};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference as OciReference, RegistryOperation};

use super::credentials::Credentials;
use super::registries::Endpoint;
use crate::image::digest::Digest;
use crate::image::error::ImageError;
use crate::image::oci;

/// Manifest media types a pull accepts.
const ACCEPT: [&str; 4] = [
    oci::MT_OCI_MANIFEST,
    oci::MT_OCI_INDEX,
    oci::MT_DOCKER_MANIFEST,
    oci::MT_DOCKER_LIST,
];

/// A blob response: its bytes, and how many at their start the caller already has.
pub(crate) struct BlobBody {
    pub(crate) stream: BoxStream<'static, std::io::Result<bytes::Bytes>>,
    /// Bytes to drop at the start of `stream` (a resumed download whose registry ignored
    /// the `Range` header and sent the blob from its start).
    pub(crate) skip: u64,
}

/// A repository at one endpoint, with the credentials chosen for it.
pub(crate) struct Remote {
    client: Client,
    auth: RegistryAuth,
    pub(crate) endpoint: Endpoint,
    /// The reference the user asked for (for error messages).
    pub(crate) display: String,
}

/// Most clients kept; past it the cache starts over (pull secrets can vary per pod).
const MAX_CACHED_CLIENTS: usize = 64;

/// Registry clients kept across pulls, one per endpoint settings and credentials: a pull
/// reuses the previous one's connections and Bearer tokens (oci-client caches them until
/// they expire) instead of loading the system roots and shaking hands again, which is most
/// of a warm `Always` pull.
#[derive(Default)]
pub(crate) struct ClientCache {
    clients: std::sync::Mutex<std::collections::HashMap<String, Client>>,
}

impl ClientCache {
    fn get_or_build(
        &self,
        key: String,
        build: impl FnOnce() -> Result<Client, ImageError>,
    ) -> Result<Client, ImageError> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let client = build()?;
        if clients.len() >= MAX_CACHED_CLIENTS {
            clients.clear();
        }
        clients.insert(key, client.clone());
        Ok(client)
    }
}

/// What a client depends on: the endpoint's host and TLS settings and the credentials
/// (hashed, so the key holds no secret).
fn client_key(endpoint: &Endpoint, creds: Option<&Credentials>) -> String {
    use sha2::{Digest as _, Sha256};
    let mut h = Sha256::new();
    for part in [
        endpoint.host.as_bytes(),
        &[
            u8::from(endpoint.plain_http),
            u8::from(endpoint.insecure_skip_verify),
        ],
        endpoint.ca_pem.as_deref().unwrap_or_default(),
        endpoint.client_identity_pem.as_deref().unwrap_or_default(),
        creds.map(|c| c.username.as_bytes()).unwrap_or_default(),
        creds.map(|c| c.password.as_bytes()).unwrap_or_default(),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    hex::encode(h.finalize())
}

impl Remote {
    pub(crate) fn new(
        endpoint: Endpoint,
        creds: Option<&Credentials>,
        display: String,
        cache: &ClientCache,
    ) -> Result<Self, ImageError> {
        let config = ClientConfig {
            protocol: if endpoint.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            accept_invalid_certificates: endpoint.insecure_skip_verify,
            extra_root_certificates: endpoint
                .ca_pem
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            client_identity_pem: endpoint.client_identity_pem.clone(),
            connect_timeout: Some(std::time::Duration::from_secs(30)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            user_agent: concat!("ironlet/", env!("CARGO_PKG_VERSION")),
            platform_resolver: None,
            ..ClientConfig::default()
        };
        let client = cache.get_or_build(client_key(&endpoint, creds), || {
            Client::try_from(config).map_err(|e| ImageError::Registry {
                reference: display.clone(),
                endpoint: endpoint.host.clone(),
                message: format!("setting up the client: {e}"),
            })
        })?;
        let auth = match creds {
            Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
            None => RegistryAuth::Anonymous,
        };
        Ok(Self {
            client,
            auth,
            endpoint,
            display,
        })
    }

    fn by_tag(&self, tag: &str) -> OciReference {
        OciReference::with_tag(
            self.endpoint.host.clone(),
            self.endpoint.repository.clone(),
            tag.to_owned(),
        )
    }

    fn by_digest(&self, digest: &str) -> OciReference {
        OciReference::with_digest(
            self.endpoint.host.clone(),
            self.endpoint.repository.clone(),
            digest.to_owned(),
        )
    }

    /// Authenticates (Basic, or the Bearer token flow the registry's challenge asks for).
    /// This is a pull's first request (`GET /v2/`): with `retry`, one that fails before any
    /// byte of a response (connection refused, reset, closed; not a timeout) is tried again
    /// after each of [`CONNECT_RETRIES`], so a registry that is restarting or comes up late
    /// does not fail the pull.
    pub(crate) async fn authenticate(
        &self,
        tag_or_digest: &str,
        retry: bool,
    ) -> Result<(), ImageError> {
        let r = self.reference(tag_or_digest);
        let mut waits = CONNECT_RETRIES.iter().filter(|_| retry);
        loop {
            let err = match self
                .client
                .auth(&r, &self.auth, RegistryOperation::Pull)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            match waits.next() {
                Some(wait) if is_connection_failure(&err) => {
                    tracing::info!(reference = %self.display, endpoint = %self.endpoint.host,
                        err = %error_chain(&err), retry_in_ms = wait.as_millis() as u64,
                        "registry connection failed; retrying");
                    tokio::time::sleep(*wait).await;
                }
                _ => return Err(self.error(err)),
            }
        }
    }

    fn reference(&self, tag_or_digest: &str) -> OciReference {
        if tag_or_digest.starts_with(Digest::PREFIX) {
            self.by_digest(tag_or_digest)
        } else {
            self.by_tag(tag_or_digest)
        }
    }

    /// A manifest or index by tag or digest; its bytes are verified against the digest
    /// when one was asked for. Returns the bytes and their digest.
    pub(crate) async fn manifest(
        &self,
        tag_or_digest: &str,
    ) -> Result<(Vec<u8>, Digest), ImageError> {
        let r = self.reference(tag_or_digest);
        let (bytes, _) = self
            .client
            .pull_manifest_raw(&r, &self.auth, &ACCEPT)
            .await
            .map_err(|e| self.error(e))?;
        if bytes.len() as u64 > oci::MAX_METADATA_BYTES {
            return Err(self.protocol(format!(
                "manifest larger than {} bytes",
                oci::MAX_METADATA_BYTES
            )));
        }
        let actual = Digest::of_bytes(&bytes);
        if let Some(want) = Digest::parse(tag_or_digest) {
            if want != actual {
                return Err(ImageError::DigestMismatch {
                    location: format!("{}/{}@{want}", self.endpoint.host, self.endpoint.repository),
                    expected: want.to_string(),
                    actual: actual.to_string(),
                    expected_size: None,
                    actual_size: bytes.len() as u64,
                });
            }
        }
        Ok((bytes, actual))
    }

    /// A small blob (the image config), verified.
    pub(crate) async fn small_blob(&self, desc: &oci::Descriptor) -> Result<Vec<u8>, ImageError> {
        if desc.size > oci::MAX_METADATA_BYTES {
            return Err(self.protocol(format!(
                "config blob {} is {} bytes",
                desc.digest, desc.size
            )));
        }
        let mut out = Vec::with_capacity(desc.size as usize);
        self.client
            .pull_blob(
                &self.by_digest(&desc.digest.to_string()),
                &oci_desc(desc),
                &mut out,
            )
            .await
            .map_err(|e| self.error(e))?;
        let actual = Digest::of_bytes(&out);
        if actual != desc.digest || out.len() as u64 != desc.size {
            return Err(ImageError::DigestMismatch {
                location: self.location(&desc.digest),
                expected: desc.digest.to_string(),
                actual: actual.to_string(),
                expected_size: Some(desc.size),
                actual_size: out.len() as u64,
            });
        }
        Ok(out)
    }

    /// A layer blob from byte `offset` on, as a stream of chunks (verified by the caller as
    /// it is consumed). From an offset past 0 it asks for a `Range`; a registry that
    /// ignores it sends the whole blob again, whose first `offset` bytes the caller skips.
    pub(crate) async fn blob_from(
        &self,
        desc: &oci::Descriptor,
        offset: u64,
    ) -> Result<BlobBody, ImageError> {
        let r = self.by_digest(&desc.digest.to_string());
        if offset == 0 {
            let s = self
                .client
                .pull_blob_stream(&r, &oci_desc(desc))
                .await
                .map_err(|e| self.error(e))?;
            return Ok(BlobBody {
                stream: s.stream,
                skip: 0,
            });
        }
        let response = self
            .client
            .pull_blob_stream_partial(&r, &oci_desc(desc), offset, None)
            .await
            .map_err(|e| self.error(e))?;
        match response {
            BlobResponse::Full(s) => Ok(BlobBody {
                stream: s.stream,
                skip: offset,
            }),
            BlobResponse::Partial(s) => {
                let rest = desc.size.saturating_sub(offset);
                if s.content_length.is_some_and(|n| n != rest) {
                    return Err(self.protocol(format!(
                        "asked for blob {} from byte {offset}, got {:?} bytes instead of {rest}",
                        desc.digest, s.content_length
                    )));
                }
                Ok(BlobBody {
                    stream: s.stream,
                    skip: 0,
                })
            }
        }
    }

    pub(crate) fn location(&self, digest: &Digest) -> String {
        format!(
            "{}/{}@{digest}",
            self.endpoint.host, self.endpoint.repository
        )
    }

    fn protocol(&self, message: String) -> ImageError {
        ImageError::Registry {
            reference: self.display.clone(),
            endpoint: self.endpoint.host.clone(),
            message,
        }
    }

    fn error(&self, e: OciDistributionError) -> ImageError {
        let reference = self.display.clone();
        let endpoint = self.endpoint.host.clone();
        match e {
            OciDistributionError::AuthenticationFailure(message) => ImageError::Unauthorized {
                reference,
                endpoint,
                message,
            },
            OciDistributionError::UnauthorizedError { url } => ImageError::Unauthorized {
                reference,
                endpoint,
                message: format!("401 Unauthorized from {url}"),
            },
            OciDistributionError::RegistryError { envelope, .. }
                if envelope.errors.iter().any(|e| {
                    matches!(
                        e.code,
                        oci_client::errors::OciErrorCode::Unauthorized
                            | oci_client::errors::OciErrorCode::Denied
                    )
                }) =>
            {
                ImageError::Unauthorized {
                    reference,
                    endpoint,
                    message: envelope.to_string(),
                }
            }
            other => ImageError::Registry {
                reference,
                endpoint,
                message: error_chain(&other),
            },
        }
    }
}

/// The waits before each new try of a pull's first request that failed to connect: four
/// more tries over 3.75 s.
pub(crate) const CONNECT_RETRIES: [std::time::Duration; 4] = [
    std::time::Duration::from_millis(250),
    std::time::Duration::from_millis(500),
    std::time::Duration::from_millis(1000),
    std::time::Duration::from_millis(2000),
];

/// A request that failed before any byte of a response: the connection (TCP or TLS) was
/// refused, reset or closed. Timeouts are not (they already took their time).
fn is_connection_failure(e: &OciDistributionError) -> bool {
    let OciDistributionError::RequestError(e) = e else {
        return false;
    };
    if e.is_timeout() || e.status().is_some() {
        return false;
    }
    if e.is_connect() {
        return true;
    }
    let mut cur = std::error::Error::source(e);
    while let Some(s) = cur {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | BrokenPipe
                    | UnexpectedEof
            ) {
                return true;
            }
        }
        cur = s.source();
    }
    // hyper's IncompleteMessage: the connection closed before a response began.
    error_chain(e).contains("connection closed before message completed")
}

/// The error and its causes (reqwest hides "connection refused" in a source).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

fn oci_desc(d: &oci::Descriptor) -> OciDescriptor {
    OciDescriptor {
        media_type: d.media_type.clone(),
        digest: d.digest.to_string(),
        size: i64::try_from(d.size).unwrap_or(i64::MAX),
        ..OciDescriptor::default()
    }
}

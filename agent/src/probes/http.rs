//! The httpGet action: a minimal HTTP/1.1 GET over plain TCP or TLS, following redirects as
//! kubelet's probe and lifecycle-hook clients do.
//!
//! Behaviour, as kubelet (`pkg/probe/http`, `pkg/kubelet/lifecycle/handlers.go`):
//! - `HTTPS` does not verify the server's certificate (kubelet's `InsecureSkipVerify`); the
//!   TLS handshake itself is verified.
//! - Redirects (301, 302, 303, 307, 308 with a `Location`) are followed up to 10 times
//!   while they stay on the first request's host name (the port and scheme may change).
//!   A redirect to another host ends the chain: a probe then succeeds with a warning
//!   ([`ProbeOutcome::Warning`], kubelet's `ProbeWarning` event); more than 10 redirects
//!   are an error.
//! - A probe succeeds on a final status in 200..400 (a 3xx is a warning) and fails on any
//!   other; a hook ([`HttpUse::Hook`]) only needs an answer, whatever its status.
//! - Errors read as Go's client reports them: `Get "http://10.1.0.5:80/": EOF` for a server
//!   that closes without answering.
//!
//! Simplified on purpose: one request per connection (`Connection: close`), HTTP/1.1 only,
//! only the response head is read (at most 16 KiB), the body is ignored.
//!
//! Headers sent: `Host` (`host:port`), `User-Agent: kube-probe/1.37`, `Accept: */*`, then
//! the action's headers; an action header named like a default replaces it.

use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::action::{HttpGet, Scheme};
use super::net::{authority, connect, NetError, Route};
use super::{ProbeOutcome, ProbeTarget};

/// kubelet's probe user agent, at the Kubernetes version ironlet follows.
const USER_AGENT: &str = "kube-probe/1.37";
/// The most of a response head read before giving up on finding its end.
const MAX_HEAD: usize = 16 * 1024;
/// kubelet's `maxRespBodyLength`: the most of a body a probe reads (10 KiB).
const MAX_BODY: usize = 10 * 1024;
/// Go's default client (and kubelet's redirect checker): at most 10 redirects.
const MAX_REDIRECTS: usize = 10;

/// Who asks: a probe judges the final HTTP status and fails an exec with its bare output
/// (kubelet's probers); a lifecycle hook does neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HttpUse {
    Probe,
    Hook,
}

/// One request of a redirect chain.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hop {
    scheme: Scheme,
    host: String,
    port: u16,
    /// Starts with `/`; may carry a query string.
    path: String,
}

impl Hop {
    fn url(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        format!(
            "{scheme}://{}{}",
            authority(&self.host, self.port),
            self.path
        )
    }

    /// Where a `Location` header sends the next request, relative to this one.
    fn follow(&self, location: &str) -> Option<Self> {
        let (scheme, rest) = if let Some(rest) = location.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else if let Some(rest) = location.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else if let Some(rest) = location.strip_prefix("//") {
            (self.scheme, rest)
        } else if location.starts_with('/') {
            return Some(Self {
                path: location.to_owned(),
                ..self.clone()
            });
        } else {
            // Relative to the current path's directory.
            let path = self.path.split('?').next().unwrap_or("/");
            let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
            return Some(Self {
                path: format!("{dir}{location}"),
                ..self.clone()
            });
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_owned()),
            None => (rest, "/".to_owned()),
        };
        let default_port = match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        };
        let (host, port) = split_authority(authority, default_port)?;
        Some(Self {
            scheme,
            host,
            port,
            path,
        })
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None if authority.is_empty() => None,
        None => Some((authority.to_owned(), default_port)),
    }
}

/// The parts of a response head the client looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Response {
    status: u16,
    location: Option<String>,
    /// `Content-Length`, if given.
    content_length: Option<usize>,
    /// The start of the body (what came with the head, later read up to [`MAX_BODY`]).
    body: Vec<u8>,
}

/// httpGet: see the module docs for what counts as success.
pub(crate) async fn http_get(
    target: &ProbeTarget,
    get: &HttpGet,
    timeout: Duration,
    usage: HttpUse,
) -> ProbeOutcome {
    let port = match get.port.resolve(&target.container_ports) {
        Ok(p) => p,
        Err(e) => return ProbeOutcome::Unknown(e.to_string()),
    };
    let route = Route::new(&target.network, get.host.as_deref());
    let first = Hop {
        scheme: get.scheme,
        host: route.host().to_owned(),
        port,
        path: get.path.clone(),
    };
    let url = first.url();
    match tokio::time::timeout(timeout, chain(&route, get, first, timeout)).await {
        Err(_) => ProbeOutcome::Failure(format!(
            "Get {url:?}: context deadline exceeded (timeout {timeout:?})"
        )),
        Ok(Err((hop, e))) => {
            let unknown = e.is_local();
            let message = format!("Get {:?}: {e}", hop.url());
            if unknown {
                ProbeOutcome::Unknown(message)
            } else {
                ProbeOutcome::Failure(message)
            }
        }
        Ok(Ok(_)) if usage == HttpUse::Hook => ProbeOutcome::Success,
        Ok(Ok((status, _))) if (200..300).contains(&status) => ProbeOutcome::Success,
        Ok(Ok((status, body))) if (300..400).contains(&status) => ProbeOutcome::Warning(format!(
            "Probe terminated redirects, Response body: {}",
            String::from_utf8_lossy(&body)
        )),
        Ok(Ok((status, _))) => {
            ProbeOutcome::Failure(format!("HTTP probe failed with statuscode: {status}"))
        }
    }
}

/// Runs the request and its same-host redirects; the final status and the start of its body
/// (read for a redirect that ends the chain only), or the failed hop.
async fn chain(
    route: &Route,
    get: &HttpGet,
    first: Hop,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), (Hop, NetError)> {
    let mut hop = first.clone();
    let mut redirects = 0;
    loop {
        let response = exchange(route, get, &hop, timeout)
            .await
            .map_err(|e| (hop.clone(), e))?;
        let next = match (&response.location, response.status) {
            (Some(location), 301 | 302 | 303 | 307 | 308) => hop.follow(location),
            _ => None,
        };
        let Some(next) = next.filter(|n| n.host == first.host) else {
            return Ok((response.status, response.body));
        };
        if redirects == MAX_REDIRECTS {
            return Err((next, NetError::TooManyRedirects));
        }
        redirects += 1;
        tracing::debug!(from = %hop.url(), to = %next.url(), "following a same-host redirect");
        hop = next;
    }
}

/// Anything a request can go over.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One request and the head of its response.
async fn exchange(
    route: &Route,
    get: &HttpGet,
    hop: &Hop,
    timeout: Duration,
) -> Result<Response, NetError> {
    let addr = authority(&hop.host, hop.port);
    let hop_route = route.with_host(&hop.host);
    let tcp = connect(&hop_route, hop.port, timeout).await?;
    let mut stream: Box<dyn Io> = match hop.scheme {
        Scheme::Http => Box::new(tcp),
        Scheme::Https => {
            let name = ServerName::try_from(hop.host.clone())
                .map_err(|_| NetError::InvalidServerName(hop.host.clone()))?;
            let connector = tokio_rustls::TlsConnector::from(insecure_tls_config());
            let tls = connector
                .connect(name, tcp)
                .await
                .map_err(|source| NetError::Handshake {
                    addr: addr.clone(),
                    source,
                })?;
            Box::new(tls)
        }
    };
    stream
        .write_all(request(get, &hop.path, &addr).as_bytes())
        .await
        .map_err(|source| NetError::Send {
            addr: addr.clone(),
            source,
        })?;
    let head = read_head(&mut stream)
        .await
        .map_err(|source| NetError::Receive {
            addr: addr.clone(),
            source,
        })?;
    if head.is_empty() {
        return Err(NetError::EmptyReply);
    }
    let mut response = parse_head(&head).ok_or_else(|| NetError::MalformedResponse {
        addr: addr.clone(),
        head: String::from_utf8_lossy(&head[..head.len().min(200)]).into_owned(),
    })?;
    // A redirect's body goes into the warning (kubelet's "Response body: …"): read it up to
    // its Content-Length (never past it: the server may keep the connection open).
    if (300..400).contains(&response.status) {
        let want = response.content_length.unwrap_or(0).min(MAX_BODY);
        let mut buf = [0u8; 2048];
        while response.body.len() < want {
            let n = match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            response.body.extend_from_slice(&buf[..n]);
        }
        response.body.truncate(MAX_BODY);
    }
    Ok(response)
}

/// The request text: defaults first, replaced by same-named action headers.
fn request(get: &HttpGet, path: &str, host_port: &str) -> String {
    let mut headers: Vec<(&str, &str)> = vec![
        ("Host", host_port),
        ("User-Agent", USER_AGENT),
        ("Accept", "*/*"),
    ];
    headers.retain(|(name, _)| {
        !get.headers
            .iter()
            .any(|(given, _)| given.eq_ignore_ascii_case(name))
    });
    headers.extend(get.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    let mut text = format!("GET {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("Connection: close\r\n\r\n");
    text
}

/// Reads until the end of the head (`\r\n\r\n`), the end of the stream, or [`MAX_HEAD`].
/// A TLS peer that closes without `close_notify` after sending something ends the head too.
async fn read_head(stream: &mut (impl AsyncRead + Unpin)) -> io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(head);
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() >= MAX_HEAD || head.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(head);
        }
    }
}

/// The status of an `HTTP/1.x NNN …` status line and the `Location` header, if any.
fn parse_head(head: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status_line = lines.next()?;
    let mut parts = status_line.trim_end().split(' ');
    let version = parts.next()?;
    let code = parts.next()?;
    if !version.starts_with("HTTP/1.") || code.len() != 3 {
        return None;
    }
    let status = code.parse().ok().filter(|c| (100..600).contains(c))?;
    let headers: Vec<(&str, &str)> = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .collect();
    let header = |wanted: &str| {
        headers
            .iter()
            .find(|(name, _)| name.trim().eq_ignore_ascii_case(wanted))
            .map(|(_, value)| value.trim())
    };
    let location = header("location")
        .map(str::to_owned)
        .filter(|v| !v.is_empty());
    let content_length = header("content-length").and_then(|v| v.parse().ok());
    let body = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|end| head[end + 4..].to_vec())
        .unwrap_or_default();
    Some(Response {
        status,
        location,
        content_length,
        body,
    })
}

/// kubelet's probe and hook TLS: certificates are not verified, handshake signatures are.
fn insecure_tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map(|builder| {
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(NoCertificateCheck(provider)))
                        .with_no_client_auth()
                });
            match config {
                Ok(config) => Arc::new(config),
                // The ring provider supports the default versions; a config without any
                // protocol would fail every handshake, which reports the problem per probe.
                Err(err) => {
                    tracing::error!(%err, "building the probe TLS configuration");
                    Arc::new(
                        rustls::ClientConfig::builder()
                            .with_root_certificates(rustls::RootCertStore::empty())
                            .with_no_client_auth(),
                    )
                }
            }
        })
        .clone()
}

/// Accepts any server certificate (Go's `InsecureSkipVerify`).
#[derive(Debug)]
struct NoCertificateCheck(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoCertificateCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;

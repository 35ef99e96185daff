//! Network actions: tcpSocket and a minimal HTTP/1.1 GET, connected from the right network
//! namespace.
//!
//! Where a connection starts ([`Route`]): a pod with an IP is reached from the host's
//! namespace; a pod with only a pinned namespace file is reached from *inside* it (on
//! `127.0.0.1` unless the action names a host); a host-network pod on the host's
//! `127.0.0.1`. To connect from inside, a fresh OS thread enters the namespace with
//! `setns(CLONE_NEWNET)`, creates and connects the socket (a socket stays in the namespace it
//! was created in), hands the connected socket back to tokio and exits: no tokio thread is
//! ever moved into a pod's namespace.
//!
//! HTTP, current behaviour (simpler than kubelet's Go client, by design):
//! - HTTP/1.1 only, one request per connection (`Connection: close`); `HTTPS` and the
//!   `protocol` field are not supported (HTTPS runs answer [`ProbeOutcome::Unknown`]).
//! - Success is a status in 200..400. Redirects are not followed: a 3xx is a success, where
//!   kubelet follows same-host redirects (up to 10) and judges the final status.
//! - Headers sent: `Host` (`host:port`), `User-Agent: kube-probe/1.37`, `Accept: */*`, then
//!   the action's headers; an action header named like a default replaces it.
//! - Only the response head is read (at most 16 KiB); the body is ignored.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::action::{HttpGet, PortRef, Scheme};
use super::{ProbeNetwork, ProbeOutcome, ProbeTarget};

/// kubelet's probe user agent, at the Kubernetes version ironlet follows.
const USER_AGENT: &str = "kube-probe/1.37";
/// The most of a response head read before giving up on finding its end.
const MAX_HEAD: usize = 16 * 1024;

/// Where a connection is made from, and to which host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// From the host's network namespace.
    Host { host: String },
    /// From inside the pod's pinned network namespace.
    PodNamespace { netns: PathBuf, host: String },
}

impl Route {
    pub(crate) fn new(network: &ProbeNetwork, host: Option<&str>) -> Self {
        match (&network.ip, &network.netns_path) {
            (Some(ip), _) => Self::Host {
                host: host.unwrap_or(ip).to_owned(),
            },
            (None, Some(netns)) => Self::PodNamespace {
                netns: netns.clone(),
                host: host.unwrap_or("127.0.0.1").to_owned(),
            },
            (None, None) => Self::Host {
                host: host.unwrap_or("127.0.0.1").to_owned(),
            },
        }
    }

    fn host(&self) -> &str {
        match self {
            Self::Host { host } | Self::PodNamespace { host, .. } => host,
        }
    }
}

/// A network action that went wrong.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NetError {
    #[error("open network namespace {path}: {source}")]
    OpenNetns { path: PathBuf, source: io::Error },
    #[error("enter network namespace {path}: {source}")]
    EnterNetns {
        path: PathBuf,
        source: nix::errno::Errno,
    },
    #[error("start a thread to connect from the pod's network namespace: {0}")]
    SpawnThread(io::Error),
    #[error("the thread connecting from the pod's network namespace died")]
    ThreadLost,
    #[error("register the connected socket with tokio: {0}")]
    Register(io::Error),
    #[error("resolve {host}: {source}")]
    Resolve { host: String, source: io::Error },
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    #[error("dial tcp {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("send the request to {addr}: {source}")]
    Send { addr: String, source: io::Error },
    #[error("read the response from {addr}: {source}")]
    Receive { addr: String, source: io::Error },
    #[error("malformed HTTP response from {addr}: {head:?}")]
    MalformedResponse { addr: String, head: String },
}

impl NetError {
    /// Whether the target failed (Failure) or the probe could not be run at all (Unknown).
    fn into_outcome(self) -> ProbeOutcome {
        let message = self.to_string();
        match self {
            Self::OpenNetns { .. }
            | Self::EnterNetns { .. }
            | Self::SpawnThread(_)
            | Self::ThreadLost
            | Self::Register(_) => ProbeOutcome::Unknown(message),
            Self::Resolve { .. }
            | Self::NoAddress { .. }
            | Self::Connect { .. }
            | Self::Send { .. }
            | Self::Receive { .. }
            | Self::MalformedResponse { .. } => ProbeOutcome::Failure(message),
        }
    }
}

/// tcpSocket: success when a connection can be opened within `timeout`.
pub(crate) async fn tcp_socket(
    target: &ProbeTarget,
    host: Option<&str>,
    port: &PortRef,
    timeout: Duration,
) -> ProbeOutcome {
    let port = match port.resolve(&target.container_ports) {
        Ok(p) => p,
        Err(e) => return ProbeOutcome::Unknown(e.to_string()),
    };
    let route = Route::new(&target.network, host);
    let addr = authority(route.host(), port);
    match tokio::time::timeout(timeout, connect(&route, port, timeout)).await {
        Err(_) => ProbeOutcome::Failure(format!("dial tcp {addr}: i/o timeout after {timeout:?}")),
        Ok(Err(e)) => e.into_outcome(),
        Ok(Ok(_stream)) => ProbeOutcome::Success,
    }
}

/// httpGet: success when the response status is in 200..400 within `timeout`.
pub(crate) async fn http_get(
    target: &ProbeTarget,
    get: &HttpGet,
    timeout: Duration,
) -> ProbeOutcome {
    if get.scheme == Scheme::Https {
        return ProbeOutcome::Unknown(
            "HTTPS probes and hooks are not supported (HTTP only)".into(),
        );
    }
    let port = match get.port.resolve(&target.container_ports) {
        Ok(p) => p,
        Err(e) => return ProbeOutcome::Unknown(e.to_string()),
    };
    let route = Route::new(&target.network, get.host.as_deref());
    let addr = authority(route.host(), port);
    let url = format!("http://{addr}{}", get.path);
    let exchange = async {
        let mut stream = connect(&route, port, timeout).await?;
        let request = request(get, &addr);
        stream
            .write_all(request.as_bytes())
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
        status_code(&head).ok_or_else(|| NetError::MalformedResponse {
            addr,
            head: String::from_utf8_lossy(&head[..head.len().min(200)]).into_owned(),
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => ProbeOutcome::Failure(format!("Get {url:?}: timed out after {timeout:?}")),
        Ok(Err(e)) => e.into_outcome(),
        Ok(Ok(status)) if (200..400).contains(&status) => ProbeOutcome::Success,
        Ok(Ok(status)) => {
            ProbeOutcome::Failure(format!("HTTP probe failed with statuscode: {status}"))
        }
    }
}

/// `host:port`, with an IPv6 literal in brackets.
fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The request text: defaults first, replaced by same-named action headers.
fn request(get: &HttpGet, host_port: &str) -> String {
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
    let mut text = format!("GET {} HTTP/1.1\r\n", get.path);
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("Connection: close\r\n\r\n");
    text
}

/// Reads until the end of the head (`\r\n\r\n`), the end of the stream, or [`MAX_HEAD`].
async fn read_head(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(head);
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() >= MAX_HEAD || head.windows(4).any(|w| w == b"\r\n\r\n") {
            return Ok(head);
        }
    }
}

/// The status code of an `HTTP/1.x NNN …` status line.
fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.trim_end().split(' ');
    let version = parts.next()?;
    let code = parts.next()?;
    if !version.starts_with("HTTP/1.") || code.len() != 3 {
        return None;
    }
    code.parse().ok().filter(|c| (100..600).contains(c))
}

/// Opens a TCP connection along `route`.
async fn connect(route: &Route, port: u16, timeout: Duration) -> Result<TcpStream, NetError> {
    match route {
        Route::Host { host } => {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|source| NetError::Resolve {
                    host: host.clone(),
                    source,
                })?
                .collect();
            let mut last = NetError::NoAddress { host: host.clone() };
            for addr in addrs {
                match TcpStream::connect(addr).await {
                    Ok(stream) => return Ok(stream),
                    Err(source) => {
                        last = NetError::Connect {
                            addr: addr.to_string(),
                            source,
                        }
                    }
                }
            }
            Err(last)
        }
        Route::PodNamespace { netns, host } => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (netns, host) = (netns.clone(), host.clone());
            std::thread::Builder::new()
                .name("probe-netns".into())
                .spawn(move || {
                    // The receiver may be gone after a timeout; the socket then just closes.
                    let _ = tx.send(connect_in_netns(&netns, &host, port, timeout));
                })
                .map_err(NetError::SpawnThread)?;
            let stream = rx.await.map_err(|_| NetError::ThreadLost)??;
            stream.set_nonblocking(true).map_err(NetError::Register)?;
            TcpStream::from_std(stream).map_err(NetError::Register)
        }
    }
}

/// Runs on a thread of its own, which ends right after: enters `netns`, then connects.
fn connect_in_netns(
    netns: &Path,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<std::net::TcpStream, NetError> {
    let file = std::fs::File::open(netns).map_err(|source| NetError::OpenNetns {
        path: netns.to_owned(),
        source,
    })?;
    nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(|source| {
        NetError::EnterNetns {
            path: netns.to_owned(),
            source,
        }
    })?;
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|source| NetError::Resolve {
            host: host.to_owned(),
            source,
        })?;
    let mut last = NetError::NoAddress {
        host: host.to_owned(),
    };
    for addr in addrs {
        match std::net::TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(source) => {
                last = NetError::Connect {
                    addr: addr.to_string(),
                    source,
                }
            }
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_ip_is_reached_from_the_host_and_a_bare_namespace_from_inside() {
        let with_ip = ProbeNetwork {
            ip: Some("10.1.0.5".into()),
            netns_path: Some("/ns/net".into()),
        };
        assert_eq!(
            Route::new(&with_ip, None),
            Route::Host {
                host: "10.1.0.5".into()
            }
        );
        let no_ip = ProbeNetwork {
            ip: None,
            netns_path: Some("/ns/net".into()),
        };
        assert_eq!(
            Route::new(&no_ip, Some("localhost")),
            Route::PodNamespace {
                netns: "/ns/net".into(),
                host: "localhost".into()
            }
        );
        assert_eq!(
            Route::new(&ProbeNetwork::default(), None),
            Route::Host {
                host: "127.0.0.1".into()
            }
        );
    }

    #[test]
    fn the_request_lets_action_headers_replace_the_defaults() {
        let get = HttpGet {
            scheme: Scheme::Http,
            host: None,
            port: PortRef::Number(80),
            path: "/healthz".into(),
            headers: vec![("host".into(), "example.test".into())],
        };
        let text = request(&get, "127.0.0.1:80");
        assert_eq!(
            text,
            "GET /healthz HTTP/1.1\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\n\
             host: example.test\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn ipv6_literals_are_bracketed_in_the_authority() {
        assert_eq!(authority("fd00::5", 80), "[fd00::5]:80");
        assert_eq!(authority("10.0.0.5", 80), "10.0.0.5:80");
    }

    #[test]
    fn status_lines_are_parsed_strictly() {
        assert_eq!(status_code(b"HTTP/1.1 204 No Content\r\n\r\n"), Some(204));
        assert_eq!(status_code(b"HTTP/1.0 302\r\n"), Some(302));
        assert_eq!(status_code(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_code(b"HTTP/1.1 2000 Huh\r\n"), None);
        assert_eq!(status_code(b""), None);
    }

    #[tokio::test]
    async fn a_closed_port_on_the_host_is_a_failure_and_an_open_one_a_success() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let port = listener.local_addr().expect("local addr").port();
        let target = ProbeTarget {
            container_id: ironlet_runtime::types::ContainerId::random(),
            network: ProbeNetwork::default(),
            container_ports: Vec::new(),
        };
        let open = tcp_socket(
            &target,
            None,
            &PortRef::Number(port),
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(open, ProbeOutcome::Success);
        drop(listener);
        let closed = tcp_socket(
            &target,
            None,
            &PortRef::Number(port),
            Duration::from_secs(1),
        )
        .await;
        assert!(
            matches!(&closed, ProbeOutcome::Failure(m) if m.contains("refused")),
            "{closed:?}"
        );
    }

    #[tokio::test]
    async fn an_http_server_answering_500_fails_and_200_succeeds() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let port = listener.local_addr().expect("local addr").port();
        let server = tokio::spawn(async move {
            for status in ["500 Oops", "200 OK"] {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let reply = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        let target = ProbeTarget {
            container_id: ironlet_runtime::types::ContainerId::random(),
            network: ProbeNetwork::default(),
            container_ports: Vec::new(),
        };
        let get = HttpGet {
            scheme: Scheme::Http,
            host: None,
            port: PortRef::Number(port),
            path: "/".into(),
            headers: Vec::new(),
        };
        let first = http_get(&target, &get, Duration::from_secs(2)).await;
        assert_eq!(
            first,
            ProbeOutcome::Failure("HTTP probe failed with statuscode: 500".into())
        );
        let second = http_get(&target, &get, Duration::from_secs(2)).await;
        assert_eq!(second, ProbeOutcome::Success);
        server.abort();
    }
}

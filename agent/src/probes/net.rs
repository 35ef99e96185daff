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
//! The httpGet action on top of [`connect`] is in the `http` module.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::TcpStream;

use super::action::PortRef;
use super::{ProbeNetwork, ProbeOutcome, ProbeTarget};

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

    pub(crate) fn host(&self) -> &str {
        match self {
            Self::Host { host } | Self::PodNamespace { host, .. } => host,
        }
    }

    /// The same route (same namespace) to another host: for a redirect.
    pub(crate) fn with_host(&self, host: &str) -> Self {
        match self {
            Self::Host { .. } => Self::Host {
                host: host.to_owned(),
            },
            Self::PodNamespace { netns, .. } => Self::PodNamespace {
                netns: netns.clone(),
                host: host.to_owned(),
            },
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
    /// The server closed the connection without answering (Go's client says `EOF`).
    #[error("EOF")]
    EmptyReply,
    #[error("stopped after 10 redirects")]
    TooManyRedirects,
    #[error("{0:?} is not a valid TLS server name")]
    InvalidServerName(String),
    #[error("TLS handshake with {addr}: {source}")]
    Handshake { addr: String, source: io::Error },
}

impl NetError {
    /// Whether the probe could not be run at all here (Unknown) rather than the target
    /// failing (Failure).
    pub(crate) fn is_local(&self) -> bool {
        matches!(
            self,
            Self::OpenNetns { .. }
                | Self::EnterNetns { .. }
                | Self::SpawnThread(_)
                | Self::ThreadLost
                | Self::Register(_)
        )
    }

    fn into_outcome(self) -> ProbeOutcome {
        let message = self.to_string();
        if self.is_local() {
            ProbeOutcome::Unknown(message)
        } else {
            ProbeOutcome::Failure(message)
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

/// `host:port`, with an IPv6 literal in brackets.
pub(crate) fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Opens a TCP connection along `route`.
pub(crate) async fn connect(
    route: &Route,
    port: u16,
    timeout: Duration,
) -> Result<TcpStream, NetError> {
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
    fn ipv6_literals_are_bracketed_in_the_authority() {
        assert_eq!(authority("fd00::5", 80), "[fd00::5]:80");
        assert_eq!(authority("10.0.0.5", 80), "10.0.0.5:80");
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
}

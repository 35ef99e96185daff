//! The API client's connections: kube-rs's default stack, on sockets with `TCP_NODELAY`.
//!
//! kube-rs connects through hyper's `HttpConnector`, which leaves Nagle's algorithm on. After
//! a TLS handshake the client's `Finished` is still unacknowledged when its first request
//! follows, so the kernel holds the request until the server's delayed ACK fires: **~40 ms
//! on every new connection** (Linux's minimum delayed-ACK timeout), seen in a packet capture
//! of the agent's start (node registration, the first watches) and of every exec a kube-rs
//! client drove through the API server. client-go, kubelet and kubectl set `TCP_NODELAY` on
//! every connection (Go's default); so does this client.
//!
//! The stack is kube-rs's own (`ClientBuilder::try_from`): the base URI, server-error retries,
//! authentication and extra headers over a connector with the configuration's connect, read
//! and write timeouts. What it leaves out: the per-request tracing spans. A kubeconfig with a
//! `proxy-url` gets kube-rs's own client, unchanged (and its answer to proxies).

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::retry::RetryPolicy;
use kube::client::ConfigExt;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// A client for `config`, as `kube::Client::try_from(config)` builds it, whose connections
/// send without delay (`TCP_NODELAY`).
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let http_client =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http_client);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn config_for(url: &str) -> kube::Config {
        let mut config = kube::Config::new(url.parse().expect("a valid URL"));
        config.default_retry = false;
        config
    }

    /// A request through the client works, and the connection it made has `TCP_NODELAY`
    /// (checked on the client's own socket, found among this process's descriptors by the
    /// local port the server saw).
    #[tokio::test]
    async fn the_client_s_connections_have_tcp_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let (mut conn, peer) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            let body = br#"{"major":"1","minor":"37","gitVersion":"v1.37.2","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).await.expect("write");
            conn.write_all(body).await.expect("write");
            // Kept open, so the client's pooled connection stays open too.
            (peer, conn)
        });
        let client = client(config_for(&format!("http://127.0.0.1:{port}"))).expect("client");
        let started = Instant::now();
        let version = client.apiserver_version().await.expect("version");
        assert_eq!(version.git_version, "v1.37.2");
        assert!(started.elapsed() < Duration::from_secs(5));
        let (peer, _open) = server.await.expect("server");
        // The client's socket is this process's: find it by its local port and read the option.
        let nodelay = client_socket_nodelay(peer.port());
        assert_eq!(nodelay, Some(true), "the client's socket lacks TCP_NODELAY");
    }

    /// `TCP_NODELAY` of this process's IPv4 TCP socket bound to local port `port`, if any.
    fn client_socket_nodelay(port: u16) -> Option<bool> {
        let entries = std::fs::read_dir("/proc/self/fd").ok()?;
        for entry in entries.flatten() {
            let Ok(fd) = entry.file_name().to_string_lossy().parse::<libc::c_int>() else {
                continue;
            };
            // SAFETY: plain getsockname/getsockopt into local buffers of the right sizes; on
            // a descriptor that is not a socket (or was closed meanwhile) they fail harmlessly.
            unsafe {
                let mut addr: libc::sockaddr_in = std::mem::zeroed();
                let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                if libc::getsockname(fd, std::ptr::addr_of_mut!(addr).cast(), &mut len) != 0
                    || addr.sin_family != libc::AF_INET as libc::sa_family_t
                    || u16::from_be(addr.sin_port) != port
                {
                    continue;
                }
                let mut value: libc::c_int = 0;
                let mut value_len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                if libc::getsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    std::ptr::addr_of_mut!(value).cast(),
                    &mut value_len,
                ) != 0
                {
                    return None;
                }
                return Some(value != 0);
            }
        }
        None
    }
}

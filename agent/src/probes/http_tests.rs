//! Unit tests of the httpGet client against small loopback servers (plain and TLS).

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::probes::action::PortRef;
use crate::probes::ProbeNetwork;

/// Serves the scripted replies, one connection each, in order; returns the request heads.
async fn serve(replies: Vec<String>) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
    serve_with(replies, None).await
}

/// [`serve`], over TLS when `acceptor` is set.
async fn serve_with(
    replies: Vec<String>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let port = listener.local_addr().expect("local addr").port();
    let server = tokio::spawn(async move {
        let mut requests = Vec::new();
        for reply in replies {
            let Ok((tcp, _)) = listener.accept().await else {
                break;
            };
            let mut conn: Box<dyn Io> = match &acceptor {
                None => Box::new(tcp),
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(tls) => Box::new(tls),
                    Err(_) => continue,
                },
            };
            let mut buf = [0u8; 2048];
            let n = conn.read(&mut buf).await.unwrap_or(0);
            requests.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = conn.write_all(reply.as_bytes()).await;
            let _ = conn.shutdown().await;
        }
        requests
    });
    (port, server)
}

fn target() -> ProbeTarget {
    ProbeTarget {
        container_id: ironlet_runtime::types::ContainerId::random(),
        network: ProbeNetwork::default(),
        container_ports: Vec::new(),
    }
}

fn get(scheme: Scheme, port: u16, path: &str) -> HttpGet {
    HttpGet {
        scheme,
        host: None,
        port: PortRef::Number(port),
        path: path.into(),
        headers: Vec::new(),
    }
}

fn status(line: &str) -> String {
    format!("HTTP/1.1 {line}\r\nContent-Length: 0\r\n\r\n")
}

fn redirect(location: &str) -> String {
    format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n")
}

const TIMEOUT: Duration = Duration::from_secs(5);

/// One httpGet of `path` on the loopback port.
async fn fetch(scheme: Scheme, port: u16, path: &str, usage: HttpUse) -> ProbeOutcome {
    http_get(&target(), &get(scheme, port, path), TIMEOUT, usage).await
}

#[test]
fn the_request_lets_action_headers_replace_the_defaults() {
    let mut action = get(Scheme::Http, 80, "/healthz");
    action.headers = vec![("host".into(), "example.test".into())];
    assert_eq!(
        request(&action, "/healthz", "127.0.0.1:80"),
        "GET /healthz HTTP/1.1\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\n\
         host: example.test\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn status_lines_are_parsed_strictly_and_the_location_is_found() {
    let ok = |head: &[u8]| parse_head(head).map(|r| r.status);
    assert_eq!(ok(b"HTTP/1.1 204 No Content\r\n\r\n"), Some(204));
    assert_eq!(ok(b"HTTP/1.0 302\r\n"), Some(302));
    assert_eq!(ok(b"SSH-2.0-OpenSSH\r\n"), None);
    assert_eq!(ok(b"HTTP/1.1 2000 Huh\r\n"), None);
    assert_eq!(ok(b""), None);
    let head =
        b"HTTP/1.1 301 Moved\r\nX: y\r\nlocation:  /new?a=1 \r\nContent-length: 9\r\n\r\n<a>";
    assert_eq!(
        parse_head(head),
        Some(Response {
            status: 301,
            location: Some("/new?a=1".into()),
            content_length: Some(9),
            body: b"<a>".to_vec(),
        })
    );
}

#[test]
fn locations_resolve_against_the_current_request() {
    let hop = Hop {
        scheme: Scheme::Http,
        host: "10.0.0.5".into(),
        port: 8080,
        path: "/a/b?x=1".into(),
    };
    let to = |loc: &str| hop.follow(loc).map(|h| h.url());
    assert_eq!(to("/c").as_deref(), Some("http://10.0.0.5:8080/c"));
    assert_eq!(to("c").as_deref(), Some("http://10.0.0.5:8080/a/c"));
    assert_eq!(
        to("https://10.0.0.5:8443").as_deref(),
        Some("https://10.0.0.5:8443/")
    );
    assert_eq!(
        to("http://example.test/x?y").as_deref(),
        Some("http://example.test:80/x?y")
    );
    assert_eq!(
        to("//[fd00::1]:81?q").as_deref(),
        Some("http://[fd00::1]:81/?q")
    );
    assert_eq!(to("http://host:port/"), None);
}

#[tokio::test]
async fn an_http_server_answering_500_fails_and_200_succeeds() {
    let (port, server) = serve(vec![status("500 Oops"), status("200 OK")]).await;
    let action = get(Scheme::Http, port, "/");
    let first = http_get(&target(), &action, TIMEOUT, HttpUse::Probe).await;
    assert_eq!(
        first,
        ProbeOutcome::Failure("HTTP probe failed with statuscode: 500".into())
    );
    let second = http_get(&target(), &action, TIMEOUT, HttpUse::Probe).await;
    assert_eq!(second, ProbeOutcome::Success);
    server.abort();
}

#[tokio::test]
async fn a_redirect_to_the_same_host_is_followed_and_judged_by_its_target() {
    let (port, server) = serve(vec![redirect("/healthz"), status("503 Unavailable")]).await;
    let outcome = fetch(Scheme::Http, port, "/redirect", HttpUse::Probe).await;
    assert_eq!(
        outcome,
        ProbeOutcome::Failure("HTTP probe failed with statuscode: 503".into())
    );
    let requests = server.await.expect("server");
    assert!(requests[0].starts_with("GET /redirect "), "{requests:?}");
    assert!(requests[1].starts_with("GET /healthz "), "{requests:?}");

    let (port, server) = serve(vec![redirect("/healthz"), status("200 OK")]).await;
    let outcome = fetch(Scheme::Http, port, "/redirect", HttpUse::Probe).await;
    assert_eq!(outcome, ProbeOutcome::Success);
    server.abort();
}

#[tokio::test]
async fn a_redirect_to_another_host_is_a_success_with_a_warning() {
    // What Go's http.Redirect answers (agnhost's /redirect in the conformance suite).
    let body = "<a href=\"http://0.0.0.0/\">Found</a>.\n\n";
    let reply = format!(
        "HTTP/1.1 302 Found\r\nLocation: http://0.0.0.0/\r\nContent-Type: text/html\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (port, server) = serve(vec![reply]).await;
    let outcome = fetch(Scheme::Http, port, "/redirect", HttpUse::Probe).await;
    assert_eq!(
        outcome,
        ProbeOutcome::Warning(format!("Probe terminated redirects, Response body: {body}")),
        "kubelet's message, with the body"
    );
    assert!(outcome.is_success());
    let requests = server.await.expect("server");
    assert_eq!(requests.len(), 1, "the other host is never asked");
}

#[tokio::test]
async fn more_than_ten_redirects_fail() {
    let (port, server) = serve(vec![redirect("/again"); 11]).await;
    let outcome = fetch(Scheme::Http, port, "/", HttpUse::Probe).await;
    assert_eq!(
        outcome,
        ProbeOutcome::Failure(format!(
            "Get \"http://127.0.0.1:{port}/again\": stopped after 10 redirects"
        ))
    );
    server.abort();
}

#[tokio::test]
async fn an_empty_reply_is_eof_as_in_go_and_a_hook_ignores_the_status() {
    let (port, server) = serve(vec![String::new(), status("500 Oops")]).await;
    let action = get(Scheme::Http, port, "/stop");
    let empty = http_get(&target(), &action, TIMEOUT, HttpUse::Hook).await;
    assert_eq!(
        empty,
        ProbeOutcome::Failure(format!("Get \"http://127.0.0.1:{port}/stop\": EOF"))
    );
    let error_status = http_get(&target(), &action, TIMEOUT, HttpUse::Hook).await;
    assert_eq!(error_status, ProbeOutcome::Success);
    server.abort();
}

/// A TLS server with a fresh self-signed certificate answering `replies` in order.
async fn serve_tls(replies: Vec<String>) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["unrelated.test".to_owned()])
        .expect("self-signed certificate");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .expect("server config");
    serve_with(
        replies,
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
    )
    .await
}

#[tokio::test]
async fn https_does_not_verify_the_certificate_and_judges_the_status() {
    let (port, server) = serve_tls(vec![status("200 OK"), status("500 Oops")]).await;
    let action = get(Scheme::Https, port, "/healthz");
    let ok = http_get(&target(), &action, TIMEOUT, HttpUse::Probe).await;
    assert_eq!(ok, ProbeOutcome::Success);
    let failed = http_get(&target(), &action, TIMEOUT, HttpUse::Probe).await;
    assert_eq!(
        failed,
        ProbeOutcome::Failure("HTTP probe failed with statuscode: 500".into())
    );
    let requests = server.await.expect("server");
    assert!(
        requests[0].starts_with("GET /healthz HTTP/1.1\r\n"),
        "{requests:?}"
    );
}

#[tokio::test]
async fn https_to_a_plain_http_server_fails() {
    let (port, server) = serve(vec![status("200 OK")]).await;
    let outcome = fetch(Scheme::Https, port, "/", HttpUse::Hook).await;
    assert!(
        matches!(&outcome, ProbeOutcome::Failure(m) if m.contains("TLS handshake")),
        "{outcome:?}"
    );
    server.abort();
}

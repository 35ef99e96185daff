//! Unit tests of the gRPC health probe: the message encoding, and calls against a small
//! `grpc.health.v1.Health` server on loopback (HTTP/2 by `h2`, messages written by hand
//! from the protocol's bytes, independently of the client's encoder).

use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;

use super::*;
use crate::probes::ProbeNetwork;

/// What the test server answers to a `Check` for a service.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// A `HealthCheckResponse` with this status, then `grpc-status: 0`.
    Health(u8),
    /// A normal answer without a message and a non-zero `grpc-status` in the trailers.
    Error(u32, &'static str),
    /// A trailers-only answer: the `grpc-status` in the response headers.
    TrailersOnly(u32, &'static str),
}

/// Serves `Check` calls with `reply(service)`; records each request's path and service.
async fn serve(reply: fn(&str) -> Reply) -> (u16, Arc<Mutex<Vec<(String, String)>>>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let port = listener.local_addr().expect("local addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((request, mut respond))) = conn.accept().await {
                    let path = request.uri().path().to_owned();
                    let mut body = request.into_body();
                    let mut data = Vec::new();
                    while let Some(Ok(chunk)) = body.data().await {
                        let _ = body.flow_control().release_capacity(chunk.len());
                        data.extend_from_slice(&chunk);
                    }
                    // [0, len(4)] then, for a named service, [0x0a, len, name].
                    let service = match data.get(5..) {
                        Some([0x0a, len, name @ ..]) if name.len() == usize::from(*len) => {
                            String::from_utf8_lossy(name).into_owned()
                        }
                        _ => String::new(),
                    };
                    log.lock().expect("log").push((path, service.clone()));
                    let head = |extra: Option<(u32, &str)>| {
                        let mut builder = http::Response::builder()
                            .status(200)
                            .header("content-type", "application/grpc");
                        if let Some((code, message)) = extra {
                            builder = builder
                                .header("grpc-status", code.to_string())
                                .header("grpc-message", message.replace(' ', "%20"));
                        }
                        builder.body(()).expect("response head")
                    };
                    let trailers = |code: u32, message: &str| {
                        let mut t = http::HeaderMap::new();
                        t.insert("grpc-status", code.to_string().parse().expect("value"));
                        t.insert("grpc-message", message.parse().expect("value"));
                        t
                    };
                    match reply(&service) {
                        Reply::Health(status) => {
                            let Ok(mut send) = respond.send_response(head(None), false) else {
                                continue;
                            };
                            let message = Bytes::from(vec![0, 0, 0, 0, 2, 0x08, status]);
                            let _ = send.send_data(message, false);
                            let _ = send.send_trailers(trailers(0, ""));
                        }
                        Reply::Error(code, message) => {
                            let Ok(mut send) = respond.send_response(head(None), false) else {
                                continue;
                            };
                            let _ = send.send_trailers(trailers(code, message));
                        }
                        Reply::TrailersOnly(code, message) => {
                            let _ = respond.send_response(head(Some((code, message))), true);
                        }
                    }
                }
            });
        }
    });
    (port, seen)
}

fn target() -> ProbeTarget {
    ProbeTarget {
        container_id: ironlet_runtime::types::ContainerId::random(),
        network: ProbeNetwork::default(),
        container_ports: Vec::new(),
    }
}

const TIMEOUT: Duration = Duration::from_secs(5);

fn health(service: &str) -> Reply {
    match service {
        "" | "web" => Reply::Health(1),
        "db" => Reply::Health(2),
        _ => Reply::Error(5, "unknown service"),
    }
}

#[test]
fn messages_are_encoded_as_protobuf_behind_the_grpc_prefix() {
    assert_eq!(check_request(""), Vec::<u8>::new());
    assert_eq!(check_request("web"), b"\x0a\x03web".to_vec());
    assert_eq!(
        frame(b"\x0a\x03web"),
        b"\x00\x00\x00\x00\x05\x0a\x03web".to_vec()
    );
    assert_eq!(
        unframe(b"\x00\x00\x00\x00\x02\x08\x01"),
        Some(&b"\x08\x01"[..])
    );
    assert_eq!(unframe(b"\x01\x00\x00\x00\x02\x08\x01"), None, "compressed");
    assert_eq!(unframe(b"\x00\x00\x00\x00\x05\x08"), None, "short");
    assert_eq!(health_status(b""), Some(0));
    // An unknown string field before the status is skipped.
    assert_eq!(health_status(b"\x12\x02hi\x08\x02"), Some(2));
    assert_eq!(health_status(b"\x08"), None);
    let mut long = Vec::new();
    put_varint(&mut long, 300);
    assert_eq!(long, vec![0xac, 0x02]);
    assert_eq!(take_varint(&mut &long[..]), Some(300));
    assert_eq!(
        percent_decode("unknown%20service%3A%20x"),
        "unknown service: x"
    );
}

#[tokio::test]
async fn a_serving_service_is_a_success_and_the_service_name_is_sent() {
    let (port, seen) = serve(health).await;
    let outcome = grpc_check(&target(), port, Some("web"), TIMEOUT).await;
    assert_eq!(outcome, ProbeOutcome::Success);
    let overall = grpc_check(&target(), port, None, TIMEOUT).await;
    assert_eq!(overall, ProbeOutcome::Success);
    let seen = seen.lock().expect("log").clone();
    assert_eq!(
        seen,
        vec![
            ("/grpc.health.v1.Health/Check".to_owned(), "web".to_owned()),
            ("/grpc.health.v1.Health/Check".to_owned(), String::new()),
        ]
    );
}

#[tokio::test]
async fn a_service_not_serving_fails_with_kubelets_message() {
    let (port, _) = serve(health).await;
    let outcome = grpc_check(&target(), port, Some("db"), TIMEOUT).await;
    assert_eq!(
        outcome,
        ProbeOutcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
    );
}

#[tokio::test]
async fn grpc_errors_fail_with_their_code_and_message() {
    let (port, _) = serve(health).await;
    let outcome = grpc_check(&target(), port, Some("cache"), TIMEOUT).await;
    assert_eq!(
        outcome,
        ProbeOutcome::Failure(
            "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
                .into()
        )
    );
    let (port, _) =
        serve(|_| Reply::TrailersOnly(12, "unknown service grpc.health.v1.Health")).await;
    let outcome = grpc_check(&target(), port, None, TIMEOUT).await;
    assert_eq!(
        outcome,
        ProbeOutcome::Failure(
            "error: this server does not implement the grpc health protocol \
             (grpc.health.v1.Health): unknown service grpc.health.v1.Health"
                .into()
        )
    );
}

#[tokio::test]
async fn a_closed_port_fails_to_connect_and_plain_http_is_not_grpc() {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let port = listener.local_addr().expect("local addr").port();
    drop(listener);
    let outcome = grpc_check(&target(), port, None, TIMEOUT).await;
    assert!(
        matches!(&outcome, ProbeOutcome::Failure(m)
            if m.starts_with(&format!("error: failed to connect service at \"127.0.0.1:{port}\""))),
        "{outcome:?}"
    );
    // An HTTP/1 server that answers and closes is a failed rpc, not a success.
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let port = listener.local_addr().expect("local addr").port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let outcome = grpc_check(&target(), port, None, TIMEOUT).await;
    assert!(
        matches!(&outcome, ProbeOutcome::Failure(m) if m.starts_with("error: health rpc probe failed")),
        "{outcome:?}"
    );
}

//! The grpc probe action: one `grpc.health.v1.Health/Check` unary call over HTTP/2
//! (cleartext, prior knowledge), as kubelet's `pkg/probe/grpc` makes it.
//!
//! The call is encoded by hand: the request is `HealthCheckRequest { service = 1 }` and the
//! answer `HealthCheckResponse { status = 1 }`, each a protobuf message behind gRPC's 5-byte
//! length prefix; HTTP/2 itself is the `h2` crate.
//!
//! Outcomes and messages, as kubelet's:
//! - `SERVING` → success;
//! - another status → failure, `service unhealthy (responded with "NOT_SERVING")`;
//! - gRPC status `Unimplemented` → failure, `error: this server does not implement the grpc
//!   health protocol (grpc.health.v1.Health): <message>`;
//! - another gRPC error → failure, `error: health rpc probe failed: rpc error: code = NotFound
//!   desc = unknown service`;
//! - no connection → failure, `error: failed to connect service at "10.1.0.5:9000": …`;
//! - out of time → failure, `timeout: health rpc did not complete within 1s`.
//!
//! The probe connects to the pod's IP (the action has no host), from the host's network
//! namespace, or from inside the pod's namespace when the pod has no IP (see `net`).

use std::time::Duration;

use bytes::Bytes;

use super::net::{authority, connect, Route};
use super::{ProbeOutcome, ProbeTarget};

/// kubelet's gRPC probe user agent, at the Kubernetes version ironlet follows.
const USER_AGENT: &str = "kube-probe/1.37";
/// The longest response message read.
const MAX_MESSAGE: usize = 64 * 1024;
/// gRPC's `Unimplemented` status code.
const UNIMPLEMENTED: u32 = 12;

/// Why a call did not produce a health status.
#[derive(Debug)]
enum CallError {
    /// The connection or the HTTP/2 exchange failed.
    Transport(String),
    /// The server answered with a non-OK gRPC status.
    Status { code: u32, message: String },
}

/// grpc: success when the server says `SERVING` for `service` within `timeout`.
pub(crate) async fn grpc_check(
    target: &ProbeTarget,
    port: u16,
    service: Option<&str>,
    timeout: Duration,
) -> ProbeOutcome {
    let route = Route::new(&target.network, None);
    let addr = authority(route.host(), port);
    let tcp = match tokio::time::timeout(timeout, connect(&route, port, timeout)).await {
        Err(_) => {
            return ProbeOutcome::Failure(format!(
                "timeout: failed to connect service {addr:?} within {timeout:?}: context deadline exceeded"
            ))
        }
        Ok(Err(e)) if e.is_local() => return ProbeOutcome::Unknown(e.to_string()),
        Ok(Err(e)) => {
            return ProbeOutcome::Failure(format!(
                "error: failed to connect service at {addr:?}: {e}"
            ))
        }
        Ok(Ok(tcp)) => tcp,
    };
    let service = service.unwrap_or_default();
    match tokio::time::timeout(timeout, call(tcp, &addr, service, timeout)).await {
        Err(_) => ProbeOutcome::Failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Ok(1)) => ProbeOutcome::Success,
        Ok(Ok(status)) => ProbeOutcome::Failure(format!(
            "service unhealthy (responded with {:?})",
            status_name(status)
        )),
        Ok(Err(CallError::Status { code, message })) if code == UNIMPLEMENTED => {
            ProbeOutcome::Failure(format!(
                "error: this server does not implement the grpc health protocol \
                 (grpc.health.v1.Health): {message}"
            ))
        }
        Ok(Err(CallError::Status { code, message })) => ProbeOutcome::Failure(format!(
            "error: health rpc probe failed: rpc error: code = {} desc = {message}",
            code_name(code)
        )),
        Ok(Err(CallError::Transport(message))) => {
            ProbeOutcome::Failure(format!("error: health rpc probe failed: {message}"))
        }
    }
}

/// One `Check` call on a fresh HTTP/2 connection; the `status` field of the answer.
async fn call(
    tcp: tokio::net::TcpStream,
    addr: &str,
    service: &str,
    timeout: Duration,
) -> Result<u64, CallError> {
    let transport = |e: h2::Error| CallError::Transport(e.to_string());
    let (client, connection) = h2::client::handshake(tcp).await.map_err(transport)?;
    // Drives the connection; ends when the client side is dropped.
    let driver = tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(%err, "gRPC probe connection ended");
        }
    });
    let result = async {
        let mut client = client.ready().await.map_err(transport)?;
        let request = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("http://{addr}/grpc.health.v1.Health/Check"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", USER_AGENT)
            .header("grpc-timeout", format!("{}m", timeout.as_millis().max(1)))
            .body(())
            .map_err(|e| CallError::Transport(e.to_string()))?;
        let (response, mut stream) = client.send_request(request, false).map_err(transport)?;
        stream
            .send_data(Bytes::from(frame(&check_request(service))), true)
            .map_err(transport)?;
        let response = response.await.map_err(transport)?;
        let (head, mut body) = response.into_parts();
        if head.status != http::StatusCode::OK {
            return Err(CallError::Status {
                code: 2,
                message: format!(
                    "unexpected HTTP status code received from server: {}",
                    head.status.as_u16()
                ),
            });
        }
        // A trailers-only answer carries the gRPC status in its headers.
        if let Some(err) = status_error(&head.headers) {
            return Err(err);
        }
        let mut data = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(transport)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            data.extend_from_slice(&chunk);
            if data.len() > MAX_MESSAGE {
                return Err(CallError::Transport(format!(
                    "response larger than {MAX_MESSAGE} bytes"
                )));
            }
        }
        let trailers = body.trailers().await.map_err(transport)?;
        if let Some(err) = trailers.as_ref().and_then(status_error) {
            return Err(err);
        }
        let message = unframe(&data).ok_or_else(|| CallError::Status {
            code: 13,
            message: "malformed gRPC message in the response".into(),
        })?;
        health_status(message).ok_or_else(|| CallError::Status {
            code: 13,
            message: "malformed HealthCheckResponse".into(),
        })
    }
    .await;
    driver.abort();
    result
}

/// The error a `grpc-status` header other than 0 stands for.
fn status_error(headers: &http::HeaderMap) -> Option<CallError> {
    let code: u32 = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (code != 0).then(|| CallError::Status {
        code,
        message: headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .map(percent_decode)
            .unwrap_or_default(),
    })
}

/// `grpc-message` is percent-encoded.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `HealthCheckRequest { service = 1 }` (an empty service is the empty message).
fn check_request(service: &str) -> Vec<u8> {
    let mut message = Vec::new();
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        put_varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    message
}

/// gRPC's length-prefixed message: not compressed, big-endian length, the bytes.
fn frame(message: &[u8]) -> Vec<u8> {
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The first message of a gRPC body, if it is complete and not compressed.
fn unframe(data: &[u8]) -> Option<&[u8]> {
    let (&flag, rest) = data.split_first()?;
    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?;
    (flag == 0).then_some(())?;
    rest.get(4..4 + len)
}

/// Field 1 (`status`) of a `HealthCheckResponse`; 0 (`UNKNOWN`) when absent.
fn health_status(mut message: &[u8]) -> Option<u64> {
    let mut status = 0;
    while !message.is_empty() {
        let key = take_varint(&mut message)?;
        match (key >> 3, key & 7) {
            (1, 0) => status = take_varint(&mut message)?,
            (_, 0) => {
                take_varint(&mut message)?;
            }
            (_, 1) => message = message.get(8..)?,
            (_, 2) => {
                let len = usize::try_from(take_varint(&mut message)?).ok()?;
                message = message.get(len..)?;
            }
            (_, 5) => message = message.get(4..)?,
            _ => return None,
        }
    }
    Some(status)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(data: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = data.split_first()?;
        *data = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// `HealthCheckResponse.ServingStatus` as Go's generated `String()` spells it.
fn status_name(status: u64) -> String {
    match status {
        0 => "UNKNOWN".into(),
        1 => "SERVING".into(),
        2 => "NOT_SERVING".into(),
        3 => "SERVICE_UNKNOWN".into(),
        other => other.to_string(),
    }
}

/// gRPC status codes as Go's `codes.Code.String()` spells them.
fn code_name(code: u32) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("Code({code})"), |n| (*n).to_owned())
}

#[cfg(test)]
#[path = "grpc_tests.rs"]
mod tests;

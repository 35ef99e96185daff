//! A blocking client for the agent's socket: one `GET`, one response, as the `ironlet pods`
//! command and tests need. No async runtime required.
//!
//! Guarantees: the whole exchange is bounded by [`TIMEOUT`] per read/write and the response
//! by [`MAX_RESPONSE`] bytes; a malformed response is an error, never a panic.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Per read or write on the socket.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// A pod list of thousands of pods fits many times over.
pub const MAX_RESPONSE: u64 = 256 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sending the request to {path}")]
    Send {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the response from {path}")]
    Receive {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the response from {path} is larger than {MAX_RESPONSE} bytes")]
    TooLarge { path: PathBuf },
    #[error("malformed response from {path}: {what}")]
    Malformed { path: PathBuf, what: &'static str },
}

/// A received response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// `GET path` on the socket.
pub fn get(socket: &Path, path: &str) -> Result<ClientResponse, ClientError> {
    let mut stream = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: socket.into(),
        source,
    })?;
    let send = |source| ClientError::Send {
        path: socket.into(),
        source,
    };
    stream.set_write_timeout(Some(TIMEOUT)).map_err(send)?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(send)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(send)?;
    let mut raw = Vec::new();
    (&mut stream)
        .take(MAX_RESPONSE + 1)
        .read_to_end(&mut raw)
        .map_err(|source| ClientError::Receive {
            path: socket.into(),
            source,
        })?;
    if raw.len() as u64 > MAX_RESPONSE {
        return Err(ClientError::TooLarge {
            path: socket.into(),
        });
    }
    parse_response(&raw).map_err(|what| ClientError::Malformed {
        path: socket.into(),
        what,
    })
}

fn parse_response(raw: &[u8]) -> Result<ClientResponse, &'static str> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or("bad status line")?;
    let headers = lines
        .map(|l| {
            l.split_once(':')
                .map(|(n, v)| (n.to_owned(), v.trim().to_owned()))
                .ok_or("bad header line")
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut body = raw[end + 4..].to_vec();
    let length = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse::<usize>().map_err(|_| "bad Content-Length"))
        .transpose()?;
    if let Some(length) = length {
        if body.len() < length {
            return Err("body shorter than its Content-Length");
        }
        body.truncate(length);
    }
    Ok(ClientResponse {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_parses_into_status_headers_and_body() {
        let resp =
            parse_response(b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nX: y\r\n\r\nabcdef")
                .unwrap();
        assert_eq!(resp.status, 404);
        assert_eq!(resp.headers[1], ("X".into(), "y".into()));
        assert_eq!(resp.body, b"abc");
    }

    #[test]
    fn malformed_responses_are_errors() {
        for raw in [
            &b""[..],
            b"HTTP/1.1 200 OK\r\n",
            b"SPDY 200\r\n\r\n",
            b"HTTP/1.1 2x0 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nnocolon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
        ] {
            assert!(
                parse_response(raw).is_err(),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }
}

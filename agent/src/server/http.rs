//! A minimal HTTP/1.1 server side: parse one request (request line, headers, an optional
//! `Content-Length` body) and write one response with `Connection: close`.
//!
//! Guarantees:
//! - Parsing never panics on any input; every malformed request maps to an [`HttpError`]
//!   whose [`HttpError::status`] is the 4xx/5xx to answer with.
//! - Memory is bounded by [`Limits`]: the head (request line + headers) may not exceed
//!   `max_head` bytes (431), the body `max_body` bytes (413), checked before the body is
//!   read. A client that trickles bytes is bounded by the caller's timeout, not here.
//! - Chunked bodies (`Transfer-Encoding`) are refused with 501; HTTP versions other than
//!   1.0/1.1 with 505.
//!
//! Current behaviour, not contract: bare `\n` line ends are accepted as well as `\r\n`;
//! bytes after the body (pipelined requests) are ignored, since the connection closes.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Caps on what one request may make the server hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Request line plus headers, including the blank line that ends them.
    pub max_head: usize,
    /// Body bytes (`Content-Length`).
    pub max_body: usize,
    /// Number of header lines.
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // Go's net/http allows 1 MiB of headers; the endpoints here take none that
            // matter, so a small cap keeps a connection's memory small.
            max_head: 8 * 1024,
            max_body: 64 * 1024,
            max_headers: 64,
        }
    }
}

/// One parsed request. Header names are kept as sent; look them up with [`Request::header`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path part of the request target (before `?`), e.g. `/pods/default/web`.
    pub path: String,
    /// The query string without `?`, if any.
    pub query: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// A bodiless request with these headers (for tests of handlers).
    #[cfg(test)]
    pub fn with_headers(method: &str, path: &str, headers: &[(&str, &str)]) -> Self {
        Self {
            method: method.into(),
            path: path.into(),
            query: None,
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            body: Vec::new(),
        }
    }

    /// The first header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request was refused; each maps to one response status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("malformed request line")]
    RequestLine,
    #[error("malformed header line")]
    HeaderLine,
    #[error("invalid Content-Length")]
    ContentLength,
    #[error("request headers exceed {limit} bytes")]
    HeadTooLarge { limit: usize },
    #[error("more than {limit} request headers")]
    TooManyHeaders { limit: usize },
    #[error("request body of {length} bytes exceeds {limit} bytes")]
    BodyTooLarge { length: usize, limit: usize },
    #[error("Transfer-Encoding is not supported; send a Content-Length body")]
    TransferEncoding,
    #[error("HTTP version {version} is not supported")]
    Version { version: String },
    #[error("connection closed in the middle of the request")]
    Truncated,
}

impl HttpError {
    /// The response status for this error.
    pub fn status(&self) -> u16 {
        match self {
            Self::RequestLine | Self::HeaderLine | Self::ContentLength | Self::Truncated => 400,
            Self::HeadTooLarge { .. } | Self::TooManyHeaders { .. } => 431,
            Self::BodyTooLarge { .. } => 413,
            Self::TransferEncoding => 501,
            Self::Version { .. } => 505,
        }
    }
}

/// Reading a request from a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection before sending a byte: nothing to answer.
    #[error("connection closed before a request")]
    Closed,
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("reading the request")]
    Io(#[source] std::io::Error),
}

/// The request line and headers, parsed; the body is still to be read.
#[derive(Debug, PartialEq, Eq)]
pub struct Head {
    pub request: Request,
    /// Bytes of the buffer the head took, including the blank line.
    pub len: usize,
    pub content_length: usize,
}

/// Parses the head at the start of `buf`. `Ok(None)`: not complete yet, read more.
pub fn parse_head(buf: &[u8], limits: &Limits) -> Result<Option<Head>, HttpError> {
    let window = &buf[..buf.len().min(limits.max_head)];
    let Some(len) = head_end(window) else {
        return if buf.len() >= limits.max_head {
            Err(HttpError::HeadTooLarge {
                limit: limits.max_head,
            })
        } else {
            Ok(None)
        };
    };
    let mut lines = window[..len]
        .split(|b| *b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .take_while(|l| !l.is_empty());
    let (method, target) = parse_request_line(lines.next().unwrap_or_default())?;
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == limits.max_headers {
            return Err(HttpError::TooManyHeaders {
                limit: limits.max_headers,
            });
        }
        headers.push(parse_header(line)?);
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (target, None),
    };
    let request = Request {
        method,
        path,
        query,
        headers,
        body: Vec::new(),
    };
    if request.header("transfer-encoding").is_some() {
        return Err(HttpError::TransferEncoding);
    }
    let content_length = content_length(&request)?;
    if content_length > limits.max_body {
        return Err(HttpError::BodyTooLarge {
            length: content_length,
            limit: limits.max_body,
        });
    }
    Ok(Some(Head {
        request,
        len,
        content_length,
    }))
}

/// Reads one request, bounded by `limits` (and by the caller's timeout).
pub async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    limits: &Limits,
) -> Result<Request, ReadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head = loop {
        if let Some(head) = parse_head(&buf, limits)? {
            break head;
        }
        let n = reader.read(&mut chunk).await.map_err(ReadError::Io)?;
        if n == 0 {
            return Err(if buf.is_empty() {
                ReadError::Closed
            } else {
                HttpError::Truncated.into()
            });
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let end = head.len + head.content_length;
    while buf.len() < end {
        let n = reader.read(&mut chunk).await.map_err(ReadError::Io)?;
        if n == 0 {
            return Err(HttpError::Truncated.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut request = head.request;
    request.body = buf[head.len..end].to_vec();
    Ok(request)
}

/// The length of the head including its blank line, if the buffer holds all of it.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(off) = buf[i..].iter().position(|b| *b == b'\n') {
        let nl = i + off;
        let rest = &buf[nl + 1..];
        if rest.starts_with(b"\n") {
            return Some(nl + 2);
        }
        if rest.starts_with(b"\r\n") {
            return Some(nl + 3);
        }
        i = nl + 1;
    }
    None
}

fn parse_request_line(line: &[u8]) -> Result<(String, String), HttpError> {
    let line = std::str::from_utf8(line).map_err(|_| HttpError::RequestLine)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::RequestLine);
    };
    if method.is_empty() || !method.bytes().all(is_token_byte) {
        return Err(HttpError::RequestLine);
    }
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HttpError::RequestLine);
    }
    match version {
        "HTTP/1.1" | "HTTP/1.0" => Ok((method.to_owned(), target.to_owned())),
        v if v.len() == 8
            && v.starts_with("HTTP/")
            && v.as_bytes()[5].is_ascii_digit()
            && v.as_bytes()[6] == b'.'
            && v.as_bytes()[7].is_ascii_digit() =>
        {
            Err(HttpError::Version {
                version: v.to_owned(),
            })
        }
        _ => Err(HttpError::RequestLine),
    }
}

fn parse_header(line: &[u8]) -> Result<(String, String), HttpError> {
    let colon = line
        .iter()
        .position(|b| *b == b':')
        .ok_or(HttpError::HeaderLine)?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    // An empty name also rejects obsolete line folding (a line starting with whitespace).
    if name.is_empty() || !name.iter().copied().all(is_token_byte) {
        return Err(HttpError::HeaderLine);
    }
    if value
        .iter()
        .any(|b| (b.is_ascii_control() && *b != b'\t') || *b == 0x7f)
    {
        return Err(HttpError::HeaderLine);
    }
    let value = std::str::from_utf8(value).map_err(|_| HttpError::HeaderLine)?;
    let name = std::str::from_utf8(name).map_err(|_| HttpError::HeaderLine)?;
    Ok((name.to_owned(), value.trim_matches([' ', '\t']).to_owned()))
}

fn content_length(request: &Request) -> Result<usize, HttpError> {
    let mut found: Option<usize> = None;
    for (_, value) in request
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
    {
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(HttpError::ContentLength);
        }
        // Too many digits for usize is certainly over any body limit.
        let n = value.parse::<usize>().unwrap_or(usize::MAX);
        match found {
            Some(prev) if prev != n => return Err(HttpError::ContentLength),
            _ => found = Some(n),
        }
    }
    Ok(found.unwrap_or(0))
}

/// RFC 9110 `tchar`.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// One response; always sent with `Content-Length` and `Connection: close`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// The `Allow` header of a 405.
    pub allow: Option<&'static str>,
}

pub const TEXT: &str = "text/plain; charset=utf-8";
pub const JSON: &str = "application/json";

impl Response {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            content_type,
            body: body.into(),
            allow: None,
        }
    }

    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self::new(status, TEXT, body.into())
    }

    /// The answer to a request that could not be parsed.
    pub fn for_error(err: &HttpError) -> Self {
        Self::text(err.status(), format!("{err}\n"))
    }

    /// The bytes on the wire; `head_only` for a HEAD request (length kept, body dropped).
    pub fn to_bytes(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
            self.status,
            reason_phrase(self.status),
            self.content_type,
            self.body.len()
        );
        if let Some(allow) = self.allow {
            out.push_str("Allow: ");
            out.push_str(allow);
            out.push_str("\r\n");
        }
        out.push_str("Connection: close\r\n\r\n");
        let mut out = out.into_bytes();
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::ReadBuf;

    use super::*;

    fn parse(raw: &[u8]) -> Result<Option<Head>, HttpError> {
        parse_head(raw, &Limits::default())
    }

    /// Hands out its bytes `step` at a time, as a slow client would.
    struct Trickle {
        data: Vec<u8>,
        pos: usize,
        step: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let end = (self.pos + self.step)
                .min(self.data.len())
                .min(self.pos + buf.remaining());
            let pos = self.pos;
            buf.put_slice(&self.data[pos..end]);
            self.pos = end;
            Poll::Ready(Ok(()))
        }
    }

    async fn read_trickled(raw: &[u8], step: usize) -> Result<Request, ReadError> {
        let mut r = Trickle {
            data: raw.to_vec(),
            pos: 0,
            step,
        };
        read_request(&mut r, &Limits::default()).await
    }

    #[test]
    fn a_simple_get_parses_into_method_path_query_and_headers() {
        let raw = b"GET /pods/default/web?x=1 HTTP/1.1\r\nHost: a\r\nAccept:  */* \r\n\r\n";
        let head = parse(raw).unwrap().unwrap();
        assert_eq!(head.request.method, "GET");
        assert_eq!(head.request.path, "/pods/default/web");
        assert_eq!(head.request.query.as_deref(), Some("x=1"));
        assert_eq!(head.request.header("accept"), Some("*/*"));
        assert_eq!(head.content_length, 0);
        assert_eq!(head.len, raw.len());
    }

    #[test]
    fn bare_newlines_end_lines_too() {
        let raw = b"GET /healthz HTTP/1.0\nHost: a\n\nbody";
        let head = parse(raw).unwrap().unwrap();
        assert_eq!(head.request.path, "/healthz");
        assert_eq!(head.len, raw.len() - 4);
    }

    #[test]
    fn an_incomplete_head_asks_for_more() {
        assert_eq!(
            parse(b"GET /healthz HTTP/1.1\r\nHost: a\r\n").unwrap(),
            None
        );
        assert_eq!(parse(b"").unwrap(), None);
    }

    #[test]
    fn malformed_request_lines_are_bad_requests() {
        for raw in [
            &b"GET /healthz\r\n\r\n"[..],
            b"GET  /healthz HTTP/1.1\r\n\r\n",
            b"GET /healthz HTTP/1.1 extra\r\n\r\n",
            b"GET healthz HTTP/1.1\r\n\r\n",
            b"G(T /healthz HTTP/1.1\r\n\r\n",
            b"GET /heal\x01thz HTTP/1.1\r\n\r\n",
            b"GET /healthz FTP/1.1\r\n\r\n",
            b"\xff\xfe /healthz HTTP/1.1\r\n\r\n",
            b"\r\n\r\n",
        ] {
            let err = parse(raw).unwrap_err();
            assert_eq!(err.status(), 400, "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn malformed_headers_are_bad_requests() {
        for raw in [
            &b"GET / HTTP/1.1\r\nno colon\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
            b"GET / HTTP/1.1\r\n: empty\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        ] {
            let err = parse(raw).unwrap_err();
            assert_eq!(err.status(), 400, "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn other_http_versions_and_chunked_bodies_are_refused_by_status() {
        assert_eq!(parse(b"GET / HTTP/2.0\r\n\r\n").unwrap_err().status(), 505);
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(parse(chunked).unwrap_err().status(), 501);
    }

    #[test]
    fn oversize_heads_bodies_and_header_counts_are_refused_before_reading_on() {
        let limits = Limits::default();
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(limits.max_head));
        assert_eq!(parse(long.as_bytes()).unwrap_err().status(), 431);

        let many: String = (0..=limits.max_headers)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        let raw = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parse(raw.as_bytes()).unwrap_err().status(), 431);

        let raw = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            limits.max_body + 1
        );
        assert_eq!(parse(raw.as_bytes()).unwrap_err().status(), 413);
        let huge = b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n";
        assert_eq!(parse(huge).unwrap_err().status(), 413);
    }

    #[tokio::test]
    async fn a_request_read_one_byte_at_a_time_comes_out_whole_with_its_body() {
        let raw = b"POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello and more";
        let req = read_trickled(raw, 1).await.unwrap();
        assert_eq!(req.method, "POST");
        assert_eq!(req.body, b"hello");
    }

    #[tokio::test]
    async fn a_connection_closed_mid_request_is_a_truncated_request() {
        let err = read_trickled(b"GET / HTTP/1.1\r\nHost", 3)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ReadError::Http(HttpError::Truncated)),
            "{err:?}"
        );
        let body_cut = b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc";
        let err = read_trickled(body_cut, 7).await.unwrap_err();
        assert!(
            matches!(err, ReadError::Http(HttpError::Truncated)),
            "{err:?}"
        );
        let err = read_trickled(b"", 1).await.unwrap_err();
        assert!(matches!(err, ReadError::Closed), "{err:?}");
    }

    #[tokio::test]
    async fn an_endless_header_stream_stops_at_the_head_limit() {
        let endless = vec![b'a'; 64 * 1024];
        let err = read_trickled(&endless, 1000).await.unwrap_err();
        assert!(
            matches!(err, ReadError::Http(HttpError::HeadTooLarge { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn responses_carry_length_and_close_and_head_drops_the_body() {
        let resp = Response::text(200, "ok");
        assert_eq!(
            resp.to_bytes(false),
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        );
        let head = String::from_utf8(resp.to_bytes(true)).unwrap();
        assert!(head.ends_with("Content-Length: 2\r\nConnection: close\r\n\r\n"));
        let mut not_allowed = Response::text(405, "");
        not_allowed.allow = Some("GET, HEAD");
        let text = String::from_utf8(not_allowed.to_bytes(false)).unwrap();
        assert!(text.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
        assert!(text.contains("\r\nAllow: GET, HEAD\r\n"));
    }
}

//! `/portForward/{namespace}/{pod}[/{uid}]`: kubelet's port forwarding over SPDY/3.1
//! (`portforward.k8s.io`), as `kubectl port-forward` reaches it through the v1.37 API server.
//!
//! What arrives (`pkg/registry/core/pod/rest/subresources.go`, `pkg/kubelet/server/server.go`):
//! kubectl opens a WebSocket offering `SPDY/3.1+portforward.k8s.io`. To a node declaring
//! `ExtendWebSocketsToKubelet` the API server proxies it unchanged and the node unwraps the
//! tunnel (`k8s.io/apiserver/pkg/util/proxy/streamtunnel.go`): the SPDY byte stream travels
//! in WebSocket binary messages, message boundaries meaning nothing. To other nodes the API
//! server does the unwrapping and sends a plain upgrade (`Upgrade: SPDY/3.1`,
//! `X-Stream-Protocol-Version: portforward.k8s.io`). Both end in the same [`session`].
//!
//! ```text
//!  client                                   node
//!  SYN_STREAM {streamtype: error, port, requestid: N} ──►  SYN_REPLY
//!  SYN_STREAM {streamtype: data,  port, requestid: N} ──►  SYN_REPLY, connect 127.0.0.1:port
//!  DATA ◄──────────────────────────────────────────────►  DATA      (inside the pod's netns)
//!  DATA FIN (client's end) ──► shutdown(write) to the pod
//!                         ◄── DATA FIN on data and error once the pod closed its end
//!  a failed connect:      ◄── the error text on the error stream, RST_STREAM on both
//! ```
//!
//! Streams come in pairs per request (cri-streaming `portforward/httpstream.go`); a pair
//! incomplete after [`STREAM_CREATION_TIMEOUT`] gets "timed out waiting for streams" on its
//! error stream. Many pairs share one session. The pod side is reached from inside the
//! sandbox's network namespace (a short-lived thread enters it to create the socket, as
//! probes do), or on the host for a host-network pod. The session ends when the client goes
//! away, or after `--streaming-connection-idle-timeout` without a frame (GOAWAY).
//!
//! Unlike containerd, which closes both directions when either ends, a client's end of data
//! half-closes the pod connection: the pod's answer still reaches the client.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::super::http::{Request, Response};
use super::spdy::{self, Frame, FrameReader, FrameWriter, Headers};
use crate::probes::net::{self as pnet, NetError, Route};

/// The SPDY subprotocol (`portforward.ProtocolV1Name`).
pub const PROTOCOL: &str = "portforward.k8s.io";
/// The WebSocket subprotocol prefix for SPDY tunnelled in WebSocket messages.
pub const TUNNELING_PREFIX: &str = "SPDY/3.1+";
/// kubelet's `--streaming-connection-idle-timeout` default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// cri-streaming's `DefaultConfig.StreamCreationTimeout`.
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

const HEADER_PORT: &str = "port";
const HEADER_REQUEST_ID: &str = "requestid";
const HEADER_STREAM_TYPE: &str = "streamtype";
const TYPE_ERROR: &str = "error";
const TYPE_DATA: &str = "data";

/// Frames queued towards the client; forwarders wait beyond it.
const OUTBOUND_QUEUE: usize = 64;
/// Chunks of client data queued towards one pod connection.
const INBOUND_QUEUE: usize = 16;
const READ_CHUNK: usize = 64 * 1024;
/// Frames written together (one WebSocket message, one TLS write) up to this size.
const WRITE_BATCH: usize = 256 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_secs(1);

/// How the client asked for the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrade {
    /// `Upgrade: SPDY/3.1`.
    Spdy,
    /// A WebSocket carrying `SPDY/3.1+portforward.k8s.io`.
    WebSocketTunnel,
}

/// Where the forwarded connections go: the pod sandbox and its network namespace (`None`:
/// the host's, for a host-network pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub sandbox_id: String,
    pub netns: Option<PathBuf>,
}

pub(super) fn is_upgrade(request: &Request) -> bool {
    request.header("connection").is_some_and(|c| {
        c.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
    })
}

/// Every value of a (possibly repeated) comma-separated header.
fn header_values<'a>(request: &'a Request, name: &str) -> Vec<&'a str> {
    request
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect()
}

/// The `101 Switching Protocols` answer and the kind of session; else the error response
/// kubelet sends (its messages: `httpstream.Handshake`, `spdy.UpgradeResponse`, the
/// tunneling handler).
pub fn upgrade_response(request: &Request) -> Result<(Vec<u8>, Upgrade), Response> {
    if request.method != "GET" && request.method != "POST" {
        return Err(Response::text(405, "method not allowed\n"));
    }
    let upgrade = request.header("upgrade").unwrap_or("");
    if upgrade.eq_ignore_ascii_case("websocket") && is_upgrade(request) {
        let offered = header_values(request, "sec-websocket-protocol");
        let spdy: Vec<&str> = offered
            .iter()
            .filter_map(|p| p.strip_prefix(TUNNELING_PREFIX))
            .filter(|p| p.ends_with(".k8s.io"))
            .collect();
        if spdy.is_empty() {
            return Err(Response::text(
                400,
                format!(
                    "unable to upgrade: this node serves port forwarding over SPDY tunnelled in \
                     WebSocket ({TUNNELING_PREFIX}{PROTOCOL}), not {offered:?}\n"
                ),
            ));
        }
        if !spdy.contains(&PROTOCOL) {
            return Err(negotiation_failed(&spdy));
        }
        let key = request
            .header("sec-websocket-key")
            .ok_or_else(|| Response::text(400, "missing Sec-WebSocket-Key\n"))?;
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let head = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: {TUNNELING_PREFIX}{PROTOCOL}\r\n\r\n"
        );
        return Ok((head.into_bytes(), Upgrade::WebSocketTunnel));
    }
    let offered = offered_stream_protocols(request)?;
    if !offered.contains(&PROTOCOL) {
        return Err(negotiation_failed(&offered));
    }
    if !is_upgrade(request) || !upgrade.to_ascii_lowercase().contains("spdy/3.1") {
        return Err(Response::text(
            400,
            "unable to upgrade: missing upgrade headers in request\n",
        ));
    }
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: {PROTOCOL}\r\n\r\n"
    );
    Ok((head.into_bytes(), Upgrade::Spdy))
}

/// The client's `X-Stream-Protocol-Version`s; none is `httpstream.Handshake`'s 400.
pub(super) fn offered_stream_protocols(request: &Request) -> Result<Vec<&str>, Response> {
    let offered = header_values(request, "x-stream-protocol-version");
    if offered.is_empty() {
        return Err(Response::text(
            400,
            format!(
                "unable to upgrade: header X-Stream-Protocol-Version does not exist in request \
                 with {} headers\n",
                request.headers.len()
            ),
        ));
    }
    Ok(offered)
}

fn negotiation_failed(offered: &[&str]) -> Response {
    Response::text(
        403,
        format!(
            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, \
             server accepts [\"{PROTOCOL}\"]\n"
        ),
    )
}

/// Serves one upgraded connection until the client leaves or it idles out.
pub async fn serve<S>(stream: S, upgrade: Upgrade, target: Target, idle_timeout: Duration)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    match upgrade {
        Upgrade::Spdy => {
            let (reader, writer) = tokio::io::split(stream);
            let reader = BufReader::with_capacity(READ_CHUNK, reader);
            session(reader, Box::new(RawOutput(writer)), target, idle_timeout).await;
        }
        Upgrade::WebSocketTunnel => {
            let ws = WebSocketStream::from_raw_socket(stream, Role::Server, None).await;
            let (sink, source) = ws.split();
            // The SPDY byte stream is the concatenation of the binary messages; a Close (or
            // the end) is its end.
            let bytes = source
                .take_while(|m| std::future::ready(!matches!(m, Ok(Message::Close(_)))))
                .filter_map(|m| {
                    std::future::ready(match m {
                        Ok(Message::Binary(data)) => Some(Ok(data)),
                        Ok(_) => None,
                        Err(err) => Some(Err(std::io::Error::other(err))),
                    })
                });
            let reader = tokio_util::io::StreamReader::new(Box::pin(bytes));
            session(reader, Box::new(WsOutput(sink)), target, idle_timeout).await;
        }
    }
}

/// Where encoded frames go.
#[async_trait::async_trait]
pub(super) trait Output: Send {
    async fn send(&mut self, bytes: Vec<u8>) -> std::io::Result<()>;
    async fn close(&mut self);
}

pub(super) struct RawOutput<W>(pub(super) W);

#[async_trait::async_trait]
impl<W: AsyncWrite + Send + Unpin> Output for RawOutput<W> {
    async fn send(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        self.0.write_all(&bytes).await?;
        self.0.flush().await
    }

    async fn close(&mut self) {
        let _ = self.0.shutdown().await;
    }
}

struct WsOutput<S>(futures_util::stream::SplitSink<WebSocketStream<S>, Message>);

#[async_trait::async_trait]
impl<S: AsyncRead + AsyncWrite + Send + Unpin> Output for WsOutput<S> {
    async fn send(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        self.0
            .send(Message::binary(bytes))
            .await
            .map_err(std::io::Error::other)
    }

    async fn close(&mut self) {
        // 1000: the client's tunnelling connection reads it as the end of the stream.
        let normal = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        let _ = self.0.send(Message::Close(Some(normal))).await;
        let _ = self.0.close().await;
    }
}

/// Encodes frames in order (one header compression context) and writes them in batches.
pub(super) async fn write_frames(mut frames: mpsc::Receiver<Frame>, mut output: Box<dyn Output>) {
    let mut writer = FrameWriter::new();
    while let Some(first) = frames.recv().await {
        let mut batch = Vec::with_capacity(READ_CHUNK + 64);
        let mut next = Some(first);
        while let Some(frame) = next.take() {
            if let Err(err) = writer.encode(&frame, &mut batch) {
                tracing::warn!(%err, "encoding a SPDY frame");
            }
            if batch.len() < WRITE_BATCH {
                next = frames.try_recv().ok();
            }
        }
        if output.send(batch).await.is_err() {
            return;
        }
    }
    output.close().await;
}

/// The client's data towards one pod connection, and how its end is told.
struct DataStream {
    /// Dropped on the client's FIN.
    inbound: Option<mpsc::Sender<Bytes>>,
    /// Dropped (with the whole entry) on RST_STREAM: the forwarder stops.
    _reset: oneshot::Sender<()>,
    forwarding: bool,
}

/// A request's streams as they arrive.
struct PendingPair {
    created: Instant,
    error: Option<u32>,
    data: Option<(u32, u16, mpsc::Receiver<Bytes>, oneshot::Receiver<()>)>,
}

/// Milliseconds since the session started at the last frame either way.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// A valid SYN_STREAM's port-forward headers.
#[derive(Debug, PartialEq, Eq)]
struct StreamHeaders {
    port: u16,
    is_data: bool,
    request_id: String,
}

/// `httpStreamReceived`'s checks, then the request id (older clients send none: kubelet
/// derives one from the stream id).
fn stream_headers(stream_id: u32, headers: &Headers) -> Result<StreamHeaders, String> {
    let port = spdy::header(headers, HEADER_PORT)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| format!("{:?} header is required", "port"))?;
    let port: u16 = port
        .parse()
        .map_err(|e| format!("unable to parse {port:?} as a port: {e}"))?;
    if port < 1 {
        return Err(format!("port \"{port}\" must be > 0"));
    }
    let is_data = match spdy::header(headers, HEADER_STREAM_TYPE) {
        None | Some("") => return Err(format!("{:?} header is required", "streamType")),
        Some(TYPE_DATA) => true,
        Some(TYPE_ERROR) => false,
        Some(other) => return Err(format!("invalid stream type {other:?}")),
    };
    let request_id = match spdy::header(headers, HEADER_REQUEST_ID).filter(|r| !r.is_empty()) {
        Some(id) => id.to_owned(),
        None if is_data => (i64::from(stream_id) - 2).to_string(),
        None => stream_id.to_string(),
    };
    Ok(StreamHeaders {
        port,
        is_data,
        request_id,
    })
}

/// One SPDY session: reads frames, pairs streams, runs a forwarder per complete pair.
async fn session<R>(reader: R, output: Box<dyn Output>, target: Target, idle_timeout: Duration)
where
    R: AsyncRead + Send + Unpin + 'static,
{
    let (out, out_rx) = mpsc::channel::<Frame>(OUTBOUND_QUEUE);
    let writer = tokio::spawn(write_frames(out_rx, output));
    let (in_tx, mut inbound) = mpsc::channel(INBOUND_QUEUE);
    let reader = tokio::spawn(async move {
        let mut frames = FrameReader::new(reader);
        loop {
            let next = frames.read_frame().await;
            let last = !matches!(next, Ok(Some(_)));
            if in_tx.send(next).await.is_err() || last {
                return;
            }
        }
    });
    let activity = Arc::new(Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    });
    let target = Arc::new(target);
    let mut streams: HashMap<u32, DataStream> = HashMap::new();
    let mut pairs: HashMap<String, PendingPair> = HashMap::new();
    let mut forwarders = JoinSet::new();
    let mut last_stream_id = 0u32;
    let mut tick = tokio::time::interval(TICK);
    loop {
        let frame = tokio::select! {
            next = inbound.recv() => match next {
                Some(Ok(Some(frame))) => frame,
                Some(Ok(None)) | None => break,
                Some(Err(err)) => {
                    tracing::debug!(%err, "port-forward session ended");
                    break;
                }
            },
            Some(done) = forwarders.join_next(), if !forwarders.is_empty() => {
                if let Ok(data_id) = done {
                    streams.remove(&data_id);
                }
                continue;
            }
            _ = tick.tick() => {
                for (request_id, pair) in expired(&mut pairs) {
                    tracing::warn!(request = %request_id, "timed out waiting for streams");
                    if let Some(error_id) = pair.error {
                        let text = format!("(request={request_id}) timed out waiting for streams");
                        send_error(&out, error_id, pair.data.as_ref().map(|d| d.0), text).await;
                    }
                    if let Some((data_id, ..)) = pair.data {
                        streams.remove(&data_id);
                    }
                }
                if activity.idle() >= idle_timeout {
                    tracing::debug!(?idle_timeout, "port-forward session idle; closing");
                    let _ = out.send(Frame::GoAway { last_good_stream_id: last_stream_id, status: spdy::GOAWAY_OK }).await;
                    break;
                }
                continue;
            }
        };
        activity.touch();
        match frame {
            Frame::SynStream {
                stream_id, headers, ..
            } => {
                if stream_id % 2 == 0 || stream_id <= last_stream_id {
                    reset(&out, stream_id, spdy::PROTOCOL_ERROR).await;
                    continue;
                }
                last_stream_id = stream_id;
                let parsed = match stream_headers(stream_id, &headers) {
                    Ok(parsed) => parsed,
                    Err(reason) => {
                        tracing::warn!(%reason, "Stream rejected");
                        reset(&out, stream_id, spdy::CANCEL).await;
                        continue;
                    }
                };
                let _ = out
                    .send(Frame::SynReply {
                        stream_id,
                        flags: 0,
                        headers: Headers::new(),
                    })
                    .await;
                let pair = pairs
                    .entry(parsed.request_id.clone())
                    .or_insert_with(|| PendingPair {
                        created: Instant::now(),
                        error: None,
                        data: None,
                    });
                let duplicate = if parsed.is_data {
                    if pair.data.is_some() {
                        Some("data stream already assigned")
                    } else {
                        let (tx, rx) = mpsc::channel(INBOUND_QUEUE);
                        let (reset_tx, reset_rx) = oneshot::channel();
                        streams.insert(
                            stream_id,
                            DataStream {
                                inbound: Some(tx),
                                _reset: reset_tx,
                                forwarding: false,
                            },
                        );
                        pair.data = Some((stream_id, parsed.port, rx, reset_rx));
                        None
                    }
                } else if pair.error.is_some() {
                    Some("error stream already assigned")
                } else {
                    pair.error = Some(stream_id);
                    None
                };
                if let Some(reason) = duplicate {
                    let text = format!(
                        "error processing stream for request {}: {reason}",
                        parsed.request_id
                    );
                    tracing::warn!("{text}");
                    if let Some(error_id) = pair.error {
                        send_data(&out, error_id, 0, text.into_bytes()).await;
                    }
                    continue;
                }
                if pair.error.is_some() && pair.data.is_some() {
                    let Some(PendingPair {
                        error: Some(error_id),
                        data: Some((data_id, port, rx, reset)),
                        ..
                    }) = pairs.remove(&parsed.request_id)
                    else {
                        continue;
                    };
                    if let Some(entry) = streams.get_mut(&data_id) {
                        entry.forwarding = true;
                    }
                    let forward = Forward {
                        data_id,
                        error_id,
                        port,
                        from_client: rx,
                        reset,
                        out: out.clone(),
                        activity: activity.clone(),
                    };
                    forwarders.spawn(forward.run(target.clone()));
                }
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                let Some(entry) = streams.get_mut(&stream_id) else {
                    continue;
                };
                if let (false, Some(tx)) = (data.is_empty(), entry.inbound.as_ref()) {
                    let delivered = if entry.forwarding {
                        // Back-pressure: the session waits for this pod connection.
                        tx.send(data).await.is_ok()
                    } else {
                        // Not forwarding yet (its error stream is still to come): what does
                        // not fit is a protocol error rather than a stalled session.
                        tx.try_send(data).is_ok()
                    };
                    if !delivered && !entry.forwarding {
                        streams.remove(&stream_id);
                        reset(&out, stream_id, spdy::PROTOCOL_ERROR).await;
                        continue;
                    }
                }
                if flags & spdy::FLAG_FIN != 0 {
                    entry.inbound = None;
                }
            }
            Frame::RstStream { stream_id, .. } => {
                streams.remove(&stream_id);
            }
            Frame::Ping { id } => {
                // Answer the client's pings (odd ids); the server sends none.
                if id % 2 == 1 {
                    let _ = out.send(Frame::Ping { id }).await;
                }
            }
            Frame::GoAway { .. } => break,
            Frame::SynReply { .. }
            | Frame::Headers { .. }
            | Frame::Settings { .. }
            | Frame::WindowUpdate { .. }
            | Frame::Unknown { .. } => {}
        }
    }
    reader.abort();
    forwarders.shutdown().await;
    drop(out);
    let _ = writer.await;
}

/// Removes and returns the pairs incomplete for longer than [`STREAM_CREATION_TIMEOUT`].
fn expired(pairs: &mut HashMap<String, PendingPair>) -> Vec<(String, PendingPair)> {
    let old: Vec<String> = pairs
        .iter()
        .filter(|(_, p)| p.created.elapsed() >= STREAM_CREATION_TIMEOUT)
        .map(|(id, _)| id.clone())
        .collect();
    old.into_iter()
        .filter_map(|id| pairs.remove(&id).map(|p| (id, p)))
        .collect()
}

async fn send_data(out: &mpsc::Sender<Frame>, stream_id: u32, flags: u8, data: Vec<u8>) {
    let _ = out
        .send(Frame::Data {
            stream_id,
            flags,
            data: Bytes::from(data),
        })
        .await;
}

/// kubelet's failure: the message on the error stream, then both streams reset.
async fn send_error(out: &mpsc::Sender<Frame>, error_id: u32, data_id: Option<u32>, text: String) {
    send_data(out, error_id, 0, text.into_bytes()).await;
    for stream_id in data_id.into_iter().chain([error_id]) {
        reset(out, stream_id, spdy::CANCEL).await;
    }
}

async fn reset(out: &mpsc::Sender<Frame>, stream_id: u32, status: u32) {
    let _ = out.send(Frame::RstStream { stream_id, status }).await;
}

/// One forwarded connection.
struct Forward {
    data_id: u32,
    error_id: u32,
    port: u16,
    from_client: mpsc::Receiver<Bytes>,
    reset: oneshot::Receiver<()>,
    out: mpsc::Sender<Frame>,
    activity: Arc<Activity>,
}

impl Forward {
    /// Connects and copies until the pod's side ends or the client resets the stream;
    /// returns the data stream's id.
    async fn run(self, target: Arc<Target>) -> u32 {
        let Self {
            data_id,
            error_id,
            port,
            mut from_client,
            mut reset,
            out,
            activity,
        } = self;
        let conn = match connect(&target, port).await {
            Ok(conn) => conn,
            Err(reason) => {
                // cri-streaming's message around the runtime's.
                let text = format!(
                    "error forwarding port {port} to pod {}, uid : {reason}",
                    target.sandbox_id
                );
                tracing::debug!("{text}");
                send_error(&out, error_id, Some(data_id), text).await;
                return data_id;
            }
        };
        let _ = conn.set_nodelay(true);
        let (mut pod_read, mut pod_write) = conn.into_split();
        let to_pod = async {
            while let Some(chunk) = from_client.recv().await {
                if pod_write.write_all(&chunk).await.is_err() {
                    // The pod closed; what follows is dropped.
                    while from_client.recv().await.is_some() {}
                    return;
                }
                activity.touch();
            }
            let _ = pod_write.shutdown().await;
        };
        // The pod's end of data ends the request (kubectl resets the stream then).
        let from_pod = async {
            loop {
                let mut buf = BytesMut::with_capacity(READ_CHUNK);
                let data = match pod_read.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => buf.freeze(),
                };
                activity.touch();
                let frame = Frame::Data {
                    stream_id: data_id,
                    flags: 0,
                    data,
                };
                if out.send(frame).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = from_pod => {}
            _ = &mut reset => {}
            () = async { to_pod.await; std::future::pending::<()>().await } => {}
        }
        // Both streams end (kubelet's deferred Close of each).
        for stream_id in [data_id, error_id] {
            send_data(&out, stream_id, spdy::FLAG_FIN, Vec::new()).await;
        }
        data_id
    }
}

/// A connection to `127.0.0.1:port` (else `[::1]:port`) in the pod's network namespace;
/// the error is containerd's text.
async fn connect(target: &Target, port: u16) -> Result<TcpStream, String> {
    let netns = target.netns.as_ref();
    let route = |host: &str| match netns {
        Some(netns) => Route::PodNamespace {
            netns: netns.clone(),
            host: host.to_owned(),
        },
        None => Route::Host {
            host: host.to_owned(),
        },
    };
    let v4 = match pnet::connect(&route("127.0.0.1"), port, CONNECT_TIMEOUT).await {
        Ok(conn) => return Ok(conn),
        Err(err) => dial_error(&err, "tcp4"),
    };
    let v6 = match pnet::connect(&route("::1"), port, CONNECT_TIMEOUT).await {
        Ok(conn) => return Ok(conn),
        Err(err) => dial_error(&err, "tcp6"),
    };
    let namespace = netns.map_or_else(|| "host".to_owned(), |p| p.display().to_string());
    Err(format!(
        "failed to execute portforward in network namespace {namespace:?}: failed to connect \
         to localhost:{port} inside namespace {:?}, IPv4: {v4} IPv6 {v6} ",
        target.sandbox_id
    ))
}

/// Go's text for a failed dial (`dial tcp4 127.0.0.1:81: connect: connection refused`).
fn dial_error(err: &NetError, network: &str) -> String {
    match err {
        NetError::Connect { addr, source } => {
            let reason = source
                .raw_os_error()
                .map(|n| nix::errno::Errno::from_raw(n).desc().to_ascii_lowercase())
                .unwrap_or_else(|| source.to_string());
            format!("dial {network} {addr}: connect: {reason}")
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
use spdy::headers as h;

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, headers: &[(&str, &str)]) -> Request {
        Request::with_headers(method, "/portForward/default/web", headers)
    }

    /// The 101's head and the session kind of an accepted upgrade.
    fn accepted(method: &str, headers: &[(&str, &str)]) -> (String, Upgrade) {
        let (head, upgrade) = upgrade_response(&request(method, headers)).expect("an upgrade");
        let head = String::from_utf8(head).expect("ascii");
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        (head, upgrade)
    }

    fn text(response: Response) -> (u16, String) {
        let bytes = response.to_bytes(false);
        let all = String::from_utf8_lossy(&bytes).into_owned();
        let status = all[9..12].parse().expect("status");
        (status, all)
    }

    /// A plain SPDY upgrade offering `protocol`, as the API server sends it.
    fn spdy_upgrade(protocol: &str) -> [(&str, &str); 3] {
        [
            ("Connection", "Upgrade"),
            ("Upgrade", "SPDY/3.1"),
            ("X-Stream-Protocol-Version", protocol),
        ]
    }

    /// A WebSocket upgrade offering `protocol` (RFC 6455's example key).
    fn websocket_upgrade(protocol: &str) -> [(&str, &str); 4] {
        [
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Protocol", protocol),
        ]
    }

    fn refused(method: &str, headers: &[(&str, &str)]) -> (u16, String) {
        text(upgrade_response(&request(method, headers)).expect_err("refused"))
    }

    #[test]
    fn the_api_servers_spdy_upgrade_is_accepted() {
        let (head, upgrade) = accepted("POST", &spdy_upgrade(PROTOCOL));
        assert_eq!(upgrade, Upgrade::Spdy);
        assert!(head.contains("Upgrade: SPDY/3.1\r\n"));
        assert!(head.contains("X-Stream-Protocol-Version: portforward.k8s.io\r\n"));
    }

    #[test]
    fn kubectls_tunnelling_websocket_is_accepted() {
        let (head, upgrade) = accepted("GET", &websocket_upgrade("SPDY/3.1+portforward.k8s.io"));
        assert_eq!(upgrade, Upgrade::WebSocketTunnel);
        assert!(head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(head.contains("Sec-WebSocket-Protocol: SPDY/3.1+portforward.k8s.io\r\n"));
    }

    #[test]
    fn refusals_carry_kubelets_status_and_message() {
        let (status, body) = refused("POST", &[("Upgrade", "SPDY/3.1")]);
        assert_eq!(status, 400);
        assert!(body.contains("X-Stream-Protocol-Version does not exist"));
        let (status, body) = refused("POST", &spdy_upgrade("v4.channel.k8s.io"));
        assert_eq!(status, 403);
        assert!(body.contains("unable to negotiate protocol"));
        let (status, body) = refused("GET", &websocket_upgrade("SPDY/3.1+v4.channel.k8s.io"));
        assert_eq!(status, 403);
        assert!(body.contains("unable to negotiate protocol"));
        // kubelet's own WebSocket port-forward protocol is not served.
        let (status, _) = refused("GET", &websocket_upgrade("v4.channel.k8s.io"));
        assert_eq!(status, 400);
        let (status, _) = refused("DELETE", &spdy_upgrade(PROTOCOL));
        assert_eq!(status, 405);
    }

    #[test]
    fn stream_headers_are_checked_as_kubelet_does() {
        assert_eq!(
            stream_headers(
                3,
                &h(&[("streamtype", "data"), ("port", "80"), ("requestid", "7")])
            ),
            Ok(StreamHeaders {
                port: 80,
                is_data: true,
                request_id: "7".into()
            })
        );
        // Older clients: the request id comes from the stream ids (error n, data n+2).
        assert_eq!(
            stream_headers(5, &h(&[("streamtype", "error"), ("port", "80")])).map(|s| s.request_id),
            Ok("5".into())
        );
        assert_eq!(
            stream_headers(7, &h(&[("streamtype", "data"), ("port", "80")])).map(|s| s.request_id),
            Ok("5".into())
        );
        assert_eq!(
            stream_headers(1, &h(&[("streamtype", "data")])),
            Err("\"port\" header is required".into())
        );
        assert!(stream_headers(1, &h(&[("streamtype", "data"), ("port", "0")])).is_err());
        assert!(stream_headers(1, &h(&[("streamtype", "data"), ("port", "70000")])).is_err());
        assert_eq!(
            stream_headers(1, &h(&[("streamtype", "video"), ("port", "80")])),
            Err("invalid stream type \"video\"".into())
        );
    }
}

#[cfg(test)]
mod session_tests {
    //! A session over an in-memory socket against a client built from this module's codec,
    //! forwarding to a listener on the host (a host-network target).

    use tokio::io::duplex;
    use tokio::net::TcpListener;

    use super::*;

    struct Client {
        reader: FrameReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
        writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
        frames: FrameWriter,
    }

    impl Client {
        async fn send(&mut self, frame: Frame) {
            let mut bytes = Vec::new();
            self.frames.encode(&frame, &mut bytes).expect("encode");
            self.writer.write_all(&bytes).await.expect("write");
        }

        async fn next(&mut self) -> Frame {
            tokio::time::timeout(Duration::from_secs(10), self.reader.read_frame())
                .await
                .expect("a frame in time")
                .expect("a valid frame")
                .expect("not the end")
        }

        async fn open(&mut self, id: u32, stream_type: &str, port: u16, request: u32) {
            let headers = h(&[
                ("streamType", stream_type),
                ("port", &port.to_string()),
                ("requestID", &request.to_string()),
            ]);
            self.send(Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers,
            })
            .await;
        }
    }

    fn start() -> (Client, tokio::task::JoinHandle<()>) {
        start_idle(DEFAULT_IDLE_TIMEOUT)
    }

    fn start_idle(idle: Duration) -> (Client, tokio::task::JoinHandle<()>) {
        let (server, client) = duplex(1 << 20);
        let target = Target {
            sandbox_id: "sandbox".into(),
            netns: None,
        };
        let served = tokio::spawn(serve(server, Upgrade::Spdy, target, idle));
        let (reader, writer) = tokio::io::split(client);
        let client = Client {
            reader: FrameReader::new(reader),
            writer,
            frames: FrameWriter::new(),
        };
        (client, served)
    }

    #[tokio::test]
    async fn a_pair_is_forwarded_both_ways_with_half_close() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // Echo in upper case until the client's end, then say bye and close.
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut all = Vec::new();
            conn.read_to_end(&mut all).await.expect("read");
            all.make_ascii_uppercase();
            all.extend_from_slice(b" bye");
            conn.write_all(&all).await.expect("write");
        });
        let (mut client, served) = start();
        client.open(1, "error", port, 0).await;
        assert!(matches!(
            client.next().await,
            Frame::SynReply { stream_id: 1, .. }
        ));
        client.open(3, "data", port, 0).await;
        assert!(matches!(
            client.next().await,
            Frame::SynReply { stream_id: 3, .. }
        ));
        client
            .send(Frame::Data {
                stream_id: 3,
                flags: 0,
                data: Bytes::from_static(b"hello"),
            })
            .await;
        client
            .send(Frame::Data {
                stream_id: 3,
                flags: spdy::FLAG_FIN,
                data: Bytes::new(),
            })
            .await;
        let (mut received, mut fins) = (Vec::new(), Vec::new());
        while fins.len() < 2 {
            match client.next().await {
                Frame::Data {
                    stream_id: 3,
                    flags,
                    data,
                } => {
                    received.extend_from_slice(&data);
                    if flags & spdy::FLAG_FIN != 0 {
                        fins.push(3);
                    }
                }
                Frame::Data {
                    stream_id: 1,
                    flags,
                    data,
                } => {
                    assert!(data.is_empty(), "no error: {data:?}");
                    assert_eq!(flags, spdy::FLAG_FIN);
                    fins.push(1);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(received, b"HELLO bye");
        // The client leaving ends the session.
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("the session ends")
            .expect("session task");
    }

    #[tokio::test]
    async fn a_closed_port_is_reported_on_the_error_stream_and_the_session_goes_on() {
        // A port nothing listens on: bind, note it, close.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let (mut client, _served) = start();
        client.open(1, "error", port, 0).await;
        client.open(3, "data", port, 0).await;
        let mut error = Vec::new();
        let mut resets = Vec::new();
        while resets.len() < 2 {
            match client.next().await {
                Frame::SynReply { .. } => {}
                Frame::Data {
                    stream_id: 1, data, ..
                } => error.extend_from_slice(&data),
                Frame::RstStream { stream_id, status } => {
                    assert_eq!(status, spdy::CANCEL);
                    resets.push(stream_id);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        resets.sort();
        assert_eq!(resets, [1, 3]);
        let error = String::from_utf8(error).expect("text");
        assert!(
            error.starts_with(&format!(
                "error forwarding port {port} to pod sandbox, uid : "
            )),
            "{error}"
        );
        assert!(
            error.contains(&format!(
                "IPv4: dial tcp4 127.0.0.1:{port}: connect: connection refused"
            )),
            "{error}"
        );
        // The session still answers: a ping, and a stream with a bad header is reset alone.
        client.send(Frame::Ping { id: 1 }).await;
        assert_eq!(client.next().await, Frame::Ping { id: 1 });
        client
            .send(Frame::SynStream {
                stream_id: 5,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: h(&[("streamType", "data")]),
            })
            .await;
        assert_eq!(
            client.next().await,
            Frame::RstStream {
                stream_id: 5,
                status: spdy::CANCEL
            }
        );
    }

    #[tokio::test]
    async fn an_idle_session_is_closed_with_goaway_and_traffic_keeps_it_open() {
        let (mut client, served) = start_idle(Duration::from_secs(2));
        // Pings every half second keep it alive past the timeout.
        for _ in 0..6 {
            client.send(Frame::Ping { id: 1 }).await;
            assert_eq!(client.next().await, Frame::Ping { id: 1 });
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(!served.is_finished(), "closed while in use");
        // Then silence: GOAWAY and the end of the stream.
        assert_eq!(
            client.next().await,
            Frame::GoAway {
                last_good_stream_id: 0,
                status: spdy::GOAWAY_OK
            }
        );
        let end = client.reader.read_frame().await.expect("a clean end");
        assert_eq!(end, None);
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("the session ends")
            .expect("session task");
    }
}

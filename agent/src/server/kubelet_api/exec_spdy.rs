//! `/exec/…` and `/attach/…` over SPDY/3.1: kubelet's remote command protocol for clients
//! that do not bring a WebSocket to the node. API servers before 1.36 (and a v1.37 one when
//! the node does not declare `ExtendWebSocketsToKubelet`) translate kubectl's WebSocket into
//! it; kubectl with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false` (or older than 1.31) speaks it
//! itself, through the API server's proxy (`k8s.io/kubelet/pkg/cri/streaming/remotecommand/
//! httpstream.go`).
//!
//! ```text
//!  GET|POST /exec/ns/pod/c?command=…&stdin=1&stdout=1&tty=1
//!    Connection: Upgrade, Upgrade: SPDY/3.1,
//!    X-Stream-Protocol-Version: v5.channel.k8s.io, v4.channel.k8s.io, …
//!  ◄── 101, X-Stream-Protocol-Version: the client's first one served
//!  ──► SYN_STREAM {streamtype: error | stdin | stdout | stderr | resize}   ◄── SYN_REPLY each
//!      (the process starts once every stream the options call for is there, at most 30 s:
//!       error always, stderr without tty, resize with tty from v3 on)
//!  ──► DATA stdin …, FIN: the process's stdin is closed
//!  ──► DATA resize: {"Width":…,"Height":…} JSON objects one after the other
//!  ◄── DATA stdout / stderr …, FIN once the output ended
//!  ◄── DATA error: the metav1.Status (v4, v5; v1–v3: a failure's message as text), FIN
//!  ◄── GOAWAY, and the connection closes
//! ```
//!
//! Frames are [`super::spdy`]'s and written by the port-forward writer. A client that goes
//! away (end of stream, GOAWAY, a broken frame) ends the session, which kills the process,
//! as over WebSocket. v5 over SPDY is v4 (the stdin close signal is the stream's FIN).

use std::time::Duration;

use bytes::Bytes;
use ironlet_runtime::types::{ExecSession, ExecWriter, Resize};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::exec::{self, ExecOptions};
use super::portforward::{self, RawOutput};
use super::spdy::{self, Frame, FrameReader, Headers};
use crate::server::http::{Request, Response};

/// cri-streaming's `DefaultConfig.StreamCreationTimeout`.
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
const OUTBOUND_QUEUE: usize = 16;
const INBOUND_QUEUE: usize = 16;
/// Client stdin held while the other streams are still to come.
const EARLY_STDIN_LIMIT: usize = 1 << 20;

/// The remote command versions served over SPDY, preferred first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V5,
    V4,
    V3,
    V2,
    V1,
}

impl Version {
    const SERVED: [Self; 5] = [Self::V5, Self::V4, Self::V3, Self::V2, Self::V1];

    pub fn name(self) -> &'static str {
        match self {
            Self::V5 => "v5.channel.k8s.io",
            Self::V4 => "v4.channel.k8s.io",
            Self::V3 => "v3.channel.k8s.io",
            Self::V2 => "v2.channel.k8s.io",
            Self::V1 => "channel.k8s.io",
        }
    }

    /// v4 and later: the error stream carries a `metav1.Status`.
    fn status_json(self) -> bool {
        matches!(self, Self::V5 | Self::V4)
    }

    /// v3 and later: a terminal's size comes on a resize stream.
    fn resizes(self) -> bool {
        matches!(self, Self::V5 | Self::V4 | Self::V3)
    }
}

/// Whether the request asks for SPDY (`Upgrade: SPDY/3.1`) rather than a WebSocket.
pub fn is_spdy(request: &Request) -> bool {
    request
        .header("upgrade")
        .is_some_and(|u| u.to_ascii_lowercase().contains("spdy/3.1"))
}

/// kubelet's `httpstream.Handshake` and SPDY upgrade: the `101` and the version (the
/// client's first one served), else the refusal.
pub fn upgrade_response(request: &Request) -> Result<(Vec<u8>, Version), Response> {
    let offered = portforward::offered_stream_protocols(request)?;
    let Some(version) = offered
        .iter()
        .find_map(|o| Version::SERVED.into_iter().find(|v| v.name() == *o))
    else {
        let served: Vec<&str> = Version::SERVED.map(Version::name).to_vec();
        return Err(Response::text(
            403,
            format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, \
                 server accepts {served:?}\n"
            ),
        ));
    };
    if !portforward::is_upgrade(request) || !is_spdy(request) {
        return Err(Response::text(
            400,
            "unable to upgrade: missing upgrade headers in request\n",
        ));
    }
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: {}\r\n\r\n",
        version.name()
    );
    Ok((head.into_bytes(), version))
}

/// The streams the client made, by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Streams {
    error: Option<u32>,
    stdin: Option<u32>,
    stdout: Option<u32>,
    stderr: Option<u32>,
    resize: Option<u32>,
}

impl Streams {
    /// Every stream the options call for is there (kubelet's `waitForStreams`).
    fn complete(&self, version: Version, opts: &ExecOptions) -> bool {
        self.error.is_some()
            && (!opts.stdin || self.stdin.is_some())
            && (!opts.stdout || self.stdout.is_some())
            && (!opts.stderr || self.stderr.is_some())
            && (!(opts.tty && version.resizes()) || self.resize.is_some())
    }

    fn slot(&mut self, kind: &str) -> Option<&mut Option<u32>> {
        match kind {
            "error" => Some(&mut self.error),
            "stdin" => Some(&mut self.stdin),
            "stdout" => Some(&mut self.stdout),
            "stderr" => Some(&mut self.stderr),
            "resize" => Some(&mut self.resize),
            _ => None,
        }
    }
}

/// The client's side of the session: its frames as they arrive, what they set up.
struct Client {
    inbound: mpsc::Receiver<Result<Option<Frame>, spdy::SpdyError>>,
    out: mpsc::Sender<Frame>,
    streams: Streams,
    last_stream_id: u32,
    /// Stdin that came before the process was there.
    early_stdin: Vec<Bytes>,
    stdin_closed: bool,
    /// Resize bytes not yet a whole JSON object.
    resize_buffer: Vec<u8>,
    /// The latest size asked for before the process was there.
    early_size: Option<(u16, u16)>,
    /// A stdin close that came with data, told after it.
    close_pending: bool,
}

/// What one client frame meant.
enum Event {
    Stdin(Bytes),
    StdinClosed,
    Resize(Vec<(u16, u16)>),
    None,
    Gone,
}

impl Client {
    async fn next(&mut self) -> Event {
        if std::mem::take(&mut self.close_pending) {
            return Event::StdinClosed;
        }
        let frame = match self.inbound.recv().await {
            Some(Ok(Some(frame))) => frame,
            Some(Err(err)) => {
                tracing::debug!(%err, "exec over SPDY: the client's stream broke");
                return Event::Gone;
            }
            Some(Ok(None)) | None => return Event::Gone,
        };
        match frame {
            Frame::SynStream {
                stream_id, headers, ..
            } => self.stream_created(stream_id, &headers).await,
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                if Some(stream_id) == self.streams.stdin && !self.stdin_closed {
                    if flags & spdy::FLAG_FIN != 0 {
                        self.stdin_closed = true;
                        if data.is_empty() {
                            return Event::StdinClosed;
                        }
                        // The data first; the close follows on the next call.
                        self.close_pending = true;
                    }
                    return Event::Stdin(data);
                }
                if Some(stream_id) == self.streams.resize {
                    self.resize_buffer.extend_from_slice(&data);
                    return Event::Resize(take_sizes(&mut self.resize_buffer));
                }
                Event::None
            }
            Frame::RstStream { stream_id, .. } if Some(stream_id) == self.streams.stdin => {
                self.stdin_closed = true;
                Event::StdinClosed
            }
            Frame::Ping { id } => {
                // Answer the client's pings (odd ids); the server sends none.
                if id % 2 == 1 {
                    let _ = self.out.send(Frame::Ping { id }).await;
                }
                Event::None
            }
            Frame::GoAway { .. } => Event::Gone,
            _ => Event::None,
        }
    }

    /// Replies to a new stream and notes its kind; a stream of no known kind, or one
    /// already there, is reset.
    async fn stream_created(&mut self, stream_id: u32, headers: &Headers) -> Event {
        if stream_id.is_multiple_of(2) || stream_id <= self.last_stream_id {
            self.reset(stream_id, spdy::PROTOCOL_ERROR).await;
            return Event::None;
        }
        self.last_stream_id = stream_id;
        let kind = spdy::header(headers, "streamtype").unwrap_or("");
        match self.streams.slot(kind) {
            Some(slot) if slot.is_none() => {
                *slot = Some(stream_id);
                let reply = Frame::SynReply {
                    stream_id,
                    flags: 0,
                    headers: Headers::new(),
                };
                let _ = self.out.send(reply).await;
            }
            _ => {
                tracing::warn!(kind, "exec over SPDY: unexpected stream; resetting it");
                self.reset(stream_id, spdy::CANCEL).await;
            }
        }
        Event::None
    }

    async fn reset(&self, stream_id: u32, status: u32) {
        let _ = self.out.send(Frame::RstStream { stream_id, status }).await;
    }

    /// Waits until the streams the options call for are there (their early stdin and
    /// resizes kept); `false` when the client left or took longer than
    /// [`STREAM_CREATION_TIMEOUT`].
    async fn wait_for_streams(&mut self, version: Version, opts: &ExecOptions) -> bool {
        let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
        while !self.streams.complete(version, opts) {
            let event = match tokio::time::timeout_at(deadline, self.next()).await {
                Ok(event) => event,
                Err(_) => {
                    tracing::warn!(
                        "exec over SPDY: timed out waiting for client to create streams"
                    );
                    return false;
                }
            };
            match event {
                Event::Gone => return false,
                Event::Stdin(data) => {
                    let held: usize = self.early_stdin.iter().map(Bytes::len).sum();
                    if held + data.len() > EARLY_STDIN_LIMIT {
                        return false;
                    }
                    self.early_stdin.push(data);
                }
                Event::StdinClosed => self.early_stdin.push(Bytes::new()),
                Event::Resize(sizes) => self.early_size = sizes.last().copied().or(self.early_size),
                Event::None => {}
            }
        }
        true
    }

    /// Feeds the process from the client until the client goes away.
    async fn feed(&mut self, mut stdin: Option<ExecWriter>, resize: Option<Resize>) {
        let apply = |size: (u16, u16)| {
            if let Some(resize) = &resize {
                if let Err(err) = resize(size.0, size.1) {
                    tracing::debug!(%err, "resizing the terminal failed");
                }
            }
        };
        if let Some(size) = self.early_size.take() {
            apply(size);
        }
        // An empty chunk stands for the close of stdin.
        for data in std::mem::take(&mut self.early_stdin) {
            write_stdin(&mut stdin, (!data.is_empty()).then_some(data)).await;
        }
        loop {
            match self.next().await {
                Event::Gone => return,
                Event::Stdin(data) => write_stdin(&mut stdin, Some(data)).await,
                Event::StdinClosed => write_stdin(&mut stdin, None).await,
                Event::Resize(sizes) => sizes.into_iter().for_each(apply),
                Event::None => {}
            }
        }
    }
}

/// Writes `data` to the process's stdin, or closes it (`None`); a stdin the process closed
/// takes nothing more.
async fn write_stdin(stdin: &mut Option<ExecWriter>, data: Option<Bytes>) {
    let Some(pipe) = stdin.as_mut() else { return };
    match data {
        Some(data) => {
            if pipe.write_all(&data).await.is_err() {
                *stdin = None;
            }
        }
        None => {
            let _ = pipe.shutdown().await;
            *stdin = None;
        }
    }
}

/// The whole JSON objects at the front of `buffer` as sizes (those that are not sizes are
/// skipped, as kubelet logs and skips them); what is left is an object still arriving.
/// Bytes that are not JSON are dropped.
fn take_sizes(buffer: &mut Vec<u8>) -> Vec<(u16, u16)> {
    let mut sizes = Vec::new();
    let mut values = serde_json::Deserializer::from_slice(buffer).into_iter::<Value>();
    let consumed = loop {
        match values.next() {
            Some(Ok(value)) => {
                if let Some(size) = exec::parse_size(value.to_string().as_bytes()) {
                    sizes.push(size);
                }
            }
            Some(Err(err)) if err.is_eof() => break values.byte_offset(),
            Some(Err(_)) => break buffer.len(),
            None => break values.byte_offset(),
        }
    };
    buffer.drain(..consumed);
    sizes
}

fn data(stream_id: u32, flags: u8, bytes: &[u8]) -> Frame {
    Frame::Data {
        stream_id,
        flags,
        data: Bytes::copy_from_slice(bytes),
    }
}

/// Serves one upgraded connection: waits for the client's streams, then `start` runs the
/// process (its error becomes a Failure status); returns the exit code, if the process ran
/// to its end with the client there.
pub async fn serve<S, F>(stream: S, version: Version, opts: &ExecOptions, start: F) -> Option<i32>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: std::future::Future<Output = Result<ExecSession, String>>,
{
    let (reader, writer) = tokio::io::split(stream);
    let (out, out_rx) = mpsc::channel::<Frame>(OUTBOUND_QUEUE);
    let writer = tokio::spawn(portforward::write_frames(
        out_rx,
        Box::new(RawOutput(writer)),
    ));
    let (in_tx, inbound) = mpsc::channel(INBOUND_QUEUE);
    let reader = tokio::spawn(async move {
        let mut frames = FrameReader::new(BufReader::new(reader));
        loop {
            let next = frames.read_frame().await;
            let last = !matches!(next, Ok(Some(_)));
            if in_tx.send(next).await.is_err() || last {
                return;
            }
        }
    });
    let mut client = Client {
        inbound,
        out: out.clone(),
        streams: Streams::default(),
        last_stream_id: 0,
        early_stdin: Vec::new(),
        stdin_closed: false,
        resize_buffer: Vec::new(),
        early_size: None,
        close_pending: false,
    };
    let code = if client.wait_for_streams(version, opts).await {
        match start.await {
            Err(error) => {
                let streams = client.streams;
                end_outputs(&out, &streams).await;
                send_status(&out, version, streams.error, &exec::internal_error(&error)).await;
                None
            }
            Ok(session) => run(session, version, opts, &mut client).await,
        }
    } else {
        None
    };
    let goaway = Frame::GoAway {
        last_good_stream_id: client.last_stream_id,
        status: spdy::GOAWAY_OK,
    };
    let _ = out.send(goaway).await;
    drop(client);
    drop(out);
    let _ = writer.await;
    reader.abort();
    code
}

/// Pumps the session until the process exited (then ends the outputs and sends its status)
/// or the client left (then the session is dropped, which kills the process).
async fn run(
    session: ExecSession,
    version: Version,
    opts: &ExecOptions,
    client: &mut Client,
) -> Option<i32> {
    let ExecSession {
        stdin,
        stdout,
        stderr,
        mut exit,
        resize,
    } = session;
    let out = client.out.clone();
    let streams = client.streams;
    let to = |id: Option<u32>, wanted: bool| {
        let id = id.filter(|_| wanted)?;
        Some((&out, move |bytes: &[u8]| data(id, 0, bytes)))
    };
    let outputs = async {
        tokio::join!(
            exec::pump(stdout, to(streams.stdout, opts.stdout)),
            exec::pump(stderr, to(streams.stderr, opts.stderr)),
        );
    };
    let finished = exec::exit_after_output(&mut exit, outputs);
    tokio::select! {
        code = finished => {
            end_outputs(&out, &streams).await;
            let status = match code {
                Some(code) => exec::exit_status(code),
                None => exec::internal_error("the exit status of the process was lost"),
            };
            send_status(&out, version, streams.error, &status).await;
            code
        }
        () = client.feed(stdin, resize) => {
            tracing::debug!("exec client went away; killing the process");
            None
        }
    }
}

/// FIN on the output streams: the client's copies end.
async fn end_outputs(out: &mpsc::Sender<Frame>, streams: &Streams) {
    for id in [streams.stdout, streams.stderr].into_iter().flatten() {
        let _ = out.send(data(id, spdy::FLAG_FIN, &[])).await;
    }
}

/// The status on the error stream, then its FIN.
async fn send_status(
    out: &mpsc::Sender<Frame>,
    version: Version,
    error_id: Option<u32>,
    status: &Value,
) {
    let Some(id) = error_id else { return };
    if let Some(payload) = exec::status_payload(version.status_json(), status) {
        let _ = out.send(data(id, 0, payload.as_bytes())).await;
    }
    let _ = out.send(data(id, spdy::FLAG_FIN, &[])).await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use ironlet_runtime::types::ExecExit;
    use tokio::io::{duplex, AsyncReadExt, DuplexStream};

    use super::*;
    use crate::server::kubelet_api::spdy::FrameWriter;

    fn request(headers: &[(&str, &str)]) -> Request {
        Request::with_headers("POST", "/exec/ns/p/c", headers)
    }

    #[test]
    fn the_clients_first_served_version_is_chosen() {
        let spdy = |versions: &str| {
            request(&[
                ("Connection", "Upgrade"),
                ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", versions),
            ])
        };
        let (head, version) = upgrade_response(&spdy(
            "v6.channel.k8s.io, v4.channel.k8s.io, v5.channel.k8s.io",
        ))
        .unwrap();
        assert_eq!(version, Version::V4);
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        assert!(head.contains("\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n"));
        assert!(head.contains("\r\nUpgrade: SPDY/3.1\r\n"));
        assert_eq!(
            upgrade_response(&spdy("channel.k8s.io")).unwrap().1,
            Version::V1
        );
        let refused = upgrade_response(&spdy("v9.channel.k8s.io")).unwrap_err();
        assert_eq!(refused.status, 403);
        let none = request(&[("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1")]);
        assert_eq!(upgrade_response(&none).unwrap_err().status, 400);
        assert!(is_spdy(&none));
        assert!(!is_spdy(&request(&[("Upgrade", "websocket")])));
    }

    #[test]
    fn resize_objects_are_taken_whole_across_chunks() {
        let mut buffer = br#"{"Width":80,"Height":24}
{"Width":100,"#
            .to_vec();
        assert_eq!(take_sizes(&mut buffer), [(80, 24)]);
        buffer.extend_from_slice(br#""Height":30}{"x":1}"#);
        assert_eq!(take_sizes(&mut buffer), [(100, 30)]);
        assert!(buffer.is_empty());
        buffer.extend_from_slice(b"not json");
        assert!(take_sizes(&mut buffer).is_empty());
        assert!(buffer.is_empty());
    }

    /// The client's half of a session: its own frame writer and reader.
    struct TestClient {
        writer: FrameWriter,
        io: tokio::io::WriteHalf<DuplexStream>,
        frames: FrameReader<tokio::io::ReadHalf<DuplexStream>>,
    }

    impl TestClient {
        async fn send(&mut self, frame: Frame) {
            let mut bytes = Vec::new();
            self.writer.encode(&frame, &mut bytes).unwrap();
            self.io.write_all(&bytes).await.unwrap();
        }

        async fn create(&mut self, stream_id: u32, kind: &str) {
            let headers = spdy::headers(&[("streamtype", kind)]);
            self.send(Frame::SynStream {
                stream_id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers,
            })
            .await;
        }

        /// Every frame until the server's GOAWAY (which must come).
        async fn until_goaway(&mut self) -> Vec<Frame> {
            let mut seen = Vec::new();
            loop {
                let frame = tokio::time::timeout(Duration::from_secs(5), self.frames.read_frame())
                    .await
                    .expect("a frame in time")
                    .expect("a valid frame")
                    .expect("no end before GOAWAY");
                if matches!(frame, Frame::GoAway { .. }) {
                    return seen;
                }
                seen.push(frame);
            }
        }
    }

    fn client(io: DuplexStream) -> TestClient {
        let (read, write) = tokio::io::split(io);
        TestClient {
            writer: FrameWriter::new(),
            io: write,
            frames: FrameReader::new(read),
        }
    }

    /// The bytes that came on `stream_id` and whether it ended with FIN.
    fn on_stream(frames: &[Frame], id: u32) -> (Vec<u8>, bool) {
        let mut bytes = Vec::new();
        let mut fin = false;
        for frame in frames {
            if let Frame::Data {
                stream_id,
                flags,
                data,
            } = frame
            {
                if *stream_id == id {
                    bytes.extend_from_slice(data);
                    fin |= flags & spdy::FLAG_FIN != 0;
                }
            }
        }
        (bytes, fin)
    }

    /// A process that echoes its stdin to stdout and exits with `code` once stdin closed.
    fn echo_session(code: i32) -> (ExecSession, Arc<AtomicBool>) {
        let (stdin_w, mut stdin_r) = duplex(1024);
        let (mut stdout_w, stdout_r) = duplex(1024);
        let (_stderr_w, stderr_r) = duplex(16);
        let (code_tx, code_rx) = tokio::sync::oneshot::channel();
        let killed = Arc::new(AtomicBool::new(false));
        let flag = killed.clone();
        tokio::spawn(async move {
            let mut all = Vec::new();
            let _ = stdin_r.read_to_end(&mut all).await;
            let _ = stdout_w.write_all(&all).await;
            drop(stdout_w);
            drop(_stderr_w);
            let _ = code_tx.send(code);
        });
        let session = ExecSession {
            stdin: Some(Box::new(stdin_w)),
            stdout: Box::new(stdout_r),
            stderr: Box::new(stderr_r),
            exit: ExecExit::new(code_rx, move || flag.store(true, Ordering::SeqCst)),
            resize: None,
        };
        (session, killed)
    }

    fn options() -> ExecOptions {
        ExecOptions {
            command: vec!["cat".into()],
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        }
    }

    #[tokio::test]
    async fn stdin_comes_back_on_stdout_then_fins_and_the_v4_status() {
        let (server, io) = duplex(64 * 1024);
        let (session, killed) = echo_session(3);
        let served = tokio::spawn(async move {
            serve(server, Version::V4, &options(), async { Ok(session) }).await
        });
        let mut c = client(io);
        c.create(1, "error").await;
        c.create(3, "stdin").await;
        c.create(5, "stdout").await;
        // Stdin before the last stream: held until the process runs.
        c.send(data(3, 0, b"hello ")).await;
        c.create(7, "stderr").await;
        c.send(data(3, spdy::FLAG_FIN, b"spdy")).await;
        let frames = c.until_goaway().await;
        let replies = frames
            .iter()
            .filter(|f| matches!(f, Frame::SynReply { .. }))
            .count();
        assert_eq!(replies, 4);
        assert_eq!(on_stream(&frames, 5), (b"hello spdy".to_vec(), true));
        assert_eq!(on_stream(&frames, 7), (Vec::new(), true));
        let (status, fin) = on_stream(&frames, 1);
        assert!(fin);
        let status: Value = serde_json::from_slice(&status).unwrap();
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "3");
        assert_eq!(served.await.unwrap(), Some(3));
        assert!(!killed.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn v2_sends_nothing_on_success_and_an_unknown_stream_is_reset() {
        let (server, io) = duplex(64 * 1024);
        let (session, _) = echo_session(0);
        let served = tokio::spawn(async move {
            serve(server, Version::V2, &options(), async { Ok(session) }).await
        });
        let mut c = client(io);
        c.create(1, "error").await;
        c.create(3, "bogus").await;
        c.create(5, "stdin").await;
        c.create(7, "stdout").await;
        c.create(9, "stderr").await;
        c.send(data(5, spdy::FLAG_FIN, b"x")).await;
        let frames = c.until_goaway().await;
        assert!(frames
            .iter()
            .any(|f| matches!(f, Frame::RstStream { stream_id: 3, .. })));
        assert_eq!(on_stream(&frames, 7), (b"x".to_vec(), true));
        assert_eq!(on_stream(&frames, 1), (Vec::new(), true));
        assert_eq!(served.await.unwrap(), Some(0));
    }

    #[tokio::test]
    async fn a_client_that_leaves_kills_the_process_and_a_start_error_is_reported() {
        let (server, io) = duplex(64 * 1024);
        let (session, killed) = echo_session(0);
        let served = tokio::spawn(async move {
            serve(server, Version::V4, &options(), async { Ok(session) }).await
        });
        let mut c = client(io);
        for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
            c.create(id, kind).await;
        }
        c.send(data(3, 0, b"partial")).await;
        drop(c);
        assert_eq!(served.await.unwrap(), None);
        assert!(killed.load(Ordering::SeqCst), "the process was not killed");

        let (server, io) = duplex(64 * 1024);
        let served = tokio::spawn(async move {
            serve(server, Version::V4, &options(), async {
                Err("container not running".to_owned())
            })
            .await
        });
        let mut c = client(io);
        for (id, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
            c.create(id, kind).await;
        }
        let frames = c.until_goaway().await;
        let status: Value = serde_json::from_slice(&on_stream(&frames, 1).0).unwrap();
        assert_eq!(status["reason"], "InternalError");
        assert!(status["message"]
            .as_str()
            .is_some_and(|m| m.contains("container not running")));
        assert_eq!(on_stream(&frames, 5), (Vec::new(), true));
        assert_eq!(served.await.unwrap(), None);
    }
}

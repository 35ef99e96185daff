//! `/exec/{namespace}/{pod}/{container}` over WebSocket, kubelet's remote command protocol
//! as the v1.37 API server proxies it to a node that declares `ExtendWebSocketsToKubelet`
//! (`k8s.io/apiserver/pkg/util/proxy/websocket.go`, `k8s.io/streaming/.../wsstream`).
//!
//! ```text
//!  GET|POST /exec/ns/pod/c?command=sh&command=-c&command=…&stdin=1&stdout=1&stderr=1
//!    Upgrade: websocket, Sec-WebSocket-Protocol: v5.channel.k8s.io (or v4.channel.k8s.io)
//!  ◄── 101, then one empty message on stdout (else stderr, else error): "streams ready"
//!  ──► [0 | bytes]  stdin            [255 | 0]  stdin closed (v5 only)
//!      [4 | json]   resize (ignored: no tty)
//!  ◄── [1 | bytes]  stdout           [2 | bytes]  stderr
//!  ◄── [3 | metav1.Status]  once the process exited and its output was sent, then Close
//! ```
//!
//! The status is `{"metadata":{},"status":"Success"}` for exit code 0, else a Failure with
//! reason `NonZeroExitCode` and the code in `details.causes[{reason: ExitCode}]`, from which
//! `kubectl exec` takes its own exit code. A client that goes away (Close frame, error, EOF)
//! ends the session, which kills the process ([`ExecSession`] does on drop).
//!
//! No tty: a request with `tty=1` is refused (400) rather than served without one.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use ironlet_runtime::types::{ExecReader, ExecSession};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::super::http::Request;
use super::logs::percent_decode;

/// Channel numbers (`k8s.io/apimachinery/pkg/util/remotecommand`).
pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
pub const RESIZE: u8 = 4;
/// v5: `[255, channel]` half-closes a channel (the client's stdin).
pub const CLOSE: u8 = 255;

/// How long output may still arrive after the process exited: a background child that
/// inherited the pipes would otherwise hold the session open forever.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// Frames queued towards the client; the pumps wait beyond it (back-pressure).
const OUTBOUND_QUEUE: usize = 16;
const READ_CHUNK: usize = 32 * 1024;

/// The subprotocols served, preferred first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    V5,
    V4,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Self::V5 => "v5.channel.k8s.io",
            Self::V4 => "v4.channel.k8s.io",
        }
    }

    /// The best protocol of a `Sec-WebSocket-Protocol` list, if any is served.
    pub fn negotiate(offered: &str) -> Option<Self> {
        let offered: Vec<&str> = offered.split(',').map(str::trim).collect();
        [Self::V5, Self::V4]
            .into_iter()
            .find(|p| offered.contains(&p.name()))
    }
}

/// kubelet's exec query (`remotecommand.NewOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl ExecOptions {
    /// Parses the query; the error is the 400's message.
    pub fn parse(query: Option<&str>) -> Result<Self, String> {
        let mut out = Self::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value).ok_or_else(|| format!("{key}: bad escape"))?;
            // The API server sends "1"; kubelet treats anything else as false.
            let flag = matches!(value.as_str(), "1" | "true");
            match key {
                "command" => out.command.push(value),
                "input" | "stdin" => out.stdin = flag,
                "output" | "stdout" => out.stdout = flag,
                "error" | "stderr" => out.stderr = flag,
                "tty" => out.tty = flag,
                _ => {}
            }
        }
        if out.command.is_empty() {
            return Err("you must specify a command".into());
        }
        if !(out.stdin || out.stdout || out.stderr) {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        Ok(out)
    }
}

/// The `101 Switching Protocols` answer to a WebSocket upgrade, or why there is none (the
/// 400 to send: not a WebSocket request, no key, or no protocol in common).
pub fn upgrade_response(request: &Request) -> Result<(Vec<u8>, Protocol), String> {
    let is_upgrade = request.header("connection").is_some_and(|c| {
        c.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
    });
    let upgrade = request.header("upgrade").unwrap_or("");
    if !is_upgrade || !upgrade.eq_ignore_ascii_case("websocket") {
        return Err(format!(
            "unable to upgrade: the node serves exec over WebSocket ({}), not {upgrade:?}",
            Protocol::V5.name()
        ));
    }
    let key = request
        .header("sec-websocket-key")
        .ok_or("missing Sec-WebSocket-Key")?;
    let offered = request.header("sec-websocket-protocol").unwrap_or("");
    let protocol = Protocol::negotiate(offered).ok_or_else(|| {
        format!(
            "requested protocol(s) are not supported: {offered:?}; supports [{} {}]",
            Protocol::V5.name(),
            Protocol::V4.name()
        )
    })?;
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: {}\r\n\r\n",
        protocol.name()
    );
    Ok((head.into_bytes(), protocol))
}

/// One message to the client: the channel byte, then the data.
pub fn frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(channel);
    out.extend_from_slice(data);
    out
}

/// What one binary message from the client means.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound<'a> {
    Stdin(&'a [u8]),
    /// v5 `[255, channel]`: the client closed that channel (in practice, stdin).
    Close(u8),
    Resize(&'a [u8]),
    /// Empty, or for a channel the client does not write.
    Ignored,
    /// A close signal without exactly one channel byte (wsstream ends the connection).
    Malformed,
}

pub fn parse_inbound(protocol: Protocol, message: &[u8]) -> Inbound<'_> {
    match message {
        [] => Inbound::Ignored,
        [CLOSE, rest @ ..] if protocol == Protocol::V5 => match rest {
            [channel] => Inbound::Close(*channel),
            _ => Inbound::Malformed,
        },
        [STDIN, data @ ..] => Inbound::Stdin(data),
        [RESIZE, data @ ..] => Inbound::Resize(data),
        _ => Inbound::Ignored,
    }
}

/// The `metav1.Status` sent on the error channel for an exit code (the API server's
/// stream translator and kubelet send the same).
pub fn exit_status(code: i32) -> Value {
    if code == 0 {
        return json!({ "metadata": {}, "status": "Success" });
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: exit status {code}"),
        "reason": "NonZeroExitCode",
        "details": { "causes": [{ "reason": "ExitCode", "message": code.to_string() }] },
    })
}

/// A Failure status for an error that is not the command's (apierrors.NewInternalError).
pub fn internal_error(message: &str) -> Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("Internal error occurred: {message}"),
        "reason": "InternalError",
        "details": { "causes": [{ "message": message }] },
        "code": 500,
    })
}

/// Serves one upgraded connection: `start` runs the process (its error becomes a Failure
/// status); returns the exit code, if the process ran to its end with the client there.
pub async fn serve<S, F>(stream: S, protocol: Protocol, opts: &ExecOptions, start: F) -> Option<i32>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: std::future::Future<Output = Result<ExecSession, String>>,
{
    let ws = WebSocketStream::from_raw_socket(stream, Role::Server, None).await;
    let (mut sink, mut source) = ws.split();
    let (tx, mut rx) = mpsc::channel::<Message>(OUTBOUND_QUEUE);
    // One writer owns the sink; it ends with a Close frame when every sender is gone. The
    // frame carries 1000 (normal closure): gorilla/websocket reports one without a code as
    // 1005, an error, and kubectl fails with "error reading from error stream".
    let writer = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            if sink.send(message).await.is_err() {
                return;
            }
        }
        let normal = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        let _ = sink.send(Message::Close(Some(normal))).await;
        let _ = sink.close().await;
    });
    let ready = if opts.stdout {
        STDOUT
    } else if opts.stderr {
        STDERR
    } else {
        ERROR
    };
    let _ = tx.send(Message::binary(frame(ready, &[]))).await;
    let code = match start.await {
        Err(message) => {
            send_status(&tx, &internal_error(&message)).await;
            None
        }
        Ok(session) => run(session, protocol, opts, &tx, &mut source).await,
    };
    drop(tx);
    let _ = writer.await;
    code
}

async fn send_status(tx: &mpsc::Sender<Message>, status: &Value) {
    let _ = tx
        .send(Message::binary(frame(ERROR, status.to_string().as_bytes())))
        .await;
}

type Source<S> = futures_util::stream::SplitStream<WebSocketStream<S>>;

/// Pumps the session until the process exited (then sends its status) or the client left
/// (then the session is dropped, which kills the process).
async fn run<S>(
    session: ExecSession,
    protocol: Protocol,
    opts: &ExecOptions,
    tx: &mpsc::Sender<Message>,
    source: &mut Source<S>,
) -> Option<i32>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let ExecSession {
        stdin,
        stdout,
        stderr,
        mut exit,
    } = session;
    let client = read_client(source, protocol, stdin);
    let outputs = async {
        tokio::join!(
            pump(stdout, STDOUT, opts.stdout.then_some(tx)),
            pump(stderr, STDERR, opts.stderr.then_some(tx)),
        )
    };
    let finished = async {
        tokio::pin!(outputs);
        let mut drained = false;
        let code = loop {
            tokio::select! {
                _ = &mut outputs, if !drained => drained = true,
                code = exit.wait() => break code,
            }
        };
        if !drained {
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, outputs).await;
        }
        code
    };
    tokio::select! {
        code = finished => {
            match code {
                Some(code) => send_status(tx, &exit_status(code)).await,
                None => send_status(tx, &internal_error("the exit status of the process was lost")).await,
            }
            code
        }
        () = client => {
            tracing::debug!("exec client went away; killing the process");
            None
        }
    }
}

/// Reads the client's messages until it goes away: stdin data into the process, a v5 close
/// of stdin closes the pipe (the process sees end-of-file).
async fn read_client<S>(
    source: &mut Source<S>,
    protocol: Protocol,
    mut stdin: Option<ironlet_runtime::types::ExecWriter>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(message) = source.next().await {
        let data = match message {
            Ok(Message::Binary(data)) => data,
            Ok(Message::Close(_)) | Err(_) => return,
            Ok(_) => continue,
        };
        match parse_inbound(protocol, &data) {
            Inbound::Stdin(bytes) => {
                if let Some(pipe) = stdin.as_mut() {
                    if pipe.write_all(bytes).await.is_err() {
                        // The process closed its stdin; what follows is dropped.
                        stdin = None;
                    }
                }
            }
            Inbound::Close(STDIN) => {
                if let Some(mut pipe) = stdin.take() {
                    let _ = pipe.shutdown().await;
                }
            }
            Inbound::Malformed => return,
            Inbound::Close(_) | Inbound::Resize(_) | Inbound::Ignored => {}
        }
    }
}

/// Copies one output of the process to the client on `channel` (or discards it when the
/// client did not ask for it), until end-of-file or the client is gone.
async fn pump(mut from: ExecReader, channel: u8, to: Option<&mpsc::Sender<Message>>) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(tx) = to {
            if tx
                .send(Message::binary(frame(channel, &buf[..n])))
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_prefers_v5_then_v4_and_refuses_others() {
        assert_eq!(
            Protocol::negotiate("v4.channel.k8s.io, v5.channel.k8s.io"),
            Some(Protocol::V5)
        );
        assert_eq!(
            Protocol::negotiate("v4.channel.k8s.io,channel.k8s.io"),
            Some(Protocol::V4)
        );
        assert_eq!(Protocol::negotiate("base64.channel.k8s.io"), None);
        assert_eq!(Protocol::negotiate(""), None);
    }

    #[test]
    fn the_query_gives_the_command_in_order_and_the_streams() {
        let opts = ExecOptions::parse(Some(
            "command=sh&command=-c&command=echo+out%3B+exit+3&stdin=1&stdout=1&stderr=true&tty=0",
        ))
        .expect("valid query");
        assert_eq!(opts.command, ["sh", "-c", "echo out; exit 3"]);
        assert!(opts.stdin && opts.stdout && opts.stderr && !opts.tty);
        assert!(ExecOptions::parse(Some("stdout=1")).is_err(), "no command");
        assert!(
            ExecOptions::parse(Some("command=true")).is_err(),
            "no stream"
        );
        assert!(ExecOptions::parse(Some("command=%zz&stdout=1")).is_err());
    }

    #[test]
    fn frames_carry_the_channel_byte_first() {
        assert_eq!(frame(STDOUT, b"hi"), b"\x01hi");
        assert_eq!(frame(ERROR, b""), b"\x03");
    }

    #[test]
    fn inbound_messages_split_into_stdin_close_and_resize() {
        assert_eq!(
            parse_inbound(Protocol::V5, b"\x00data"),
            Inbound::Stdin(b"data")
        );
        assert_eq!(
            parse_inbound(Protocol::V5, &[CLOSE, STDIN]),
            Inbound::Close(0)
        );
        assert_eq!(parse_inbound(Protocol::V5, &[CLOSE]), Inbound::Malformed);
        assert_eq!(
            parse_inbound(Protocol::V5, &[CLOSE, 0, 1]),
            Inbound::Malformed
        );
        // v4 has no close signal.
        assert_eq!(
            parse_inbound(Protocol::V4, &[CLOSE, STDIN]),
            Inbound::Ignored
        );
        assert_eq!(
            parse_inbound(Protocol::V5, b"\x04{\"Width\":80}"),
            Inbound::Resize(b"{\"Width\":80}")
        );
        assert_eq!(parse_inbound(Protocol::V5, b""), Inbound::Ignored);
        assert_eq!(parse_inbound(Protocol::V5, b"\x01x"), Inbound::Ignored);
    }

    #[test]
    fn the_status_is_success_or_non_zero_exit_code_with_the_code_as_cause() {
        assert_eq!(
            exit_status(0).to_string(),
            r#"{"metadata":{},"status":"Success"}"#
        );
        let failed = exit_status(3);
        assert_eq!(failed["status"], "Failure");
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(
            failed["details"]["causes"],
            json!([{ "reason": "ExitCode", "message": "3" }])
        );
        let internal = internal_error("container is Exited");
        assert_eq!(internal["reason"], "InternalError");
        assert_eq!(internal["code"], 500);
    }

    fn request(headers: &[(&str, &str)]) -> Request {
        Request::with_headers("GET", "/exec/default/p/c", headers)
    }

    #[test]
    fn the_upgrade_answers_with_the_accept_key_and_the_protocol() {
        let (head, protocol) = upgrade_response(&request(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            // RFC 6455's example key and accept value.
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Protocol", "v5.channel.k8s.io"),
        ]))
        .expect("a valid upgrade");
        let head = String::from_utf8(head).expect("ascii");
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        assert!(head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(head.contains("Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n"));
        assert_eq!(protocol, Protocol::V5);
    }

    #[test]
    fn spdy_and_unknown_protocols_are_refused() {
        let spdy = upgrade_response(&request(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "SPDY/3.1"),
            ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
        ]));
        assert!(spdy.is_err());
        let unknown = upgrade_response(&request(&[
            ("Connection", "keep-alive, Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Protocol", "base64.channel.k8s.io"),
        ]));
        assert!(unknown.is_err());
    }
}

#[cfg(test)]
mod session_tests {
    //! [`serve`] against a WebSocket client over an in-memory socket and a stand-in
    //! process (`cat` that exits 3 at end of input).

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use ironlet_runtime::types::ExecExit;
    use tokio::io::duplex;
    use tokio::sync::oneshot;

    use super::*;

    /// A session whose process copies stdin to stdout and exits 3 at end of input; `killed`
    /// is set if the session is dropped first.
    fn cat_session(killed: Arc<AtomicBool>) -> ExecSession {
        let (stdin_w, mut stdin_r) = duplex(1024);
        let (mut stdout_w, stdout_r) = duplex(1024);
        let (_stderr_w, stderr_r) = duplex(1024);
        let (code_tx, code_rx) = oneshot::channel();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut stdin_r, &mut stdout_w).await;
            drop(stdout_w);
            drop(_stderr_w);
            let _ = code_tx.send(3);
        });
        ExecSession {
            stdin: Some(Box::new(stdin_w)),
            stdout: Box::new(stdout_r),
            stderr: Box::new(stderr_r),
            exit: ExecExit::new(code_rx, move || killed.store(true, Ordering::SeqCst)),
        }
    }

    /// Serves `start` on one end of an in-memory socket; the client end as a WebSocket.
    async fn connect<F>(
        start: F,
    ) -> (
        WebSocketStream<tokio::io::DuplexStream>,
        tokio::task::JoinHandle<Option<i32>>,
    )
    where
        F: std::future::Future<Output = Result<ExecSession, String>> + Send + 'static,
    {
        let (server, client) = duplex(64 * 1024);
        let served = tokio::spawn(async move { serve(server, Protocol::V5, &opts(), start).await });
        let ws = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        (ws, served)
    }

    /// Every binary message until the server's Close, and that Close's frame.
    async fn receive_all(
        ws: &mut WebSocketStream<tokio::io::DuplexStream>,
    ) -> (Vec<Vec<u8>>, Option<CloseFrame>) {
        let mut received = Vec::new();
        while let Some(Ok(message)) = ws.next().await {
            match message {
                Message::Binary(data) => received.push(data.to_vec()),
                Message::Close(frame) => return (received, frame),
                _ => {}
            }
        }
        (received, None)
    }

    fn opts() -> ExecOptions {
        ExecOptions {
            command: vec!["cat".into()],
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        }
    }

    #[tokio::test]
    async fn stdin_reaches_the_process_and_the_exit_status_ends_the_stream() {
        let killed = Arc::new(AtomicBool::new(false));
        let session = cat_session(killed.clone());
        let (mut ws, served) = connect(async { Ok(session) }).await;
        ws.send(Message::binary(frame(STDIN, b"hello")))
            .await
            .expect("send stdin");
        ws.send(Message::binary(vec![CLOSE, STDIN]))
            .await
            .expect("send close");
        let (received, close) = receive_all(&mut ws).await;
        assert_eq!(
            close.map(|f| f.code),
            Some(CloseCode::Normal),
            "kubectl needs 1000"
        );
        assert_eq!(received.first(), Some(&vec![STDOUT]), "ready signal first");
        let stdout: Vec<u8> = received
            .iter()
            .filter(|m| m.first() == Some(&STDOUT))
            .flat_map(|m| m[1..].to_vec())
            .collect();
        assert_eq!(stdout, b"hello");
        let status = received.last().expect("a status");
        assert_eq!(status[0], ERROR);
        let status: Value = serde_json::from_slice(&status[1..]).expect("status json");
        assert_eq!(status, exit_status(3));
        assert_eq!(served.await.expect("serve task"), Some(3));
        assert!(
            !killed.load(Ordering::SeqCst),
            "a finished process is not killed"
        );
    }

    #[tokio::test]
    async fn a_client_that_goes_away_kills_the_process() {
        let killed = Arc::new(AtomicBool::new(false));
        let session = cat_session(killed.clone());
        let (mut ws, served) = connect(async { Ok(session) }).await;
        ws.send(Message::binary(frame(STDIN, b"partial")))
            .await
            .expect("send stdin");
        drop(ws);
        let code = tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("serve ends when the client is gone")
            .expect("serve task");
        assert_eq!(code, None);
        assert!(killed.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_failed_start_is_an_internal_error_status() {
        let (mut ws, served) =
            connect(async { Err::<ExecSession, _>("container is Exited".to_owned()) }).await;
        let (received, _) = receive_all(&mut ws).await;
        let last = received.last().expect("a status");
        assert_eq!(last.first(), Some(&ERROR));
        let status: Value = serde_json::from_slice(&last[1..]).expect("status json");
        assert_eq!(status, internal_error("container is Exited"));
        assert_eq!(served.await.expect("serve task"), None);
    }
}

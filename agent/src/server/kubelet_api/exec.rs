//! `/exec/{namespace}/{pod}/{container}` and `/attach/…` over WebSocket, kubelet's remote command protocol
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
//! The older protocols kubelet still serves (`k8s.io/kubelet/pkg/cri/streaming/remotecommand/
//! websocket.go`): `channel.k8s.io` (v1) frames the same way but has no status JSON: the
//! error channel carries nothing on success, else the failure's message as plain text; the
//! `base64.` variants (`base64.channel.k8s.io`, `v4.base64.channel.k8s.io`) send each
//! message as text, the channel as an ASCII digit then the data in base64, both ways.
//!
//! With `tty=1` the process (or, for `/attach/…`, the container created with `tty`) runs on
//! a terminal: its output is all on stdout, and the client's `[4 | {"Width":…,"Height":…}]`
//! messages set the window size (`TIOCSWINSZ`; the process gets `SIGWINCH`). `/attach/…`
//! takes the same streams without a command: stdin goes to the container's own stdin (or
//! terminal), output is the container's from the moment of attaching; the session ends
//! when the container's output ends, with a Success status (as kubelet's attach), and
//! leaving it leaves the container running.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use ironlet_runtime::types::{ExecExit, ExecReader, ExecSession};
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
    V4Base64,
    V1,
    V1Base64,
}

impl Protocol {
    const SERVED: [Self; 5] = [Self::V5, Self::V4, Self::V4Base64, Self::V1, Self::V1Base64];

    pub fn name(self) -> &'static str {
        match self {
            Self::V5 => "v5.channel.k8s.io",
            Self::V4 => "v4.channel.k8s.io",
            Self::V4Base64 => "v4.base64.channel.k8s.io",
            Self::V1 => "channel.k8s.io",
            Self::V1Base64 => "base64.channel.k8s.io",
        }
    }

    /// The best protocol of a `Sec-WebSocket-Protocol` list, if any is served.
    pub fn negotiate(offered: &str) -> Option<Self> {
        let offered: Vec<&str> = offered.split(',').map(str::trim).collect();
        Self::SERVED
            .into_iter()
            .find(|p| offered.contains(&p.name()))
    }

    /// Text messages with the channel as a digit and base64 data (wsstream's base64 codec).
    pub fn base64(self) -> bool {
        matches!(self, Self::V4Base64 | Self::V1Base64)
    }

    /// v4 and later: the error channel carries a `metav1.Status`; v1 plain text.
    pub fn status_json(self) -> bool {
        matches!(self, Self::V5 | Self::V4 | Self::V4Base64)
    }

    /// The names served, for the refusal's message.
    fn served_names() -> String {
        Self::SERVED.map(Self::name).join(" ")
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
    /// Parses an exec's query; the error is the 400's message.
    pub fn parse(query: Option<&str>) -> Result<Self, String> {
        let out = Self::parse_streams(query)?;
        if out.command.is_empty() {
            return Err("you must specify a command".into());
        }
        Ok(out)
    }

    /// Parses an attach's query: the same streams, no command.
    pub fn parse_attach(query: Option<&str>) -> Result<Self, String> {
        let mut out = Self::parse_streams(query)?;
        out.command.clear();
        Ok(out)
    }

    fn parse_streams(query: Option<&str>) -> Result<Self, String> {
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
        if !(out.stdin || out.stdout || out.stderr) {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        // kubelet (remotecommand.NewOptions): a terminal merges stderr into stdout.
        if out.tty && out.stderr {
            out.stderr = false;
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
            "requested protocol(s) are not supported: {offered:?}; supports [{}]",
            Protocol::served_names()
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

/// One message to the client in `protocol`'s encoding.
pub fn message(protocol: Protocol, channel: u8, data: &[u8]) -> Message {
    if protocol.base64() {
        let digit = char::from(b'0'.wrapping_add(channel));
        Message::text(format!("{digit}{}", BASE64.encode(data)))
    } else {
        Message::binary(frame(channel, data))
    }
}

/// A client's message as channel byte and data (the base64 codec decoded); `None` for one
/// that carries none (ping, pong, frame), `Err` for base64 that does not decode (wsstream
/// ends the connection).
fn inbound_bytes(protocol: Protocol, message: Message) -> Result<Option<Vec<u8>>, ()> {
    let data: Vec<u8> = match message {
        Message::Binary(data) => data.into(),
        Message::Text(text) if protocol.base64() => text.as_bytes().to_vec(),
        _ => return Ok(None),
    };
    if !protocol.base64() {
        return Ok(Some(data));
    }
    let Some((&digit, encoded)) = data.split_first() else {
        return Ok(None);
    };
    let mut out = vec![digit.wrapping_sub(b'0')];
    BASE64.decode_vec(encoded, &mut out).map_err(|_| ())?;
    Ok(Some(out))
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

/// A resize message (`remotecommand.TerminalSize`, `{"Width":80,"Height":24}`) as
/// `(width, height)`; `None` for one that does not parse (kubelet logs and skips it).
pub fn parse_size(json: &[u8]) -> Option<(u16, u16)> {
    #[derive(serde::Deserialize)]
    struct TerminalSize {
        #[serde(rename = "Width")]
        width: u16,
        #[serde(rename = "Height")]
        height: u16,
    }
    let size: TerminalSize = serde_json::from_slice(json).ok()?;
    Some((size.width, size.height))
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
    let _ = tx.send(message(protocol, ready, &[])).await;
    let code = match start.await {
        Err(error) => {
            send_status(&tx, protocol, &internal_error(&error)).await;
            None
        }
        Ok(session) => run(session, protocol, opts, &tx, &mut source).await,
    };
    drop(tx);
    let _ = writer.await;
    code
}

/// The status on the error channel: the `metav1.Status` (v4, v5); v1 sends nothing for
/// success and the message as text for a failure (kubelet's `v1WriteStatusFunc`).
async fn send_status(tx: &mpsc::Sender<Message>, protocol: Protocol, status: &Value) {
    if let Some(payload) = status_payload(protocol.status_json(), status) {
        let _ = tx.send(message(protocol, ERROR, payload.as_bytes())).await;
    }
}

/// What the error channel carries for `status`: the JSON (`as_json`, v4 and later), else a
/// failure's message as text and nothing for success.
pub(super) fn status_payload(as_json: bool, status: &Value) -> Option<String> {
    if as_json {
        Some(status.to_string())
    } else if status["status"] == "Success" {
        None
    } else {
        Some(status["message"].as_str().unwrap_or_default().to_owned())
    }
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
        resize,
    } = session;
    let client = read_client(source, protocol, stdin, resize);
    let outputs = async {
        tokio::join!(
            pump(
                stdout,
                opts.stdout
                    .then_some((tx, |d: &[u8]| message(protocol, STDOUT, d)))
            ),
            pump(
                stderr,
                opts.stderr
                    .then_some((tx, |d: &[u8]| message(protocol, STDERR, d)))
            ),
        );
    };
    let finished = exit_after_output(&mut exit, outputs);
    tokio::select! {
        code = finished => {
            match code {
                Some(code) => send_status(tx, protocol, &exit_status(code)).await,
                None => {
                    let lost = internal_error("the exit status of the process was lost");
                    send_status(tx, protocol, &lost).await
                }
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
    resize: Option<ironlet_runtime::types::Resize>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(message) = source.next().await {
        let data = match message {
            Ok(Message::Close(_)) | Err(_) => return,
            Ok(message) => match inbound_bytes(protocol, message) {
                Ok(Some(data)) => data,
                Ok(None) => continue,
                Err(()) => return,
            },
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
            Inbound::Resize(json) => {
                if let (Some(resize), Some((width, height))) = (&resize, parse_size(json)) {
                    if let Err(err) = resize(width, height) {
                        tracing::debug!(%err, "resizing the terminal failed");
                    }
                }
            }
            Inbound::Malformed => return,
            Inbound::Close(_) | Inbound::Ignored => {}
        }
    }
}

/// Waits for the process's exit while `outputs` copy what it writes; output still flowing
/// [`DRAIN_AFTER_EXIT`] after the exit (a background child holding the pipes) is left.
pub(super) async fn exit_after_output(
    exit: &mut ExecExit,
    outputs: impl std::future::Future<Output = ()>,
) -> Option<i32> {
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
}

/// Copies one output of the process to the client, each chunk wrapped by `to`'s function
/// (or discards it when the client did not ask for it), until end-of-file or the client is
/// gone.
pub(super) async fn pump<T>(
    mut from: ExecReader,
    to: Option<(&mpsc::Sender<T>, impl Fn(&[u8]) -> T)>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some((tx, wrap)) = &to {
            if tx.send(wrap(&buf[..n])).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_prefers_v5_then_v4_then_v1_and_refuses_others() {
        assert_eq!(
            Protocol::negotiate("v4.channel.k8s.io, v5.channel.k8s.io"),
            Some(Protocol::V5)
        );
        assert_eq!(
            Protocol::negotiate("v4.channel.k8s.io,channel.k8s.io"),
            Some(Protocol::V4)
        );
        assert_eq!(
            Protocol::negotiate("base64.channel.k8s.io, channel.k8s.io"),
            Some(Protocol::V1)
        );
        assert_eq!(
            Protocol::negotiate("base64.channel.k8s.io"),
            Some(Protocol::V1Base64)
        );
        assert_eq!(
            Protocol::negotiate("v4.base64.channel.k8s.io"),
            Some(Protocol::V4Base64)
        );
        // v2 and v3 are SPDY-only versions; kubelet serves none of them over WebSocket.
        assert_eq!(Protocol::negotiate("v3.channel.k8s.io"), None);
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
    fn each_protocol_frames_binary_or_as_a_digit_and_base64_text() {
        for protocol in [Protocol::V5, Protocol::V4, Protocol::V1] {
            assert_eq!(
                message(protocol, STDOUT, b"nameserver"),
                Message::binary(b"\x01nameserver".to_vec()),
                "{protocol:?}"
            );
        }
        for protocol in [Protocol::V1Base64, Protocol::V4Base64] {
            // "hi\n" is aGkK in base64; an empty message is the digit alone.
            assert_eq!(message(protocol, STDERR, b"hi\n"), Message::text("2aGkK"));
            assert_eq!(message(protocol, STDOUT, b""), Message::text("1"));
        }
    }

    #[test]
    fn inbound_messages_decode_per_protocol() {
        let binary = Message::binary(b"\x00data".to_vec());
        assert_eq!(
            inbound_bytes(Protocol::V1, binary.clone()),
            Ok(Some(b"\x00data".to_vec()))
        );
        // A binary protocol carries no text; a base64 one takes both.
        assert_eq!(
            inbound_bytes(Protocol::V1, Message::text("0ZGF0YQ==")),
            Ok(None)
        );
        assert_eq!(
            inbound_bytes(Protocol::V1Base64, Message::text("0ZGF0YQ==")),
            Ok(Some(b"\x00data".to_vec()))
        );
        assert_eq!(
            inbound_bytes(Protocol::V1Base64, Message::binary(b"4e30=".to_vec())),
            Ok(Some(b"\x04{}".to_vec()))
        );
        assert_eq!(
            inbound_bytes(Protocol::V1Base64, Message::text("")),
            Ok(None)
        );
        assert_eq!(
            inbound_bytes(Protocol::V1Base64, Message::text("0not base64!")),
            Err(())
        );
        assert_eq!(
            inbound_bytes(Protocol::V5, Message::Ping(vec![].into())),
            Ok(None)
        );
        // v1 has no close signal either.
        assert_eq!(
            parse_inbound(Protocol::V1, &[CLOSE, STDIN]),
            Inbound::Ignored
        );
    }

    #[test]
    fn attach_takes_no_command_and_a_tty_drops_stderr_as_kubelet_does() {
        let attach = ExecOptions::parse_attach(Some("stdin=1&stdout=1&stderr=1&tty=1"))
            .expect("an attach query");
        assert_eq!(
            attach,
            ExecOptions {
                command: Vec::new(),
                stdin: true,
                stdout: true,
                stderr: false,
                tty: true,
            }
        );
        assert!(
            ExecOptions::parse(Some("stdout=1&tty=1")).is_err(),
            "exec needs a command"
        );
        assert!(
            ExecOptions::parse_attach(Some("tty=1")).is_err(),
            "no stream"
        );
        let exec = ExecOptions::parse(Some("command=sh&stdout=1&stderr=1")).expect("exec");
        assert!(exec.stderr && !exec.tty);
    }

    #[test]
    fn resize_messages_carry_width_and_height() {
        assert_eq!(parse_size(br#"{"Width":120,"Height":40}"#), Some((120, 40)));
        assert_eq!(parse_size(br#"{"Width":120}"#), None);
        assert_eq!(parse_size(b"not json"), None);
        assert_eq!(parse_size(br#"{"Width":70000,"Height":1}"#), None);
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
            ("Sec-WebSocket-Protocol", "v2.channel.k8s.io"),
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
            resize: None,
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
        connect_with(Protocol::V5, start).await
    }

    async fn connect_with<F>(
        protocol: Protocol,
        start: F,
    ) -> (
        WebSocketStream<tokio::io::DuplexStream>,
        tokio::task::JoinHandle<Option<i32>>,
    )
    where
        F: std::future::Future<Output = Result<ExecSession, String>> + Send + 'static,
    {
        let (server, client) = duplex(64 * 1024);
        let served = tokio::spawn(async move { serve(server, protocol, &opts(), start).await });
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
    async fn a_resize_message_reaches_the_session_s_terminal() {
        let killed = Arc::new(AtomicBool::new(false));
        let mut session = cat_session(killed);
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = sizes.clone();
        session.resize = Some(Box::new(move |w, h| {
            seen.lock().expect("sizes").push((w, h));
            Ok(())
        }));
        let (mut ws, served) = connect(async { Ok(session) }).await;
        ws.send(Message::binary(frame(
            RESIZE,
            br#"{"Width":90,"Height":25}"#,
        )))
        .await
        .expect("send resize");
        ws.send(Message::binary(vec![CLOSE, STDIN]))
            .await
            .expect("send close");
        let _ = receive_all(&mut ws).await;
        assert_eq!(served.await.expect("serve task"), Some(3));
        assert_eq!(*sizes.lock().expect("sizes"), [(90, 25)]);
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

    /// Every text message until the server's Close, decoded: channel digit, base64 data.
    async fn receive_all_base64(
        ws: &mut WebSocketStream<tokio::io::DuplexStream>,
    ) -> (Vec<Vec<u8>>, Option<CloseFrame>) {
        let mut received = Vec::new();
        while let Some(Ok(message)) = ws.next().await {
            match message {
                Message::Text(text) => {
                    let (digit, data) = text.split_at(1);
                    let mut decoded = vec![digit.as_bytes()[0] - b'0'];
                    BASE64
                        .decode_vec(data, &mut decoded)
                        .expect("base64 from the server");
                    received.push(decoded);
                }
                Message::Close(frame) => return (received, frame),
                _ => {}
            }
        }
        (received, None)
    }

    #[tokio::test]
    async fn v1_carries_stdin_and_stdout_in_binary_frames() {
        let killed = Arc::new(AtomicBool::new(false));
        let session = cat_session(killed);
        let (mut ws, served) = connect_with(Protocol::V1, async { Ok(session) }).await;
        ws.send(Message::binary(frame(STDIN, b"nameserver 10.0.0.10\n")))
            .await
            .expect("send stdin");
        // v1 has no close signal for stdin: the client leaves once it saw the echo.
        let first = ws.next().await.expect("ready").expect("ready message");
        assert_eq!(first, Message::binary(vec![STDOUT]), "ready signal first");
        let echoed = ws.next().await.expect("stdout").expect("stdout message");
        assert_eq!(
            echoed,
            Message::binary(frame(STDOUT, b"nameserver 10.0.0.10\n"))
        );
        drop(ws);
        assert_eq!(served.await.expect("serve task"), None);
    }

    #[tokio::test]
    async fn v1_status_is_nothing_on_success_and_plain_text_on_failure() {
        for (code, want) in [
            (0, None),
            (
                3,
                Some("command terminated with non-zero exit code: exit status 3"),
            ),
        ] {
            let (mut ws, served) =
                connect_with(
                    Protocol::V1,
                    async move { Ok(exiting_session(b"out\n", code)) },
                )
                .await;
            let (received, close) = receive_all(&mut ws).await;
            assert_eq!(close.map(|f| f.code), Some(CloseCode::Normal));
            assert_eq!(received.first(), Some(&vec![STDOUT]), "ready signal first");
            assert!(received.contains(&frame(STDOUT, b"out\n")), "{received:?}");
            let errors: Vec<&Vec<u8>> = received.iter().filter(|m| m[0] == ERROR).collect();
            match want {
                None => assert!(errors.is_empty(), "success sends no status: {errors:?}"),
                Some(text) => assert_eq!(errors, [&frame(ERROR, text.as_bytes())]),
            }
            assert_eq!(served.await.expect("serve task"), Some(code));
        }
    }

    #[tokio::test]
    async fn base64_sends_text_messages_and_reads_base64_stdin() {
        let killed = Arc::new(AtomicBool::new(false));
        let session = cat_session(killed);
        let (mut ws, served) = connect_with(Protocol::V1Base64, async { Ok(session) }).await;
        // "0" + base64("hello"): stdin.
        ws.send(Message::text("0aGVsbG8="))
            .await
            .expect("send stdin");
        let first = ws.next().await.expect("ready").expect("ready message");
        assert_eq!(first, Message::text("1"), "ready signal first");
        let echoed = ws.next().await.expect("stdout").expect("stdout message");
        assert_eq!(echoed, Message::text("1aGVsbG8="));
        drop(ws);
        assert_eq!(served.await.expect("serve task"), None);

        let (mut ws, served) = connect_with(Protocol::V1Base64, async {
            Ok(exiting_session(b"nameserver 1.1.1.1\n", 3))
        })
        .await;
        let (received, close) = receive_all_base64(&mut ws).await;
        assert_eq!(close.map(|f| f.code), Some(CloseCode::Normal));
        assert_eq!(
            received,
            [
                vec![STDOUT],
                frame(STDOUT, b"nameserver 1.1.1.1\n"),
                frame(
                    ERROR,
                    b"command terminated with non-zero exit code: exit status 3"
                ),
            ]
        );
        assert_eq!(served.await.expect("serve task"), Some(3));
    }

    /// A session whose process writes `out` on stdout and exits with `code`.
    fn exiting_session(out: &'static [u8], code: i32) -> ExecSession {
        let (_stdin_w, _stdin_r) = duplex(16);
        let (mut stdout_w, stdout_r) = duplex(1024);
        let (stderr_w, stderr_r) = duplex(16);
        let (code_tx, code_rx) = oneshot::channel();
        tokio::spawn(async move {
            let _ = stdout_w.write_all(out).await;
            drop(stdout_w);
            drop(stderr_w);
            let _ = code_tx.send(code);
        });
        ExecSession {
            stdin: None,
            stdout: Box::new(stdout_r),
            stderr: Box::new(stderr_r),
            exit: ExecExit::new(code_rx, || {}),
            resize: None,
        }
    }
}

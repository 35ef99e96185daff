//! The CRI log writer: copies a container's stdout and stderr pipes into its log file in
//! the format the kubelet and `kubectl logs` read:
//!
//! ```text
//! 2026-11-22T10:00:00.123456789Z stdout F a whole line
//! 2026-11-22T10:00:00.223456789Z stderr P the first 16 KiB of a longer line…
//! ```
//!
//! Lines longer than [`MAX_LINE`] are split into partial (`P`) records ending with a full
//! (`F`) one, as containerd does; an unterminated last line is written as `F` at end of
//! stream. Output can also be tapped raw (for `ironlet ctr run`).
//!
//! Guarantee: **no line is lost or written twice when the agent is killed at any instant**,
//! and a new pump (after an agent restart, with pipes from the supervisor) continues the
//! same file. The pump never reads container output destructively before it is in the file:
//! 1. it *peeks* at the head of the pipe with `tee(2)` (into a scratch pipe it reads),
//! 2. plans the records for the complete lines it sees ([`plan`], a pure function),
//! 3. writes each record as `pwrite(prefix)` + `splice(pipe → file)` of the line's bytes
//!    (+ `pwrite("\n")` for a `P` record): the kernel moves the bytes from the pipe into the
//!    file, so a byte is either still in the pipe or already in the file.
//!
//! A kill can only tear the last record (a prefix without all its bytes). On open, the file
//! is repaired: a torn prefix is cut off (its line is still in the pipe); a record with a
//! complete prefix is continued from its stream's pipe before anything else is written.
//! An incomplete line waits in the pipe (not in memory) until its newline, the 16 KiB
//! split, or the end of the stream, so a restart loses no partial line either.
//!
//! Readers: a record is complete once its newline is in the file; while the pump writes
//! it, the last record may be seen without it (prefix first, then the bytes), so a reader
//! following the file treats an unterminated last line as still being written.
//!
//! Rotation (kubelet's `--container-log-max-size` / `--container-log-max-files`): once the
//! file holds at least the maximum size and no record is open, the pump renames it to
//! `<n>.log.<YYYYMMDD-HHMMSS>` (kubelet's name), removes the oldest rotated files beyond
//! `max-files − 1` and goes on in a new `<n>.log`. The kubelet asks the runtime to reopen
//! the file after renaming it (`ReopenContainerLog`); here the writer does both between two
//! records, so no line is split, lost or written twice across the files.
//!
//! Cost: two system calls per record plus a `tee` and a `read` per wake-up; the file is
//! opened without `O_APPEND` (splice refuses it) and written at the pump's own offset; the
//! pump is the file's only writer.

mod open;
mod plan;

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use nix::fcntl::SpliceFFlags;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use open::{open_log_file, rotate_log_file, LogTarget};
pub use open::{open_log_for_reading, LogOpen, LOG_DIR_MODE, LOG_FILE_MODE};
use plan::{plan, Op, OpenRecord};

/// containerd's default maximum log line size before splitting.
pub const MAX_LINE: usize = 16 * 1024;

/// How much of a pipe one peek looks at (the scratch pipe's default capacity).
const PEEK_MAX: usize = 64 * 1024;

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStream {
    Stdout,
    Stderr,
}

impl LogStream {
    fn as_str(self) -> &'static str {
        match self {
            Self::Stdout => "stdout",
            Self::Stderr => "stderr",
        }
    }

    fn parse(s: &[u8]) -> Option<Self> {
        match s {
            b"stdout" => Some(Self::Stdout),
            b"stderr" => Some(Self::Stderr),
            _ => None,
        }
    }
}

/// A raw chunk of container output, for taps.
pub type OutputChunk = (LogStream, Vec<u8>);

/// Yields the tap to copy output to; asked once, when the first output arrives.
pub type TapSource = Box<dyn FnOnce() -> Option<mpsc::UnboundedSender<OutputChunk>> + Send>;

/// Where a pump copies raw output besides the log file.
#[derive(Default)]
pub struct Taps {
    /// The one subscriber that must see all of it (`ironlet ctr run`).
    pub source: Option<TapSource>,
    /// Attached sessions, from the moment they attach (a slow one misses chunks rather
    /// than hold the pump back).
    pub live: Option<LiveOutput>,
}

/// Chunks an attached session may fall behind by before it misses output.
const LIVE_CAPACITY: usize = 1024;

/// A container's output for attached sessions. The broadcast channel (its
/// [`LIVE_CAPACITY`] slots take ~56 KiB) exists only while a session is attached: it is
/// made by the first [`subscribe`](Self::subscribe) and dropped by the pump once no
/// receiver is left, so a container nobody attaches to costs none of it.
#[derive(Clone, Default)]
pub struct LiveOutput(Arc<std::sync::Mutex<Live>>);

#[derive(Default)]
enum Live {
    /// No session attached.
    #[default]
    Idle,
    Open(tokio::sync::broadcast::Sender<OutputChunk>),
    /// The output ended: no session can attach any more.
    Ended,
}

impl LiveOutput {
    fn lock(&self) -> std::sync::MutexGuard<'_, Live> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A receiver of the output from now on; `None` once it [ended](Self::end).
    pub fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<OutputChunk>> {
        let mut live = self.lock();
        match &*live {
            Live::Open(tx) => Some(tx.subscribe()),
            Live::Idle => {
                let (tx, rx) = tokio::sync::broadcast::channel(LIVE_CAPACITY);
                *live = Live::Open(tx);
                Some(rx)
            }
            Live::Ended => None,
        }
    }

    /// Sends `chunk()` to the attached sessions; with none left, drops the channel.
    fn send(&self, chunk: impl FnOnce() -> OutputChunk) {
        let mut live = self.lock();
        if let Live::Open(tx) = &*live {
            if tx.receiver_count() == 0 {
                *live = Live::Idle;
            } else {
                let _ = tx.send(chunk());
            }
        }
    }

    /// The output ended: attached sessions see its end, later ones cannot attach.
    pub fn end(&self) {
        *self.lock() = Live::Ended;
    }
}

/// A container's log file: `<pod log dir>/<relative>` at `path`, and whether it is new.
#[derive(Debug, Clone)]
pub struct LogFile {
    pub path: PathBuf,
    /// The part of `path` below the pod's log directory (`<container>/<n>.log`): nothing
    /// from the pod log directory down is followed if it is a symlink.
    pub relative: PathBuf,
    pub open: LogOpen,
    /// When the file is rotated; `None`: never.
    pub rotation: Option<LogRotation>,
}

/// Kubelet's container log rotation: `--container-log-max-size`, `--container-log-max-files`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRotation {
    /// The size from which the file is rotated, in bytes.
    pub max_size: u64,
    /// How many files of one container instance are kept, the current one included (≥ 2).
    pub max_files: usize,
}

impl Default for LogRotation {
    /// Kubelet's defaults: 10Mi and 5 files.
    fn default() -> Self {
        Self {
            max_size: 10 * 1024 * 1024,
            max_files: 5,
        }
    }
}

impl LogRotation {
    /// Whether a file of `size` bytes is due for rotation.
    pub fn due(&self, size: u64) -> bool {
        self.max_size > 0 && size >= self.max_size
    }
}

/// Kubelet's suffix of a rotated log file (Go layout `20060102-150405`, UTC).
pub fn rotation_suffix(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y%m%d-%H%M%S").to_string()
}

/// The log file, written at our own offset.
struct LogWriter {
    file: std::fs::File,
    path: PathBuf,
    offset: u64,
    log: LogFile,
}

impl LogWriter {
    /// Opens (creating) the file without following symlinks (see [`open`]) and repairs a
    /// torn last record: returns the record to continue, if its prefix is complete.
    fn open(log: &LogFile) -> std::io::Result<(Self, Option<OpenRecord>)> {
        let target = LogTarget::split(&log.path, &log.relative).ok_or_else(|| {
            std::io::Error::other(format!(
                "log path {} does not end with {}",
                log.path.display(),
                log.relative.display()
            ))
        })?;
        let file = open_log_file(&target, log.open)?;
        let len = file.metadata()?.len();
        let mut writer = Self {
            file,
            path: log.path.clone(),
            offset: len,
            log: log.clone(),
        };
        let open = writer.repair()?;
        Ok((writer, open))
    }

    fn repair(&mut self) -> std::io::Result<Option<OpenRecord>> {
        use std::os::unix::fs::FileExt;
        let len = self.offset;
        let mut last = [0u8; 1];
        if len == 0 || (self.file.read_exact_at(&mut last, len - 1).is_ok() && last[0] == b'\n') {
            return Ok(None);
        }
        // Find the start of the last record, reading backwards.
        let mut start = 0;
        let mut end = len;
        let mut chunk = vec![0u8; 64 * 1024];
        while end > 0 {
            let from = end.saturating_sub(chunk.len() as u64);
            let buf = &mut chunk[..(end - from) as usize];
            self.file.read_exact_at(buf, from)?;
            if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
                start = from + i as u64 + 1;
                break;
            }
            end = from;
        }
        let mut head = vec![0u8; ((len - start) as usize).min(128)];
        self.file.read_exact_at(&mut head, start)?;
        let prefix = parse_prefix(&head);
        tracing::info!(path = ?self.path, torn_at = start, continued = prefix.is_some(), "repairing a log record torn by a crash");
        match prefix {
            Some((stream, partial, prefix_len)) => Ok(Some(OpenRecord {
                stream,
                partial,
                len: (len - start) as usize - prefix_len,
            })),
            None => {
                // The prefix itself is torn: no container byte was written after it yet.
                self.file.set_len(start)?;
                self.offset = start;
                Ok(None)
            }
        }
    }

    /// Rotates the file if it is due (call only between records): renames it, drops the
    /// oldest rotated files and continues in a new file.
    fn rotate_if_due(&mut self) -> std::io::Result<()> {
        let Some(rotation) = self.log.rotation else {
            return Ok(());
        };
        if !rotation.due(self.offset) {
            return Ok(());
        }
        let target = LogTarget::split(&self.log.path, &self.log.relative)
            .ok_or_else(|| std::io::Error::other("log path does not end with its relative part"))?;
        let suffix = rotation_suffix(chrono::Utc::now());
        let keep = rotation.max_files.saturating_sub(1).max(1);
        match rotate_log_file(&target, &suffix, keep) {
            Ok(true) => {}
            // Rotated within this second already: the next record tries again.
            Ok(false) => return Ok(()),
            Err(err) => {
                // The file is still in place: it goes on growing.
                tracing::warn!(path = ?self.path, %err, "rotating container log failed");
                return Ok(());
            }
        }
        let file = open_log_file(&target, LogOpen::New)?;
        self.offset = file.metadata()?.len();
        self.file = file;
        tracing::debug!(path = ?self.path, %suffix, "container log rotated");
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(bytes, self.offset)?;
        self.offset += bytes.len() as u64;
        Ok(())
    }

    fn prefix(&mut self, stream: LogStream, partial: bool) -> std::io::Result<()> {
        let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let tag = if partial { "P" } else { "F" };
        self.write(format!("{ts} {} {tag} ", stream.as_str()).as_bytes())
    }

    /// Moves exactly `len` bytes from `pipe` into the file.
    fn splice_from(&mut self, pipe: &OwnedFd, mut len: usize) -> std::io::Result<()> {
        while len > 0 {
            let mut off = self.offset as libc::loff_t;
            let moved = nix::fcntl::splice(
                pipe.as_fd(),
                None,
                self.file.as_fd(),
                Some(&mut off),
                len,
                SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK,
            )
            .map_err(std::io::Error::from)?;
            if moved == 0 {
                return Err(std::io::Error::other("pipe ended before the peeked bytes"));
            }
            self.offset = off as u64;
            len -= moved;
        }
        Ok(())
    }
}

/// Parses `TIMESTAMP STREAM TAG ` at the start of a record: (stream, partial, length).
fn parse_prefix(head: &[u8]) -> Option<(LogStream, bool, usize)> {
    let mut spaces = head
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b' ')
        .map(|(i, _)| i);
    let (a, b, c) = (spaces.next()?, spaces.next()?, spaces.next()?);
    let stream = LogStream::parse(&head[a + 1..b])?;
    let partial = match &head[b + 1..c] {
        b"P" => true,
        b"F" => false,
        _ => return None,
    };
    Some((stream, partial, c + 1))
}

/// One of the container's output pipes, registered with tokio.
struct StreamPipe {
    pipe: AsyncFd<OwnedFd>,
    peek: Peek,
}

/// How a pipe is peeked at: through a scratch pipe that `tee` fills.
struct Peek {
    stream: LogStream,
    scratch_r: std::fs::File,
    scratch_w: OwnedFd,
    /// What the last peek saw; grown on demand, released when the pipe is drained.
    buf: Vec<u8>,
    /// Bytes at the head of the pipe already sent to the tap.
    tapped: usize,
    done: bool,
}

impl StreamPipe {
    fn new(stream: LogStream, fd: OwnedFd) -> std::io::Result<Self> {
        set_nonblocking(&fd)?;
        let (r, w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map_err(std::io::Error::from)?;
        Ok(Self {
            // SAFETY: the AsyncFd owns the descriptor for as long as it is registered.
            pipe: unsafe { AsyncFd::register(fd) }?,
            peek: Peek {
                stream,
                scratch_r: std::fs::File::from(r),
                scratch_w: w,
                buf: Vec::new(),
                tapped: 0,
                done: false,
            },
        })
    }
}

impl Peek {
    /// Peeks at up to [`PEEK_MAX`] bytes of `pipe`: `Some(n)` (0 at end of stream), `None`
    /// if the pipe is empty for now.
    fn peek(&mut self, pipe: &OwnedFd) -> std::io::Result<Option<usize>> {
        let n = match nix::fcntl::tee(
            pipe.as_fd(),
            self.scratch_w.as_fd(),
            PEEK_MAX,
            SpliceFFlags::SPLICE_F_NONBLOCK,
        ) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN) => {
                // Drained: an idle container holds no buffer (64 KiB per stream, 128 KiB
                // per container, was most of the agent's memory at a few hundred pods).
                self.buf = Vec::new();
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        self.scratch_r.read_exact(&mut self.buf[..n])?;
        Ok(Some(n))
    }
}

/// True when `pipe` has no writer left and `peeked` bytes are all it holds.
fn fully_peeked_and_closed(pipe: &OwnedFd, peeked: usize) -> bool {
    let fd = pipe.as_raw_fd();
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let hup = unsafe { libc::poll(&mut pfd, 1, 0) } >= 0 && pfd.revents & libc::POLLHUP != 0;
    let mut available: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let ok = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut available) } == 0;
    hup && ok && available as usize == peeked
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    let flags = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)
        .map_err(std::io::Error::from)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))
        .map_err(std::io::Error::from)?;
    Ok(())
}

/// What one wake-up of a stream achieved.
enum Progress {
    /// Something was consumed; look again.
    More,
    /// Only an incomplete line (or nothing) is there: wait for the next write.
    Wait,
    Ended,
}

/// The pump's state across both streams.
struct Pump {
    writer: Option<LogWriter>,
    open: Option<OpenRecord>,
    tap_source: Option<TapSource>,
    tap: Option<mpsc::UnboundedSender<OutputChunk>>,
    live: Option<LiveOutput>,
}

impl Pump {
    fn step(&mut self, pipe: &OwnedFd, s: &mut Peek) -> std::io::Result<Progress> {
        let Some(n) = s.peek(pipe)? else {
            return Ok(Progress::Wait);
        };
        let end_of_stream = n == 0 || fully_peeked_and_closed(pipe, n);
        if n > s.tapped {
            if let Some(source) = self.tap_source.take() {
                self.tap = source();
            }
            if let Some(tap) = &self.tap {
                let _ = tap.send((s.stream, s.buf[s.tapped..n].to_vec()));
            }
            if let Some(live) = &self.live {
                live.send(|| (s.stream, s.buf[s.tapped..n].to_vec()));
            }
            s.tapped = n;
        }
        let ops = plan(&s.buf[..n], s.stream, &mut self.open, end_of_stream);
        let mut consumed = 0;
        for op in ops {
            if let Op::Copy(len) = op {
                consumed += len;
            }
            self.apply(pipe, s.stream, op)?;
        }
        // Every planned record is whole unless one stays open: the file may rotate here.
        if self.open.is_none() {
            self.rotate_if_due();
        }
        s.tapped -= consumed;
        Ok(if n == 0 {
            Progress::Ended
        } else if consumed > 0 {
            Progress::More
        } else {
            Progress::Wait
        })
    }

    fn apply(&mut self, pipe: &OwnedFd, stream: LogStream, op: Op) -> std::io::Result<()> {
        let Some(writer) = self.writer.as_mut() else {
            // No log file: drain what would have been written.
            if let Op::Copy(len) = op {
                discard(pipe, len)?;
            }
            return Ok(());
        };
        let written = match op {
            Op::Start { partial } => writer.prefix(stream, partial),
            Op::Copy(len) => writer.splice_from(pipe, len),
            Op::End => writer.write(b"\n"),
        };
        if let Err(err) = written {
            tracing::error!(path = ?writer.path, %err, "writing container log failed; output is drained from now on");
            self.writer = None;
            if let Op::Copy(len) = op {
                discard(pipe, len)?;
            }
        }
        Ok(())
    }

    fn rotate_if_due(&mut self) {
        let Some(writer) = self.writer.as_mut() else {
            return;
        };
        if let Err(err) = writer.rotate_if_due() {
            tracing::error!(path = ?writer.path, %err, "rotating container log failed; output is drained from now on");
            self.writer = None;
        }
    }

    /// Ends a record `stream` left open when that stream ends.
    fn close_open_record(&mut self, stream: LogStream) {
        if self.open.is_some_and(|r| r.stream == stream) {
            self.open = None;
            if let Some(w) = self.writer.as_mut() {
                let _ = w.write(b"\n");
            }
        }
    }
}

/// Reads and drops exactly `len` bytes from a pipe that holds them.
fn discard(pipe: &OwnedFd, mut len: usize) -> std::io::Result<()> {
    let mut sink = [0u8; 8192];
    while len > 0 {
        let want = len.min(sink.len());
        let n =
            nix::unistd::read(pipe.as_raw_fd(), &mut sink[..want]).map_err(std::io::Error::from)?;
        if n == 0 {
            return Ok(());
        }
        len -= n;
    }
    Ok(())
}

/// Copies both pipes into the log file until both reach end of stream, continuing the
/// file where an earlier pump stopped; tapped chunks go to `tap` too. Returns when the
/// container's last writer has closed its pipes and everything is in the file.
pub async fn pump(log: LogFile, stdout: OwnedFd, stderr: OwnedFd, taps: Taps) {
    let log_path = &log.path;
    let (writer, open) = match LogWriter::open(&log) {
        Ok((w, open)) => (Some(w), open),
        Err(err) => {
            tracing::error!(path = ?log_path, %err, "cannot open container log; output is drained");
            (None, None)
        }
    };
    let (mut out, mut err) = match (
        StreamPipe::new(LogStream::Stdout, stdout),
        StreamPipe::new(LogStream::Stderr, stderr),
    ) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(path = ?log_path, err = %e, "cannot read container output pipes");
            return;
        }
    };
    let mut pump = Pump {
        writer,
        open,
        tap_source: taps.source,
        tap: None,
        live: taps.live,
    };
    while !(out.peek.done && err.peek.done) {
        // A torn record of one stream is finished before the other stream writes.
        let owner = pump.open.map(|r| r.stream);
        let out_turn = !out.peek.done && owner.is_none_or(|s| s == LogStream::Stdout);
        let err_turn = !err.peek.done && owner.is_none_or(|s| s == LogStream::Stderr);
        tokio::select! {
            ready = out.pipe.readable(), if out_turn => {
                step_ready(&mut pump, ready, &mut out.peek);
            }
            ready = err.pipe.readable(), if err_turn => {
                step_ready(&mut pump, ready, &mut err.peek);
            }
            else => match owner {
                // The stream owning an open record ended without finishing it.
                Some(stream) => pump.close_open_record(stream),
                None => break,
            },
        }
        // One step writes up to a 64 KiB peek, tens of thousands of records for short
        // lines; without a yield a chatty container would hold this worker thread (and the
        // exit events queued behind it) until its output stops.
        tokio::task::yield_now().await;
    }
    // A container that wrote nothing still ends its tap: taking it closes the channel.
    if let Some(source) = pump.tap_source.take() {
        drop(source());
    }
}

/// Handles one readiness of a stream's pipe.
fn step_ready(
    pump: &mut Pump,
    ready: std::io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, OwnedFd>>,
    peek: &mut Peek,
) {
    let mut guard = match ready {
        Ok(guard) => guard,
        Err(err) => {
            tracing::error!(stream = peek.stream.as_str(), %err, "polling container output failed");
            pump.close_open_record(peek.stream);
            peek.done = true;
            return;
        }
    };
    match pump.step(guard.get_inner(), peek) {
        Ok(Progress::More) => {}
        // Cleared only if no new write arrived since the guard was taken (tokio's tick).
        Ok(Progress::Wait) => guard.clear_ready(),
        Ok(Progress::Ended) => {
            pump.close_open_record(peek.stream);
            peek.done = true;
        }
        Err(err) => {
            tracing::error!(stream = peek.stream.as_str(), %err, "reading container output failed");
            pump.close_open_record(peek.stream);
            peek.done = true;
        }
    }
}

/// Fuzzing entry point (not an API): opens the existing log file `<dir>/<file name>` at
/// `path` as a pump does after an agent restart, repairing a record torn by a crash;
/// returns the continued record's (stream, partial, length so far) if the last record
/// stays open.
#[doc(hidden)]
pub fn reopen_log_for_fuzzing(
    path: &std::path::Path,
) -> std::io::Result<Option<(LogStream, bool, usize)>> {
    let relative = path
        .file_name()
        .map(PathBuf::from)
        .ok_or_else(|| std::io::Error::other("a log path needs a file name"))?;
    let log = LogFile {
        path: path.to_owned(),
        relative,
        open: LogOpen::Continue,
        rotation: None,
    };
    let (_, open) = LogWriter::open(&log)?;
    Ok(open.map(|r| (r.stream, r.partial, r.len)))
}

/// Parses one CRI log record into (stream, partial, content); used by `ctr logs` and tests.
pub fn parse_record(line: &str) -> Option<(&str, bool, &str)> {
    let record = parse_record_bytes(line.as_bytes())?;
    // Split at ASCII spaces, so each part of a `str` is one.
    Some((
        std::str::from_utf8(record.stream).ok()?,
        record.partial,
        std::str::from_utf8(record.content).ok()?,
    ))
}

/// One CRI log record's fields, as bytes: a container may log bytes that are not UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRecord<'a> {
    pub timestamp: &'a [u8],
    pub stream: &'a [u8],
    /// `P`: the content continues in the next record.
    pub partial: bool,
    pub content: &'a [u8],
}

/// Parses one CRI log record (without its newline) into its fields.
#[must_use]
pub fn parse_record_bytes(line: &[u8]) -> Option<RawRecord<'_>> {
    let mut parts = line.splitn(4, |&b| b == b' ');
    let timestamp = parts.next()?;
    let stream = parts.next()?;
    let tag = parts.next()?;
    let content = parts.next().unwrap_or_default();
    Some(RawRecord {
        timestamp,
        stream,
        partial: tag == b"P",
        content,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    use LogStream::Stderr;

    #[test]
    fn records_parse_back() {
        let rec = "2026-11-22T10:00:00.000000001Z stderr P some text here";
        assert_eq!(parse_record(rec), Some(("stderr", true, "some text here")));
        assert_eq!(
            parse_prefix(rec.as_bytes()),
            Some((
                Stderr,
                true,
                "2026-11-22T10:00:00.000000001Z stderr P ".len()
            ))
        );
        assert_eq!(parse_prefix(b"2026-11-22T10:00:00.0Z std"), None);
    }

    #[test]
    fn live_output_exists_while_a_session_is_attached_and_ends_for_good() {
        use tokio::sync::broadcast::error::TryRecvError;
        let live = LiveOutput::default();
        let chunk = |text: &str| (LogStream::Stdout, text.as_bytes().to_vec());
        // Nobody attached: the chunk is not even built.
        live.send(|| unreachable!("no session is attached"));
        assert!(matches!(*live.lock(), Live::Idle));

        let mut first = live.subscribe().expect("a session attaches");
        let mut second = live.subscribe().expect("a second session attaches");
        live.send(|| chunk("both"));
        assert_eq!(first.try_recv().expect("first").1, b"both");
        assert_eq!(second.try_recv().expect("second").1, b"both");

        // The last session left: the next output drops the channel.
        drop((first, second));
        live.send(|| chunk("nobody"));
        assert!(matches!(*live.lock(), Live::Idle));

        // A session attaching later sees output from then on, and the end of it.
        let mut late = live.subscribe().expect("attaches again");
        live.send(|| chunk("late"));
        live.end();
        assert_eq!(late.try_recv().expect("late").1, b"late");
        assert_eq!(late.try_recv(), Err(TryRecvError::Closed));
        assert!(live.subscribe().is_none(), "no attach after the end");
    }

    fn write_pipe(fd: &OwnedFd, bytes: &[u8]) {
        nix::unistd::write(fd, bytes).expect("write to pipe");
    }

    fn records(path: &Path) -> Vec<(String, bool, String)> {
        std::fs::read_to_string(path)
            .expect("log file")
            .lines()
            .map(|l| {
                let (s, p, c) = parse_record(l).expect("a CRI record");
                (s.to_owned(), p, c.to_owned())
            })
            .collect()
    }

    fn new_file(dir: &Path, relative: &str) -> LogFile {
        LogFile {
            path: dir.join(relative),
            relative: relative.into(),
            open: LogOpen::New,
            rotation: None,
        }
    }

    fn continued(dir: &Path, relative: &str) -> LogFile {
        LogFile {
            open: LogOpen::Continue,
            ..new_file(dir, relative)
        }
    }

    fn full(stream: &str, content: &str) -> (String, bool, String) {
        (stream.to_owned(), false, content.to_owned())
    }

    #[tokio::test]
    async fn the_pump_writes_both_streams_and_ends_with_the_writers() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("c/0.log");
        let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
        let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
        let task = tokio::spawn(pump(
            new_file(dir.path(), "c/0.log"),
            out_r,
            err_r,
            Taps::default(),
        ));
        write_pipe(&out_w, b"one\ntw");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        write_pipe(&err_w, b"oops\n");
        write_pipe(&out_w, b"o\nthree");
        drop((out_w, err_w));
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the pump ends when the writers close")
            .expect("pump task");
        let mut got = records(&log);
        got.sort();
        let mut want = vec![
            full("stdout", "one"),
            full("stdout", "two"),
            full("stdout", "three"),
            full("stderr", "oops"),
        ];
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn rotation_is_due_from_the_maximum_size_and_named_as_kubelet_names_it() {
        let rotation = LogRotation {
            max_size: 100,
            max_files: 3,
        };
        assert!(!rotation.due(99));
        assert!(rotation.due(100) && rotation.due(5000));
        assert_eq!(LogRotation::default().max_size, 10 * 1024 * 1024);
        assert_eq!(LogRotation::default().max_files, 5);
        let at = chrono::DateTime::parse_from_rfc3339("2026-11-25T07:08:09.5Z")
            .expect("time")
            .with_timezone(&chrono::Utc);
        assert_eq!(rotation_suffix(at), "20261125-070809");
    }

    #[tokio::test]
    async fn a_rotating_pump_keeps_max_files_and_loses_or_repeats_no_line() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
        let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
        let log = LogFile {
            rotation: Some(LogRotation {
                max_size: 4096,
                max_files: 3,
            }),
            ..new_file(dir.path(), "c/0.log")
        };
        let task = tokio::spawn(pump(log, out_r, err_r, Taps::default()));
        // Lines in bursts across several seconds, so several rotations get distinct names.
        let mut next = 0;
        for _ in 0..5 {
            let burst: String = (next..next + 100).map(|n| format!("line {n}\n")).collect();
            next += 100;
            write_pipe(&out_w, burst.as_bytes());
            tokio::time::sleep(std::time::Duration::from_millis(1050)).await;
        }
        drop((out_w, err_w));
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the pump ends")
            .expect("pump task");
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("c"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        // Oldest rotated file first, the current file last.
        names.sort_by_key(|n| (n == "0.log", n.clone()));
        assert_eq!(names.len(), 3, "{names:?}");
        assert_eq!(names[2], "0.log");
        for rotated in &names[..2] {
            let suffix = rotated.strip_prefix("0.log.").expect("a rotated name");
            assert_eq!(suffix.len(), "20060102-150405".len(), "{rotated}");
        }
        // Read in order (rotated oldest first, then the current file): consecutive lines.
        let mut lines = Vec::new();
        for name in names[..2].iter().chain(std::iter::once(&names[2])) {
            let path = dir.path().join("c").join(name);
            let text = std::fs::read_to_string(&path).expect("read");
            assert!(
                text.is_empty() || text.ends_with('\n'),
                "{name} ends mid-record"
            );
            if name != "0.log" {
                assert!(text.len() >= 4096, "{name} rotated early");
            }
            lines.extend(records(&path).into_iter().map(|(_, _, c)| c));
        }
        let first: usize = lines[0]
            .strip_prefix("line ")
            .and_then(|n| n.parse().ok())
            .expect("numbered");
        let want: Vec<String> = (first..next).map(|n| format!("line {n}")).collect();
        assert_eq!(lines, want, "lines lost or repeated across rotations");
        assert!(first > 0, "older files were removed");
    }

    #[tokio::test]
    async fn a_new_pump_continues_a_record_torn_by_a_crash_without_losing_bytes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("0.log");
        // A previous pump wrote one record, the prefix of the next and two of its bytes,
        // then died; the rest of the line is still in the pipe.
        std::fs::write(
            &log,
            "2026-11-22T10:00:00.000000001Z stdout F first\n2026-11-22T10:00:00.000000002Z stdout F se",
        )
        .expect("write log");
        let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
        let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
        write_pipe(&err_w, b"on stderr\n");
        write_pipe(&out_w, b"cond\nthird\n");
        drop((out_w, err_w));
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            pump(
                continued(dir.path(), "0.log"),
                out_r,
                err_r,
                Taps::default(),
            ),
        )
        .await
        .expect("pump ends");
        let got = records(&log);
        assert_eq!(
            &got[..2],
            &[full("stdout", "first"), full("stdout", "second")]
        );
        let mut rest = got[2..].to_vec();
        rest.sort();
        assert_eq!(
            rest,
            vec![full("stderr", "on stderr"), full("stdout", "third")]
        );
    }

    #[tokio::test]
    async fn a_torn_prefix_is_cut_off_and_its_line_written_whole() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("0.log");
        std::fs::write(
            &log,
            "2026-11-22T10:00:00.000000001Z stdout F first\n2026-11-22T1",
        )
        .expect("write log");
        let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
        let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
        write_pipe(&out_w, b"second\n");
        drop((out_w, err_w));
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            pump(
                continued(dir.path(), "0.log"),
                out_r,
                err_r,
                Taps::default(),
            ),
        )
        .await
        .expect("pump ends");
        assert_eq!(
            records(&log),
            vec![full("stdout", "first"), full("stdout", "second")]
        );
    }
}

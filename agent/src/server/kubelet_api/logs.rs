//! `/containerLogs/{namespace}/{pod}/{container}`: kubelet's log endpoint over the CRI log
//! files (`<pod-logs-dir>/<ns>_<pod>_<uid>/<container>/<attempt>.log`, records parsed by
//! [`parse_record`]). Query parameters as kubelet's `PodLogOptions`: `follow`, `previous`,
//! `tailLines`, `sinceSeconds`, `sinceTime`, `timestamps`, `limitBytes`.
//!
//! The current instance is the highest-numbered file, `previous` the one before it. With
//! `follow`, the reader waits at the end of the file while the container runs and returns
//! once it no longer does (and the rest is read); a line still being written (no newline
//! yet) is only sent once whole. A follower sleeps on an inotify watch of the log (kubelet's
//! follower uses fsnotify alike) and looks at the container's state every
//! [`STATE_CHECK_PERIOD`]; it reads only when the file changed. Polling the file instead
//! would cost one blocking-pool task per follower per poll, which keeps the pool's threads
//! alive at their high-water mark while logs are followed.

use std::io::SeekFrom;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use ironlet_runtime::local::logs::parse_record_bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, BufReader};

use crate::config::inotify::DirWatch;

/// How often a follower looks whether the container still runs while its log is quiet.
const STATE_CHECK_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);
/// How often a follower without an inotify watch (e.g. the per-user instance limit) reads.
const POLL_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);
/// The file reader's buffer: one blocking-pool read per 16 KiB. A follower gives it back
/// while it waits (see [`LogReader`]).
const READ_BUFFER: usize = 16 * 1024;

/// Kubelet's `PodLogOptions` as the query carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    pub since: Option<DateTime<Utc>>,
    pub limit_bytes: Option<u64>,
}

impl LogOptions {
    /// Parses the query string; errors name the bad parameter (400).
    pub fn parse(query: Option<&str>, now: DateTime<Utc>) -> Result<Self, String> {
        let mut out = Self::default();
        let mut since_seconds = None;
        let mut since_time = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
            let value = percent_decode(value).ok_or_else(|| format!("{key}: bad escape"))?;
            let flag = |v: &str| match v {
                "true" | "1" | "" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(format!("{key}: {v:?} is not a boolean")),
            };
            let number = |v: &str| {
                v.parse::<i64>()
                    .map_err(|_| format!("{key}: {v:?} is not a number"))
            };
            match key {
                "follow" => out.follow = flag(&value)?,
                "previous" => out.previous = flag(&value)?,
                "timestamps" => out.timestamps = flag(&value)?,
                "tailLines" => out.tail_lines = Some(non_negative(key, number(&value)?)?),
                "limitBytes" => out.limit_bytes = Some(positive(key, number(&value)?)?),
                "sinceSeconds" => since_seconds = Some(positive(key, number(&value)?)?),
                "sinceTime" => {
                    let t = DateTime::parse_from_rfc3339(&value)
                        .map_err(|_| format!("sinceTime: {value:?} is not RFC 3339"))?;
                    since_time = Some(t.with_timezone(&Utc));
                }
                _ => {}
            }
        }
        out.since = match (since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err("at most one of sinceTime or sinceSeconds may be specified".into())
            }
            (Some(s), None) => {
                Some(now - chrono::Duration::seconds(i64::try_from(s).unwrap_or(i64::MAX / 2)))
            }
            (None, t) => t,
        };
        Ok(out)
    }
}

fn non_negative(key: &str, n: i64) -> Result<u64, String> {
    u64::try_from(n).map_err(|_| format!("{key} must be >= 0"))
}

fn positive(key: &str, n: i64) -> Result<u64, String> {
    match non_negative(key, n)? {
        0 => Err(format!("{key} must be > 0")),
        n => Ok(n),
    }
}

pub(crate) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The log file of the current instance (or, with `previous`, the one before): the highest
/// (second highest) `<n>.log` in the container's log directory.
pub fn instance_file(container_dir: &Path, previous: bool) -> Option<PathBuf> {
    let mut attempts = attempts(container_dir)?;
    attempts.sort_unstable();
    let pick = if previous {
        attempts.iter().rev().nth(1)
    } else {
        attempts.last()
    };
    pick.map(|n| container_dir.join(format!("{n}.log")))
}

/// Whether the container was started again since the instance that writes `file`
/// (`<n>.log`): a higher attempt has its file. A file the writer renamed in a rotation and has
/// not replaced yet leaves no `<n>.log` for a moment; that instance goes on all the same.
pub fn newer_instance_started(container_dir: &Path, file: &Path) -> bool {
    let Some(ours) = file.file_name().and_then(|n| attempt_of(n.to_str()?)) else {
        return false;
    };
    attempts(container_dir).is_some_and(|all| all.into_iter().any(|n| n > ours))
}

/// The attempts `<n>.log` in a container's log directory (rotated files not among them).
fn attempts(container_dir: &Path) -> Option<Vec<u64>> {
    let entries = std::fs::read_dir(container_dir).ok()?;
    Some(
        entries
            .flatten()
            .filter_map(|e| attempt_of(e.file_name().to_str()?))
            .collect(),
    )
}

fn attempt_of(file_name: &str) -> Option<u64> {
    file_name.strip_suffix(".log")?.parse().ok()
}

/// A name that is safe as one path component (pod, namespace and container names are DNS
/// labels/subdomains).
pub fn is_safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Where lines go; `false` from [`Sink::write`] stops the stream (limit reached or the
/// client is gone).
#[async_trait::async_trait]
pub trait Sink: Send {
    async fn write(&mut self, bytes: &[u8]) -> bool;
    /// Resolves when the client has gone away (used while waiting for more log).
    async fn closed(&mut self);
}

/// Appends one CRI record, formatted as kubelet does, to `out`; `false` if it is not a
/// record or is filtered out. Bytes, not text: a container may log anything.
fn render_into(line: &[u8], opts: &LogOptions, out: &mut Vec<u8>) -> bool {
    let Some(record) = parse_record_bytes(line) else {
        return false;
    };
    if let Some(since) = opts.since {
        let at = std::str::from_utf8(record.timestamp)
            .ok()
            .and_then(|ts| DateTime::parse_from_rfc3339(ts).ok());
        match at {
            Some(at) if at.with_timezone(&Utc) >= since => {}
            _ => return false,
        }
    }
    if opts.timestamps {
        out.extend_from_slice(record.timestamp);
        out.push(b' ');
    }
    out.extend_from_slice(record.content);
    if !record.partial {
        out.push(b'\n');
    }
    true
}

/// Rendered records on their way to the sink: one write (one TLS record, one syscall)
/// per [`BATCH_BYTES`] rather than one per line, which bounded a 100 MiB read to ~10 MB/s.
/// Whatever is pending goes out before the reader waits or stops.
struct Batch {
    pending: Vec<u8>,
    /// Bytes rendered so far, for `limitBytes`.
    rendered: u64,
}

/// What a batch is filled to before it is written.
const BATCH_BYTES: usize = 64 * 1024;
/// The most a batch keeps allocated while its reader waits.
const IDLE_BATCH_CAPACITY: usize = 4 * 1024;

impl Batch {
    fn new() -> Self {
        Self {
            pending: Vec::new(),
            rendered: 0,
        }
    }

    /// Adds one record; `false` once `limitBytes` is reached (what is pending then still
    /// has to be sent).
    fn add(&mut self, line: &[u8], opts: &LogOptions) -> bool {
        let before = self.pending.len();
        if !render_into(line, opts, &mut self.pending) {
            return true;
        }
        if let Some(limit) = opts.limit_bytes {
            let room = usize::try_from(limit.saturating_sub(self.rendered)).unwrap_or(usize::MAX);
            self.pending.truncate(before.saturating_add(room));
        }
        self.rendered += (self.pending.len() - before) as u64;
        opts.limit_bytes.is_none_or(|limit| self.rendered < limit)
    }

    fn is_full(&self) -> bool {
        self.pending.len() >= BATCH_BYTES
    }

    /// Writes what is pending; `false` when the sink refuses (the client is gone).
    async fn send<S: Sink>(&mut self, sink: &mut S) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        let ok = sink.write(&self.pending).await;
        self.pending.clear();
        ok
    }

    /// [`Batch::send`], then gives the buffer back: the reader is at the end of a file, where
    /// a follower may wait for a long time (a hundred followers would hold 64 KiB each).
    async fn send_and_release<S: Sink>(&mut self, sink: &mut S) -> bool {
        let ok = self.send(sink).await;
        if self.pending.capacity() > IDLE_BATCH_CAPACITY {
            self.pending = Vec::new();
        }
        ok
    }
}

/// The start of the last `lines` records of `file` and how many records that is (fewer
/// than `lines` when the file has fewer: then from offset 0).
async fn tail_offset(file: &mut tokio::fs::File, lines: u64) -> std::io::Result<(u64, u64)> {
    const CHUNK: u64 = 64 * 1024;
    let len = file.metadata().await?.len();
    if lines == 0 {
        return Ok((len, 0));
    }
    let mut end = len;
    let mut newlines = 0u64;
    let mut buf = vec![0u8; CHUNK as usize];
    // The newline nearest the end closes the last whole record (bytes after it are a
    // record still being written): it does not start a line.
    let mut seen_last = false;
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let n = usize::try_from(end - start).unwrap_or(0);
        file.seek(SeekFrom::Start(start)).await?;
        file.read_exact(&mut buf[..n]).await?;
        for (i, b) in buf[..n].iter().enumerate().rev() {
            if *b != b'\n' {
                continue;
            }
            if !seen_last {
                seen_last = true;
                continue;
            }
            newlines += 1;
            if newlines == lines {
                return Ok((start + i as u64 + 1, lines));
            }
        }
        end = start;
    }
    // The first record has no newline before it.
    Ok((0, newlines + u64::from(seen_last)))
}

/// The files of the container instance whose log is `current` (`<n>.log`), oldest first:
/// its rotated files `<n>.log.<YYYYMMDD-HHMMSS>` (kubelet's names sort by time), then
/// `current` itself if it exists.
pub fn instance_files(current: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (current.parent(), current.file_name()) else {
        return Vec::new();
    };
    let mut prefix = name.as_encoded_bytes().to_vec();
    prefix.push(b'.');
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().as_encoded_bytes().starts_with(&prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    rotated.sort();
    if current.exists() {
        rotated.push(current.to_owned());
    }
    rotated
}

fn open_log(path: &Path) -> std::io::Result<tokio::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    Ok(tokio::fs::File::from_std(file))
}

/// One open log file and its inode (to tell when `<n>.log` was rotated away from it).
struct Opened {
    file: tokio::fs::File,
    ino: u64,
}

impl Opened {
    async fn open(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let file = open_log(path)?;
        let ino = file.metadata().await?.ino();
        Ok(Self { file, ino })
    }
}

/// The file being read: buffered while it is read, bare while a follower waits at its end.
/// A waiting follower held two 16 KiB buffers ([`BufReader`]'s and the one `tokio::fs::File`
/// reads into on the blocking pool), 32 KiB each for as long as its log stays quiet.
enum LogReader {
    Buffered(BufReader<tokio::fs::File>),
    Bare(std::fs::File),
    /// Only while switching between the two.
    Switching,
}

impl LogReader {
    fn new(file: tokio::fs::File) -> Self {
        Self::Buffered(BufReader::with_capacity(READ_BUFFER, file))
    }

    /// [`AsyncBufReadExt::read_until`], buffering a bare file first.
    async fn read_until(&mut self, byte: u8, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        if matches!(self, Self::Bare(_)) {
            if let Self::Bare(file) = std::mem::replace(self, Self::Switching) {
                *self = Self::new(tokio::fs::File::from_std(file));
            }
        }
        match self {
            Self::Buffered(reader) => reader.read_until(byte, buf).await,
            Self::Bare(_) | Self::Switching => Err(std::io::Error::other(
                "the log reader lost its file while switching buffers",
            )),
        }
    }

    /// Gives the buffers back when everything read into them was consumed, as it is at the
    /// end of the file (`read_until` consumes what it scans; `tokio::fs::File` reads at most
    /// what `BufReader` asks for and hands it all over, so nothing is buffered below either).
    async fn release(&mut self) {
        if !matches!(self, Self::Buffered(reader) if reader.buffer().is_empty()) {
            return;
        }
        if let Self::Buffered(reader) = std::mem::replace(self, Self::Switching) {
            *self = Self::Bare(reader.into_inner().into_std().await);
        }
    }

    /// Whether the buffers are given back (for tests).
    #[cfg(test)]
    fn is_bare(&self) -> bool {
        matches!(self, Self::Bare(_))
    }
}

/// While following `current`: the file that comes after the one with inode `ino` once the
/// writer has rotated it away, `None` while `current` is still that file (or not made yet).
async fn next_after_rotation(current: &Path, ino: u64) -> Option<Opened> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(current) {
        Ok(meta) if meta.ino() == ino => return None,
        _ => {}
    }
    let files = instance_files(current);
    let inodes: Vec<Option<u64>> = files
        .iter()
        .map(|p| std::fs::symlink_metadata(p).ok().map(|m| m.ino()))
        .collect();
    // The next file after ours; if ours was removed already (max-files), the oldest left.
    let next = match inodes.iter().position(|i| *i == Some(ino)) {
        Some(i) => files.get(i + 1)?,
        None => files.first()?,
    };
    Opened::open(next).await.ok()
}

/// Streams the log of the container instance whose file is `path` (its rotated files
/// first) to `sink` with `opts`; `running` tells (polled at the end of the file) whether
/// the container still writes to it. A follower moves on to the new file when the writer
/// rotates the one it reads.
pub async fn stream<S: Sink, F: Fn() -> bool + Send>(
    path: &Path,
    opts: &LogOptions,
    sink: &mut S,
    running: F,
) -> std::io::Result<()> {
    // Set up before the first read, so that no write between a read and the wait is missed.
    let mut changes = if opts.follow {
        DirWatch::new(path)
            .inspect_err(|err| tracing::debug!(%err, "following a log by polling"))
            .ok()
    } else {
        None
    };
    // Every file is opened now: a rotation while they are read removes none of them.
    let mut files = Vec::new();
    for file in instance_files(path) {
        match Opened::open(&file).await {
            Ok(opened) => files.push(opened),
            // Removed by a rotation since it was listed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if files.is_empty() {
        // The current file itself, for its error.
        files.push(Opened::open(path).await?);
    }
    // The head goes out now: the request is accepted even if nothing is logged yet.
    if !sink.write(&[]).await {
        return Ok(());
    }
    // Where to start: the tail spans files from the newest back.
    let mut first = 0;
    let mut start = 0;
    if let Some(mut lines) = opts.tail_lines {
        first = files.len() - 1;
        loop {
            let (offset, found) = tail_offset(&mut files[first].file, lines).await?;
            start = offset;
            lines -= found;
            if lines == 0 || first == 0 {
                break;
            }
            first -= 1;
        }
    }
    let mut files = files.into_iter().skip(first);
    let Some(mut opened) = files.next() else {
        return Ok(());
    };
    opened.file.seek(SeekFrom::Start(start)).await?;
    let mut ino = opened.ino;
    let mut reader = LogReader::new(opened.file);
    let mut batch = Batch::new();
    let mut line = Vec::new();
    let mut rotated: Option<Opened> = None;
    loop {
        let n = reader.read_until(b'\n', &mut line).await?;
        if n > 0 && line.ends_with(b"\n") {
            let more = batch.add(&line[..line.len() - 1], opts);
            line.clear();
            if !more {
                batch.send(sink).await;
                return Ok(());
            }
            if batch.is_full() && !batch.send(sink).await {
                return Ok(());
            }
            continue;
        }
        // The reader is about to switch files, wait or stop: what is rendered goes out.
        if !batch.send_and_release(sink).await {
            return Ok(());
        }
        // At the end of this file (possibly with a line still being written, in `line`).
        // A file seen rotated is read to its end once more before moving on: the writer
        // may have added records between the last read and the rename, never after it.
        let next = match (files.next(), rotated.take()) {
            (Some(next), _) | (None, Some(next)) => Some(next),
            (None, None) if opts.follow && line.is_empty() => {
                if let Some(next) = next_after_rotation(path, ino).await {
                    rotated = Some(next);
                    continue;
                }
                None
            }
            (None, None) => None,
        };
        if let Some(mut next) = next {
            // A rotated file ends with a whole record: what it holds is all read. The next
            // is read from its start (the tail's search moved its position).
            next.file.seek(SeekFrom::Start(0)).await?;
            ino = next.ino;
            reader = LogReader::new(next.file);
            continue;
        }
        if !opts.follow {
            return Ok(());
        }
        if !running() {
            // One last read for what the container wrote before it stopped: in this file,
            // or in the next one if the writer rotated this one since the look above (its
            // last burst then lies wholly in a file this reader has not opened yet).
            let more = reader.read_until(b'\n', &mut line).await?;
            if more > 0 {
                continue;
            }
            if line.is_empty() {
                if let Some(next) = next_after_rotation(path, ino).await {
                    rotated = Some(next);
                    continue;
                }
            }
            tracing::debug!(path = %path.display(), "the container stopped: the log's follower ends");
            return Ok(());
        }
        // The follower waits: its read buffers go back until the log changes.
        reader.release().await;
        let Some(watch) = changes.as_mut() else {
            tokio::select! {
                () = sink.closed() => return Ok(()),
                () = tokio::time::sleep(POLL_PERIOD) => {}
            }
            continue;
        };
        // Until the log changes or the container stops (then its last lines are read).
        let watching = loop {
            tokio::select! {
                () = sink.closed() => return Ok(()),
                changed = watch.changed() => break changed,
                () = tokio::time::sleep(STATE_CHECK_PERIOD) => if !running() {
                    break Ok(());
                },
            }
        };
        if let Err(err) = watching {
            tracing::debug!(%err, "the log's watch ended; following by polling");
            changes = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-25T10:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default()
    }

    #[test]
    fn kubelets_query_parameters_parse() {
        let o = LogOptions::parse(
            Some("follow=true&tailLines=3&timestamps=1&limitBytes=10&sinceTime=2026-11-25T09%3A00%3A00Z"),
            now(),
        )
        .expect("valid");
        assert!(o.follow && o.timestamps && !o.previous);
        assert_eq!((o.tail_lines, o.limit_bytes), (Some(3), Some(10)));
        assert_eq!(o.since, Some(now() - chrono::Duration::hours(1)));
        let o = LogOptions::parse(Some("sinceSeconds=60&previous=true"), now()).expect("valid");
        assert_eq!(o.since, Some(now() - chrono::Duration::seconds(60)));
        assert!(o.previous);
        for bad in [
            "tailLines=-1",
            "limitBytes=0",
            "follow=maybe",
            "sinceSeconds=1&sinceTime=2026-11-25T09:00:00Z",
            "sinceTime=yesterday",
            "tailLines=%zz",
        ] {
            assert!(LogOptions::parse(Some(bad), now()).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_with_separators_or_dots_only_are_refused() {
        assert!(is_safe_name("web-1.a"));
        for bad in ["", ".", "..", "a/b", "A", "a b"] {
            assert!(!is_safe_name(bad), "{bad}");
        }
    }

    #[test]
    fn current_and_previous_instances_are_the_two_highest_attempts() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(instance_file(dir.path(), false), None);
        for n in [0, 2, 10] {
            std::fs::write(dir.path().join(format!("{n}.log")), "").expect("write");
        }
        assert_eq!(
            instance_file(dir.path(), false),
            Some(dir.path().join("10.log"))
        );
        assert_eq!(
            instance_file(dir.path(), true),
            Some(dir.path().join("2.log"))
        );
    }

    #[test]
    fn an_instance_whose_file_is_mid_rotation_is_still_the_current_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let current = dir.path().join("1.log");
        std::fs::write(dir.path().join("0.log"), "").expect("write");
        std::fs::write(&current, "").expect("write");
        assert!(!newer_instance_started(dir.path(), &current));
        // The writer renamed 1.log and has not opened the new one yet.
        std::fs::rename(&current, dir.path().join("1.log.20261126-201500")).expect("rename");
        assert!(!newer_instance_started(dir.path(), &current));
        // A restart: attempt 2 writes now.
        std::fs::write(dir.path().join("2.log"), "").expect("write");
        assert!(newer_instance_started(dir.path(), &current));
        assert!(newer_instance_started(
            dir.path(),
            &dir.path().join("0.log")
        ));
    }

    struct Collect(Vec<u8>);

    #[async_trait::async_trait]
    impl Sink for Collect {
        async fn write(&mut self, bytes: &[u8]) -> bool {
            self.0.extend_from_slice(bytes);
            true
        }
        async fn closed(&mut self) {
            std::future::pending::<()>().await
        }
    }

    /// Collects what is written and counts the writes.
    #[derive(Default)]
    struct CountWrites {
        bytes: Vec<u8>,
        writes: usize,
    }

    #[async_trait::async_trait]
    impl Sink for CountWrites {
        async fn write(&mut self, bytes: &[u8]) -> bool {
            self.bytes.extend_from_slice(bytes);
            self.writes += 1;
            true
        }
        async fn closed(&mut self) {
            std::future::pending::<()>().await
        }
    }

    async fn read_bytes(log: &[u8], query: &str) -> CountWrites {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("0.log");
        std::fs::write(&path, log).expect("write");
        let opts = LogOptions::parse(Some(query), now()).expect("valid");
        let mut sink = CountWrites::default();
        stream(&path, &opts, &mut sink, || false)
            .await
            .expect("stream");
        sink
    }

    async fn read(text: &str, query: &str) -> String {
        String::from_utf8(read_bytes(text.as_bytes(), query).await.bytes).expect("utf-8")
    }

    #[tokio::test]
    async fn bytes_that_are_not_utf8_pass_through_as_logged() {
        let log = b"2026-11-25T09:00:00.000000001Z stdout F \xff\xfe raw\n\
            2026-11-25T09:00:00.000000002Z stdout F after\n";
        let read = read_bytes(log, "").await;
        assert_eq!(read.bytes, b"\xff\xfe raw\nafter\n");
    }

    #[tokio::test]
    async fn a_large_log_goes_out_in_batches_not_a_write_per_line() {
        let log = records(0..20_000);
        let read = read_bytes(log.as_bytes(), "").await;
        assert_eq!(read.bytes, lines(0..20_000).as_bytes());
        // The head, then one write per full batch and the rest: not 20 000.
        let most = 2 + read.bytes.len() / BATCH_BYTES;
        assert!(
            read.writes <= most,
            "{} writes for {} bytes",
            read.writes,
            read.bytes.len()
        );
        // limitBytes still cuts inside the batch.
        let limited = read_bytes(log.as_bytes(), "limitBytes=100000").await;
        assert_eq!(limited.bytes, &lines(0..20_000).as_bytes()[..100_000]);
    }

    const LOG: &str = "2026-11-25T08:00:00.000000001Z stdout F one\n\
        2026-11-25T09:30:00.000000001Z stderr P tw\n\
        2026-11-25T09:30:00.000000002Z stderr F o\n\
        2026-11-25T09:40:00.000000001Z stdout F three\n\
        2026-11-25T09:50:00.000000001Z stdout F fo";

    #[tokio::test]
    async fn records_become_lines_filtered_as_asked() {
        assert_eq!(read(LOG, "").await, "one\ntwo\nthree\n");
        assert_eq!(read(LOG, "tailLines=1").await, "three\n");
        assert_eq!(read(LOG, "tailLines=0").await, "");
        assert_eq!(read(LOG, "tailLines=99").await, "one\ntwo\nthree\n");
        assert_eq!(read(LOG, "sinceSeconds=1200").await, "three\n");
        assert_eq!(read(LOG, "limitBytes=6").await, "one\ntw");
        assert_eq!(
            read(LOG, "timestamps=true&tailLines=1").await,
            "2026-11-25T09:40:00.000000001Z three\n"
        );
    }

    fn record(n: u32) -> String {
        format!("2026-11-25T09:00:00.000000001Z stdout F line {n}\n")
    }

    fn records(range: std::ops::Range<u32>) -> String {
        range.map(record).collect()
    }

    fn lines(range: std::ops::Range<u32>) -> String {
        range.map(|n| format!("line {n}\n")).collect()
    }

    #[tokio::test]
    async fn the_rotated_files_are_read_before_the_current_one_and_tails_span_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let current = dir.path().join("0.log");
        std::fs::write(dir.path().join("0.log.20261125-090000"), records(0..3)).expect("write");
        std::fs::write(dir.path().join("0.log.20261125-090100"), records(3..5)).expect("write");
        std::fs::write(&current, records(5..7)).expect("write");
        // Another instance's rotated file is not this one's.
        std::fs::write(dir.path().join("1.log.20261125-090000"), records(90..91)).expect("write");
        let read = |query: &'static str| {
            let current = current.clone();
            async move {
                let opts = LogOptions::parse(Some(query), now()).expect("valid");
                let mut sink = Collect(Vec::new());
                stream(&current, &opts, &mut sink, || false)
                    .await
                    .expect("stream");
                String::from_utf8(sink.0).expect("utf-8")
            }
        };
        assert_eq!(read("").await, lines(0..7));
        assert_eq!(read("tailLines=2").await, lines(5..7));
        assert_eq!(read("tailLines=3").await, lines(4..7));
        assert_eq!(read("tailLines=5").await, lines(2..7));
        assert_eq!(read("tailLines=50").await, lines(0..7));
    }

    /// The container's last lines land in a new file, rotated in right after the follower
    /// last looked for a rotation and before it saw the container stop: they are read.
    #[tokio::test]
    async fn a_rotation_between_the_last_look_and_the_stop_loses_no_line() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().expect("tempdir");
        let current = dir.path().join("0.log");
        std::fs::write(&current, records(0..3)).expect("write");
        let rotated = AtomicBool::new(false);
        let opts = LogOptions::parse(Some("follow=true"), now()).expect("valid");
        let mut sink = CountWrites::default();
        // Asked once the reader is at the end of the file: the writer rotates and the
        // container stops at that very moment.
        let running = || {
            if !rotated.swap(true, Ordering::SeqCst) {
                std::fs::rename(&current, dir.path().join("0.log.20261125-090000"))
                    .expect("rename");
                std::fs::write(&current, records(3..6)).expect("write");
            }
            false
        };
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            stream(&current, &opts, &mut sink, running),
        )
        .await
        .expect("the follower ends with the container")
        .expect("stream");
        assert_eq!(String::from_utf8(sink.bytes).expect("utf-8"), lines(0..6));
    }

    #[tokio::test]
    async fn a_follower_moves_to_the_new_file_when_the_current_one_is_rotated() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().expect("tempdir");
        let current = dir.path().join("0.log");
        std::fs::write(&current, records(0..2)).expect("write");
        let running = std::sync::Arc::new(AtomicBool::new(true));
        let follower = {
            let (current, running) = (current.clone(), running.clone());
            tokio::spawn(async move {
                let opts = LogOptions::parse(Some("follow=true"), now()).expect("valid");
                let mut sink = Collect(Vec::new());
                stream(&current, &opts, &mut sink, || {
                    running.load(Ordering::SeqCst)
                })
                .await
                .expect("stream");
                String::from_utf8(sink.0).expect("utf-8")
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        // Written just before the rename, as a writer does: the follower still reads them.
        let append = |path: &Path, text: String| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .expect("open");
            f.write_all(text.as_bytes()).expect("append");
        };
        append(&current, records(2..4));
        std::fs::rename(&current, dir.path().join("0.log.20261125-090000")).expect("rename");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        std::fs::write(&current, records(4..6)).expect("write");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        append(&current, records(6..7));
        std::fs::rename(&current, dir.path().join("0.log.20261125-090001")).expect("rename");
        std::fs::write(&current, records(7..8)).expect("write");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        running.store(false, Ordering::SeqCst);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), follower)
            .await
            .expect("the follower ends with the container")
            .expect("follower task");
        assert_eq!(got, lines(0..8));
    }

    /// A sink that hands every write to the test as it happens.
    struct Forward(tokio::sync::mpsc::UnboundedSender<Vec<u8>>);

    #[async_trait::async_trait]
    impl Sink for Forward {
        async fn write(&mut self, bytes: &[u8]) -> bool {
            self.0.send(bytes.to_vec()).is_ok()
        }
        async fn closed(&mut self) {
            std::future::pending::<()>().await
        }
    }

    fn inotify_descriptors_of_this_process() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| target.as_os_str() == "anon_inode:inotify")
            .count()
    }

    /// More `kubectl logs -f` than `fs.inotify.max_user_instances` (128 by default) follow
    /// on one inotify instance, and each gets the lines of its own log as they are written.
    /// With an instance per follower, those past the limit fell back to polling.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_hundred_followers_share_one_inotify_instance_and_each_gets_its_lines() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::Duration;
        const FOLLOWERS: usize = 200;
        let dir = tempfile::tempdir().expect("tempdir");
        let running = std::sync::Arc::new(AtomicBool::new(true));
        let mut followers = Vec::new();
        for n in 0..FOLLOWERS {
            // A container's log directory each, as the CRI layout has them.
            let log = dir.path().join(format!("c{n}")).join("0.log");
            std::fs::create_dir(dir.path().join(format!("c{n}"))).expect("mkdir");
            std::fs::write(&log, record(0)).expect("write");
            let (sink, received) = tokio::sync::mpsc::unbounded_channel();
            let running = running.clone();
            let task = {
                let log = log.clone();
                tokio::spawn(async move {
                    let opts = LogOptions::parse(Some("follow=true"), now()).expect("valid");
                    stream(&log, &opts, &mut Forward(sink), || {
                        running.load(Ordering::SeqCst)
                    })
                    .await
                })
            };
            followers.push((log, received, task));
        }
        // Each follower sends its head (and the line there) once its watch is set up.
        for (_, received, _) in &mut followers {
            let head = tokio::time::timeout(Duration::from_secs(10), received.recv()).await;
            assert_eq!(head.expect("a follower started").expect("head"), b"");
            let first = tokio::time::timeout(Duration::from_secs(5), received.recv()).await;
            assert_eq!(first.expect("the first line").expect("line"), b"line 0\n");
        }
        let held = inotify_descriptors_of_this_process();
        assert!(
            held < 10,
            "{held} inotify descriptors for {FOLLOWERS} followers"
        );
        for (log, _, _) in &followers {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(log)
                .expect("open");
            f.write_all(record(1).as_bytes()).expect("append");
        }
        for (n, (_, received, _)) in followers.iter_mut().enumerate() {
            let line = tokio::time::timeout(Duration::from_secs(5), received.recv()).await;
            let line = line.unwrap_or_else(|_| panic!("follower {n} got no new line"));
            assert_eq!(line.expect("line"), b"line 1\n", "follower {n}");
        }
        running.store(false, Ordering::SeqCst);
        for (n, (_, _, task)) in followers.into_iter().enumerate() {
            let ended = tokio::time::timeout(Duration::from_secs(5), task).await;
            let result = ended.unwrap_or_else(|_| panic!("follower {n} did not end"));
            result.expect("follower task").expect("stream");
        }
    }

    #[tokio::test]
    async fn a_reader_at_the_end_gives_its_buffers_back_and_goes_on_where_it_stopped() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("0.log");
        std::fs::write(&path, "a\nb\n").expect("write");
        let mut reader = LogReader::new(open_log(&path).expect("open"));
        let mut line = Vec::new();
        reader.read_until(b'\n', &mut line).await.expect("read");
        assert_eq!(line, b"a\n");
        // "b\n" is still buffered: nothing is given back.
        reader.release().await;
        assert!(!reader.is_bare(), "released a buffer holding unread bytes");
        line.clear();
        reader.read_until(b'\n', &mut line).await.expect("read");
        assert_eq!(line, b"b\n");
        line.clear();
        assert_eq!(reader.read_until(b'\n', &mut line).await.expect("read"), 0);
        // At the end: both buffers go back while the follower waits.
        reader.release().await;
        assert!(reader.is_bare(), "a waiting reader kept its buffers");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        file.write_all(b"c\nd").expect("append");
        reader.read_until(b'\n', &mut line).await.expect("read");
        assert_eq!(line, b"c\n");
        line.clear();
        // A line still being written is kept, and finished by the next read.
        reader.read_until(b'\n', &mut line).await.expect("read");
        assert_eq!(line, b"d");
        reader.release().await;
        file.write_all(b"e\n").expect("append");
        reader.read_until(b'\n', &mut line).await.expect("read");
        assert_eq!(line, b"de\n");
    }
}

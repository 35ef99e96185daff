//! `/containerLogs/{namespace}/{pod}/{container}`: kubelet's log endpoint over the CRI log
//! files (`<pod-logs-dir>/<ns>_<pod>_<uid>/<container>/<attempt>.log`, records parsed by
//! [`parse_record`]). Query parameters as kubelet's `PodLogOptions`: `follow`, `previous`,
//! `tailLines`, `sinceSeconds`, `sinceTime`, `timestamps`, `limitBytes`.
//!
//! The current instance is the highest-numbered file, `previous` the one before it. With
//! `follow`, the reader waits at the end of the file while the container runs and returns
//! once it no longer does (and the rest is read); a line still being written (no newline
//! yet) is only sent once whole.

use std::io::SeekFrom;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use ironlet_runtime::local::logs::parse_record;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, BufReader};

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
    let mut attempts: Vec<u64> = std::fs::read_dir(container_dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
        .collect();
    attempts.sort_unstable();
    let pick = if previous {
        attempts.iter().rev().nth(1)
    } else {
        attempts.last()
    };
    pick.map(|n| container_dir.join(format!("{n}.log")))
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

/// Formats one CRI record as kubelet does; `None` if it is not a record or is filtered out.
fn render(line: &str, opts: &LogOptions) -> Option<Vec<u8>> {
    let (_, partial, content) = parse_record(line)?;
    let ts = line.split(' ').next()?;
    if let Some(since) = opts.since {
        let at = DateTime::parse_from_rfc3339(ts).ok()?.with_timezone(&Utc);
        if at < since {
            return None;
        }
    }
    let mut out = Vec::with_capacity(content.len() + ts.len() + 2);
    if opts.timestamps {
        out.extend_from_slice(ts.as_bytes());
        out.push(b' ');
    }
    out.extend_from_slice(content.as_bytes());
    if !partial {
        out.push(b'\n');
    }
    Some(out)
}

/// Offset of the start of the last `lines` records of `file` (0 if it has fewer).
async fn tail_offset(file: &mut tokio::fs::File, lines: u64) -> std::io::Result<u64> {
    const CHUNK: u64 = 64 * 1024;
    let len = file.metadata().await?.len();
    if lines == 0 {
        return Ok(len);
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
                return Ok(start + i as u64 + 1);
            }
        }
        end = start;
    }
    Ok(0)
}

/// Streams `path` to `sink` with `opts`; `running` tells (polled at the end of the file)
/// whether the container still writes to it.
pub async fn stream<S: Sink, F: Fn() -> bool + Send>(
    path: &Path,
    opts: &LogOptions,
    sink: &mut S,
    running: F,
) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let mut file = tokio::fs::File::from_std(file);
    // The head goes out now: the request is accepted even if nothing is logged yet.
    if !sink.write(&[]).await {
        return Ok(());
    }
    let start = match opts.tail_lines {
        Some(n) => tail_offset(&mut file, n).await?,
        None => 0,
    };
    file.seek(SeekFrom::Start(start)).await?;
    let mut reader = BufReader::new(file);
    let mut sent = 0u64;
    let mut line = String::new();
    loop {
        let n = reader.read_line(&mut line).await?;
        if n > 0 && line.ends_with('\n') {
            let record = line.trim_end_matches('\n');
            if let Some(mut bytes) = render(record, opts) {
                if let Some(limit) = opts.limit_bytes {
                    let room = usize::try_from(limit - sent).unwrap_or(usize::MAX);
                    bytes.truncate(room);
                }
                sent += bytes.len() as u64;
                if !sink.write(&bytes).await {
                    return Ok(());
                }
                if opts.limit_bytes.is_some_and(|l| sent >= l) {
                    return Ok(());
                }
            }
            line.clear();
            continue;
        }
        // At the end (possibly with a line still being written, kept in `line`).
        if !opts.follow {
            return Ok(());
        }
        if !running() {
            // One last read for what the container wrote before it stopped.
            let more = reader.read_line(&mut line).await?;
            if more > 0 {
                continue;
            }
            return Ok(());
        }
        tokio::select! {
            () = sink.closed() => return Ok(()),
            () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
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

    async fn read(text: &str, query: &str) -> String {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("0.log");
        std::fs::write(&path, text).expect("write");
        let opts = LogOptions::parse(Some(query), now()).expect("valid");
        let mut sink = Collect(Vec::new());
        stream(&path, &opts, &mut sink, || false)
            .await
            .expect("stream");
        String::from_utf8(sink.0).expect("utf-8")
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
}

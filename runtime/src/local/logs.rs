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

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

/// containerd's default maximum log line size before splitting.
pub const MAX_LINE: usize = 16 * 1024;

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
}

/// A raw chunk of container output, for taps.
pub type OutputChunk = (LogStream, Vec<u8>);

/// Yields the tap to copy output to; asked once, when the first output arrives.
pub type TapSource = Box<dyn FnOnce() -> Option<mpsc::UnboundedSender<OutputChunk>> + Send>;

/// Appends CRI records to one file.
struct CriWriter {
    file: std::fs::File,
    path: PathBuf,
}

impl CriWriter {
    fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            file,
            path: path.to_owned(),
        })
    }

    fn record(&mut self, stream: LogStream, partial: bool, line: &[u8]) {
        let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let tag = if partial { "P" } else { "F" };
        let mut out = Vec::with_capacity(line.len() + 48);
        out.extend_from_slice(ts.as_bytes());
        out.push(b' ');
        out.extend_from_slice(stream.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(tag.as_bytes());
        out.push(b' ');
        out.extend_from_slice(line);
        out.push(b'\n');
        if let Err(err) = self.file.write_all(&out) {
            tracing::error!(path = ?self.path, %err, "writing container log failed");
        }
    }
}

/// Splits a byte stream into CRI records.
#[derive(Default)]
struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes; calls `emit(partial, line)` for each record that is complete.
    fn feed(&mut self, mut data: &[u8], emit: &mut impl FnMut(bool, &[u8])) {
        while let Some(nl) = data.iter().position(|&b| b == b'\n') {
            self.pending.extend_from_slice(&data[..nl]);
            self.flush_long(emit);
            emit(false, &self.pending);
            self.pending.clear();
            data = &data[nl + 1..];
        }
        self.pending.extend_from_slice(data);
        self.flush_long(emit);
    }

    fn flush_long(&mut self, emit: &mut impl FnMut(bool, &[u8])) {
        while self.pending.len() > MAX_LINE {
            emit(true, &self.pending[..MAX_LINE]);
            self.pending.drain(..MAX_LINE);
        }
    }

    fn finish(&mut self, emit: &mut impl FnMut(bool, &[u8])) {
        if !self.pending.is_empty() {
            emit(false, &self.pending);
            self.pending.clear();
        }
    }
}

/// Copies both pipes into the log file until both reach end of stream; tapped chunks go
/// to `tap` too. Returns when the container's last writer has closed its pipes.
pub async fn pump(
    log_path: PathBuf,
    stdout: OwnedFd,
    stderr: OwnedFd,
    mut tap_source: Option<TapSource>,
) {
    let mut tap = None;
    let mut writer = match CriWriter::open(&log_path) {
        Ok(w) => Some(w),
        Err(err) => {
            tracing::error!(path = ?log_path, %err, "cannot open container log; output is drained");
            None
        }
    };
    let (mut out, mut err) = match (pipe_reader(stdout), pipe_reader(stderr)) {
        (Ok(o), Ok(e)) => (Some(o), Some(e)),
        _ => {
            tracing::error!(path = ?log_path, "cannot read container output pipes");
            return;
        }
    };
    let mut splitters = [LineSplitter::default(), LineSplitter::default()];
    let mut buf_out = vec![0u8; 64 * 1024];
    let mut buf_err = vec![0u8; 64 * 1024];
    while out.is_some() || err.is_some() {
        let (stream, n) = tokio::select! {
            r = read_some(&mut out, &mut buf_out), if out.is_some() => (LogStream::Stdout, r),
            r = read_some(&mut err, &mut buf_err), if err.is_some() => (LogStream::Stderr, r),
        };
        let (idx, buf) = match stream {
            LogStream::Stdout => (0, &buf_out),
            LogStream::Stderr => (1, &buf_err),
        };
        let mut emit = |partial: bool, line: &[u8]| {
            if let Some(w) = writer.as_mut() {
                w.record(stream, partial, line);
            }
        };
        match n {
            Some(n) => {
                splitters[idx].feed(&buf[..n], &mut emit);
                if let Some(source) = tap_source.take() {
                    tap = source();
                }
                if let Some(tap) = &tap {
                    let _ = tap.send((stream, buf[..n].to_vec()));
                }
            }
            None => {
                splitters[idx].finish(&mut emit);
                match stream {
                    LogStream::Stdout => out = None,
                    LogStream::Stderr => err = None,
                }
            }
        }
    }
    // A container that wrote nothing still ends its tap: taking it closes the channel.
    if let Some(source) = tap_source.take() {
        drop(source());
    }
}

fn pipe_reader(fd: OwnedFd) -> std::io::Result<tokio::net::unix::pipe::Receiver> {
    tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
}

/// Reads once; `None` at end of stream or on error.
async fn read_some(
    reader: &mut Option<tokio::net::unix::pipe::Receiver>,
    buf: &mut [u8],
) -> Option<usize> {
    let r = reader.as_mut()?;
    match r.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// Parses one CRI log record into (stream, partial, content); used by `ctr logs` and tests.
pub fn parse_record(line: &str) -> Option<(&str, bool, &str)> {
    let mut parts = line.splitn(4, ' ');
    let _ts = parts.next()?;
    let stream = parts.next()?;
    let tag = parts.next()?;
    let content = parts.next().unwrap_or("");
    Some((stream, tag == "P", content))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<(bool, Vec<u8>)> {
        let mut s = LineSplitter::default();
        let mut out = Vec::new();
        let mut emit = |p: bool, l: &[u8]| out.push((p, l.to_vec()));
        for c in chunks {
            s.feed(c, &mut emit);
        }
        s.finish(&mut emit);
        out
    }

    #[test]
    fn lines_split_across_reads_are_joined() {
        let got = split(&[b"hel", b"lo\nwor", b"ld\n"]);
        assert_eq!(
            got,
            vec![(false, b"hello".to_vec()), (false, b"world".to_vec())]
        );
    }

    #[test]
    fn long_lines_become_partial_records_then_a_full_one() {
        let long = vec![b'x'; MAX_LINE * 2 + 10];
        let mut data = long.clone();
        data.push(b'\n');
        let got = split(&[&data]);
        assert_eq!(got.len(), 3);
        assert!(got[0].0 && got[1].0 && !got[2].0);
        assert_eq!(got.iter().map(|(_, l)| l.len()).sum::<usize>(), long.len());
    }

    #[test]
    fn an_unterminated_last_line_is_written_as_full() {
        let got = split(&[b"a\nb"]);
        assert_eq!(got, vec![(false, b"a".to_vec()), (false, b"b".to_vec())]);
    }

    #[test]
    fn records_parse_back() {
        let rec = "2026-11-22T10:00:00.000000001Z stderr P some text here";
        assert_eq!(parse_record(rec), Some(("stderr", true, "some text here")));
    }
}

//! `ironlet ctr logs [-f] ID`: prints a container's CRI log file as its output (stdout
//! records to stdout, stderr records to stderr), and with `-f` follows it until the
//! container has exited and its last lines are in the file.
//!
//! The file is read by offset and only whole records (ending in a newline) are printed, so
//! a record the pump is still writing is printed once it is complete, never torn. After the
//! exit, the pump (in the process that runs the container) may still be copying the last
//! lines: following ends once the file has not grown for [`QUIET`], at most
//! [`SETTLE_LIMIT`] after the exit.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use ironlet_runtime::local::logs::{open_log_for_reading, parse_record};
use ironlet_runtime::types::{ContainerState, ContainerStatus};
use ironlet_runtime::LocalRuntime;
use tokio::io::AsyncWriteExt;

use crate::cli::output::stdout_error;

/// How often a followed file is read again.
const POLL: Duration = Duration::from_millis(100);
/// After the exit: the file is complete once it has not grown for this long…
const QUIET: Duration = Duration::from_millis(300);
/// …or this long after the exit (the runtime's own bound on a pump's last writes).
const SETTLE_LIMIT: Duration = Duration::from_secs(2);

/// Reads a log file from where the last read stopped.
struct Reader<'a> {
    path: &'a Path,
    offset: u64,
    /// Bytes of a record whose newline is not in the file yet.
    pending: Vec<u8>,
}

impl Reader<'_> {
    /// Prints the whole records written since the last call; returns how many bytes were
    /// read (0: the file did not grow or does not exist yet).
    async fn print_new(&mut self) -> anyhow::Result<usize> {
        let mut bytes = Vec::new();
        match open_log_for_reading(self.path) {
            Ok(mut file) => {
                file.seek(SeekFrom::Start(self.offset))?;
                file.read_to_end(&mut bytes)
                    .with_context(|| format!("reading {}", self.path.display()))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        }
        self.offset += bytes.len() as u64;
        self.pending.extend_from_slice(&bytes);
        let Some(end) = self.pending.iter().rposition(|b| *b == b'\n') else {
            return Ok(bytes.len());
        };
        let complete: Vec<u8> = self.pending.drain(..=end).collect();
        print_records(&complete).await?;
        Ok(bytes.len())
    }

    /// Prints what is left (an unterminated last record of a file that is complete).
    async fn print_rest(&mut self) -> anyhow::Result<()> {
        let rest = std::mem::take(&mut self.pending);
        print_records(&rest).await
    }
}

async fn print_records(bytes: &[u8]) -> anyhow::Result<()> {
    let text = String::from_utf8_lossy(bytes);
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    for line in text.lines() {
        let Some((stream, partial, content)) = parse_record(line) else {
            continue;
        };
        let mut out = content.as_bytes().to_vec();
        if !partial {
            out.push(b'\n');
        }
        if stream == "stderr" {
            stderr.write_all(&out).await?;
        } else {
            stdout.write_all(&out).await.map_err(stdout_error)?;
        }
    }
    stdout.flush().await.map_err(stdout_error)?;
    stderr.flush().await?;
    Ok(())
}

/// Prints the container's logs; with `follow`, until it has exited.
pub async fn print(
    runtime: &LocalRuntime,
    status: &ContainerStatus,
    follow: bool,
) -> anyhow::Result<()> {
    let mut reader = Reader {
        path: &status.log_path,
        offset: 0,
        pending: Vec::new(),
    };
    reader.print_new().await?;
    if follow && status.state != ContainerState::Exited {
        let exited = runtime.wait(&status.id);
        tokio::pin!(exited);
        loop {
            tokio::select! {
                result = &mut exited => {
                    result.with_context(|| format!("waiting for {}", status.id.short()))?;
                    break;
                }
                () = tokio::time::sleep(POLL) => {
                    reader.print_new().await?;
                }
            }
        }
        let exited_at = Instant::now();
        let mut last_growth = Instant::now();
        while last_growth.elapsed() < QUIET && exited_at.elapsed() < SETTLE_LIMIT {
            tokio::time::sleep(POLL).await;
            if reader.print_new().await? > 0 {
                last_growth = Instant::now();
            }
        }
    }
    reader.print_rest().await
}

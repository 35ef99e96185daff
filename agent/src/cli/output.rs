//! The commands' standard output, and what happens when its reader goes away.
//!
//! `ironlet images ls | head -1`: the reader closes the pipe early, and the next write
//! fails with `EPIPE` (Rust ignores `SIGPIPE`, so the process is not killed by it).
//! Every command then stops writing and exits **quietly with status 0**: no message, no
//! backtrace. coreutils die by `SIGPIPE` instead, which a `set -o pipefail` script sees as
//! status 141 and treats as a failure although a reader stopping early is normal; exiting 0
//! keeps `ironlet … | head -1` working in such scripts. Only stdout is treated so: any
//! other write error (a full disk behind `>file`) is reported and fails the command.
//!
//! The long-running agent (`ironlet run`) never writes here; it keeps `SIGPIPE` ignored.

use std::io::Write;

/// The reader of stdout closed it: the command ends quietly with status 0.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed by its reader")]
pub struct StdoutClosed;

/// Maps a write error on stdout: a closed pipe becomes [`StdoutClosed`].
pub fn stdout_error(err: std::io::Error) -> anyhow::Error {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::Error::new(err).context("writing to stdout")
    }
}

/// Writes `args` to stdout (no newline added), flushing so a closed pipe is seen now.
pub fn print(args: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(stdout_error)
}

/// True when `err` means stdout's reader went away (the command succeeded as far as
/// anyone can read).
pub fn is_stdout_closed(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| cause.is::<StdoutClosed>())
}

/// `println!` that returns [`StdoutClosed`] instead of panicking on a closed pipe.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::output::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that returns [`StdoutClosed`] instead of panicking on a closed pipe.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::output::print(format_args!($($arg)*))
    };
}

pub(crate) use {out, outln};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_pipe_is_stdout_closed_and_other_errors_are_not() {
        let closed = stdout_error(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(is_stdout_closed(&closed));
        assert!(is_stdout_closed(&closed.context("listing images")));
        let full = stdout_error(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(!is_stdout_closed(&full));
        assert!(full.to_string().contains("stdout"), "{full}");
    }
}

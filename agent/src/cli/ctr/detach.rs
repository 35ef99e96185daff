//! `ironlet ctr run -d`: the container keeps running after the command returns.
//!
//! The runtime is in-process, so something must stay to pump the container's output into
//! its log file and record its exit (what conmon does for podman). `ctr run -d` starts the
//! same command line again as a *monitor*: a new session (no terminal, stdio on
//! `/dev/null`) that runs the container exactly as a foreground `ctr run` would, reports
//! `ok <id>` or `err <message>` through an inherited pipe once the container has started
//! or failed, and stays until the container exits (then removes it with `--rm`).
//!
//! Guarantees: the caller returns only after the container has started (it prints the
//! id, exit 0) or failed (it prints the monitor's error, exit 1); a monitor that dies
//! before reporting is an error too, never a silent success. The container, its logs and
//! its exit are then reachable with `ctr ps`, `ctr logs [-f]`, `ctr stop` and `ctr rm`
//! from any process. If the monitor itself is killed, the container keeps running but its
//! output has no reader any more (its next write gets `EPIPE`), as with a killed conmon.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context};
use ironlet_runtime::types::ContainerId;

/// Set in the monitor's environment: the number of its end of the report pipe.
const DETACH_FD_ENV: &str = "IRONLET_CTR_DETACH_FD";

/// In the caller of `ctr run -d`: starts the monitor with the same arguments, waits for its
/// report and prints the container id.
pub fn launch() -> anyhow::Result<ExitCode> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .context("creating the detach report pipe")?;
    let exe = std::env::current_exe().context("finding the ironlet binary")?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let fd = write.as_raw_fd();
    let mut cmd = Command::new(&exe);
    cmd.args(&args)
        .env(DETACH_FD_ENV, fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls (setsid, fcntl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut monitor = cmd
        .spawn()
        .with_context(|| format!("starting the detached monitor {}", exe.display()))?;
    drop(write);
    // One line, not up to end of file: the monitor's zygote (forked, not exec'd) and
    // the container keep copies of the pipe's write end.
    let mut report = String::new();
    BufReader::new(File::from(read))
        .read_line(&mut report)
        .context("reading the detached monitor's report")?;
    let report = report.trim_end();
    if let Some(id) = report.strip_prefix("ok ") {
        crate::cli::output::outln!("{id}")?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(message) = report.strip_prefix("err ") {
        bail!("{message}");
    }
    let status = monitor.wait().context("waiting for the detached monitor")?;
    bail!("the detached monitor ended ({status}) before starting the container")
}

/// In the monitor: the write end of the report pipe; reports once.
pub struct Reporter(Option<File>);

impl Reporter {
    /// The monitor's reporter, when this process was started by [`launch`].
    pub fn from_env() -> Option<Self> {
        let fd: RawFd = std::env::var(DETACH_FD_ENV).ok()?.parse().ok()?;
        // SAFETY: F_GETFD only queries; a number that is no open descriptor fails.
        if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return None;
        }
        // SAFETY: the descriptor is open, was inherited for this purpose and nothing else
        // in this process owns it; close-on-exec keeps it from programs exec'd from here
        // (the zygote, only forked, keeps a copy: the caller reads one line, not to EOF).
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            Some(Self(Some(File::from(OwnedFd::from_raw_fd(fd)))))
        }
    }

    /// The container runs: the caller prints its id and returns.
    pub fn started(&mut self, id: &ContainerId) {
        self.send(&format!("ok {id}\n"));
    }

    /// Ready (another command's detached agent): the caller prints `text` and returns.
    pub fn ready(&mut self, text: &str) {
        self.send(&format!("ok {}\n", text.replace('\n', " ")));
    }

    /// The run failed before the container started.
    pub fn failed(&mut self, err: &anyhow::Error) {
        let message = format!("{err:#}").replace('\n', " ");
        self.send(&format!("err {message}\n"));
    }

    fn send(&mut self, line: &str) {
        if let Some(mut pipe) = self.0.take() {
            // The caller may have been killed meanwhile; nobody else would read this.
            let _ = pipe.write_all(line.as_bytes());
        }
    }
}

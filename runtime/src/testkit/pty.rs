//! A command driven through a pseudo-terminal, as a person at a terminal would drive it
//! (`kubectl exec -it`, `ironlet ctr run -it`): it runs as the leader of a new session
//! whose controlling terminal is the pty's slave, so it sees a real terminal on its stdio
//! and gets `SIGWINCH` when the test resizes the window.
//!
//! Output is collected by a thread until the terminal closes; [`PtyChild::expect`] waits
//! for a string in it. Dropping a `PtyChild` kills the command (SIGKILL) and reaps it.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Something the pty driver could not do, or did not see in time.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error("pty: {0}")]
    Io(#[from] std::io::Error),
    #[error("timed out after {timeout:?} waiting for {want:?}; the terminal showed {seen:?}")]
    Timeout {
        want: String,
        timeout: Duration,
        seen: String,
    },
}

/// A command on a pseudo-terminal; see the module docs.
pub struct PtyChild {
    master: std::fs::File,
    child: Child,
    output: Arc<Mutex<Vec<u8>>>,
    /// Where [`Self::expect`] starts looking.
    mark: usize,
    /// The slave's path (`/dev/pts/N`), to read the terminal's settings.
    slave_path: std::path::PathBuf,
}

impl PtyChild {
    /// Starts `command` on a new terminal of `width`×`height` characters.
    pub fn spawn(mut command: Command, width: u16, height: u16) -> Result<Self, PtyError> {
        let pty = nix::pty::openpty(None, None).map_err(std::io::Error::from)?;
        crate::zygote::tty::set_window_size(&pty.master, width, height)?;
        let slave: OwnedFd = pty.slave;
        let stdio = |fd: &OwnedFd| -> Result<Stdio, PtyError> { Ok(Stdio::from(fd.try_clone()?)) };
        command
            .stdin(stdio(&slave)?)
            .stdout(stdio(&slave)?)
            .stderr(stdio(&slave)?);
        // SAFETY: only async-signal-safe calls (setsid, ioctl) between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let slave_path = std::fs::read_link(format!("/proc/self/fd/{}", slave.as_raw_fd()))?;
        let child = command.spawn()?;
        drop(slave);
        let master = std::fs::File::from(pty.master);
        let output = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone()?;
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once the command and its children closed the terminal.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut out) = sink.lock() {
                    out.extend_from_slice(&buf[..n]);
                }
            }
        });
        Ok(Self {
            master,
            child,
            output,
            mark: 0,
            slave_path,
        })
    }

    /// Types `input` (a terminal in raw mode passes it as is; end lines with `\r`).
    pub fn send(&mut self, input: &str) -> Result<(), PtyError> {
        self.master.write_all(input.as_bytes())?;
        Ok(())
    }

    /// Waits until the output after the last match contains `want`; returns what came
    /// before it and moves past it.
    pub fn expect(&mut self, want: &str, timeout: Duration) -> Result<String, PtyError> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let out = self
                    .output
                    .lock()
                    .map_err(|_| std::io::Error::other("the pty reader panicked"))?;
                let text = String::from_utf8_lossy(&out[self.mark.min(out.len())..]).into_owned();
                if let Some(at) = text.find(want) {
                    self.mark += text[..at + want.len()].len();
                    return Ok(text[..at].to_owned());
                }
                if Instant::now() >= deadline {
                    return Err(PtyError::Timeout {
                        want: want.to_owned(),
                        timeout,
                        seen: text,
                    });
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the terminal showed so far.
    pub fn seen(&self) -> String {
        self.output
            .lock()
            .map(|out| String::from_utf8_lossy(&out).into_owned())
            .unwrap_or_default()
    }

    /// Resizes the window; the command gets `SIGWINCH`.
    pub fn resize(&self, width: u16, height: u16) -> Result<(), PtyError> {
        crate::zygote::tty::set_window_size(&self.master, width, height)?;
        Ok(())
    }

    /// Waits for the command to exit, at most `timeout`; `None` if it still runs.
    pub fn wait(&mut self, timeout: Duration) -> Result<Option<ExitStatus>, PtyError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The terminal's local modes as the command left them (`ICANON` and `ECHO` are off
    /// in raw mode).
    pub fn local_flags(&self) -> Result<nix::sys::termios::LocalFlags, PtyError> {
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOCTTY)
            .open(&self.slave_path)?;
        let termios = nix::sys::termios::tcgetattr(&slave).map_err(std::io::Error::from)?;
        Ok(termios.local_flags)
    }
}

impl Drop for PtyChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Running a command in a running container: `exec_sync` collects its output and exit code
//! (CRI `ExecSync`, used by exec probes and `ironlet ctr exec`); `exec` hands its stdio out
//! as streams (CRI `Exec`, for `kubectl exec`).
//!
//! Both ask the zygote for a libcontainer tenant process whose stdout and stderr (and, for a
//! streaming exec with stdin, stdin) are pipes, and learn its exit code from the zygote's
//! exit event for its exec id. A streaming exec whose session is dropped before the exit
//! kills the process and its descendants; the exit event still arrives and clears the
//! waiter.

use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;

use super::attach::PtyMaster;
use super::{not_found, Inner};
use crate::error::RuntimeError;
use crate::types::{
    ContainerId, ContainerState, ExecExit, ExecOutput, ExecReader, ExecRequest, ExecSession,
    ExecWriter,
};
use crate::zygote::{ExecHandle, ExecProcess};

/// Output beyond this is dropped (the process still runs to completion): exec is for
/// probes and short commands, not for streaming.
const MAX_EXEC_OUTPUT: usize = 16 * 1024 * 1024;

/// A started exec process and the receiver of its exit code.
struct Started {
    exec_id: String,
    handle: ExecHandle,
    exit: oneshot::Receiver<i32>,
}

impl Inner {
    /// Starts `cmd` in running container `id`; the exit code arrives on `Started::exit`.
    async fn start_exec(
        &self,
        id: &ContainerId,
        cmd: &[String],
        stdin: bool,
        tty: bool,
    ) -> Result<Started, RuntimeError> {
        if cmd.is_empty() {
            return Err(RuntimeError::InvalidConfig("exec needs a command".into()));
        }
        let exec_id = ContainerId::random().to_string();
        let (tx, exit) = oneshot::channel();
        {
            let mut state = self.lock();
            let entry = state
                .containers
                .get(id)
                .ok_or_else(|| not_found("container", id.as_str()))?;
            let st = entry.record.phase.state();
            if st != ContainerState::Running {
                return Err(RuntimeError::IncorrectState {
                    id: id.clone(),
                    state: st,
                    action: "exec",
                });
            }
            state.exec_waiters.insert(exec_id.clone(), tx);
        }
        let asked = std::time::Instant::now();
        let started = self
            .zygote
            .exec(
                id.as_str(),
                ExecProcess {
                    exec_id: exec_id.clone(),
                    state_root: self.config.libcontainer_root(),
                    bundle: self.container_dir(id),
                    args: cmd.to_vec(),
                    env: Vec::new(),
                    cwd: None,
                    stdin,
                    tty,
                },
            )
            .await;
        tracing::debug!(container_id = %id, zygote = ?asked.elapsed(), ok = started.is_ok(), "exec process started by the zygote");
        match started {
            Ok(handle) => Ok(Started {
                exec_id,
                handle,
                exit,
            }),
            Err(e) => {
                self.lock().exec_waiters.remove(&exec_id);
                Err(RuntimeError::Exec {
                    id: id.clone(),
                    message: e.to_string(),
                })
            }
        }
    }

    pub(crate) async fn exec_sync(
        &self,
        id: &ContainerId,
        cmd: &[String],
        timeout: Option<Duration>,
    ) -> Result<ExecOutput, RuntimeError> {
        let Started {
            exec_id,
            handle,
            exit,
        } = self.start_exec(id, cmd, false, false).await?;
        let pid = handle.pid;
        let run = async {
            let (stdout, stderr) = tokio::join!(read_all(handle.stdout), read_all(handle.stderr));
            let exit_code = exit.await.unwrap_or(-1);
            ExecOutput {
                stdout,
                stderr,
                exit_code,
            }
        };
        match timeout {
            None => Ok(run.await),
            Some(limit) => match tokio::time::timeout(limit, run).await {
                Ok(out) => Ok(out),
                Err(_) => {
                    // Kill the exec process; its exit is still reaped by the zygote.
                    if let Ok(fd) = crate::zygote::sys::pidfd_open(pid) {
                        let _ = crate::zygote::sys::pidfd_send_signal(&fd, libc::SIGKILL);
                    }
                    self.lock().exec_waiters.remove(&exec_id);
                    Err(RuntimeError::ExecTimeout {
                        id: id.clone(),
                        seconds: limit.as_secs(),
                    })
                }
            },
        }
    }

    pub(crate) async fn exec(
        &self,
        id: &ContainerId,
        request: &ExecRequest,
    ) -> Result<ExecSession, RuntimeError> {
        let Started { handle, exit, .. } = self
            .start_exec(id, &request.cmd, request.stdin, request.tty)
            .await?;
        let ExecHandle {
            pid,
            stdin,
            stdout,
            stderr,
        } = handle;
        // Opened now, while the process surely lives: the kill later can't hit a reused pid.
        let pidfd = crate::zygote::sys::pidfd_open(pid).ok();
        let exec_err = |what: &str, e: std::io::Error| RuntimeError::Exec {
            id: id.clone(),
            message: format!("{what} pipe: {e}"),
        };
        let container = id.clone();
        let kill = move || {
            tracing::info!(container_id = %container, pid, "killing an exec process nobody waits for");
            kill_tree(pid, pidfd.as_ref());
        };
        let exit = ExecExit::new(exit, kill);
        if request.tty {
            return self.exec_on_terminal(id, stdin, stdout, stderr, exit);
        }
        let stdin: Option<ExecWriter> = match stdin {
            Some(fd) => Some(Box::new(
                tokio::net::unix::pipe::Sender::from_owned_fd(fd)
                    .map_err(|e| exec_err("stdin", e))?,
            )),
            None => None,
        };
        let reader = |fd: OwnedFd, what: &str| -> Result<ExecReader, RuntimeError> {
            Ok(Box::new(
                tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
                    .map_err(|e| exec_err(what, e))?,
            ))
        };
        let (stdout, stderr) = (reader(stdout, "stdout")?, reader(stderr, "stderr")?);
        Ok(ExecSession {
            stdin,
            stdout,
            stderr,
            exit,
            resize: None,
        })
    }

    /// The session of an exec on its own terminal: `master` is its output, `stdin` a copy
    /// of the master, `stderr` empty.
    fn exec_on_terminal(
        &self,
        id: &ContainerId,
        stdin: Option<OwnedFd>,
        master: OwnedFd,
        stderr: OwnedFd,
        exit: ExecExit,
    ) -> Result<ExecSession, RuntimeError> {
        let exec_err = |e: std::io::Error| RuntimeError::Exec {
            id: id.clone(),
            message: format!("terminal: {e}"),
        };
        let resize_fd = std::sync::Arc::new(master.try_clone().map_err(exec_err)?);
        let stdin: Option<ExecWriter> = match stdin {
            Some(fd) => Some(Box::new(PtyMaster::new(fd).map_err(exec_err)?)),
            None => None,
        };
        let stdout: ExecReader = Box::new(PtyMaster::new(master).map_err(exec_err)?);
        let stderr: ExecReader =
            Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd(stderr).map_err(exec_err)?);
        Ok(ExecSession {
            stdin,
            stdout,
            stderr,
            exit,
            resize: Some(super::attach::resizer(resize_fd)),
        })
    }
}

/// SIGKILLs process `pid` (through `pidfd`, immune to pid reuse) and every descendant it
/// has: a `sh -c` exec leaves its children behind otherwise, reparented to the container's
/// init. Descendants are found first and each pinned with its own pidfd, so killing the
/// parent (which reparents them) doesn't lose them.
fn kill_tree(pid: i32, pidfd: Option<&OwnedFd>) {
    let Some(pidfd) = pidfd else {
        return;
    };
    let descendants: Vec<OwnedFd> = descendants(pid)
        .into_iter()
        .filter_map(|child| crate::zygote::sys::pidfd_open(child).ok())
        .collect();
    let _ = crate::zygote::sys::pidfd_send_signal(pidfd, libc::SIGKILL);
    for fd in &descendants {
        let _ = crate::zygote::sys::pidfd_send_signal(fd, libc::SIGKILL);
    }
}

/// Every process below `root`, from each process's parent pid in `/proc/<pid>/stat`.
fn descendants(root: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(i32, i32)> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent_pid(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// Field 4 of `/proc/<pid>/stat` (after the parenthesised command name).
fn parent_pid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

async fn read_all(fd: OwnedFd) -> Vec<u8> {
    let mut out = Vec::new();
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return out;
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = MAX_EXEC_OUTPUT.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_finds_children_and_grandchildren_not_the_root() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .expect("spawning sh");
        let root = i32::try_from(child.id()).expect("pid fits");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut found = Vec::new();
        while std::time::Instant::now() < deadline {
            found = descendants(root);
            if found.len() >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let own = std::process::id() as i32;
        let parent = parent_pid(root);
        let _ = child.kill();
        for pid in &found {
            // SAFETY: plain kill(2) of the test's own grandchildren.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        let _ = child.wait();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(!found.contains(&root) && !found.contains(&own));
        assert_eq!(parent, Some(own));
    }
}

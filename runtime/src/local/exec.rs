//! `exec_sync`: run a command in a running container and collect its output and exit code
//! (CRI `ExecSync`, used by exec probes and `ironlet ctr exec`).

use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;

use super::{not_found, Inner};
use crate::error::RuntimeError;
use crate::types::{ContainerId, ContainerState, ExecOutput};
use crate::zygote::ExecProcess;

/// Output beyond this is dropped (the process still runs to completion): exec is for
/// probes and short commands, not for streaming.
const MAX_EXEC_OUTPUT: usize = 16 * 1024 * 1024;

impl Inner {
    pub(crate) async fn exec_sync(
        &self,
        id: &ContainerId,
        cmd: &[String],
        timeout: Option<Duration>,
    ) -> Result<ExecOutput, RuntimeError> {
        if cmd.is_empty() {
            return Err(RuntimeError::InvalidConfig("exec needs a command".into()));
        }
        let exec_id = ContainerId::random().to_string();
        let (tx, rx) = oneshot::channel();
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
        let handle = match self
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
                },
            )
            .await
        {
            Ok(h) => h,
            Err(e) => {
                self.lock().exec_waiters.remove(&exec_id);
                return Err(RuntimeError::Exec {
                    id: id.clone(),
                    message: e.to_string(),
                });
            }
        };
        let pid = handle.pid;
        let run = async {
            let (stdout, stderr) = tokio::join!(read_all(handle.stdout), read_all(handle.stderr));
            let exit_code = rx.await.unwrap_or(-1);
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

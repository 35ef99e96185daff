//! The zygote: the single-threaded helper process in which every libcontainer call runs.
//!
//! libcontainer clones processes and changes the process-wide working directory during
//! create/start; doing that from a multi-threaded tokio process is unsafe (only
//! async-signal-safe code may run in a child forked from threads) and was seen to hang
//! containers. So the binary calls [`spawn`] first thing in `main`, before any thread
//! exists; the zygote forks one short-lived worker per call (`start` excepted, see
//! `server`) and reaps every container process through pidfds. The agent talks to it with a [`ZygoteClient`].
//!
//! Under `ironlet run` the zygote loop is the supervisor itself (see
//! [`crate::supervisor`]) and the agent connects to it through an inherited socket.
//!
//! Start with [`spawn`]; `server` documents the zygote's guarantees.

mod calls;
pub mod cgroup_view;
mod client;
mod exec_process;
pub mod exits;
mod holder;
mod join;
pub mod pod_mounts;
pub(crate) mod protocol;
mod reaper;
pub mod seccomp;
pub(crate) mod server;
pub(crate) mod sys;
pub mod tty;
mod userns;
mod worker;

use std::os::fd::OwnedFd;

pub use client::{ContainerStdio, CreateStdio, ExecHandle, ExecProcess, ZygoteClient};
pub use holder::{holder_id, NETWORK_FAILED, NETWORK_READY};
pub use protocol::{Event, Hello, LiveProcess, WireExit, PROTOCOL_VERSION};
pub use sys::process_start_time;

#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    #[error(
        "the zygote must be spawned before any other thread starts ({threads} threads running)"
    )]
    Threaded { threads: usize },
    #[error("spawning the zygote: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("zygote socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("encoding a zygote message: {0}")]
    Encode(String),
    #[error("decoding a zygote message: {0}")]
    Decode(String),
    #[error("the zygote has exited")]
    Gone,
    #[error("{0}")]
    Failed(String),
    #[error("unexpected zygote reply: {0}")]
    Unexpected(String),
    #[error(
        "the supervisor speaks protocol {theirs}, this agent {ours}: restart the supervisor \
         (stop it, then start the new binary) to upgrade across this change"
    )]
    Protocol { theirs: u32, ours: u32 },
}

/// The agent's end of a freshly spawned zygote; turn it into a [`ZygoteClient`] inside a
/// tokio runtime.
#[derive(Debug)]
pub struct ZygoteHandle {
    pub(crate) sock: OwnedFd,
    pub pid: i32,
}

/// Forks the zygote. Must be called while the process is single-threaded (first thing in
/// `main`, or in a test harness before it starts threads).
pub fn spawn() -> Result<ZygoteHandle, ZygoteError> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map_err(ZygoteError::Spawn)?
        .count();
    if threads != 1 {
        return Err(ZygoteError::Threaded { threads });
    }
    let (agent_end, zygote_end) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| ZygoteError::Spawn(e.into()))?;
    // SAFETY: checked above that no other thread exists.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(agent_end);
            server::serve(zygote_end)
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(zygote_end);
            Ok(ZygoteHandle {
                sock: agent_end,
                pid: child.as_raw(),
            })
        }
        Err(e) => Err(ZygoteError::Spawn(e.into())),
    }
}

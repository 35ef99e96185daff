//! The wire protocol between the agent (a tokio process) and the zygote.
//!
//! Messages are JSON documents, one per `SOCK_SEQPACKET` datagram, so framing is the
//! kernel's. File descriptors (log pipes) travel beside a message as `SCM_RIGHTS`.
//! Requests carry a client-chosen `seq`; the zygote answers each with exactly one
//! [`Reply`] of the same `seq`, in any order. [`Event`]s (process exits) are unsolicited.
//!
//! A connection starts with [`Request::Hello`]. Under a supervisor the agent's connection
//! is one of many over the supervisor's life (one per agent run), so the answer tells the
//! agent what outlived its predecessor: live container processes and held log pipes.
//!
//! Compatibility: after an upgrade in place the supervisor keeps running the old code while
//! the agent runs the new one. [`PROTOCOL_VERSION`] changes whenever a message changes
//! incompatibly; an agent refuses a supervisor with another version (see
//! `docs/CRASH_SAFETY.md`). Adding a variant is incompatible for the side that receives it.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};

use super::ZygoteError;

/// Largest message either side sends; exec output never travels inline (it uses pipes).
pub(crate) const MAX_MESSAGE: usize = 256 * 1024;
/// At most this many descriptors ride along one message.
const MAX_FDS: usize = 4;

/// The version of this protocol; see the module docs.
pub const PROTOCOL_VERSION: u32 = 3;

/// What the agent asks of the zygote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Create a container from a bundle (libcontainer `as_init().build()`); its init waits
    /// for `Start`. Reply: [`Reply::Created`] with the read ends of stdout and stderr pipes,
    /// then, with `tty`, the pty master (the container's output reaches the stdout pipe
    /// through the zygote's relay; stderr ends at once), else with `stdin` the write end
    /// of its stdin pipe. The zygote keeps its own copies (see [`Request::TakeLogs`]).
    Create {
        id: String,
        bundle: PathBuf,
        state_root: PathBuf,
        /// Added after version 2 without a version change (an older zygote ignores them and
        /// replies with two descriptors, which the client reports as unsupported).
        #[serde(default)]
        stdin: bool,
        #[serde(default)]
        tty: bool,
        /// The runtime's root, bound onto itself: the worker detaches other pods' mounts
        /// under it (`pod_mounts.rs`). Absent: nothing is detached.
        #[serde(default)]
        pod_mounts_root: Option<PathBuf>,
    },
    /// Let a created container's init exec the user process.
    Start { id: String, state_root: PathBuf },
    /// Signal a container's init through the pidfd the zygote holds.
    Kill { id: String, signal: i32 },
    /// Delete libcontainer's state and cgroups of a stopped container.
    Delete {
        id: String,
        state_root: PathBuf,
        force: bool,
    },
    /// Run a process in a running container (libcontainer tenant). Reply: [`Reply::Execd`]
    /// with the stdout and stderr read ends and, with `stdin`, the write end of the
    /// process's stdin (else it reads `/dev/null`); the exit arrives as an
    /// [`Event::Exited`] with `exec_id`. With `tty` the process runs on a new terminal:
    /// "stdout" is its pty master, "stderr" ends at once, "stdin" is the master again.
    Exec {
        id: String,
        exec_id: String,
        /// Added after version 2 without a version change: an older zygote ignores it and
        /// replies with two descriptors, which the client reports as unsupported.
        #[serde(default)]
        stdin: bool,
        /// Added like `stdin`; an older zygote's stdout is then not a terminal.
        #[serde(default)]
        tty: bool,
        state_root: PathBuf,
        /// The container's bundle, for its precompiled seccomp profile.
        bundle: PathBuf,
        args: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<PathBuf>,
    },
    /// Create network, IPC and UTS namespaces held by bind mounts under `dir`.
    CreateNamespaces {
        dir: PathBuf,
        hostname: String,
        net: bool,
        ipc: bool,
        uts: bool,
        /// The pod's network is IPv4 only: links made in the new network namespace (the
        /// pod's `eth0`) get no IPv6 (`default.disable_ipv6`); `lo` keeps `::1`.
        #[serde(default)]
        ipv4_only: bool,
    },
    /// Rootless: start the process holding a pod's user, network, IPC and UTS namespaces,
    /// with pasta connecting the network (see `holder.rs`). Reply: [`Reply::Created`] once
    /// pasta has configured the namespace; the holder is watched like a started container.
    CreatePodNetwork {
        id: String,
        /// The sandbox directory: pasta's pid file and log, the pod's address (`pod-ip`).
        dir: PathBuf,
        hostname: String,
        /// `(container id, host id, size)` of the user namespace's uid and gid maps.
        uids: Vec<(u32, u32, u32)>,
        gids: Vec<(u32, u32, u32)>,
        ipc: bool,
        /// pasta and its arguments, without the target pid (the holder appends its own).
        pasta: Vec<String>,
    },
    /// Re-adopt a running container process (after a client restart): watch `pid` again if
    /// its start time still matches.
    Adopt {
        id: String,
        pid: i32,
        start_time: u64,
    },
    /// Remember an exit durably under this directory (`<dir>/<id>.json`).
    SetExitDir { dir: PathBuf },
    /// The first request of a connection. Answered with [`Reply::Hello`] once every worker
    /// started for an earlier connection has finished, so the answer is a settled state.
    Hello,
    /// A copy of the read ends of container `id`'s stdout and stderr pipes, which the zygote
    /// keeps until [`Request::ReleaseLogs`]. Reply: [`Reply::Logs`] with two descriptors,
    /// and a third for a container created with a tty (its master) or stdin (the write end).
    TakeLogs { id: String },
    /// The caller has drained container `id`'s output to end of stream (or removed the
    /// container): the zygote closes its copies of the log pipes.
    ReleaseLogs { id: String },
    /// Close the zygote's copy of container `id`'s stdin write end (`stdinOnce` after the
    /// first attach): once the callers close theirs, the container reads end-of-file.
    CloseStdin { id: String },
}

/// The zygote's answer to one request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    Created {
        pid: i32,
        start_time: u64,
    },
    Execd {
        pid: i32,
    },
    Done,
    Failed {
        message: String,
    },
    Hello(Hello),
    /// The stdout and stderr read ends travel beside this reply.
    Logs,
}

/// What the zygote tells a newly connected client.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Hello {
    /// The zygote's [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// Whether the zygote is a supervisor that outlives its clients (`ironlet run`), rather
    /// than the private zygote of one process (`ironlet ctr`, tests).
    pub supervised: bool,
    /// Container init processes the zygote watches (and will reap).
    pub live: Vec<LiveProcess>,
    /// Containers whose log pipes the zygote holds (running, or exited and not drained).
    pub held_logs: Vec<String>,
}

/// A container init process a zygote watches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveProcess {
    pub id: String,
    pub pid: i32,
    /// Clock ticks since boot (`/proc/<pid>/stat` field 22), the pid reuse guard.
    pub start_time: u64,
}

/// Something that happened without being asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Event {
    /// A watched process ended and was reaped. `exec_id` is set for exec processes.
    Exited {
        id: String,
        exec_id: Option<String>,
        pid: i32,
        status: WireExit,
        /// Wall-clock time of the reap, in nanoseconds since the epoch.
        at_unix_nanos: u128,
    },
}

/// How a process ended, on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireExit {
    Code(i32),
    Signal(i32),
    /// The process ended but was not the reaper's child (it was re-adopted after a
    /// supervisor restart), so its status is unknowable.
    Unknown,
}

/// A message from the agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub seq: u64,
    pub request: Request,
}

/// A message from the zygote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Inbound {
    Reply { seq: u64, reply: Reply },
    Event(Event),
}

/// Sends one message with descriptors; blocks on a blocking socket, returns `EAGAIN` on a
/// non-blocking one.
pub(crate) fn send_message<T: Serialize>(
    sock: RawFd,
    msg: &T,
    fds: &[RawFd],
) -> Result<(), ZygoteError> {
    let bytes = serde_json::to_vec(msg).map_err(|e| ZygoteError::Encode(e.to_string()))?;
    if bytes.len() > MAX_MESSAGE {
        return Err(ZygoteError::Encode(format!(
            "message of {} bytes exceeds {MAX_MESSAGE}",
            bytes.len()
        )));
    }
    let iov = [IoSlice::new(&bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(sock, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(ZygoteError::Socket(std::io::Error::from(e))),
        }
    }
}

/// Receives one message and its descriptors. `Ok(None)` means the peer hung up.
pub(crate) fn recv_message<T: for<'de> Deserialize<'de>>(
    sock: RawFd,
    buf: &mut [u8],
) -> Result<Option<(T, Vec<OwnedFd>)>, ZygoteError> {
    let mut cmsg_space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (len, fds) = loop {
        let mut iov = [std::io::IoSliceMut::new(buf)];
        match recvmsg::<()>(
            sock,
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for cmsg in msg.cmsgs().map_err(|e| ZygoteError::Socket(e.into()))? {
                    if let ControlMessageOwned::ScmRights(raw) = cmsg {
                        // SAFETY: the kernel just installed these descriptors for us.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                if msg.flags.contains(MsgFlags::MSG_TRUNC) {
                    return Err(ZygoteError::Decode("message truncated".into()));
                }
                break (msg.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(ZygoteError::Socket(std::io::Error::from(e))),
        }
    };
    if len == 0 {
        return Ok(None);
    }
    let msg =
        serde_json::from_slice(&buf[..len]).map_err(|e| ZygoteError::Decode(e.to_string()))?;
    Ok(Some((msg, fds)))
}

/// Raw descriptor numbers of a list of owned descriptors, for [`send_message`].
pub(crate) fn raw_fds(fds: &[OwnedFd]) -> Vec<RawFd> {
    fds.iter().map(AsRawFd::as_raw_fd).collect()
}

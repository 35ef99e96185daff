//! The supervisor: one small process per node that outlives the agent, so that killing or
//! upgrading the agent never kills a container, loses an exit code or a log line (DESIGN.md
//! decision 2). `ironlet run` starts as the supervisor; the agent is its child.
//!
//! ```text
//!  ironlet run  (supervisor = the zygote loop; single-threaded, no tokio, child subreaper)
//!   ├─ ironlet run  (the agent: tokio; IRONLET_SUPERVISOR_FD = its end of a socket pair)
//!   │    restarted after a crash (100 ms doubling to 10 s), re-exec'd from disk on SIGHUP
//!   ├─ worker       (one libcontainer call each, then exits)
//!   └─ container init processes (reparented here; reaped through pidfds)
//!        stdout/stderr pipes: the supervisor keeps a read end until the agent has drained
//!        them, and hands copies (SCM_RIGHTS) to every new agent
//! ```
//!
//! Guarantees (the mechanisms live in `crate::zygote` and `crate::local`):
//! - The supervisor is the parent of every container init, so it reaps every exit and
//!   writes it to `<root>/exits/<id>.json` (temp + fsync + rename) before telling the agent;
//!   an agent that was down reads them on start.
//! - An agent crash closes only the agent's copies of the log pipes: containers keep
//!   writing into the pipes (1 MiB each), then block, and never get SIGPIPE. The next agent
//!   gets the pipes again and continues the log files where the last one stopped.
//! - Signals: SIGTERM/SIGINT stop the agent (SIGTERM, SIGKILL after the grace period) and
//!   then the supervisor; containers keep running. SIGHUP stops the agent and starts it
//!   again at once from the binary path on disk (upgrade in place). The supervisor itself
//!   keeps running the code it started with; restart it (stop + start, re-adopting) to
//!   upgrade it.
//! - SIGPWR (a power failure or an imminent shutdown, from init or whoever stops the node)
//!   is passed to the running agent, and every agent started afterwards gets
//!   `IRONLET_NODE_SHUTDOWN=1`: the agent's graceful node shutdown stops the pods (when
//!   `--shutdown-grace-period` is set). The supervisor itself keeps running until stopped.
//! - One supervisor per data root: it holds an exclusive lock on `<root>/supervisor.lock`.
//!
//! Current behaviour when the supervisor itself dies (SIGKILL, OOM): containers keep
//! running, reparented to PID 1; the agent gets SIGTERM (parent-death signal) and stops.
//! The next `ironlet run` re-adopts running containers by pid and start time. What is lost:
//! exit codes of containers that end before or after that (they are not its children; they
//! are reported as exit code 137, reason `Error`), and the log pipes: once the agent is gone
//! a container's next write to stdout/stderr fails with EPIPE, and the default SIGPIPE
//! action ends the container. See `docs/CRASH_SAFETY.md`.

pub(crate) mod agent;
mod process;

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

pub use agent::BackoffConfig;
pub(crate) use process::{Supervisor, SupervisorSource};

use crate::zygote::{ZygoteError, ZygoteHandle};

/// Carries the number of the agent's inherited socket; set by the supervisor only.
pub const SUPERVISOR_FD_ENV: &str = "IRONLET_SUPERVISOR_FD";

/// Set (to `1`) for agents started after the supervisor received SIGPWR: the node is
/// shutting down.
pub const NODE_SHUTDOWN_ENV: &str = "IRONLET_NODE_SHUTDOWN";

/// Why the supervisor could not start.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("the supervisor must start before any other thread ({threads} threads running)")]
    Threaded { threads: usize },
    #[error("creating {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another ironlet supervisor holds {path}")]
    Locked { path: PathBuf },
    #[error("locking {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("setting up signal handling: {0}")]
    Signals(#[source] std::io::Error),
    #[error("argument or environment entry with a NUL byte: {0:?}")]
    Argument(String),
    #[error("starting the agent: {0}")]
    Spawn(#[source] std::io::Error),
}

/// How the supervisor runs the agent.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// The data root: the lock and the exit records live under it.
    pub root_dir: PathBuf,
    /// The binary the agent runs, read from disk at every start (so SIGHUP after replacing
    /// it upgrades the agent).
    pub agent_binary: PathBuf,
    /// The agent's arguments, `argv[0]` included (normally the supervisor's own).
    pub agent_args: Vec<OsString>,
    pub backoff: BackoffConfig,
    /// How long a stopping agent gets between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
}

impl SupervisorConfig {
    /// The current binary and arguments, default back-off and a 30 s stop grace.
    pub fn for_current_process(root_dir: PathBuf) -> std::io::Result<Self> {
        Ok(Self {
            root_dir,
            agent_binary: std::env::current_exe()?,
            agent_args: std::env::args_os().collect(),
            backoff: BackoffConfig::default(),
            stop_grace: Duration::from_secs(30),
        })
    }
}

/// Becomes the supervisor: takes the root's lock, becomes child subreaper, starts the
/// agent and runs the zygote loop until stopped, then exits the process. Must be called
/// while the process is single-threaded. Returns only if setting up failed.
pub fn run(config: SupervisorConfig) -> Result<std::convert::Infallible, SupervisorError> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0);
    if threads != 1 {
        return Err(SupervisorError::Threaded { threads });
    }
    let exit_dir = config.root_dir.join("exits");
    crate::fsutil::private_dir(&exit_dir).map_err(|source| SupervisorError::CreateDir {
        path: exit_dir.clone(),
        source,
    })?;
    let lock = lock_root(&config.root_dir)?;
    crate::zygote::server::set_child_subreaper();
    let supervisor = Supervisor::new(config, lock)?;
    tracing::info!(pid = std::process::id(), "supervisor started");
    crate::zygote::server::serve_supervised(supervisor, exit_dir)
}

/// Takes `<root>/supervisor.lock` (flock, exclusive). Workers close their inherited copy
/// right after the fork, so no container holds it and it is released with the supervisor.
fn lock_root(root: &std::path::Path) -> Result<std::fs::File, SupervisorError> {
    let path = root.join("supervisor.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(crate::fsutil::PRIVATE_FILE_MODE)
        .open(&path)
        .map_err(|source| SupervisorError::Lock {
            path: path.clone(),
            source,
        })?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Err(if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            SupervisorError::Locked { path }
        } else {
            SupervisorError::Lock { path, source: err }
        });
    }
    Ok(file)
}

/// In the agent: the connection to the supervisor that started this process, if any.
/// Reads and clears `IRONLET_SUPERVISOR_FD`; call first thing, before threads exist.
pub fn agent_connection() -> Result<Option<ZygoteHandle>, ZygoteError> {
    let Some(value) = std::env::var_os(SUPERVISOR_FD_ENV) else {
        return Ok(None);
    };
    std::env::remove_var(SUPERVISOR_FD_ENV);
    let fd: i32 = value
        .to_str()
        .and_then(|v| v.parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or_else(|| ZygoteError::Unexpected(format!("{SUPERVISOR_FD_ENV}={value:?}")))?;
    // It must be a socket our parent passed, not some other descriptor.
    let stat = nix::sys::stat::fstat(fd).map_err(|e| ZygoteError::Socket(e.into()))?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(ZygoteError::Unexpected(format!(
            "{SUPERVISOR_FD_ENV}={fd} is not a socket"
        )));
    }
    // SAFETY: the descriptor was inherited for us alone and is a socket (checked above).
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::fcntl::fcntl(
        sock.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| ZygoteError::Socket(e.into()))?;
    Ok(Some(ZygoteHandle {
        sock,
        pid: nix::unistd::getppid().as_raw(),
    }))
}

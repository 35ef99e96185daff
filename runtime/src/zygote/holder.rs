//! The holder of a rootless pod's namespaces, and its pasta.
//!
//! An unprivileged user cannot pin namespaces with bind mounts, so a small process holds
//! them instead, as podman's infra ("pause") process does: a user namespace mapping the
//! subordinate ranges (the containers of the pod join it, see `userns::Plan::Join`), and
//! network, IPC and UTS namespaces it owns. pasta (`network/rootless.rs` says why pasta)
//! connects the network namespace. pasta must be started from the host's namespaces, which
//! the holder has left, so the holder's first child K (the keeper) stays there and runs
//! pasta as its own child, for the whole life of the pod:
//!
//! ```text
//!  worker ──fork──► holder H ──fork──► K keeper (host namespaces; waits on a pipe)
//!    │               │ unshare(USER|NS) + newuidmap, unshare(NET|IPC|UTS), lo up
//!    │               │ "go" ─────────► K ──fork──► exec pasta --config-net … <H>
//!    │ ◄── "ok" ─────┤                 K: pasta ended? warn, start it again (same argv)
//!    ▼ result {pid: H}; H is reparented to the zygote, which watches it
//!                    │ waits for pasta's pid file (written once the namespace is set up),
//!                    │ writes the pod's address to <dir>/pod-ip, then <dir>/network-ready
//!                    │ (or <dir>/network-failed with the reason, and exits 1)
//!                    └─ sigwait: SIGTERM/SIGINT → SIGTERM K (which stops pasta), reap, exit 0
//! ```
//!
//! The reply comes once the namespaces exist, so containers can be created in them while
//! pasta starts (the largest part of a pod network's start-up); the runtime waits for
//! `network-ready` before it reports the sandbox made, or, for `ctr run` and the agent
//! (`run`, `play`: `LocalRuntime::network_ready_at_start`), before it starts a container
//! of the pod (`local/sandbox.rs`, `wait_rootless_network`).
//!
//! Guarantees: `network-ready` appears only once pasta has configured the namespace, and
//! `network-failed` carries pasta's own message (from `<dir>/pasta.log`) when it did not;
//! stopping the holder with SIGTERM
//! stops and reaps the keeper and pasta first, so nothing of the pod's network is left. The
//! keeper gets SIGKILL should the holder die otherwise, and pasta should the keeper. A pasta
//! that dies on its own (killed, crashed) is restarted by the keeper for the same namespace
//! with the same port forwards (its tap device went with it; the new one is configured
//! anew), with a warning in the agent's log and in `<dir>/pasta.log`, and a line in
//! `<dir>/pasta-restarts` that the runtime reports as the pod's event; restarts of a pasta
//! that keeps failing are spaced out, up to [`RESTART_DELAY_MAX`] apart.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

/// Ends the zygote id of a holder (`<sandbox id><suffix>`): its exit is not recorded.
pub(crate) const HOLDER_ID_SUFFIX: &str = ".pod-network";

/// The zygote id of the holder of sandbox `sandbox_id`.
pub fn holder_id(sandbox_id: &str) -> String {
    format!("{sandbox_id}{HOLDER_ID_SUFFIX}")
}

/// How long pasta may take to configure the namespace.
const PASTA_READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long pasta gets to exit after SIGTERM before SIGKILL.
const PASTA_STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the keeper gets to stop pasta and exit after SIGTERM before SIGKILL.
const KEEPER_STOP_TIMEOUT: Duration = Duration::from_secs(6);
/// A pasta that ran at least this long is restarted at once; one that ended sooner is
/// restarted after a delay that doubles from [`RESTART_DELAY_MIN`].
const RESTART_QUICK: Duration = Duration::from_secs(10);
const RESTART_DELAY_MIN: Duration = Duration::from_millis(100);
const RESTART_DELAY_MAX: Duration = Duration::from_secs(10);

/// What the holder is asked to make (pasta's argv without the target pid).
pub(crate) use crate::network::rootless::HolderRequest as HolderSpec;

/// Forks the holder from the (single-threaded) worker; returns its pid once the pod's
/// network is up, or the reason it is not (the holder has then exited).
pub(crate) fn start(spec: &HolderSpec) -> Result<i32, String> {
    let (ready_r, ready_w) = super::sys::pipe().map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the worker is single-threaded.
    match unsafe { fork() }.map_err(|e| format!("fork the namespace holder: {e}"))? {
        ForkResult::Child => {
            drop(ready_r);
            holder(spec, ready_w)
        }
        ForkResult::Parent { child } => {
            drop(ready_w);
            let mut answer = String::new();
            let _ = std::fs::File::from(ready_r).read_to_string(&mut answer);
            if answer == "ok" {
                return Ok(child.as_raw());
            }
            let _ = waitpid(child, None);
            Err(if answer.is_empty() {
                "the pod's namespace holder ended without a word".into()
            } else {
                answer
            })
        }
    }
}

/// The holder's life; never returns.
fn holder(spec: &HolderSpec, ready: OwnedFd) -> ! {
    let mut ready = std::fs::File::from(ready);
    let mut mask = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD] {
        mask.add(signal);
    }
    let keeper = match mask
        .thread_block()
        .map_err(|e| format!("block signals: {e}"))
    {
        Ok(()) => setup(spec, ready.as_raw_fd()),
        Err(e) => Err(e),
    };
    let keeper = match keeper {
        Ok(keeper) => {
            let _ = ready.write_all(b"ok");
            keeper
        }
        Err(message) => {
            let _ = ready.write_all(message.as_bytes());
            // SAFETY: leaving the forked child without running the worker's destructors.
            unsafe { libc::_exit(1) }
        }
    };
    drop(ready);
    if let Err(message) = await_pasta(spec, keeper) {
        let failed = spec.dir.join(NETWORK_FAILED);
        if let Err(err) = crate::fsutil::write_state(&failed, message.as_bytes()) {
            tracing::warn!(sandbox = %spec.id, %err, %message, "recording pasta's failure");
        }
        // SAFETY: as above.
        unsafe { libc::_exit(1) }
    }
    loop {
        match mask.wait() {
            Ok(Signal::SIGTERM) | Ok(Signal::SIGINT) => break,
            Ok(Signal::SIGCHLD) => {
                // The keeper was killed (or a leftover helper ended): reap, keep holding.
                let _ = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG));
            }
            _ => {}
        }
    }
    stop_child(keeper, KEEPER_STOP_TIMEOUT);
    // SAFETY: as above.
    unsafe { libc::_exit(0) }
}

/// In a sandbox directory: written by the holder once pasta has configured the pod's
/// network (after `pod-ip`).
pub const NETWORK_READY: &str = "network-ready";
/// In a sandbox directory: why pasta did not configure the pod's network (the holder has
/// then stopped it and exits).
pub const NETWORK_FAILED: &str = "network-failed";

/// Forks the keeper, makes the namespaces and lets the keeper start pasta. Returns the
/// keeper's pid. `ready` is the holder's end of its reply pipe, which the keeper closes: the
/// worker reads the reply to its end.
fn setup(spec: &HolderSpec, ready: std::os::fd::RawFd) -> Result<Pid, String> {
    let holder = nix::unistd::getpid();
    let log_path = spec.dir.join("pasta.log");
    let pid_file = spec.dir.join("pasta.pid");
    for stale in [&pid_file, &spec.dir.join("pod-ip")] {
        let _ = std::fs::remove_file(stale);
    }
    for stale in [NETWORK_READY, NETWORK_FAILED] {
        let _ = std::fs::remove_file(spec.dir.join(stale));
    }
    let log = std::fs::File::create(&log_path)
        .map_err(|e| format!("create {}: {e}", log_path.display()))?;
    let mut argv: Vec<std::ffi::CString> = Vec::new();
    for arg in spec
        .pasta
        .iter()
        .map(String::as_str)
        .chain([holder.as_raw().to_string().as_str()])
    {
        argv.push(std::ffi::CString::new(arg).map_err(|_| format!("argument {arg:?}"))?);
    }
    let (go_r, go_w) = super::sys::pipe().map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the holder is single-threaded; the child stays single-threaded.
    let keeper = match unsafe { fork() }.map_err(|e| format!("fork pasta's keeper: {e}"))? {
        ForkResult::Child => {
            drop(go_w);
            let _ = nix::unistd::close(ready);
            let mut byte = [0u8; 1];
            let go = std::fs::File::from(go_r).read(&mut byte).ok() == Some(1);
            // SAFETY: prctl with plain integer arguments.
            let pdeath = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            if go && pdeath == 0 && nix::unistd::getppid() == holder {
                let sandbox = spec.id.strip_suffix(HOLDER_ID_SUFFIX).unwrap_or(&spec.id);
                keep(&argv, log, &pid_file, sandbox)
            }
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => child,
    };
    drop(go_r);
    let made = make_namespaces(spec);
    if let Err(message) = made {
        drop(go_w);
        let _ = waitpid(keeper, None);
        return Err(message);
    }
    let _ = std::fs::File::from(go_w).write_all(b"1");
    Ok(keeper)
}

/// Waits until pasta (the keeper's child) has connected the namespaces, then writes the
/// pod's address and [`NETWORK_READY`]; on an error the keeper is stopped.
fn await_pasta(spec: &HolderSpec, keeper: Pid) -> Result<(), String> {
    let log_path = spec.dir.join("pasta.log");
    let pid_file = spec.dir.join("pasta.pid");
    let deadline = Instant::now() + PASTA_READY_TIMEOUT;
    loop {
        if std::fs::metadata(&pid_file).is_ok_and(|m| m.len() > 0) {
            break;
        }
        if stop_pending() {
            stop_child(keeper, KEEPER_STOP_TIMEOUT);
            return Err(
                "rootless networking: the pod was stopped before pasta had configured its network"
                    .into(),
            );
        }
        // The keeper ends when the first pasta ends before it has written its pid file.
        let ended = !matches!(
            waitpid(keeper, Some(WaitPidFlag::WNOHANG)),
            Ok(WaitStatus::StillAlive)
        );
        if ended || Instant::now() > deadline {
            if !ended {
                stop_child(keeper, KEEPER_STOP_TIMEOUT);
            }
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(format!(
                "rootless networking: pasta {} ({}): {}",
                if ended {
                    "ended before configuring the pod's network"
                } else {
                    "did not configure the pod's network in time"
                },
                spec.pasta.join(" "),
                said.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let written = pod_ip().map_or(Ok(()), |ip| {
        let path = spec.dir.join("pod-ip");
        crate::fsutil::write_state(&path, ip.to_string().as_bytes())
            .map_err(|e| format!("write {}: {e}", path.display()))
    });
    let ready = spec.dir.join(NETWORK_READY);
    let written = written.and_then(|()| {
        crate::fsutil::write_state(&ready, b"")
            .map_err(|e| format!("write {}: {e}", ready.display()))
    });
    if written.is_err() {
        stop_child(keeper, KEEPER_STOP_TIMEOUT);
    }
    written
}

/// Whether SIGTERM or SIGINT (blocked in the holder) is pending.
fn stop_pending() -> bool {
    // SAFETY: sigpending fills the zeroed set; sigismember reads it.
    unsafe {
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut pending) == 0
            && (libc::sigismember(&pending, libc::SIGTERM) == 1
                || libc::sigismember(&pending, libc::SIGINT) == 1)
    }
}

/// The keeper's life, in the host's namespaces with SIGTERM, SIGINT and SIGCHLD blocked:
/// runs pasta (`argv`, output to `log`) and starts it again whenever it ends, until SIGTERM
/// or SIGINT, then stops it. Exits 1 when the first pasta ends before writing `pid_file`
/// (the holder then reports pasta's log). Never returns.
fn keep(argv: &[std::ffi::CString], mut log: std::fs::File, pid_file: &Path, sandbox: &str) -> ! {
    let mut mask = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD] {
        mask.add(signal);
    }
    let Some(mut pasta) = spawn_pasta(argv, &log) else {
        // SAFETY: leaving the forked child.
        unsafe { libc::_exit(1) }
    };
    let mut started = Instant::now();
    let mut ever_ready = false;
    let mut delay = RESTART_DELAY_MIN;
    loop {
        match wait_signal(&mask, None) {
            Some(libc::SIGTERM) | Some(libc::SIGINT) => break,
            Some(libc::SIGCHLD) => {}
            _ => continue,
        }
        let status = match waitpid(pasta, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => continue,
            Ok(status) => status,
        };
        let ready = std::fs::metadata(pid_file).is_ok_and(|m| m.len() > 0);
        ever_ready |= ready;
        if !ever_ready {
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(1) }
        }
        let how = describe(status);
        let wait = if ready && started.elapsed() >= RESTART_QUICK {
            delay = RESTART_DELAY_MIN;
            Duration::ZERO
        } else {
            let now = delay;
            delay = (delay * 2).min(RESTART_DELAY_MAX);
            now
        };
        tracing::warn!(sandbox, pid = pasta.as_raw(), ended = %how, ?wait,
            "pasta of a rootless pod ended: the pod's network and published ports are down \
             until it is restarted; restarting it");
        let _ = writeln!(
            log,
            "ironlet: pasta (pid {pasta}) ended ({how}); restarting it in {wait:?}"
        );
        if !wait.is_zero() {
            if let Some(libc::SIGTERM | libc::SIGINT) = wait_signal(&mask, Some(wait)) {
                // SAFETY: leaving the forked child; pasta is reaped.
                unsafe { libc::_exit(0) }
            }
        }
        let _ = std::fs::remove_file(pid_file);
        match spawn_pasta(argv, &log) {
            Some(new) => {
                tracing::warn!(
                    sandbox,
                    pid = new.as_raw(),
                    "pasta restarted for the rootless pod"
                );
                let _ = writeln!(log, "ironlet: pasta restarted (pid {new})");
                // The runtime turns it into the pod's event (`local/mod.rs`).
                if let Some(dir) = pid_file.parent() {
                    let what = format!("pasta (pid {pasta}) ended ({how}); restarted as pid {new}");
                    if let Err(err) = crate::network::rootless::record_restart(dir, &what) {
                        tracing::warn!(sandbox, %err, "recording pasta's restart failed");
                    }
                }
                pasta = new;
                started = Instant::now();
            }
            None => {
                // SAFETY: leaving the forked child.
                unsafe { libc::_exit(1) }
            }
        }
    }
    stop_child(pasta, PASTA_STOP_TIMEOUT);
    // SAFETY: leaving the forked child.
    unsafe { libc::_exit(0) }
}

/// Forks and execs pasta (SIGKILL should the keeper die), output to `log`.
fn spawn_pasta(argv: &[std::ffi::CString], log: &std::fs::File) -> Option<Pid> {
    let keeper = nix::unistd::getpid();
    // SAFETY: the keeper is single-threaded; the child only changes descriptors and execs.
    match unsafe { fork() }.ok()? {
        ForkResult::Child => {
            // SAFETY: prctl with plain integer arguments.
            let pdeath = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            if pdeath == 0 && nix::unistd::getppid() == keeper {
                let _ = SigSet::empty().thread_set_mask();
                if let Ok(null) = std::fs::File::open("/dev/null") {
                    let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
                    let _ = nix::unistd::dup2(log.as_raw_fd(), 1);
                    let _ = nix::unistd::dup2(log.as_raw_fd(), 2);
                    if let Some(program) = argv.first() {
                        let _ = nix::unistd::execvp(program, argv);
                    }
                }
            }
            // SAFETY: leaving the forked child.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => Some(child),
    }
}

/// The next of the blocked signals in `mask`, waiting at most `timeout` (forever: `None`).
fn wait_signal(mask: &SigSet, timeout: Option<Duration>) -> Option<i32> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a valid signal set and an optional valid timespec; no siginfo wanted.
    let signal = unsafe { libc::sigtimedwait(mask.as_ref(), std::ptr::null_mut(), ts_ptr) };
    (signal > 0).then_some(signal)
}

/// How a process ended, for a log line.
fn describe(status: WaitStatus) -> String {
    match status {
        WaitStatus::Exited(_, code) => format!("exit code {code}"),
        WaitStatus::Signaled(_, signal, _) => format!("signal {signal}"),
        other => format!("{other:?}"),
    }
}

/// The user namespace (subordinate ranges, through the setuid helpers) and the pod's
/// network, IPC and UTS namespaces, with `lo` up and the pod's hostname.
fn make_namespaces(spec: &HolderSpec) -> Result<(), String> {
    super::userns::enter(&super::userns::Plan::Ranges {
        uids: spec.uids.clone(),
        gids: spec.gids.clone(),
    })
    .map_err(|e| e.to_string())?;
    let mut flags = CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWUTS;
    if spec.ipc {
        flags |= CloneFlags::CLONE_NEWIPC;
    }
    nix::sched::unshare(flags).map_err(|e| format!("unshare {flags:?}: {e}"))?;
    nix::unistd::sethostname(&spec.hostname)
        .map_err(|e| format!("sethostname {}: {e}", spec.hostname))?;
    super::worker::loopback_up()?;
    // Nothing of the host's file system stays busy through the holder.
    let _ = nix::unistd::chdir(Path::new("/"));
    Ok(())
}

/// The pod's address: the source address its routes pick for an outside destination (a
/// UDP `connect` sends nothing). pasta copies the host's address and routes; IPv4 first.
fn pod_ip() -> Option<std::net::IpAddr> {
    [
        ("0.0.0.0:0", "198.51.100.1:9"),
        ("[::]:0", "[2001:db8::1]:9"),
    ]
    .into_iter()
    .find_map(|(local, remote)| {
        let socket = std::net::UdpSocket::bind(local).ok()?;
        socket.connect(remote).ok()?;
        Some(socket.local_addr().ok()?.ip())
    })
}

/// SIGTERM to a child (pasta, the keeper), SIGKILL after `timeout`; reaped either way.
fn stop_child(child: Pid, timeout: Duration) {
    let _ = nix::sys::signal::kill(child, Signal::SIGTERM);
    let deadline = Instant::now() + timeout;
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                return;
            }
            _ => return,
        }
    }
}

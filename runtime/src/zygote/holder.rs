//! The holder of a rootless pod's namespaces, and its pasta.
//!
//! An unprivileged user cannot pin namespaces with bind mounts, so a small process holds
//! them instead, as podman's infra ("pause") process does: a user namespace mapping the
//! subordinate ranges (the containers of the pod join it, see `userns::Plan::Join`), and
//! network, IPC and UTS namespaces it owns. pasta (`network/rootless.rs` says why pasta)
//! connects the network namespace; it is the holder's child, so one process is the whole
//! network of the pod:
//!
//! ```text
//!  worker ──fork──► holder H ──fork──► C (host namespaces; waits on a pipe)
//!    │               │ unshare(USER|NS) + newuidmap, unshare(NET|IPC|UTS), lo up
//!    │               │ "go" ─────────► C: exec pasta --config-net … <H>   (PDEATHSIG)
//!    │               │ waits for pasta's pid file (written once the namespace is set up),
//!    │               │ writes the pod's address to <dir>/pod-ip
//!    │ ◄── "ok" ─────┤
//!    ▼ result {pid: H}; H is reparented to the zygote, which watches it
//!                    └─ sigwait: SIGTERM/SIGINT → SIGTERM pasta, reap it, exit 0
//! ```
//!
//! Guarantees: the reply comes only once pasta has configured the namespace (or the error
//! carries pasta's own message, from `<dir>/pasta.log`); stopping the holder with SIGTERM
//! stops and reaps pasta first, so nothing of the pod's network is left. pasta gets SIGKILL
//! should the holder die otherwise. Not done: a pasta that dies on its own is not restarted
//! (the holder cannot start a process in the host's namespaces any more); the pod keeps
//! its loopback.

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
    let pasta = match mask
        .thread_block()
        .map_err(|e| format!("block signals: {e}"))
    {
        Ok(()) => setup(spec),
        Err(e) => Err(e),
    };
    let pasta = match pasta {
        Ok(pasta) => {
            let _ = ready.write_all(b"ok");
            pasta
        }
        Err(message) => {
            let _ = ready.write_all(message.as_bytes());
            // SAFETY: leaving the forked child without running the worker's destructors.
            unsafe { libc::_exit(1) }
        }
    };
    drop(ready);
    loop {
        match mask.wait() {
            Ok(Signal::SIGTERM) | Ok(Signal::SIGINT) => break,
            Ok(Signal::SIGCHLD) => {
                // pasta ended on its own (or a leftover helper): reap, keep holding.
                let _ = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG));
            }
            _ => {}
        }
    }
    stop_pasta(pasta);
    // SAFETY: as above.
    unsafe { libc::_exit(0) }
}

/// Forks pasta's process, makes the namespaces, lets pasta connect them and waits until it
/// has. Returns pasta's pid.
fn setup(spec: &HolderSpec) -> Result<Pid, String> {
    let holder = nix::unistd::getpid();
    let log_path = spec.dir.join("pasta.log");
    let pid_file = spec.dir.join("pasta.pid");
    let _ = std::fs::remove_file(&pid_file);
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
    // SAFETY: the holder is single-threaded; the child only reads a pipe and execs.
    let pasta = match unsafe { fork() }.map_err(|e| format!("fork pasta: {e}"))? {
        ForkResult::Child => {
            drop(go_w);
            let mut byte = [0u8; 1];
            let go = std::fs::File::from(go_r).read(&mut byte).ok() == Some(1);
            // SAFETY: prctl with plain integer arguments.
            let pdeath = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            if go && pdeath == 0 && nix::unistd::getppid() == holder {
                let _ = SigSet::empty().thread_set_mask();
                if let Ok(null) = std::fs::File::open("/dev/null") {
                    let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
                    let _ = nix::unistd::dup2(log.as_raw_fd(), 1);
                    let _ = nix::unistd::dup2(log.as_raw_fd(), 2);
                    if let Some(program) = argv.first() {
                        let _ = nix::unistd::execvp(program, &argv);
                    }
                }
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
        let _ = waitpid(pasta, None);
        return Err(message);
    }
    let _ = std::fs::File::from(go_w).write_all(b"1");
    let deadline = Instant::now() + PASTA_READY_TIMEOUT;
    loop {
        if std::fs::metadata(&pid_file).is_ok_and(|m| m.len() > 0) {
            break;
        }
        let ended = !matches!(
            waitpid(pasta, Some(WaitPidFlag::WNOHANG)),
            Ok(WaitStatus::StillAlive)
        );
        if ended || Instant::now() > deadline {
            if !ended {
                stop_pasta(pasta);
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
    if let Some(ip) = pod_ip() {
        let path = spec.dir.join("pod-ip");
        std::fs::write(&path, ip.to_string().as_bytes())
            .map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    Ok(pasta)
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

/// SIGTERM to pasta, SIGKILL after [`PASTA_STOP_TIMEOUT`]; reaped either way.
fn stop_pasta(pasta: Pid) {
    let _ = nix::sys::signal::kill(pasta, Signal::SIGTERM);
    let deadline = Instant::now() + PASTA_STOP_TIMEOUT;
    loop {
        match waitpid(pasta, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = nix::sys::signal::kill(pasta, Signal::SIGKILL);
                let _ = waitpid(pasta, None);
                return;
            }
            _ => return,
        }
    }
}

//! The fast path of an exec (what runc and crun do): the worker joins the running
//! container's cgroups and namespaces itself and forks the process, which applies the
//! exec's process settings and `execve`s, instead of building a libcontainer tenant.
//!
//! libcontainer's tenant build loads and validates the bundle again, opens its notify and
//! tty sockets, and runs a main → intermediate → init clone dance with channel round
//! trips between the three, the intermediate parsing `mountinfo` through libcgroups; on a
//! loaded node each hand-off waits for a CPU, and that was most of an exec's time. Here:
//!
//! 1. the worker (forked by the zygote, single-threaded) writes its pid to the
//!    `cgroup.procs` of each hierarchy the container's init is in (`/proc/<init>/cgroup`,
//!    the mount points from the cgroup lines of `mountinfo`), sets the process's
//!    `oom_score_adj`, makes itself non-dumpable (as libcontainer does before joining),
//!    and joins the init's namespaces with one `setns(pidfd, CLONE_NEW…)` (Linux ≥ 5.8);
//! 2. it forks the process (a fork after joining a pid namespace lands in it); the
//!    process sets its stdio, rlimits, `no_new_privs`, AppArmor profile, umask, working
//!    directory, groups and ids, capabilities (libcontainer's own functions, in
//!    libcontainer's order) and `execve`s through the zygote's [`SeccompExecutor`], which
//!    makes the pty the controlling terminal and installs the seccomp program last;
//! 3. a close-on-exec pipe tells the worker whether the `execve` happened (end of file)
//!    or what failed before it; the worker reports the pid and exits, and the process is
//!    reparented to the zygote (a child subreaper), which reaps it.
//!
//! Anything this path does not reproduce takes libcontainer's: rootless workers, a user or
//! time namespace, an SELinux label, a seccomp profile in `config.json` itself (rather than
//! the zygote's compiled one), personality, I/O priority, scheduler, CPU affinity or memory
//! policy settings. [`eligible`] decides, before anything has been done.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use libcontainer::container::ContainerStatus;
use libcontainer::syscall::syscall::create_syscall;
use libcontainer::workload::Executor;
use nix::sched::CloneFlags;
use nix::unistd::{ForkResult, Gid, Uid};
use oci_spec::runtime::{LinuxNamespaceType, Process, Spec};

use super::exec_process::Temporary;
use super::seccomp::SeccompExecutor;
use super::worker::{Program, Stdio};

/// Why the fast path does not apply to a container (it then takes libcontainer's).
pub(crate) fn eligible(spec: &Spec, process: &Process) -> Result<(), &'static str> {
    if !root_of_the_initial_user_namespace() {
        return Err("rootless");
    }
    let linux = spec.linux().as_ref().ok_or("no linux section")?;
    if linux.namespaces().as_ref().is_some_and(|all| {
        all.iter().any(|ns| {
            matches!(
                ns.typ(),
                LinuxNamespaceType::User | LinuxNamespaceType::Time
            )
        })
    }) {
        return Err("a user or time namespace");
    }
    if linux.seccomp().is_some() {
        return Err("a seccomp profile in config.json");
    }
    if linux.personality().is_some() || linux.memory_policy().is_some() {
        return Err("personality or memory policy");
    }
    if process.selinux_label().is_some()
        || process.io_priority().is_some()
        || process.scheduler().is_some()
        || process.exec_cpu_affinity().is_some()
    {
        return Err("an SELinux label, I/O priority, scheduler or CPU affinity");
    }
    Ok(())
}

/// Whether this process is root on the host. A rootless worker enters a user namespace
/// before it handles an exec, and is uid 0 there too: only the identity `uid_map` of the
/// initial namespace tells them apart.
fn root_of_the_initial_user_namespace() -> bool {
    nix::unistd::geteuid().is_root()
        && std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|map| is_identity_map(&map))
}

/// Whether a `uid_map` maps every id to itself (the initial user namespace's).
fn is_identity_map(map: &str) -> bool {
    map.split_whitespace().eq(["0", "0", "4294967295"])
}

/// Starts `process` in running container `id` (state under `state_root`) and returns its
/// pid. `spec` is the container's `config.json` and must be [`eligible`].
pub(crate) fn exec(
    id: &str,
    state_root: &Path,
    spec: &Spec,
    process: Process,
    stdio: Option<Stdio>,
    seccomp: Option<Program>,
    temporary: Temporary,
) -> Result<i32, String> {
    let container = super::worker::load(state_root, id)?;
    if container.status() != ContainerStatus::Running {
        return Err(format!(
            "exec: container {id} is {:?}, not running",
            container.status()
        ));
    }
    let init = container
        .pid()
        .ok_or_else(|| format!("exec: container {id} has no pid"))?
        .as_raw();
    // Pins the init: from here on its pid can't name another process.
    let pidfd = super::sys::pidfd_open(init).map_err(|e| format!("exec: pidfd of {init}: {e}"))?;
    join_cgroups(init)?;
    // Still holding the state's pid: a reused one would have been another process's
    // cgroups, but the namespaces are joined through the pidfd, which fails if it died.
    if let Some(score) = process.oom_score_adj() {
        std::fs::write("/proc/self/oom_score_adj", score.to_string())
            .map_err(|e| format!("exec: oom_score_adj: {e}"))?;
    }
    // Processes of the container must not ptrace or read this one while it holds host
    // resources (libcontainer and runc do the same); `execve` resets it.
    // SAFETY: a plain prctl on this process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let flags = namespace_flags(spec);
    // SAFETY: setns on a valid pidfd; the worker is single-threaded.
    if unsafe { libc::setns(pidfd.as_raw_fd(), flags.bits()) } != 0 {
        return Err(format!(
            "exec: join the namespaces of {init} ({flags:?}): {}",
            std::io::Error::last_os_error()
        ));
    }
    let (error_r, error_w) = super::sys::pipe().map_err(|e| format!("exec: pipe: {e}"))?;
    let mut spec = spec.clone();
    spec.set_process(Some(process));
    // SAFETY: the worker is single-threaded; the child only runs `start` and exits.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            drop(error_r);
            let message = match start(&spec, stdio, seccomp, temporary) {
                Ok(never) => match never {},
                Err(message) => message,
            };
            let mut file = std::fs::File::from(error_w);
            let _ = std::io::Write::write_all(&mut file, message.as_bytes());
            // SAFETY: _exit skips destructors shared with the parent's image.
            unsafe { libc::_exit(127) }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(error_w);
            drop(stdio);
            let mut message = String::new();
            let _ = std::fs::File::from(error_r).read_to_string(&mut message);
            if message.is_empty() {
                return Ok(child.as_raw());
            }
            let _ = nix::sys::wait::waitpid(child, None);
            Err(format!("exec: {message}"))
        }
        Err(e) => Err(format!("exec: fork: {e}")),
    }
}

/// The namespaces the container has (its own or a pod's), each joined as its init's.
fn namespace_flags(spec: &Spec) -> CloneFlags {
    let mut flags = CloneFlags::empty();
    let namespaces = spec.linux().as_ref().and_then(|l| l.namespaces().as_ref());
    for ns in namespaces.into_iter().flatten() {
        flags |= match ns.typ() {
            LinuxNamespaceType::Pid => CloneFlags::CLONE_NEWPID,
            LinuxNamespaceType::Network => CloneFlags::CLONE_NEWNET,
            LinuxNamespaceType::Mount => CloneFlags::CLONE_NEWNS,
            LinuxNamespaceType::Ipc => CloneFlags::CLONE_NEWIPC,
            LinuxNamespaceType::Uts => CloneFlags::CLONE_NEWUTS,
            LinuxNamespaceType::Cgroup => CloneFlags::CLONE_NEWCGROUP,
            // Not eligible (see `eligible`).
            LinuxNamespaceType::User | LinuxNamespaceType::Time => CloneFlags::empty(),
        };
    }
    flags
}

/// Moves this process into every cgroup `pid` is in.
fn join_cgroups(pid: i32) -> Result<(), String> {
    let dirs = ironlet_cgroups::process_cgroup_dirs(pid)
        .map_err(|e| format!("exec: cgroups of {pid}: {e}"))?;
    let own = std::process::id().to_string();
    for dir in dirs {
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, &own).map_err(|e| format!("exec: join {}: {e}", procs.display()))?;
    }
    Ok(())
}

/// In the forked process, inside the container's namespaces: applies `spec`'s process and
/// `execve`s. Returns only on failure.
fn start(
    spec: &Spec,
    stdio: Option<Stdio>,
    seccomp: Option<Program>,
    temporary: Temporary,
) -> Result<std::convert::Infallible, String> {
    let process = spec.process().as_ref().ok_or("no process")?;
    nix::unistd::setsid().map_err(|e| format!("setsid: {e}"))?;
    let terminal = stdio.as_ref().is_some_and(|s| s.terminal);
    let (stdin, stdout, stderr) = match stdio {
        Some(s) => (s.stdin, Some(s.stdout), Some(s.stderr)),
        None => (None, None, None),
    };
    let stdin = match stdin {
        Some(fd) => fd,
        None => std::fs::File::open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|e| format!("open /dev/null: {e}"))?,
    };
    for (fd, target) in [(Some(stdin), 0), (stdout, 1), (stderr, 2)] {
        if let Some(fd) = fd {
            if fd.as_raw_fd() != target {
                // SAFETY: dup2 onto a standard descriptor; `fd` stays owned and is closed.
                if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
                    return Err(format!(
                        "dup2 onto {target}: {}",
                        std::io::Error::last_os_error()
                    ));
                }
            } else {
                std::mem::forget(fd);
            }
        }
    }
    let syscall = create_syscall();
    for rlimit in process.rlimits().iter().flatten() {
        syscall
            .set_rlimit(rlimit)
            .map_err(|e| format!("rlimit {:?}: {e}", rlimit.typ()))?;
    }
    if process.no_new_privileges() == Some(true) {
        nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    }
    if let Some(profile) = process.apparmor_profile() {
        libcontainer::apparmor::apply_profile(profile)
            .map_err(|e| format!("AppArmor profile {profile}: {e}"))?;
    }
    if let Some(umask) = process.user().umask() {
        let mode = nix::sys::stat::Mode::from_bits(umask)
            .ok_or_else(|| format!("invalid umask {umask:o}"))?;
        nix::sys::stat::umask(mode);
    }
    // Before the ids change, as libcontainer does; again after if the user may not.
    let cwd = process.cwd();
    let chdir_later = match nix::unistd::chdir(cwd) {
        Ok(()) => false,
        Err(nix::errno::Errno::EPERM) => true,
        Err(e) => return Err(format!("chdir {}: {e}", cwd.display())),
    };
    let user = process.user();
    if let Some(gids) = user.additional_gids().as_ref().filter(|g| !g.is_empty()) {
        let gids: Vec<Gid> = gids.iter().map(|g| Gid::from_raw(*g)).collect();
        syscall
            .set_groups(&gids)
            .map_err(|e| format!("supplementary groups {gids:?}: {e}"))?;
    }
    syscall
        .set_id(Uid::from_raw(user.uid()), Gid::from_raw(user.gid()))
        .map_err(|e| format!("uid {} gid {}: {e}", user.uid(), user.gid()))?;
    syscall
        .close_range(0)
        .map_err(|e| format!("close-on-exec above stdio: {e}"))?;
    libcontainer::capabilities::reset_effective(syscall.as_ref())
        .map_err(|e| format!("reset the effective capabilities: {e}"))?;
    if let Some(caps) = process.capabilities() {
        libcontainer::capabilities::drop_privileges(caps, syscall.as_ref())
            .map_err(|e| format!("drop capabilities: {e}"))?;
    }
    if chdir_later {
        nix::unistd::chdir(cwd).map_err(|e| format!("chdir {}: {e}", cwd.display()))?;
    }
    if !nix::unistd::getcwd().is_ok_and(|c| c.is_absolute()) {
        return Err(format!("{} is not inside the container", cwd.display()));
    }
    let mut envs: HashMap<String, String> =
        libcontainer::utils::parse_env(process.env().as_deref().unwrap_or_default());
    if envs.get("HOME").is_none_or(|h| h.is_empty()) {
        if let Some(home) = libcontainer::utils::get_user_home(user.uid())
            .and_then(|h| h.to_str().map(str::to_owned))
        {
            envs.insert("HOME".to_owned(), home);
        }
    }
    let executor = SeccompExecutor {
        program: seccomp,
        terminal,
        temporary,
    };
    executor.validate(spec).map_err(|e| e.to_string())?;
    executor.setup_envs(envs).map_err(|e| e.to_string())?;
    executor.exec(spec).map_err(|e| e.to_string())?;
    Err("the executor returned".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_identity_map_is_the_initial_user_namespace() {
        assert!(is_identity_map("         0          0 4294967295\n"));
        // A rootless worker's maps: its own id, or a subordinate range.
        assert!(!is_identity_map("         0       1001          1\n"));
        assert!(!is_identity_map(
            "         0       1001          1\n         1     100000      65536\n"
        ));
        assert!(!is_identity_map(""));
    }

    #[test]
    fn namespaces_of_the_spec_become_setns_flags() {
        let spec = Spec::default();
        let flags = namespace_flags(&spec);
        assert!(flags.contains(CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS));
        assert!(!flags.contains(CloneFlags::CLONE_NEWUSER));
    }
}

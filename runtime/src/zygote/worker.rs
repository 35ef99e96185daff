//! What a forked worker of the zygote does: exactly one libcontainer call (or namespace
//! setup) in a fresh single-threaded process, whose result it writes to a pipe before
//! `_exit`.
//!
//! A worker per call gives libcontainer what it assumes, a process of its own: it may
//! `chdir`, write `/proc/self/oom_score_adj` and clone freely without disturbing the agent,
//! the zygote or a concurrent call.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::syscall::syscall::SyscallType;
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use serde::{Deserialize, Serialize};

use super::pod_mounts::TemplateNs;
use super::protocol::Request;

/// What a worker reports back to the zygote.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum WorkerResult {
    /// The pid of the process the call created (container init or exec process), if any.
    Ok {
        pid: Option<i32>,
    },
    Err {
        message: String,
    },
}

/// Descriptors a worker hands to the container process.
pub(crate) struct Stdio {
    /// The read end of an exec's stdin pipe; `/dev/null` without one.
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The three are a pty slave that becomes the process's controlling terminal.
    pub terminal: bool,
}

/// Runs `request` and writes the result to `result_pipe`. Never returns.
pub(crate) fn run(
    request: Request,
    stdio: Option<Stdio>,
    seccomp: Option<Program>,
    result_pipe: OwnedFd,
    mount_template: Option<TemplateNs>,
) -> ! {
    ensure_usable_cwd();
    let result = match perform(request, stdio, seccomp, mount_template) {
        Ok(pid) => WorkerResult::Ok { pid },
        Err(message) => WorkerResult::Err { message },
    };
    let mut file = std::fs::File::from(result_pipe);
    // One JSON line: the newline tells the zygote the result is whole, so it can reply
    // before this process has finished exiting.
    let code = match serde_json::to_vec(&result) {
        Ok(mut bytes) => {
            bytes.push(RESULT_END);
            i32::from(file.write_all(&bytes).is_err())
        }
        Err(_) => 1,
    };
    drop(file);
    linger_for_tests();
    // SAFETY: _exit skips atexit handlers and destructors shared with the parent's image.
    unsafe { libc::_exit(code) }
}

/// Set by a test (`runtime/tests/zygote_workers.rs`): the worker stays alive this long after
/// writing its result, as a slow exit would, so that the test can check that the zygote
/// answers without waiting and still reaps what the worker created.
const LINGER_ENV: &str = "IRONLET_TEST_WORKER_LINGER_MS";

fn linger_for_tests() {
    if let Some(ms) = std::env::var(LINGER_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// libcontainer `chdir`s into a container's notify-socket directory and back to the
/// current directory, so it fails ("failed to get cwd") when the directory the agent was
/// started from has since been removed. Every path the zygote is given is absolute, so `/`
/// serves as well as any.
fn ensure_usable_cwd() {
    if std::env::current_dir().is_err() {
        if let Err(err) = nix::unistd::chdir(Path::new("/")) {
            tracing::warn!(%err, "the current directory is gone and / is not reachable");
        }
    }
}

/// Ends a worker's result on its pipe (compact JSON never contains a raw newline).
pub(crate) const RESULT_END: u8 = b'\n';

/// A compiled seccomp program (see `seccomp.rs`).
pub(crate) type Program = std::sync::Arc<Vec<libc::sock_filter>>;

fn perform(
    request: Request,
    stdio: Option<Stdio>,
    seccomp: Option<Program>,
    mount_template: Option<TemplateNs>,
) -> Result<Option<i32>, String> {
    // (container id, whether libcontainer will add processes to its cgroup)
    let cgroup_user = match &request {
        Request::Create { id, .. } | Request::Exec { id, .. } => Some((id.clone(), true)),
        Request::Delete { id, .. } => Some((id.clone(), false)),
        _ => None,
    };
    // Asked before entering a user namespace, where the worker becomes its root.
    let rootless = !nix::unistd::geteuid().is_root();
    let mut plan = super::userns::Plan::OwnIds;
    if let Some((id, adds)) = cgroup_user.filter(|_| rootless) {
        let mut bundle = None;
        plan = match &request {
            Request::Create { bundle: b, .. } => {
                bundle = Some(b.clone());
                super::userns::plan_for_create(b).map_err(|e| e.to_string())?
            }
            Request::Exec { state_root, .. } | Request::Delete { state_root, .. } => {
                match load(state_root, &id) {
                    Ok(c) => {
                        bundle = Some(c.bundle().to_path_buf());
                        super::userns::plan_for_existing(c.bundle(), c.pid().map(|p| p.as_raw()))
                    }
                    Err(_) => super::userns::Plan::OwnIds,
                }
            }
            _ => super::userns::Plan::OwnIds,
        };
        if bundle.as_deref().is_some_and(has_cgroups_path) {
            // A delegated cgroup v2 subtree: libcontainer manages the container's cgroup
            // there, from the user namespace whose root is the subtree's owner.
            super::userns::enter(&plan).map_err(|e| e.to_string())?;
            set_root_propagation(MsFlags::MS_PRIVATE, "rootless")?;
        } else {
            hide_cgroups_from_libcontainer(&id, adds, &plan)?;
        }
    }
    match request {
        Request::Create {
            id,
            bundle,
            state_root,
            ..
        } if rootless => {
            let rootfs = super::userns::rootfs_of(&bundle).map_err(|e| e.to_string())?;
            // An overlay rootfs is mounted here, in the mount namespace the container's is
            // copied from (image/userns_overlay.rs); it goes when both are gone.
            let overlay = crate::image::userns_overlay::mount_described(&rootfs)?;
            if plan.maps_ranges() && overlay != Some(false) {
                let changed = crate::image::owners::apply_recorded(&rootfs).map_err(|e| {
                    format!(
                        "rootless: give the image's owners to {}: {e}",
                        rootfs.display()
                    )
                })?;
                if changed > 0 {
                    crate::image::owners::mark_applied(&bundle)
                        .map_err(|e| format!("rootless: mark {}: {e}", bundle.display()))?;
                }
            }
            let created = create(&id, &bundle, &state_root, stdio, seccomp, None, None);
            if created.is_err() && plan.maps_ranges() {
                // The agent removes the rootfs of a failed create; it must be the user's.
                if overlay.is_some() {
                    let _ = nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH);
                }
                let _ = crate::image::owners::hand_back_rootfs(&rootfs);
            }
            created.map(Some)
        }
        Request::Create {
            id,
            bundle,
            state_root,
            pod_mounts_root,
            ..
        } => create(
            &id,
            &bundle,
            &state_root,
            stdio,
            seccomp,
            pod_mounts_root.as_deref(),
            mount_template,
        )
        .map(Some),
        Request::Delete {
            id,
            state_root,
            force,
        } if plan.maps_ranges() => {
            let rootfs = load(&state_root, &id)
                .ok()
                .and_then(|c| super::userns::rootfs_of(c.bundle()).ok());
            delete(&id, &state_root, force)?;
            if let Some(rootfs) = rootfs {
                crate::image::owners::hand_back_rootfs(&rootfs).map_err(|e| {
                    format!("rootless: give {} back to the user: {e}", rootfs.display())
                })?;
            }
            Ok(None)
        }
        Request::Delete {
            id,
            state_root,
            force,
        } => delete(&id, &state_root, force).map(|()| None),
        Request::Exec {
            id,
            state_root,
            bundle,
            args,
            env,
            cwd,
            ..
        } => exec(&id, &state_root, &bundle, args, env, cwd, stdio, seccomp).map(Some),
        Request::CreateNamespaces {
            dir,
            hostname,
            net,
            ipc,
            uts,
            ipv4_only,
        } => create_namespaces(&dir, &hostname, net, ipc, uts)
            .and_then(|()| {
                if net && ipv4_only {
                    no_ipv6_on_new_links()
                } else {
                    Ok(())
                }
            })
            .map(|()| None),
        Request::CreatePodNetwork {
            id,
            dir,
            hostname,
            uids,
            gids,
            ipc,
            pasta,
        } => super::holder::start(&super::holder::HolderSpec {
            id,
            dir,
            hostname,
            uids: uids.into_iter().map(id_mapping).collect(),
            gids: gids.into_iter().map(id_mapping).collect(),
            ipc,
            pasta,
        })
        .map(Some),
        other => Err(format!("not a worker request: {other:?}")),
    }
}

fn id_mapping((container_id, host_id, size): (u32, u32, u32)) -> crate::spec::IdMapping {
    crate::spec::IdMapping {
        container_id,
        host_id,
        size,
    }
}

fn dev_null() -> Result<OwnedFd, String> {
    std::fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| format!("open /dev/null: {e}"))
}

fn builder(
    id: &str,
    state_root: &Path,
    stdio: Option<Stdio>,
    seccomp: Option<Program>,
    temporary: super::exec_process::Temporary,
) -> Result<ContainerBuilder, String> {
    let mut builder = ContainerBuilder::new(id.to_owned(), SyscallType::Linux)
        .with_root_path(state_root)
        .map_err(|e| format!("state root {}: {e}", state_root.display()))?;
    let terminal = stdio.as_ref().is_some_and(|s| s.terminal);
    match stdio {
        Some(stdio) => {
            let stdin = match stdio.stdin {
                Some(fd) => fd,
                None => dev_null()?,
            };
            builder = builder
                .with_stdin(stdin)
                .with_stdout(stdio.stdout)
                .with_stderr(stdio.stderr);
        }
        None => builder = builder.with_stdin(dev_null()?),
    }
    if seccomp.is_some() || terminal {
        builder = builder.with_executor(super::seccomp::SeccompExecutor {
            program: seccomp,
            terminal,
            temporary,
        });
    }
    Ok(builder)
}

fn create(
    id: &str,
    bundle: &Path,
    state_root: &Path,
    stdio: Option<Stdio>,
    seccomp: Option<Program>,
    pod_mounts_root: Option<&Path>,
    mount_template: Option<TemplateNs>,
) -> Result<i32, String> {
    let pruned = match pod_mounts_root {
        Some(root) => super::pod_mounts::prune_in_worker(root, bundle, mount_template)?,
        None => super::pod_mounts::Pruned::Not,
    };
    super::cgroup_view::prepare_in_worker(bundle, pruned.is_private())?;
    let container = builder(id, state_root, stdio, seccomp, Default::default())?
        .validate_id()
        .map_err(|e| format!("container id: {e}"))?
        .as_init(bundle)
        .with_systemd(false)
        .with_detach(true)
        .build()
        .map_err(|e| format!("create: {e}"))?;
    container
        .pid()
        .map(|p| p.as_raw())
        .ok_or_else(|| "create: container has no pid".to_owned())
}

fn start(id: &str, state_root: &Path) -> Result<(), String> {
    load(state_root, id)?
        .start()
        .map_err(|e| format!("start: {e}"))
}

/// `start` run by the zygote itself rather than by a forked worker: it is a connect and a
/// write to the container's notify socket plus a state save, and a worker's fork, exit and
/// reap were most of its time. libcontainer's `chdir` around the connect is harmless in the
/// single-threaded zygote and undone; a panic is caught so the zygote keeps reaping.
pub(crate) fn start_in_zygote(id: &str, state_root: &Path) -> Result<(), String> {
    ensure_usable_cwd();
    let cwd = std::env::current_dir().ok();
    let result = std::panic::catch_unwind(|| start(id, state_root))
        .unwrap_or_else(|_| Err(format!("start {id}: libcontainer panicked")));
    if let Some(cwd) = cwd {
        let _ = std::env::set_current_dir(cwd);
    }
    result
}

pub(super) fn load(state_root: &Path, id: &str) -> Result<Container, String> {
    Container::load(state_root.join(id)).map_err(|e| format!("load state of {id}: {e}"))
}

fn delete(id: &str, state_root: &Path, force: bool) -> Result<(), String> {
    let dir = state_root.join(id);
    if !dir.exists() {
        return Ok(());
    }
    match load(state_root, id) {
        Ok(mut container) => container.delete(force).map_err(|e| format!("delete: {e}")),
        // A state directory without a readable state (a create interrupted before
        // libcontainer wrote it) holds nothing else to clean.
        Err(_) if force && !dir.join("state.json").exists() => {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))
        }
        Err(e) => Err(e),
    }
}

/// Runs `args` in container `id` as runc would: with the container's process settings
/// (see `zygote::exec_process`), by joining it (`zygote::join`) or, where that path does
/// not apply, as a libcontainer tenant.
#[allow(clippy::too_many_arguments)]
fn exec(
    id: &str,
    state_root: &Path,
    bundle: &Path,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
    stdio: Option<Stdio>,
    seccomp: Option<Program>,
) -> Result<i32, String> {
    let config = bundle.join("config.json");
    let spec = oci_spec::runtime::Spec::load(&config)
        .map_err(|e| format!("exec: load {}: {e}", config.display()))?;
    let (process, temporary) =
        super::exec_process::exec_process(&spec, args, &env, cwd, seccomp.is_some())?;
    if super::join::eligible(&spec, &process).is_ok() {
        return super::join::exec(id, state_root, &spec, process, stdio, seccomp, temporary);
    }
    let (_file, path) = super::exec_process::process_file(&process)?;
    let pid = builder(id, state_root, stdio, seccomp, temporary)?
        .as_tenant()
        .with_process(Some(path))
        .with_detach(true)
        .build()
        .map_err(|e| format!("exec: {e}"))?;
    Ok(pid.as_raw())
}

/// Whether the container of `bundle` has a cgroup: the runtime gives a rootless container a
/// `linux.cgroupsPath` only inside a delegated cgroup v2 subtree (`local/container.rs`). An
/// unreadable spec counts as none (the container then runs as without delegation).
fn has_cgroups_path(bundle: &Path) -> bool {
    oci_spec::runtime::Spec::load(bundle.join("config.json"))
        .ok()
        .and_then(|spec| spec.linux().as_ref()?.cgroups_path().clone())
        .is_some()
}

/// Rootless without cgroup delegation: libcontainer's cgroup v1 manager has no rootless
/// mode and fails to create its cgroup. So the worker moves into a user namespace (see
/// `userns.rs`: its own ids only, the subordinate ranges, or the running container's), which
/// lets it own a mount namespace, and covers every cgroup mount with a private tmpfs:
/// libcontainer then "manages" empty directories nobody else sees, and on a pure v2 host
/// finds no v1 controller at all. The container simply has no limits, which the CLI and
/// agent report.
fn hide_cgroups_from_libcontainer(
    container_id: &str,
    adds_tasks: bool,
    plan: &super::userns::Plan,
) -> Result<(), String> {
    // The cgroup lines the zygote remembered (`cgroup_view::remember_cgroup_mounts`), or
    // mountinfo read now if they changed.
    let mountinfo = ironlet_cgroups::view::cgroup_mount_table()
        .map_err(|e| format!("rootless: read mountinfo: {e}"))?;
    super::userns::enter(plan).map_err(|e| e.to_string())?;
    set_root_propagation(MsFlags::MS_PRIVATE, "rootless")?;
    for mount_point in cgroup_mount_points(&mountinfo) {
        // cpuset refuses tasks until cpus and mems are set, copied down from the parent.
        let cpuset: Vec<(String, String)> = ["cpuset.cpus", "cpuset.mems"]
            .iter()
            .filter_map(|f| {
                let v = std::fs::read_to_string(Path::new(&mount_point).join(f)).ok()?;
                Some((f.to_string(), v))
            })
            .collect();
        nix::mount::mount(
            Some("tmpfs"),
            mount_point.as_str(),
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=755,size=64k"),
        )
        .map_err(|e| format!("rootless: cover {mount_point}: {e}"))?;
        if !adds_tasks {
            continue;
        }
        // libcontainer's default cgroup path for a spec without one; it opens (without
        // creating) `cgroup.procs` there to add the container's processes.
        let dir = Path::new(&mount_point).join(format!(":youki:{container_id}"));
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join("cgroup.procs"), b""))
            .and_then(|()| {
                cpuset.iter().try_for_each(|(file, value)| {
                    std::fs::write(Path::new(&mount_point).join(file), value)?;
                    std::fs::write(dir.join(file), value)
                })
            })
            .map_err(|e| format!("rootless: prepare {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// Gives every mount of this process's (private) mount namespace `propagation`
/// (`MS_PRIVATE`, `MS_SLAVE`), recursively from `/`.
pub(super) fn set_root_propagation(propagation: MsFlags, context: &str) -> Result<(), String> {
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | propagation,
        None::<&str>,
    )
    .map_err(|e| format!("{context}: make / {propagation:?}: {e}"))
}

/// Mount points of cgroup (v1) and cgroup2 file systems, from `/proc/self/mountinfo`.
fn cgroup_mount_points(mountinfo: &str) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let mount_point = left.split_whitespace().nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| mount_point.replace("\\040", " "))
        })
        .collect()
}

/// Unshares the requested namespaces and pins each with a bind mount of
/// `/proc/self/ns/<kind>` onto `<dir>/<kind>`, as `ip netns add` does; no process has to
/// stay behind to hold them.
fn create_namespaces(
    dir: &Path,
    hostname: &str,
    net: bool,
    ipc: bool,
    uts: bool,
) -> Result<(), String> {
    let mut flags = CloneFlags::empty();
    for (wanted, flag) in [
        (net, CloneFlags::CLONE_NEWNET),
        (ipc, CloneFlags::CLONE_NEWIPC),
        (uts, CloneFlags::CLONE_NEWUTS),
    ] {
        if wanted {
            flags |= flag;
        }
    }
    nix::sched::unshare(flags).map_err(|e| format!("unshare {flags:?}: {e}"))?;
    if uts {
        nix::unistd::sethostname(hostname).map_err(|e| format!("sethostname {hostname}: {e}"))?;
    }
    if net {
        loopback_up()?;
    }
    for (wanted, kind) in [(net, "net"), (ipc, "ipc"), (uts, "uts")] {
        if !wanted {
            continue;
        }
        let target = dir.join(kind);
        std::fs::File::create(&target).map_err(|e| format!("create {}: {e}", target.display()))?;
        let source = format!("/proc/self/ns/{kind}");
        nix::mount::mount(
            Some(source.as_str()),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("bind {source} to {}: {e}", target.display()))?;
    }
    Ok(())
}

/// In a new pod network namespace of an IPv4-only network, after `lo` is up: links made
/// from now on (the CNI plugin's `eth0`) get no IPv6, so they send no duplicate address
/// detection, router solicitation or MLD report that the node's bridge would flood to
/// every other pod's port (at 500 pods a third of a bridge ADD's time). `lo` keeps `::1`.
/// A kernel without IPv6 has nothing to turn off.
fn no_ipv6_on_new_links() -> Result<(), String> {
    const DEFAULT_DISABLE_IPV6: &str = "/proc/sys/net/ipv6/conf/default/disable_ipv6";
    match std::fs::write(DEFAULT_DISABLE_IPV6, "1") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("write {DEFAULT_DISABLE_IPV6}: {e}")),
    }
}

/// Brings `lo` up in the current network namespace (SIOCSIFFLAGS), so pods can talk to
/// themselves on 127.0.0.1 without a CNI loopback plugin.
pub(super) fn loopback_up() -> Result<(), String> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("socket for lo: {e}"))?;
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: valid socket and ifreq pointer for the duration of the calls.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(format!(
                "SIOCGIFFLAGS lo: {}",
                std::io::Error::last_os_error()
            ));
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(format!(
                "SIOCSIFFLAGS lo: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

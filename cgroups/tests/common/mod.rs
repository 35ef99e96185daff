//! Shared helpers of the integration tests: root check, a uniquely named node tree that cleans
//! itself up, spawning a process directly into a cgroup, and timeouts that say what hung.
//!
//! These tests create real cgroups, so they need root; without it each test prints why it is
//! skipped and passes.

#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::CString;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ironlet_cgroups::{CgroupPath, Hierarchy, NodeCgroups};

/// `true` if running as root; otherwise prints that `test` is skipped.
pub fn root_or_skip(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipping {test}: needs root to create cgroups");
    }
    root
}

/// A unique root name, `ironlet-test-<pid>-<n>`, so parallel tests and runs never collide.
pub fn unique_root_name() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "ironlet-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A node tree under a unique root, removed (processes killed) when dropped.
pub struct TestTree {
    pub node: NodeCgroups,
}

impl TestTree {
    pub fn new(hierarchy: Hierarchy) -> anyhow::Result<Self> {
        Ok(Self {
            node: NodeCgroups::ensure(hierarchy, &unique_root_name())?,
        })
    }

    pub fn detect() -> anyhow::Result<Self> {
        Self::new(Hierarchy::detect()?)
    }

    pub fn hierarchy(&self) -> &Hierarchy {
        self.node.hierarchy()
    }
}

impl Drop for TestTree {
    fn drop(&mut self) {
        if let Err(err) = self.node.remove(self.node.root()) {
            eprintln!("cleanup of {} failed: {err:?}", self.node.root());
        }
    }
}

/// Spawns `program args…` already inside cgroup `path` (in every controller): the child writes
/// itself into each `cgroup.procs` between fork and exec, so nothing it allocates escapes.
pub fn spawn_in(
    hierarchy: &Hierarchy,
    path: &CgroupPath,
    program: &str,
    args: &[&str],
) -> anyhow::Result<Child> {
    let procs: Vec<CString> = hierarchy
        .dirs(path)
        .iter()
        .map(|dir| CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the hook only calls open/write/close (async-signal-safe) on pre-built C strings.
    unsafe {
        command.pre_exec(move || {
            for file in &procs {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0" means "the writing process" in both v1 and v2.
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(command.spawn()?)
}

/// Awaits `future` for at most `secs`, panicking with `what_hung` otherwise.
pub async fn within<T>(secs: u64, what_hung: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {secs}s: {what_hung}"),
    }
}

/// The cgroup2 mount point of a hybrid machine (`/sys/fs/cgroup/unified`), if any.
pub fn unified_mount_of_hybrid() -> Option<std::path::PathBuf> {
    if Hierarchy::detect().ok()?.is_v2() {
        return None;
    }
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    table.lines().find_map(|line| {
        let (head, tail) = line.split_once(" - ")?;
        tail.starts_with("cgroup2 ")
            .then(|| head.split(' ').nth(4).map(std::path::PathBuf::from))
            .flatten()
    })
}

/// Reads one cgroup file of `path` under `controller`, trimmed.
pub fn read_file(
    hierarchy: &Hierarchy,
    controller: &str,
    path: &CgroupPath,
    file: &str,
) -> anyhow::Result<String> {
    let dir = hierarchy
        .controller_dir(controller, path)
        .ok_or_else(|| anyhow::anyhow!("controller {controller} not mounted"))?;
    Ok(std::fs::read_to_string(dir.join(file))?.trim().to_owned())
}

/// How many inotify descriptors this process holds (`anon_inode:inotify`; a shared instance
/// has two: its own and its reader's).
pub fn inotify_descriptors_of_this_process() -> anyhow::Result<usize> {
    let mut count = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        // A descriptor closed since it was listed has no link any more.
        if let Ok(target) = std::fs::read_link(entry?.path()) {
            count += usize::from(target.as_os_str() == "anon_inode:inotify");
        }
    }
    Ok(count)
}

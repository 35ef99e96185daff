//! Memory threshold notifications (kubelet's `memoryThresholdNotifier` and
//! `linuxCgroupNotifier`), so that memory pressure is seen when it happens rather than at
//! the next monitoring period: on cgroup v1 an eventfd registered in the memory cgroup's
//! `cgroup.event_control` on `memory.usage_in_bytes` fires when usage crosses
//! `capacity − threshold + inactive_file` (usage counts the page cache; the working set
//! does not count inactive file pages). The level is re-armed at every period, as kubelet
//! does, since inactive_file moves.
//!
//! One notifier watches the root memory cgroup (`memory.available`), one the pods' tree
//! (`allocatableMemory.available`).
//!
//! cgroup v2 has no usage threshold event (kubelet has no notifier there). There the
//! notifiers wake on what v2 signals ([`ironlet_cgroups::MemoryPressureWatcher`]): a PSI
//! trigger (`some 100000 1000000`: 100 ms of memory stall within 1 s) on the group's
//! `memory.pressure` (the root's, or `/proc/pressure/memory`), and for the pods' tree the
//! `high`/`max`/`oom` counters of its own limits (`memory.events.local`; node allocatable
//! enforcement sets its `memory.max`). Either way the eviction manager synchronizes at once:
//! reclaim stalls and limit hits are seen within a second; a threshold crossed with no
//! stall at all is seen at the next monitoring period, as before. The level is not used
//! there (`arm` only starts the watch).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::unix::AsyncFd;

use super::thresholds::Signal;

/// A re-armable usage threshold event on one v1 memory cgroup, or the memory pressure
/// watch of one v2 group.
#[derive(Debug)]
pub struct MemoryNotifier {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    V1 {
        dir: PathBuf,
        armed: Option<(u64, AsyncFd<EventFd>)>,
    },
    V2 {
        hierarchy: ironlet_cgroups::Hierarchy,
        path: ironlet_cgroups::CgroupPath,
        watch: Option<ironlet_cgroups::MemoryPressureWatcher>,
    },
}

/// `total_inactive_file` of a v1 memory cgroup's `memory.stat`.
fn inactive_file(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("memory.stat"))
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("total_inactive_file "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

impl MemoryNotifier {
    /// A notifier for the v1 memory cgroup directory `dir` (armed by [`Self::arm`]).
    pub fn new(dir: PathBuf) -> Self {
        Self {
            kind: Kind::V1 { dir, armed: None },
        }
    }

    /// A notifier for the v2 group `path` (started by [`Self::arm`], in the runtime).
    pub fn v2(hierarchy: ironlet_cgroups::Hierarchy, path: ironlet_cgroups::CgroupPath) -> Self {
        Self {
            kind: Kind::V2 {
                hierarchy,
                path,
                watch: None,
            },
        }
    }

    /// Arms (or re-arms) the event for `available < threshold` of `capacity` bytes.
    /// Unchanged levels (within 1 MiB) keep the current registration. On v2, starts the
    /// pressure watch once (the levels do not apply).
    pub fn arm(&mut self, capacity: u64, threshold: u64) -> std::io::Result<()> {
        match &mut self.kind {
            Kind::V1 { dir, armed } => arm_v1(dir, armed, capacity, threshold),
            Kind::V2 {
                hierarchy,
                path,
                watch,
            } => {
                if watch.is_none() {
                    *watch = Some(
                        hierarchy
                            .watch_memory_pressure(path, ironlet_cgroups::PsiTrigger::default())
                            .map_err(std::io::Error::other)?,
                    );
                }
                Ok(())
            }
        }
    }

    /// Waits until usage crosses the armed level (v1, in either direction, as the kernel
    /// signals) or the group is under memory pressure (v2); never returns when not armed.
    pub async fn fired(&mut self) {
        match &mut self.kind {
            Kind::V1 { armed, .. } => fired_v1(armed.as_ref()).await,
            Kind::V2 { watch, .. } => {
                let Some(w) = watch else {
                    return std::future::pending().await;
                };
                match w.next().await {
                    Ok(Some(_)) => {}
                    // The group is gone or the watch failed: the period applies from now on.
                    Ok(None) | Err(_) => {
                        *watch = None;
                        std::future::pending().await
                    }
                }
            }
        }
    }
}

fn arm_v1(
    dir: &Path,
    armed: &mut Option<(u64, AsyncFd<EventFd>)>,
    capacity: u64,
    threshold: u64,
) -> std::io::Result<()> {
    let level = capacity
        .saturating_sub(threshold)
        .saturating_add(inactive_file(dir));
    if let Some((current, _)) = &armed {
        if current.abs_diff(level) < (1 << 20) {
            return Ok(());
        }
    }
    let eventfd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
    let usage = std::fs::File::open(dir.join("memory.usage_in_bytes"))?;
    let mut control = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.event_control"))?;
    control
        .write_all(format!("{} {} {level}", eventfd.as_raw_fd(), usage.as_raw_fd()).as_bytes())?;
    // SAFETY: the `EventFd` owns its descriptor, always returns that same one, and lives
    // inside the `AsyncFd` until it is dropped, so the descriptor stays open and
    // unchanged for as long as tokio has it registered.
    let fd = unsafe { AsyncFd::register(eventfd) }.map_err(|err| err.into_parts().1)?;
    // Dropping the previous eventfd closes it, which removes its registration.
    *armed = Some((level, fd));
    Ok(())
}

/// Waits until usage crosses the armed v1 level; never returns when not armed.
async fn fired_v1(armed: Option<&(u64, AsyncFd<EventFd>)>) {
    let Some((_, fd)) = armed else {
        return std::future::pending().await;
    };
    loop {
        let Ok(mut guard) = fd.readable().await else {
            return std::future::pending().await;
        };
        match guard.try_io(|inner| inner.get_ref().read().map_err(std::io::Error::from)) {
            Ok(_) => return,
            Err(_would_block) => continue,
        }
    }
}

/// The two notifiers of node-pressure eviction, set up on the first period.
#[derive(Debug, Default)]
pub struct Notifiers {
    started: bool,
    /// The root memory cgroup: `memory.available`.
    pub node: Option<MemoryNotifier>,
    /// The pods' tree: `allocatableMemory.available`.
    pub pods: Option<MemoryNotifier>,
}

impl Notifiers {
    /// Creates the notifiers (once).
    pub fn start(&mut self, cgroups: Option<&ironlet_cgroups::NodeCgroups>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let Some(cgroups) = cgroups else {
            return;
        };
        let hierarchy = cgroups.hierarchy();
        if hierarchy.is_v2() {
            let root = ironlet_cgroups::CgroupPath::root();
            if hierarchy.controller_dir("memory", cgroups.root()).is_some() {
                self.node = Some(MemoryNotifier::v2(hierarchy.clone(), root));
                self.pods = Some(MemoryNotifier::v2(
                    hierarchy.clone(),
                    cgroups.root().clone(),
                ));
            }
            return;
        }
        self.node = hierarchy
            .controller_dir("memory", &ironlet_cgroups::CgroupPath::root())
            .map(MemoryNotifier::new);
        self.pods = hierarchy
            .controller_dir("memory", cgroups.root())
            .map(MemoryNotifier::new);
    }

    /// Waits for the first notification; returns the signal whose level was crossed.
    pub async fn fired(&mut self) -> Signal {
        async fn one(n: &mut Option<MemoryNotifier>) {
            match n {
                Some(n) => n.fired().await,
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = one(&mut self.node) => Signal::MemoryAvailable,
            () = one(&mut self.pods) => Signal::AllocatableMemoryAvailable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inactive_file_is_read_from_memory_stat() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("memory.stat"),
            "cache 10\ninactive_file 5\ntotal_inactive_file 4096\n",
        )
        .unwrap();
        assert_eq!(inactive_file(dir.path()), 4096);
        assert_eq!(inactive_file(&dir.path().join("missing")), 0);
    }

    /// On pure cgroup v2 (scripts/cgroup2-vm; skipped elsewhere): a hog in a pod pushing
    /// the pods' tree above its limit (`memory.high` here) wakes the pods' notifier within
    /// a second, as `allocatableMemory.available`. Before the v2 notifier there was none
    /// on v2 and this timed out.
    #[tokio::test]
    async fn v2_pods_tree_pressure_wakes_the_notifier_within_a_second() {
        use ironlet_cgroups::{CgroupSettings, Hierarchy, NodeCgroups, QosClass};
        use std::time::{Duration, Instant};

        let test = "v2_pods_tree_pressure_wakes_the_notifier_within_a_second";
        let hierarchy = match Hierarchy::detect() {
            Ok(h) if h.is_v2() && nix::unistd::geteuid().is_root() => h,
            _ => {
                eprintln!("skipping {test}: needs root on cgroup v2 (scripts/cgroup2-vm)");
                return;
            }
        };
        let memory = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
        if !memory {
            eprintln!("skipping {test}: no memory controller");
            return;
        }
        let node = NodeCgroups::ensure(
            hierarchy.clone(),
            &format!("ironlet-test-notifier-{}", std::process::id()),
        )
        .unwrap();
        let cleanup = scopeguard(node.clone());
        let root_dir = hierarchy.controller_dir("memory", node.root()).unwrap();
        std::fs::write(root_dir.join("memory.high"), (32u64 << 20).to_string()).unwrap();
        let pod = node.pod_path(QosClass::Burstable, "hog").unwrap();
        node.create_pod(&pod, &CgroupSettings::default()).unwrap();
        let container = node.container_path(&pod, "hog").unwrap();
        node.create_container(&container, &CgroupSettings::default())
            .unwrap();
        let container_dir = hierarchy.controller_dir("memory", &container).unwrap();

        let mut notifiers = Notifiers::default();
        notifiers.start(Some(&node));
        for n in [&mut notifiers.node, &mut notifiers.pods] {
            n.as_mut()
                .expect("v2 notifiers are created")
                .arm(8 << 30, 100 << 20)
                .unwrap();
        }
        let quiet = tokio::time::timeout(Duration::from_millis(500), notifiers.fired()).await;
        assert!(quiet.is_err(), "notified without pressure: {quiet:?}");

        // The instant the tree first went above its limit, seen by polling its counter.
        let events = root_dir.join("memory.events.local");
        let crossed = tokio::spawn(async move {
            loop {
                let high = std::fs::read_to_string(&events).ok().and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("high "))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                });
                if high.is_some_and(|h| h > 0) {
                    return Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let mut hog = std::process::Command::new("sh")
            .args([
                "-c",
                "echo $$ > \"$0/cgroup.procs\" && exec dd if=/dev/zero of=/dev/null bs=96M count=1",
            ])
            .arg(&container_dir)
            .spawn()
            .unwrap();
        let signal = tokio::time::timeout(Duration::from_secs(10), notifiers.fired()).await;
        let notified_at = Instant::now();
        let crossed = tokio::time::timeout(Duration::from_secs(5), crossed).await;
        let _ = hog.kill();
        let _ = hog.wait();
        drop(cleanup);
        let signal = signal.expect("no notification while the pods' tree is 3x above its limit");
        assert_eq!(signal, Signal::AllocatableMemoryAvailable);
        let crossed = crossed
            .expect("memory.events.local never counted `high`")
            .unwrap();
        let elapsed = notified_at.saturating_duration_since(crossed);
        assert!(
            elapsed <= Duration::from_secs(1),
            "notified {elapsed:?} after crossing"
        );
        eprintln!("{test}: notified {elapsed:?} after crossing");
    }

    /// Removes the test's node tree when dropped (also when an assertion fails).
    fn scopeguard(node: ironlet_cgroups::NodeCgroups) -> impl Drop {
        struct Guard(ironlet_cgroups::NodeCgroups);
        impl Drop for Guard {
            fn drop(&mut self) {
                let _ = self.0.remove(self.0.root());
            }
        }
        Guard(node)
    }
}

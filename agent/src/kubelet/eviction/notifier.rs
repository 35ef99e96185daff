//! Memory threshold notifications (kubelet's `memoryThresholdNotifier` and
//! `linuxCgroupNotifier`), so that memory pressure is seen when it happens rather than at
//! the next monitoring period: on cgroup v1 an eventfd registered in the memory cgroup's
//! `cgroup.event_control` on `memory.usage_in_bytes` fires when usage crosses
//! `capacity − threshold + inactive_file` (usage counts the page cache; the working set
//! does not count inactive file pages). The level is re-armed at every period, as kubelet
//! does, since inactive_file moves.
//!
//! One notifier watches the root memory cgroup (`memory.available`), one the pods' tree
//! (`allocatableMemory.available`). cgroup v2 has no usage threshold event (kubelet has no
//! notifier there either): the monitoring period applies.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::unix::AsyncFd;

use super::thresholds::Signal;

/// A re-armable usage threshold event on one v1 memory cgroup.
#[derive(Debug)]
pub struct MemoryNotifier {
    dir: PathBuf,
    armed: Option<(u64, AsyncFd<EventFd>)>,
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
        Self { dir, armed: None }
    }

    /// Arms (or re-arms) the event for `available < threshold` of `capacity` bytes.
    /// Unchanged levels (within 1 MiB) keep the current registration.
    pub fn arm(&mut self, capacity: u64, threshold: u64) -> std::io::Result<()> {
        let level = capacity
            .saturating_sub(threshold)
            .saturating_add(inactive_file(&self.dir));
        if let Some((current, _)) = &self.armed {
            if current.abs_diff(level) < (1 << 20) {
                return Ok(());
            }
        }
        let eventfd =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        let usage = std::fs::File::open(self.dir.join("memory.usage_in_bytes"))?;
        let mut control = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.event_control"))?;
        control.write_all(
            format!("{} {} {level}", eventfd.as_raw_fd(), usage.as_raw_fd()).as_bytes(),
        )?;
        // SAFETY: the `EventFd` owns its descriptor, always returns that same one, and lives
        // inside the `AsyncFd` until it is dropped, so the descriptor stays open and
        // unchanged for as long as tokio has it registered.
        let fd = unsafe { AsyncFd::register(eventfd) }.map_err(|err| err.into_parts().1)?;
        // Dropping the previous eventfd closes it, which removes its registration.
        self.armed = Some((level, fd));
        Ok(())
    }

    /// Waits until usage crosses the armed level (in either direction, as the kernel
    /// signals); never returns when not armed.
    pub async fn fired(&mut self) {
        let Some((_, fd)) = &self.armed else {
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
    /// Creates the notifiers on cgroup v1 (once).
    pub fn start(&mut self, cgroups: Option<&ironlet_cgroups::NodeCgroups>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let Some(cgroups) = cgroups.filter(|c| !c.hierarchy().is_v2()) else {
            return;
        };
        let hierarchy = cgroups.hierarchy();
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
}

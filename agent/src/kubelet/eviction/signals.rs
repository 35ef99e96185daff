//! Reading the eviction signals on this machine (kubelet's `makeSignalObservations`, from
//! the same sources as the Summary API; see [`super::thresholds`] for the table).

use std::path::Path;

use ironlet_cgroups::{MachineUsage, NodeCgroups};

use super::manager::{Observation, Observations};
use super::thresholds::Signal;

/// Where the signals are read.
#[derive(Debug, Clone)]
pub struct SignalSources<'a> {
    /// `--root-dir`: the node filesystem.
    pub root_dir: &'a Path,
    /// The image store's directory (the image filesystem).
    pub image_dir: &'a Path,
    /// The pods' cgroup tree (`allocatableMemory.available`); none rootless.
    pub cgroups: Option<&'a NodeCgroups>,
    /// Memory pods may use: capacity − system and kube reservations, bytes.
    pub allocatable_memory_bytes: u64,
}

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Reads every signal it can; a source that cannot be read leaves its signals out (and so
/// unmet), with a debug log.
// statvfs's field types are narrower than u64 on some targets.
#[allow(clippy::unnecessary_cast)]
pub fn observe(sources: &SignalSources<'_>) -> Observations {
    let mut out = Observations::new();
    match MachineUsage::read() {
        Ok(machine) => {
            out.insert(
                Signal::MemoryAvailable,
                Observation {
                    available: clamp(machine.memory_total_bytes)
                        - clamp(machine.memory_working_set_bytes),
                    capacity: machine.memory_total_bytes,
                },
            );
        }
        Err(err) => tracing::debug!(%err, "cannot read the node's memory usage"),
    }
    if let Some(cgroups) = sources.cgroups {
        match cgroups.hierarchy().usage(cgroups.root()) {
            Ok(usage) => {
                out.insert(
                    Signal::AllocatableMemoryAvailable,
                    Observation {
                        available: clamp(sources.allocatable_memory_bytes)
                            - clamp(usage.memory_working_set_bytes),
                        capacity: sources.allocatable_memory_bytes,
                    },
                );
            }
            Err(err) => tracing::debug!(%err, "cannot read the pods' cgroup usage"),
        }
    }
    for (dir, bytes, inodes) in [
        (
            sources.root_dir,
            Signal::NodeFsAvailable,
            Signal::NodeFsInodesFree,
        ),
        (
            sources.image_dir,
            Signal::ImageFsAvailable,
            Signal::ImageFsInodesFree,
        ),
    ] {
        let existing = dir
            .ancestors()
            .find(|d| d.exists())
            .unwrap_or(Path::new("/"));
        match nix::sys::statvfs::statvfs(existing) {
            Ok(stat) => {
                let fragment = stat.fragment_size() as u64;
                out.insert(
                    bytes,
                    Observation {
                        available: clamp((stat.blocks_available() as u64).saturating_mul(fragment)),
                        capacity: (stat.blocks() as u64).saturating_mul(fragment),
                    },
                );
                out.insert(
                    inodes,
                    Observation {
                        available: clamp(stat.files_free() as u64),
                        capacity: stat.files() as u64,
                    },
                );
            }
            Err(err) => tracing::debug!(%err, dir = %existing.display(), "cannot statvfs"),
        }
    }
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    let procs = nix::sys::sysinfo::sysinfo().map(|i| u64::from(i.process_count()));
    if let (Some(max), Ok(procs)) = (pid_max, procs) {
        out.insert(
            Signal::PidAvailable,
            Observation {
                available: clamp(max) - clamp(procs),
                capacity: max,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_reports_memory_disk_and_pids() {
        let dir = tempfile::tempdir().unwrap();
        let observed = observe(&SignalSources {
            root_dir: dir.path(),
            image_dir: &dir.path().join("images"),
            cgroups: None,
            allocatable_memory_bytes: 0,
        });
        let memory = observed[&Signal::MemoryAvailable];
        assert!(memory.available > 0 && (memory.available as u64) < memory.capacity);
        let (nodefs, imagefs) = (
            observed[&Signal::NodeFsAvailable],
            observed[&Signal::ImageFsAvailable],
        );
        // The same file system, read twice: other processes write between the two reads.
        assert_eq!(nodefs.capacity, imagefs.capacity, "same filesystem");
        assert!(
            nodefs.available.abs_diff(imagefs.available) < 256 << 20,
            "same filesystem: {nodefs:?} {imagefs:?}"
        );
        assert!(observed[&Signal::NodeFsInodesFree].capacity > 0);
        let pids = observed[&Signal::PidAvailable];
        assert!(pids.available > 0 && (pids.available as u64) < pids.capacity);
        assert!(!observed.contains_key(&Signal::AllocatableMemoryAvailable));
    }
}

//! [`NodeCapacity`]: what the node offers pods, for `status.capacity` and admission.
//!
//! * `cpu_milli`: CPUs in the hierarchy root's effective cpuset (v1 `cpuset.effective_cpus`, v2
//!   `cpuset.cpus.effective`) × 1000 — the CPUs `/kubepods` can use. Where the root has no cpuset
//!   file, the CPUs this process may run on (`sched_getaffinity`).
//! * `memory_bytes`: `MemTotal` from `/proc/meminfo`.
//! * `pids`: `/proc/sys/kernel/pid_max`.

use std::path::Path;

use crate::error::{Error, Result};
use crate::fs;
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;

const MEMINFO: &str = "/proc/meminfo";
const PID_MAX: &str = "/proc/sys/kernel/pid_max";

/// The node's raw capacity (before system reservations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCapacity {
    /// Usable CPUs in millicores.
    pub cpu_milli: u64,
    /// Physical memory in bytes.
    pub memory_bytes: u64,
    /// Maximum number of process ids.
    pub pids: u64,
}

impl NodeCapacity {
    /// Reads the capacity of this machine. See the module docs for the sources.
    pub fn read(hierarchy: &Hierarchy) -> Result<Self> {
        let cpus = match root_cpuset(hierarchy) {
            Some(file) => {
                let list = fs::read(&file)?;
                count_cpu_list(&list).ok_or_else(|| Error::Parse {
                    path: file.clone(),
                    reason: format!("not a CPU list: {:?}", list.trim()),
                })?
            }
            None => affinity_cpus()?,
        };
        let meminfo_path = Path::new(MEMINFO);
        let memory_bytes =
            mem_total_bytes(&fs::read(meminfo_path)?).ok_or_else(|| Error::Parse {
                path: meminfo_path.to_path_buf(),
                reason: "no MemTotal line in kB".to_owned(),
            })?;
        Ok(Self {
            cpu_milli: cpus.saturating_mul(1000),
            memory_bytes,
            pids: fs::read_u64(Path::new(PID_MAX))?,
        })
    }
}

fn root_cpuset(hierarchy: &Hierarchy) -> Option<std::path::PathBuf> {
    let (controller_dir, file) = match hierarchy {
        Hierarchy::V1 { .. } => (
            hierarchy.controller_dir("cpuset", &CgroupPath::root())?,
            "cpuset.effective_cpus",
        ),
        Hierarchy::V2 { root } => (root.clone(), "cpuset.cpus.effective"),
    };
    let path = controller_dir.join(file);
    path.exists().then_some(path)
}

fn affinity_cpus() -> Result<u64> {
    let set =
        nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).map_err(|e| Error::Read {
            path: "sched_getaffinity".into(),
            source: e.into(),
        })?;
    let count = (0..nix::sched::CpuSet::count())
        .filter(|cpu| set.is_set(*cpu).unwrap_or(false))
        .count();
    Ok(u64::try_from(count).unwrap_or(u64::MAX))
}

/// Counts the CPUs of a kernel CPU list such as `0-3,8,10-11`. `None` if malformed.
pub(crate) fn count_cpu_list(list: &str) -> Option<u64> {
    let list = list.trim();
    if list.is_empty() {
        return Some(0);
    }
    list.split(',').try_fold(0u64, |total, range| {
        let n = match range.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi): (u64, u64) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
                hi.checked_sub(lo)? + 1
            }
            None => {
                range.trim().parse::<u64>().ok()?;
                1
            }
        };
        Some(total + n)
    })
}

/// `MemTotal:  24681234 kB` → bytes.
pub(crate) fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let kib: u64 = fields.next()?.parse().ok()?;
    (fields.next() == Some("kB")).then(|| kib.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_ranges_and_singles() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("5"), Some(1));
        assert_eq!(count_cpu_list(""), Some(0));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("a-b"), None);
    }

    #[test]
    fn mem_total_is_read_in_kib() {
        let meminfo = "MemTotal:       24681234 kB\nMemFree:        21747000 kB\n";
        assert_eq!(mem_total_bytes(meminfo), Some(24_681_234 * 1024));
        assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn this_machine_reports_plausible_capacity() {
        let hierarchy = Hierarchy::detect().unwrap();
        let capacity = NodeCapacity::read(&hierarchy).unwrap();
        assert!(capacity.cpu_milli >= 1000, "{capacity:?}");
        assert!(capacity.memory_bytes > 64 << 20, "{capacity:?}");
        assert!(capacity.pids >= 301, "{capacity:?}");
    }
}

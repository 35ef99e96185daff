//! `Hierarchy::usage` and `Hierarchy::oom_kill_count`: resource accounting of one cgroup
//! (including its descendants), for admission, eviction and the stats API.
//!
//! | field                       | v1                                              | v2                                  |
//! |-----------------------------|-------------------------------------------------|-------------------------------------|
//! | `cpu_usage_nanos`           | `cpuacct.usage`                                 | `cpu.stat` `usage_usec` × 1000      |
//! | `memory_usage_bytes`        | `memory.usage_in_bytes`                         | `memory.current`                    |
//! | `memory_working_set_bytes`  | usage − `memory.stat` `total_inactive_file`     | usage − `memory.stat` `inactive_file` |
//! | `pids_current`              | `pids.current`                                  | `pids.current`                      |
//! | OOM kills                   | Σ `memory.oom_control` `oom_kill` over subtree  | `memory.events` `oom_kill`          |
//!
//! The working set is cAdvisor's definition (what kubelet evicts on), floored at zero. All of these
//! are hierarchical; v1's `oom_kill` is per cgroup (counted where the victim lived), so it is summed
//! over the subtree to match v2. These files do not exist in the hierarchy root.

use std::path::Path;

use crate::error::Result;
use crate::fs;
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;

/// A snapshot of one cgroup's resource usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// Cumulative CPU time, nanoseconds.
    pub cpu_usage_nanos: u64,
    /// Charged memory, bytes (page cache included).
    pub memory_usage_bytes: u64,
    /// Memory usage minus inactive file pages, bytes.
    pub memory_working_set_bytes: u64,
    /// Number of tasks (threads included).
    pub pids_current: u64,
}

impl Hierarchy {
    /// Reads the usage of cgroup `path`. See the module docs for the sources.
    pub fn usage(&self, path: &CgroupPath) -> Result<CgroupUsage> {
        match self {
            Self::V1 { .. } => {
                let cpuacct = self.require_dir("cpuacct", path)?;
                let memory = self.require_dir("memory", path)?;
                let pids = self.require_dir("pids", path)?;
                let memory_usage = fs::read_u64(&memory.join("memory.usage_in_bytes"))?;
                Ok(CgroupUsage {
                    cpu_usage_nanos: fs::read_u64(&cpuacct.join("cpuacct.usage"))?,
                    memory_usage_bytes: memory_usage,
                    memory_working_set_bytes: working_set(
                        &memory,
                        memory_usage,
                        "total_inactive_file",
                    )?,
                    pids_current: fs::read_u64(&pids.join("pids.current"))?,
                })
            }
            Self::V2 { .. } => {
                let dir = self.require_dir("memory", path)?;
                let cpu_stat_path = dir.join("cpu.stat");
                let cpu_stat = fs::read(&cpu_stat_path)?;
                let usage_usec = fs::required_keyed_value(&cpu_stat_path, &cpu_stat, "usage_usec")?;
                let memory_usage = fs::read_u64(&dir.join("memory.current"))?;
                Ok(CgroupUsage {
                    cpu_usage_nanos: usage_usec.saturating_mul(1000),
                    memory_usage_bytes: memory_usage,
                    memory_working_set_bytes: working_set(&dir, memory_usage, "inactive_file")?,
                    pids_current: fs::read_u64(&dir.join("pids.current"))?,
                })
            }
        }
    }

    /// The number of processes the OOM killer killed in cgroup `path` and its descendants.
    pub fn oom_kill_count(&self, path: &CgroupPath) -> Result<u64> {
        let dir = self.require_dir("memory", path)?;
        match self {
            Self::V1 { .. } => {
                let mut total = 0u64;
                for sub in fs::subtree(&dir)? {
                    total = total.saturating_add(oom_kills_in(&sub.join("memory.oom_control"))?);
                }
                Ok(total)
            }
            Self::V2 { .. } => oom_kills_in(&dir.join("memory.events")),
        }
    }
}

fn working_set(memory_dir: &Path, usage: u64, inactive_key: &str) -> Result<u64> {
    let stat_path = memory_dir.join("memory.stat");
    let stat = fs::read(&stat_path)?;
    let inactive = fs::keyed_value(&stat_path, &stat, inactive_key)?.unwrap_or(0);
    Ok(usage.saturating_sub(inactive))
}

/// The `oom_kill` counter of a v1 `memory.oom_control` or v2 `memory.events` file. A file that
/// vanished with its cgroup counts zero; a kernel without the counter (before 4.13) counts zero.
pub(crate) fn oom_kills_in(file: &Path) -> Result<u64> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => {
            return Err(crate::error::Error::Read {
                path: file.to_path_buf(),
                source,
            })
        }
    };
    Ok(fs::keyed_value(file, &text, "oom_kill")?.unwrap_or(0))
}

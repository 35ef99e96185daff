//! `Hierarchy::usage` and `Hierarchy::oom_kill_count`: resource accounting of one cgroup
//! (including its descendants), for admission, eviction and the stats API.
//!
//! | field                       | v1                                              | v2                                  |
//! |-----------------------------|-------------------------------------------------|-------------------------------------|
//! | `cpu_usage_nanos`           | `cpuacct.usage`                                 | `cpu.stat` `usage_usec` × 1000      |
//! | `memory_usage_bytes`        | `memory.usage_in_bytes`                         | `memory.current`                    |
//! | `memory_working_set_bytes`  | usage − `memory.stat` `total_inactive_file`     | usage − `memory.stat` `inactive_file` |
//! | `memory_rss_bytes`          | `memory.stat` `total_rss`                       | `memory.stat` `anon`                |
//! | `page_faults`               | `memory.stat` `total_pgfault`                   | `memory.stat` `pgfault`             |
//! | `major_page_faults`         | `memory.stat` `total_pgmajfault`                | `memory.stat` `pgmajfault`          |
//! | `pids_current`              | `pids.current`                                  | `pids.current`                      |
//! | OOM kills                   | Σ `memory.oom_control` `oom_kill` over subtree  | `memory.events` `oom_kill`          |
//!
//! The working set and RSS are cAdvisor's definitions (what kubelet reports in its Summary API
//! and evicts on); the working set is floored at zero. All of these are hierarchical; v1's
//! `oom_kill` is per cgroup (counted where the victim lived), so it is summed over the subtree
//! to match v2. These files do not exist in the hierarchy root: the node's figures come from
//! [`crate::MachineUsage`].
//!
//! The parsing is split from the reading ([`CgroupUsage::from_v1`], [`CgroupUsage::from_v2`]), so
//! both versions are tested on fixture files on any machine.

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
    /// Anonymous memory (cAdvisor's RSS), bytes.
    pub memory_rss_bytes: u64,
    /// Cumulative page faults.
    pub page_faults: u64,
    /// Cumulative major page faults.
    pub major_page_faults: u64,
    /// Number of tasks (threads included).
    pub pids_current: u64,
}

/// The `memory.stat` keys of one cgroup version.
struct StatKeys {
    inactive_file: &'static str,
    rss: &'static str,
    pgfault: &'static str,
    pgmajfault: &'static str,
}

const V1_KEYS: StatKeys = StatKeys {
    inactive_file: "total_inactive_file",
    rss: "total_rss",
    pgfault: "total_pgfault",
    pgmajfault: "total_pgmajfault",
};

const V2_KEYS: StatKeys = StatKeys {
    inactive_file: "inactive_file",
    rss: "anon",
    pgfault: "pgfault",
    pgmajfault: "pgmajfault",
};

/// The contents of the files a v1 readout needs, and where they were read (for errors).
#[derive(Debug, Clone, Copy)]
pub struct V1Files<'a> {
    /// `cpuacct/…/cpuacct.usage`.
    pub cpuacct_usage: &'a str,
    /// `memory/…/memory.usage_in_bytes`.
    pub memory_usage: &'a str,
    /// `memory/…/memory.stat`.
    pub memory_stat: &'a str,
    /// `pids/…/pids.current`.
    pub pids_current: &'a str,
    /// The cgroup's memory directory, named in parse errors.
    pub dir: &'a Path,
}

/// The contents of the files a v2 readout needs, and where they were read (for errors).
#[derive(Debug, Clone, Copy)]
pub struct V2Files<'a> {
    /// `cpu.stat`.
    pub cpu_stat: &'a str,
    /// `memory.current`.
    pub memory_current: &'a str,
    /// `memory.stat`.
    pub memory_stat: &'a str,
    /// `pids.current`.
    pub pids_current: &'a str,
    /// The cgroup's directory, named in parse errors.
    pub dir: &'a Path,
}

impl CgroupUsage {
    /// Parses a v1 readout (see the module docs).
    pub fn from_v1(files: &V1Files<'_>) -> Result<Self> {
        let dir = files.dir;
        let memory_usage = fs::parse_u64(
            &dir.join("memory.usage_in_bytes"),
            files.memory_usage.trim(),
        )?;
        let mut usage = Self {
            cpu_usage_nanos: fs::parse_u64(&dir.join("cpuacct.usage"), files.cpuacct_usage.trim())?,
            memory_usage_bytes: memory_usage,
            pids_current: fs::parse_u64(&dir.join("pids.current"), files.pids_current.trim())?,
            ..Self::default()
        };
        usage.memory_stat(&dir.join("memory.stat"), files.memory_stat, &V1_KEYS)?;
        Ok(usage)
    }

    /// Parses a v2 readout (see the module docs).
    pub fn from_v2(files: &V2Files<'_>) -> Result<Self> {
        let dir = files.dir;
        let usage_usec =
            fs::required_keyed_value(&dir.join("cpu.stat"), files.cpu_stat, "usage_usec")?;
        let mut usage = Self {
            cpu_usage_nanos: usage_usec.saturating_mul(1000),
            memory_usage_bytes: fs::parse_u64(
                &dir.join("memory.current"),
                files.memory_current.trim(),
            )?,
            pids_current: fs::parse_u64(&dir.join("pids.current"), files.pids_current.trim())?,
            ..Self::default()
        };
        usage.memory_stat(&dir.join("memory.stat"), files.memory_stat, &V2_KEYS)?;
        Ok(usage)
    }

    /// Fills the `memory.stat` figures; `memory_usage_bytes` must be set.
    fn memory_stat(&mut self, path: &Path, text: &str, keys: &StatKeys) -> Result<()> {
        let value = |key| fs::keyed_value(path, text, key).map(Option::unwrap_or_default);
        let inactive = value(keys.inactive_file)?;
        self.memory_working_set_bytes = self.memory_usage_bytes.saturating_sub(inactive);
        self.memory_rss_bytes = value(keys.rss)?;
        self.page_faults = value(keys.pgfault)?;
        self.major_page_faults = value(keys.pgmajfault)?;
        Ok(())
    }
}

impl Hierarchy {
    /// Reads the usage of cgroup `path`. See the module docs for the sources.
    pub fn usage(&self, path: &CgroupPath) -> Result<CgroupUsage> {
        match self {
            Self::V1 { .. } => {
                let cpuacct = self.require_dir("cpuacct", path)?;
                let memory = self.require_dir("memory", path)?;
                let pids = self.require_dir("pids", path)?;
                CgroupUsage::from_v1(&V1Files {
                    cpuacct_usage: &fs::read(&cpuacct.join("cpuacct.usage"))?,
                    memory_usage: &fs::read(&memory.join("memory.usage_in_bytes"))?,
                    memory_stat: &fs::read(&memory.join("memory.stat"))?,
                    pids_current: &fs::read(&pids.join("pids.current"))?,
                    dir: &memory,
                })
            }
            Self::V2 { .. } => {
                let dir = self.require_dir("memory", path)?;
                CgroupUsage::from_v2(&V2Files {
                    cpu_stat: &fs::read(&dir.join("cpu.stat"))?,
                    memory_current: &fs::read(&dir.join("memory.current"))?,
                    memory_stat: &fs::read(&dir.join("memory.stat"))?,
                    pids_current: &fs::read(&dir.join("pids.current"))?,
                    dir: &dir,
                })
            }
        }
    }

    /// The processes in cgroup `path` and its descendants (pids, not threads), as listed in
    /// the memory controller's (v1) or the unified (v2) `cgroup.procs` files: what the stats
    /// API counts and where it finds a pod's network namespace. A missing cgroup has none.
    pub fn processes(&self, path: &CgroupPath) -> Result<Vec<i32>> {
        fs::procs_recursive(&self.require_dir("memory", path)?)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;

    /// v1 `memory.stat` as this kernel writes it (local then hierarchical `total_` keys).
    const V1_MEMORY_STAT: &str = "cache 13582336\nrss 8998912\nrss_huge 0\nshmem 9084928\n\
        pgfault 45421\npgmajfault 0\ninactive_anon 0\nactive_anon 1531904\n\
        inactive_file 24576\nactive_file 4472832\nunevictable 0\n\
        hierarchical_memory_limit 9223372036854771712\n\
        total_cache 41943040\ntotal_rss 52428800\ntotal_rss_huge 0\n\
        total_pgfault 16788633\ntotal_pgmajfault 1497\ntotal_inactive_anon 0\n\
        total_active_anon 52428800\ntotal_inactive_file 10485760\ntotal_active_file 31457280\n";

    /// v2 `memory.stat` (abridged: the keys are in the kernel's order).
    const V2_MEMORY_STAT: &str = "anon 52428800\nfile 41943040\nkernel 1048576\nsock 0\n\
        shmem 0\nfile_mapped 4096\nactive_anon 52428800\ninactive_anon 0\n\
        active_file 31457280\ninactive_file 10485760\nunevictable 0\n\
        pgfault 16788633\npgmajfault 1497\n";

    const V2_CPU_STAT: &str = "usage_usec 2500123\nuser_usec 2000000\nsystem_usec 500123\n\
        nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n";

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ironlet-usage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    const EXPECTED: CgroupUsage = CgroupUsage {
        cpu_usage_nanos: 2_500_123_000,
        memory_usage_bytes: 94_371_840,
        memory_working_set_bytes: 94_371_840 - 10_485_760,
        memory_rss_bytes: 52_428_800,
        page_faults: 16_788_633,
        major_page_faults: 1497,
        pids_current: 3,
    };

    #[test]
    fn v1_readout_takes_the_hierarchical_total_keys() {
        let root = scratch("v1");
        let mut mounts = BTreeMap::new();
        for controller in ["cpuacct", "memory", "pids"] {
            mounts.insert(controller.to_owned(), root.join(controller));
        }
        let pod = CgroupPath::new("/kubepods/podu").unwrap();
        write(
            &pod.under(&root.join("cpuacct")),
            &[("cpuacct.usage", "2500123000\n")],
        );
        write(
            &pod.under(&root.join("memory")),
            &[
                ("memory.usage_in_bytes", "94371840\n"),
                ("memory.stat", V1_MEMORY_STAT),
            ],
        );
        write(&pod.under(&root.join("pids")), &[("pids.current", "3\n")]);
        let usage = Hierarchy::V1 { mounts }.usage(&pod);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(usage.unwrap(), EXPECTED);
    }

    #[test]
    fn v2_readout_takes_usage_usec_anon_and_inactive_file() {
        let root = scratch("v2");
        let pod = CgroupPath::new("/kubepods/podu").unwrap();
        write(
            &pod.under(&root),
            &[
                ("cpu.stat", V2_CPU_STAT),
                ("memory.current", "94371840\n"),
                ("memory.stat", V2_MEMORY_STAT),
                ("pids.current", "3\n"),
            ],
        );
        let usage = Hierarchy::V2 { root: root.clone() }.usage(&pod);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(usage.unwrap(), EXPECTED);
    }

    #[test]
    fn working_set_is_floored_at_zero_and_missing_keys_count_zero() {
        let usage = CgroupUsage::from_v2(&V2Files {
            cpu_stat: "usage_usec 1\n",
            memory_current: "100\n",
            memory_stat: "inactive_file 4096\n",
            pids_current: "0\n",
            dir: Path::new("/c"),
        })
        .unwrap();
        assert_eq!(usage.memory_working_set_bytes, 0);
        assert_eq!((usage.memory_rss_bytes, usage.page_faults), (0, 0));
    }

    #[test]
    fn malformed_files_are_errors_naming_the_file() {
        let good = V1Files {
            cpuacct_usage: "1\n",
            memory_usage: "2\n",
            memory_stat: V1_MEMORY_STAT,
            pids_current: "1\n",
            dir: Path::new("/sys/fs/cgroup/memory/x"),
        };
        let err = CgroupUsage::from_v1(&V1Files {
            memory_usage: "lots\n",
            ..good
        })
        .unwrap_err();
        assert!(err.to_string().contains("memory.usage_in_bytes"), "{err}");
        let bad_stat = CgroupUsage::from_v1(&V1Files {
            memory_stat: "total_rss -1\n",
            ..good
        });
        assert!(bad_stat.is_err());
        let no_usage = CgroupUsage::from_v2(&V2Files {
            cpu_stat: "user_usec 1\n",
            memory_current: "1\n",
            memory_stat: "",
            pids_current: "1\n",
            dir: Path::new("/c"),
        });
        assert!(no_usage.is_err());
    }
}

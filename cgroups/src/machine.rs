//! [`MachineUsage`]: the node's own CPU and memory figures, for the stats API's `node` entry
//! (cAdvisor's root container), read the same way on cgroup v1 and v2.
//!
//! | field                       | source                                                        |
//! |-----------------------------|---------------------------------------------------------------|
//! | `cpu_usage_nanos`           | `/proc/stat` `cpu` line: user+nice+system+irq+softirq+steal jiffies × (10⁹ / `CLK_TCK`) |
//! | `memory_total_bytes`        | `/proc/meminfo` `MemTotal`                                    |
//! | `memory_available_bytes`    | `/proc/meminfo` `MemAvailable`                                |
//! | `memory_usage_bytes`        | `MemTotal − MemFree` (cAdvisor's root on v2)                   |
//! | `memory_working_set_bytes`  | usage − `Inactive(file)`, floored at zero                      |
//! | `memory_rss_bytes`          | `/proc/meminfo` `AnonPages`                                   |
//! | `page_faults`, `major_page_faults` | `/proc/vmstat` `pgfault`, `pgmajfault`                 |
//!
//! The root cgroup has no usage files on v2 (and on v1 they miss what runs outside any
//! accounting), so `/proc` is the one source that means the same on every machine. Guest time
//! is already part of user time in `/proc/stat`, idle and iowait are not busy time.
//! Parsing ([`MachineUsage::parse`]) is split from reading, and tested on fixtures.

use std::path::Path;

use crate::error::{Error, Result};
use crate::fs;

const PROC_STAT: &str = "/proc/stat";
const PROC_MEMINFO: &str = "/proc/meminfo";
const PROC_VMSTAT: &str = "/proc/vmstat";
/// The unit of `/proc/stat` (`USER_HZ`, `sysconf(_SC_CLK_TCK)`): 100 on every architecture
/// Linux exports to user space the same way (x86, arm64, riscv, …).
const USER_HZ: u64 = 100;

/// A snapshot of the whole machine's usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MachineUsage {
    /// Cumulative busy CPU time over all CPUs, nanoseconds.
    pub cpu_usage_nanos: u64,
    /// Physical memory, bytes.
    pub memory_total_bytes: u64,
    /// Memory available for new work without swapping, bytes.
    pub memory_available_bytes: u64,
    /// Memory in use (page cache included), bytes.
    pub memory_usage_bytes: u64,
    /// Usage minus inactive file pages, bytes.
    pub memory_working_set_bytes: u64,
    /// Anonymous memory, bytes.
    pub memory_rss_bytes: u64,
    /// Cumulative page faults.
    pub page_faults: u64,
    /// Cumulative major page faults.
    pub major_page_faults: u64,
}

impl MachineUsage {
    /// Reads `/proc/stat`, `/proc/meminfo` and `/proc/vmstat`.
    pub fn read() -> Result<Self> {
        Self::parse(
            &fs::read(Path::new(PROC_STAT))?,
            &fs::read(Path::new(PROC_MEMINFO))?,
            &fs::read(Path::new(PROC_VMSTAT))?,
            USER_HZ,
        )
    }

    /// Parses the three files; `ticks_per_second` is `CLK_TCK`.
    pub fn parse(stat: &str, meminfo: &str, vmstat: &str, ticks_per_second: u64) -> Result<Self> {
        let stat_path = Path::new(PROC_STAT);
        let cpu = stat
            .lines()
            .find_map(|line| line.strip_prefix("cpu "))
            .ok_or_else(|| Error::Parse {
                path: stat_path.to_path_buf(),
                reason: "no aggregate \"cpu\" line".to_owned(),
            })?;
        let fields = cpu
            .split_whitespace()
            .map(|f| fs::parse_u64(stat_path, f))
            .collect::<Result<Vec<u64>>>()?;
        // user nice system idle iowait irq softirq steal guest guest_nice
        let busy: u64 = [0usize, 1, 2, 5, 6, 7]
            .iter()
            .filter_map(|i| fields.get(*i))
            .fold(0u64, |sum, v| sum.saturating_add(*v));
        let nanos_per_tick = 1_000_000_000 / ticks_per_second.max(1);

        let meminfo_path = Path::new(PROC_MEMINFO);
        let kib = |key: &str| -> Result<u64> {
            let value = meminfo
                .lines()
                .filter_map(|line| line.split_once(':'))
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.trim().trim_end_matches("kB").trim())
                .ok_or_else(|| Error::Parse {
                    path: meminfo_path.to_path_buf(),
                    reason: format!("missing key {key:?}"),
                })?;
            Ok(fs::parse_u64(meminfo_path, value)?.saturating_mul(1024))
        };
        let total = kib("MemTotal")?;
        let usage = total.saturating_sub(kib("MemFree")?);
        let vmstat_path = Path::new(PROC_VMSTAT);
        Ok(Self {
            cpu_usage_nanos: busy.saturating_mul(nanos_per_tick),
            memory_total_bytes: total,
            memory_available_bytes: kib("MemAvailable")?,
            memory_usage_bytes: usage,
            memory_working_set_bytes: usage.saturating_sub(kib("Inactive(file)")?),
            memory_rss_bytes: kib("AnonPages")?,
            page_faults: fs::keyed_value(vmstat_path, vmstat, "pgfault")?.unwrap_or(0),
            major_page_faults: fs::keyed_value(vmstat_path, vmstat, "pgmajfault")?.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  28055 3 8135 114847 441 7 85 30 12 0\n\
                        cpu0 13773 0 3714 58282 44 0 9 9 0 0\n\
                        intr 1 2 3\nctxt 99\n";
    const MEMINFO: &str = "MemTotal:       24684084 kB\n\
                           MemFree:        16491508 kB\n\
                           MemAvailable:   23387200 kB\n\
                           Buffers:          100000 kB\n\
                           Inactive(anon):   704036 kB\n\
                           Inactive(file):  4402056 kB\n\
                           AnonPages:        713800 kB\n";
    const VMSTAT: &str = "nr_free_pages 4122877\npgfault 16790062\npgmajfault 1497\n";

    #[test]
    fn busy_jiffies_memory_and_faults_are_parsed() {
        let usage = MachineUsage::parse(STAT, MEMINFO, VMSTAT, 100).unwrap();
        // user 28055 + nice 3 + system 8135 + irq 7 + softirq 85 + steal 30 (guest excluded).
        assert_eq!(usage.cpu_usage_nanos, 36_315 * 10_000_000);
        assert_eq!(usage.memory_total_bytes, 24_684_084 * 1024);
        assert_eq!(usage.memory_available_bytes, 23_387_200 * 1024);
        assert_eq!(usage.memory_usage_bytes, (24_684_084 - 16_491_508) * 1024);
        assert_eq!(
            usage.memory_working_set_bytes,
            (24_684_084 - 16_491_508 - 4_402_056) * 1024
        );
        assert_eq!(usage.memory_rss_bytes, 713_800 * 1024);
        assert_eq!(usage.page_faults, 16_790_062);
        assert_eq!(usage.major_page_faults, 1497);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(MachineUsage::parse("intr 1\n", MEMINFO, VMSTAT, 100).is_err());
        assert!(MachineUsage::parse("cpu  1 x 3\n", MEMINFO, VMSTAT, 100).is_err());
        assert!(MachineUsage::parse(STAT, "MemTotal: 1 kB\n", VMSTAT, 100).is_err());
        // A short cpu line (old kernels) and a missing vmstat counter are fine.
        let old = MachineUsage::parse("cpu  10 0 5 100\n", MEMINFO, "", 100).unwrap();
        assert_eq!(old.cpu_usage_nanos, 15 * 10_000_000);
        assert_eq!(old.page_faults, 0);
    }

    #[test]
    fn this_machine_is_plausible() {
        let usage = MachineUsage::read().unwrap();
        assert!(usage.cpu_usage_nanos > 0, "{usage:?}");
        assert!(usage.memory_total_bytes > 0, "{usage:?}");
        assert!(usage.memory_working_set_bytes <= usage.memory_usage_bytes);
        assert!(usage.memory_usage_bytes <= usage.memory_total_bytes);
    }
}

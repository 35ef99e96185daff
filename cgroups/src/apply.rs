//! `Hierarchy::apply`: write [`CgroupSettings`] into an existing cgroup's interface files.
//!
//! | setting        | v1 file                                   | v2 file                      |
//! |----------------|-------------------------------------------|------------------------------|
//! | `cpu_shares`   | `cpu.shares`                              | `cpu.weight` (converted)     |
//! | `cpu_quota`    | `cpu.cfs_quota_us` (`-1` = unlimited)     | `cpu.max` (`max` = unlimited)|
//! | `cpu_period`   | `cpu.cfs_period_us`                       | `cpu.max` (second field)     |
//! | `memory_limit` | `memory.limit_in_bytes` (`-1`)            | `memory.max` (`max`)         |
//! | `pids_limit`   | `pids.max` (`max` when negative)          | `pids.max`                   |
//!
//! Guarantees: `None` fields are not touched; a `Some` field whose controller is missing fails
//! with [`Error::ControllerMissing`] rather than being silently dropped. On v2 a quota without a
//! period keeps the kernel's current period.

use std::io;
use std::path::Path;

use crate::error::{Error, Result};
use crate::fs;
use crate::hierarchy::Hierarchy;
use crate::path::CgroupPath;
use crate::resources::{shares_to_weight, CgroupSettings};

impl Hierarchy {
    /// Writes `settings` into cgroup `path`, which must exist. See the module docs.
    pub fn apply(&self, path: &CgroupPath, settings: &CgroupSettings) -> Result<()> {
        match self {
            Self::V1 { .. } => self.apply_v1(path, settings)?,
            Self::V2 { .. } => self.apply_v2(path, settings)?,
        }
        tracing::debug!(cgroup = %path, ?settings, "cgroup settings applied");
        Ok(())
    }

    fn apply_v1(&self, path: &CgroupPath, s: &CgroupSettings) -> Result<()> {
        if s.cpu_shares.is_some() || s.cpu_quota.is_some() || s.cpu_period.is_some() {
            let cpu = self.require_dir("cpu", path)?;
            if let Some(shares) = s.cpu_shares {
                write_setting("cpu", path, &cpu.join("cpu.shares"), &shares.to_string())?;
            }
            write_cfs_v1(path, &cpu, s.cpu_quota, s.cpu_period)?;
        }
        if let Some(limit) = s.memory_limit {
            let memory = self.require_dir("memory", path)?;
            let value = if limit < 0 {
                "-1".to_owned()
            } else {
                limit.to_string()
            };
            write_setting(
                "memory",
                path,
                &memory.join("memory.limit_in_bytes"),
                &value,
            )?;
        }
        if let Some(limit) = s.pids_limit {
            let pids = self.require_dir("pids", path)?;
            write_setting("pids", path, &pids.join("pids.max"), &max_or(limit))?;
        }
        Ok(())
    }

    fn apply_v2(&self, path: &CgroupPath, s: &CgroupSettings) -> Result<()> {
        let dir = self.require_dir("cpu", path)?;
        if let Some(shares) = s.cpu_shares {
            let weight = shares_to_weight(shares).to_string();
            write_setting("cpu", path, &dir.join("cpu.weight"), &weight)?;
        }
        if let Some(quota) = s.cpu_quota {
            let quota = if quota < 0 {
                "max".to_owned()
            } else {
                quota.to_string()
            };
            let value = match s.cpu_period {
                Some(period) => format!("{quota} {period}"),
                None => quota,
            };
            write_setting("cpu", path, &dir.join("cpu.max"), &value)?;
        }
        if let Some(limit) = s.memory_limit {
            write_setting("memory", path, &dir.join("memory.max"), &max_or(limit))?;
        }
        if let Some(limit) = s.pids_limit {
            write_setting("pids", path, &dir.join("pids.max"), &max_or(limit))?;
        }
        Ok(())
    }
}

fn max_or(limit: i64) -> String {
    if limit < 0 {
        "max".to_owned()
    } else {
        limit.to_string()
    }
}

/// Writes one setting; a missing interface file means the controller is not there.
fn write_setting(
    controller: &'static str,
    cgroup: &CgroupPath,
    file: &Path,
    value: &str,
) -> Result<()> {
    if !file.exists() {
        return Err(Error::ControllerMissing {
            controller,
            path: cgroup.clone(),
        });
    }
    fs::write(file, value)
}

/// Writes CFS period and quota. The kernel validates the pair (and against the parent), so a new
/// period may be refused under the old quota: period first, and on `EINVAL` quota first, as runc.
fn write_cfs_v1(
    cgroup: &CgroupPath,
    cpu_dir: &Path,
    quota: Option<i64>,
    period: Option<u64>,
) -> Result<()> {
    let quota_file = cpu_dir.join("cpu.cfs_quota_us");
    let period_file = cpu_dir.join("cpu.cfs_period_us");
    let write_quota = || match quota {
        Some(q) => write_setting("cpu", cgroup, &quota_file, &q.max(-1).to_string()),
        None => Ok(()),
    };
    let Some(period) = period else {
        return write_quota();
    };
    let period = period.to_string();
    match fs::write_raw(&period_file, &period) {
        Ok(()) => write_quota(),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && quota.is_some() => {
            write_quota()?;
            fs::write(&period_file, &period)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::ControllerMissing {
            controller: "cpu",
            path: cgroup.clone(),
        }),
        Err(source) => Err(Error::Write {
            path: period_file,
            value: period,
            source,
        }),
    }
}

//! On-disk records of sandboxes and containers: what the runtime made, so that another
//! process (the CLI, a restarted agent) can list, inspect and clean it up.
//!
//! A container's life is one enum, [`ContainerPhase`], with the data each phase has; the
//! status guards (`can_start`, …) sit next to it. Records are written with
//! write-temp-fsync-rename, so a crash leaves the old or the new record, never a torn one.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::types::{
    ContainerConfig, ContainerId, ContainerState, ContainerStatus, ExitReason, PodSandboxConfig,
    PodSandboxStatus, SandboxId, SandboxState,
};

/// Where a container is in its life, with the facts of that phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ContainerPhase {
    /// libcontainer created it; its init waits for `start`.
    Created { pid: i32, start_time: u64 },
    Running {
        pid: i32,
        start_time: u64,
        started_at: SystemTime,
    },
    Exited {
        started_at: Option<SystemTime>,
        finished_at: SystemTime,
        exit_code: i32,
        reason: ExitReason,
        message: Option<String>,
    },
}

impl ContainerPhase {
    pub fn state(&self) -> ContainerState {
        match self {
            Self::Created { .. } => ContainerState::Created,
            Self::Running { .. } => ContainerState::Running,
            Self::Exited { .. } => ContainerState::Exited,
        }
    }

    pub fn can_start(&self) -> bool {
        matches!(self, Self::Created { .. })
    }

    /// The live process (pid, start time), if any.
    pub fn process(&self) -> Option<(i32, u64)> {
        match self {
            Self::Created { pid, start_time }
            | Self::Running {
                pid, start_time, ..
            } => Some((*pid, *start_time)),
            Self::Exited { .. } => None,
        }
    }

    /// The phase after the process ended.
    pub fn exited(
        &self,
        finished_at: SystemTime,
        exit_code: i32,
        reason: ExitReason,
    ) -> ContainerPhase {
        let started_at = match self {
            Self::Running { started_at, .. } => Some(*started_at),
            Self::Exited { .. } => return self.clone(),
            Self::Created { .. } => None,
        };
        Self::Exited {
            started_at,
            finished_at,
            exit_code,
            reason,
            message: None,
        }
    }
}

/// Everything known about one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: ContainerId,
    pub sandbox_id: SandboxId,
    pub pod_uid: String,
    pub config: ContainerConfig,
    pub image_id: String,
    /// Absolute path of the CRI log file.
    pub log_path: PathBuf,
    /// The container's cgroup relative to the hierarchy root, if it has one.
    pub cgroups_path: Option<String>,
    pub created_at: SystemTime,
    pub phase: ContainerPhase,
}

impl ContainerRecord {
    pub fn status(&self) -> ContainerStatus {
        let (started_at, finished_at, exit_code, reason, message) = match &self.phase {
            ContainerPhase::Created { .. } => (None, None, None, None, None),
            ContainerPhase::Running { started_at, .. } => {
                (Some(*started_at), None, None, None, None)
            }
            ContainerPhase::Exited {
                started_at,
                finished_at,
                exit_code,
                reason,
                message,
            } => (
                *started_at,
                Some(*finished_at),
                Some(*exit_code),
                Some(*reason),
                message.clone(),
            ),
        };
        ContainerStatus {
            id: self.id.clone(),
            sandbox_id: self.sandbox_id.clone(),
            name: self.config.name.clone(),
            attempt: self.config.attempt,
            state: self.phase.state(),
            created_at: self.created_at,
            started_at,
            finished_at,
            exit_code,
            reason,
            message,
            image: self.config.image.clone(),
            image_id: self.image_id.clone(),
            pid: self.phase.process().map(|(pid, _)| pid),
            log_path: self.log_path.clone(),
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
        }
    }
}

/// Everything known about one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: SandboxId,
    pub config: PodSandboxConfig,
    pub created_at: SystemTime,
    pub state: SandboxState,
    /// Directory holding the bind-mounted namespace files (`net`, `ipc`, `uts`), if any.
    pub namespace_dir: Option<PathBuf>,
    pub net: bool,
    pub ipc: bool,
    pub uts: bool,
    /// The pod's address on the CNI network, once set up.
    #[serde(default)]
    pub ip: Option<String>,
    /// The CNI attachment ADD made, kept for DEL; `None` without CNI networking.
    #[serde(default)]
    pub network: Option<crate::network::NetworkAttachment>,
    /// Rootless with a network: the process holding the pod's user, network, IPC and UTS
    /// namespaces, with pasta (`zygote/holder.rs`); the containers join them.
    #[serde(default)]
    pub holder: Option<NamespaceHolder>,
}

/// The process holding a rootless pod's namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceHolder {
    pub pid: i32,
    /// Clock ticks since boot, the pid reuse guard.
    pub start_time: u64,
}

impl NamespaceHolder {
    /// `/proc/<pid>/ns/<kind>`.
    pub fn ns_path(&self, kind: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/{kind}", self.pid))
    }

    /// Whether the holder still runs (same pid and start time).
    pub fn alive(&self) -> bool {
        crate::zygote::process_start_time(self.pid).ok() == Some(self.start_time)
    }
}

impl SandboxRecord {
    pub fn status(&self) -> PodSandboxStatus {
        PodSandboxStatus {
            id: self.id.clone(),
            config: self.config.clone(),
            state: self.state,
            created_at: self.created_at,
            ip: self.ip.clone(),
            netns_path: match &self.holder {
                Some(holder) => Some(holder.ns_path("net")),
                None => self
                    .namespace_dir
                    .as_ref()
                    .filter(|_| self.net)
                    .map(|dir| dir.join("net")),
            },
        }
    }
}

/// Saves a record as `<dir>/record.json`.
pub fn save<T: Serialize>(dir: &Path, record: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?;
    crate::fsutil::write_state(&dir.join("record.json"), &bytes)
}

/// Loads every `<parent>/<id>/record.json`; unreadable records are skipped with a warning.
pub fn load_all<T: for<'de> Deserialize<'de>>(parent: &Path) -> Vec<T> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path().join("record.json");
        match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(record) => out.push(record),
                Err(err) => tracing::warn!(?path, %err, "skipping unreadable record"),
            },
            // A directory without record: creation was interrupted; `recover` cleans it.
            Err(_) => continue,
        }
    }
    out
}

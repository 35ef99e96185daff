//! The node controller: makes this machine a Node of the cluster and keeps it alive there
//! (the seed's `NodeController`, kubelet's `registerWithAPIServer`, `updateNodeStatus` and the
//! node lease controller).
//!
//! ```text
//!  NodeController::run
//!   │  register: POST Node (capacity, allocatable, addresses, nodeInfo, labels, conditions);
//!   │            AlreadyExists ⇒ adopt it (patch our labels). Retried 100 ms → 7 s.
//!   ▼
//!  loop ┬─ every lease_renew_interval (10 s): Lease kube-node-lease/<node> renewTime = now
//!       │    (failure ⇒ retry after 100 ms, doubling to 7 s; skipped while unhealthy)
//!       ├─ every node_status_update_frequency (10 s): compute the status; PATCH it when it
//!       │    changed, or when node_status_report_frequency (5 min) passed since the last one
//!       └─ shutdown ⇒ PATCH Ready=False "ironlet is shutting down", return
//! ```
//!
//! Guarantees:
//! * Status goes out as a strategic-merge patch of `nodes/<name>/status` holding only our
//!   four condition types (`Ready`, `MemoryPressure`, `DiskPressure`, `PIDPressure`): the
//!   apiserver merges conditions by `type`, so conditions others wrote survive.
//! * A condition's `lastTransitionTime` changes only when its status changes;
//!   `lastHeartbeatTime` is the time of the patch that carried it.
//! * The Lease is owned by the Node (owner reference), so deleting the Node deletes it.
//!
//! What the node offers comes from a [`NodeStatusProvider`]; [`MachineStatus`] reads this
//! machine (cgroups capacity, `/proc`, `statvfs` of the data root, `/etc/os-release`).
//!
//! ```no_run
//! # async fn example(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use ironlet::node::{MachineConfig, MachineStatus, NodeConfig, NodeController};
//!
//! let machine = MachineStatus::new(MachineConfig::default())?;
//! let controller = NodeController::new(client, NodeConfig::default(), machine);
//! let registered = controller.registered(); // turns true once the Node exists
//! controller.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
//!
//! Current behaviour: a Node deleted while the agent runs is not registered again (status
//! patches fail with NotFound until restart, as with kubelet); a failed status patch leaves
//! the transition times it stamped in place for the next attempt.

mod backoff;
mod conditions;
mod config;
mod controller;
mod error;
mod lease;
mod machine;
mod object;
mod provider;
mod status;

pub use backoff::Backoff;
pub use conditions::{
    DISK_PRESSURE, MEMORY_PRESSURE, OUR_CONDITION_TYPES, PID_PRESSURE, READY, SHUTTING_DOWN_MESSAGE,
};
pub use config::NodeConfig;
pub use controller::NodeController;
pub use error::{Error, Result};
pub use machine::{default_route_ip, ImageList, MachineConfig, MachineStatus, Reserved};
pub use object::{default_labels, go_arch, memory_quantity};
pub use provider::{NodeResources, NodeStatusProvider, Pressure, ProviderError, Readiness};

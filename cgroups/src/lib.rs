//! # ironlet-cgroups
//!
//! The node's cgroups: the pod tree in kubelet's layout, kubelet's requests/limits → cgroup
//! mapping, usage readouts, and the OOM and emptiness events that feed the event-driven PLEG.
//! Works on cgroup v1 (including hybrid machines) and v2. Containers' own cgroups are created by
//! libcontainer from `linux.cgroupsPath`; this crate prepares and cleans up around them.
//!
//! ## Where to start
//!
//! ```no_run
//! # async fn demo() -> ironlet_cgroups::Result<()> {
//! use ironlet_cgroups::*;
//!
//! let hierarchy = Hierarchy::detect()?;                    // v1/hybrid or v2, from mountinfo
//! if let Delegation::None { reason } = Delegation::detect(&hierarchy) {
//!     tracing::warn!(%reason, "running without resource limits");
//! }
//! let capacity = NodeCapacity::read(&hierarchy)?;          // cpu_milli, memory_bytes, pids
//! let node = NodeCgroups::ensure(hierarchy, "kubepods")?;  // /kubepods/{burstable,besteffort}
//!
//! let pod = PodResources {
//!     containers: vec![ResourceRequirements { cpu_limit_milli: Some(500), ..Default::default() }],
//!     init_containers: vec![],
//! };
//! let path = node.pod_path(pod.qos(), "0b9c…uid")?;        // /kubepods/burstable/pod<uid>
//! node.create_pod(&path, &pod.cgroup_settings(&CgroupOptions::default()))?;
//! let container = node.container_path(&path, "abc123")?;  // → OCI linux.cgroupsPath
//!
//! let mut ooms = node.hierarchy().watch_oom(&container)?;  // after libcontainer created it
//! while let Some(oom) = ooms.next().await? { /* OOMKilled */ }
//! let usage = node.hierarchy().usage(&path)?;
//! node.remove(&path)?;                                     // kill leftovers, rmdir everywhere
//! # Ok(()) }
//! ```
//!
//! ## Map
//!
//! | module | holds |
//! |---|---|
//! | `hierarchy` | [`Hierarchy`]: detection, path → per-controller directories |
//! | `path` | [`CgroupPath`]: validated relative cgroup paths |
//! | `node` | [`NodeCgroups`]: the kubepods tree, pod/container paths |
//! | `qos`, `resources` | [`QosClass`], [`ResourceRequirements`] → [`CgroupSettings`] (pure) |
//! | `create`, `apply`, `remove`, `usage` | the verbs on a [`Hierarchy`] |
//! | `machine` | [`MachineUsage`]: the node's CPU and memory from `/proc` |
//! | `watch` | [`OomWatcher`], [`EmptyWatcher`], [`MemoryPressureWatcher`] (tokio) |
//! | [`inotify`] | one inotify instance per runtime, shared by every watch of the process |
//! | `capacity`, `delegation` | [`NodeCapacity`], [`Delegation`] |
//! | `dynmods` | [`favor_dynamic_modifications`]: cheap task migration (`favordynmods`) |
//! | [`view`] | a container's read-only `/sys/fs/cgroup` on v1 |
//!
//! ## Choices
//!
//! * Plain file I/O on cgroupfs rather than `cgroups-rs`: the files used are few, the v1/v2
//!   differences are tabled in each verb's module docs, and events need raw fds anyway.
//! * Every call is synchronous except the watchers; `remove`/`kill` block up to ~5 s.
//!
//! ## Lint policy
//!
//! `missing_docs` and `unsafe_op_in_unsafe_fn` are denied. `unsafe` appears in two places only:
//! the `pidfd_open`/`pidfd_send_signal`/`kill` syscalls in `pidfd.rs` (nix 0.29 does not wrap
//! them), and registering owned fds with tokio (`AsyncFd::register_with_interest`) in `watch/`
//! (used by `inotify/` too).

#![deny(missing_docs, unsafe_op_in_unsafe_fn)]

mod apply;
mod capacity;
mod create;
mod delegation;
mod dynmods;
mod error;
mod fs;
mod hierarchy;
pub mod inotify;
mod machine;
mod mountinfo;
mod node;
mod path;
mod pidfd;
mod qos;
mod remove;
mod resources;
mod usage;
pub mod view;
mod watch;

pub use capacity::NodeCapacity;
pub use create::{CgroupKind, V2_CONTROLLERS};
pub use delegation::Delegation;
pub use dynmods::{favor_dynamic_modifications, Dynmods};
pub use error::{Error, Result};
pub use hierarchy::{process_cgroup_dirs, Hierarchy};
pub use machine::MachineUsage;
/// `/proc/self/mountinfo` fields with the kernel's octal escapes undone.
pub use mountinfo::unescape_path as unescape_mountinfo_path;
pub use node::NodeCgroups;
pub use path::CgroupPath;
pub use qos::QosClass;
pub use resources::{
    milli_cpu_to_quota, milli_cpu_to_shares, shares_to_weight, CgroupOptions, CgroupSettings,
    PodResources, ResourceRequirements, MAX_SHARES, MIN_QUOTA_US, MIN_SHARES, QUOTA_PERIOD_US,
};
pub use usage::{CgroupUsage, V1Files, V2Files};
pub use watch::{
    EmptyEvent, EmptyWatcher, MemoryPressureWatcher, OomEvent, OomWatcher, PressureEvent,
    PressureSource, PsiTrigger,
};

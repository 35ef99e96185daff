//! The decision half of a pod sync — what kubelet's `kuberuntime_manager` decides before it
//! touches the runtime — as pure functions the pod workers call.
//!
//! ```text
//!  desired Pod ─┐
//!  PodStatus  ──┼─► compute_pod_actions ─► PodActions ─► filter_backoff ─► starts now
//!  probe       ─┘   (actions, compute,       (enum)        (Backoff)      └► CrashLoopBackOff
//!  verdicts          init, sandbox)                                          + when to retry
//! ```
//!
//! Where to start: [`compute_pod_actions`] and [`PodActions`]. The worker then creates
//! containers with [`container_labels`] and [`container_annotations`] (the spec hash and
//! restart count live there) and reads them back with [`ContainerLabels`].
//!
//! Guarantees: nothing here does I/O or reads a clock; the same input gives the same
//! output, so every rule is unit-tested without a runtime.

pub mod actions;
pub mod backoff;
mod compute;
pub mod ephemeral;
pub mod hash;
mod init;
pub mod labels;
mod plan;
pub mod restart;
mod sandbox;
pub mod termination;
mod view;

#[cfg(test)]
mod fixtures;

pub use actions::{
    ActionsInput, ContainerKill, ContainerKind, ContainerStart, KillReason, PodActions, PodDone,
    ProbeResults, ProbeVerdict, ProbeVerdicts, SandboxChange,
};
pub use backoff::{
    crash_loop_message, filter_backoff, Backoff, BackoffFiltered, BackoffKey, CrashLoopBackOff,
};
pub use compute::compute_pod_actions;
pub use hash::container_hash;
pub use labels::{
    container_annotations, container_labels, ContainerLabels, ContainerType, LabelError,
    TerminationMessagePolicy,
};
pub use termination::termination_prerequisites;

//! Container probes (startup, liveness, readiness) and the actions they share with
//! lifecycle hooks (postStart, preStop): kubelet's prober manager in async Rust.
//!
//! ```text
//!  pod worker ──update_pod(pod, running containers, network)──► ProbeManager
//!                                                                   │ one task per
//!                                                                   │ (pod uid, container, kind),
//!                                                                   ▼ bound to one container id
//!      sync loop ◄──ProbeUpdate (result changed)── worker ──run_handler──► exec / httpGet / tcpSocket / grpc
//!      status    ──is_ready / startup_done / liveness_failed──► results (per container id)
//! ```
//!
//! Where to start:
//! - [`Action`] and [`run_handler`]: one probe or hook action, run once against a
//!   [`ProbeTarget`]; the answer is a [`ProbeOutcome`]. Hooks use these directly.
//! - [`ProbeSpec`]: a `v1.Probe` with kubelet's defaults applied and validated.
//! - [`ProbeManager`]: starts and stops probe workers to match the running containers and
//!   answers the questions the pod workers and status code ask.
//!
//! Guarantees:
//! - Results are kept per container id: a new container (new id) starts from the initial
//!   results again (readiness Failure, liveness Success, startup unknown), and a query for
//!   an id the manager does not currently track never answers from another container.
//! - Liveness and readiness probes do not run until the container's startup probe (if any)
//!   has succeeded.
//! - A liveness or startup probe that reached its failure threshold stops probing: the
//!   container must be restarted, and the new container gets new workers.
//! - No tokio worker thread ever changes network namespace: connections into a pod's
//!   namespace are made on a short-lived thread of their own.

mod action;
mod counts;
mod grpc;
mod handler;
mod http;
mod manager;
pub(crate) mod net;
mod results;
mod spec;
mod worker;

use std::fmt;
use std::path::PathBuf;

use ironlet_runtime::types::ContainerId;
use k8s_openapi::api::core::v1::{Container, ContainerPort};

pub use action::{Action, ActionError, HttpGet, PortRef, Scheme};
pub use counts::ProbeCounts;
pub use handler::{run_handler, run_hook};
pub use manager::{Carried, ProbeManager, ProbeUpdate, RunningContainer};
pub use spec::{ProbeSpec, ProbeSpecError};

/// The three kinds of probe, in the order kubelet gates them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

impl ProbeKind {
    pub const ALL: [Self; 3] = [Self::Startup, Self::Liveness, Self::Readiness];

    /// As kubelet's events spell it (`Liveness probe failed: …`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Startup => "Startup",
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
        }
    }

    /// The result a container starts with before its first probe (kubelet's
    /// `initialValue`): readiness is not ready, liveness is alive, startup is unknown.
    pub fn initial_result(self) -> Option<ProbeResult> {
        match self {
            Self::Startup => None,
            Self::Liveness => Some(ProbeResult::Success),
            Self::Readiness => Some(ProbeResult::Failure),
        }
    }
}

impl fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A probe's published result, after its thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    Success,
    Failure,
}

/// What one run of an action says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    Success,
    /// A success that deserves a word (kubelet's `probe.Warning`: an HTTP probe stopped at a
    /// redirect to another host); counted as a success, reported as a `ProbeWarning` event.
    Warning(String),
    /// The target answered badly or not in time (non-zero exit, HTTP status ≥ 400,
    /// connection refused, timeout); the message says which.
    Failure(String),
    /// The action could not be run at all (container not running, unknown port name,
    /// unsupported scheme, cannot enter the pod's network namespace). Probe workers discard
    /// such a run as kubelet does; a hook treats it as a failure.
    Unknown(String),
}

impl ProbeOutcome {
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Success | Self::Warning(_))
    }

    /// The failure or error message, if any.
    pub fn message(&self) -> Option<&str> {
        match self {
            Self::Success | Self::Warning(_) => None,
            Self::Failure(m) | Self::Unknown(m) => Some(m),
        }
    }
}

/// One probe run that kubelet records as an event on the pod (`recordContainerEvent` in
/// kubelet's `prober.probe`): every failed or errored run, not only the one that reaches
/// the failure threshold, and every run that succeeded with a warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeEvent {
    /// The run succeeded with a warning: `ProbeWarning`.
    Warning(String),
    /// The run failed: `Unhealthy`, `<Kind> probe failed: <output>`.
    Failed(String),
    /// The probe could not be run: `Unhealthy`,
    /// `<Kind> probe errored and resulted in unknown state: <err>`.
    Errored(String),
}

impl ProbeEvent {
    /// The event a run's outcome asks for; none for a plain success.
    pub fn of(outcome: &ProbeOutcome) -> Option<Self> {
        match outcome {
            ProbeOutcome::Success => None,
            ProbeOutcome::Warning(m) => Some(Self::Warning(m.clone())),
            ProbeOutcome::Failure(m) => Some(Self::Failed(m.clone())),
            ProbeOutcome::Unknown(m) => Some(Self::Errored(m.clone())),
        }
    }

    /// The event's reason, as kubelet spells it.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Warning(_) => crate::kubelet::events::reason::PROBE_WARNING,
            Self::Failed(_) | Self::Errored(_) => crate::kubelet::events::reason::UNHEALTHY,
        }
    }

    /// The event's message for a probe of `kind`, as kubelet writes it.
    pub fn message(&self, kind: ProbeKind) -> String {
        match self {
            Self::Warning(m) => format!("{kind} probe warning: {m}"),
            Self::Failed(m) => format!("{kind} probe failed: {m}"),
            Self::Errored(m) => format!("{kind} probe errored and resulted in unknown state: {m}"),
        }
    }
}

/// How a pod is reached over the network.
///
/// - `ip` set: connect from the host's namespace to the IP (or the action's host).
/// - no `ip` but `netns_path`: connect from inside the pod's namespace to `127.0.0.1`
///   (or the action's host).
/// - neither (host network): connect from the host to `127.0.0.1` (or the action's host).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeNetwork {
    pub ip: Option<String>,
    pub netns_path: Option<PathBuf>,
}

/// The container an action runs against.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeTarget {
    pub container_id: ContainerId,
    pub network: ProbeNetwork,
    /// The container's declared ports, to resolve a port given by name.
    pub container_ports: Vec<ContainerPort>,
}

impl ProbeTarget {
    /// The target for a probe or hook of `container`, running as `container_id`.
    pub fn for_container(
        container_id: ContainerId,
        network: ProbeNetwork,
        container: &Container,
    ) -> Self {
        Self {
            container_id,
            network,
            container_ports: container.ports.clone().unwrap_or_default(),
        }
    }
}

//! Test fixtures for the status module: pods from a few lines of YAML, runtime containers and
//! sandboxes at given seconds, API container statuses in a named state, and fake probes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ironlet_runtime::types::{
    ContainerId, ContainerState as RtState, ContainerStatus as RtContainer, ExitReason,
    PodSandboxConfig, PodSandboxStatus, PodStatus as RuntimePodStatus, SandboxState,
};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodStatus,
};

use super::{
    generate_pod_status, ImageRefs, PodLifecycle, ProbeState, StatusInputs, WaitingReason,
    WaitingReasons,
};

/// `secs` seconds after the epoch.
pub fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// A pod `p` in namespace `ns` with uid `u1` and the given `spec` YAML (top-level keys).
pub fn pod(spec: &str) -> Pod {
    let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    let yaml = format!("metadata: {{name: p, namespace: ns, uid: u1}}\nspec:\n{spec}");
    serde_yaml::from_str(&yaml).unwrap()
}

/// A container id made of one repeated hex digit per name and attempt, e.g. `a` attempt 1.
pub fn id(name: &str, attempt: u32) -> ContainerId {
    let hex = format!(
        "{:x}",
        (name.bytes().map(u32::from).sum::<u32>() * 16 + attempt) % 65536
    );
    ContainerId::parse(&format!("{hex:0>32}")).unwrap()
}

fn rt(name: &str, attempt: u32, created: u64, state: RtState) -> RtContainer {
    RtContainer {
        id: id(name, attempt),
        sandbox_id: sandbox_id(),
        name: name.to_owned(),
        attempt,
        state,
        created_at: t(created),
        started_at: None,
        finished_at: None,
        exit_code: None,
        reason: None,
        message: None,
        image: "busybox".to_owned(),
        image_id: "sha256:cafe".to_owned(),
        pid: None,
        log_path: PathBuf::new(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }
}

/// A container created at `created` that started one second later and still runs.
pub fn running(name: &str, attempt: u32, created: u64) -> RtContainer {
    RtContainer {
        started_at: Some(t(created + 1)),
        pid: Some(42),
        ..rt(name, attempt, created, RtState::Running)
    }
}

/// A container created at `created` that ran from `created + 1` to `created + 5`.
pub fn exited(
    name: &str,
    attempt: u32,
    created: u64,
    code: i32,
    reason: ExitReason,
) -> RtContainer {
    RtContainer {
        started_at: Some(t(created + 1)),
        finished_at: Some(t(created + 5)),
        exit_code: Some(code),
        reason: Some(reason),
        ..rt(name, attempt, created, RtState::Exited)
    }
}

/// A container created but not started.
pub fn created(name: &str, attempt: u32, created: u64) -> RtContainer {
    rt(name, attempt, created, RtState::Created)
}

pub fn sandbox_id() -> ContainerId {
    ContainerId::parse("5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a").unwrap()
}

/// The pod's ready sandbox with this IP.
pub fn sandbox(ip: Option<&str>) -> PodSandboxStatus {
    PodSandboxStatus {
        id: sandbox_id(),
        config: PodSandboxConfig::default(),
        state: SandboxState::Ready,
        created_at: t(100),
        ip: ip.map(str::to_owned),
        netns_path: None,
    }
}

pub fn runtime(sandboxes: Vec<PodSandboxStatus>, containers: Vec<RtContainer>) -> RuntimePodStatus {
    RuntimePodStatus {
        pod_uid: "u1".to_owned(),
        name: "p".to_owned(),
        namespace: "ns".to_owned(),
        sandboxes,
        containers,
    }
}

/// An API container state, by name.
#[derive(Debug, Clone, Copy)]
pub enum State {
    /// Waiting `ContainerCreating`.
    Creating,
    /// Waiting `PodInitializing`.
    Initializing,
    /// Running and started.
    Running,
    /// Running, startup probe not passed.
    RunningNotStarted,
    /// Terminated with this exit code.
    Exited(i32),
    /// Waiting `CrashLoopBackOff` after exiting with this code.
    BackOff(i32),
}

/// An API container status `name` in `state`.
pub fn status(name: &str, state: State) -> ContainerStatus {
    let waiting = |r: &str| ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(r.to_owned()),
            message: None,
        }),
        ..ContainerState::default()
    };
    let terminated = |code: i32| ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            reason: Some(if code == 0 { "Completed" } else { "Error" }.to_owned()),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    };
    let running = ContainerState {
        running: Some(ContainerStateRunning::default()),
        ..ContainerState::default()
    };
    let (state, last, started, ready) = match state {
        State::Creating => (waiting("ContainerCreating"), None, false, false),
        State::Initializing => (waiting("PodInitializing"), None, false, false),
        State::Running => (running, None, true, true),
        State::RunningNotStarted => (running, None, false, false),
        State::Exited(code) => (terminated(code), None, false, code == 0),
        State::BackOff(code) => (
            waiting("CrashLoopBackOff"),
            Some(terminated(code)),
            false,
            false,
        ),
    };
    ContainerStatus {
        name: name.to_owned(),
        state: Some(state),
        last_state: last,
        started: Some(started),
        ready,
        ..ContainerStatus::default()
    }
}

/// Probes where the named containers are not ready / not started; all others are.
#[derive(Default)]
pub struct Probes {
    pub unready: BTreeSet<String>,
    pub unstarted: BTreeSet<String>,
}

impl Probes {
    pub fn unready(names: &[&str]) -> Self {
        Self {
            unready: names.iter().map(|n| (*n).to_owned()).collect(),
            ..Self::default()
        }
    }
}

impl ProbeState for Probes {
    fn is_ready(&self, name: &str, _: &ContainerId) -> bool {
        !self.unready.contains(name)
    }
    fn is_started(&self, name: &str, _: &ContainerId) -> bool {
        !self.unstarted.contains(name)
    }
}

/// Everything [`super::generate_pod_status`] reads, owned, with defaults: a ready sandbox with IP
/// `10.88.0.5`, host IP `192.168.1.10`, no probes failing, now = 1000 s.
pub struct Scenario {
    pub pod: Pod,
    pub runtime: RuntimePodStatus,
    pub probes: Probes,
    pub waiting: WaitingReasons,
    pub previous: Option<PodStatus>,
    pub host_ips: Vec<String>,
    pub image_refs: ImageRefs,
    pub lifecycle: PodLifecycle,
    pub now: SystemTime,
}

impl Scenario {
    pub fn new(spec: &str, containers: Vec<RtContainer>) -> Self {
        Self {
            pod: pod(spec),
            runtime: runtime(vec![sandbox(Some("10.88.0.5"))], containers),
            probes: Probes::default(),
            waiting: WaitingReasons::new(),
            previous: None,
            host_ips: vec!["192.168.1.10".to_owned()],
            image_refs: ImageRefs::new(),
            lifecycle: PodLifecycle::Active,
            now: t(1000),
        }
    }

    /// The worker left `container` waiting for `reason`.
    pub fn waiting(mut self, container: &str, reason: &str, message: &str) -> Self {
        self.waiting
            .insert(container.to_owned(), WaitingReason::new(reason, message));
        self
    }

    pub fn generate(&self) -> PodStatus {
        generate_pod_status(&StatusInputs {
            pod: &self.pod,
            runtime: &self.runtime,
            probes: &self.probes,
            waiting: &self.waiting,
            previous: self.previous.as_ref(),
            host_ips: &self.host_ips,
            image_refs: &self.image_refs,
            lifecycle: &self.lifecycle,
            now: self.now,
        })
    }

    /// The pod as `ironlet pods` sees it after [`Self::generate`].
    pub fn pod_with_status(&self) -> Pod {
        Pod {
            status: Some(self.generate()),
            ..self.pod.clone()
        }
    }
}

/// The status of container `name`, init or app.
pub fn container<'s>(status: &'s PodStatus, name: &str) -> &'s ContainerStatus {
    let init = status.init_container_statuses.iter().flatten();
    let app = status.container_statuses.iter().flatten();
    init.chain(app)
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no status for container {name}"))
}

/// The condition of `type_`.
pub fn condition<'s>(status: &'s PodStatus, type_: &str) -> &'s PodCondition {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no condition {type_}"))
}

/// `(status, reason, message)` of a condition, for one-line assertions.
pub fn cond(status: &PodStatus, type_: &str) -> (String, Option<String>, Option<String>) {
    let c = condition(status, type_);
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

pub fn phase(status: &PodStatus) -> &str {
    status.phase.as_deref().unwrap_or_default()
}

pub fn waiting_reason(c: &ContainerStatus) -> Option<&str> {
    c.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

pub fn terminated_of(state: Option<&ContainerState>) -> Option<&ContainerStateTerminated> {
    state?.terminated.as_ref()
}

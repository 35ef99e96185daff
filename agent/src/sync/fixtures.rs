//! Test fixtures: desired pods and runtime `PodStatus` values built in a few lines.
//!
//! Every sandbox or container added to a [`StatusBuilder`] is created 10 s after the
//! previous one, so insertion order is age order (the last added is the newest). Containers
//! go into the last sandbox added (or `s1`) and carry the hash of their spec unless told
//! otherwise.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ironlet_runtime::types::{
    ContainerId, ContainerState, ContainerStatus, ExitReason, PodSandboxConfig, PodSandboxStatus,
    PodStatus, SandboxState,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::hash::container_hash;
use super::labels::{CONTAINER_NAME, HASH};

/// The time the first fixture object is created.
pub(super) fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

pub(super) fn id(s: &str) -> ContainerId {
    ContainerId::parse(s).unwrap_or_else(|| panic!("fixture id {s:?} is not a valid id"))
}

fn container(name: &str) -> Container {
    Container {
        name: name.into(),
        image: Some("busybox:latest".into()),
        command: Some(vec!["sleep".into(), "3600".into()]),
        ..Container::default()
    }
}

/// A pod `web` in `default` with UID `uid-1`, the given init and regular containers and
/// restart policy `Always`.
pub(super) fn pod(init: &[&str], containers: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("uid-1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            init_containers: (!init.is_empty())
                .then(|| init.iter().map(|n| container(n)).collect()),
            containers: containers.iter().map(|n| container(n)).collect(),
            restart_policy: Some("Always".into()),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// `pod` with restart policy `policy`.
pub(super) fn with_policy(mut pod: Pod, policy: &str) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        spec.restart_policy = Some(policy.into());
    }
    pod
}

/// `pod` with init container `name` turned into a sidecar.
pub(super) fn with_sidecar(mut pod: Pod, name: &str) -> Pod {
    let init = pod
        .spec
        .as_mut()
        .and_then(|s| s.init_containers.as_mut())
        .and_then(|list| list.iter_mut().find(|c| c.name == name));
    match init {
        Some(c) => c.restart_policy = Some("Always".into()),
        None => panic!("fixture pod has no init container {name}"),
    }
    pod
}

/// Mutable access to the spec of container `name` (init or regular).
pub(super) fn spec_mut<'p>(pod: &'p mut Pod, name: &str) -> &'p mut Container {
    let spec = pod.spec.as_mut().expect("fixture pods have a spec");
    spec.init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("fixture pod has no container {name}"))
}

fn spec_of<'p>(pod: &'p Pod, name: &str) -> Option<&'p Container> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == name)
}

/// A container instance to add to a [`StatusBuilder`].
#[derive(Debug, Clone)]
pub(super) struct Ctr {
    name: String,
    id: Option<String>,
    sandbox: Option<String>,
    attempt: u32,
    state: ContainerState,
    exit_code: Option<i32>,
    reason: Option<ExitReason>,
    hash: Option<String>,
}

/// A running instance of `name`.
pub(super) fn running(name: &str) -> Ctr {
    Ctr {
        name: name.into(),
        id: None,
        sandbox: None,
        attempt: 0,
        state: ContainerState::Running,
        exit_code: None,
        reason: None,
        hash: None,
    }
}

/// An instance of `name` that exited with `code`.
pub(super) fn exited(name: &str, code: i32) -> Ctr {
    Ctr {
        state: ContainerState::Exited,
        exit_code: Some(code),
        reason: Some(if code == 0 {
            ExitReason::Completed
        } else {
            ExitReason::Error
        }),
        ..running(name)
    }
}

impl Ctr {
    pub(super) fn id(mut self, id: &str) -> Self {
        self.id = Some(id.into());
        self
    }

    pub(super) fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    pub(super) fn in_sandbox(mut self, sandbox: &str) -> Self {
        self.sandbox = Some(sandbox.into());
        self
    }

    pub(super) fn state(mut self, state: ContainerState) -> Self {
        self.state = state;
        self
    }

    pub(super) fn oom_killed(mut self) -> Self {
        self.reason = Some(ExitReason::OOMKilled);
        self
    }

    pub(super) fn hash(mut self, hash: &str) -> Self {
        self.hash = Some(hash.into());
        self
    }
}

/// Builds the runtime's `PodStatus` of a fixture pod.
pub(super) struct StatusBuilder {
    pod: Pod,
    clock: SystemTime,
    last_sandbox: Option<String>,
    status: PodStatus,
}

pub(super) fn status(pod: &Pod) -> StatusBuilder {
    StatusBuilder {
        pod: pod.clone(),
        clock: t0(),
        last_sandbox: None,
        status: PodStatus {
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            sandboxes: Vec::new(),
            containers: Vec::new(),
        },
    }
}

impl StatusBuilder {
    fn tick(&mut self) -> SystemTime {
        self.clock += Duration::from_secs(10);
        self.clock
    }

    /// Adds sandbox `sandbox_id` (host network as the pod asks), newer than everything so far.
    pub(super) fn sandbox(mut self, sandbox_id: &str, attempt: u32, state: SandboxState) -> Self {
        let created_at = self.tick();
        let host_network = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        self.status.sandboxes.push(PodSandboxStatus {
            id: id(sandbox_id),
            config: PodSandboxConfig {
                pod_uid: self.status.pod_uid.clone(),
                name: self.status.name.clone(),
                namespace: self.status.namespace.clone(),
                attempt,
                host_network,
                ..PodSandboxConfig::default()
            },
            state,
            created_at,
            ip: Some("10.88.0.2".into()),
            netns_path: None,
        });
        self.last_sandbox = Some(sandbox_id.into());
        self
    }

    /// Adds container instance `c`, newer than everything so far.
    pub(super) fn container(mut self, c: Ctr) -> Self {
        let created_at = self.tick();
        let n = self.status.containers.len();
        let hash = c.hash.clone().unwrap_or_else(|| {
            spec_of(&self.pod, &c.name).map_or_else(|| "none".into(), container_hash)
        });
        let sandbox = c
            .sandbox
            .or_else(|| self.last_sandbox.clone())
            .unwrap_or_else(|| "s1".into());
        let finished = matches!(c.state, ContainerState::Exited);
        self.status.containers.push(ContainerStatus {
            id: id(&c.id.unwrap_or_else(|| format!("{}-{n}", c.name))),
            sandbox_id: id(&sandbox),
            name: c.name.clone(),
            attempt: c.attempt,
            state: c.state,
            created_at,
            started_at: Some(created_at + Duration::from_secs(1)),
            finished_at: finished.then(|| created_at + Duration::from_secs(5)),
            exit_code: c.exit_code,
            reason: c.reason,
            message: None,
            image: "busybox:latest".into(),
            image_id: "sha256:0".into(),
            pid: (!finished).then_some(100),
            log_path: PathBuf::from(format!("{}/{}.log", c.name, c.attempt)),
            labels: BTreeMap::from([(CONTAINER_NAME.to_owned(), c.name)]),
            annotations: BTreeMap::from([(HASH.to_owned(), hash)]),
        });
        self
    }

    pub(super) fn build(self) -> PodStatus {
        self.status
    }
}

/// The actions for `pod` in `status` with no probe verdicts.
pub(super) fn compute(pod: &Pod, status: &PodStatus) -> super::PodActions {
    compute_with(pod, status, &super::ProbeVerdicts::default())
}

/// The actions for `pod` in `status` with `probes`.
pub(super) fn compute_with(
    pod: &Pod,
    status: &PodStatus,
    probes: &super::ProbeVerdicts,
) -> super::PodActions {
    super::compute_pod_actions(&super::ActionsInput {
        pod,
        status,
        probes,
    })
}

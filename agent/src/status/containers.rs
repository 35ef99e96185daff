//! Container statuses: kubelet's `convertToAPIContainerStatuses` and the probe manager's
//! `UpdatePodStatus`, for the init and the app containers of one pod.
//!
//! Per spec container, in this order:
//! 1. **default**: the previous status if it was terminated; otherwise waiting
//!    `ContainerCreating` (`PodInitializing` when the pod has init containers), keeping the
//!    previous restart count and last state;
//! 2. **lost**: no instance at all in the runtime but previously running ⇒ last state
//!    terminated `ContainerStatusUnknown` (137), one more restart unless the pod is deleted;
//! 3. **runtime**: the newest instance gives the state, `restartCount` (its attempt), image,
//!    imageID and containerID; the second newest, if the runtime still has it, the last state;
//! 4. **waiting reason**: a container that the next sync would (re)start shows the reason the
//!    worker recorded (`CrashLoopBackOff`…), its termination moving to the last state;
//! 5. **probes**: `started` once running and past its startup probe; `ready` once started and
//!    past its readiness probe — a finished (exit 0) regular init container is ready.

use std::collections::HashMap;

use ironlet_runtime::types::{
    ContainerId, ContainerState as RtState, ContainerStatus as RtContainer,
    PodStatus as RuntimePodStatus, SandboxState,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodStatus,
};

use super::time::api_time;
use super::{
    ImageRefs, ProbeState, StatusInputs, WaitingReasons, CONTAINER_CREATING,
    CONTAINER_STATUS_UNKNOWN, POD_INITIALIZING,
};
use crate::qos::is_restartable_init_container;
use crate::sync::restart;

/// The scheme of `containerID`s: `ironlet://<id>`, as containerd reports `containerd://<id>`.
pub const CONTAINER_ID_SCHEME: &str = "ironlet";

/// `ironlet://<id>`.
pub fn api_container_id(id: &ContainerId) -> String {
    format!("{CONTAINER_ID_SCHEME}://{id}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Init,
    App,
    /// From `spec.ephemeralContainers`: never restarted, never probed (`ready` false,
    /// `started` unset, as kubelet's prober leaves them).
    Ephemeral,
}

/// What converting needs, borrowed from [`StatusInputs`].
pub(super) struct Context<'a> {
    pod: &'a Pod,
    runtime: &'a RuntimePodStatus,
    probes: &'a dyn ProbeState,
    waiting: &'a WaitingReasons,
    image_refs: &'a ImageRefs,
    /// Runtime containers by name, newest first.
    instances: HashMap<&'a str, Vec<&'a RtContainer>>,
}

impl<'a> Context<'a> {
    pub(super) fn new(inputs: &StatusInputs<'a>) -> Self {
        let mut instances: HashMap<&str, Vec<&RtContainer>> = HashMap::new();
        for c in &inputs.runtime.containers {
            instances.entry(c.name.as_str()).or_default().push(c);
        }
        for list in instances.values_mut() {
            list.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        }
        Self {
            pod: inputs.pod,
            runtime: inputs.runtime,
            probes: inputs.probes,
            waiting: inputs.waiting,
            image_refs: inputs.image_refs,
            instances,
        }
    }

    /// `initContainerStatuses`, in spec order.
    pub(super) fn init_statuses(&self, old: &PodStatus) -> Vec<ContainerStatus> {
        let specs = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_deref());
        self.statuses(
            specs.unwrap_or_default(),
            old.init_container_statuses.as_deref(),
            Kind::Init,
        )
    }

    /// `containerStatuses`, sorted by name as kubelet sorts them.
    pub(super) fn regular_statuses(&self, old: &PodStatus) -> Vec<ContainerStatus> {
        let specs = self.pod.spec.as_ref().map(|s| s.containers.as_slice());
        let mut statuses = self.statuses(
            specs.unwrap_or_default(),
            old.container_statuses.as_deref(),
            Kind::App,
        );
        statuses.sort_by(|a, b| a.name.cmp(&b.name));
        statuses
    }

    /// `ephemeralContainerStatuses`, sorted by name as kubelet sorts them.
    pub(super) fn ephemeral_statuses(&self, old: &PodStatus) -> Vec<ContainerStatus> {
        let specs = crate::sync::ephemeral::ephemeral_containers(self.pod);
        let mut statuses = self.statuses(
            &specs,
            old.ephemeral_container_statuses.as_deref(),
            Kind::Ephemeral,
        );
        statuses.sort_by(|a, b| a.name.cmp(&b.name));
        statuses
    }

    /// The IP of the newest sandbox, if it is ready and has one (kubelet reads only that one).
    pub(super) fn sandbox_ips(&self) -> Vec<String> {
        let newest = self.runtime.sandboxes.iter().max_by_key(|s| s.created_at);
        newest
            .filter(|s| s.state == SandboxState::Ready)
            .and_then(|s| s.ip.clone())
            .into_iter()
            .collect()
    }

    /// kubelet's `HasAnyActiveRegularContainerStarted`: an app container exists in the newest
    /// ready sandbox, so the pod was initialized in it.
    pub(super) fn has_active_regular_container(&self) -> bool {
        let Some(active) = self
            .runtime
            .sandboxes
            .iter()
            .filter(|s| s.state == SandboxState::Ready)
            .max_by_key(|s| s.created_at)
        else {
            return false;
        };
        let apps = self.pod.spec.iter().flat_map(|s| &s.containers);
        let names: Vec<&str> = apps.map(|c| c.name.as_str()).collect();
        self.runtime
            .containers
            .iter()
            .any(|c| c.sandbox_id == active.id && names.contains(&c.name.as_str()))
    }

    fn statuses(
        &self,
        specs: &[Container],
        old: Option<&[ContainerStatus]>,
        kind: Kind,
    ) -> Vec<ContainerStatus> {
        let old = old.unwrap_or_default();
        specs
            .iter()
            .map(|spec| {
                let previous = old.iter().find(|s| s.name == spec.name);
                self.status(spec, previous, kind)
            })
            .collect()
    }

    fn status(
        &self,
        spec: &Container,
        old: Option<&ContainerStatus>,
        kind: Kind,
    ) -> ContainerStatus {
        let instances = self.instances.get(spec.name.as_str());
        let instances = instances.map(Vec::as_slice).unwrap_or_default();
        let mut status = match instances {
            [] => self.lost(self.default_status(spec, old), old),
            [newest] => self.convert(newest, old),
            [newest, previous, ..] => ContainerStatus {
                last_state: self.convert(previous, old).state,
                ..self.convert(newest, old)
            },
        };
        let newest = instances.first().copied();
        self.apply_waiting_reason(&mut status, spec, newest, kind);
        self.apply_probes(&mut status, spec, newest, kind);
        status
    }

    fn default_waiting_reason(&self) -> &'static str {
        let has_init = self
            .pod
            .spec
            .as_ref()
            .is_some_and(|s| s.init_containers.as_ref().is_some_and(|i| !i.is_empty()));
        if has_init {
            POD_INITIALIZING
        } else {
            CONTAINER_CREATING
        }
    }

    fn default_status(&self, spec: &Container, old: Option<&ContainerStatus>) -> ContainerStatus {
        if let Some(old) = old.filter(|o| is_terminated(o.state.as_ref())) {
            return old.clone();
        }
        ContainerStatus {
            name: spec.name.clone(),
            image: spec.image.clone().unwrap_or_default(),
            state: Some(waiting(Some(self.default_waiting_reason()), None)),
            restart_count: old.map_or(0, |o| o.restart_count),
            last_state: old.and_then(|o| o.last_state.clone()),
            ..ContainerStatus::default()
        }
    }

    /// A container that was running and of which the runtime has no trace any more ended in
    /// an unknown way: record that, rather than showing it as never run.
    fn lost(&self, mut status: ContainerStatus, old: Option<&ContainerStatus>) -> ContainerStatus {
        let was_running = old.is_some_and(|o| {
            let state = o.state.as_ref();
            !is_terminated(state) && state.is_some_and(|s| s.running.is_some())
        });
        let is_default = status
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some(self.default_waiting_reason()));
        let has_last = is_terminated(status.last_state.as_ref());
        if was_running && is_default && !has_last {
            status.last_state = Some(terminated(ContainerStateTerminated {
                exit_code: 137,
                reason: Some(CONTAINER_STATUS_UNKNOWN.to_owned()),
                message: Some("The container could not be located when the pod was deleted.  The container used to be Running".to_owned()),
                ..ContainerStateTerminated::default()
            }));
            if !self.deleting() {
                status.restart_count += 1;
            }
        }
        status
    }

    /// kubelet's `convertContainerStatus`: one runtime instance.
    fn convert(&self, c: &RtContainer, old: Option<&ContainerStatus>) -> ContainerStatus {
        let container_id = api_container_id(&c.id);
        let mut restart_count = i32::try_from(c.attempt).unwrap_or(i32::MAX);
        let state = match c.state {
            RtState::Running => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: c.started_at.map(api_time),
                }),
                ..ContainerState::default()
            },
            RtState::Exited => {
                let exit_code = c.exit_code.unwrap_or_default();
                let reason = c
                    .reason
                    .map_or(if exit_code == 0 { "Completed" } else { "Error" }, |r| {
                        r.as_str()
                    });
                terminated(ContainerStateTerminated {
                    exit_code,
                    reason: Some(reason.to_owned()),
                    message: c.message.clone().filter(|m| !m.is_empty()),
                    started_at: c.started_at.map(api_time),
                    finished_at: c.finished_at.map(api_time),
                    container_id: Some(container_id.clone()),
                    signal: None,
                })
            }
            RtState::Unknown
                if old.is_some_and(|o| o.state.as_ref().is_some_and(|s| s.running.is_some())) =>
            {
                restart_count = old.map_or(0, |o| o.restart_count.saturating_add(1));
                terminated(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some(CONTAINER_STATUS_UNKNOWN.to_owned()),
                    message: Some(
                        "The container could not be located when the pod was terminated".to_owned(),
                    ),
                    ..ContainerStateTerminated::default()
                })
            }
            RtState::Created | RtState::Unknown => waiting(None, None),
        };
        ContainerStatus {
            name: c.name.clone(),
            restart_count,
            image: c.image.clone(),
            image_id: self
                .image_refs
                .get(&c.image_id)
                .unwrap_or(&c.image_id)
                .clone(),
            container_id: Some(container_id),
            volume_mounts: old.and_then(|o| o.volume_mounts.clone()),
            state: Some(state),
            ..ContainerStatus::default()
        }
    }

    /// kubelet's `ShouldContainerBeRestarted`, judged on the newest instance.
    fn should_restart(&self, spec: &Container, newest: Option<&RtContainer>, kind: Kind) -> bool {
        if self.deleting() {
            return false;
        }
        let Some(c) = newest else {
            return true;
        };
        match c.state {
            RtState::Running => false,
            RtState::Created | RtState::Unknown => true,
            RtState::Exited if kind == Kind::Ephemeral => false,
            RtState::Exited if is_restartable_init_container(spec) => true,
            // The container's own restartPolicy and rules, else the pod's (as the sync
            // decides): a container that stays down never shows a waiting reason.
            RtState::Exited => restart::should_restart(spec, self.pod.spec.as_ref(), c.exit_code),
        }
    }

    fn apply_waiting_reason(
        &self,
        status: &mut ContainerStatus,
        spec: &Container,
        newest: Option<&RtContainer>,
        kind: Kind,
    ) {
        let succeeded =
            newest.is_some_and(|c| c.state == RtState::Exited && c.exit_code == Some(0));
        if (kind == Kind::Init && succeeded) || !self.should_restart(spec, newest, kind) {
            return;
        }
        let Some(reason) = self.waiting.get(&spec.name) else {
            return;
        };
        if is_terminated(status.state.as_ref()) {
            status.last_state = status.state.take();
        }
        status.state = Some(waiting(Some(&reason.reason), Some(&reason.message)));
    }

    fn apply_probes(
        &self,
        status: &mut ContainerStatus,
        spec: &Container,
        newest: Option<&RtContainer>,
        kind: Kind,
    ) {
        if kind == Kind::Ephemeral {
            status.ready = false;
            return;
        }
        let running = status.state.as_ref().is_some_and(|s| s.running.is_some());
        let running_id = newest
            .filter(|c| running && c.state == RtState::Running)
            .map(|c| &c.id);
        let started = running_id.is_some_and(|id| self.probes.is_started(&spec.name, id));
        status.started = Some(started);
        status.ready = if kind == Kind::Init && !is_restartable_init_container(spec) {
            status
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        } else {
            started && running_id.is_some_and(|id| self.probes.is_ready(&spec.name, id))
        };
    }

    fn deleting(&self) -> bool {
        self.pod.metadata.deletion_timestamp.is_some()
    }
}

fn is_terminated(state: Option<&ContainerState>) -> bool {
    state.is_some_and(|s| s.terminated.is_some())
}

fn waiting(reason: Option<&str>, message: Option<&str>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: reason.map(str::to_owned),
            message: message.filter(|m| !m.is_empty()).map(str::to_owned),
        }),
        ..ContainerState::default()
    }
}

fn terminated(t: ContainerStateTerminated) -> ContainerState {
    ContainerState {
        terminated: Some(t),
        ..ContainerState::default()
    }
}

#[cfg(test)]
mod tests {
    use ironlet_runtime::types::ExitReason;

    use super::*;
    use crate::status::testing::*;

    const ONE: &str = "containers: [{name: a, image: busybox}]";
    const INIT: &str =
        "initContainers: [{name: i, image: busybox}]\ncontainers: [{name: a, image: busybox}]";

    fn crash_loop() -> Scenario {
        Scenario::new(ONE, vec![exited("a", 3, 200, 1, ExitReason::Error)]).waiting(
            "a",
            "CrashLoopBackOff",
            "back-off 40s restarting failed container=a pod=p_ns(u1)",
        )
    }

    #[test]
    fn a_container_never_created_waits_with_container_creating() {
        let status = Scenario::new(ONE, vec![]).generate();
        let a = container(&status, "a");
        assert_eq!(waiting_reason(a), Some("ContainerCreating"));
        assert_eq!((a.image.as_str(), a.image_id.as_str()), ("busybox", ""));
        assert_eq!(
            (a.ready, a.started, a.restart_count),
            (false, Some(false), 0)
        );
        assert_eq!(a.container_id, None);
    }

    #[test]
    fn app_containers_wait_with_pod_initializing_while_init_containers_run() {
        let status = Scenario::new(INIT, vec![running("i", 0, 100)]).generate();
        assert_eq!(
            waiting_reason(container(&status, "a")),
            Some("PodInitializing")
        );
        let i = container(&status, "i");
        assert!(i.state.as_ref().is_some_and(|s| s.running.is_some()));
        assert!(!i.ready, "a running init container is not ready");
    }

    #[test]
    fn a_running_container_reports_its_start_image_and_ironlet_container_id() {
        let status = Scenario::new(ONE, vec![running("a", 0, 100)]).generate();
        let a = container(&status, "a");
        let running = a.state.as_ref().and_then(|s| s.running.as_ref()).unwrap();
        assert_eq!(running.started_at.as_ref().unwrap().0.as_second(), 101);
        assert_eq!(a.container_id, Some(format!("ironlet://{}", id("a", 0))));
        assert_eq!(
            (a.image.as_str(), a.image_id.as_str()),
            ("busybox", "sha256:cafe")
        );
        assert_eq!((a.ready, a.started), (true, Some(true)));
    }

    #[test]
    fn ephemeral_containers_get_their_own_statuses_and_an_exited_one_stays_terminated() {
        const WITH_EPHEMERAL: &str = "containers: [{name: a, image: busybox}]\n\
            ephemeralContainers: [{name: dbg, image: busybox}, {name: old, image: busybox}, \
            {name: new, image: busybox}]";
        let status = Scenario::new(
            WITH_EPHEMERAL,
            vec![
                running("a", 0, 100),
                running("dbg", 0, 110),
                exited("old", 0, 105, 1, ExitReason::Error),
            ],
        )
        .waiting("old", "CrashLoopBackOff", "must not be shown")
        .generate();
        let names: Vec<&str> = status
            .ephemeral_container_statuses
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["dbg", "new", "old"]);
        let find = |name: &str| {
            status
                .ephemeral_container_statuses
                .iter()
                .flatten()
                .find(|c| c.name == name)
                .unwrap()
        };
        let dbg = find("dbg");
        assert!(dbg.state.as_ref().is_some_and(|s| s.running.is_some()));
        assert_eq!(
            dbg.container_id,
            Some(format!("ironlet://{}", id("dbg", 0)))
        );
        assert_eq!(dbg.image_id, "sha256:cafe");
        assert_eq!((dbg.ready, dbg.started), (false, None));
        let old = terminated_of(find("old").state.as_ref()).expect("terminated");
        assert_eq!(old.exit_code, 1);
        assert_eq!(waiting_reason(find("new")), Some("ContainerCreating"));
        assert!(
            status
                .container_statuses
                .iter()
                .flatten()
                .all(|c| c.name == "a"),
            "ephemeral containers are not regular ones"
        );
    }

    #[test]
    fn image_id_is_the_repo_digest_when_the_image_store_knows_it() {
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        let digest = "docker.io/library/busybox@sha256:beef";
        s.image_refs.insert("sha256:cafe".into(), digest.into());
        assert_eq!(container(&s.generate(), "a").image_id, digest);
    }

    #[test]
    fn restart_count_is_the_attempt_and_last_state_the_previous_instance() {
        let containers = vec![
            exited("a", 1, 100, 2, ExitReason::Error),
            running("a", 2, 200),
        ];
        let status = Scenario::new(ONE, containers).generate();
        let a = container(&status, "a");
        assert_eq!(a.restart_count, 2);
        let last = terminated_of(a.last_state.as_ref()).unwrap();
        assert_eq!((last.exit_code, last.reason.as_deref()), (2, Some("Error")));
        assert_eq!(last.container_id, Some(format!("ironlet://{}", id("a", 1))));
        assert_eq!(last.finished_at.as_ref().unwrap().0.as_second(), 105);
        assert!(a.state.as_ref().is_some_and(|s| s.running.is_some()));
    }

    #[test]
    fn an_exited_container_under_always_shows_crash_loop_back_off_with_last_state_terminated() {
        let status = crash_loop().generate();
        let a = container(&status, "a");
        let waiting = a.state.as_ref().and_then(|s| s.waiting.as_ref()).unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
        assert_eq!(
            waiting.message.as_deref(),
            Some("back-off 40s restarting failed container=a pod=p_ns(u1)")
        );
        let last = terminated_of(a.last_state.as_ref()).unwrap();
        assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
        assert_eq!(a.restart_count, 3);
        assert_eq!(phase(&status), "Running");
    }

    #[test]
    fn an_exited_container_without_a_waiting_reason_shows_terminated() {
        let s = Scenario::new(ONE, vec![exited("a", 3, 200, 1, ExitReason::Error)]);
        let status = s.generate();
        let a = container(&status, "a");
        assert_eq!(terminated_of(a.state.as_ref()).unwrap().exit_code, 1);
        assert_eq!(a.last_state, None, "the runtime kept no older instance");
    }

    #[test]
    fn a_container_that_will_not_restart_never_shows_a_waiting_reason() {
        let mut never = crash_loop();
        never.pod.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        let status = never.generate();
        assert!(terminated_of(container(&status, "a").state.as_ref()).is_some());

        let mut on_failure = Scenario::new(
            ONE,
            vec![exited("a", 0, 200, 0, ExitReason::Completed)],
        )
        .waiting("a", "CrashLoopBackOff", "m");
        on_failure.pod.spec.as_mut().unwrap().restart_policy = Some("OnFailure".into());
        assert!(terminated_of(container(&on_failure.generate(), "a").state.as_ref()).is_some());

        let mut deleted = crash_loop();
        deleted.pod.metadata.deletion_timestamp = Some(crate::status::time::api_time(t(900)));
        assert!(terminated_of(container(&deleted.generate(), "a").state.as_ref()).is_some());
    }

    #[test]
    fn a_container_whose_own_policy_is_never_shows_terminated_under_pod_policy_always() {
        let mut own_never = crash_loop();
        own_never.pod.spec.as_mut().unwrap().containers[0].restart_policy = Some("Never".into());
        let status = own_never.generate();
        assert!(
            terminated_of(container(&status, "a").state.as_ref()).is_some(),
            "a terminated container must never go back to waiting"
        );
    }

    #[test]
    fn a_container_not_created_shows_the_workers_error() {
        let s = Scenario::new(ONE, vec![]).waiting("a", "ErrImageNeverPull", "image not present");
        let status = s.generate();
        let w = container(&status, "a")
            .state
            .as_ref()
            .and_then(|s| s.waiting.clone())
            .unwrap();
        assert_eq!(w.reason.as_deref(), Some("ErrImageNeverPull"));
        assert_eq!(w.message.as_deref(), Some("image not present"));
    }

    #[test]
    fn a_created_container_waits_without_a_reason() {
        let status = Scenario::new(ONE, vec![created("a", 0, 100)]).generate();
        let a = container(&status, "a");
        let w = a.state.as_ref().and_then(|s| s.waiting.as_ref()).unwrap();
        assert_eq!(w.reason, None);
        assert_eq!(a.container_id, Some(format!("ironlet://{}", id("a", 0))));
    }

    #[test]
    fn oom_killed_reason_and_termination_message_are_reported() {
        let mut dead = exited("a", 0, 100, 137, ExitReason::OOMKilled);
        dead.message = Some("out of memory\n".into());
        let mut s = Scenario::new(ONE, vec![dead]);
        s.pod.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        let status = s.generate();
        let t = terminated_of(container(&status, "a").state.as_ref())
            .unwrap()
            .clone();
        assert_eq!(t.reason.as_deref(), Some("OOMKilled"));
        assert_eq!(t.exit_code, 137);
        assert_eq!(t.message.as_deref(), Some("out of memory\n"));
        assert_eq!(t.started_at.unwrap().0.as_second(), 101);
        assert_eq!(phase(&status), "Failed");
    }

    #[test]
    fn a_succeeded_init_container_is_ready_and_not_started() {
        let containers = vec![
            exited("i", 0, 100, 0, ExitReason::Completed),
            running("a", 0, 110),
        ];
        let s = Scenario::new(INIT, containers).waiting("i", "CrashLoopBackOff", "stale");
        let status = s.generate();
        let i = container(&status, "i");
        assert!(
            terminated_of(i.state.as_ref()).is_some(),
            "a finished init container stays terminated"
        );
        assert_eq!((i.ready, i.started), (true, Some(false)));
    }

    #[test]
    fn a_failed_init_container_is_not_ready() {
        let containers = vec![exited("i", 0, 100, 1, ExitReason::Error)];
        let status = Scenario::new(INIT, containers).generate();
        assert!(!container(&status, "i").ready);
    }

    #[test]
    fn readiness_and_startup_come_from_the_probes() {
        let mut s = Scenario::new(ONE, vec![running("a", 0, 100)]);
        s.probes = Probes::unready(&["a"]);
        let a = container(&s.generate(), "a").clone();
        assert_eq!((a.started, a.ready), (Some(true), false));
        s.probes.unstarted.insert("a".into());
        let a = container(&s.generate(), "a").clone();
        assert_eq!((a.started, a.ready), (Some(false), false));
    }

    #[test]
    fn app_statuses_are_sorted_by_name_and_init_statuses_follow_the_spec() {
        let spec = "initContainers: [{name: z, image: i}, {name: b, image: i}]\ncontainers: [{name: y, image: i}, {name: c, image: i}]";
        let status = Scenario::new(spec, vec![]).generate();
        let names = |l: &Option<Vec<ContainerStatus>>| {
            l.iter()
                .flatten()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&status.init_container_statuses), ["z", "b"]);
        assert_eq!(names(&status.container_statuses), ["c", "y"]);
    }

    #[test]
    fn a_running_container_that_vanished_gets_an_unknown_last_state_and_a_restart() {
        let before = Scenario::new(ONE, vec![running("a", 4, 100)]).generate();
        let mut s = Scenario::new(ONE, vec![]);
        s.previous = Some(before);
        let status = s.generate();
        let a = container(&status, "a");
        assert_eq!(waiting_reason(a), Some("ContainerCreating"));
        let last = terminated_of(a.last_state.as_ref()).unwrap();
        assert_eq!(
            (last.exit_code, last.reason.as_deref()),
            (137, Some("ContainerStatusUnknown"))
        );
        assert_eq!(a.restart_count, 5);
        assert_eq!(
            phase(&status),
            "Running",
            "a lost container does not make the pod pending"
        );
    }

    #[test]
    fn a_terminated_status_is_kept_when_the_runtime_forgot_the_container() {
        let mut s = Scenario::new(ONE, vec![exited("a", 0, 100, 0, ExitReason::Completed)]);
        s.pod.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        let before = s.generate();
        s.runtime.containers.clear();
        s.previous = Some(before.clone());
        let after = s.generate();
        assert_eq!(container(&after, "a").state, container(&before, "a").state);
        assert_eq!(phase(&after), "Succeeded");
    }

    #[test]
    fn container_ids_use_the_ironlet_scheme() {
        assert_eq!(
            api_container_id(&id("a", 0)),
            format!("ironlet://{}", id("a", 0))
        );
    }
}

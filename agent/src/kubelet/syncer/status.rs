//! Status after a sync: termination messages read from their files (or the log tail), the
//! API status computed by [`crate::status`] and stored, and the probe workers reconciled
//! with the running containers.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use crate::status::PodLifecycle as StatusLifecycle;
use ironlet_runtime::types::{ContainerId, ContainerState, PodStatus};
use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};

use super::start::TERMINATION_MESSAGE_HOST_PATH;
use super::NodeSyncer;
use crate::config::pod_uid;
use crate::pod_cache::CachedStatus;

/// kubelet's limits: 4096 bytes from the file; from the log, the last 80 lines and at
/// most 2048 bytes.
const MAX_MESSAGE_FILE_BYTES: u64 = 4096;
const MAX_LOG_TAIL_LINES: usize = 80;
const MAX_LOG_TAIL_BYTES: u64 = 2048;

impl NodeSyncer {
    /// Computes the API status from the runtime's and stores it (with a terminal phase held
    /// back while a container runs, [`crate::status::delay_terminal_phase`]); returns it as
    /// computed.
    pub(super) fn record_status(
        &self,
        pod: &Arc<Pod>,
        runtime: &PodStatus,
        lifecycle: &StatusLifecycle,
    ) -> ApiPodStatus {
        let uid = pod_uid(pod).to_owned();
        // An evicted pod reports its eviction whatever step records its status.
        let evicted = self.eviction_of(&uid);
        let lifecycle = evicted.as_ref().unwrap_or(lifecycle);
        let waiting = self.lock_waiting().get(&uid).cloned().unwrap_or_default();
        let previous = self.statuses.previous(&uid);
        let image_refs = self
            .image_refs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let host_ips: Vec<String> = self.node.host_ip.iter().cloned().collect();
        let status = crate::status::generate_pod_status(&crate::status::StatusInputs {
            pod,
            runtime,
            probes: &PodProbeState {
                manager: &self.probes,
                uid: &uid,
            },
            waiting: &waiting,
            previous: previous.as_ref(),
            host_ips: &host_ips,
            image_refs: &image_refs,
            lifecycle,
            now: SystemTime::now(),
        });
        self.observe_start(pod, previous.as_ref(), &status);
        // The worker acts on the status as computed; the API sees a terminal phase only once
        // no container runs.
        let published = crate::status::delay_terminal_phase(
            status.clone(),
            runtime,
            previous.as_ref().or(pod.status.as_ref()),
        );
        self.statuses.set(pod.clone(), published);
        status
    }

    /// Fills `message` of exited containers from their termination-message file, or the
    /// log tail under `FallbackToLogsOnError`. Read once per container and remembered.
    pub(super) fn fill_termination_messages(&self, pod: &Pod, cached: &mut CachedStatus) {
        let needs = cached
            .status
            .containers
            .iter()
            .any(|c| c.state == ContainerState::Exited && c.message.is_none());
        if !needs {
            return;
        }
        let mut status = (*cached.status).clone();
        let mut known = self
            .termination_messages
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for c in status
            .containers
            .iter_mut()
            .filter(|c| c.state == ContainerState::Exited && c.message.is_none())
        {
            let message = known.entry(c.id.to_string()).or_insert_with(|| {
                let from_file = c
                    .annotations
                    .get(TERMINATION_MESSAGE_HOST_PATH)
                    .and_then(|p| read_capped(Path::new(p), MAX_MESSAGE_FILE_BYTES))
                    .unwrap_or_default();
                let fallback = container_policy(pod, &c.name) == Some("FallbackToLogsOnError")
                    && from_file.is_empty()
                    && c.exit_code.unwrap_or(0) != 0;
                if fallback {
                    log_tail(&c.log_path).unwrap_or_default()
                } else {
                    from_file
                }
            });
            if !message.is_empty() {
                c.message = Some(message.clone());
            }
        }
        cached.status = Arc::new(status);
    }

    /// Starts and stops probe workers to match the running containers.
    /// Learns the repo digest (`imageID`) of the images of containers this agent did not
    /// start (re-adopted after a restart), so that their status shows the same `imageID`
    /// as when the previous agent started them.
    pub(super) async fn learn_image_refs(&self, status: &PodStatus) {
        let missing: Vec<(String, String)> = {
            let known = self.image_refs.lock().unwrap_or_else(|p| p.into_inner());
            status
                .containers
                .iter()
                .filter(|c| !known.contains_key(&c.image_id))
                .map(|c| (c.image.clone(), c.image_id.clone()))
                .collect()
        };
        for (image, image_id) in missing {
            let Ok(Some(found)) = self.images.get_image(&image).await else {
                continue;
            };
            if found.id == image_id {
                // Without a repo digest the id itself is the imageID (and is not looked
                // up again).
                let digest = found.repo_digests.first().unwrap_or(&found.id).clone();
                self.image_refs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(image_id, digest);
            }
        }
    }

    /// A container the manager does not track yet carries the readiness and `started` of
    /// the previous status of the very same container (after an agent restart: the
    /// previous agent's record, see [`super::super::status_store`]).
    pub(super) fn update_probes(&self, pod: &Pod, status: &PodStatus) {
        let previous = self.statuses.previous(pod_uid(pod));
        let running: Vec<crate::probes::RunningContainer> = super::running_containers(status)
            .map(|c| crate::probes::RunningContainer {
                name: c.name.clone(),
                id: c.id.clone(),
                started_at: c.started_at.unwrap_or(c.created_at),
                carried: carried(previous.as_ref(), &c.id),
            })
            .collect();
        let sandbox = status.sandboxes.iter().max_by_key(|s| s.created_at);
        let network = crate::probes::ProbeNetwork {
            ip: sandbox.and_then(|s| s.ip.clone()),
            netns_path: sandbox.and_then(|s| s.netns_path.clone()),
        };
        self.probes.update_pod(pod, &running, &network);
    }
}

/// What the previous status said of the running container `id`.
fn carried(previous: Option<&ApiPodStatus>, id: &ContainerId) -> crate::probes::Carried {
    let api_id = crate::status::api_container_id(id);
    let status = previous.and_then(|p| {
        p.container_statuses
            .iter()
            .flatten()
            .chain(p.init_container_statuses.iter().flatten())
            .find(|c| c.container_id.as_deref() == Some(api_id.as_str()))
    });
    let running = status
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some());
    match status {
        Some(c) if running => crate::probes::Carried {
            started: c.started == Some(true),
            ready: c.ready,
        },
        _ => crate::probes::Carried::default(),
    }
}

/// The probe manager's answers for one pod, as the status computation asks them.
struct PodProbeState<'a> {
    manager: &'a crate::probes::ProbeManager,
    uid: &'a str,
}

impl crate::status::ProbeState for PodProbeState<'_> {
    fn is_ready(&self, container_name: &str, container_id: &ContainerId) -> bool {
        self.manager
            .is_ready(self.uid, container_name, container_id)
    }

    fn is_started(&self, container_name: &str, container_id: &ContainerId) -> bool {
        self.manager
            .startup_done(self.uid, container_name, container_id)
            .unwrap_or(false)
    }
}

fn container_policy<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)?
        .termination_message_policy
        .as_deref()
}

fn read_capped(path: &Path, max: u64) -> Option<String> {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(max)
        .read_to_end(&mut buf)
        .ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The last lines of a CRI log file, without the CRI prefixes, capped as kubelet caps them.
fn log_tail(path: &Path) -> Option<String> {
    let mut file = ironlet_runtime::local::logs::open_log_for_reading(path).ok()?;
    let len = file.metadata().ok()?.len();
    // CRI prefixes roughly double short lines; read enough raw bytes for the cap.
    let start = len.saturating_sub(MAX_LOG_TAIL_BYTES * 4);
    file.seek(SeekFrom::Start(start)).ok()?;
    let mut raw = String::new();
    file.read_to_string(&mut raw).ok()?;
    let mut lines: Vec<&str> = raw
        .lines()
        .skip(usize::from(start > 0))
        .filter_map(|l| ironlet_runtime::local::logs::parse_record(l).map(|(_, _, text)| text))
        .collect();
    if lines.len() > MAX_LOG_TAIL_LINES {
        lines.drain(..lines.len() - MAX_LOG_TAIL_LINES);
    }
    let mut text = lines.join("\n");
    if text.len() as u64 > MAX_LOG_TAIL_BYTES {
        let mut cut = text.len() - MAX_LOG_TAIL_BYTES as usize;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        text = text.split_off(cut);
    }
    Some(text)
}

impl NodeSyncer {
    /// kubelet's `pod_start_sli_duration_seconds`: from when the agent first saw the pod to
    /// its first Running status (image pulls excluded: ironlet pulls none).
    fn observe_start(&self, pod: &Pod, previous: Option<&ApiPodStatus>, now: &ApiPodStatus) {
        let running =
            |s: Option<&ApiPodStatus>| s.and_then(|s| s.phase.as_deref()) == Some("Running");
        if running(previous) || !running(Some(now)) {
            return;
        }
        let seen = crate::config::annotation(pod, crate::config::CONFIG_SEEN)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        if let Some(seen) = seen {
            let elapsed = chrono::Utc::now().signed_duration_since(seen);
            if let Ok(elapsed) = elapsed.to_std() {
                self.metrics.pod_start_sli.observe(elapsed.as_secs_f64());
                self.metrics
                    .pod_start_duration
                    .observe(elapsed.as_secs_f64());
            }
        }
    }
}

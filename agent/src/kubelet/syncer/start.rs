//! Starting one container (kubelet's `startContainer`): image check, environment, mounts,
//! the termination-message file, create, start, and the postStart hook.

use std::path::PathBuf;

use ironlet_runtime::types::{ContainerId, ContainerState, Mount, PodSandboxStatus, SandboxId};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::NodeSyncer;
use crate::config::pod_uid;
use crate::kubelet::container_config::{container_config, ContainerInputs};
use crate::kubelet::events::{reason, EventType};
use crate::kubelet::security::{verify_run_as_non_root, ImageUser};
use crate::pod_workers::SyncError;
use crate::sync::{container_annotations, container_labels, ContainerKind, ContainerStart};
use crate::volumes::PodVolumes;

/// Annotation holding the host path of the container's termination-message file.
pub(crate) const TERMINATION_MESSAGE_HOST_PATH: &str = "ironlet.io/termination-message-host-path";

impl NodeSyncer {
    pub(super) async fn start_container(
        &self,
        pod: &Pod,
        sandbox: &SandboxId,
        sandbox_status: &mut PodSandboxStatus,
        start: &ContainerStart,
        volumes: &PodVolumes,
    ) -> Result<(), SyncError> {
        let container = start.spec(pod).ok_or_else(|| {
            SyncError::new(
                "CreateContainerError",
                format!("container {:?} is not in the pod spec", start.name),
            )
        })?;
        let container: &Container = &container;
        let image = container.image.clone().unwrap_or_default();
        self.ensure_image(pod, container, &image).await?;
        let image_config = match self.images.get_image(&image).await {
            Ok(found) => found.map(|i| i.config),
            Err(err) => return Err(self.config_error(pod, err.to_string())),
        };
        let image_user = ImageUser::parse(image_config.as_ref().and_then(|c| c.user.as_deref()));
        verify_run_as_non_root(pod, container, &image_user)
            .map_err(|message| self.config_error(pod, message))?;

        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        // A rootless pod's network may still come up (pasta) while its first container is
        // created; a container whose environment names the pod's IP waits for it first.
        let network_pending = !host_network && sandbox_status.ip.is_none();
        if network_pending && env_names_pod_ip(container) {
            self.await_pod_network(pod, sandbox, sandbox_status).await?;
        }
        let pod_ip = if host_network {
            self.node.host_ip.as_deref()
        } else {
            sandbox_status.ip.as_deref()
        };
        let env_ctx = crate::env::EnvContext {
            objects: self.objects.as_ref(),
            services: self.services.as_deref(),
            node_name: &self.config.node_name,
            pod_ip,
            host_ip: self.node.host_ip.as_deref(),
            allocatable: self.allocatable(),
        };
        let env = crate::env::container_env(pod, container, &env_ctx)
            .await
            .map_err(|e| self.config_error(pod, e.to_string()))?;
        let mut mounts = crate::volumes::container_mounts(pod, container, volumes, &env)
            .map_err(|e| self.config_error(pod, e.to_string()))?;
        let message_file = self.termination_message_file(pod, container, &mut mounts)?;
        self.mount_etc_files(pod, container, sandbox_status, &mut mounts)?;

        let labels = container_labels(pod, &container.name, start.kind.container_type());
        let mut annotations = container_annotations(pod, container, start.restart_count)
            .map_err(|e| self.config_error(pod, e.to_string()))?;
        annotations.insert(
            TERMINATION_MESSAGE_HOST_PATH.to_owned(),
            message_file.to_string_lossy().into_owned(),
        );
        let qos = crate::qos::qos_class(pod).map_err(|e| self.config_error(pod, e.to_string()))?;
        let seccomp_dir = self.config.root_dir.join("seccomp");
        let mut config = container_config(ContainerInputs {
            pod,
            container,
            attempt: start.restart_count,
            env,
            mounts,
            labels,
            annotations,
            qos,
            node_memory_bytes: self.node.memory_bytes,
            cgroup_options: &self.config.cgroup_options,
            seccomp_default: self.config.seccomp_default,
            seccomp_dir: &seccomp_dir,
        })
        .map_err(|e| self.config_error(pod, e.to_string()))?;
        if start.kind == ContainerKind::Ephemeral {
            config.pid_namespace_target = self.ephemeral_target(pod, sandbox, container).await?;
        }

        let id = self
            .runtime
            .create_container(sandbox, &config)
            .await
            .map_err(|e| {
                let message = format!("Error: {e}");
                self.event(pod, EventType::Warning, reason::FAILED, message.clone());
                SyncError::new("CreateContainerError", message)
            })?;
        self.event(
            pod,
            EventType::Normal,
            reason::CREATED,
            format!("Created container: {}", container.name),
        );
        if network_pending && sandbox_status.ip.is_none() {
            // The CRI's order only needs the network before the container starts: its
            // /etc/hosts gets the pod's IP now, in the inode the container mounts.
            let ready = match self.await_pod_network(pod, sandbox, sandbox_status).await {
                Ok(()) if sandbox_status.ip.is_some() => self.rewrite_hosts(pod, sandbox_status),
                other => other,
            };
            if let Err(err) = ready {
                let _ = self.runtime.remove_container(&id).await;
                return Err(err);
            }
        }
        if let Err(err) = self.runtime.start_container(&id).await {
            let message = format!("Error: {err}");
            self.event(pod, EventType::Warning, reason::FAILED, message.clone());
            let _ = self.runtime.remove_container(&id).await;
            return Err(SyncError::new("RunContainerError", message));
        }
        self.event(
            pod,
            EventType::Normal,
            reason::STARTED,
            format!("Started container {}", container.name),
        );
        self.run_post_start(pod, container, &id, sandbox_status)
            .await
    }

    /// Waits until the sandbox's network is up ([`ironlet_runtime::Runtime::await_pod_network`])
    /// and reads its status again (with the pod's IP). A network that failed is the
    /// sandbox's failure (kubelet's `FailedCreatePodSandBox`): the runtime turned it
    /// NotReady, and the next sync makes a new one.
    async fn await_pod_network(
        &self,
        pod: &Pod,
        sandbox: &SandboxId,
        sandbox_status: &mut PodSandboxStatus,
    ) -> Result<(), SyncError> {
        let failed = |err: ironlet_runtime::RuntimeError| self.sandbox_failed(pod, &err);
        self.runtime
            .await_pod_network(sandbox)
            .await
            .map_err(failed)?;
        *sandbox_status = self
            .runtime
            .pod_sandbox_status(sandbox)
            .await
            .map_err(failed)?;
        Ok(())
    }

    /// The running instance of an ephemeral container's `targetContainerName` in `sandbox`,
    /// whose PID namespace it joins (kubelet's `getTargetID`); `None` without a target.
    async fn ephemeral_target(
        &self,
        pod: &Pod,
        sandbox: &SandboxId,
        container: &Container,
    ) -> Result<Option<ContainerId>, SyncError> {
        let Some(target) = crate::sync::ephemeral::target_of(pod, &container.name) else {
            return Ok(None);
        };
        let status = self
            .runtime
            .pod_status(pod_uid(pod))
            .await
            .map_err(|e| SyncError::new("RuntimeStatusError", e.to_string()))?;
        let running = status.containers.into_iter().find(|c| {
            c.name == target && &c.sandbox_id == sandbox && c.state == ContainerState::Running
        });
        match running {
            Some(c) => Ok(Some(c.id)),
            None => {
                Err(self.config_error(pod, format!("unable to find target container {target}")))
            }
        }
    }

    pub(super) fn config_error(&self, pod: &Pod, message: String) -> SyncError {
        self.event(
            pod,
            EventType::Warning,
            reason::FAILED,
            format!("Error: {message}"),
        );
        SyncError::new("CreateContainerConfigError", message)
    }

    /// Creates an empty file for the container's termination message and mounts it at
    /// `terminationMessagePath` (kubelet: `<pod dir>/containers/<name>/<random>`).
    fn termination_message_file(
        &self,
        pod: &Pod,
        container: &Container,
        mounts: &mut Vec<Mount>,
    ) -> Result<PathBuf, SyncError> {
        let path = container
            .termination_message_path
            .clone()
            .unwrap_or_else(|| crate::config::DEFAULT_TERMINATION_MESSAGE_PATH.to_owned());
        let dir = self
            .config
            .pods_dir()
            .join(pod_uid(pod))
            .join("containers")
            .join(&container.name);
        let file = dir.join(ContainerId::random().short());
        // 0666 whatever the umask, as kubelet makes it: a non-root container writes it too.
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&file, b""))
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))
            })
            .map_err(|e| {
                SyncError::new(
                    "CreateContainerConfigError",
                    format!(
                        "creating the termination message file {}: {e}",
                        file.display()
                    ),
                )
            })?;
        if !mounts.iter().any(|m| m.container_path == path) {
            mounts.push(Mount {
                container_path: path,
                host_path: file.clone(),
                read_only: false,
            });
        }
        Ok(file)
    }
}

pub(crate) fn find_container<'a>(pod: &'a Pod, name: &str, init: bool) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    let list = if init {
        spec.init_containers.as_deref().unwrap_or_default()
    } else {
        &spec.containers
    };
    list.iter().find(|c| c.name == name)
}

/// Whether the container's environment takes the pod's IP (`status.podIP(s)`), which must
/// then be known before the container is created.
fn env_names_pod_ip(container: &Container) -> bool {
    container.env.iter().flatten().any(|var| {
        var.value_from
            .as_ref()
            .and_then(|from| from.field_ref.as_ref())
            .is_some_and(|field| {
                matches!(field.field_path.as_str(), "status.podIP" | "status.podIPs")
            })
    })
}

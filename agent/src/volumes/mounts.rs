//! [`container_mounts`]: a container's `volumeMounts` → the runtime's bind mounts, as
//! kubelet's `makeMounts` builds them (minus `/etc/hosts` and the termination log, which the
//! pod worker adds).
//!
//! * the volume must be one of the pod's set-up volumes;
//! * a relative `mountPath` is made absolute (`/` + path), as kubelet does on Linux;
//! * read-only when the volumeMount says so or the plugin always is (configMap, secret,
//!   downwardAPI, projected);
//! * `subPathExpr` is expanded with the container's environment (every referenced variable
//!   must be set and non-empty) and then treated as `subPath`; a subPath is bind-mounted
//!   safely through `volume-subpaths` (see `subpath`).

use std::path::PathBuf;

use ironlet_runtime::types::Mount;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::error::{SubPathError, VolumeError};
use super::{subpath, PodVolumes};
use crate::env::expand_strict;

/// The bind mounts of `container` (of `pod`), with `env` its environment from
/// `crate::env::container_env` for `subPathExpr`.
pub fn container_mounts(
    pod: &Pod,
    container: &Container,
    volumes: &PodVolumes,
    env: &[(String, String)],
) -> Result<Vec<Mount>, VolumeError> {
    let mut mounts = Vec::new();
    for (index, volume_mount) in container.volume_mounts.iter().flatten().enumerate() {
        let info =
            volumes
                .volumes
                .get(&volume_mount.name)
                .ok_or_else(|| VolumeError::VolumeNotFound {
                    volume: volume_mount.name.clone(),
                    container: container.name.clone(),
                })?;
        let sub_path_err = |source: SubPathError| VolumeError::SubPath {
            container: container.name.clone(),
            mount: volume_mount.name.clone(),
            source,
        };
        let sub_path = match volume_mount
            .sub_path_expr
            .as_deref()
            .filter(|e| !e.is_empty())
        {
            Some(expr) => expand_strict(expr, env).map_err(|err| sub_path_err(err.into()))?,
            None => volume_mount.sub_path.clone().unwrap_or_default(),
        };
        let host_path = if sub_path.is_empty() {
            info.path.clone()
        } else {
            let target: PathBuf = volumes
                .pod_dir
                .join("volume-subpaths")
                .join(&volume_mount.name)
                .join(&container.name)
                .join(index.to_string());
            subpath::prepare(&info.path, &sub_path, &target).map_err(|err| {
                tracing::warn!(
                    pod = pod.metadata.name.as_deref().unwrap_or_default(),
                    container = container.name,
                    volume = volume_mount.name,
                    sub_path,
                    %err,
                    "subPath refused",
                );
                sub_path_err(err)
            })?
        };
        let container_path = if volume_mount.mount_path.starts_with('/') {
            volume_mount.mount_path.clone()
        } else {
            format!("/{}", volume_mount.mount_path)
        };
        mounts.push(Mount {
            container_path,
            host_path,
            read_only: volume_mount.read_only == Some(true) || info.plugin.always_read_only(),
        });
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::VolumeMount;

    use super::*;
    use crate::volumes::{Medium, VolumeInfo, VolumePlugin};

    fn volumes() -> PodVolumes {
        let info = |plugin, path: &str| VolumeInfo {
            plugin,
            path: path.into(),
            medium: Medium::Disk,
            size_limit_bytes: None,
        };
        PodVolumes {
            pod_uid: "u".into(),
            pod_dir: "/nonexistent/pods/u".into(),
            volumes: BTreeMap::from([
                ("cfg".into(), info(VolumePlugin::ConfigMap, "/v/cfg")),
                ("data".into(), info(VolumePlugin::EmptyDir, "/v/data")),
            ]),
        }
    }

    fn mount(name: &str, path: &str, read_only: Option<bool>) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            read_only,
            ..VolumeMount::default()
        }
    }

    fn container(mounts: Vec<VolumeMount>) -> Container {
        Container {
            name: "app".into(),
            volume_mounts: Some(mounts),
            ..Container::default()
        }
    }

    #[test]
    fn mounts_carry_paths_and_read_only_with_plugin_attributes() {
        let c = container(vec![
            mount("data", "/data", None),
            mount("data", "scratch", Some(true)),
            mount("cfg", "/etc/app", Some(false)),
        ]);
        let mounts = container_mounts(&Pod::default(), &c, &volumes(), &[]).unwrap();
        let view: Vec<_> = mounts
            .iter()
            .map(|m| {
                (
                    m.container_path.as_str(),
                    m.host_path.to_str().unwrap(),
                    m.read_only,
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                ("/data", "/v/data", false),
                ("/scratch", "/v/data", true),
                ("/etc/app", "/v/cfg", true),
            ]
        );
    }

    #[test]
    fn an_undeclared_volume_is_an_error_naming_volume_and_container() {
        let c = container(vec![mount("ghost", "/g", None)]);
        let err = container_mounts(&Pod::default(), &c, &volumes(), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot find volume \"ghost\" to mount into container \"app\""
        );
        assert_eq!(err.reason(), "CreateContainerConfigError");
    }

    #[test]
    fn bad_sub_paths_fail_before_touching_the_disk() {
        let mut escape = mount("data", "/d", None);
        escape.sub_path = Some("../../etc".into());
        let err = container_mounts(&Pod::default(), &container(vec![escape]), &volumes(), &[])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to prepare subPath for volumeMount \"data\" of container \"app\": unable to provision SubPath `../../etc`: must not contain '..'"
        );
        let mut expr = mount("data", "/d", None);
        expr.sub_path_expr = Some("logs/$(POD_NAME)".into());
        let err =
            container_mounts(&Pod::default(), &container(vec![expr]), &volumes(), &[]).unwrap_err();
        assert!(
            err.to_string().ends_with("missing value for POD_NAME"),
            "{err}"
        );
    }
}

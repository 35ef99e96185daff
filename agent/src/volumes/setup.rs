//! `setup_pod_volumes`: each volume of the pod spec → a [`Plan`] (async: object lookups and
//! payloads), then the plans applied to disk in one blocking task.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ironlet_cgroups::CgroupOptions;
use k8s_openapi::api::core::v1::{Pod, Volume};

use super::atomic_writer::{self, Payload};
use super::error::{SetUpError, VolumeError};
use super::payload::{self, mode_or, PayloadContext, DEFAULT_MODE};
use super::{host_path, mount_table, Medium, PodVolumes, VolumeInfo, VolumeManager, VolumePlugin};
use crate::env::Allocatable;
use crate::qos::{pod_resources, Quantity};

/// kubelet's emptyDir directory mode.
const EMPTY_DIR_MODE: u32 = 0o777;
/// kubelet's mode for the pod and volumes directories.
const POD_DIR_MODE: u32 = 0o750;

/// What to do on disk for one volume.
#[derive(Debug)]
enum Plan {
    /// A directory, on tmpfs for `Medium::Memory`.
    EmptyDir {
        medium: Medium,
        size_limit_bytes: Option<u64>,
        mode: u32,
        /// The pod's `fsGroup`: owns the directory, which gets the setgid bit.
        group: Option<u32>,
    },
    /// A host path to check (and maybe create).
    HostPath { path: String, type_: Option<String> },
    /// A directory filled by the atomic writer.
    Files {
        plugin: VolumePlugin,
        medium: Medium,
        payload: Payload,
        /// The pod's `fsGroup`: owns the files, whose modes then include `0440`.
        group: Option<u32>,
    },
}

pub(super) async fn setup(
    manager: &VolumeManager,
    pod: &Pod,
    allocatable: &Allocatable,
) -> Result<PodVolumes, VolumeError> {
    let uid = pod.metadata.uid.as_deref().ok_or(VolumeError::MissingUid)?;
    let pod_dir = manager.pod_dir(super::teardown::checked_uid(uid)?);
    let ctx = PayloadContext {
        pod,
        namespace: pod.metadata.namespace.as_deref().unwrap_or("default"),
        objects: manager.objects.as_ref(),
        allocatable,
    };
    let mut plans = Vec::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let plan = plan(&ctx, volume)
            .await
            .map_err(|source| VolumeError::SetUp {
                volume: volume.name.clone(),
                source,
            })?;
        plans.push((volume.name.clone(), plan));
    }
    let pod_uid = uid.to_owned();
    tokio::task::spawn_blocking(move || apply_all(pod_uid, pod_dir, plans))
        .await
        .map_err(|err| VolumeError::Task {
            reason: err.to_string(),
        })?
}

async fn plan(ctx: &PayloadContext<'_>, volume: &Volume) -> Result<Plan, SetUpError> {
    // Payload volumes live on tmpfs as kubelet's do; rootless, mounting one needs a
    // capability the agent lacks, so they are written to the (private) data root instead.
    let rootless = !nix::unistd::geteuid().is_root();
    let memory = || match rootless {
        true => Medium::Disk,
        false => Medium::Memory {
            size_bytes: memory_size(ctx.pod, ctx.allocatable, None),
        },
    };
    if let Some(empty_dir) = &volume.empty_dir {
        let size_limit_bytes = empty_dir
            .size_limit
            .as_ref()
            .map(|q| Quantity::parse(&q.0).and_then(|q| q.amount()))
            .transpose()
            .map_err(SetUpError::SizeLimit)?
            .filter(|&size| size > 0);
        let medium = match empty_dir.medium.as_deref().unwrap_or_default() {
            "" => Medium::Disk,
            "Memory" => Medium::Memory {
                size_bytes: memory_size(ctx.pod, ctx.allocatable, size_limit_bytes),
            },
            other => {
                return Err(SetUpError::Unsupported {
                    kind: format!("emptyDir with medium {other}"),
                })
            }
        };
        return Ok(Plan::EmptyDir {
            medium,
            size_limit_bytes,
            mode: mode_or(empty_dir.mode, EMPTY_DIR_MODE),
            // Rootless, the agent cannot give a directory to another group (the fsGroup is
            // a subordinate id); the emptyDir stays world-writable (EMPTY_DIR_MODE) instead.
            group: fs_group(ctx.pod).filter(|_| !rootless),
        });
    }
    if let Some(host) = &volume.host_path {
        return Ok(Plan::HostPath {
            path: host.path.clone(),
            type_: host.type_.clone(),
        });
    }
    let mut files = Payload::new();
    let (plugin, medium) = if let Some(cm) = &volume.config_map {
        let mode = mode_or(cm.default_mode, DEFAULT_MODE);
        let optional = cm.optional == Some(true);
        payload::add_config_map(
            ctx,
            &cm.name,
            cm.items.as_deref(),
            mode,
            optional,
            &mut files,
        )
        .await?;
        (VolumePlugin::ConfigMap, Medium::Disk)
    } else if let Some(secret) = &volume.secret {
        let mode = mode_or(secret.default_mode, DEFAULT_MODE);
        let optional = secret.optional == Some(true);
        let name = secret.secret_name.as_deref().unwrap_or_default();
        let items = secret.items.as_deref();
        payload::add_secret(ctx, name, items, mode, optional, &mut files).await?;
        (VolumePlugin::Secret, memory())
    } else if let Some(downward) = &volume.downward_api {
        let mode = mode_or(downward.default_mode, DEFAULT_MODE);
        let items = downward.items.as_deref().unwrap_or_default();
        payload::add_downward_api(ctx, items, mode, &mut files)?;
        (VolumePlugin::DownwardApi, memory())
    } else if let Some(projected) = &volume.projected {
        files = payload::projected(ctx, &volume.name, projected).await?;
        (VolumePlugin::Projected, memory())
    } else {
        return Err(SetUpError::Unsupported {
            kind: source_kind(volume),
        });
    };
    let mut group = fs_group(ctx.pod);
    if group.is_some() {
        // kubelet's `SetVolumeOwnership` on a read-only volume adds `0440` to every file.
        for file in files.values_mut() {
            file.mode |= FS_GROUP_FILE_MODE;
        }
    }
    if group.is_some() && rootless {
        // Rootless: the group's host id is a subordinate one, which only the container's
        // user namespace may give; the files stay the agent's (container root's) and every
        // container user may read them instead.
        tracing::debug!(volume = %volume.name, "rootless: fsGroup not applied to the payload; files are world-readable");
        group = None;
        for file in files.values_mut() {
            file.mode |= ROOTLESS_FS_GROUP_FILE_MODE;
        }
    }
    Ok(Plan::Files {
        plugin,
        medium,
        payload: files,
        group,
    })
}

/// The bits kubelet's `SetVolumeOwnership` adds to the files of a read-only volume of a
/// pod with an `fsGroup` (owner and group may read).
const FS_GROUP_FILE_MODE: u32 = 0o440;

/// What a rootless agent adds instead of [`FS_GROUP_FILE_MODE`] (it cannot give the files
/// the group): read for everyone.
const ROOTLESS_FS_GROUP_FILE_MODE: u32 = 0o444;

/// The pod's `securityContext.fsGroup`, if set and valid.
fn fs_group(pod: &Pod) -> Option<u32> {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.fs_group)
        .and_then(|g| u32::try_from(g).ok())
}

/// The name of the volume source field that is set (`persistentVolumeClaim`…).
fn source_kind(volume: &Volume) -> String {
    serde_json::to_value(volume)
        .ok()
        .and_then(|v| {
            v.as_object()
                .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        })
        .unwrap_or_else(|| "<none>".to_owned())
}

/// kubelet's `calculateEmptyDirMemorySize`: the smallest positive of node allocatable memory,
/// the pod's memory limit (when every container declares one) and the volume's `sizeLimit`.
fn memory_size(pod: &Pod, allocatable: &Allocatable, size_limit: Option<u64>) -> Option<u64> {
    let pod_limit = pod_resources(pod)
        .ok()
        .and_then(|r| r.cgroup_settings(&CgroupOptions::default()).memory_limit)
        .and_then(|limit| u64::try_from(limit).ok());
    [Some(allocatable.memory_bytes), pod_limit, size_limit]
        .into_iter()
        .flatten()
        .filter(|&size| size > 0)
        .min()
}

fn apply_all(
    pod_uid: String,
    pod_dir: PathBuf,
    plans: Vec<(String, Plan)>,
) -> Result<PodVolumes, VolumeError> {
    let volumes_dir = pod_dir.join("volumes");
    if !plans.is_empty() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(POD_DIR_MODE)
            .create(&volumes_dir)
            .map_err(|source| VolumeError::PodDirectory {
                path: volumes_dir.clone(),
                source,
            })?;
    }
    let mut volumes = std::collections::BTreeMap::new();
    for (name, plan) in plans {
        let info = apply(&volumes_dir, &name, plan).map_err(|source| {
            tracing::warn!(pod_uid, volume = name, %source, "volume set-up failed");
            VolumeError::SetUp {
                volume: name.clone(),
                source,
            }
        })?;
        volumes.insert(name, info);
    }
    Ok(PodVolumes {
        pod_uid,
        pod_dir,
        volumes,
    })
}

fn apply(volumes_dir: &Path, name: &str, plan: Plan) -> Result<VolumeInfo, SetUpError> {
    let dir_of = |plugin: VolumePlugin| volumes_dir.join(plugin.dir_name()).join(name);
    match plan {
        Plan::EmptyDir {
            medium,
            size_limit_bytes,
            mode,
            group,
        } => {
            let path = dir_of(VolumePlugin::EmptyDir);
            ensure_dir(&path, mode, medium)?;
            if let Some(gid) = group {
                set_fs_group(&path, gid)?;
            }
            Ok(VolumeInfo {
                plugin: VolumePlugin::EmptyDir,
                path,
                medium,
                size_limit_bytes,
            })
        }
        Plan::HostPath { path, type_ } => {
            host_path::check(&path, type_.as_deref())?;
            Ok(VolumeInfo {
                plugin: VolumePlugin::HostPath,
                path: PathBuf::from(path),
                medium: Medium::Disk,
                size_limit_bytes: None,
            })
        }
        Plan::Files {
            plugin,
            medium,
            payload,
            group,
        } => {
            let path = dir_of(plugin);
            ensure_dir(&path, EMPTY_DIR_MODE, medium)?;
            if atomic_writer::write(&path, &payload, group)? {
                tracing::debug!(path = %path.display(), files = payload.len(), "volume contents written");
            }
            Ok(VolumeInfo {
                plugin,
                path,
                medium,
                size_limit_bytes: None,
            })
        }
    }
}

/// kubelet's `SetVolumeOwnership` on a writable volume's (new, empty) directory: group owner
/// `gid`, and `rw` plus `x` for the owner and the group and the setgid bit added to its mode,
/// so that what the containers create in it belongs to the group too.
fn set_fs_group(path: &Path, gid: u32) -> Result<(), SetUpError> {
    const DIR_MASK: u32 = 0o2770;
    let ownership_err = |source: io::Error| SetUpError::Ownership {
        path: path.to_path_buf(),
        source,
    };
    std::os::unix::fs::lchown(path, None, Some(gid)).map_err(ownership_err)?;
    let mode = fs::symlink_metadata(path).map_err(ownership_err)?.mode() & 0o7777;
    if mode & DIR_MASK != DIR_MASK {
        fs::set_permissions(path, fs::Permissions::from_mode(mode | DIR_MASK))
            .map_err(ownership_err)?;
    }
    Ok(())
}

/// Creates `path` with `mode` if missing, and mounts its tmpfs if it is memory-backed and
/// not mounted yet.
fn ensure_dir(path: &Path, mode: u32, medium: Medium) -> Result<(), SetUpError> {
    let create_err = |source: io::Error| SetUpError::Create {
        path: path.to_path_buf(),
        source,
    };
    if fs::symlink_metadata(path).is_err() {
        if let Some(parent) = path.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(POD_DIR_MODE)
                .create(parent)
                .map_err(create_err)?;
        }
        fs::DirBuilder::new()
            .mode(mode)
            .create(path)
            .map_err(create_err)?;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(create_err)?;
    }
    if let Medium::Memory { size_bytes } = medium {
        let canonical = fs::canonicalize(path).map_err(create_err)?;
        let mounted = mount_table::is_mount_point(&canonical)
            .map_err(|source| SetUpError::MountTable { source })?;
        if !mounted {
            mount_table::mount_tmpfs(&canonical, size_bytes).map_err(|source| {
                SetUpError::MountTmpfs {
                    path: canonical.clone(),
                    source,
                }
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Container, PersistentVolumeClaimVolumeSource, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

    use super::*;

    fn pod_with_memory_limits(limits: &[Option<&str>]) -> Pod {
        let containers = limits
            .iter()
            .enumerate()
            .map(|(i, limit)| Container {
                name: format!("c{i}"),
                resources: limit.map(|l| ResourceRequirements {
                    limits: Some(BTreeMap::from([("memory".into(), K8sQuantity(l.into()))])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            })
            .collect();
        Pod {
            spec: Some(PodSpec {
                containers,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn memory_volumes_are_sized_by_the_smallest_bound() {
        let node = Allocatable {
            memory_bytes: 1 << 30,
            ..Allocatable::default()
        };
        let limited = pod_with_memory_limits(&[Some("64Mi"), Some("64Mi")]);
        assert_eq!(memory_size(&limited, &node, None), Some(128 << 20));
        assert_eq!(memory_size(&limited, &node, Some(1 << 20)), Some(1 << 20));
        let partly = pod_with_memory_limits(&[Some("64Mi"), None]);
        assert_eq!(memory_size(&partly, &node, None), Some(1 << 30));
        let unknown = Allocatable::default();
        assert_eq!(memory_size(&partly, &unknown, None), None);
    }

    #[test]
    fn an_unsupported_volume_is_named_by_its_source_field() {
        let volume = Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: "c".into(),
                read_only: None,
            }),
            ..Volume::default()
        };
        assert_eq!(source_kind(&volume), "persistentVolumeClaim");
    }
}

//! Container root file systems: [`ImageStore::prepare_rootfs`] and
//! [`ImageStore::release_rootfs`], and the leases that keep their snapshots from gc.
//!
//! ```text
//!  target_dir/rootfs   overlay mount point, or the copied tree
//!            /upper    overlay upper dir (container writes)      } overlay modes only
//!            /work     overlay work dir                          }
//!            /rootfs-overlay.json  what the runtime mounts (userns overlay, rootless)
//!  images/leases/<sha256(target_dir)>.json   {image, chain ids, mode, ready}
//! ```
//!
//! Guarantees:
//! - the lease is written (under the shared gc lock, after the snapshots exist) before the
//!   mount or copy starts, and removed only by `release_rootfs` (or by gc once `target_dir`
//!   no longer exists), so gc never removes a snapshot under a prepared root file system;
//! - `prepare_rootfs` on a target that is already prepared for the same image returns it
//!   unchanged; anything else there (a half-prepared target after a crash, another
//!   image) is released first and prepared again;
//! - on error nothing is left mounted and the lease is removed;
//! - `release_rootfs` is idempotent: unmount (lazy detach if busy), remove `rootfs`,
//!   `upper`, `work` and the lease, then `target_dir` itself if it is empty (other files the
//!   runtime keeps there, such as `config.json`, are left alone). It never descends into a
//!   mount that is still present.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::copy::{copy_layers, CopyLayer};
use super::digest::Digest;
use super::error::ImageError;
use super::fsx::{self, LockKind};
use super::mount::{self, OverlaySpec};
use super::snapshot::Snapshot;
use super::store::ImageStore;
use super::userns_overlay;
use super::whiteout::WhiteoutFormat;
use crate::types::Image;

/// How a container's root file system is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootfsMode {
    /// An overlayfs of the snapshots (needs root and overlay-format snapshots).
    Overlay,
    /// An overlayfs of the snapshots that the container runtime mounts inside the
    /// container's user namespace (rootless; `userns_overlay.rs`): `rootfs` stays an empty
    /// directory on the host, described by `rootfs-overlay.json` beside it.
    UsernsOverlay,
    /// A copy of the snapshots with whiteouts applied.
    Copy,
    /// Overlay when it is possible and works, else copy.
    Auto,
}

/// What [`ImageStore::prepare_rootfs`] accepts to name an image: an [`Image`] (by its id),
/// or a string holding a reference or an id.
pub trait ImageSelector {
    fn selector(&self) -> &str;
}

impl ImageSelector for Image {
    fn selector(&self) -> &str {
        &self.id
    }
}

impl ImageSelector for str {
    fn selector(&self) -> &str {
        self
    }
}

impl ImageSelector for String {
    fn selector(&self) -> &str {
        self
    }
}

/// A prepared root file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedRootfs {
    /// `target_dir/rootfs`.
    pub rootfs: PathBuf,
    /// What was used, never `Auto`.
    pub mode: RootfsMode,
    /// The image id (`sha256:<config digest>`).
    pub image_id: String,
    /// With [`RootfsMode::UsernsOverlay`], the snapshot trees (top first) the container will
    /// see merged, to read image files from before it runs; empty otherwise.
    pub layers: Vec<PathBuf>,
}

/// One lease file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub target_dir: PathBuf,
    pub image_id: String,
    pub chain_ids: Vec<Digest>,
    pub mode: RootfsMode,
    pub ready: bool,
}

impl ImageStore {
    fn lease_path(&self, target_dir: &Path) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let key = Digest::of_bytes(target_dir.as_os_str().as_bytes());
        self.leases_dir().join(format!("{}.json", key.hex()))
    }

    fn write_lease(&self, lease: &Lease) -> Result<(), ImageError> {
        let bytes = serde_json::to_vec_pretty(lease).map_err(|e| {
            ImageError::io(
                "encoding lease for",
                &lease.target_dir,
                std::io::Error::other(e),
            )
        })?;
        fsx::write_state(&self.lease_path(&lease.target_dir), &bytes)
    }

    fn read_lease(path: &Path) -> Option<Lease> {
        let bytes = std::fs::read(path).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Every lease with its file.
    pub(crate) fn leases(&self) -> Result<Vec<(PathBuf, Lease)>, ImageError> {
        let dir = self.leases_dir();
        let rd = std::fs::read_dir(&dir).map_err(|e| ImageError::io("listing", &dir, e))?;
        Ok(rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter_map(|p| Self::read_lease(&p).map(|l| (p, l)))
            .collect())
    }

    /// Makes `target_dir/rootfs` the root file system of `image` (a reference or an id).
    pub fn prepare_rootfs<I: ImageSelector + ?Sized>(
        &self,
        image: &I,
        target_dir: &Path,
        mode: RootfsMode,
    ) -> Result<PreparedRootfs, ImageError> {
        let image = image.selector();
        let target_dir = absolute(target_dir)?;
        let (_, record) = self
            .resolve_records(image)?
            .into_iter()
            .next()
            .ok_or_else(|| ImageError::NotFound(image.to_owned()))?;
        let image_id = record.config_digest.to_string();
        let rootfs = target_dir.join("rootfs");
        if let Some(existing) = Self::read_lease(&self.lease_path(&target_dir)) {
            let described = userns_overlay::read(&target_dir);
            let usable = match existing.mode {
                RootfsMode::Overlay => mount::is_mount_point(&rootfs),
                RootfsMode::UsernsOverlay => rootfs.is_dir() && described.is_some(),
                _ => rootfs.is_dir(),
            };
            let wanted = mode == RootfsMode::Auto || mode == existing.mode;
            if existing.ready && existing.image_id == image_id && usable && wanted {
                return Ok(PreparedRootfs {
                    rootfs,
                    mode: existing.mode,
                    image_id,
                    layers: described.map(|d| d.lower).unwrap_or_default(),
                });
            }
            tracing::warn!(
                ?target_dir,
                "target holds a stale or different rootfs; releasing it"
            );
        }
        // Also clears what a crash before the lease was written may have left.
        self.release_rootfs(&target_dir)?;
        fsx::ensure_dir(&target_dir)?;
        let mut lease = Lease {
            target_dir: target_dir.clone(),
            image_id: image_id.clone(),
            chain_ids: record.layers.iter().map(|l| l.chain_id.clone()).collect(),
            mode,
            ready: false,
        };
        let snapshots = {
            let _gc = self.gc_lock(LockKind::Shared)?;
            let snapshots = self.ensure_snapshots(&record)?;
            self.write_lease(&lease)?;
            snapshots
        };
        match self.build_rootfs(&snapshots, &target_dir, mode) {
            Ok(used) => {
                lease.mode = used;
                lease.ready = true;
                if let Err(e) = self.write_lease(&lease) {
                    let _ = self.release_rootfs(&target_dir);
                    return Err(e);
                }
                tracing::info!(image = %image_id, ?target_dir, mode = ?used, layers = snapshots.len(), "rootfs prepared");
                let layers = if used == RootfsMode::UsernsOverlay {
                    snapshots.iter().rev().map(Snapshot::fs).collect()
                } else {
                    Vec::new()
                };
                Ok(PreparedRootfs {
                    rootfs,
                    mode: used,
                    image_id,
                    layers,
                })
            }
            Err(e) => {
                if let Err(cleanup) = self.release_rootfs(&target_dir) {
                    tracing::warn!(?target_dir, err = %cleanup, "cleaning up a failed rootfs");
                }
                Err(e)
            }
        }
    }

    fn build_rootfs(
        &self,
        snapshots: &[Snapshot],
        target_dir: &Path,
        mode: RootfsMode,
    ) -> Result<RootfsMode, ImageError> {
        let rootfs = target_dir.join("rootfs");
        let all = |format| {
            !snapshots.is_empty() && snapshots.iter().all(|s| s.marker.whiteouts == format)
        };
        let overlay_ready = all(WhiteoutFormat::Overlay);
        let userxattr_ready = all(WhiteoutFormat::UserXattr);
        match mode {
            RootfsMode::Copy => self.copy_rootfs(snapshots, &rootfs),
            RootfsMode::Overlay if !overlay_ready => Err(ImageError::OverlayUnavailable {
                target: rootfs,
                reason: "snapshots were unpacked without overlay whiteouts (rootless) or the \
                         image has no layers"
                    .into(),
            }),
            RootfsMode::Overlay => self.overlay_rootfs(snapshots, target_dir),
            RootfsMode::UsernsOverlay if !userxattr_ready => Err(ImageError::OverlayUnavailable {
                target: rootfs,
                reason: "snapshots were not unpacked with user-xattr whiteouts (an older \
                         version, root, or a file system without user xattrs) or the image \
                         has no layers"
                    .into(),
            }),
            RootfsMode::UsernsOverlay => match self.userns_overlay_works() {
                Ok(()) => self.describe_userns_overlay(snapshots, target_dir),
                Err(reason) => Err(ImageError::OverlayUnavailable {
                    target: rootfs,
                    reason: reason.clone(),
                }),
            },
            RootfsMode::Auto if overlay_ready && self.config.privileged => {
                match self.overlay_rootfs(snapshots, target_dir) {
                    Ok(m) => Ok(m),
                    Err(e) => {
                        tracing::warn!(?target_dir, err = %e, "overlay failed; copying the layers instead");
                        let _ = mount::unmount(&rootfs);
                        for d in ["rootfs", "upper", "work"] {
                            fsx::remove_tree(&target_dir.join(d))?;
                        }
                        self.copy_rootfs(snapshots, &rootfs)
                    }
                }
            }
            RootfsMode::Auto
                if !self.config.privileged
                    && userxattr_ready
                    && self.userns_overlay_works().is_ok() =>
            {
                self.describe_userns_overlay(snapshots, target_dir)
            }
            RootfsMode::Auto => {
                if !self.config.privileged && !userxattr_ready && !snapshots.is_empty() {
                    tracing::info!(?target_dir, "copying the image: some of its layers were unpacked by an older version (whiteouts overlayfs cannot read rootless); remove the image and pull or import it again for an overlay");
                }
                self.copy_rootfs(snapshots, &rootfs)
            }
        }
    }

    /// Whether overlayfs mounts inside a user namespace here ([`userns_overlay::probe`]);
    /// the error says why not, and is logged the first time in each process. The answer is
    /// kept in the store per kernel release, so each `ironlet ctr run` need not probe again.
    pub(crate) fn userns_overlay_works(&self) -> &Result<(), String> {
        self.userns_overlay.get_or_init(|| {
            let cache = self.root.join("userns-overlay-probe.json");
            let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned();
            let cached = std::fs::read(&cache)
                .ok()
                .and_then(|b| serde_json::from_slice::<ProbeRecord>(&b).ok())
                .filter(|r| !kernel.is_empty() && r.kernel == kernel);
            let result = match cached {
                Some(record) => record.result,
                None => {
                    let scratch = self
                        .snapshots_dir()
                        .join(fsx::unique_name("tmp-userns-overlay-probe-"));
                    let result = fsx::ensure_dir(&scratch)
                        .map_err(|e| e.to_string())
                        .and_then(|()| userns_overlay::probe(&scratch));
                    if let Err(e) = fsx::remove_tree(&scratch) {
                        tracing::warn!(dir = ?scratch, err = %e, "removing the overlay probe");
                    }
                    let record = ProbeRecord {
                        kernel,
                        result: result.clone(),
                    };
                    if let Ok(bytes) = serde_json::to_vec(&record) {
                        let _ = fsx::write_atomic(&cache, &bytes);
                    }
                    result
                }
            };
            match &result {
                Ok(()) => tracing::debug!("overlayfs mounts in a user namespace: rootless root file systems are overlays"),
                Err(reason) => tracing::warn!(%reason, "overlayfs does not mount in a user namespace here: rootless root file systems are copies of the image"),
            }
            result
        })
    }

    /// Why rootless root file systems cannot be overlays here (probing if not done yet);
    /// `None` when they can.
    pub fn userns_overlay_reason(&self) -> Option<String> {
        self.userns_overlay_works().clone().err()
    }

    /// Prepares the directories and description of a [`RootfsMode::UsernsOverlay`].
    fn describe_userns_overlay(
        &self,
        snapshots: &[Snapshot],
        target_dir: &Path,
    ) -> Result<RootfsMode, ImageError> {
        let d = userns_overlay::Description {
            lower: snapshots.iter().rev().map(Snapshot::fs).collect(),
            upper: target_dir.join("upper"),
            work: target_dir.join("work"),
            owners: snapshots.iter().any(|s| s.marker.owned_entries != Some(0)),
        };
        for dir in [&target_dir.join("rootfs"), &d.upper, &d.work] {
            make_dir(dir)?;
        }
        userns_overlay::describe(target_dir, &d)?;
        Ok(RootfsMode::UsernsOverlay)
    }

    fn overlay_rootfs(
        &self,
        snapshots: &[Snapshot],
        target_dir: &Path,
    ) -> Result<RootfsMode, ImageError> {
        let spec = OverlaySpec {
            lower: snapshots.iter().rev().map(Snapshot::fs).collect(),
            upper: target_dir.join("upper"),
            work: target_dir.join("work"),
            userxattr: false,
        };
        let rootfs = target_dir.join("rootfs");
        for d in [&rootfs, &spec.upper, &spec.work] {
            make_dir(d)?;
        }
        mount::mount_overlay(&spec, &rootfs)?;
        Ok(RootfsMode::Overlay)
    }

    fn copy_rootfs(&self, snapshots: &[Snapshot], rootfs: &Path) -> Result<RootfsMode, ImageError> {
        make_dir(rootfs)?;
        if let Some(old) = snapshots
            .iter()
            .find(|s| !self.config.privileged && !s.marker.owners_recorded)
        {
            tracing::warn!(
                chain_id = %old.marker.chain_id,
                "snapshot unpacked before file owners were recorded: its files belong to \
                 container root; remove the image and pull it again for the image's owners"
            );
        }
        let layers = snapshots
            .iter()
            .map(|s| {
                Ok(CopyLayer {
                    fs: s.fs(),
                    changes: s.changes()?,
                })
            })
            .collect::<Result<Vec<_>, ImageError>>()?;
        copy_layers(&layers, rootfs, self.config.privileged)?;
        Ok(RootfsMode::Copy)
    }

    /// What the container's writable layer under `target_dir` holds (CRI's
    /// `ContainerStats.writable_layer`): the overlay's `upper`, or the whole copied `rootfs`
    /// (a copy is all writable: the image's files count too). `None` when there is neither.
    /// Walks the tree: call it off the async executor.
    pub fn writable_layer_usage(&self, target_dir: &Path) -> Option<crate::fsutil::DiskUsage> {
        let upper = target_dir.join("upper");
        let layer = if upper.is_dir() {
            upper
        } else {
            target_dir.join("rootfs")
        };
        layer
            .is_dir()
            .then(|| crate::fsutil::disk_usage_and_inodes(&layer))
    }

    /// Undoes [`prepare_rootfs`](Self::prepare_rootfs); succeeds when there is nothing to undo.
    pub fn release_rootfs(&self, target_dir: &Path) -> Result<(), ImageError> {
        let target_dir = absolute(target_dir)?;
        let rootfs = target_dir.join("rootfs");
        mount::unmount(&rootfs)?;
        for d in ["rootfs", "upper", "work", userns_overlay::DESCRIPTION] {
            fsx::remove_tree(&target_dir.join(d))?;
        }
        let lease = self.lease_path(&target_dir);
        match std::fs::remove_file(&lease) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ImageError::io("removing lease", &lease, e)),
        }
        // Only if empty: the runtime may keep its own files beside the rootfs.
        let _ = std::fs::remove_dir(&target_dir);
        tracing::debug!(?target_dir, "rootfs released");
        Ok(())
    }
}

/// The answer of [`userns_overlay::probe`] on one kernel release.
#[derive(Serialize, Deserialize)]
struct ProbeRecord {
    kernel: String,
    result: Result<(), String>,
}

fn make_dir(path: &Path) -> Result<(), ImageError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(ImageError::io("creating directory", path, e)),
    }
}

fn absolute(path: &Path) -> Result<PathBuf, ImageError> {
    std::path::absolute(path).map_err(|e| ImageError::io("resolving", path, e))
}

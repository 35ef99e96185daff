//! [`ImageStore`]: the on-disk image store and its read/untag verbs (resolve, list, get,
//! remove, stats). Import, snapshots, root file systems and GC are `impl` blocks in their own
//! files.
//!
//! Layout under the root given to [`ImageStore::open`] (the runtime passes
//! `<data-root>/images`):
//!
//! ```text
//!  images/
//!    index.json, index.lock     refs → manifest digest, one record per manifest
//!    gc.lock                    shared by import/prepare, exclusive for gc
//!    blobs/sha256/<hex>         manifests, configs, layer blobs (verified on write)
//!    snapshots/<chain-hex>/     fs/ (unpacked layer), changes.json, done (written last)
//!    leases/<hex>.json          one per prepared root file system
//!    ingest/, snapshots/tmp-*   staging, removed by gc
//! ```
//!
//! Guarantees: every method may run concurrently with any other, in this process or in
//! another one on the same root (see the locks above). Lookups accept anything
//! [`Reference::parse`] accepts, an image id `sha256:<hex>`, or an unambiguous id prefix of
//! at least 12 hex characters. Images are grouped by id (config digest): two manifests of the
//! same config (say gzip from an OCI layout and plain tar from a docker-archive) are one
//! image with the tags of both.

use std::path::{Path, PathBuf};

use super::blobs::Blobs;
use super::digest::Digest;
use super::error::ImageError;
use super::fsx::{self, FileLock, LockKind};
use super::index::{Index, IndexFile};
use super::reference::Reference;
use super::sys;
use crate::types::{Image, ImageStats};

/// Limits and modes of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageStoreConfig {
    /// Largest unpacked size of one layer (sum of file sizes). containerd has no limit; we
    /// refuse decompression bombs at 8 GiB.
    pub max_layer_bytes: u64,
    /// Most entries in one layer.
    pub max_layer_entries: u64,
    /// Unpack as root: keep ownership from the tar and write overlayfs whiteouts. Defaults
    /// to "the effective uid is 0".
    pub privileged: bool,
    /// Sync unpacked snapshots: one `syncfs` per pull, import or rootfs preparation, after
    /// its layers (`snapshot.rs`), so a snapshot marked done survives a power loss complete
    /// or is unpacked again. `false`: never synced and trusted after a reboot, as
    /// containerd's unpack by default.
    pub sync_snapshots: bool,
}

impl Default for ImageStoreConfig {
    fn default() -> Self {
        Self {
            max_layer_bytes: 8 << 30,
            max_layer_entries: 1_000_000,
            privileged: sys::is_root(),
            sync_snapshots: true,
        }
    }
}

/// The local, content-addressed image store.
#[derive(Debug)]
pub struct ImageStore {
    pub(crate) root: PathBuf,
    pub(crate) config: ImageStoreConfig,
    pub(crate) blobs: Blobs,
    pub(crate) index: Index,
    /// See [`ImageStore::user_xattrs_supported`].
    pub(crate) user_xattrs: std::sync::OnceLock<bool>,
    /// Whether overlayfs mounts in a user namespace here (see `userns_overlay.rs`), probed
    /// once; the error says why not.
    pub(crate) userns_overlay: std::sync::OnceLock<Result<(), String>>,
    /// `syncfs` calls made for snapshots (tests count them).
    pub(crate) syncs: std::sync::atomic::AtomicU64,
}

/// What a lookup resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A reference key in the index.
    Ref(String),
    /// One manifest (a digest reference).
    Manifest(Digest),
    /// An image id: every manifest with this config.
    Id(Digest),
}

impl ImageStore {
    /// Opens (creating if needed) the store at `root` with the default config.
    pub fn open(root: &Path) -> Result<Self, ImageError> {
        Self::open_with(root, ImageStoreConfig::default())
    }

    pub fn open_with(root: &Path, config: ImageStoreConfig) -> Result<Self, ImageError> {
        let store = Self {
            root: root.to_path_buf(),
            blobs: Blobs::new(root),
            index: Index::new(root),
            config,
            user_xattrs: Default::default(),
            userns_overlay: Default::default(),
            syncs: Default::default(),
        };
        // Other users get nothing of the store, rootless or not: blobs may hold private
        // images and snapshots setuid binaries. containerd keeps its root 0700 (0711 at
        // most) and its overlay snapshotter's 0700; here every directory ironlet makes in
        // the store is 0700 as well, so a parent opened up later still exposes nothing.
        fsx::ensure_private_dir(root)?;
        store.blobs.create_dirs()?;
        fsx::ensure_private_dir(&store.snapshots_dir())?;
        fsx::ensure_private_dir(&store.leases_dir())?;
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn config(&self) -> &ImageStoreConfig {
        &self.config
    }

    pub(crate) fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    pub(crate) fn leases_dir(&self) -> PathBuf {
        self.root.join("leases")
    }

    /// Held shared by import and prepare (which add content), exclusive by gc.
    pub(crate) fn gc_lock(&self, kind: LockKind) -> Result<FileLock, ImageError> {
        FileLock::acquire(&self.root.join("gc.lock"), kind)
    }

    /// The gc lock if it is free now (no gc, import, pull or prepare in flight anywhere).
    pub(crate) fn try_gc_lock(&self, kind: LockKind) -> Result<Option<FileLock>, ImageError> {
        FileLock::try_acquire(&self.root.join("gc.lock"), kind)
    }

    /// Every image, one per id, sorted by id.
    pub fn list_images(&self) -> Result<Vec<Image>, ImageError> {
        let file = self.index.load()?;
        let mut ids: Vec<&Digest> = file.images.values().map(|r| &r.config_digest).collect();
        ids.sort();
        ids.dedup();
        Ok(ids
            .into_iter()
            .filter_map(|id| image_of(&file, id))
            .collect())
    }

    /// The image a reference or id names, if present.
    pub fn get_image(&self, reference: &str) -> Result<Option<Image>, ImageError> {
        let file = self.index.load()?;
        Ok(id_of(&file, reference)?.and_then(|id| image_of(&file, &id)))
    }

    /// Untags a reference (or removes every tag of an id / every ref of a digest). The
    /// manifest goes from the index with its last reference; blobs and snapshots stay until
    /// [`gc`](Self::gc). Returns `false` when nothing matched.
    pub fn remove_image(&self, reference: &str) -> Result<bool, ImageError> {
        self.index.update(|file| {
            let manifests: Vec<Digest> = match resolve(file, reference)? {
                None => return Ok(false),
                Some(Target::Ref(key)) => {
                    let removed = file.untag(&key).is_some();
                    tracing::info!(reference = %key, "image reference removed");
                    return Ok(removed);
                }
                Some(Target::Manifest(m)) => vec![m],
                Some(Target::Id(id)) => file
                    .images
                    .iter()
                    .filter(|(_, r)| r.config_digest == id)
                    .map(|(m, _)| m.clone())
                    .collect(),
            };
            for m in &manifests {
                file.refs.retain(|_, target| target != m);
                file.images.remove(m);
                tracing::info!(manifest = %m, "image removed");
            }
            file.drop_stale_pins();
            Ok(!manifests.is_empty())
        })
    }

    /// Pins (or unpins) the image a reference or id names: image garbage collection never
    /// removes a pinned image. Returns `false` when nothing matched.
    pub fn set_pinned(&self, reference: &str, pinned: bool) -> Result<bool, ImageError> {
        self.index.update(|file| {
            let Some(id) = id_of(file, reference)? else {
                return Ok(false);
            };
            if pinned {
                file.pinned.insert(id.clone());
            } else {
                file.pinned.remove(&id);
            }
            file.drop_stale_pins();
            tracing::info!(image = %id, pinned, "image pin set");
            Ok(true)
        })
    }

    /// Bytes used by blobs and snapshots.
    /// Whether `reference` names an image that a registry pull put there (`false` for
    /// imports and for references that name nothing).
    pub fn is_pulled(&self, reference: &str) -> Result<bool, ImageError> {
        let file = self.index.load()?;
        Ok(match resolve(&file, reference)? {
            Some(Target::Ref(key)) => file.pulled.contains(&key),
            _ => false,
        })
    }

    pub fn image_stats(&self) -> Result<ImageStats, ImageError> {
        Ok(ImageStats {
            total_storage_bytes: fsx::disk_usage(self.blobs.dir())
                + fsx::disk_usage(&self.snapshots_dir()),
        })
    }

    /// The manifest records an image reference or id resolves to (first: the one a tag
    /// points at, or the first by digest).
    pub(crate) fn resolve_records(
        &self,
        reference: &str,
    ) -> Result<Vec<(Digest, super::index::ImageRecord)>, ImageError> {
        let file = self.index.load()?;
        let not_found = || ImageError::NotFound(reference.to_owned());
        let manifests: Vec<Digest> = match resolve(&file, reference)?.ok_or_else(not_found)? {
            Target::Ref(key) => file.refs.get(&key).cloned().into_iter().collect(),
            Target::Manifest(m) => vec![m],
            Target::Id(id) => file
                .images
                .iter()
                .filter(|(_, r)| r.config_digest == id)
                .map(|(m, _)| m.clone())
                .collect(),
        };
        let out: Vec<_> = manifests
            .into_iter()
            .filter_map(|m| file.images.get(&m).cloned().map(|r| (m, r)))
            .collect();
        if out.is_empty() {
            return Err(not_found());
        }
        Ok(out)
    }
}

/// The image id a reference or id names, if present.
fn id_of(file: &IndexFile, reference: &str) -> Result<Option<Digest>, ImageError> {
    let record = |m: &Digest| file.images.get(m).map(|r| r.config_digest.clone());
    Ok(match resolve(file, reference)? {
        None => None,
        Some(Target::Id(id)) => Some(id),
        Some(Target::Ref(key)) => file.refs.get(&key).and_then(record),
        Some(Target::Manifest(m)) => record(&m),
    })
}

/// Resolves a user's string against the index. `Ok(None)` when it is valid but absent.
pub(crate) fn resolve(file: &IndexFile, input: &str) -> Result<Option<Target>, ImageError> {
    if let Some(hex) = input.strip_prefix(Digest::PREFIX) {
        if !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) || hex.len() < 12 {
            return Err(ImageError::InvalidReference {
                reference: input.to_owned(),
                reason: "an image id is sha256: and at least 12 lowercase hex characters",
            });
        }
        return by_id_prefix(file, hex);
    }
    let looks_like_id = (12..=64).contains(&input.len())
        && input
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let parsed = match Reference::parse(input) {
        Ok(r) => r,
        Err(_) if looks_like_id => return by_id_prefix(file, input),
        Err(e) => return Err(e),
    };
    let key = parsed.to_string();
    if file.refs.contains_key(&key) {
        return Ok(Some(Target::Ref(key)));
    }
    if let Some(d) = parsed.digest().and_then(Digest::parse) {
        let name = parsed.name();
        let known = file.images.contains_key(&d);
        let unnamed = file.refs_to(&d).next().is_none();
        let same_repo = file
            .refs_to(&d)
            .any(|r| Reference::parse(r).is_ok_and(|other| other.name() == name));
        return Ok((known && (unnamed || same_repo)).then_some(Target::Manifest(d)));
    }
    if looks_like_id {
        return by_id_prefix(file, input);
    }
    Ok(None)
}

fn by_id_prefix(file: &IndexFile, hex: &str) -> Result<Option<Target>, ImageError> {
    let mut ids: Vec<&Digest> = file
        .images
        .values()
        .map(|r| &r.config_digest)
        .filter(|id| id.hex().starts_with(hex))
        .collect();
    ids.sort();
    ids.dedup();
    match ids.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(Target::Id((*one).clone()))),
        _ => Err(ImageError::AmbiguousId {
            prefix: hex.to_owned(),
        }),
    }
}

/// The [`Image`] view of one id.
pub(crate) fn image_of(file: &IndexFile, id: &Digest) -> Option<Image> {
    let manifests: Vec<(&Digest, &super::index::ImageRecord)> = file
        .images
        .iter()
        .filter(|(_, r)| &r.config_digest == id)
        .collect();
    let mut repo_tags = Vec::new();
    let mut repo_digests = Vec::new();
    let mut primary = None;
    for (m, rec) in &manifests {
        for key in file.refs_to(m) {
            primary.get_or_insert(*rec);
            let Ok(r) = Reference::parse(key) else {
                continue;
            };
            if r.digest().is_none() {
                repo_tags.push(key.to_owned());
            }
            repo_digests.push(r.repo_digest(m));
        }
    }
    repo_tags.sort();
    repo_tags.dedup();
    repo_digests.sort();
    repo_digests.dedup();
    let rec = primary.or_else(|| manifests.first().map(|(_, r)| *r))?;
    Some(Image {
        id: id.to_string(),
        repo_tags,
        repo_digests,
        size: rec.size,
        config: rec.config.clone(),
        pinned: file.pinned.contains(id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::index::ImageRecord;
    use crate::types::ImageConfig;

    fn index_with_ids(ids: &[&str]) -> IndexFile {
        let mut file = IndexFile::default();
        for (i, hex) in ids.iter().enumerate() {
            file.images.insert(
                Digest::of_bytes(&[i as u8]),
                ImageRecord {
                    config_digest: Digest::from_hex(hex).unwrap(),
                    layers: vec![],
                    size: 0,
                    config: ImageConfig::default(),
                },
            );
        }
        file
    }

    #[test]
    fn an_id_prefix_shared_by_two_images_is_ambiguous_and_a_longer_one_is_not() {
        let a = format!("{}{}", "a".repeat(12), "0".repeat(52));
        let b = format!("{}{}", "a".repeat(12), "1".repeat(52));
        let file = index_with_ids(&[&a, &b]);
        let err = resolve(&file, &"a".repeat(12)).unwrap_err();
        assert!(matches!(err, ImageError::AmbiguousId { .. }), "{err}");
        assert_eq!(err.kubelet_reason(), "ImageInspectError");
        let err = resolve(&file, &format!("sha256:{}", "a".repeat(12))).unwrap_err();
        assert!(matches!(err, ImageError::AmbiguousId { .. }), "{err}");
        let one = resolve(&file, &format!("{}0", "a".repeat(12))).unwrap();
        assert_eq!(one, Some(Target::Id(Digest::from_hex(&a).unwrap())));
        assert_eq!(resolve(&file, &"b".repeat(12)).unwrap(), None);
        // Eleven characters are a repository name, not an id prefix.
        assert_eq!(resolve(&file, &"a".repeat(11)).unwrap(), None);
    }

    #[test]
    fn a_full_id_resolves_even_when_it_is_not_a_valid_repository_name() {
        let a = "c".repeat(64);
        let file = index_with_ids(&[&a]);
        let id = Digest::from_hex(&a).unwrap();
        assert_eq!(resolve(&file, &a).unwrap(), Some(Target::Id(id.clone())));
        assert_eq!(
            resolve(&file, id.to_string().as_str()).unwrap(),
            Some(Target::Id(id))
        );
    }
}

//! [`ImageStore::import`]: OCI image layouts, OCI archives and docker-archives.
//!
//! ```text
//!  Source::open ──► stage (OCI layout: index → manifest → config → layers;
//!    (dir or tar)          docker-archive: manifest.json → config + layers → OCI manifest)
//!               ──► unpack every layer into its snapshot (checks each diff_id)
//!               ──► one index update: records + references
//! ```
//!
//! Guarantees:
//! - every blob is verified against its digest and size, every layer against its diff_id,
//!   before the index changes; an image with a missing or corrupt blob (or an unsafe layer)
//!   is refused and the index is left exactly as it was;
//! - the whole import is one index update, so it is all-or-nothing for the index; a failed
//!   import also removes the blobs and snapshots it added (unless another image references
//!   them by then), so refused content does not linger in the store;
//! - a docker-archive is converted to an OCI manifest (config verbatim, layers as they are,
//!   `tar` or `tar+gzip` by content), so the same image has the same id (config digest)
//!   from all three forms;
//! - importing the same thing again changes nothing.
//!
//! Names: a layout descriptor's `io.containerd.image.name` wins; else its
//! `org.opencontainers.image.ref.name` is a full reference when it contains `/`, `:` or
//! `@`, and otherwise a tag of the source's base name (`out/busybox` or `busybox.oci.tar`
//! with ref name `latest` → `busybox:latest`). An image without a usable name is imported
//! untagged (listable and usable by id).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use super::digest::Digest;
use super::error::ImageError;
use super::fsx::LockKind;
use super::index::{ImageRecord, LayerRecord};
use super::oci::{self, ConfigFile, Descriptor, DockerArchiveEntry, Index, Manifest};
use super::reference::Reference;
use super::source::{Format, Source};
use super::store::{image_of, ImageStore};
use crate::types::Image;

/// One image checked and ready to be indexed.
#[derive(Debug)]
struct Staged {
    manifest: Digest,
    record: ImageRecord,
    names: Vec<Reference>,
}

impl ImageStore {
    /// Imports every image in an OCI layout directory, OCI archive or docker-archive.
    pub fn import(&self, path: &Path) -> Result<Vec<Image>, ImageError> {
        let gc = self.gc_lock(LockKind::Shared)?;
        let blobs_before: HashSet<Digest> = self.blobs.list()?.into_iter().collect();
        let snapshots_before: HashSet<String> = self
            .snapshot_entries()?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let result = self.import_locked(path);
        drop(gc);
        if result.is_err() {
            let blobs: Vec<Digest> = self
                .blobs
                .list()?
                .into_iter()
                .filter(|d| !blobs_before.contains(d))
                .collect();
            let snapshots: Vec<String> = self
                .snapshot_entries()?
                .into_iter()
                .map(|(n, _)| n)
                .filter(|n| !snapshots_before.contains(n) && !n.starts_with("tmp-"))
                .collect();
            if let Err(e) = self.discard_unreferenced(&blobs, &snapshots) {
                tracing::warn!(source = ?path, err = %e, "removing what a failed import added");
            }
        }
        result
    }

    /// [`Self::import`] with the gc lock held shared.
    fn import_locked(&self, path: &Path) -> Result<Vec<Image>, ImageError> {
        let source = Source::open(self, path)?;
        let staged = match source.format {
            Format::OciLayout => self.stage_layout(&source)?,
            Format::DockerArchive => self.stage_docker(&source)?,
        };
        for s in &staged {
            self.ensure_snapshots(&s.record)?;
        }
        let images = self.index.update(|file| {
            for s in &staged {
                file.images.insert(s.manifest.clone(), s.record.clone());
                for name in &s.names {
                    file.tag(name.to_string(), s.manifest.clone());
                }
            }
            let mut ids: Vec<&Digest> = staged.iter().map(|s| &s.record.config_digest).collect();
            ids.dedup();
            Ok(ids
                .into_iter()
                .filter_map(|id| image_of(file, id))
                .collect::<Vec<_>>())
        })?;
        for s in &staged {
            tracing::info!(source = ?path, manifest = %s.manifest, id = %s.record.config_digest,
                names = ?s.names.iter().map(ToString::to_string).collect::<Vec<_>>(), "image imported");
        }
        Ok(images)
    }

    fn stage_layout(&self, src: &Source) -> Result<Vec<Staged>, ImageError> {
        let layout = src.read_small(self, "oci-layout")?.unwrap_or_default();
        let layout: serde_json::Value =
            oci::parse_json(&layout, "oci-layout", &src.location("oci-layout"))?;
        if layout.get("imageLayoutVersion").and_then(|v| v.as_str()) != Some("1.0.0") {
            return Err(ImageError::invalid(
                src.location("oci-layout"),
                "oci-layout",
                "imageLayoutVersion is not 1.0.0".into(),
            ));
        }
        let bytes = src.read_small(self, "index.json")?.unwrap_or_default();
        let index: Index = oci::parse_json(&bytes, "image index", &src.location("index.json"))?;
        let base = src.base_name();
        let mut by_manifest: BTreeMap<Digest, Staged> = BTreeMap::new();
        for desc in &index.manifests {
            let names = names_for(desc, base.as_deref())?;
            let manifest = if oci::is_index(&desc.media_type) {
                self.pick_platform(src, desc)?
            } else if oci::is_manifest(&desc.media_type) || desc.media_type.is_empty() {
                desc.clone()
            } else {
                tracing::debug!(media_type = %desc.media_type, digest = %desc.digest, "skipping non-image descriptor");
                continue;
            };
            if let Some(s) = by_manifest.get_mut(&manifest.digest) {
                s.names.extend(names);
                continue;
            }
            let record = self.stage_manifest(src, &manifest)?;
            by_manifest.insert(
                manifest.digest.clone(),
                Staged {
                    manifest: manifest.digest,
                    record,
                    names,
                },
            );
        }
        if by_manifest.is_empty() {
            return Err(ImageError::invalid(
                src.location("index.json"),
                "image index",
                "lists no image manifest".into(),
            ));
        }
        Ok(by_manifest.into_values().collect())
    }

    /// The manifest for this host's platform in a nested index.
    fn pick_platform(&self, src: &Source, desc: &Descriptor) -> Result<Descriptor, ImageError> {
        src.ingest_blob(self, desc)?;
        let bytes = self
            .blobs
            .read_verified(&desc.digest, oci::MAX_METADATA_BYTES)?;
        let location = src.location(&format!("blobs/sha256/{}", desc.digest.hex()));
        let index: Index = oci::parse_json(&bytes, "image index", &location)?;
        let (os, arch) = oci::host_platform();
        let matching = index.manifests.iter().find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == os && p.architecture == arch)
        });
        match (matching, index.manifests.as_slice()) {
            (Some(m), _) => Ok(m.clone()),
            (None, [only]) if only.platform.is_none() => Ok(only.clone()),
            _ => Err(ImageError::NoMatchingPlatform {
                location,
                platform: format!("{os}/{arch}"),
            }),
        }
    }

    fn stage_manifest(&self, src: &Source, desc: &Descriptor) -> Result<ImageRecord, ImageError> {
        src.ingest_blob(self, desc)?;
        let location = src.location(&format!("blobs/sha256/{}", desc.digest.hex()));
        let bytes = self
            .blobs
            .read_verified(&desc.digest, oci::MAX_METADATA_BYTES)?;
        let manifest = oci::parse_manifest(&bytes, &location)?;
        src.ingest_blob(self, &manifest.config)?;
        let config_bytes = self
            .blobs
            .read_verified(&manifest.config.digest, oci::MAX_METADATA_BYTES)?;
        for layer in &manifest.layers {
            if !oci::is_supported_layer(&layer.media_type) {
                return Err(ImageError::UnsupportedMediaType {
                    location: location.clone(),
                    media_type: layer.media_type.clone(),
                    digest: layer.digest.to_string(),
                });
            }
            src.ingest_blob(self, layer)?;
        }
        record_of(&manifest, &config_bytes, &location)
    }

    fn stage_docker(&self, src: &Source) -> Result<Vec<Staged>, ImageError> {
        let location = src.location("manifest.json");
        let bytes = src.read_small(self, "manifest.json")?.unwrap_or_default();
        let entries: Vec<DockerArchiveEntry> =
            oci::parse_json(&bytes, "docker-archive manifest", &location)?;
        let mut staged = Vec::with_capacity(entries.len());
        for entry in entries {
            let config_bytes =
                src.read_small(self, &entry.config)?
                    .ok_or_else(|| ImageError::BlobMissing {
                        location: src.location(&entry.config),
                        digest: "(image config)".into(),
                    })?;
            let config_digest = Digest::of_bytes(&config_bytes);
            if let Some(named) = digest_in_name(&entry.config) {
                if named != config_digest {
                    return Err(ImageError::DigestMismatch {
                        location: src.location(&entry.config),
                        expected: named.to_string(),
                        actual: config_digest.to_string(),
                        expected_size: None,
                        actual_size: config_bytes.len() as u64,
                    });
                }
            }
            self.blobs
                .write_bytes(&config_bytes, &src.location(&entry.config))?;
            let mut layers = Vec::with_capacity(entry.layers.len());
            for name in &entry.layers {
                let (digest, size) = src.ingest_file(self, name)?;
                let compression = self.sniff_blob(&digest)?;
                layers.push(Descriptor {
                    media_type: compression.oci_media_type().to_owned(),
                    digest,
                    size,
                    annotations: BTreeMap::new(),
                    platform: None,
                });
            }
            let manifest = Manifest {
                schema_version: 2,
                media_type: Some(oci::MT_OCI_MANIFEST.to_owned()),
                config: Descriptor {
                    media_type: oci::MT_OCI_CONFIG.to_owned(),
                    digest: config_digest,
                    size: config_bytes.len() as u64,
                    annotations: BTreeMap::new(),
                    platform: None,
                },
                layers,
            };
            let record = record_of(&manifest, &config_bytes, &src.location(&entry.config))?;
            let manifest_bytes = serde_json::to_vec(&manifest).map_err(|e| {
                ImageError::io("encoding manifest for", &location, std::io::Error::other(e))
            })?;
            let manifest_digest = self.blobs.write_bytes(&manifest_bytes, &location)?;
            let names = entry
                .repo_tags
                .unwrap_or_default()
                .iter()
                .map(|t| Reference::parse(t))
                .collect::<Result<Vec<_>, _>>()?;
            staged.push(Staged {
                manifest: manifest_digest,
                record,
                names,
            });
        }
        if staged.is_empty() {
            return Err(ImageError::invalid(
                location,
                "docker-archive manifest",
                "lists no image".into(),
            ));
        }
        Ok(staged)
    }

    fn sniff_blob(&self, digest: &Digest) -> Result<oci::Compression, ImageError> {
        use std::io::Read;
        let mut head = [0u8; 4];
        let mut file = self.blobs.open(digest)?;
        let n = file
            .read(&mut head)
            .map_err(|e| ImageError::io("reading blob", self.blobs.path(digest), e))?;
        oci::Compression::sniff(&head[..n]).ok_or_else(|| ImageError::UnsupportedMediaType {
            location: self.blobs.path(digest).display().to_string(),
            media_type: "zstd (by content)".into(),
            digest: digest.to_string(),
        })
    }
}

/// The index record of a manifest whose config bytes are `config_bytes`. For uncompressed
/// layers the blob digest must already equal the diff_id.
pub(crate) fn record_of(
    manifest: &Manifest,
    config_bytes: &[u8],
    location: &str,
) -> Result<ImageRecord, ImageError> {
    let config: ConfigFile = oci::parse_json(config_bytes, "image config", location)?;
    let diff_ids = &config.rootfs.diff_ids;
    if diff_ids.len() != manifest.layers.len() {
        return Err(ImageError::invalid(
            location,
            "image config",
            format!(
                "{} diff_ids for {} layers",
                diff_ids.len(),
                manifest.layers.len()
            ),
        ));
    }
    let chain = oci::chain_ids(diff_ids);
    let mut layers = Vec::with_capacity(diff_ids.len());
    for ((desc, diff_id), chain_id) in manifest.layers.iter().zip(diff_ids).zip(chain) {
        let uncompressed = desc.media_type.ends_with(".tar")
            || desc.media_type == "application/vnd.docker.image.rootfs.diff.tar";
        if uncompressed && &desc.digest != diff_id {
            return Err(ImageError::DiffIdMismatch {
                layer: desc.digest.to_string(),
                expected: diff_id.to_string(),
                actual: desc.digest.to_string(),
            });
        }
        layers.push(LayerRecord {
            digest: desc.digest.clone(),
            size: desc.size,
            media_type: desc.media_type.clone(),
            diff_id: diff_id.clone(),
            chain_id,
        });
    }
    let size = manifest
        .layers
        .iter()
        .try_fold(manifest.config.size, |total, l| total.checked_add(l.size))
        .ok_or_else(|| {
            ImageError::invalid(location, "image manifest", "sizes add up past 2^64".into())
        })?;
    Ok(ImageRecord {
        config_digest: manifest.config.digest.clone(),
        size,
        layers,
        config: config.image_config(),
    })
}

/// The digest a docker-archive member name embeds (`<hex>.json`, `blobs/sha256/<hex>`).
fn digest_in_name(name: &str) -> Option<Digest> {
    let file = name.rsplit('/').next()?;
    Digest::from_hex(file.strip_suffix(".json").unwrap_or(file))
}

/// The references a layout descriptor names (see the module doc).
pub(super) fn names_for(
    desc: &Descriptor,
    base: Option<&str>,
) -> Result<Vec<Reference>, ImageError> {
    if let Some(full) = desc.annotations.get(oci::ANNOTATION_CONTAINERD_NAME) {
        return Ok(vec![Reference::parse(full)?]);
    }
    let Some(name) = desc.annotations.get(oci::ANNOTATION_REF_NAME) else {
        return Ok(vec![]);
    };
    if name.contains(['/', ':', '@']) {
        return Ok(vec![Reference::parse(name)?]);
    }
    let Some(base) = base else {
        return Ok(vec![]);
    };
    match Reference::parse(&format!("{base}:{name}")) {
        Ok(r) => Ok(vec![r]),
        Err(e) => {
            tracing::warn!(%base, tag = %name, err = %e, "cannot name the image from the source name; importing it untagged");
            Ok(vec![])
        }
    }
}

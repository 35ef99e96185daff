//! The subset of the OCI image-spec (and Docker's equivalents) that the store reads and
//! writes: descriptors, indexes, manifests, image configs and docker-archive `manifest.json`.
//!
//! Parsing is tolerant of unknown fields and strict about what the store relies on: digests
//! are validated [`Digest`]s, sizes are numbers, layer and diff_id lists must line up.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::digest::Digest;
use super::error::ImageError;
use crate::types::ImageConfig;

pub(crate) const MT_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const MT_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const MT_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const MT_OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub(crate) const MT_OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub(crate) const MT_OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub(crate) const MT_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const MT_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Annotation naming an image in an OCI layout (a full reference or just a tag).
pub(crate) const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// containerd's annotation carrying the full image name.
pub(crate) const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// Largest manifest, index or config the store will read into memory.
pub(crate) const MAX_METADATA_BYTES: u64 = 32 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Index {
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// The image config (`application/vnd.oci.image.config.v1+json`), only what we use.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ConfigFile {
    #[serde(default)]
    pub config: Option<RunConfig>,
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<Digest>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RunConfig {
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

impl ConfigFile {
    /// The parts of the config that shape a container.
    pub(crate) fn image_config(&self) -> ImageConfig {
        let c = self.config.clone().unwrap_or_default();
        ImageConfig {
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            env: c.env.unwrap_or_default(),
            working_dir: c.working_dir.filter(|w| !w.is_empty()),
            user: c.user.filter(|u| !u.is_empty()),
            labels: c.labels.unwrap_or_default(),
        }
    }
}

/// One entry of a docker-archive `manifest.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct DockerArchiveEntry {
    pub config: String,
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    pub layers: Vec<String>,
}

/// How a layer blob is compressed, decided by media type and confirmed by magic bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// From the first bytes of a blob: gzip or zstd magic, or plain tar.
    pub(crate) fn sniff(head: &[u8]) -> Option<Self> {
        if head.starts_with(&[0x1f, 0x8b]) {
            Some(Self::Gzip)
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Some(Self::Zstd)
        } else {
            Some(Self::None)
        }
    }

    pub(crate) fn oci_media_type(self) -> &'static str {
        match self {
            Self::None => MT_OCI_LAYER,
            Self::Gzip => MT_OCI_LAYER_GZIP,
            Self::Zstd => MT_OCI_LAYER_ZSTD,
        }
    }
}

/// `true` for layer media types the store can unpack (plain or gzip tar, OCI or Docker,
/// including the non-distributable variants).
pub(crate) fn is_supported_layer(media_type: &str) -> bool {
    matches!(
        media_type,
        "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
    )
}

pub(crate) fn is_manifest(media_type: &str) -> bool {
    media_type == MT_OCI_MANIFEST || media_type == MT_DOCKER_MANIFEST
}

pub(crate) fn is_index(media_type: &str) -> bool {
    media_type == MT_OCI_INDEX || media_type == MT_DOCKER_LIST
}

/// Parses JSON, naming the document and where it came from on failure.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
    location: &str,
) -> Result<T, ImageError> {
    serde_json::from_slice(bytes).map_err(|source| ImageError::Json {
        location: location.to_owned(),
        what,
        source,
    })
}

/// Parses an image manifest and checks it is schema version 2.
pub(crate) fn parse_manifest(bytes: &[u8], location: &str) -> Result<Manifest, ImageError> {
    let manifest: Manifest = parse_json(bytes, "image manifest", location)?;
    if manifest.schema_version != 2 {
        return Err(ImageError::invalid(
            location,
            "image manifest",
            format!("schemaVersion {} is not 2", manifest.schema_version),
        ));
    }
    Ok(manifest)
}

/// The platform of this host as OCI names it (`linux`/`amd64`).
pub(crate) fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    ("linux", arch)
}

/// The OCI chain ids of a list of diff ids:
/// `chain(0) = diff(0)`, `chain(n) = sha256(chain(n-1) + " " + diff(n))`.
pub(crate) fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for d in diff_ids {
        let next = match out.last() {
            None => d.clone(),
            Some(prev) => Digest::of_bytes(format!("{prev} {d}").as_bytes()),
        };
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_id_of_the_first_layer_is_its_diff_id_and_later_ones_hash_the_chain() {
        let a = Digest::of_bytes(b"a");
        let b = Digest::of_bytes(b"b");
        let chain = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chain[0], a);
        assert_eq!(chain[1], Digest::of_bytes(format!("{a} {b}").as_bytes()));
    }

    #[test]
    fn compression_is_sniffed_from_magic_bytes() {
        assert_eq!(
            Compression::sniff(&[0x1f, 0x8b, 8]),
            Some(Compression::Gzip)
        );
        assert_eq!(Compression::sniff(b"etc/\0\0"), Some(Compression::None));
        assert_eq!(
            Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]),
            Some(Compression::Zstd)
        );
    }
}

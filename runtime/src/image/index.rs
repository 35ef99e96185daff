//! The image index, `index.json`: references → manifest digest, and one record per manifest
//! (its config, layers, chain ids, and the [`ImageConfig`] a container needs).
//!
//! Guarantees:
//! - the file is replaced atomically (temp file, fsync, rename), so a reader without the lock
//!   always sees a complete, consistent index;
//! - every read-modify-write runs under an exclusive `flock` on `index.lock`, so two
//!   processes (the CLI and the agent) never lose each other's updates;
//! - a record exists while a reference points at it or it was imported without a name; when
//!   its last reference goes it is dropped (its blobs stay until [`gc`](super::ImageStore::gc)).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::digest::Digest;
use super::error::ImageError;
use super::fsx::{self, FileLock, LockKind};
use crate::types::ImageConfig;

const INDEX_VERSION: u32 = 1;

/// One layer of an image as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LayerRecord {
    /// Digest of the blob (compressed or not).
    pub digest: Digest,
    pub size: u64,
    pub media_type: String,
    /// Digest of the uncompressed tar.
    pub diff_id: Digest,
    /// Names the snapshot directory.
    pub chain_id: Digest,
}

/// One manifest and what it resolves to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ImageRecord {
    /// The image id.
    pub config_digest: Digest,
    pub layers: Vec<LayerRecord>,
    /// Sum of the layer blob sizes plus the config size.
    pub size: u64,
    pub config: ImageConfig,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexFile {
    pub version: u32,
    /// Canonical reference string → manifest digest.
    pub refs: BTreeMap<String, Digest>,
    /// Manifest digest → record.
    pub images: BTreeMap<Digest, ImageRecord>,
    /// References whose current target came from a registry pull (not an import); an
    /// `Always` pull policy re-pulls only these (imported images are the node's own copy).
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub pulled: std::collections::BTreeSet<String>,
    /// Image ids (config digests) image garbage collection must keep.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub pinned: std::collections::BTreeSet<Digest>,
}

impl IndexFile {
    /// References pointing at `manifest`.
    pub(crate) fn refs_to<'a>(&'a self, manifest: &'a Digest) -> impl Iterator<Item = &'a str> {
        self.refs
            .iter()
            .filter(move |(_, m)| *m == manifest)
            .map(|(r, _)| r.as_str())
    }

    /// Removes a reference; drops the manifest it pointed at when nothing else does.
    pub(crate) fn untag(&mut self, reference: &str) -> Option<Digest> {
        self.pulled.remove(reference);
        let manifest = self.refs.remove(reference)?;
        if self.refs_to(&manifest).next().is_none() {
            self.images.remove(&manifest);
            self.drop_stale_pins();
        }
        Some(manifest)
    }

    /// Forgets pins of ids no manifest has any more (the image went).
    pub(crate) fn drop_stale_pins(&mut self) {
        let images = &self.images;
        self.pinned
            .retain(|id| images.values().any(|r| &r.config_digest == id));
    }

    /// Points `reference` at `manifest`, dropping the previous target if it lost its last ref.
    pub(crate) fn tag(&mut self, reference: String, manifest: Digest) {
        self.pulled.remove(&reference);
        if let Some(old) = self.refs.insert(reference, manifest.clone()) {
            if old != manifest && self.refs_to(&old).next().is_none() {
                self.images.remove(&old);
                self.drop_stale_pins();
            }
        }
    }
}

/// The index file and its lock.
#[derive(Debug, Clone)]
pub(crate) struct Index {
    path: PathBuf,
    lock: PathBuf,
}

impl Index {
    pub(crate) fn new(root: &Path) -> Self {
        Self {
            path: root.join("index.json"),
            lock: root.join("index.lock"),
        }
    }

    /// The current index (empty when the file does not exist yet).
    pub(crate) fn load(&self) -> Result<IndexFile, ImageError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(IndexFile {
                    version: INDEX_VERSION,
                    ..IndexFile::default()
                })
            }
            Err(e) => return Err(ImageError::index("reading", &self.path, e)),
        };
        let file: IndexFile = serde_json::from_slice(&bytes).map_err(|e| {
            ImageError::index(
                "parsing",
                &self.path,
                io::Error::new(io::ErrorKind::InvalidData, e),
            )
        })?;
        if file.version != INDEX_VERSION {
            return Err(ImageError::index(
                "reading",
                &self.path,
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unsupported index version {}", file.version),
                ),
            ));
        }
        Ok(file)
    }

    /// Runs `f` on the index under the exclusive lock and writes the result back if `f`
    /// succeeded and changed something.
    pub(crate) fn update<T>(
        &self,
        f: impl FnOnce(&mut IndexFile) -> Result<T, ImageError>,
    ) -> Result<T, ImageError> {
        let _lock = FileLock::acquire(&self.lock, LockKind::Exclusive)?;
        let mut file = self.load()?;
        let before = file.clone();
        let out = f(&mut file)?;
        if file != before {
            let bytes = serde_json::to_vec_pretty(&file)
                .map_err(|e| ImageError::index("encoding", &self.path, io::Error::other(e)))?;
            fsx::write_atomic(&self.path, &bytes)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u8) -> ImageRecord {
        ImageRecord {
            config_digest: Digest::of_bytes(&[n]),
            layers: vec![],
            size: 0,
            config: ImageConfig::default(),
        }
    }

    #[test]
    fn moving_the_last_tag_drops_the_old_manifest() {
        let mut f = IndexFile::default();
        let (a, b) = (Digest::of_bytes(b"a"), Digest::of_bytes(b"b"));
        f.images.insert(a.clone(), record(1));
        f.images.insert(b.clone(), record(2));
        f.tag("x:1".into(), a.clone());
        f.tag("x:1".into(), b.clone());
        assert!(!f.images.contains_key(&a));
        assert_eq!(f.untag("x:1"), Some(b.clone()));
        assert!(f.images.is_empty());
    }

    #[test]
    fn concurrent_updates_from_many_threads_are_not_lost() {
        let tmp = tempfile::tempdir().unwrap();
        let index = Index::new(tmp.path());
        std::thread::scope(|s| {
            for t in 0..4 {
                let index = &index;
                s.spawn(move || {
                    for i in 0..10 {
                        index
                            .update(|f| {
                                f.refs.insert(format!("r{t}-{i}"), Digest::of_bytes(b"m"));
                                Ok(())
                            })
                            .unwrap();
                    }
                });
            }
        });
        assert_eq!(index.load().unwrap().refs.len(), 40);
    }
}

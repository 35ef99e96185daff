//! Content-addressed blobs: `blobs/sha256/<hex>`.
//!
//! Guarantees:
//! - a blob appears under its name only after its content has been hashed, compared with the
//!   expected digest and size (when one was given), fsynced, and renamed into place; a
//!   corrupt or truncated stream never becomes a blob;
//! - the source is always hashed, even when the blob is already present, so that importing a
//!   corrupt copy of a known image is still refused;
//! - small metadata blobs (manifests, configs) are re-verified every time they are read.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::digest::{Digest, Hasher};
use super::error::ImageError;
use super::fsx;

/// The blob directory and its staging area.
#[derive(Debug, Clone)]
pub(crate) struct Blobs {
    dir: PathBuf,
    ingest: PathBuf,
}

/// What a written stream is expected to be.
pub(crate) struct Expected<'a> {
    pub digest: &'a Digest,
    pub size: Option<u64>,
}

impl Blobs {
    pub(crate) fn new(root: &Path) -> Self {
        Self {
            dir: root.join("blobs").join("sha256"),
            ingest: root.join("ingest"),
        }
    }

    pub(crate) fn create_dirs(&self) -> Result<(), ImageError> {
        for dir in [
            self.dir.parent().unwrap_or(&self.dir),
            &self.dir,
            &self.ingest,
        ] {
            fsx::ensure_private_dir(dir)?;
        }
        Ok(())
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn ingest_dir(&self) -> &Path {
        &self.ingest
    }

    pub(crate) fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join(digest.hex())
    }

    /// Streams `reader` into the store. With `expected`, the content must match it; the
    /// resulting digest and size are returned either way. `location` names the source in
    /// errors (a file path, or `archive.tar:blobs/sha256/…`).
    pub(crate) fn write(
        &self,
        reader: &mut dyn Read,
        expected: Option<Expected<'_>>,
        location: &str,
    ) -> Result<(Digest, u64), ImageError> {
        let mut ingest = self.begin()?;
        if let Err(e) = io::copy(reader, &mut ingest) {
            // A write failure is about our disk; a read failure about the source.
            return Err(if super::sys::is_disk_full(&e) {
                ImageError::DiskFull {
                    path: ingest.tmp.clone(),
                }
            } else {
                ImageError::io("reading blob from", location, e)
            });
        }
        ingest.commit(expected, location)
    }

    /// A blob being written piece by piece (a download); see [`BlobIngest::commit`].
    pub(crate) fn begin(&self) -> Result<BlobIngest, ImageError> {
        let tmp = self.ingest.join(fsx::unique_name("blob-"));
        // Private (0600), as the directories: blobs are only read by ironlet itself.
        let file = fsx::private_file(&tmp).map_err(|e| ImageError::io("creating", &tmp, e))?;
        Ok(BlobIngest {
            blobs: self.clone(),
            tmp,
            file: Some(file),
            hasher: Hasher::default(),
        })
    }

    /// Stores a small in-memory blob.
    pub(crate) fn write_bytes(&self, bytes: &[u8], location: &str) -> Result<Digest, ImageError> {
        let mut r = bytes;
        self.write(&mut r, None, location).map(|(d, _)| d)
    }

    /// Opens a blob for reading.
    pub(crate) fn open(&self, digest: &Digest) -> Result<File, ImageError> {
        let path = self.path(digest);
        File::open(&path).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ImageError::BlobMissing {
                    location: self.dir.display().to_string(),
                    digest: digest.to_string(),
                }
            } else {
                ImageError::io("opening blob", &path, e)
            }
        })
    }

    /// Reads a small blob (at most `max` bytes) and verifies its digest.
    pub(crate) fn read_verified(&self, digest: &Digest, max: u64) -> Result<Vec<u8>, ImageError> {
        let path = self.path(digest);
        let mut bytes = Vec::new();
        self.open(digest)?
            .take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ImageError::io("reading blob", &path, e))?;
        if bytes.len() as u64 > max {
            return Err(ImageError::invalid(
                path.display().to_string(),
                "metadata blob",
                format!("larger than {max} bytes"),
            ));
        }
        let actual = Digest::of_bytes(&bytes);
        if &actual != digest {
            return Err(ImageError::DigestMismatch {
                location: path.display().to_string(),
                expected: digest.to_string(),
                actual: actual.to_string(),
                expected_size: None,
                actual_size: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }

    /// Every blob digest present on disk (file names that are not digests are ignored).
    pub(crate) fn list(&self) -> Result<Vec<Digest>, ImageError> {
        let rd = std::fs::read_dir(&self.dir)
            .map_err(|e| ImageError::io("listing blobs in", &self.dir, e))?;
        Ok(rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(Digest::from_hex))
            .collect())
    }
}

/// A blob in `ingest/`: hashed as it is written, renamed into `blobs/` only by
/// [`Self::commit`] when it matches; dropped uncommitted, its temp file is removed (and a
/// crash leaves it to gc).
pub(crate) struct BlobIngest {
    blobs: Blobs,
    tmp: PathBuf,
    file: Option<File>,
    hasher: Hasher,
}

impl io::Write for BlobIngest {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("blob already committed"))?;
        let n = file.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().map_or(Ok(()), File::flush)
    }
}

impl BlobIngest {
    /// The temp file in `ingest/` being written.
    pub(crate) fn path(&self) -> &Path {
        &self.tmp
    }

    /// The digest and size of what was written, dropping the temp file.
    pub(crate) fn discard(mut self) -> (Digest, u64) {
        std::mem::take(&mut self.hasher).finish()
    }

    /// Checks the content against `expected`, then fsyncs and renames it into place.
    pub(crate) fn commit(
        mut self,
        expected: Option<Expected<'_>>,
        location: &str,
    ) -> Result<(Digest, u64), ImageError> {
        let (digest, size) = std::mem::take(&mut self.hasher).finish();
        if let Some(exp) = expected {
            if &digest != exp.digest || exp.size.is_some_and(|s| s != size) {
                tracing::warn!(%location, expected = %exp.digest, actual = %digest, size, "corrupt blob refused");
                return Err(ImageError::DigestMismatch {
                    location: location.to_owned(),
                    expected: exp.digest.to_string(),
                    actual: digest.to_string(),
                    expected_size: exp.size,
                    actual_size: size,
                });
            }
        }
        let dest = self.blobs.path(&digest);
        if dest.is_file() {
            return Ok((digest, size));
        }
        if let Some(file) = self.file.take() {
            file.sync_all()
                .map_err(|e| ImageError::io("syncing", &self.tmp, e))?;
        }
        std::fs::rename(&self.tmp, &dest).map_err(|e| ImageError::io("renaming into", &dest, e))?;
        fsx::sync_dir(&self.blobs.dir)?;
        tracing::debug!(%digest, size, %location, "blob stored");
        Ok((digest, size))
    }
}

impl Drop for BlobIngest {
    fn drop(&mut self) {
        // After a successful rename the temp name is gone and this fails harmlessly.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_does_not_match_its_digest_never_becomes_a_blob() {
        let tmp = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(tmp.path());
        blobs.create_dirs().unwrap();
        let good = Digest::of_bytes(b"good");
        let err = blobs
            .write(
                &mut &b"evil"[..],
                Some(Expected {
                    digest: &good,
                    size: Some(4),
                }),
                "test",
            )
            .unwrap_err();
        assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
        assert!(blobs.list().unwrap().is_empty());
        assert_eq!(std::fs::read_dir(blobs.ingest_dir()).unwrap().count(), 0);
    }

    #[test]
    fn a_verified_stream_is_stored_under_its_hex_digest() {
        let tmp = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(tmp.path());
        blobs.create_dirs().unwrap();
        let d = blobs.write_bytes(b"hello", "test").unwrap();
        assert_eq!(d, Digest::of_bytes(b"hello"));
        assert_eq!(blobs.read_verified(&d, 100).unwrap(), b"hello");
        assert_eq!(blobs.list().unwrap(), vec![d]);
    }
}

//! One layer streamed from the registry straight into its snapshot: a single pass over the
//! bytes as they arrive, no temp file read back.
//!
//! ```text
//!  blob stream ──► channel ──► Tee ──► sniff ──► gunzip/zstd ──► diff_id hash ──► safe unpack
//!  (async pump)   (bounded)     │                                                (snapshot tmp-*)
//!                               └──► ingest/blob-* + digest hash + size cap
//!  end of stream: blob digest and size == descriptor? diff_id == config? ──► blob renamed into
//!  blobs/, then snapshot renamed into snapshots/<chain>; else both temp copies removed.
//! ```
//!
//! The registry's bytes are capped at the descriptor's size while they stream, so a hostile
//! registry cannot fill the disk with an endless blob.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::remote::Remote;
use crate::image::blobs::{BlobIngest, Expected};
use crate::image::error::ImageError;
use crate::image::index::LayerRecord;
use crate::image::oci::Descriptor;
use crate::image::store::ImageStore;
use crate::image::sys::is_disk_full;

/// How many chunks (of reqwest's ~8-16 KiB) may wait between download and unpack.
const CHANNEL_CHUNKS: usize = 64;

/// Downloads, verifies and unpacks one layer; returns the bytes downloaded.
pub(crate) async fn fetch_layer(
    store: Arc<ImageStore>,
    remote: Arc<Remote>,
    layer: LayerRecord,
) -> Result<u64, ImageError> {
    let desc = Descriptor {
        media_type: layer.media_type.clone(),
        digest: layer.digest.clone(),
        size: layer.size,
        annotations: Default::default(),
        platform: None,
    };
    let mut stream = remote.blob_stream(&desc).await?;
    let location = remote.location(&layer.digest);
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(CHANNEL_CHUNKS);
    let worker = tokio::task::spawn_blocking(move || {
        store.ingest_layer(
            &layer,
            ChannelReader {
                rx,
                chunk: Bytes::new(),
            },
            &location,
        )
    });
    while let Some(chunk) = stream.next().await {
        let failed = chunk.is_err();
        // A closed channel means the unpacker stopped (its error is the one to report).
        if tx.send(chunk).await.is_err() || failed {
            break;
        }
    }
    drop(tx);
    worker
        .await
        .map_err(|e| ImageError::Task(e.to_string()))?
        .map(|()| desc.size)
}

impl ImageStore {
    /// Unpacks `layer` from its compressed stream while storing the stream as its blob.
    fn ingest_layer(
        &self,
        layer: &LayerRecord,
        reader: impl Read,
        location: &str,
    ) -> Result<(), ImageError> {
        let tee = RefCell::new(Tee {
            inner: reader,
            blob: Some(self.blobs.begin()?),
            read: 0,
            limit: layer.size,
            disk_full: None,
        });
        let drain = |t: &mut Tee<_>| {
            // The decoder may stop before the end (gzip trailer, padding): hash it all.
            io::copy(t, &mut io::sink()).map_err(|e| ImageError::ReadLayer {
                layer: layer.digest.to_string(),
                source: e,
            })
        };
        let expected = || Expected {
            digest: &layer.digest,
            size: Some(layer.size),
        };
        // Layers download and unpack concurrently, so the snapshots below are not there
        // yet: a hard link to a lower layer's file is refused in a pulled layer (imports
        // unpack bottom up and copy such a file up).
        let result = self.unpack_snapshot_from(layer, &[], TeeRef(&tee), || {
            let mut t = tee.borrow_mut();
            drain(&mut t)?;
            let blob = t
                .blob
                .take()
                .ok_or_else(|| ImageError::Task("blob taken twice".into()))?;
            blob.commit(Some(expected()), location).map(drop)
        });
        let Err(err) = result else {
            return Ok(());
        };
        // The blob's disk filled up: the decompressor or the unpacker saw that as a read
        // error of the layer stream; it is the store's disk that failed.
        if let Some(path) = tee.borrow_mut().disk_full.take() {
            tracing::warn!(%location, path = %path.display(), first_error = %err, "no space left for the layer blob");
            return Err(ImageError::DiskFull { path });
        }
        // A corrupt blob usually breaks the decompressor or the tar reader first: when all
        // the bytes came and do not match the digest, that is the error to report (a
        // dropped connection, with bytes missing, keeps its own error).
        let mut t = tee.into_inner();
        // The rest of the stream goes into the blob's hash before it is taken (taken
        // first, the hash would cover only what the unpacker had read when it failed).
        // oci-client ends a mismatching stream with an error of its own: ignore it here.
        let _ = drain(&mut t);
        let Some(blob) = t.blob.take() else {
            return Err(err);
        };
        let (actual, size) = blob.discard();
        let exp = expected();
        if &actual != exp.digest && exp.size == Some(size) {
            tracing::warn!(%location, expected = %layer.digest, %actual, size, first_error = %err, "corrupt layer blob refused");
            return Err(ImageError::DigestMismatch {
                location: location.to_owned(),
                expected: layer.digest.to_string(),
                actual: actual.to_string(),
                expected_size: exp.size,
                actual_size: size,
            });
        }
        Err(err)
    }
}

/// Copies what it reads into the blob being ingested, refusing more than `limit` bytes.
struct Tee<R> {
    inner: R,
    blob: Option<BlobIngest>,
    read: u64,
    limit: u64,
    /// The blob's temp file, when writing it failed for want of space.
    disk_full: Option<std::path::PathBuf>,
}

impl<R: Read> Read for Tee<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the registry sent more than the {} bytes the manifest declares",
                    self.limit
                ),
            ));
        }
        if let Some(blob) = self.blob.as_mut() {
            if let Err(e) = blob.write_all(&buf[..n]) {
                if is_disk_full(&e) {
                    self.disk_full = Some(blob.path().to_path_buf());
                }
                return Err(e);
            }
        }
        Ok(n)
    }
}

/// Reads a [`Tee`] that the verify step borrows again afterwards.
struct TeeRef<'a, R>(&'a RefCell<Tee<R>>);

impl<R: Read> Read for TeeRef<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.borrow_mut().read(buf)
    }
}

/// The download's chunks as a blocking reader.
struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    chunk: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(c)) => self.chunk = c,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

//! One layer streamed from the registry straight into its snapshot: a single pass over the
//! bytes as they arrive, no temp file read back.
//!
//! ```text
//!  blob stream ──► channel ──► Tee ──► sniff ──► gunzip/zstd ──► diff_id hash ═╗
//!  (async pump)   (bounded)     │     (decoder thread, `pipeline.rs`)              ║ bounded
//!                               └──► ingest/blob-* + digest hash + size cap        ║ chunks
//!                                         safe unpack (snapshot tmp-*, this thread) ◄╝
//!  end of stream: blob digest and size == descriptor? diff_id == config? ──► blob renamed into
//!  blobs/, then snapshot renamed into snapshots/<chain>; else both temp copies removed.
//! ```
//!
//! A connection that drops in the middle of the blob is resumed where it stopped (HTTP
//! `Range`), up to 3 times in a row without progress; the unpacker never notices, and the
//! digest is still computed over every byte of the blob.
//!
//! The registry's bytes are capped at the descriptor's size while they stream, so a hostile
//! registry cannot fill the disk with an endless blob.

use std::future::Future;
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::remote::{BlobBody, Remote};
use crate::image::blobs::{BlobIngest, Expected};
use crate::image::error::ImageError;
use crate::image::index::LayerRecord;
use crate::image::oci::Descriptor;
use crate::image::store::ImageStore;
use crate::image::sys::is_disk_full;

/// How many chunks (of reqwest's ~8-16 KiB) may wait between download and unpack.
const CHANNEL_CHUNKS: usize = 64;

/// Reconnections in a row, with no byte received in between, before a layer download
/// gives up (containerd's fetcher allows 3 too).
const MAX_RESUMES: u32 = 3;

/// The pause before a reconnection; doubled for each further one in a row.
const RESUME_DELAY: Duration = Duration::from_millis(200);

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
    let first = remote.blob_from(&desc, 0).await?;
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
    let resumes = pump(
        desc.size,
        first,
        |offset| remote.blob_from(&desc, offset),
        &tx,
    )
    .await;
    drop(tx);
    worker
        .await
        .map_err(|e| ImageError::Task(e.to_string()))?
        .map(|()| {
            if resumes > 0 {
                tracing::info!(layer = %desc.digest, resumes, "layer download resumed after dropped connections, digest verified over the whole blob");
            }
            desc.size
        })
}

/// Sends the blob's bytes, in order and each once, to the unpacker (`tx`). When the
/// connection drops before all `size` bytes came, `reopen(offset)` asks for the rest
/// (HTTP `Range`; a registry that sends the whole blob again has its first `offset` bytes
/// skipped), after a pause, up to [`MAX_RESUMES`] times in a row without progress. The
/// unpacker hashes everything it receives, so the digest covers the whole blob however
/// many connections brought it. The last error goes to the unpacker, which reports it.
/// Returns how many reconnections there were.
async fn pump<F, Fut>(
    size: u64,
    first: BlobBody,
    mut reopen: F,
    tx: &mpsc::Sender<io::Result<Bytes>>,
) -> u32
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<BlobBody, ImageError>>,
{
    let mut body = first;
    let mut offset = 0u64;
    let mut failures = 0u32;
    let mut resumes = 0u32;
    loop {
        let err = match body.stream.next().await {
            None => return resumes,
            Some(Ok(mut chunk)) => {
                let skip = body.skip.min(chunk.len() as u64) as usize;
                body.skip -= skip as u64;
                let _ = chunk.split_to(skip);
                if chunk.is_empty() {
                    continue;
                }
                failures = 0;
                offset += chunk.len() as u64;
                // A closed channel means the unpacker stopped (its error is the one to
                // report).
                if tx.send(Ok(chunk)).await.is_err() {
                    return resumes;
                }
                continue;
            }
            Some(Err(e)) => e,
        };
        // Everything came (oci-client's own digest check ends a corrupt full response
        // with an error): the unpacker's verification decides, nothing to resume.
        if offset >= size || failures >= MAX_RESUMES {
            let _ = tx.send(Err(err)).await;
            return resumes;
        }
        tracing::warn!(offset, size, err = %err, "blob download interrupted; resuming");
        loop {
            failures += 1;
            tokio::time::sleep(RESUME_DELAY * (1 << (failures - 1))).await;
            match reopen(offset).await {
                Ok(b) => {
                    body = b;
                    resumes += 1;
                    break;
                }
                Err(e) if failures < MAX_RESUMES => {
                    tracing::warn!(offset, size, err = %e, "resuming the blob download failed; retrying");
                }
                Err(e) => {
                    let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
                    return resumes;
                }
            }
        }
    }
}

impl ImageStore {
    /// Unpacks `layer` from its compressed stream while storing the stream as its blob.
    fn ingest_layer(
        &self,
        layer: &LayerRecord,
        reader: impl Read + Send,
        location: &str,
    ) -> Result<(), ImageError> {
        let tee = Mutex::new(Tee {
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
            let mut t = lock(&tee);
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
        if let Some(path) = lock(&tee).disk_full.take() {
            tracing::warn!(%location, path = %path.display(), first_error = %err, "no space left for the layer blob");
            return Err(ImageError::DiskFull { path });
        }
        // A corrupt blob usually breaks the decompressor or the tar reader first: when all
        // the bytes came and do not match the digest, that is the error to report (a
        // dropped connection, with bytes missing, keeps its own error).
        let mut t = tee.into_inner().unwrap_or_else(|p| p.into_inner());
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

/// Reads a [`Tee`] that the verify step borrows again afterwards (the decompressing
/// thread reads it first, `pipeline.rs`).
struct TeeRef<'a, R>(&'a Mutex<Tee<R>>);

impl<R: Read> Read for TeeRef<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        lock(self.0).read(buf)
    }
}

/// The tee, also after a panic of the thread that held it (its state is still what the
/// bytes read made it).
fn lock<R>(tee: &Mutex<Tee<R>>) -> MutexGuard<'_, Tee<R>> {
    tee.lock().unwrap_or_else(|p| p.into_inner())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn blob() -> Vec<u8> {
        (0..1000u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// A response of `bytes` in 64-byte chunks, dropped (an error) after `cut` bytes.
    fn body(bytes: &[u8], cut: Option<usize>, skip: u64) -> BlobBody {
        let end = cut.unwrap_or(bytes.len());
        let mut items: Vec<io::Result<Bytes>> = bytes[..end]
            .chunks(64)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        if cut.is_some() {
            items.push(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before message completed",
            )));
        }
        BlobBody {
            stream: Box::pin(futures_util::stream::iter(items)),
            skip,
        }
    }

    /// Runs the pump; returns what the unpacker received (bytes, then the error if
    /// any), the offsets asked for, and the reconnections counted.
    async fn run(
        first: BlobBody,
        reopen: impl Fn(u64) -> Result<BlobBody, ImageError>,
    ) -> (Vec<u8>, Option<io::Error>, Vec<u64>, u32) {
        let asked = Mutex::new(Vec::new());
        let (tx, mut rx) = mpsc::channel(1024);
        let resumes = pump(
            blob().len() as u64,
            first,
            |offset| {
                asked.lock().unwrap().push(offset);
                std::future::ready(reopen(offset))
            },
            &tx,
        )
        .await;
        drop(tx);
        let (mut got, mut err) = (Vec::new(), None);
        while let Some(item) = rx.recv().await {
            match item {
                Ok(c) => got.extend_from_slice(&c),
                Err(e) => err = Some(e),
            }
        }
        (got, err, asked.into_inner().unwrap(), resumes)
    }

    #[tokio::test]
    async fn a_dropped_connection_resumes_at_the_byte_reached() {
        let b = blob();
        let (got, err, asked, resumes) = run(body(&b, Some(300), 0), |offset| {
            Ok(body(&b[offset as usize..], None, 0))
        })
        .await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(got, b);
        assert_eq!((asked, resumes), (vec![300], 1));
    }

    #[tokio::test]
    async fn a_registry_ignoring_range_sends_the_whole_blob_whose_start_is_skipped() {
        let b = blob();
        // The second response (whole blob from 0) is cut again at 700: progress, so the
        // third one is allowed.
        let (got, err, asked, resumes) = run(body(&b, Some(300), 0), |offset| {
            let cut = (offset == 300).then_some(700);
            Ok(body(&b, cut, offset))
        })
        .await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(got, b, "every byte once, in order");
        assert_eq!((asked, resumes), (vec![300, 700], 2));
    }

    #[tokio::test]
    async fn reconnections_without_progress_give_up_after_three_and_report_the_error() {
        let b = blob();
        let (got, err, asked, _) = run(body(&b, Some(300), 0), |offset| {
            Ok(body(&b[offset as usize..], Some(0), 0))
        })
        .await;
        assert_eq!(got, b[..300]);
        assert!(err.is_some_and(|e| e.to_string().contains("connection closed")));
        assert_eq!(asked, vec![300; MAX_RESUMES as usize]);
        // A registry that refuses the reconnection: its error is reported.
        let (_, err, asked, resumes) = run(body(&b, Some(300), 0), |_| {
            Err(ImageError::Task("registry gone".into()))
        })
        .await;
        assert!(err.is_some_and(|e| e.to_string().contains("registry gone")));
        assert_eq!((asked.len(), resumes), (MAX_RESUMES as usize, 0));
    }

    #[tokio::test]
    async fn an_error_after_the_last_byte_is_passed_on_without_resuming() {
        let b = blob();
        let (got, err, asked, _) = run(body(&b, Some(b.len()), 0), |_| {
            unreachable!("nothing to resume")
        })
        .await;
        assert_eq!(got, b);
        assert!(err.is_some());
        assert!(asked.is_empty());
    }
}

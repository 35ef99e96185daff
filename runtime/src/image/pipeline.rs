//! A layer's decompression on its own thread, the tar unpack on the caller's: the two
//! halves of a layer's unpack overlap on two cores instead of taking turns on one.
//!
//! ```text
//!  producer thread: source.read() (download tee + blob digest, gunzip/zstd, diff_id hash)
//!        │  chunks of CHUNK bytes, at most CHUNKS in flight (bounded: a slow disk
//!        ▼  holds the decompressor back, memory stays ≤ CHUNKS × CHUNK)
//!  caller's thread: ChunkReader ──► tar reader ──► safe unpacker's file writes
//!        │
//!        └─ empty chunks go back to the producer (no allocation per chunk)
//! ```
//!
//! The producer reads the source to its end, or until the consumer hangs up (it failed,
//! or found too much trailing data). The source comes back to the caller afterwards, so
//! whatever state it carries (the diff_id hasher, the blob being written) is read there,
//! once the producer is done with it: nothing is verified on a half-read stream.

use std::io::{self, Read};
use std::sync::mpsc;

use crate::image::error::ImageError;

/// Bytes per chunk: a few gzip/zstd output blocks, and large writes for big files.
const CHUNK: usize = 256 << 10;

/// Chunks in flight between the threads (memory bound per layer: 2 MiB).
const CHUNKS: usize = 8;

/// Runs `consume` on a reader of `source`'s bytes while another thread reads `source`
/// ahead; returns what `consume` returned and `source`, read to its end unless `consume`
/// stopped reading early (then up to what the channel held).
pub(crate) fn read_ahead<R, T>(
    mut source: R,
    consume: impl FnOnce(&mut ChunkReader) -> T,
) -> Result<(T, R), ImageError>
where
    R: Read + Send,
{
    let (tx, rx) = mpsc::sync_channel::<io::Result<Vec<u8>>>(CHUNKS);
    let (free_tx, free_rx) = mpsc::sync_channel::<Vec<u8>>(CHUNKS + 2);
    std::thread::scope(|scope| {
        let producer = std::thread::Builder::new()
            .name("layer-decode".into())
            .spawn_scoped(scope, move || {
                produce(&mut source, &tx, &free_rx);
                source
            })
            .map_err(|e| ImageError::Task(format!("starting the layer decoder thread: {e}")))?;
        let mut reader = ChunkReader {
            rx,
            free: free_tx,
            chunk: Vec::new(),
            pos: 0,
        };
        let out = consume(&mut reader);
        // Hang up first: a producer blocked on a full channel stops at once.
        drop(reader);
        let source = producer
            .join()
            .map_err(|_| ImageError::Task("the layer decoder thread panicked".into()))?;
        Ok((out, source))
    })
}

/// The producer's loop: reads `source` into recycled chunks until its end, its first error
/// (passed on) or the consumer hanging up.
fn produce(
    source: &mut impl Read,
    tx: &mpsc::SyncSender<io::Result<Vec<u8>>>,
    free: &mpsc::Receiver<Vec<u8>>,
) {
    loop {
        let mut buf = free.try_recv().unwrap_or_default();
        buf.resize(CHUNK, 0);
        // Fill most of the chunk (decoders return a block at a time): fewer hand-offs.
        let mut filled = 0;
        let item = loop {
            match source.read(&mut buf[filled..]) {
                Ok(0) => break None,
                Ok(n) => {
                    filled += n;
                    if filled >= CHUNK / 2 {
                        break None;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Some(e),
            }
        };
        let end = filled < CHUNK / 2;
        if filled > 0 {
            buf.truncate(filled);
            if tx.send(Ok(buf)).is_err() {
                return;
            }
        }
        if let Some(e) = item {
            let _ = tx.send(Err(e));
            return;
        }
        if end {
            return;
        }
    }
}

/// The consumer's side: the producer's chunks, in order, as a reader; the end of the
/// source is a read of 0.
pub(crate) struct ChunkReader {
    rx: mpsc::Receiver<io::Result<Vec<u8>>>,
    free: mpsc::SyncSender<Vec<u8>>,
    chunk: Vec<u8>,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            match self.rx.recv() {
                Ok(Ok(next)) => {
                    let used = std::mem::replace(&mut self.chunk, next);
                    self.pos = 0;
                    if used.capacity() > 0 {
                        let _ = self.free.try_send(used);
                    }
                }
                Ok(Err(e)) => return Err(e),
                // The producer is done: the end of the source.
                Err(mpsc::RecvError) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 253) as u8).collect()
    }

    /// Yields `data` in reads of at most `step` bytes, then `fail` if set.
    struct Source {
        data: Vec<u8>,
        pos: usize,
        step: usize,
        fail: Option<io::ErrorKind>,
        reads: usize,
    }

    impl Read for Source {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            let n = buf.len().min(self.step).min(self.data.len() - self.pos);
            if n == 0 {
                if let Some(kind) = self.fail {
                    return Err(io::Error::new(kind, "source broke"));
                }
            }
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    fn source(len: usize, step: usize, fail: Option<io::ErrorKind>) -> Source {
        Source {
            data: data(len),
            pos: 0,
            step,
            fail,
            reads: 0,
        }
    }

    #[test]
    fn every_byte_arrives_once_in_order_and_the_source_comes_back_read_to_its_end() {
        for (len, step) in [(0, 1), (1, 1), (CHUNK * 5 + 17, 7000), (CHUNK * 3, CHUNK)] {
            let (got, src) = read_ahead(source(len, step, None), |r| {
                let mut v = Vec::new();
                r.read_to_end(&mut v).map(|_| v)
            })
            .unwrap();
            assert_eq!(got.unwrap(), data(len), "len {len} step {step}");
            assert_eq!(src.pos, len);
        }
    }

    #[test]
    fn a_source_error_reaches_the_consumer_after_the_bytes_before_it() {
        let len = CHUNK * 2 + 5;
        let (got, _) = read_ahead(
            source(len, 4096, Some(io::ErrorKind::ConnectionReset)),
            |r| {
                let mut v = Vec::new();
                let err = r.read_to_end(&mut v).unwrap_err();
                (v.len(), err.kind())
            },
        )
        .unwrap();
        assert_eq!(got, (len, io::ErrorKind::ConnectionReset));
    }

    #[test]
    fn a_consumer_that_stops_early_stops_the_producer_within_the_channel_bound() {
        // An endless source (a decompression bomb's trailing zeros) is not read to its end
        // once the consumer hangs up.
        let len = CHUNK * 1000;
        let (got, src) = read_ahead(source(len, CHUNK, None), |r| {
            let mut b = [0u8; 100];
            r.read_exact(&mut b).map(|()| b.to_vec())
        })
        .unwrap();
        assert_eq!(got.unwrap(), data(100));
        assert!(
            src.pos <= CHUNK * (CHUNKS + 3),
            "the producer read {} bytes",
            src.pos
        );
    }
}

//! Snapshots: each layer unpacked once, into `snapshots/<chain-id hex>/`.
//!
//! ```text
//!  snapshots/tmp-<chain>-<unique>/fs       unpack here (layer blob → gunzip → tar)
//!                                /changes.json   whiteouts + opaque dirs (copy mode)
//!                                /done           written last (names this boot's id)
//!      ── rename ──► snapshots/<chain>/          visible only when complete
//!  every layer of the import / rootfs done ─► ONE syncfs ─► snapshots/<chain>/durable
//!  (a pull: once the image is recorded, in the background, so not on the pull's path)
//! ```
//!
//! Guarantees:
//! - a snapshot directory without `done` is never used: it is removed and unpacked again
//!   (a crash mid-unpack leaves only a `tmp-*` directory, which gc removes);
//! - a snapshot is used only if its content is on disk or still in this boot's page cache:
//!   `done` names the boot it was written in, and one written in an earlier boot is used
//!   only if `durable` is there too, created after a `syncfs` that followed its content;
//!   otherwise (the machine went down before the sync) it is removed and unpacked again
//!   from its blob (blobs are fsynced when stored);
//! - the uncompressed stream's digest is compared with the config's diff_id before `done`
//!   is written, so a snapshot always holds exactly the layer the image names;
//! - two unpackers of the same chain id (two processes) both finish; the first rename wins
//!   and the other discards its copy.
//!
//! Why one `syncfs` per batch and not per layer: `syncfs` flushes the whole file system,
//! every other process's dirty pages included, and waits for them; on a node where other
//! work writes (builds, logs, other pulls) one per layer put that foreign writeback nine
//! times on a pull's path. An fsync of each file the layer wrote (thousands of files, each a
//! journal commit) costs more than one syncfs. containerd does not sync at all by default
//! (`image_pull_with_sync_fs` off), and trusts a snapshot after a power loss; here a process
//! crash (`kill -9`) loses nothing the page cache holds, so only a reboot can expose unsynced
//! content, and the boot id in `done` catches exactly that case.
//!
//! A snapshot holds only its own layer's files (overlay semantics), plus the lower files its
//! hard links name (copied up, see `lower.rs`); it is keyed by chain id because its
//! whiteouts and copied-up files only make sense on top of that exact parent chain.

use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::digest::{Digest, HashingReader};
use super::error::ImageError;
use super::fsx;
use super::index::{ImageRecord, LayerRecord};
use super::lower::LowerLayer;
use super::oci::Compression;
use super::pipeline;
use super::store::ImageStore;
use super::sys;
use super::unpack::{self, UnpackLimits, UnpackOptions};
use super::whiteout::{Changes, WhiteoutFormat};

/// Most uncompressed bytes read after a layer's end-of-archive marker. Tar writers pad to a
/// record: Go's archive/tar (docker, containerd, buildkit) to 1 KiB, GNU tar and bsdtar to
/// 10 KiB by default; 1 MiB is 100 times that and costs about a millisecond. The diff_id
/// must cover everything (a snapshot is keyed by it), so a layer with more is refused
/// rather than decompressed without end (10 GiB of zeros are 10 MB of gzip).
pub(crate) const MAX_TRAILING_BYTES: u64 = 1 << 20;

const DONE: &str = "done";
/// Created after a `syncfs` that followed the snapshot's content (see the module doc).
const DURABLE: &str = "durable";
const CHANGES: &str = "changes.json";
const FS: &str = "fs";

/// The done-marker's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Marker {
    pub chain_id: Digest,
    pub diff_id: Digest,
    pub whiteouts: WhiteoutFormat,
    pub entries: u64,
    pub bytes: u64,
    /// Unprivileged unpack recorded non-root owners in xattrs (`owners.rs`); `false` for a
    /// snapshot unpacked before that (or as root, where the files have their owners).
    #[serde(default)]
    pub owners_recorded: bool,
    /// How many entries have a recorded owner (`None`: unknown, an older snapshot, or root).
    #[serde(default)]
    pub owned_entries: Option<u64>,
    /// The boot the snapshot was written in, when its content was not synced before this
    /// marker; `None`: synced before (older snapshots, or no boot id to read).
    #[serde(default)]
    pub boot_id: Option<String>,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), read once; `None` if unreadable
/// (then each snapshot is synced before its marker, as without batching).
fn boot_id() -> Option<&'static str> {
    static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .as_deref()
}

/// A complete snapshot on disk.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub dir: PathBuf,
    pub marker: Marker,
}

impl Snapshot {
    pub(crate) fn fs(&self) -> PathBuf {
        self.dir.join(FS)
    }

    pub(crate) fn changes(&self) -> Result<Changes, ImageError> {
        let path = self.dir.join(CHANGES);
        let bytes = std::fs::read(&path).map_err(|e| ImageError::io("reading", &path, e))?;
        super::oci::parse_json(&bytes, "snapshot changes", &path.display().to_string())
    }
}

impl ImageStore {
    /// Whether the snapshots' file system takes `user.*` xattrs from this user (checked once
    /// per store): rootless snapshots then get [`WhiteoutFormat::UserXattr`] whiteouts.
    pub(crate) fn user_xattrs_supported(&self) -> bool {
        *self.user_xattrs.get_or_init(|| {
            let dir = self.snapshots_dir();
            let probe = dir.join(fsx::unique_name("tmp-xattr-probe-"));
            let result = std::fs::File::create(&probe).and_then(|f| {
                use xattr::FileExt;
                f.set_xattr("user.ironlet.probe", b"1")
            });
            let _ = std::fs::remove_file(&probe);
            if let Err(e) = &result {
                tracing::info!(dir = ?dir, err = %e, "the image store's file system refuses user xattrs: rootless snapshots record whiteouts for copying only");
            }
            result.is_ok()
        })
    }

    pub(crate) fn snapshot_dir(&self, chain_id: &Digest) -> PathBuf {
        self.snapshots_dir().join(chain_id.hex())
    }

    /// The snapshot of `chain_id` if it is complete: marked done, and written in this boot
    /// or synced since (see the module doc).
    pub(crate) fn snapshot(&self, chain_id: &Digest) -> Option<Snapshot> {
        let dir = self.snapshot_dir(chain_id);
        let bytes = std::fs::read(dir.join(DONE)).ok()?;
        let marker: Marker = serde_json::from_slice(&bytes).ok()?;
        if &marker.chain_id != chain_id {
            return None;
        }
        if let Some(written) = marker.boot_id.as_deref() {
            if Some(written) != boot_id() && !dir.join(DURABLE).exists() {
                tracing::warn!(%chain_id, boot = written, "snapshot written in an earlier boot and never synced; unpacking it again");
                return None;
            }
        }
        Some(Snapshot { dir, marker })
    }

    /// Makes `snapshots` (written by this process, marked done) durable: one `syncfs` of
    /// the store's file system, then `durable` in each that names a boot. The `durable`
    /// files need no sync of their own: each is created after the content it vouches for
    /// reached the disk, and one lost in a crash only costs an unpack.
    pub(crate) fn make_durable(&self, snapshots: &[Snapshot]) -> Result<(), ImageError> {
        let pending: Vec<&Snapshot> = snapshots
            .iter()
            .filter(|s| s.marker.boot_id.is_some())
            .collect();
        if pending.is_empty() || !self.config.sync_snapshots {
            return Ok(());
        }
        let dir = self.snapshots_dir();
        let fd = sys::open_dir(&dir).map_err(|e| ImageError::io("opening", &dir, e))?;
        sys::syncfs(std::os::fd::AsFd::as_fd(&fd))
            .map_err(|e| ImageError::io("syncing", &dir, e))?;
        self.syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for s in pending {
            let path = s.dir.join(DURABLE);
            std::fs::File::create(&path).map_err(|e| ImageError::io("creating", &path, e))?;
        }
        Ok(())
    }

    /// Makes sure every layer of `record` is unpacked; returns the snapshots bottom first.
    /// The layers unpacked here are made durable together at the end. The caller holds
    /// the gc lock shared.
    pub(crate) fn ensure_snapshots(
        &self,
        record: &ImageRecord,
    ) -> Result<Vec<Snapshot>, ImageError> {
        let mut snapshots: Vec<Snapshot> = Vec::with_capacity(record.layers.len());
        let mut unpacked = Vec::new();
        for layer in &record.layers {
            let snapshot = match self.snapshot(&layer.chain_id) {
                Some(s) => s,
                None => {
                    let s = self.unpack_snapshot(layer, &snapshots)?;
                    unpacked.push(s.clone());
                    s
                }
            };
            snapshots.push(snapshot);
        }
        self.make_durable(&unpacked)?;
        Ok(snapshots)
    }

    /// Unpacks `layer` onto `lowers`, the snapshots of the layers below it (bottom first).
    fn unpack_snapshot(
        &self,
        layer: &LayerRecord,
        lowers: &[Snapshot],
    ) -> Result<Snapshot, ImageError> {
        let blob = self.blobs.open(&layer.digest)?;
        self.unpack_snapshot_from(layer, lowers, blob, || Ok(()))
    }

    /// Unpacks `layer` from `blob` (its compressed stream, as stored or as it downloads)
    /// onto `lowers` into its snapshot. `verify` runs after the whole stream was read and
    /// the diff_id checked, before the snapshot is renamed into place: a pull checks the
    /// blob digest there, so a snapshot never appears for a blob that did not verify.
    pub(crate) fn unpack_snapshot_from(
        &self,
        layer: &LayerRecord,
        lowers: &[Snapshot],
        blob: impl Read + Send,
        verify: impl FnOnce() -> Result<(), ImageError>,
    ) -> Result<Snapshot, ImageError> {
        let final_dir = self.snapshot_dir(&layer.chain_id);
        if final_dir.exists() && self.snapshot(&layer.chain_id).is_none() {
            tracing::warn!(chain_id = %layer.chain_id, dir = ?final_dir, "incomplete snapshot found; unpacking again");
            fsx::remove_tree(&final_dir)?;
        }
        let tmp = self.snapshots_dir().join(fsx::unique_name(&format!(
            "tmp-{}-",
            &layer.chain_id.hex()[..12]
        )));
        let result = self
            .unpack_into(layer, lowers, blob, &tmp)
            .and_then(|m| verify().map(|()| m));
        let marker = match result {
            Ok(m) => m,
            Err(e) => {
                if let Err(cleanup) = fsx::remove_tree(&tmp) {
                    tracing::warn!(dir = ?tmp, err = %cleanup, "removing failed snapshot");
                }
                return Err(e);
            }
        };
        match std::fs::rename(&tmp, &final_dir) {
            Ok(()) => fsx::sync_dir(&self.snapshots_dir())?,
            Err(e) if final_dir.join(DONE).exists() => {
                tracing::debug!(chain_id = %layer.chain_id, err = %e, "snapshot unpacked concurrently; keeping the other copy");
                fsx::remove_tree(&tmp)?;
                // The other copy's marker (its boot id) is the one that counts.
                if let Some(other) = self.snapshot(&layer.chain_id) {
                    return Ok(other);
                }
            }
            Err(e) => {
                let _ = fsx::remove_tree(&tmp);
                return Err(ImageError::io("renaming snapshot into", &final_dir, e));
            }
        }
        tracing::info!(chain_id = %layer.chain_id, layer = %layer.digest, entries = marker.entries, bytes = marker.bytes, "layer unpacked");
        Ok(Snapshot {
            dir: final_dir,
            marker,
        })
    }

    fn unpack_into(
        &self,
        layer: &LayerRecord,
        lowers: &[Snapshot],
        blob: impl Read + Send,
        tmp: &Path,
    ) -> Result<Marker, ImageError> {
        let fs = tmp.join(FS);
        fsx::ensure_dir(&fs)?;
        let name = layer.digest.to_string();
        let mut buffered = BufReader::with_capacity(1 << 16, blob);
        let head = buffered
            .fill_buf()
            .map_err(|e| ImageError::ReadLayer {
                layer: name.clone(),
                source: e,
            })?
            .to_vec();
        let decoded: Box<dyn Read + Send> = match Compression::sniff(&head) {
            Some(Compression::Gzip) => Box::new(flate2::read::MultiGzDecoder::new(buffered)),
            Some(Compression::Zstd) => {
                Box::new(zstd::Decoder::with_buffer(buffered).map_err(|e| {
                    ImageError::ReadLayer {
                        layer: name.clone(),
                        source: e,
                    }
                })?)
            }
            Some(Compression::None) | None => Box::new(buffered),
        };
        let hashing = HashingReader::new(decoded);
        let whiteouts = if self.config.privileged {
            WhiteoutFormat::Overlay
        } else if self.user_xattrs_supported() {
            WhiteoutFormat::UserXattr
        } else {
            WhiteoutFormat::Sidecar
        };
        let opts = UnpackOptions {
            limits: UnpackLimits {
                max_bytes: self.config.max_layer_bytes,
                max_entries: self.config.max_layer_entries,
            },
            whiteouts,
            preserve_owner: self.config.privileged,
        };
        // For hard links to files of lower layers (copied up, as containerd's apply onto
        // the parents' mount would).
        let lower_fs: Vec<PathBuf> = lowers.iter().map(Snapshot::fs).collect();
        let lower_changes = lowers
            .iter()
            .map(Snapshot::changes)
            .collect::<Result<Vec<_>, _>>()?;
        let lower_layers: Vec<LowerLayer<'_>> = lower_fs
            .iter()
            .zip(&lower_changes)
            .map(|(fs, changes)| LowerLayer { fs, changes })
            .collect();
        // Decompression and both hashes on one thread, the tar unpack's writes on this one
        // (`pipeline.rs`); the unpacker sees the decompressed stream as before.
        let (unpacked, hashing) = pipeline::read_ahead(hashing, |decompressed| {
            let report = unpack::unpack_layer_onto(decompressed, &fs, &lower_layers, &opts, &name)?;
            // The diff_id covers the whole uncompressed stream, as containerd computes it
            // (it reads to the end, however far); we stop at a bound (see
            // MAX_TRAILING_BYTES), which also stops the decompressing thread.
            let trailing = io::copy(
                &mut decompressed.take(MAX_TRAILING_BYTES.saturating_add(1)),
                &mut io::sink(),
            )
            .map_err(|e| ImageError::ReadLayer {
                layer: name.clone(),
                source: e,
            })?;
            Ok::<_, ImageError>((report, trailing))
        })?;
        let (report, trailing) = unpacked?;
        if trailing > MAX_TRAILING_BYTES {
            return Err(ImageError::TrailingData {
                layer: name.clone(),
                limit: MAX_TRAILING_BYTES,
            });
        }
        // Read to its end by the decompressing thread (nothing left here).
        let (diff_id, _) = hashing
            .drain_within(MAX_TRAILING_BYTES)
            .map_err(|e| ImageError::ReadLayer {
                layer: name.clone(),
                source: e,
            })?
            .ok_or_else(|| ImageError::TrailingData {
                layer: name.clone(),
                limit: MAX_TRAILING_BYTES,
            })?;
        if diff_id != layer.diff_id {
            return Err(ImageError::DiffIdMismatch {
                layer: name,
                expected: layer.diff_id.to_string(),
                actual: diff_id.to_string(),
            });
        }
        let changes = serde_json::to_vec(&report.changes)
            .map_err(|e| ImageError::io("encoding", tmp.join(CHANGES), std::io::Error::other(e)))?;
        std::fs::write(tmp.join(CHANGES), changes)
            .map_err(|e| ImageError::io("writing", tmp.join(CHANGES), e))?;
        // Synced later, with the other layers of the batch (`make_durable`), unless there
        // is no boot id to tell a reboot by.
        let boot = self.config.sync_snapshots.then(boot_id).flatten();
        if self.config.sync_snapshots && boot.is_none() {
            let fd = sys::open_dir(tmp).map_err(|e| ImageError::io("opening", tmp, e))?;
            sys::syncfs(std::os::fd::AsFd::as_fd(&fd))
                .map_err(|e| ImageError::io("syncing", tmp, e))?;
            self.syncs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let marker = Marker {
            chain_id: layer.chain_id.clone(),
            diff_id,
            whiteouts,
            entries: report.entries,
            bytes: report.bytes,
            owners_recorded: !self.config.privileged,
            owned_entries: (!self.config.privileged).then_some(report.owned_entries),
            boot_id: boot.map(str::to_owned),
        };
        let bytes = serde_json::to_vec(&marker)
            .map_err(|e| ImageError::io("encoding", tmp.join(DONE), std::io::Error::other(e)))?;
        fsx::write_atomic(&tmp.join(DONE), &bytes)?;
        Ok(marker)
    }

    /// Chain ids of every complete or partial snapshot directory, plus the `tmp-*` names.
    pub(crate) fn snapshot_entries(&self) -> Result<Vec<(String, PathBuf)>, ImageError> {
        let dir = self.snapshots_dir();
        let rd = std::fs::read_dir(&dir).map_err(|e| ImageError::io("listing", &dir, e))?;
        Ok(rd
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// An uncompressed layer holding `name` with `content`, stored as a blob.
    fn layer(store: &ImageStore, name: &str, content: &[u8]) -> (Digest, Digest) {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, name, content).unwrap();
        let tar = builder.into_inner().unwrap();
        let digest = store.blobs.write_bytes(&tar, "test").unwrap();
        (digest.clone(), digest)
    }

    fn record(store: &ImageStore, files: &[(&str, &[u8])]) -> ImageRecord {
        let blobs: Vec<(Digest, Digest)> = files.iter().map(|(n, c)| layer(store, n, c)).collect();
        let diff_ids: Vec<Digest> = blobs.iter().map(|(_, d)| d.clone()).collect();
        let layers = blobs
            .into_iter()
            .zip(super::super::oci::chain_ids(&diff_ids))
            .map(|((digest, diff_id), chain_id)| LayerRecord {
                digest,
                size: 0,
                media_type: "application/vnd.oci.image.layer.v1.tar".into(),
                diff_id,
                chain_id,
            })
            .collect();
        ImageRecord {
            config_digest: Digest::of_bytes(b"config"),
            layers,
            size: 0,
            config: Default::default(),
        }
    }

    fn store(dir: &Path) -> ImageStore {
        ImageStore::open_with(dir, super::super::store::ImageStoreConfig::default()).unwrap()
    }

    #[test]
    fn the_layers_of_one_unpack_are_synced_once_then_marked_durable() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        let record = record(&store, &[("a", b"1"), ("b", b"2"), ("c", b"3")]);
        let snapshots = store.ensure_snapshots(&record).unwrap();
        assert_eq!(snapshots.len(), 3);
        assert_eq!(
            store.syncs.load(Ordering::Relaxed),
            1,
            "one syncfs for three layers"
        );
        for s in &snapshots {
            assert_eq!(s.marker.boot_id.as_deref(), boot_id());
            assert!(
                s.dir.join(DURABLE).exists(),
                "{:?} not marked durable",
                s.dir
            );
        }
        // Present: nothing unpacked, nothing synced again.
        store.ensure_snapshots(&record).unwrap();
        assert_eq!(store.syncs.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_snapshot_of_an_earlier_boot_is_used_only_if_it_was_synced() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        let record = record(&store, &[("a", b"first")]);
        let chain = record.layers[0].chain_id.clone();
        let first = store.ensure_snapshots(&record).unwrap().remove(0);
        // As if written in an earlier boot: with `durable`, it is used as it is.
        let mut marker = first.marker.clone();
        marker.boot_id = Some("an-earlier-boot".into());
        std::fs::write(first.dir.join(DONE), serde_json::to_vec(&marker).unwrap()).unwrap();
        assert!(store.snapshot(&chain).is_some());
        // Without `durable` (the machine went down before the sync): never used, unpacked
        // again from its blob, then synced and durable.
        std::fs::remove_file(first.dir.join(DURABLE)).unwrap();
        std::fs::write(first.fs().join("a"), b"torn").unwrap();
        assert!(store.snapshot(&chain).is_none());
        let syncs = store.syncs.load(Ordering::Relaxed);
        let again = store.ensure_snapshots(&record).unwrap().remove(0);
        assert_eq!(std::fs::read(again.fs().join("a")).unwrap(), b"first");
        assert_eq!(again.marker.boot_id.as_deref(), boot_id());
        assert!(again.dir.join(DURABLE).exists());
        assert_eq!(store.syncs.load(Ordering::Relaxed), syncs + 1);
        // A snapshot from before boot ids (synced before its marker) is trusted.
        marker.boot_id = None;
        std::fs::remove_file(again.dir.join(DURABLE)).unwrap();
        std::fs::write(again.dir.join(DONE), serde_json::to_vec(&marker).unwrap()).unwrap();
        assert!(store.snapshot(&chain).is_some());
    }
}

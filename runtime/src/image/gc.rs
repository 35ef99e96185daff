//! [`ImageStore::gc`]: removes blobs and snapshots that nothing references.
//!
//! Roots: every manifest record in the index (its manifest, config and layer blobs, and the
//! snapshots of its chain ids), and every lease (the snapshots under a prepared root file
//! system, even when its image has been removed meanwhile).
//!
//! Guarantees: gc holds the gc lock exclusively, and import/prepare hold it shared while
//! they add blobs, snapshots and leases and until those are referenced, so gc never
//! removes content that an import or prepare in flight (in any process) is about to
//! reference. Staging leftovers (`ingest/*`, `snapshots/tmp-*`) of crashed imports are
//! removed too, as are leases whose `target_dir` no longer exists.

use std::collections::HashSet;

use super::digest::Digest;
use super::error::ImageError;
use super::fsx::{self, LockKind};
use super::store::ImageStore;

/// What a gc run removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcReport {
    pub blobs_removed: usize,
    pub snapshots_removed: usize,
    /// Disk space given back (allocated blocks).
    pub bytes_freed: u64,
}

impl ImageStore {
    /// Deletes unreferenced blobs and snapshots.
    pub fn gc(&self) -> Result<GcReport, ImageError> {
        let _gc = self.gc_lock(LockKind::Exclusive)?;
        let (blobs, chains) = self.referenced()?;
        let mut report = GcReport::default();
        for digest in self.blobs.list()? {
            if blobs.contains(&digest) {
                continue;
            }
            let path = self.blobs.path(&digest);
            report.bytes_freed += fsx::disk_usage(&path);
            std::fs::remove_file(&path).map_err(|e| ImageError::io("removing blob", &path, e))?;
            report.blobs_removed += 1;
            tracing::debug!(%digest, "blob removed");
        }
        for (name, path) in self.snapshot_entries()? {
            if chains.contains(&name) {
                continue;
            }
            report.bytes_freed += fsx::disk_usage(&path);
            fsx::remove_tree(&path)?;
            if !name.starts_with("tmp-") {
                report.snapshots_removed += 1;
            }
            tracing::debug!(snapshot = %name, "snapshot removed");
        }
        self.remove_ingest();
        tracing::info!(
            blobs_removed = report.blobs_removed,
            snapshots_removed = report.snapshots_removed,
            bytes_freed = report.bytes_freed,
            "image gc done"
        );
        Ok(report)
    }

    /// Removes the staging that crashed imports and pulls left (`ingest/*` and
    /// `snapshots/tmp-*`: a `kill -9` in the middle of a layer) if no import, pull, prepare
    /// or gc is in flight in any process; when one is, it returns at once and leaves them
    /// (the in-flight work may own them; a later start or gc removes them). Cheap: what a
    /// command that adds to the store runs first. Returns the entries removed.
    pub fn clean_staging(&self) -> Result<usize, ImageError> {
        let Some(_gc) = self.try_gc_lock(LockKind::Exclusive)? else {
            tracing::debug!("image store busy; staging left for later");
            return Ok(0);
        };
        let mut removed = self.remove_ingest();
        for (name, path) in self.snapshot_entries()? {
            if name.starts_with("tmp-") {
                fsx::remove_tree(&path)?;
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(removed, "staging of interrupted pulls or imports removed");
        }
        Ok(removed)
    }

    /// Empties `ingest/`; the caller holds the gc lock exclusively.
    fn remove_ingest(&self) -> usize {
        let mut removed = 0;
        if let Ok(rd) = std::fs::read_dir(self.blobs.ingest_dir()) {
            for e in rd.flatten() {
                if fsx::remove_tree(&e.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// Every blob and snapshot (chain id hex) the index or a lease references. The caller
    /// holds the gc lock exclusively.
    fn referenced(&self) -> Result<(HashSet<Digest>, HashSet<String>), ImageError> {
        let file = self.index.load()?;
        let mut blobs: HashSet<Digest> = HashSet::new();
        let mut chains: HashSet<String> = HashSet::new();
        for (manifest, rec) in &file.images {
            blobs.insert(manifest.clone());
            blobs.insert(rec.config_digest.clone());
            for l in &rec.layers {
                blobs.insert(l.digest.clone());
                chains.insert(l.chain_id.hex().to_owned());
            }
        }
        for (path, lease) in self.leases()? {
            if !lease.target_dir.exists() {
                tracing::info!(target_dir = ?lease.target_dir, "dropping lease of a vanished rootfs");
                let _ = std::fs::remove_file(&path);
                continue;
            }
            chains.extend(lease.chain_ids.iter().map(|c| c.hex().to_owned()));
        }
        Ok((blobs, chains))
    }

    /// Removes what a failed import added: the blobs and snapshots in `added` that nothing
    /// references once every import in flight is done (gc lock taken exclusively, after
    /// the caller released its shared hold).
    pub(crate) fn discard_unreferenced(
        &self,
        added_blobs: &[Digest],
        added_snapshots: &[String],
    ) -> Result<(), ImageError> {
        if added_blobs.is_empty() && added_snapshots.is_empty() {
            return Ok(());
        }
        let _gc = self.gc_lock(LockKind::Exclusive)?;
        let (blobs, chains) = self.referenced()?;
        for digest in added_blobs.iter().filter(|d| !blobs.contains(d)) {
            let path = self.blobs.path(digest);
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::debug!(%digest, "blob of a failed import removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ImageError::io("removing blob", &path, e)),
            }
        }
        for name in added_snapshots.iter().filter(|c| !chains.contains(*c)) {
            fsx::remove_tree(&self.snapshots_dir().join(name))?;
            tracing::debug!(snapshot = %name, "snapshot of a failed import removed");
        }
        Ok(())
    }
}

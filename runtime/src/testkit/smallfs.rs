//! [`SmallFs`]: a size-limited tmpfs mounted on a fresh temp dir, for tests that must run
//! out of disk space (a pull into a full image store). Root only; unmounted and removed on
//! drop, so nothing is left behind.
//!
//! ```text
//!  SmallFs::mount(16 MiB) ── tmpfs size=16m on /tmp/ironlet-smallfs-XXXX
//!  fill_leaving(6 MiB)    ── one filler file, so that ~6 MiB stay free
//!  free_filler()          ── space again
//!  drop                   ── umount (lazily when busy), remove the dir
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// A mounted size-limited tmpfs.
#[derive(Debug)]
pub struct SmallFs {
    dir: Option<tempfile::TempDir>,
}

impl SmallFs {
    /// Mounts a tmpfs of `size` bytes (rounded up to pages) on a new temp dir.
    pub fn mount(size: u64) -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ironlet-smallfs-")
            .tempdir()?;
        let options = format!("size={size},mode=0700");
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(std::io::Error::from)?;
        Ok(Self { dir: Some(dir) })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }

    /// Bytes an unprivileged writer can still use.
    pub fn available(&self) -> std::io::Result<u64> {
        let st = nix::sys::statvfs::statvfs(self.path()).map_err(std::io::Error::from)?;
        Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
    }

    fn filler(&self) -> PathBuf {
        self.path().join("filler")
    }

    /// Writes a filler file so that about `free` bytes stay available.
    pub fn fill_leaving(&self, free: u64) -> std::io::Result<()> {
        let take = self.available()?.saturating_sub(free);
        let mut f = std::fs::File::create(self.filler())?;
        let chunk = vec![0x5au8; 1 << 16];
        let mut left = take;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        f.sync_all()
    }

    /// Removes the filler file.
    pub fn free_filler(&self) -> std::io::Result<()> {
        std::fs::remove_file(self.filler())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            if nix::mount::umount(dir.path()).is_err() {
                let _ = nix::mount::umount2(dir.path(), nix::mount::MntFlags::MNT_DETACH);
            }
            let _ = dir.close();
        }
    }
}

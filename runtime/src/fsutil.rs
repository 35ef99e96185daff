//! Small file-system helpers shared by the runtime's state keeping.

use std::io::Write;
use std::path::Path;

/// Mode of the state directories (`<root-dir>` and what the runtime keeps in it): nothing
/// for other users, whose environment variables and secrets the records hold.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Mode of state files.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Creates `path` (and missing parents) with mode 0700, and narrows an existing directory
/// that other users can enter or read (an install made before the modes were set) to
/// 0700. Symlinks to the directory are followed, as an admin may place the root elsewhere.
pub fn private_dir(path: &Path) -> std::io::Result<()> {
    narrowed_dir(path, PRIVATE_DIR_MODE)
}

/// Creates `path` (and missing parents) with `mode`, or narrows an existing directory to
/// `mode` when it grants more.
pub fn narrowed_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)?;
    let old = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    if old & !mode != 0 {
        tracing::info!(
            ?path,
            from = format!("{old:o}"),
            to = format!("{mode:o}"),
            "narrowing the mode of a state directory"
        );
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// What a directory tree holds on disk (CRI's `FilesystemUsage`, kubelet's `fs.DiskUsage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Allocated bytes.
    pub used_bytes: u64,
    /// Inodes: files, directories, symlinks…, the top directory included.
    pub inodes_used: u64,
}

/// Bytes used on disk below `path` (allocated blocks; hard links counted once; other file
/// systems mounted below are not entered, as `du -x`). Entries that vanish or cannot be read
/// meanwhile count as nothing; symlinks are not followed.
pub fn disk_usage(path: &Path) -> u64 {
    disk_usage_and_inodes(path).used_bytes
}

/// [`disk_usage`] with the inodes counted too (each hard-linked inode once).
pub fn disk_usage_and_inodes(path: &Path) -> DiskUsage {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(path) else {
        return DiskUsage::default();
    };
    let mut seen = std::collections::HashSet::new();
    let mut usage = DiskUsage::default();
    let mut stack: Vec<std::path::PathBuf> = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.dev() != top.dev() {
            continue;
        }
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        usage.used_bytes = usage
            .used_bytes
            .saturating_add(meta.blocks().saturating_mul(512));
        usage.inodes_used += 1;
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    usage
}

/// Writes `bytes` to `path` so that a crash leaves either the old or the new content:
/// temp file in the same directory, fsync, rename, fsync of the directory. The file is
/// private (0600): state records and bundle configs hold environment variables.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_mode(path, bytes, PRIVATE_FILE_MODE)
}

/// Whether this process's container state is throwaway (see [`set_state_throwaway`]).
static STATE_THROWAWAY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks every container and sandbox state file this process (and the zygote it forks
/// afterwards) writes as throwaway: [`write_state`] then renames without fsyncs. For a
/// one-shot `ironlet ctr run --rm`, which removes all of it before it exits: the records
/// only serve a cleanup after a crash, and a host crash ends the container anyway (its
/// overlay is `volatile` too). A record torn by a host crash is skipped as unreadable and
/// its directory cleaned like one without a record. Image data (blobs, index, snapshots)
/// and caches stay durable whatever this says.
pub fn set_state_throwaway() {
    STATE_THROWAWAY.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`set_state_throwaway`] was called in this process (or before its fork).
pub fn state_is_throwaway() -> bool {
    STATE_THROWAWAY.load(std::sync::atomic::Ordering::Relaxed)
}

/// Writes a state file of a container or sandbox (record, bundle config, exit record,
/// lease): [`write_atomic`], without its fsyncs when the state is throwaway. Still a
/// rename of a whole temp file: a reader never sees a torn file while the host runs.
pub fn write_state(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_inner(path, bytes, PRIVATE_FILE_MODE, !state_is_throwaway())
}

/// [`write_atomic`] with the file's mode given, for files others are meant to read.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomic_inner(path, bytes, mode, true)
}

fn write_atomic_inner(path: &Path, bytes: &[u8], mode: u32, durable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("path has no parent directory"))?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("path has no file name"))?;
    // One temp file per call: two threads saving the same record at once (a container's
    // exit and its start's update) each rename their own. With one name per process, the
    // second rename failed with ENOENT, or renamed a file the other was still writing.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{}.tmp{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    // A temp file left by a crash keeps its old mode through O_CREAT: set it.
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(bytes)?;
    if durable {
        file.sync_all()?;
    }
    drop(file);
    std::fs::rename(&tmp, path)?;
    if durable {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_private_dir_is_made_0700_and_an_older_wider_one_narrowed() {
        let tmp = tempfile::tempdir().unwrap();
        let made = tmp.path().join("a/b");
        private_dir(&made).unwrap();
        assert_eq!(mode(&made), 0o700);
        let old = tmp.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&old).unwrap();
        assert_eq!(mode(&old), 0o700);
        narrowed_dir(&old, 0o750).unwrap();
        assert_eq!(mode(&old), 0o700, "a narrower directory is left alone");
    }

    #[test]
    fn concurrent_atomic_writes_of_one_file_all_succeed_and_leave_a_whole_one() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("record.json");
        let contents: Vec<Vec<u8>> = (0..8u8).map(|i| vec![b'a' + i; 64 << 10]).collect();
        std::thread::scope(|scope| {
            let writers: Vec<_> = contents
                .iter()
                .map(|bytes| {
                    let path = &path;
                    scope.spawn(move || (0..20).try_for_each(|_| write_atomic(path, bytes)))
                })
                .collect();
            for w in writers {
                w.join().unwrap().expect("a concurrent write failed");
            }
        });
        let last = std::fs::read(&path).unwrap();
        assert!(contents.contains(&last), "the file is a mix of writes");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "temp files left: {left:?}");
    }

    #[test]
    fn state_files_are_written_0600_even_over_a_wider_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("record.json");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        write_atomic_mode(&path, b"conf", 0o644).unwrap();
        assert_eq!(mode(&path), 0o644);
    }

    #[test]
    fn usage_counts_blocks_and_inodes_with_hard_links_once() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("t");
        std::fs::create_dir_all(top.join("d")).unwrap();
        std::fs::write(top.join("d/a"), vec![7u8; 256 * 1024]).unwrap();
        std::fs::hard_link(top.join("d/a"), top.join("b")).unwrap();
        std::os::unix::fs::symlink("d/a", top.join("s")).unwrap();
        let usage = disk_usage_and_inodes(&top);
        // t, d, a (once), s.
        assert_eq!(usage.inodes_used, 4);
        assert!(usage.used_bytes >= 256 * 1024, "{usage:?}");
        assert!(usage.used_bytes < 2 * 256 * 1024, "{usage:?}");
        assert_eq!(disk_usage(&top), usage.used_bytes);
        assert_eq!(
            disk_usage_and_inodes(&tmp.path().join("missing")),
            DiskUsage::default()
        );
    }
}

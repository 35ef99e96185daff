//! Copy mode: a container root file system made by copying snapshots in order, applying
//! each layer's whiteouts and opaque directories (for rootless setups and where overlayfs
//! is unavailable).
//!
//! For each layer, bottom first, the layer tree is walked top-down; at each directory `D`:
//! if `D` is opaque in this layer, the content already in the destination's `D` (from lower
//! layers) is removed; each whiteout in `D` removes the destination entry; then the
//! layer's entries are copied over. A destination entry of another kind is replaced (a
//! layer's directory replaces a lower file or symlink of the same name).
//!
//! Guarantees: the walk only ever descends into destination directories it has just
//! checked with `lstat` to be real directories (never symlinks), so whiteouts and copies
//! cannot reach outside the destination even when a lower layer planted `evil -> /`.
//! Modes, mtimes, symlinks, FIFOs, xattrs (except overlay's own) and hard links within a
//! layer are preserved; ownership only when `preserve_owner`. Overlay whiteouts in a
//! snapshot (0:0 devices, zero-size files with `user.overlay.whiteout`) are treated as
//! whiteouts, never copied.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::ImageError;
use super::owners::OWNER_XATTR;
use super::sys;
use super::whiteout::{is_overlay_whiteout, is_xattr_whiteout, Changes};

/// One layer to copy: its tree and its whiteouts.
pub(crate) struct CopyLayer {
    pub fs: PathBuf,
    pub changes: Changes,
}

/// Copies `layers` (bottom first) into the existing empty directory `dest`, on a thread of
/// its own whose stack fits [`MAX_COPY_DEPTH`] levels of the recursive walk.
pub(crate) fn copy_layers(
    layers: &[CopyLayer],
    dest: &Path,
    preserve_owner: bool,
) -> Result<(), ImageError> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("ironlet-copy".into())
            .stack_size(COPY_STACK_BYTES)
            .spawn_scoped(scope, || copy_here(layers, dest, preserve_owner))
            .map_err(|e| ImageError::io("starting the copy of", dest, e))?
            .join()
            .unwrap_or_else(|_| Err(ImageError::Task(format!("copying into {dest:?} panicked"))))
    })
}

/// Virtual size of the copy thread's stack (committed only as used): about 10 KiB per
/// level in a debug build, 4 times that for [`MAX_COPY_DEPTH`].
const COPY_STACK_BYTES: usize = 64 << 20;

fn copy_here(layers: &[CopyLayer], dest: &Path, preserve_owner: bool) -> Result<(), ImageError> {
    for layer in layers {
        let mut c = Copier {
            changes: &layer.changes,
            preserve_owner,
            links: HashMap::new(),
            depth: 0,
        };
        c.dir(&layer.fs, dest, Path::new(""))?;
    }
    Ok(())
}

struct Copier<'a> {
    changes: &'a Changes,
    preserve_owner: bool,
    /// (dev, ino) of a multiply-linked source file → its first copy, for hard links.
    links: HashMap<(u64, u64), PathBuf>,
    /// Directories entered (see [`MAX_COPY_DEPTH`]).
    depth: usize,
}

/// Deepest directory tree copy mode copies (layers themselves unpack at any depth; paths
/// this long already reach `PATH_MAX` in most stores).
const MAX_COPY_DEPTH: usize = 1024;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ImageError + 'a {
    move |e| ImageError::io(op, path, e)
}

/// Removes `path` whatever it is, without following a symlink; missing is fine.
fn remove_any(path: &Path) -> Result<(), ImageError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ImageError::io("inspecting", path, e)),
        Ok(m) if m.is_dir() => super::fsx::remove_tree(path),
        Ok(_) => fs::remove_file(path).map_err(io_err("removing", path)),
    }
}

impl Copier<'_> {
    /// Copies the children of the layer directory `src` into `dst`, a real directory.
    fn dir(&mut self, src: &Path, dst: &Path, rel: &Path) -> Result<(), ImageError> {
        self.depth += 1;
        if self.depth > MAX_COPY_DEPTH {
            // This walk recurses and uses whole paths: refuse cleanly what overlay mode
            // (no depth limit) can still mount, rather than overflow the stack.
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("deeper than {MAX_COPY_DEPTH} directories: copy mode cannot copy it, overlay mode can"),
            );
            return Err(ImageError::io("copying", dst, e));
        }
        let result = self.dir_entries(src, dst, rel);
        self.depth -= 1;
        result
    }

    fn dir_entries(&mut self, src: &Path, dst: &Path, rel: &Path) -> Result<(), ImageError> {
        let rel_str = rel.to_string_lossy();
        if self.changes.opaque_dirs.contains(rel_str.as_ref()) {
            let fd = sys::open_dir(dst).map_err(io_err("opening", dst))?;
            sys::clear_dir(fd.as_fd()).map_err(io_err("clearing opaque directory", dst))?;
        }
        for name in whiteouts_in(self.changes, &rel_str) {
            remove_any(&dst.join(name))?;
        }
        let mut names: Vec<_> = fs::read_dir(src)
            .map_err(io_err("listing", src))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io_err("listing", src))?;
        names.sort();
        for name in names {
            self.entry(&src.join(&name), &dst.join(&name), &rel.join(&name))?;
        }
        Ok(())
    }

    fn entry(&mut self, src: &Path, dst: &Path, rel: &Path) -> Result<(), ImageError> {
        let meta = fs::symlink_metadata(src).map_err(io_err("inspecting", src))?;
        let ft = meta.file_type();
        if is_overlay_whiteout(&meta) || is_xattr_whiteout(src, meta.mode(), meta.size() as i64) {
            return remove_any(dst);
        }
        if ft.is_dir() {
            let existing = fs::symlink_metadata(dst);
            if !existing.as_ref().is_ok_and(|m| m.is_dir()) {
                remove_any(dst)?;
                fs::create_dir(dst).map_err(io_err("creating directory", dst))?;
            }
            self.dir(src, dst, rel)?;
            return self.finish(src, dst, &meta);
        }
        remove_any(dst)?;
        if ft.is_symlink() {
            let target = fs::read_link(src).map_err(io_err("reading link", src))?;
            std::os::unix::fs::symlink(&target, dst).map_err(io_err("creating symlink", dst))?;
        } else if ft.is_file() {
            if meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(first) = self.links.get(&key) {
                    return fs::hard_link(first, dst).map_err(io_err("linking", dst));
                }
                self.links.insert(key, dst.to_path_buf());
            }
            fs::copy(src, dst).map_err(io_err("copying into", dst))?;
        } else if ft.is_fifo() {
            let parent = dst.parent().unwrap_or(Path::new("/"));
            let pfd = sys::open_dir(parent).map_err(io_err("opening", parent))?;
            let name = dst.file_name().unwrap_or(OsStr::new(""));
            sys::mknod_at(pfd.as_fd(), name, libc::S_IFIFO | 0o600, 0)
                .map_err(io_err("creating fifo", dst))?;
        } else {
            tracing::warn!(path = ?src, "skipping device node in snapshot");
            return Ok(());
        }
        self.finish(src, dst, &meta)
    }

    /// Owner, mode, xattrs and times of a copied entry.
    fn finish(&self, src: &Path, dst: &Path, meta: &fs::Metadata) -> Result<(), ImageError> {
        let parent = dst.parent().unwrap_or(Path::new("/"));
        let name = dst.file_name().unwrap_or(OsStr::new(""));
        let pfd = sys::open_dir(parent).map_err(io_err("opening", parent))?;
        if self.preserve_owner {
            sys::lchown_at(pfd.as_fd(), name, meta.uid(), meta.gid())
                .map_err(io_err("chown", dst))?;
        }
        if !meta.file_type().is_symlink() {
            fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(io_err("chmod", dst))?;
            copy_xattrs(src, dst, self.preserve_owner)?;
            // A directory of a lower layer taken over by this one takes this one's owner.
            if !self.preserve_owner && matches!(xattr::get(src, OWNER_XATTR), Ok(None)) {
                let _ = xattr::remove(dst, OWNER_XATTR);
            }
        }
        sys::set_times_at(pfd.as_fd(), name, meta.mtime(), meta.mtime_nsec() as u32)
            .map_err(io_err("setting times of", dst))
    }
}

fn whiteouts_in<'a>(changes: &'a Changes, dir: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    changes.whiteouts.iter().filter_map(move |w| {
        let (parent, name) = w.rsplit_once('/').unwrap_or(("", w.as_str()));
        (parent == dir).then_some(name)
    })
}

fn copy_xattrs(src: &Path, dst: &Path, strict: bool) -> Result<(), ImageError> {
    let Ok(names) = xattr::list(src) else {
        return Ok(());
    };
    for name in names {
        let key = name.to_string_lossy();
        if key.starts_with("trusted.overlay.") || key.starts_with("user.overlay.") {
            continue;
        }
        let Ok(Some(value)) = xattr::get(src, &name) else {
            continue;
        };
        if let Err(e) = xattr::set(dst, &name, &value) {
            if strict && e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(ImageError::io("setting xattr on", dst, e));
            }
            tracing::debug!(path = ?dst, xattr = %key, err = %e, "xattr not copied");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whiteouts_are_matched_to_their_parent_directory() {
        let mut c = Changes::default();
        c.whiteouts.insert("etc/gone".into());
        c.whiteouts.insert("top".into());
        assert_eq!(whiteouts_in(&c, "etc").collect::<Vec<_>>(), vec!["gone"]);
        assert_eq!(whiteouts_in(&c, "").collect::<Vec<_>>(), vec!["top"]);
    }

    #[test]
    fn a_whiteout_under_a_lower_symlink_does_not_reach_outside() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("victim"), b"x").unwrap();
        let lower = tmp.path().join("lower");
        fs::create_dir(&lower).unwrap();
        std::os::unix::fs::symlink(&outside, lower.join("evil")).unwrap();
        let upper = tmp.path().join("upper");
        fs::create_dir_all(upper.join("evil")).unwrap();
        let mut changes = Changes::default();
        changes.whiteouts.insert("evil/victim".into());
        let dest = tmp.path().join("dest");
        fs::create_dir(&dest).unwrap();
        let layers = [
            CopyLayer {
                fs: lower,
                changes: Changes::default(),
            },
            CopyLayer { fs: upper, changes },
        ];
        copy_layers(&layers, &dest, false).unwrap();
        assert!(outside.join("victim").exists());
        assert!(fs::symlink_metadata(dest.join("evil")).unwrap().is_dir());
    }
}

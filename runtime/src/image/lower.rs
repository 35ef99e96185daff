//! Hard links to files of lower layers: where the merged view of the layers below finds a
//! path, so that the unpacker can copy the file up into the layer it unpacks.
//!
//! containerd applies a layer onto a mount of its parents, so a hard link in a layer may
//! name a file that only a lower layer has (some image builders write such layers); the
//! link then joins the copied-up file, as overlayfs copies a file up before linking it. A
//! snapshot here holds only its own layer, so [`find`] looks the target up in the lower
//! snapshots, top first, as overlayfs would merge them: a whiteout of the path or of an
//! ancestor, or an opaque ancestor directory, in a layer hides the layers below it; a
//! non-directory at a parent component hides everything below it.
//!
//! Guarantees: every component is opened by name from its parent's descriptor with
//! `RESOLVE_NO_SYMLINKS`, so the lookup never leaves a lower snapshot, and a symlinked
//! parent in a lower layer makes the target "missing" (containerd would follow it inside
//! the merged root; images do not rely on that). Only regular files are found (a
//! `user.overlay.whiteout` file is a whiteout, not a file).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path};

use super::sys;
use super::whiteout::{self, Changes};

/// A layer below the one being unpacked: its unpacked tree and its whiteouts.
#[derive(Debug, Clone, Copy)]
pub struct LowerLayer<'a> {
    pub fs: &'a Path,
    pub changes: &'a Changes,
}

/// A regular file found below: open for reading, with its metadata and that of its parent
/// directories (outermost first), for the copy-up.
pub(crate) struct Found {
    pub file: File,
    pub stat: libc::stat,
    pub parents: Vec<libc::stat>,
}

/// Whether `changes` hides `rel` from the layers below: `rel` or an ancestor is whited
/// out, or an ancestor directory is opaque.
pub(crate) fn hides(changes: &Changes, rel: &str) -> bool {
    if changes.opaque_dirs.contains("") {
        return true;
    }
    let ends = rel.match_indices('/').map(|(i, _)| i).chain([rel.len()]);
    ends.into_iter().any(|end| {
        let prefix = &rel[..end];
        changes.whiteouts.contains(prefix)
            || (end < rel.len() && changes.opaque_dirs.contains(prefix))
    })
}

/// The metadata the merged view of `lowers` (bottom first) gives each directory
/// `comps[..=k]`, for `k` in `from..comps.len()`; `None` where it has no directory there.
/// One walk per layer, top first: a layer's directory counts unless a layer above it put
/// a non-directory on the path or hides it (whiteout, opaque ancestor).
pub(crate) fn dir_stats(
    lowers: &[LowerLayer<'_>],
    comps: &[&OsStr],
    from: usize,
) -> io::Result<Vec<Option<libc::stat>>> {
    let n = comps.len();
    let mut out: Vec<Option<libc::stat>> = vec![None; n.saturating_sub(from)];
    let mut hidden = vec![false; out.len()];
    // As `Changes` spells them (callers keep `comps` short: this is quadratic).
    let prefixes: Vec<String> = (from..n)
        .map(|k| {
            let p: std::path::PathBuf = comps[..=k].iter().collect();
            p.to_string_lossy().into_owned()
        })
        .collect();
    for layer in lowers.iter().rev() {
        let mut dir: OwnedFd = sys::open_dir(layer.fs)?;
        for (k, c) in comps.iter().enumerate() {
            match sys::open_dir_beneath(dir.as_fd(), Path::new(c), libc::RESOLVE_NO_SYMLINKS) {
                Ok(fd) => {
                    if let Some(i) = k.checked_sub(from) {
                        if out[i].is_none() && !hidden[i] {
                            out[i] = Some(sys::fstat(fd.as_fd())?);
                        }
                    }
                    dir = fd;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
                Err(_) => {
                    // A file, symlink or whiteout here shadows everything below it.
                    for h in hidden.iter_mut().skip(k.saturating_sub(from)) {
                        *h = true;
                    }
                    break;
                }
            }
        }
        for (i, h) in hidden.iter_mut().enumerate() {
            *h = *h || hides(layer.changes, &prefixes[i]);
        }
    }
    Ok(out)
}

/// What one lower layer says about a path.
enum Lookup {
    Found(Found),
    /// Nothing there: look further down (unless this layer hides it).
    Absent,
    /// Something else is there (a file at a parent, a symlink, a directory, a whiteout):
    /// the merged view has no regular file at the path.
    Shadowed,
}

fn lookup(layer: &LowerLayer<'_>, rel: &Path) -> io::Result<Lookup> {
    let mut dir: OwnedFd = sys::open_dir(layer.fs)?;
    let mut parents = Vec::new();
    let comps: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some((name, parent_comps)) = comps.split_last() else {
        return Ok(Lookup::Shadowed);
    };
    for c in parent_comps {
        match sys::open_dir_beneath(dir.as_fd(), Path::new(c), libc::RESOLVE_NO_SYMLINKS) {
            Ok(fd) => {
                parents.push(sys::fstat(fd.as_fd())?);
                dir = fd;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Lookup::Absent),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP)) => {
                return Ok(Lookup::Shadowed)
            }
            Err(e) => return Err(e),
        }
    }
    let Some(st) = sys::lstat_at(dir.as_fd(), name)? else {
        return Ok(Lookup::Absent);
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(Lookup::Shadowed);
    }
    let by_fd = Path::new("/proc/self/fd")
        .join(dir.as_raw_fd().to_string())
        .join(name);
    if whiteout::is_xattr_whiteout(&by_fd, st.st_mode, st.st_size) {
        return Ok(Lookup::Shadowed);
    }
    let fd = sys::open_beneath(
        dir.as_fd(),
        Path::new(name),
        libc::O_RDONLY | libc::O_NOFOLLOW,
        libc::RESOLVE_NO_SYMLINKS,
    )?;
    Ok(Lookup::Found(Found {
        file: File::from(fd),
        stat: st,
        parents,
    }))
}

/// The regular file `rel` in the merged view of `lowers` (bottom first), if any.
pub(crate) fn find(lowers: &[LowerLayer<'_>], rel: &Path) -> io::Result<Option<Found>> {
    let key = rel.to_string_lossy();
    for layer in lowers.iter().rev() {
        match lookup(layer, rel)? {
            Lookup::Found(f) => return Ok(Some(f)),
            Lookup::Shadowed => return Ok(None),
            Lookup::Absent if hides(layer.changes, &key) => return Ok(None),
            Lookup::Absent => {}
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whiteouts_and_opaque_ancestors_hide_lower_paths() {
        let mut c = Changes::default();
        c.whiteouts.insert("etc/gone".into());
        c.opaque_dirs.insert("var/opq".into());
        assert!(hides(&c, "etc/gone"));
        assert!(hides(&c, "etc/gone/below"));
        assert!(!hides(&c, "etc/gone2"));
        assert!(hides(&c, "var/opq/file"));
        // The opaque directory itself is still there.
        assert!(!hides(&c, "var/opq"));
        assert!(!hides(&c, "etc/kept"));
        c.opaque_dirs.insert(String::new());
        assert!(hides(&c, "anything"));
    }
}

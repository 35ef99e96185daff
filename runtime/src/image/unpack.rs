//! Safe extraction of one layer tar into a directory.
//!
//! ```text
//!  tar entry ──► clean path ──► resolve parent beneath target ──► create final component
//!               (refuse ..)     (DirCache: openat2 per new        (O_EXCL / *at calls that
//!                                component, symlinks resolved      never follow a symlink)
//!                                beneath the root, mkdirat)
//! ```
//!
//! Guarantees (the contract the tests prove with a canary beside the target):
//! - nothing outside `target` is created, written, linked, chmod'ed or removed: every parent
//!   is resolved beneath the target's descriptor (see `beneath.rs`), so a symlink
//!   planted by an earlier entry (`evil -> /`, `evil -> ../../..`) makes a later `evil/x`
//!   fail with [`UnsafeEntryReason::SymlinkEscape`] instead of writing through it; symlinks
//!   that stay inside the target are followed as a normal tar would;
//! - a leading `/` is treated as relative; any `..` component is refused, in entry names
//!   and in hard-link targets;
//! - hard links must name an entry that already exists inside the target;
//! - character and block devices are refused (all of them); FIFOs are created (containerd
//!   allows them and they carry no privilege);
//! - at most `max_bytes` of file content and `max_entries` entries per layer; the work is
//!   linear in the layer whatever its depth (no depth limit: a 10 000-deep layer unpacks in
//!   about a second; paths longer than `PATH_MAX` work, as every call is relative);
//! - `trusted.overlay.*`/`user.overlay.*` xattrs in the tar are dropped, so a layer cannot
//!   forge overlay state (opaque dirs, redirects); other xattrs are applied as containerd
//!   applies them (see `set_xattrs`: unsupported ones and capabilities on directories are
//!   skipped with a warning, other refusals fail the entry as root).
//!
//! Whiteouts (see `whiteout.rs`) are always returned in [`Changes`]; with
//! [`WhiteoutFormat::Overlay`] or [`WhiteoutFormat::UserXattr`] they are also written as
//! overlayfs expects them. Ownership is applied only with `preserve_owner` (root);
//! otherwise files belong to the unpacking user and a non-root owner is recorded in an xattr
//! (see `owners.rs`). Directory modes and times are applied after
//! the last entry, so a read-only directory can still receive its children. xattrs are not
//! set on symlinks. On error the target is left partly filled: callers unpack into a temp
//! directory and remove it.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::beneath::{clean_path, DirCache, Resolve};
use super::error::{ImageError, UnsafeEntryReason};
use super::lower::{self, LowerLayer};
use super::sys;
use super::whiteout::{self, Whiteout, OVERLAY_OPAQUE_XATTR};
use super::whiteout::{Changes, WhiteoutFormat};
use super::whiteout::{USER_OPAQUE_XATTR, USER_WHITEOUT_XATTR};

/// Limits on one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Bytes of regular-file content.
    pub max_bytes: u64,
    /// Entries of any kind.
    pub max_entries: u64,
}

/// Options of [`unpack_layer`].
#[derive(Debug, Clone, Copy)]
pub struct UnpackOptions {
    pub limits: UnpackLimits,
    pub whiteouts: WhiteoutFormat,
    /// Apply the uid/gid from the tar (needs root).
    pub preserve_owner: bool,
}

/// What an unpack did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackReport {
    pub entries: u64,
    pub bytes: u64,
    pub changes: Changes,
    /// Entries whose non-root owner was recorded in an xattr (unprivileged, see `owners.rs`).
    pub owned_entries: u64,
}

/// Unpacks the tar stream `reader` into the existing directory `target`. `layer` names the
/// layer in errors. The reader is not drained past the end of the archive.
pub fn unpack_layer(
    reader: &mut dyn Read,
    target: &Path,
    opts: &UnpackOptions,
    layer: &str,
) -> Result<UnpackReport, ImageError> {
    unpack_layer_onto(reader, target, &[], opts, layer)
}

/// [`unpack_layer`] for a layer that sits on `lowers` (bottom first): a hard link to a file
/// only they have copies that file up first (see `lower.rs`).
pub fn unpack_layer_onto(
    reader: &mut dyn Read,
    target: &Path,
    lowers: &[LowerLayer<'_>],
    opts: &UnpackOptions,
    layer: &str,
) -> Result<UnpackReport, ImageError> {
    let root = sys::open_dir(target).map_err(|e| ImageError::io("opening", target, e))?;
    let cache = || DirCache::new(root.as_fd()).map_err(|e| ImageError::io("opening", target, e));
    let mut u = Unpacker {
        parents: cache()?,
        link_targets: cache()?,
        lowers,
        root,
        target,
        opts,
        layer,
        report: UnpackReport::default(),
        dirs: Vec::new(),
        buf: Vec::new(),
    };
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(|e| u.read_err(e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| u.read_err(e))?;
        u.entry(&mut entry)?;
    }
    if opts.whiteouts == WhiteoutFormat::UserXattr {
        u.write_xattr_whiteouts()?;
    }
    u.finish_dirs()?;
    Ok(u.report)
}

/// Deepest implicitly created directory that looks up its metadata in the lower layers.
const MAX_INHERIT_DEPTH: usize = 256;

/// Copies the xattrs of a copied-up file (but overlay's own); refusals are only logged, as
/// the file system of the snapshot may support fewer.
fn copy_xattrs(from: &std::fs::File, to: &std::fs::File) {
    use xattr::FileExt;
    let Ok(names) = from.list_xattr() else {
        return;
    };
    for name in names {
        let key = name.to_string_lossy();
        if key.starts_with("trusted.overlay.") || key.starts_with("user.overlay.") {
            continue;
        }
        if let Ok(Some(value)) = from.get_xattr(&name) {
            if let Err(e) = to.set_xattr(&name, &value) {
                tracing::debug!(xattr = %key, err = %e, "xattr of a copied-up file not copied");
            }
        }
    }
}

/// Metadata of one entry, read from its header and PAX records.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    xattrs: Vec<(String, Vec<u8>)>,
}

impl Meta {
    /// The metadata of a directory of a lower layer, for its copy in this one.
    fn of_dir(st: &libc::stat) -> Self {
        Self {
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            mtime: st.st_mtime,
            xattrs: Vec::new(),
        }
    }
}

struct Unpacker<'a> {
    root: OwnedFd,
    /// Resolves entries' parent directories.
    parents: DirCache,
    /// Resolves hard-link targets' directories (a second path, so that links to one
    /// directory from entries in another stay cheap).
    link_targets: DirCache,
    lowers: &'a [LowerLayer<'a>],
    target: &'a Path,
    opts: &'a UnpackOptions,
    layer: &'a str,
    report: UnpackReport,
    /// Directories whose mode and times are applied at the end.
    dirs: Vec<(PathBuf, Meta)>,
    /// The file copies' buffer: a file up to its size in one write.
    buf: Vec<u8>,
}

/// The largest write of a file's content.
const COPY_BUF: usize = 1 << 20;

/// Copies `from` to its end into `to` through `buf` (grown up to [`COPY_BUF`]), in writes
/// as large as the buffer, where `io::copy` would write 8 KiB at a time.
fn copy_through(
    buf: &mut Vec<u8>,
    from: &mut impl Read,
    to: &mut impl io::Write,
) -> io::Result<u64> {
    if buf.len() < COPY_BUF {
        buf.resize(COPY_BUF, 0);
    }
    let mut total = 0u64;
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            match from.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if filled == 0 {
            return Ok(total);
        }
        to.write_all(&buf[..filled])?;
        total += filled as u64;
        if filled < buf.len() {
            return Ok(total);
        }
    }
}

impl<'a> Unpacker<'a> {
    fn read_err(&self, source: io::Error) -> ImageError {
        ImageError::ReadLayer {
            layer: self.layer.to_owned(),
            source,
        }
    }

    fn unsafe_entry(&self, entry: &str, reason: UnsafeEntryReason) -> ImageError {
        tracing::warn!(layer = %self.layer, %entry, %reason, "refusing layer entry");
        ImageError::UnsafeEntry {
            layer: self.layer.to_owned(),
            entry: entry.to_owned(),
            reason,
        }
    }

    fn write_err(&self, entry: &str, rel: &Path, source: io::Error) -> ImageError {
        if sys::is_disk_full(&source) {
            ImageError::DiskFull {
                path: self.target.join(rel),
            }
        } else {
            ImageError::WriteEntry {
                layer: self.layer.to_owned(),
                entry: entry.to_owned(),
                source,
            }
        }
    }

    fn resolve_err(&self, entry: &str, rel: &Path, r: Resolve) -> ImageError {
        match r {
            Resolve::Unsafe(reason) => self.unsafe_entry(entry, reason),
            Resolve::Io(e) => self.write_err(entry, rel, e),
        }
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ImageError> {
        let raw = entry.path().map_err(|e| self.read_err(e))?.into_owned();
        let name = raw.display().to_string();
        self.report.entries += 1;
        if self.report.entries > self.opts.limits.max_entries {
            return Err(ImageError::TooManyEntries {
                layer: self.layer.to_owned(),
                entry: name,
                limit: self.opts.limits.max_entries,
            });
        }
        let rel = clean_path(&raw).map_err(|r| self.unsafe_entry(&name, r))?;
        let kind = entry.header().entry_type();
        let Some(file_name) = rel.file_name().map(OsStr::to_os_string) else {
            // The layer root itself ("./" or "/"): keep the target's own metadata.
            return Ok(());
        };
        let parent_rel = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        let fname = file_name.to_string_lossy().into_owned();
        if let Some(w) = whiteout::classify(&fname) {
            return self.whiteout(&name, &parent_rel, w);
        }
        use tar::EntryType as T;
        if matches!(kind, T::Char | T::Block) {
            return Err(self.unsafe_entry(&name, UnsafeEntryReason::DeviceNode));
        }
        let meta = self.meta(entry)?;
        if !self.opts.preserve_owner
            && meta
                .xattrs
                .iter()
                .any(|(k, _)| k == super::owners::OWNER_XATTR)
        {
            self.report.owned_entries += 1;
        }
        let parent = self
            .open_parent(&parent_rel, true)
            .map_err(|r| self.resolve_err(&name, &rel, r))?;
        let pfd = parent.as_fd();
        match kind {
            T::Directory => self.directory(&name, &rel, pfd, &file_name, meta),
            T::Regular | T::Continuous | T::GNUSparse => {
                self.regular(&name, &rel, pfd, &file_name, entry, meta)
            }
            T::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| self.read_err(e))?
                    .map(|c| c.into_owned())
                    .ok_or_else(|| self.unsafe_entry(&name, UnsafeEntryReason::InvalidName))?;
                self.symlink(&name, &rel, pfd, &file_name, &target, meta)
            }
            T::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| self.read_err(e))?
                    .map(|c| c.into_owned())
                    .ok_or_else(|| self.unsafe_entry(&name, UnsafeEntryReason::InvalidName))?;
                self.hard_link(&name, &rel, pfd, &file_name, &target)
            }
            T::Fifo => {
                self.replace(&name, &rel, pfd, &file_name, false)?;
                sys::mknod_at(pfd, &file_name, libc::S_IFIFO | (meta.mode & 0o777), 0)
                    .map_err(|e| self.write_err(&name, &rel, e))?;
                self.apply_link_meta(&name, &rel, pfd, &file_name, &meta)
            }
            other => {
                tracing::debug!(layer = %self.layer, entry = %name, kind = ?other, "skipping tar entry of unsupported kind");
                Ok(())
            }
        }
    }

    fn meta<R: Read>(&self, entry: &mut tar::Entry<'_, R>) -> Result<Meta, ImageError> {
        // Like Go's archive/tar (containerd), an empty or malformed numeric field reads as 0.
        let h = entry.header();
        let mut meta = Meta {
            mode: h.mode().unwrap_or(0) & 0o7777,
            uid: u32::try_from(h.uid().unwrap_or(0)).unwrap_or(0),
            gid: u32::try_from(h.gid().unwrap_or(0)).unwrap_or(0),
            mtime: i64::try_from(h.mtime().unwrap_or(0)).unwrap_or(0),
            xattrs: Vec::new(),
        };
        if let Some(pax) = entry.pax_extensions().map_err(|e| self.read_err(e))? {
            for ext in pax {
                let ext = ext.map_err(|e| self.read_err(e))?;
                let Ok(key) = ext.key() else { continue };
                let value = ext.value().ok();
                match key {
                    "uid" => meta.uid = value.and_then(|v| v.parse().ok()).unwrap_or(meta.uid),
                    "gid" => meta.gid = value.and_then(|v| v.parse().ok()).unwrap_or(meta.gid),
                    "mtime" => {
                        let secs = value.and_then(|v| v.split('.').next()?.parse().ok());
                        meta.mtime = secs.unwrap_or(meta.mtime);
                    }
                    _ => {
                        if let Some(x) = key.strip_prefix("SCHILY.xattr.") {
                            if !x.starts_with("trusted.overlay.")
                                && !x.starts_with("user.overlay.")
                                && x != super::owners::OWNER_XATTR
                            {
                                meta.xattrs.push((x.to_owned(), ext.value_bytes().to_vec()));
                            }
                        }
                    }
                }
            }
        }
        if !self.opts.preserve_owner {
            // Applied inside the container's user namespace (see `owners.rs`).
            if let Some(owner) = super::owners::record(meta.uid, meta.gid) {
                meta.xattrs
                    .push((super::owners::OWNER_XATTR.to_owned(), owner));
            }
        }
        Ok(meta)
    }

    /// The directory `rel` (see [`DirCache`]), as a descriptor of its own so that the
    /// caches can move on.
    fn open_parent(&mut self, rel: &Path, create: bool) -> Result<OwnedFd, Resolve> {
        let fd = self
            .parents
            .open(rel, create)?
            .try_clone_to_owned()
            .map_err(Resolve::Io)?;
        if let Some(from) = self.parents.created_from() {
            self.inherit_lower_dirs(rel, from).map_err(Resolve::Io)?;
        }
        Ok(fd)
    }

    /// Directories created implicitly (for an entry whose parents the layer does not list)
    /// take the metadata of the same directories below, as containerd's `mkparent` does
    /// (else the merged view would show them 0755, root-owned and new). Skipped for paths
    /// deeper than [`MAX_INHERIT_DEPTH`], which real layers never need.
    fn inherit_lower_dirs(&mut self, rel: &Path, from: usize) -> io::Result<()> {
        let comps: Vec<&OsStr> = rel.iter().collect();
        if self.lowers.is_empty() || comps.len() > MAX_INHERIT_DEPTH {
            return Ok(());
        }
        let stats = lower::dir_stats(self.lowers, &comps, from)?;
        for (k, st) in (from..).zip(stats) {
            let Some(st) = st else { continue };
            self.dirs
                .push((comps[..=k].iter().collect(), Meta::of_dir(&st)));
        }
        Ok(())
    }

    /// Removes whatever is at `name` so that a new entry can take its place. A directory is
    /// kept when `keep_dir` (a directory entry over an existing directory merges).
    fn replace(
        &mut self,
        entry: &str,
        rel: &Path,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        keep_dir: bool,
    ) -> Result<bool, ImageError> {
        let existing = sys::lstat_at(dir, name).map_err(|e| self.write_err(entry, rel, e))?;
        match existing {
            None => Ok(false),
            Some(st) if keep_dir && st.st_mode & libc::S_IFMT == libc::S_IFDIR => Ok(true),
            Some(_) => {
                // The caches may hold what this removes (or a path through it).
                self.parents.removed();
                self.link_targets.clear();
                sys::remove_at(dir, name).map_err(|e| self.write_err(entry, rel, e))?;
                Ok(false)
            }
        }
    }

    fn directory(
        &mut self,
        entry: &str,
        rel: &Path,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        meta: Meta,
    ) -> Result<(), ImageError> {
        match sys::mkdir_at(dir, name, 0o700) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !self.replace(entry, rel, dir, name, true)? {
                    sys::mkdir_at(dir, name, 0o700).map_err(|e| self.write_err(entry, rel, e))?;
                }
            }
            r => r.map_err(|e| self.write_err(entry, rel, e))?,
        }
        if self.opts.preserve_owner {
            sys::lchown_at(dir, name, meta.uid, meta.gid)
                .map_err(|e| self.write_err(entry, rel, e))?;
        }
        if !meta.xattrs.is_empty() {
            let fd = sys::open_dir_beneath(dir, Path::new(name), libc::RESOLVE_NO_SYMLINKS)
                .map_err(|e| self.write_err(entry, rel, e))?;
            self.set_xattrs(entry, rel, fd.as_fd(), &meta, false)?;
        }
        self.dirs.push((rel.to_path_buf(), meta));
        Ok(())
    }

    fn regular<R: Read>(
        &mut self,
        entry_name: &str,
        rel: &Path,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        entry: &mut tar::Entry<'_, R>,
        meta: Meta,
    ) -> Result<(), ImageError> {
        let size = entry.size();
        let total = self.report.bytes.saturating_add(size);
        if total > self.opts.limits.max_bytes {
            return Err(ImageError::LayerTooLarge {
                layer: self.layer.to_owned(),
                entry: entry_name.to_owned(),
                limit: self.opts.limits.max_bytes,
            });
        }
        self.report.bytes = total;
        // O_EXCL first: an entry's name is new in its layer but for a repeated entry, which
        // is replaced (one lookup less per file than looking first).
        let mut file = match sys::create_file_at(dir, name) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                self.replace(entry_name, rel, dir, name, false)?;
                sys::create_file_at(dir, name)
            }
            r => r,
        }
        .map_err(|e| self.write_err(entry_name, rel, e))?;
        // Never trust the stream to stop at the header's size.
        let copied = copy_through(&mut self.buf, &mut (&mut *entry).take(size), &mut file)
            .map_err(|e| {
                if sys::is_disk_full(&e) {
                    self.write_err(entry_name, rel, e)
                } else {
                    self.read_err(e)
                }
            })?;
        if copied != size {
            return Err(self.read_err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("entry {entry_name:?} is truncated"),
            )));
        }
        let fd = file.as_fd();
        if self.opts.preserve_owner {
            sys::lchown_at(fd, OsStr::new(""), meta.uid, meta.gid)
                .map_err(|e| self.write_err(entry_name, rel, e))?;
        }
        // chmod after chown: chown clears setuid/setgid bits.
        sys::fchmod(fd, meta.mode).map_err(|e| self.write_err(entry_name, rel, e))?;
        self.set_xattrs(entry_name, rel, fd, &meta, true)?;
        sys::set_times(fd, meta.mtime, 0).map_err(|e| self.write_err(entry_name, rel, e))
    }

    fn symlink(
        &mut self,
        entry: &str,
        rel: &Path,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        target: &Path,
        meta: Meta,
    ) -> Result<(), ImageError> {
        self.replace(entry, rel, dir, name, false)?;
        sys::symlink_at(target.as_os_str(), dir, name)
            .map_err(|e| self.write_err(entry, rel, e))?;
        self.apply_link_meta(entry, rel, dir, name, &meta)
    }

    /// Owner and times of something that cannot be opened (symlink, FIFO).
    fn apply_link_meta(
        &self,
        entry: &str,
        rel: &Path,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        meta: &Meta,
    ) -> Result<(), ImageError> {
        if self.opts.preserve_owner {
            sys::lchown_at(dir, name, meta.uid, meta.gid)
                .map_err(|e| self.write_err(entry, rel, e))?;
        }
        sys::set_times_at(dir, name, meta.mtime, 0).map_err(|e| self.write_err(entry, rel, e))
    }

    fn hard_link(
        &mut self,
        entry: &str,
        rel: &Path,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        target: &Path,
    ) -> Result<(), ImageError> {
        let outside = |_| self.unsafe_entry(entry, UnsafeEntryReason::HardLinkOutside);
        let trel = clean_path(target).map_err(outside)?;
        let Some(tname) = trel.file_name() else {
            return Err(self.unsafe_entry(entry, UnsafeEntryReason::HardLinkToDirectory));
        };
        let tparent_rel = trel.parent().unwrap_or(Path::new(""));
        let (tparent, st) = match self.link_target(entry, rel, tparent_rel, tname)? {
            Some(found) => found,
            None if self.copy_up(entry, rel, &trel)? => self
                .link_target(entry, rel, tparent_rel, tname)?
                .ok_or_else(|| {
                    self.unsafe_entry(entry, UnsafeEntryReason::HardLinkTargetMissing)
                })?,
            None => return Err(self.unsafe_entry(entry, UnsafeEntryReason::HardLinkTargetMissing)),
        };
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(self.unsafe_entry(entry, UnsafeEntryReason::HardLinkToDirectory));
        }
        if let Some(existing) =
            sys::lstat_at(dir, name).map_err(|e| self.write_err(entry, rel, e))?
        {
            if existing.st_dev == st.st_dev && existing.st_ino == st.st_ino {
                return Ok(());
            }
        }
        self.replace(entry, rel, dir, name, false)?;
        sys::link_at(tparent.as_fd(), tname, dir, name).map_err(|e| self.write_err(entry, rel, e))
    }

    /// The directory holding a hard link's target in this layer, and the target's stat;
    /// `None` if it is not (yet) in this layer.
    fn link_target(
        &mut self,
        entry: &str,
        rel: &Path,
        tparent_rel: &Path,
        tname: &OsStr,
    ) -> Result<Option<(OwnedFd, libc::stat)>, ImageError> {
        let tparent = match self.link_targets.open(tparent_rel, false) {
            Ok(fd) => fd
                .try_clone_to_owned()
                .map_err(|e| self.write_err(entry, rel, e))?,
            Err(Resolve::Io(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(Resolve::Unsafe(UnsafeEntryReason::SymlinkEscape)) => {
                return Err(self.unsafe_entry(entry, UnsafeEntryReason::HardLinkOutside))
            }
            Err(other) => return Err(self.resolve_err(entry, rel, other)),
        };
        let st =
            sys::lstat_at(tparent.as_fd(), tname).map_err(|e| self.write_err(entry, rel, e))?;
        Ok(st.map(|st| (tparent, st)))
    }

    /// Copies the file `trel` up from the lower layers into this one, with the parent
    /// directories it lacks (their metadata from below), as overlayfs does before linking
    /// a lower file. `false` when the merged view below has no regular file there (or this
    /// layer already deleted it, or put something else on its path).
    fn copy_up(&mut self, entry: &str, rel: &Path, trel: &Path) -> Result<bool, ImageError> {
        if self.lowers.is_empty() || lower::hides(&self.report.changes, &trel.to_string_lossy()) {
            return Ok(false);
        }
        let io_err = |e| self.write_err(entry, rel, e);
        let Some(mut found) = lower::find(self.lowers, trel).map_err(io_err)? else {
            return Ok(false);
        };
        let (Some(name), Some(parent)) = (trel.file_name(), trel.parent()) else {
            return Ok(false);
        };
        let mut dir = self.root.try_clone().map_err(io_err)?;
        let mut prefix = PathBuf::new();
        let mut new_dirs = Vec::new();
        for (c, st) in parent.iter().zip(&found.parents) {
            prefix.push(c);
            match sys::lstat_at(dir.as_fd(), c).map_err(io_err)? {
                None => {
                    sys::mkdir_at(dir.as_fd(), c, 0o700).map_err(io_err)?;
                    if self.opts.preserve_owner {
                        sys::lchown_at(dir.as_fd(), c, st.st_uid, st.st_gid).map_err(io_err)?;
                    }
                    new_dirs.push((prefix.clone(), Meta::of_dir(st)));
                }
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
                Some(_) => return Ok(false),
            }
            dir = sys::open_dir_beneath(dir.as_fd(), Path::new(c), libc::RESOLVE_NO_SYMLINKS)
                .map_err(io_err)?;
        }
        if sys::lstat_at(dir.as_fd(), name).map_err(io_err)?.is_some() {
            return Ok(false);
        }
        let st = found.stat;
        let size = u64::try_from(st.st_size).unwrap_or(0);
        let total = self.report.bytes.saturating_add(size);
        if total > self.opts.limits.max_bytes {
            return Err(ImageError::LayerTooLarge {
                layer: self.layer.to_owned(),
                entry: entry.to_owned(),
                limit: self.opts.limits.max_bytes,
            });
        }
        let mut out = sys::create_file_at(dir.as_fd(), name).map_err(io_err)?;
        io::copy(&mut (&mut found.file).take(size), &mut out).map_err(io_err)?;
        if self.opts.preserve_owner {
            sys::lchown_at(out.as_fd(), OsStr::new(""), st.st_uid, st.st_gid).map_err(io_err)?;
        }
        sys::fchmod(out.as_fd(), st.st_mode & 0o7777).map_err(io_err)?;
        copy_xattrs(&found.file, &out);
        let nanos = u32::try_from(st.st_mtime_nsec).unwrap_or(0);
        sys::set_times(out.as_fd(), st.st_mtime, nanos).map_err(io_err)?;
        self.report.bytes = total;
        self.dirs.extend(new_dirs);
        tracing::debug!(layer = %self.layer, %entry, target = ?trel, "hard link target copied up from a lower layer");
        Ok(true)
    }

    fn whiteout(&mut self, entry: &str, parent: &Path, w: Whiteout<'_>) -> Result<(), ImageError> {
        let hidden = match w {
            Whiteout::Hide(h) => h,
            Whiteout::Invalid => {
                return Err(self.unsafe_entry(entry, UnsafeEntryReason::InvalidWhiteout))
            }
            Whiteout::AufsMeta => {
                tracing::debug!(layer = %self.layer, %entry, "skipping aufs metadata entry");
                return Ok(());
            }
            Whiteout::Opaque => "",
        };
        let pfd = self
            .open_parent(parent, true)
            .map_err(|r| self.resolve_err(entry, parent, r))?;
        let overlay = self.opts.whiteouts == WhiteoutFormat::Overlay;
        if hidden.is_empty() {
            let opaque_xattr = match self.opts.whiteouts {
                WhiteoutFormat::Overlay => Some(OVERLAY_OPAQUE_XATTR),
                WhiteoutFormat::UserXattr => Some(USER_OPAQUE_XATTR),
                WhiteoutFormat::Sidecar => None,
            };
            if let Some(key) = opaque_xattr {
                sys::fsetxattr(pfd.as_fd(), key, b"y")
                    .map_err(|e| self.write_err(entry, parent, e))?;
            }
            let dir = parent.to_string_lossy().into_owned();
            self.report.changes.opaque_dirs.insert(dir);
            return Ok(());
        }
        let rel = parent.join(hidden);
        if overlay {
            let name = OsStr::new(hidden);
            self.replace(entry, &rel, pfd.as_fd(), name, false)?;
            sys::mknod_at(pfd.as_fd(), name, libc::S_IFCHR, 0)
                .map_err(|e| self.write_err(entry, &rel, e))?;
        }
        let path = rel.to_string_lossy().into_owned();
        self.report.changes.whiteouts.insert(path);
        Ok(())
    }

    /// Writes the whiteouts of [`WhiteoutFormat::UserXattr`] once the layer's own entries
    /// exist (so their order in the tar does not matter, and a directory made opaque later
    /// never holds a whiteout overlayfs would not look for), before directory modes are
    /// applied (a read-only directory refuses user xattrs). For each whited-out path: in a
    /// directory this layer makes opaque, nothing (the opaque mark hides all below); where
    /// the layer has its own directory of that name, that directory becomes opaque (the lower
    /// one is deleted, the layer's stays); where it has another entry, nothing (it hides the
    /// lower one); else a zero-size file with [`USER_WHITEOUT_XATTR`], its directory marked
    /// `user.overlay.opaque=x`. A parent a later entry replaced by a non-directory is skipped.
    fn write_xattr_whiteouts(&mut self) -> Result<(), ImageError> {
        let whiteouts: Vec<String> = self.report.changes.whiteouts.iter().cloned().collect();
        let mut marked: std::collections::BTreeSet<String> = Default::default();
        for w in whiteouts {
            let (parent, name) = w.rsplit_once('/').unwrap_or(("", w.as_str()));
            if self.report.changes.opaque_dirs.contains(parent) {
                continue;
            }
            let (prel, rel) = (Path::new(parent), Path::new(&w));
            let pfd = match self.parents.open(prel, false) {
                Ok(fd) => fd
                    .try_clone_to_owned()
                    .map_err(|e| self.write_err(&w, rel, e))?,
                Err(Resolve::Io(e))
                    if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
                {
                    continue
                }
                Err(other) => return Err(self.resolve_err(&w, rel, other)),
            };
            let name = OsStr::new(name);
            match sys::lstat_at(pfd.as_fd(), name).map_err(|e| self.write_err(&w, rel, e))? {
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    let fd = sys::open_dir_beneath(
                        pfd.as_fd(),
                        Path::new(name),
                        libc::RESOLVE_NO_SYMLINKS,
                    )
                    .map_err(|e| self.write_err(&w, rel, e))?;
                    sys::fsetxattr(fd.as_fd(), USER_OPAQUE_XATTR, b"y")
                        .map_err(|e| self.write_err(&w, rel, e))?;
                }
                Some(_) => {}
                None => {
                    let file = sys::create_file_at(pfd.as_fd(), name)
                        .map_err(|e| self.write_err(&w, rel, e))?;
                    sys::fsetxattr(file.as_fd(), USER_WHITEOUT_XATTR, b"y")
                        .map_err(|e| self.write_err(&w, rel, e))?;
                    if marked.insert(parent.to_owned()) {
                        sys::fsetxattr(pfd.as_fd(), USER_OPAQUE_XATTR, b"x")
                            .map_err(|e| self.write_err(&w, prel, e))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies the entry's xattrs as containerd does: what the file system refuses as
    /// unsupported is skipped with a warning, anything else refused fails the entry, except
    /// `security.capability` on a non-regular file (capabilities only act on executed
    /// files; the kernel refuses some values there) and, unprivileged, anything refused
    /// (`trusted.*` and `security.*` need root).
    fn set_xattrs(
        &self,
        entry: &str,
        rel: &Path,
        fd: BorrowedFd<'_>,
        meta: &Meta,
        regular: bool,
    ) -> Result<(), ImageError> {
        for (key, value) in &meta.xattrs {
            let Err(e) = sys::fsetxattr(fd, key, value) else {
                continue;
            };
            let unsupported = e.raw_os_error() == Some(libc::EOPNOTSUPP);
            let inert_caps = key == "security.capability" && !regular;
            if unsupported || inert_caps {
                tracing::warn!(layer = %self.layer, %entry, xattr = %key, err = %e, "xattr in layer ignored");
            } else if self.opts.preserve_owner {
                let e = io::Error::new(e.kind(), format!("setting xattr {key}: {e}"));
                return Err(self.write_err(entry, rel, e));
            } else {
                tracing::debug!(layer = %self.layer, %entry, xattr = %key, err = %e, "xattr not applied (unprivileged)");
            }
        }
        Ok(())
    }

    /// Applies directory modes and times once all children exist, each directory after
    /// all of its descendants (so that a read-only one can still be entered until then),
    /// in one walk: sorted by components, the directories form a depth-first order; each is
    /// opened once by name from its parent and left through `..`, never through a symlink.
    /// A directory a later entry replaced (by a file or symlink) is skipped; of a directory
    /// listed twice, the last entry wins.
    fn finish_dirs(&mut self) -> Result<(), ImageError> {
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut path: Vec<(OsString, Option<&Meta>)> = Vec::new();
        // The descriptor of the last directory on `path` (`None`: the root).
        let mut cur: Option<OwnedFd> = None;
        for (i, (rel, meta)) in dirs.iter().enumerate() {
            if dirs.get(i + 1).is_some_and(|(next, _)| next == rel) {
                continue;
            }
            let comps: Vec<&OsStr> = rel
                .components()
                .filter_map(|c| match c {
                    std::path::Component::Normal(n) => Some(n),
                    _ => None,
                })
                .collect();
            let common = path
                .iter()
                .zip(&comps)
                .take_while(|((a, _), b)| a.as_os_str() == **b)
                .count();
            while path.len() > common {
                cur = self.leave_dir(&mut path, cur)?;
            }
            let mut reached = !comps.is_empty();
            for c in &comps[common..] {
                let parent = cur.as_ref().map_or(self.root.as_fd(), |f| f.as_fd());
                match sys::open_dir_beneath(parent, Path::new(c), libc::RESOLVE_NO_SYMLINKS) {
                    Ok(fd) => {
                        path.push((c.to_os_string(), None));
                        cur = Some(fd);
                    }
                    Err(_) => {
                        reached = false;
                        break;
                    }
                }
            }
            if let (true, Some(top)) = (reached, path.last_mut()) {
                top.1 = Some(meta);
            }
        }
        while !path.is_empty() {
            cur = self.leave_dir(&mut path, cur)?;
        }
        Ok(())
    }

    /// Pops the last directory of `path` (open as `cur`), applying its metadata, and
    /// returns its parent's descriptor.
    fn leave_dir(
        &self,
        path: &mut Vec<(OsString, Option<&Meta>)>,
        cur: Option<OwnedFd>,
    ) -> Result<Option<OwnedFd>, ImageError> {
        let (name, meta) = path.pop().unwrap_or_default();
        // Only for errors: building it on every pop would cost O(depth).
        let err = |e: io::Error| {
            let rel: PathBuf = path
                .iter()
                .map(|(n, _)| n.as_os_str())
                .chain([name.as_os_str()])
                .collect();
            self.write_err(&rel.display().to_string(), &rel, e)
        };
        let fd = cur.ok_or_else(|| err(io::Error::from_raw_os_error(libc::EBADF)))?;
        // The parent first: `..` needs search permission on a directory about to lose it.
        let parent = if path.is_empty() {
            None
        } else {
            Some(sys::open_dotdot(fd.as_fd()).map_err(err)?)
        };
        if let Some(meta) = meta {
            if self.opts.preserve_owner {
                sys::lchown_at(fd.as_fd(), OsStr::new(""), meta.uid, meta.gid).map_err(err)?;
            }
            sys::fchmod(fd.as_fd(), meta.mode).map_err(err)?;
            sys::set_times(fd.as_fd(), meta.mtime, 0).map_err(err)?;
        }
        Ok(parent)
    }
}

//! How a layer deletes what lower layers have: OCI whiteouts, and their two on-disk
//! representations in a snapshot.
//!
//! In a layer tar, `dir/.wh.<name>` deletes `dir/<name>` of the layers below, and
//! `dir/.wh..wh..opq` hides everything the layers below have in `dir` (the layer's own
//! entries in `dir` stay). Other `.wh..wh.*` names are aufs bookkeeping and are ignored.
//!
//! A snapshot always records both kinds in [`Changes`] (`changes.json`), which copy mode
//! applies. They are also written the way overlayfs reads a lower layer, so that the
//! snapshots can be overlay-mounted directly:
//!
//! - [`WhiteoutFormat::Overlay`] (root): a 0:0 character device and the xattr
//!   `trusted.overlay.opaque=y` (both need privileges);
//! - [`WhiteoutFormat::UserXattr`] (rootless): what overlayfs mounted with `userxattr` (in a
//!   user namespace) reads, and any user may write (Documentation/filesystems/overlayfs.rst,
//!   "whiteouts and opaque directories", Linux 6.7): a whiteout is a zero-size regular file
//!   with the xattr `user.overlay.whiteout`, and its directory is marked
//!   `user.overlay.opaque=x` ("holds such whiteouts"; the kernel only looks for them there);
//!   an opaque directory has `user.overlay.opaque=y` and needs no whiteouts in it;
//! - [`WhiteoutFormat::Sidecar`]: only [`Changes`]; rootless snapshots unpacked before
//!   `UserXattr` existed, or on a file system without user xattrs. They can only be copied.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
/// The xattr overlayfs reads to treat a lower directory as opaque.
pub(crate) const OVERLAY_OPAQUE_XATTR: &str = "trusted.overlay.opaque";
/// The same, read by overlayfs mounted with `userxattr` (`y`: opaque; `x`: holds whiteouts).
pub(crate) const USER_OPAQUE_XATTR: &str = "user.overlay.opaque";
/// The xattr that makes a zero-size regular file a whiteout for overlayfs with `userxattr`.
pub(crate) const USER_WHITEOUT_XATTR: &str = "user.overlay.whiteout";

/// How whiteouts are represented in an unpacked tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhiteoutFormat {
    /// 0:0 character devices and `trusted.overlay.opaque=y` (needs root), plus [`Changes`].
    Overlay,
    /// Zero-size files with `user.overlay.whiteout`, `user.overlay.opaque=y|x` (rootless,
    /// for overlayfs with `userxattr`), plus [`Changes`].
    UserXattr,
    /// Only [`Changes`] (rootless snapshots of older versions).
    Sidecar,
}

/// Paths (relative, `/`-separated, no leading `/`) deleted or made opaque by a layer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changes {
    pub whiteouts: BTreeSet<String>,
    /// Directories whose lower content is hidden; `""` is the layer root.
    pub opaque_dirs: BTreeSet<String>,
}

/// What a file name in a layer means, if it is a whiteout name at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whiteout<'a> {
    /// `.wh..wh..opq`: the containing directory is opaque.
    Opaque,
    /// `.wh.<name>`: `<name>` is deleted.
    Hide(&'a str),
    /// Another `.wh..wh.` name (aufs metadata): ignored.
    AufsMeta,
    /// `.wh.`, `.wh..` or `.wh...`: names nothing (refused).
    Invalid,
}

/// Classifies one path component; `None` for an ordinary name.
pub(crate) fn classify(file_name: &str) -> Option<Whiteout<'_>> {
    let hidden = file_name.strip_prefix(WHITEOUT_PREFIX)?;
    Some(if file_name == OPAQUE_MARKER {
        Whiteout::Opaque
    } else if hidden.starts_with(WHITEOUT_PREFIX) {
        Whiteout::AufsMeta
    } else if hidden.is_empty() || hidden == "." || hidden == ".." {
        Whiteout::Invalid
    } else {
        Whiteout::Hide(hidden)
    })
}

/// `true` for the 0:0 character device overlayfs uses as a whiteout.
pub(crate) fn is_overlay_whiteout(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    meta.file_type().is_char_device() && meta.rdev() == 0
}

/// `true` for a whiteout of [`WhiteoutFormat::UserXattr`]: `st` (of `path`, not followed)
/// is a zero-size regular file carrying [`USER_WHITEOUT_XATTR`].
pub(crate) fn is_xattr_whiteout(path: &std::path::Path, st_mode: u32, st_size: i64) -> bool {
    st_mode & libc::S_IFMT == libc::S_IFREG
        && st_size == 0
        && matches!(xattr::get(path, USER_WHITEOUT_XATTR), Ok(Some(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whiteout_names_are_classified_like_containerd() {
        assert_eq!(classify("passwd"), None);
        assert_eq!(classify(".wh.passwd"), Some(Whiteout::Hide("passwd")));
        assert_eq!(classify(".wh..wh..opq"), Some(Whiteout::Opaque));
        assert_eq!(classify(".wh..wh.plnk"), Some(Whiteout::AufsMeta));
        assert_eq!(classify(".wh."), Some(Whiteout::Invalid));
        assert_eq!(classify(".wh.."), Some(Whiteout::Invalid));
        assert_eq!(classify(".wh..hidden"), Some(Whiteout::Hide(".hidden")));
    }
}

//! Safe layer extraction: one crafted tar per escape kind, each refused with an error that
//! names the entry, with a canary beside the target proving that nothing outside was
//! touched; limits; metadata preservation; and unpacking as an unprivileged user.

mod image_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use image_support::LayerBuilder;
use ironlet_runtime::image::{
    unpack_layer, ImageError, UnpackLimits, UnpackOptions, UnpackReport, UnsafeEntryReason,
    WhiteoutFormat,
};

const CANARY: &[u8] = b"canary: must never change\n";

/// A target directory with a canary file beside it.
struct Arena {
    tmp: tempfile::TempDir,
}

impl Arena {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("target")).unwrap();
        std::fs::write(tmp.path().join("canary"), CANARY).unwrap();
        Self { tmp }
    }

    fn target(&self) -> PathBuf {
        self.tmp.path().join("target")
    }

    fn unpack(&self, layer: &[u8], opts: &UnpackOptions) -> Result<UnpackReport, ImageError> {
        unpack_layer(&mut &layer[..], &self.target(), opts, "test-layer")
    }

    /// The canary is intact and nothing but `target` and `canary` exists beside it.
    fn assert_untouched(&self) {
        let canary = self.tmp.path().join("canary");
        assert_eq!(std::fs::read(&canary).unwrap(), CANARY);
        let meta = std::fs::symlink_metadata(&canary).unwrap();
        assert_eq!(meta.nlink(), 1, "canary was hard-linked");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        let beside: Vec<String> = std::fs::read_dir(self.tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let mut beside = beside;
        beside.sort();
        assert_eq!(beside, vec!["canary", "target"]);
        let parent = self.tmp.path().parent().unwrap();
        assert!(!parent.join("escape").exists());
        assert!(!parent.join("outside").exists());
    }
}

fn opts() -> UnpackOptions {
    UnpackOptions {
        limits: UnpackLimits {
            max_bytes: 8 << 30,
            max_entries: 1_000_000,
        },
        whiteouts: WhiteoutFormat::Overlay,
        preserve_owner: nix_is_root(),
    }
}

fn nix_is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Asserts that `err` refuses `entry` for `reason`, and that the message names the entry.
fn assert_refused(err: ImageError, entry: &str, reason: UnsafeEntryReason) {
    match &err {
        ImageError::UnsafeEntry {
            entry: e,
            reason: r,
            ..
        } => {
            assert_eq!(e, entry);
            assert_eq!(*r, reason, "{err}");
        }
        other => panic!("expected UnsafeEntry for {entry}, got {other}"),
    }
    assert!(err.to_string().contains(entry), "{err}");
    assert_eq!(err.kubelet_reason(), "ErrImagePull");
}

#[test]
fn a_dot_dot_entry_is_refused_and_nothing_is_written_outside() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .file("ok", b"fine", 0o644)
        .file("../escape", b"pwned", 0o644)
        .build();
    assert_refused(
        a.unpack(&layer, &opts()).unwrap_err(),
        "../escape",
        UnsafeEntryReason::ParentComponent,
    );
    a.assert_untouched();
}

#[test]
fn an_absolute_entry_climbing_out_is_refused() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .file("/abs/../../escape", b"pwned", 0o644)
        .build();
    assert_refused(
        a.unpack(&layer, &opts()).unwrap_err(),
        "/abs/../../escape",
        UnsafeEntryReason::ParentComponent,
    );
    a.assert_untouched();
}

#[test]
fn a_leading_slash_is_treated_as_relative() {
    let a = Arena::new();
    let layer = LayerBuilder::new().file("/etc/motd", b"hi", 0o644).build();
    a.unpack(&layer, &opts()).unwrap();
    assert_eq!(std::fs::read(a.target().join("etc/motd")).unwrap(), b"hi");
    a.assert_untouched();
}

#[test]
fn writing_through_a_symlink_to_the_root_is_refused() {
    let a = Arena::new();
    let unique = format!("ironlet-escape-{}", std::process::id());
    let entry = format!("evil/{unique}");
    let layer = LayerBuilder::new()
        .symlink("evil", "/")
        .file(&entry, b"pwned", 0o644)
        .build();
    assert_refused(
        a.unpack(&layer, &opts()).unwrap_err(),
        &entry,
        UnsafeEntryReason::SymlinkEscape,
    );
    assert!(!Path::new("/").join(&unique).exists());
    a.assert_untouched();
}

#[test]
fn writing_through_a_relative_symlink_that_climbs_out_is_refused() {
    for link in ["../../..", "..", "../target/../.."] {
        let a = Arena::new();
        let layer = LayerBuilder::new()
            .symlink("evil", link)
            .file("evil/escape", b"pwned", 0o644)
            .build();
        assert_refused(
            a.unpack(&layer, &opts()).unwrap_err(),
            "evil/escape",
            UnsafeEntryReason::SymlinkEscape,
        );
        a.assert_untouched();
    }
}

#[test]
fn a_directory_through_a_symlink_that_climbs_out_is_refused() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .dir("d/", 0o755)
        .symlink("d/up", "../..")
        .dir("d/up/newdir/", 0o755)
        .build();
    assert_refused(
        a.unpack(&layer, &opts()).unwrap_err(),
        "d/up/newdir/",
        UnsafeEntryReason::SymlinkEscape,
    );
    a.assert_untouched();
}

#[test]
fn a_symlink_that_stays_inside_is_followed_like_a_normal_tar() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .dir("usr/lib/", 0o755)
        .symlink("lib", "usr/lib")
        .file("lib/libc.so", b"elf", 0o755)
        .symlink("abs", "/usr")
        .build();
    // `abs -> /usr` resolves outside under RESOLVE_BENEATH, but is only stored, not used.
    a.unpack(&layer, &opts()).unwrap();
    assert_eq!(
        std::fs::read(a.target().join("usr/lib/libc.so")).unwrap(),
        b"elf"
    );
    assert_eq!(
        std::fs::read_link(a.target().join("abs")).unwrap(),
        Path::new("/usr")
    );
    a.assert_untouched();
}

#[test]
fn a_file_entry_over_a_symlink_replaces_the_symlink_instead_of_writing_through_it() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .symlink("f", "../canary")
        .file("f", b"pwned", 0o644)
        .build();
    a.unpack(&layer, &opts()).unwrap();
    assert_eq!(std::fs::read(a.target().join("f")).unwrap(), b"pwned");
    assert!(!std::fs::symlink_metadata(a.target().join("f"))
        .unwrap()
        .file_type()
        .is_symlink());
    a.assert_untouched();
}

#[test]
fn a_hard_link_to_a_path_outside_is_refused() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .hardlink("link", "../../outside")
        .build();
    assert_refused(
        a.unpack(&layer, &opts()).unwrap_err(),
        "link",
        UnsafeEntryReason::HardLinkOutside,
    );
    a.assert_untouched();

    let a = Arena::new();
    let layer = LayerBuilder::new().hardlink("link", "../canary").build();
    assert_refused(
        a.unpack(&layer, &opts()).unwrap_err(),
        "link",
        UnsafeEntryReason::HardLinkOutside,
    );
    a.assert_untouched();
}

#[test]
fn a_hard_link_through_a_symlink_to_outside_is_refused() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .symlink("up", "..")
        .hardlink("link", "up/canary")
        .build();
    assert_refused(
        a.unpack(&layer, &opts()).unwrap_err(),
        "link",
        UnsafeEntryReason::HardLinkOutside,
    );
    a.assert_untouched();
}

#[test]
fn a_hard_link_to_a_missing_target_is_refused() {
    let a = Arena::new();
    let layer = LayerBuilder::new().hardlink("link", "not/there").build();
    assert_refused(
        a.unpack(&layer, &opts()).unwrap_err(),
        "link",
        UnsafeEntryReason::HardLinkTargetMissing,
    );
    a.assert_untouched();
}

#[test]
fn device_nodes_are_refused() {
    for (major, minor) in [(1, 3), (0, 0), (8, 0)] {
        let a = Arena::new();
        let layer = LayerBuilder::new()
            .char_device("dev/x", major, minor)
            .build();
        assert_refused(
            a.unpack(&layer, &opts()).unwrap_err(),
            "dev/x",
            UnsafeEntryReason::DeviceNode,
        );
        a.assert_untouched();
    }
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .raw("dev/sda", tar::EntryType::Block, None, &[], 0o660)
        .build();
    assert_refused(
        a.unpack(&layer, &opts()).unwrap_err(),
        "dev/sda",
        UnsafeEntryReason::DeviceNode,
    );
}

#[test]
fn fifos_are_allowed() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .raw("run/fifo", tar::EntryType::Fifo, None, &[], 0o600)
        .build();
    a.unpack(&layer, &opts()).unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(a.target().join("run/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn a_layer_past_the_size_limit_is_refused_naming_the_entry() {
    let a = Arena::new();
    let mut o = opts();
    o.limits.max_bytes = 1 << 20;
    let layer = LayerBuilder::new()
        .file("small", &[1u8; 600 << 10], 0o644)
        .file("big", &[2u8; 600 << 10], 0o644)
        .build();
    let err = a.unpack(&layer, &o).unwrap_err();
    assert!(
        matches!(err, ImageError::LayerTooLarge { ref entry, limit, .. } if entry == "big" && limit == 1 << 20),
        "{err}"
    );
    assert!(err.to_string().contains("\"big\""), "{err}");
    assert!(!a.target().join("big").exists());
    a.assert_untouched();
}

#[test]
fn a_layer_past_the_entry_limit_is_refused_naming_the_entry() {
    let a = Arena::new();
    let mut o = opts();
    o.limits.max_entries = 3;
    let mut b = LayerBuilder::new();
    for i in 0..5 {
        b = b.file(&format!("f{i}"), b"", 0o644);
    }
    let err = a.unpack(&b.build(), &o).unwrap_err();
    assert!(
        matches!(err, ImageError::TooManyEntries { ref entry, .. } if entry == "f3"),
        "{err}"
    );
}

#[test]
fn running_out_of_space_is_reported_as_disk_full_with_the_path() {
    if !nix_is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let a = Arena::new();
    let small = a.target();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&small)
        .status();
    if !status.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot mount tmpfs");
        return;
    }
    let layer = LayerBuilder::new()
        .file("big", &vec![7u8; 1 << 20], 0o644)
        .build();
    let err = a.unpack(&layer, &opts()).unwrap_err();
    let _ = std::process::Command::new("umount").arg(&small).status();
    match err {
        ImageError::DiskFull { path } => assert_eq!(path, small.join("big")),
        other => panic!("expected DiskFull, got {other}"),
    }
}

#[test]
fn modes_owners_times_links_and_xattrs_are_preserved() {
    let a = Arena::new();
    let mut b = LayerBuilder::new()
        .dir("ro/", 0o555)
        .file("ro/inside", b"x", 0o444)
        .file("bin/su", b"su", 0o4755)
        .symlink("bin/sh", "busybox")
        .file("bin/busybox", b"bb", 0o755)
        .hardlink("bin/ls", "bin/busybox")
        .owned_file("home/user/file", b"mine", 1234, 5678);
    {
        // A PAX xattr record before a regular file.
        let mut h = tar::Header::new_ustar();
        h.set_path("xattr-file").unwrap();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        let mut inner = tar::Builder::new(Vec::new());
        inner
            .append_pax_extensions([
                ("SCHILY.xattr.user.test", b"v".as_slice()),
                ("SCHILY.xattr.trusted.overlay.opaque", b"y".as_slice()),
            ])
            .unwrap();
        inner.append(&h, &b"z"[..]).unwrap();
        let bytes = inner.into_inner().unwrap();
        // Strip the two end-of-archive blocks and splice the entries into `b`.
        b = b.splice(&bytes[..bytes.len() - 1024]);
    }
    a.unpack(&b.build(), &opts()).unwrap();
    let t = a.target();
    let mode = |p: &str| std::fs::symlink_metadata(t.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("ro"), 0o555);
    assert_eq!(mode("ro/inside"), 0o444);
    assert_eq!(mode("bin/su"), 0o4755);
    assert_eq!(
        std::fs::read_link(t.join("bin/sh")).unwrap(),
        Path::new("busybox")
    );
    let bb = std::fs::metadata(t.join("bin/busybox")).unwrap();
    let ls = std::fs::metadata(t.join("bin/ls")).unwrap();
    assert_eq!((bb.ino(), bb.nlink()), (ls.ino(), 2));
    assert_eq!(
        std::fs::metadata(t.join("bin/su")).unwrap().mtime(),
        1_700_000_000
    );
    assert_eq!(
        std::fs::metadata(t.join("ro")).unwrap().mtime(),
        1_700_000_000
    );
    let owned = std::fs::metadata(t.join("home/user/file")).unwrap();
    if nix_is_root() {
        assert_eq!((owned.uid(), owned.gid()), (1234, 5678));
    }
    assert_eq!(owned.mtime(), 1_600_000_000);
    let x = t.join("xattr-file");
    if let Ok(Some(v)) = xattr::get(&x, "user.test") {
        assert_eq!(v, b"v");
    }
    // A layer may not forge overlay state.
    assert_eq!(
        xattr::get(&x, "trusted.overlay.opaque").unwrap_or(None),
        None
    );
}

#[test]
fn whiteouts_are_reported_and_written_as_overlayfs_expects_when_root() {
    if !nix_is_root() {
        eprintln!("skipped: overlay whiteouts need root");
        return;
    }
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .file("etc/.wh.passwd", b"", 0o644)
        .dir("opq/", 0o755)
        .file("opq/.wh..wh..opq", b"", 0o644)
        .file("opq/new", b"n", 0o644)
        .file(".wh..wh.plnk", b"", 0o644)
        .build();
    let report = a.unpack(&layer, &opts()).unwrap();
    assert_eq!(
        report.changes.whiteouts.iter().collect::<Vec<_>>(),
        vec!["etc/passwd"]
    );
    assert_eq!(
        report.changes.opaque_dirs.iter().collect::<Vec<_>>(),
        vec!["opq"]
    );
    let wh = std::fs::symlink_metadata(a.target().join("etc/passwd")).unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    assert_eq!(
        xattr::get(a.target().join("opq"), "trusted.overlay.opaque").unwrap(),
        Some(b"y".to_vec())
    );
    assert!(!a.target().join(".wh..wh.plnk").exists());
    assert!(!a.target().join("etc/.wh.passwd").exists());
}

/// `path` is a whiteout overlayfs with `userxattr` reads: a zero-size regular file with
/// `user.overlay.whiteout`, in a directory marked `user.overlay.opaque=x`.
fn assert_xattr_whiteout(path: &Path) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    assert!(meta.is_file() && meta.len() == 0, "{path:?}: {meta:?}");
    assert!(
        xattr::get(path, "user.overlay.whiteout").unwrap().is_some(),
        "{path:?} has no user.overlay.whiteout"
    );
    assert_eq!(
        xattr::get(path.parent().unwrap(), "user.overlay.opaque").unwrap(),
        Some(b"x".to_vec()),
        "the directory of {path:?}"
    );
}

#[test]
fn user_xattr_whiteouts_are_written_as_overlayfs_with_userxattr_reads_them() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .file(".wh.top", b"", 0o644)
        .file("etc/.wh.passwd", b"", 0o644)
        .dir("opq/", 0o755)
        .file("opq/.wh..wh..opq", b"", 0o644)
        .file("opq/.wh.x", b"", 0o644)
        .file("opq/new", b"n", 0o644)
        .file(".wh.both", b"", 0o644)
        .dir("both/", 0o755)
        .file("both/own", b"o", 0o644)
        .dir("ro/", 0o555)
        .file("ro/.wh.gone", b"", 0o644)
        .build();
    let o = UnpackOptions {
        whiteouts: WhiteoutFormat::UserXattr,
        ..opts()
    };
    let report = a.unpack(&layer, &o).unwrap();
    assert_eq!(
        report.changes.whiteouts.iter().collect::<Vec<_>>(),
        vec!["both", "etc/passwd", "opq/x", "ro/gone", "top"]
    );
    let t = a.target();
    for w in ["top", "etc/passwd", "ro/gone"] {
        assert_xattr_whiteout(&t.join(w));
    }
    let opaque = |p: &str| xattr::get(t.join(p), "user.overlay.opaque").unwrap();
    // Opaque: `y`, and no whiteout inside (overlayfs would not look for it there).
    assert_eq!(opaque("opq"), Some(b"y".to_vec()));
    assert!(!t.join("opq/x").exists());
    // The layer's own `both` replaces the lower one wholly: an opaque directory.
    assert_eq!(opaque("both"), Some(b"y".to_vec()));
    assert_eq!(std::fs::read(t.join("both/own")).unwrap(), b"o");
    assert_eq!(
        std::fs::metadata(t.join("ro")).unwrap().mode() & 0o777,
        0o555,
        "the mode is applied after the whiteout"
    );
    assert!(std::fs::read_dir(&t).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with(".wh.")));
}

/// Runs in a child process as `nobody` (see the next test); does nothing when run directly.
#[test]
#[ignore = "helper run by unpacking_as_an_unprivileged_user_works_without_root_features"]
fn unprivileged_unpack_helper() {
    let Ok(dir) = std::env::var("IRONLET_UNPRIV_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let layer = std::fs::read(dir.join("layer.tar")).unwrap();
    let target = dir.join("target");
    std::fs::create_dir(&target).unwrap();
    let o = UnpackOptions {
        limits: opts().limits,
        whiteouts: WhiteoutFormat::UserXattr,
        preserve_owner: false,
    };
    let report = unpack_layer(&mut &layer[..], &target, &o, "unpriv").unwrap();
    std::fs::write(
        dir.join("report"),
        format!(
            "{:?} {:?}",
            report.changes.whiteouts, report.changes.opaque_dirs
        ),
    )
    .unwrap();
}

#[test]
fn unpacking_as_an_unprivileged_user_works_without_root_features() {
    use std::os::unix::process::CommandExt;
    if !nix_is_root() {
        eprintln!("skipped: needs root to switch to nobody");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("u");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let layer = LayerBuilder::new()
        .dir("ro/", 0o555)
        .file("ro/inside", b"x", 0o444)
        .owned_file("owned", b"o", 0, 0)
        .file("etc/.wh.gone", b"", 0o644)
        .dir("opq/", 0o755)
        .file("opq/.wh..wh..opq", b"", 0o644)
        .build();
    std::fs::write(dir.join("layer.tar"), layer).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(&exe)
        .args([
            "--exact",
            "unprivileged_unpack_helper",
            "--include-ignored",
            "--nocapture",
        ])
        .env("IRONLET_UNPRIV_DIR", &dir)
        .uid(65534)
        .gid(65534)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: cannot run the test binary as nobody: {e}");
            return;
        }
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("Permission denied") && !dir.join("target").exists() {
            eprintln!("skipped: the test binary is not reachable by nobody: {stderr}");
            return;
        }
        panic!(
            "helper failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            stderr
        );
    }
    let target = dir.join("target");
    let owned = std::fs::metadata(target.join("owned")).unwrap();
    assert_eq!((owned.uid(), owned.gid()), (65534, 65534));
    assert_eq!(
        std::fs::metadata(target.join("ro")).unwrap().mode() & 0o777,
        0o555
    );
    assert_eq!(std::fs::read(target.join("ro/inside")).unwrap(), b"x");
    // No whiteout devices without root: user-xattr whiteouts, and the sidecar list.
    assert_xattr_whiteout(&target.join("etc/gone"));
    assert_eq!(
        xattr::get(target.join("opq"), "user.overlay.opaque").unwrap(),
        Some(b"y".to_vec())
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("report")).unwrap(),
        r#"{"etc/gone"} {"opq"}"#
    );
}

#[test]
fn an_image_with_an_escaping_layer_is_refused_unindexed_and_leaves_no_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let canary = tmp.path().join("canary");
    std::fs::write(&canary, CANARY).unwrap();
    let (_d, store) = image_support::store();
    let good =
        image_support::TestImage::new(vec![LayerBuilder::new().file("ok", b"ok", 0o644).build()]);
    store
        .import(&good.write_layout(&tmp.path().join("good"), Some("good:1")))
        .unwrap();
    let index = std::fs::read(store.root().join("index.json")).unwrap();
    let snapshots = image_support::tree(&store.root().join("snapshots"));
    let evil = image_support::TestImage::new(vec![LayerBuilder::new()
        .symlink("evil", "../../..")
        .file("evil/escape", b"pwned", 0o644)
        .build()]);
    let err = store
        .import(&evil.write_oci_archive(&tmp.path().join("evil.oci.tar"), Some("evil:1")))
        .unwrap_err();
    assert_refused(err, "evil/escape", UnsafeEntryReason::SymlinkEscape);
    assert_eq!(
        std::fs::read(store.root().join("index.json")).unwrap(),
        index
    );
    assert_eq!(
        image_support::tree(&store.root().join("snapshots")),
        snapshots
    );
    assert!(!store.root().join("escape").exists());
    assert!(!store.root().join("snapshots/escape").exists());
    assert_eq!(std::fs::read(&canary).unwrap(), CANARY);
}

/// The unpacker caches the directories of the last path; an entry that replaces one of them
/// (or what a cached symlink led to) must be seen by the next entries.
#[test]
fn entries_after_a_directory_is_replaced_follow_the_new_tree() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .dir("a/", 0o755)
        .dir("a/b/", 0o755)
        .file("a/b/f1", b"1", 0o644)
        .dir("c/", 0o755)
        // The directory a/b becomes a symlink to c: a/b/f2 lands in c.
        .symlink("a/b", "../c")
        .file("a/b/f2", b"2", 0o644)
        // s leads to p/q/r; through s/up (p/q/r/../.. = p), p/q is replaced by a file, so
        // s now dangles: s/w must not land in the deleted p/q/r.
        .dir("p/q/r/", 0o755)
        .symlink("s", "p/q/r")
        .symlink("s/up", "../..")
        .file("s/up/x", b"x", 0o644)
        .file("s/up/q", b"now a file", 0o644)
        .file("s/w", b"w", 0o644)
        .build();
    let err = a.unpack(&layer, &opts()).unwrap_err();
    assert_refused(err, "s/w", UnsafeEntryReason::ParentNotDirectory);
    let t = a.target();
    assert_eq!(std::fs::read(t.join("c/f2")).unwrap(), b"2");
    assert!(!t.join("c/f1").exists());
    assert!(std::fs::symlink_metadata(t.join("a/b"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(t.join("p/x")).unwrap(), b"x");
    assert_eq!(std::fs::read(t.join("p/q")).unwrap(), b"now a file");
    a.assert_untouched();
}

#[test]
fn symlinks_inside_are_followed_through_dot_dot_and_chains_but_never_out() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .dir("usr/lib/", 0o755)
        .dir("x/y/", 0o755)
        .symlink("x/y/up", "../../usr")
        .symlink("chain", "x/y/up/lib")
        .file("chain/ok", b"ok", 0o644)
        .symlink("x/y/out", "../../..")
        .file("x/y/out/escape", b"pwned", 0o644)
        .build();
    let err = a.unpack(&layer, &opts()).unwrap_err();
    assert_refused(err, "x/y/out/escape", UnsafeEntryReason::SymlinkEscape);
    assert_eq!(std::fs::read(a.target().join("usr/lib/ok")).unwrap(), b"ok");
    a.assert_untouched();
}

#[test]
fn a_symlink_loop_is_refused_as_not_a_directory() {
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .symlink("loop1", "loop2")
        .symlink("loop2", "loop1")
        .file("loop1/x", b"x", 0o644)
        .build();
    let err = a.unpack(&layer, &opts()).unwrap_err();
    assert_refused(err, "loop1/x", UnsafeEntryReason::ParentNotDirectory);
    a.assert_untouched();
}

/// `security.capability` values: v2 (cap_net_bind_service, effective) is valid; a v1-sized
/// value is refused by the kernel with EINVAL.
fn caps_v2() -> Vec<u8> {
    [0x0200_0001u32, 1 << 10, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

fn caps_invalid() -> Vec<u8> {
    [0x0100_0001u32, 1 << 10, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// File capabilities only act on executed regular files: on a directory (where the kernel
/// may refuse the value) they are applied when accepted and otherwise skipped with a
/// warning, instead of failing the layer; on a file they are applied.
#[test]
fn a_capability_xattr_on_a_directory_does_not_fail_the_layer() {
    let a = Arena::new();
    let (valid, invalid) = (caps_v2(), caps_invalid());
    let cap = "security.capability";
    let layer = LayerBuilder::new()
        .with_xattrs(
            "capdir/",
            tar::EntryType::Directory,
            &[(cap, &invalid)],
            &[],
            0o750,
        )
        .with_xattrs(
            "okdir/",
            tar::EntryType::Directory,
            &[(cap, &valid)],
            &[],
            0o755,
        )
        .with_xattrs(
            "bin/ping",
            tar::EntryType::Regular,
            &[(cap, &valid)],
            b"elf",
            0o755,
        )
        .file("capdir/inside", b"i", 0o644)
        .build();
    a.unpack(&layer, &opts()).unwrap();
    let t = a.target();
    let meta = std::fs::metadata(t.join("capdir")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o750);
    assert_eq!(std::fs::read(t.join("capdir/inside")).unwrap(), b"i");
    if nix_is_root() {
        assert_eq!(
            xattr::get(t.join("bin/ping"), cap).unwrap(),
            Some(valid.clone())
        );
        assert_eq!(xattr::get(t.join("okdir"), cap).unwrap(), Some(valid));
        assert_eq!(xattr::get(t.join("capdir"), cap).unwrap(), None);
    }
}

/// As containerd: an xattr the kernel refuses on a regular file fails the layer, naming
/// the entry (the file would otherwise run without the capabilities the image gave it).
#[test]
fn an_invalid_capability_on_a_file_is_refused_naming_the_entry() {
    if !nix_is_root() {
        eprintln!("skipped: unprivileged unpacks skip security xattrs");
        return;
    }
    let a = Arena::new();
    let layer = LayerBuilder::new()
        .with_xattrs(
            "bin/bad",
            tar::EntryType::Regular,
            &[("security.capability", &caps_invalid())],
            b"elf",
            0o755,
        )
        .build();
    let err = a.unpack(&layer, &opts()).unwrap_err();
    assert!(
        matches!(&err, ImageError::WriteEntry { entry, .. } if entry == "bin/bad"),
        "{err}"
    );
    assert!(err.to_string().contains("security.capability"), "{err}");
}

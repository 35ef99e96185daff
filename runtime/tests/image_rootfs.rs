//! Container root file systems: overlay (new mount API, 60 layers) and copy, whiteouts and
//! opaque directories applied, release idempotent, crash-interrupted snapshots redone.

mod image_support;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use image_support::{layered_image, store, store_with, tree, LayerBuilder, TestImage};
use ironlet_runtime::image::{ImageError, ImageStore, RootfsMode};

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn expected_layered_tree() -> BTreeSet<String> {
    [
        "bin",
        "bin/su",
        "bin/tool",
        "etc",
        "etc/alias",
        "etc/keep",
        "etc/layer3",
        "lib",
        "lib/libx.so",
        "lib/libx.so.1",
        "opaque",
        "opaque/new",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// Checks the merged view of [`layered_image`].
fn assert_layered_rootfs(rootfs: &Path) {
    assert_eq!(tree(rootfs), expected_layered_tree());
    assert_eq!(
        std::fs::read(rootfs.join("etc/keep")).unwrap(),
        b"keep v2\n"
    );
    assert_eq!(
        std::fs::read_link(rootfs.join("etc/alias")).unwrap(),
        Path::new("keep")
    );
    assert_eq!(
        std::fs::read(rootfs.join("etc/alias")).unwrap(),
        b"keep v2\n"
    );
    let a = std::fs::metadata(rootfs.join("lib/libx.so")).unwrap();
    let b = std::fs::metadata(rootfs.join("lib/libx.so.1")).unwrap();
    assert_eq!(a.ino(), b.ino(), "hard link kept");
    assert_eq!(
        std::fs::metadata(rootfs.join("bin/su")).unwrap().mode() & 0o7777,
        0o4755
    );
    assert_eq!(
        std::fs::metadata(rootfs.join("etc/layer3")).unwrap().mode() & 0o7777,
        0o600
    );
}

fn import_layered(store: &ImageStore, dir: &Path) -> String {
    let img = layered_image();
    let layout = img.write_layout(&dir.join("layered"), Some("latest"));
    store.import(&layout).unwrap();
    img.id()
}

fn is_mounted(path: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let p = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_ref()))
}

#[test]
fn an_overlay_rootfs_of_the_layered_image_applies_whiteouts_and_opaque_dirs() {
    if !is_root() {
        eprintln!("skipped: overlay needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    import_layered(&store, tmp.path());
    let target = tmp.path().join("bundle");
    let prepared = store
        .prepare_rootfs("layered", &target, RootfsMode::Overlay)
        .unwrap();
    assert_eq!(prepared.mode, RootfsMode::Overlay);
    assert_eq!(prepared.rootfs, target.join("rootfs"));
    assert!(is_mounted(&prepared.rootfs));
    assert_layered_rootfs(&prepared.rootfs);

    // Container writes land in upper, never in a snapshot.
    let snapshots_before = tree(&store.root().join("snapshots"));
    let empty = store.writable_layer_usage(&target).unwrap();
    std::fs::write(prepared.rootfs.join("etc/written"), vec![1u8; 300 * 1024]).unwrap();
    std::fs::remove_file(prepared.rootfs.join("etc/keep")).unwrap();
    assert!(target.join("upper/etc/written").exists());
    assert_eq!(tree(&store.root().join("snapshots")), snapshots_before);
    // The writable layer is what was written: upper, etc, the file, keep's whiteout.
    let written = store.writable_layer_usage(&target).unwrap();
    assert_eq!(written.inodes_used, empty.inodes_used + 3, "{written:?}");
    let grown = written.used_bytes - empty.used_bytes;
    assert!((300 * 1024..400 * 1024).contains(&grown), "{written:?}");

    // Preparing again returns the same mount.
    let again = store
        .prepare_rootfs("layered", &target, RootfsMode::Auto)
        .unwrap();
    assert_eq!(again, prepared);
    assert!(prepared.rootfs.join("etc/written").exists());

    store.release_rootfs(&target).unwrap();
    assert!(!is_mounted(&prepared.rootfs));
    assert!(!target.exists());
    store.release_rootfs(&target).unwrap();
}

#[test]
fn a_copied_rootfs_of_the_layered_image_matches_the_overlay_view() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let id = import_layered(&store, tmp.path());
    let target = tmp.path().join("bundle");
    let prepared = store
        .prepare_rootfs(&id, &target, RootfsMode::Copy)
        .unwrap();
    assert_eq!(prepared.mode, RootfsMode::Copy);
    assert_eq!(prepared.image_id, id);
    assert!(!is_mounted(&prepared.rootfs));
    assert_layered_rootfs(&prepared.rootfs);
    // No overlay artefacts are copied.
    assert_eq!(
        xattr::get(prepared.rootfs.join("opaque"), "trusted.overlay.opaque").unwrap_or(None),
        None
    );
    // A copy is all writable: the image's files are its layer (the top directory counts,
    // the hard link lib/libx.so.1 does not: one inode with lib/libx.so).
    let layer = store.writable_layer_usage(&target).unwrap();
    assert_eq!(
        layer.inodes_used,
        expected_layered_tree().len() as u64,
        "{layer:?}"
    );
    std::fs::write(target.join("config.json"), b"{}").unwrap();
    store.release_rootfs(&target).unwrap();
    assert!(!target.join("rootfs").exists());
    assert_eq!(store.writable_layer_usage(&target), None);
    assert!(
        target.join("config.json").exists(),
        "the runtime's own files stay"
    );
    store.release_rootfs(&target).unwrap();
}

#[test]
fn auto_mode_uses_overlay_as_root() {
    if !is_root() {
        eprintln!("skipped: overlay needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let id = import_layered(&store, tmp.path());
    let image = store.get_image(&id).unwrap().unwrap();
    let target = tmp.path().join("auto");
    let prepared = store
        .prepare_rootfs(&image, &target, RootfsMode::Auto)
        .unwrap();
    assert_eq!(prepared.mode, RootfsMode::Overlay);
    store.release_rootfs(&target).unwrap();
}

#[test]
fn a_rootless_store_copies_with_its_user_xattr_whiteouts_and_refuses_a_host_overlay() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store_with(|c| c.privileged = false);
    import_layered(&store, tmp.path());
    // No whiteout devices or trusted xattrs in the snapshots: changes.json, and the
    // user-xattr whiteouts copy mode must not copy as files.
    let snaps = store.root().join("snapshots");
    for entry in std::fs::read_dir(&snaps).unwrap() {
        let dir = entry.unwrap().path();
        assert!(dir.join("changes.json").is_file());
        assert!(dir.join("done").is_file());
    }
    let target = tmp.path().join("bundle");
    let err = store
        .prepare_rootfs("layered", &target, RootfsMode::Overlay)
        .unwrap_err();
    assert!(
        matches!(err, ImageError::OverlayUnavailable { .. }),
        "{err}"
    );
    assert_eq!(err.kubelet_reason(), "CreateContainerError");
    assert!(
        !target.join("rootfs").exists(),
        "a failed prepare leaves nothing"
    );
    assert_eq!(image_support::count(&store.root().join("leases")), 0);

    let prepared = store
        .prepare_rootfs("layered", &target, RootfsMode::Copy)
        .unwrap();
    assert_eq!(prepared.mode, RootfsMode::Copy);
    assert_layered_rootfs(&prepared.rootfs);
    store.release_rootfs(&target).unwrap();
}

/// Snapshots unpacked by an older version (`sidecar`: whiteouts only in `changes.json`) keep
/// working: copied, never overlaid (overlayfs would show their whited-out files).
#[test]
fn a_rootless_store_copies_snapshots_of_older_versions_with_sidecar_whiteouts() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store_with(|c| c.privileged = false);
    import_layered(&store, tmp.path());
    // Make them what an older version wrote: no user-xattr whiteouts, the marker says so.
    let snaps = store.root().join("snapshots");
    for entry in std::fs::read_dir(&snaps).unwrap() {
        let dir = entry.unwrap().path();
        let mut stack = vec![dir.join("fs")];
        while let Some(d) = stack.pop() {
            let _ = xattr::remove(&d, "user.overlay.opaque");
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_symlink() {
                    continue;
                }
                if p.is_dir() {
                    stack.push(p);
                } else if xattr::get(&p, "user.overlay.whiteout").unwrap().is_some() {
                    std::fs::remove_file(&p).unwrap();
                }
            }
        }
        let done = dir.join("done");
        let marker = std::fs::read_to_string(&done).unwrap();
        assert!(marker.contains("\"user_xattr\""), "{marker}");
        std::fs::write(&done, marker.replace("\"user_xattr\"", "\"sidecar\"")).unwrap();
    }
    let target = tmp.path().join("bundle");
    let prepared = store
        .prepare_rootfs("layered", &target, RootfsMode::Auto)
        .unwrap();
    assert_eq!(prepared.mode, RootfsMode::Copy);
    assert_layered_rootfs(&prepared.rootfs);
    let err = store
        .prepare_rootfs("layered", &tmp.path().join("b2"), RootfsMode::UsernsOverlay)
        .unwrap_err();
    assert!(
        matches!(err, ImageError::OverlayUnavailable { .. }),
        "{err}"
    );
    store.release_rootfs(&target).unwrap();
}

/// Where the probe found that overlayfs does not mount in a user namespace (an older kernel),
/// rootless root file systems are copies, and the store says why. The probe's answer is kept
/// per kernel release in the store; here it is planted.
#[test]
fn a_rootless_store_copies_where_the_kernel_refuses_a_userns_overlay() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store_with(|c| c.privileged = false);
    import_layered(&store, tmp.path());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let record = serde_json::json!({"kernel": kernel.trim(), "result": {"Err": "mount -t overlay -o userxattr: Invalid argument"}});
    std::fs::write(
        store.root().join("userns-overlay-probe.json"),
        record.to_string(),
    )
    .unwrap();
    let target = tmp.path().join("bundle");
    let prepared = store
        .prepare_rootfs("layered", &target, RootfsMode::Auto)
        .unwrap();
    assert_eq!(prepared.mode, RootfsMode::Copy);
    assert!(prepared.layers.is_empty());
    assert_layered_rootfs(&prepared.rootfs);
    assert_eq!(
        store.userns_overlay_reason().as_deref(),
        Some("mount -t overlay -o userxattr: Invalid argument")
    );
    store.release_rootfs(&target).unwrap();
}

/// Rootless overlay (`image/userns_overlay.rs`): the store only prepares the directories and
/// the description the container runtime mounts inside the container's user namespace;
/// nothing is mounted on the host, and release removes all of it.
#[test]
fn a_rootless_store_describes_a_userns_overlay_and_mounts_nothing_on_the_host() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store_with(|c| c.privileged = false);
    import_layered(&store, tmp.path());
    let target = tmp.path().join("bundle");
    let prepared = store
        .prepare_rootfs("layered", &target, RootfsMode::Auto)
        .unwrap();
    assert_eq!(
        prepared.mode,
        RootfsMode::UsernsOverlay,
        "this kernel (≥ 6.7) mounts it"
    );
    let snaps = store.root().join("snapshots");
    // Every snapshot of the (only) image, top first: the last one is the base layer's.
    assert_eq!(prepared.layers.len(), image_support::count(&snaps));
    let mut sorted = prepared.layers.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), prepared.layers.len());
    assert!(prepared
        .layers
        .iter()
        .all(|l| l.starts_with(&snaps) && l.is_dir()));
    assert_eq!(
        image_support::count(&prepared.rootfs),
        0,
        "an empty mount point"
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(&*prepared.rootfs.to_string_lossy()));
    for d in ["upper", "work", "rootfs-overlay.json"] {
        assert!(target.join(d).exists(), "{d}");
    }
    // Prepared again: the same, unchanged.
    let again = store
        .prepare_rootfs("layered", &target, RootfsMode::Auto)
        .unwrap();
    assert_eq!(again, prepared);
    assert!(store.userns_overlay_reason().is_none());
    store.release_rootfs(&target).unwrap();
    assert!(!target.exists(), "release leaves nothing");
    assert_eq!(image_support::count(&store.root().join("leases")), 0);
    let left: Vec<_> = std::fs::read_dir(&snaps)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tmp-"))
        .collect();
    assert!(left.is_empty(), "the probe leaves nothing: {left:?}");
}

#[test]
fn a_snapshot_interrupted_before_its_done_marker_is_unpacked_again() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    import_layered(&store, tmp.path());
    let snaps = store.root().join("snapshots");
    let victim = std::fs::read_dir(&snaps)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::remove_file(victim.join("done")).unwrap();
    crate::image_support::tree(&victim.join("fs"))
        .iter()
        .filter(|p| !p.contains('/'))
        .for_each(|p| {
            let _ = std::fs::remove_file(victim.join("fs").join(p));
        });
    // A crashed unpack also leaves a temp dir behind.
    std::fs::create_dir_all(snaps.join("tmp-crashed-1/fs/partial")).unwrap();
    let target = tmp.path().join("bundle");
    let prepared = store
        .prepare_rootfs("layered", &target, RootfsMode::Copy)
        .unwrap();
    assert_layered_rootfs(&prepared.rootfs);
    assert!(victim.join("done").is_file());
    store.release_rootfs(&target).unwrap();
    store.gc().unwrap();
    assert!(!snaps.join("tmp-crashed-1").exists());
}

#[test]
fn sixty_layers_are_overlay_mounted_past_the_legacy_option_limit() {
    if !is_root() {
        eprintln!("skipped: overlay needs root");
        return;
    }
    const LAYERS: usize = 60;
    let layers: Vec<Vec<u8>> = (0..LAYERS)
        .map(|i| {
            LayerBuilder::new()
                .file(&format!("layers/{i:02}"), format!("{i}").as_bytes(), 0o644)
                .file("common", format!("{i}").as_bytes(), 0o644)
                .build()
        })
        .collect();
    let img = TestImage::new(layers);
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    store
        .import(&img.write_layout(&tmp.path().join("sixty"), Some("latest")))
        .unwrap();
    // The legacy mount(2) string would not fit in a page.
    let snapshot_path_len = store
        .root()
        .join("snapshots")
        .join("x".repeat(64))
        .join("fs")
        .as_os_str()
        .len();
    assert!(
        (snapshot_path_len + 1) * LAYERS > 4096,
        "test paths too short to prove anything"
    );
    let target = tmp.path().join("bundle");
    let prepared = store
        .prepare_rootfs("sixty", &target, RootfsMode::Overlay)
        .unwrap();
    assert_eq!(prepared.mode, RootfsMode::Overlay);
    let files = tree(&prepared.rootfs.join("layers"));
    assert_eq!(files.len(), LAYERS);
    assert_eq!(
        std::fs::read_to_string(prepared.rootfs.join("common")).unwrap(),
        format!("{}", LAYERS - 1),
        "the top layer wins"
    );
    store.release_rootfs(&target).unwrap();
    assert!(!is_mounted(&prepared.rootfs));
}

#[test]
fn preparing_an_unknown_image_is_not_found_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store();
    let target = tmp.path().join("bundle");
    let err = store
        .prepare_rootfs("nothere", &target, RootfsMode::Auto)
        .unwrap_err();
    assert!(matches!(err, ImageError::NotFound(_)), "{err}");
    assert!(!target.exists());
}

/// Rootless (`image/owners.rs`): an unprivileged unpack records each non-root owner in the
/// `user.ironlet.owner` xattr for the container's user namespace to apply; a layer cannot
/// forge the record, the rootfs copy carries the topmost layer's, and a file an upper layer
/// re-adds as root loses the lower layer's record.
#[test]
fn a_rootless_store_records_file_owners_for_the_container_namespace() {
    use ironlet_runtime::image::owners::OWNER_XATTR;
    let tmp = tempfile::tempdir().unwrap();
    let (_d, store) = store_with(|c| c.privileged = false);
    let lower = LayerBuilder::new()
        .dir("srv", 0o755)
        .owned_file("srv/app.txt", b"a", 1000, 1000)
        .owned_file("srv/later-root.txt", b"b", 1000, 1000)
        .with_xattrs(
            "srv/forged.txt",
            tar::EntryType::Regular,
            &[(OWNER_XATTR, b"0:5")],
            b"f",
            0o644,
        )
        .build();
    let upper = LayerBuilder::new()
        .dir("srv", 0o755)
        .file("srv/later-root.txt", b"c", 0o644)
        .owned_file("srv/group.txt", b"g", 0, 2000)
        .build();
    let img = TestImage::new(vec![lower, upper]);
    let layout = img.write_layout(&tmp.path().join("owners"), Some("latest"));
    store.import(&layout).unwrap();
    let target = tmp.path().join("bundle");
    let prepared = store
        .prepare_rootfs("owners", &target, RootfsMode::Copy)
        .unwrap();
    assert_eq!(prepared.mode, RootfsMode::Copy);
    let owner = |p: &str| {
        xattr::get(prepared.rootfs.join(p), OWNER_XATTR)
            .unwrap()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    };
    assert_eq!(owner("srv/app.txt").as_deref(), Some("1000:1000"));
    assert_eq!(owner("srv/group.txt").as_deref(), Some("0:2000"));
    assert_eq!(
        owner("srv/later-root.txt"),
        None,
        "the upper layer's root file"
    );
    assert_eq!(
        owner("srv/forged.txt"),
        None,
        "a layer's own record is dropped"
    );
    assert_eq!(owner("srv"), None);
    // The files themselves stay the unpacking user's: the store needs no namespace.
    let uid = nix::unistd::geteuid().as_raw();
    assert_eq!(
        std::fs::metadata(prepared.rootfs.join("srv/app.txt"))
            .unwrap()
            .uid(),
        uid
    );
    store.release_rootfs(&target).unwrap();
}
